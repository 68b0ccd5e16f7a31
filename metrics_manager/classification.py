"""Classification metrics that merge inside the compiled step: top-k accuracy, precision,
recall, F-beta, binned AUROC and perplexity.

Every type is a `flax.struct.dataclass` on `clu.metrics.Metric` whose state is counts or sums,
so `merge()` is addition: associative, exact for the integer counts, and the same for steps,
microbatches (`metrics_manager.accumulate_grads_microbatched`) and devices. Settings that
change what the counts mean (`k`, `average`, `beta`, `num_bins`) are static fields; merging
two metrics whose settings differ is an error, raised at trace time.

`empty()` holds zero counts of shape `()` and unset (None) settings: merged with anything it
returns the other side unchanged (the zeros broadcast), so it is a two-sided identity, but it
has not the shape of a real metric. Start a running merge from the first real metric (as
`merge_metrics(None, ...)` does), not from `empty()`.

What is computed matches scikit-learn with its defaults (tested against it):

- `TopKAccuracy(k)`: `top_k_accuracy_score`; NaN when nothing was seen, like CLU's `Accuracy`.
- `Precision`, `Recall`, `FBeta`: `precision_score`, `recall_score`, `fbeta_score` with
  `average="binary"` (binary scores and a threshold), `"micro"` or `"macro"`, and
  `zero_division` behaving as sklearn's default: a 0/0 ratio is 0. "macro" averages over the
  classes seen in the labels or the predictions, as sklearn's default `labels=None` does.
- `AUROC`: `roc_auc_score` on the scores rounded down to `num_bins` equal bins of [0, 1]
  (exactly; ties count one half), so within about `1 / num_bins` of the unbinned value.
  NaN while only one class was seen (sklearn raises).
- `Perplexity`: `exp` of the mean negative log-likelihood per (unmasked) token, that is
  `exp(log_loss(...))`; summed, not averaged per batch, so any split of the tokens into
  microbatches or devices gives the same value.

Synopsis:

    def loss_fn(params, batch):
        logits = model.apply(params, batch["inputs"])          # [B, L, V]
        labels, mask = batch["targets"], batch["weights"] > 0  # [B, L]
        return loss, {
            "accuracy/top5": TopKAccuracy.from_model_output(logits, labels, mask, k=5),
            "f1/macro": FBeta.from_model_output(logits, labels, mask, average="macro"),
            "perplexity": Perplexity.from_model_output(logits, labels, mask),
        }
"""

from typing import Any, Literal

import clu.metrics as clu_metrics
import flax
import jax
import jax.numpy as jnp
import numpy as np

from metrics_manager._problems import Problems as _Problems
from metrics_manager._problems import describe as _describe

__all__ = ["AUROC", "FBeta", "Perplexity", "Precision", "Recall", "TopKAccuracy"]

ArrayLike = jax.typing.ArrayLike
Average = Literal["binary", "micro", "macro"]
_AVERAGES = ("binary", "micro", "macro")


def _static_field() -> Any:
    return flax.struct.field(pytree_node=False, default=None)


def _merged_setting(a: Any, b: Any, name: str) -> Any:
    """The static setting `name` of a merge of `a` and `b`; None (an `empty()`) adopts the other."""
    mine, theirs = getattr(a, name), getattr(b, name)
    if mine is None:
        return theirs
    if theirs is None or mine == theirs:
        return mine
    raise ValueError(
        f"{type(a).__name__}.merge: cannot merge metrics with {name}={mine!r} and "
        f"{name}={theirs!r}; use one {name} per metric key (or two keys)."
    )


def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _check_mask(mask: ArrayLike | None, shape: tuple[int, ...], problems: _Problems) -> jax.Array:
    """A bool mask of `shape`; a given mask covers leading dimensions and broadcasts."""
    if mask is None:
        return jnp.ones(shape, bool)
    mask = jnp.asarray(mask)
    if mask.shape != shape[: mask.ndim]:
        problems.value_errors.append(
            f"mask of shape {mask.shape} does not match the labels of shape {shape}; expected "
            f"a mask of shape {shape[:1]} (per example) or {shape} (per label)"
        )
        return jnp.ones(shape, bool)
    mask = mask.astype(bool).reshape(mask.shape + (1,) * (len(shape) - mask.ndim))
    return jnp.broadcast_to(mask, shape)


def _check_labels(labels: Any, num_classes: int, problems: _Problems) -> jax.Array:
    """Integer labels; outside jit their values are checked against `[0, num_classes)`."""
    labels = jnp.asarray(labels)
    if labels.dtype == bool:
        labels = labels.astype(jnp.int32)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        problems.type_errors.append(
            f"labels must be integer class indices, got {_describe(labels)}; cast them with "
            "labels.astype(jnp.int32)"
        )
        return jnp.zeros(labels.shape, jnp.int32)
    if _is_concrete(labels) and labels.size:
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= num_classes:
            problems.value_errors.append(
                f"labels must lie in [0, {num_classes}) for {num_classes} classes, got values "
                f"from {low} to {high}; check the label vocabulary or the number of classes "
                "(inside jit, out-of-range labels are ignored like masked ones)"
            )
    return labels


def _class_predictions(
    predictions: ArrayLike,
    labels: ArrayLike,
    mask: ArrayLike | None,
    threshold: float,
    metric: str,
) -> tuple[jax.Array, jax.Array, jax.Array, int]:
    """(predicted class, label, valid mask, number of classes), all checked at trace time.

    Binary: `predictions` has the labels' shape and is compared with `threshold` (2 classes).
    Multi-class: `predictions` has one more, last axis of C >= 2 scores; the argmax wins.
    """
    problems = _Problems()
    predictions, labels = jnp.asarray(predictions), jnp.asarray(labels)
    binary = predictions.shape == labels.shape
    if binary:
        num_classes = 2
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            problems.type_errors.append(
                f"threshold must be a Python float, got {_describe(threshold)}"
            )
            threshold = 0.5
        predicted = (predictions >= threshold).astype(jnp.int32)
    elif predictions.shape[:-1] == labels.shape and predictions.shape[-1] >= 2:
        num_classes = predictions.shape[-1]
        predicted = jnp.argmax(predictions, axis=-1).astype(jnp.int32)
    else:
        problems.value_errors.append(
            f"predictions of shape {predictions.shape} do not fit labels of shape "
            f"{labels.shape}: expected {labels.shape} (binary scores) or "
            f"{labels.shape + ('C',)} with C >= 2 (one score per class)"
        )
        num_classes = 2
        predicted = jnp.zeros(labels.shape, jnp.int32)
    labels = _check_labels(labels, num_classes, problems)
    mask = _check_mask(mask, labels.shape, problems)
    problems.raise_if_any(f"{metric}.from_model_output")
    mask = mask & (labels >= 0) & (labels < num_classes)
    return predicted, labels, mask, num_classes


def _divide(numerator: jax.Array, denominator: jax.Array) -> jax.Array:
    """`numerator / denominator` in float32, 0 where the denominator is 0 (sklearn's default)."""
    numerator = numerator.astype(jnp.float32)
    denominator = denominator.astype(jnp.float32)
    return jnp.where(denominator > 0, numerator / jnp.where(denominator > 0, denominator, 1), 0.0)


@flax.struct.dataclass(kw_only=True)
class _ConfusionCounts(clu_metrics.Metric):
    """Per-class true positive, false positive and false negative counts (int32, [C]).

    Subclasses say how a class's score comes from its counts (`_score`); `average` says
    which classes and how: "binary" (class 1 of binary scores), "micro" (counts summed over
    classes first) or "macro" (the mean over the classes seen of the per-class scores).
    """

    true_positives: jax.Array
    false_positives: jax.Array
    false_negatives: jax.Array
    average: Average | None = _static_field()

    @classmethod
    def empty(cls) -> Any:
        zero = jnp.zeros((), jnp.int32)
        return cls(true_positives=zero, false_positives=zero, false_negatives=zero)

    @classmethod
    def _counts(
        cls,
        predictions: ArrayLike,
        labels: ArrayLike,
        mask: ArrayLike | None,
        threshold: float,
        average: Average | None,
    ) -> dict[str, Any]:
        predicted, labels, mask, num_classes = _class_predictions(
            predictions, labels, mask, threshold, cls.__name__
        )
        binary = num_classes == 2 and jnp.shape(predictions) == labels.shape
        if average is None and binary:
            average = "binary"
        if average not in _AVERAGES or (average == "binary" and not binary):
            raise ValueError(
                f"{cls.__name__}.from_model_output: average={average!r} does not fit "
                f"{'binary scores' if binary else f'{num_classes}-class scores'}; expected "
                f"{'one of ' + repr(_AVERAGES) if binary else repr('micro') + ' or ' + repr('macro')}"
                " (sklearn's average argument)"
            )
        weight = mask.astype(jnp.int32)
        zeros = jnp.zeros(num_classes, jnp.int32)
        # Scatter-adds instead of one-hot products: memory O(C), not O(tokens x C).
        true_positives = zeros.at[labels].add(weight * (predicted == labels), mode="drop")
        predicted_count = zeros.at[predicted].add(weight, mode="drop")
        label_count = zeros.at[labels].add(weight, mode="drop")
        return {
            "true_positives": true_positives,
            "false_positives": predicted_count - true_positives,
            "false_negatives": label_count - true_positives,
            "average": average,
        }

    @classmethod
    def from_model_output(
        cls,
        predictions: ArrayLike,
        labels: ArrayLike,
        mask: ArrayLike | None = None,
        *,
        threshold: float = 0.5,
        average: Average | None = None,
        **_: Any,
    ) -> Any:
        """Counts one batch.

        Args:
            predictions: binary scores (probabilities) of the labels' shape, a prediction is
                positive where `>= threshold`; or [..., C] scores (logits or
                probabilities) per class, whose argmax is the prediction.
            labels: integer class indices (0/1 for binary scores), shape [...].
            mask: bool mask over the labels' leading dimensions; False entries are ignored.
            threshold: binary scores only: where a score becomes a positive prediction.
            average: "binary" (binary scores only, the default there), "micro" or "macro"
                (required for C classes).

        Returns:
            The metric of this batch.

        Raises:
            TypeError: `labels` are not integers, or `threshold` is not a number.
            ValueError: shapes do not fit, `average` is not valid for the input, or (outside
                jit) a label is outside `[0, C)`.
        """
        return cls(**cls._counts(predictions, labels, mask, threshold, average))

    def merge(self, other: Any) -> Any:
        return self.replace(
            true_positives=self.true_positives + other.true_positives,
            false_positives=self.false_positives + other.false_positives,
            false_negatives=self.false_negatives + other.false_negatives,
            average=_merged_setting(self, other, "average"),
        )

    def _score(self, tp: jax.Array, fp: jax.Array, fn: jax.Array) -> jax.Array:
        """The score from per-class counts; each of Precision, Recall and FBeta defines it."""
        raise TypeError(
            f"{type(self).__name__} holds confusion counts only; compute Precision, Recall or "
            "FBeta instead."
        )

    def compute(self) -> jax.Array:
        tp, fp, fn = (
            jnp.atleast_1d(x)
            for x in (self.true_positives, self.false_positives, self.false_negatives)
        )
        if self.average == "binary":
            tp, fp, fn = tp[-1], fp[-1], fn[-1]
            return self._score(tp, fp, fn)
        if self.average == "macro":
            seen = (tp + fp + fn) > 0
            per_class = jnp.where(seen, self._score(tp, fp, fn), 0.0)
            return _divide(per_class.sum(), seen.sum())
        return self._score(tp.sum(), fp.sum(), fn.sum())  # micro, or nothing seen yet


@flax.struct.dataclass(kw_only=True)
class Precision(_ConfusionCounts):
    """Precision `tp / (tp + fp)`, binary or per class averaged "micro" or "macro".

    Equals `sklearn.metrics.precision_score(labels, predicted, average=average)`, 0/0 read
    as 0 (sklearn's default `zero_division`). For single-label multi-class data, "micro"
    precision equals accuracy.

    Attributes:
        true_positives: per-class counts (int32 [C]); C is 2 for binary scores.
        false_positives: per-class counts.
        false_negatives: per-class counts.
        average: "binary", "micro" or "macro" (static).

    Example:
        >>> import jax.numpy as jnp
        >>> scores = jnp.array([0.9, 0.8, 0.2, 0.6])
        >>> metric = Precision.from_model_output(scores, jnp.array([1, 0, 0, 1]))
        >>> round(float(metric.compute()), 6)
        0.666667
    """

    def _score(self, tp: jax.Array, fp: jax.Array, fn: jax.Array) -> jax.Array:
        return _divide(tp, tp + fp)


@flax.struct.dataclass(kw_only=True)
class Recall(_ConfusionCounts):
    """Recall `tp / (tp + fn)`, binary or per class averaged "micro" or "macro".

    Equals `sklearn.metrics.recall_score(labels, predicted, average=average)`, 0/0 read as 0.

    Attributes:
        true_positives: per-class counts (int32 [C]); C is 2 for binary scores.
        false_positives: per-class counts.
        false_negatives: per-class counts.
        average: "binary", "micro" or "macro" (static).

    Example:
        >>> import jax.numpy as jnp
        >>> logits = jnp.array([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 2.0, 0.0]])
        >>> metric = Recall.from_model_output(logits, jnp.array([0, 1, 2]), average="macro")
        >>> round(float(metric.compute()), 6)
        0.666667
    """

    def _score(self, tp: jax.Array, fp: jax.Array, fn: jax.Array) -> jax.Array:
        return _divide(tp, tp + fn)


@flax.struct.dataclass(kw_only=True)
class FBeta(_ConfusionCounts):
    """F-beta `(1 + b^2) tp / ((1 + b^2) tp + b^2 fn + fp)`: the weighted harmonic mean of
    precision and recall (recall `beta` times as important); F1 for `beta=1`.

    Equals `sklearn.metrics.fbeta_score(labels, predicted, beta=beta, average=average)`,
    0/0 read as 0.

    Attributes:
        true_positives: per-class counts (int32 [C]); C is 2 for binary scores.
        false_positives: per-class counts.
        false_negatives: per-class counts.
        average: "binary", "micro" or "macro" (static).
        beta: the weight of recall, > 0 (static).

    Example:
        >>> import jax.numpy as jnp
        >>> scores, labels = jnp.array([0.9, 0.8, 0.2, 0.6]), jnp.array([1, 0, 1, 1])
        >>> round(float(FBeta.from_model_output(scores, labels, beta=1.0).compute()), 6)
        0.666667
    """

    beta: float | None = _static_field()

    @classmethod
    def from_model_output(  # type: ignore[override]
        cls,
        predictions: ArrayLike,
        labels: ArrayLike,
        mask: ArrayLike | None = None,
        *,
        beta: float = 1.0,
        threshold: float = 0.5,
        average: Average | None = None,
        **_: Any,
    ) -> "FBeta":
        """Counts one batch; as `Precision.from_model_output`, plus `beta` (> 0, static)."""
        if isinstance(beta, bool) or not isinstance(beta, int | float) or not beta > 0:
            raise ValueError(
                f"FBeta.from_model_output: beta must be a Python number > 0, got "
                f"{_describe(beta)}; use beta=1.0 for F1, 0.5 to favour precision, 2.0 recall"
            )
        counts = cls._counts(predictions, labels, mask, threshold, average)
        return cls(**counts, beta=float(beta))

    def merge(self, other: "FBeta") -> "FBeta":
        return super().merge(other).replace(beta=_merged_setting(self, other, "beta"))

    def _score(self, tp: jax.Array, fp: jax.Array, fn: jax.Array) -> jax.Array:
        b2 = (1.0 if self.beta is None else self.beta) ** 2
        tp, fp, fn = (x.astype(jnp.float32) for x in (tp, fp, fn))
        return _divide((1 + b2) * tp, (1 + b2) * tp + b2 * fn + fp)


@flax.struct.dataclass(kw_only=True)
class TopKAccuracy(clu_metrics.Metric):
    """The fraction of labels among the `k` highest-scored classes.

    Equals `sklearn.metrics.top_k_accuracy_score(labels, scores, k=k)` (ties go to the lower
    class index, as with `jnp.argmax`; k=1 is plain accuracy). NaN while nothing was seen.

    Attributes:
        correct: the number of labels within the top k (int32).
        count: the number of (unmasked) labels (int32).
        k: how many classes count as predicted (static).

    Example:
        >>> import jax.numpy as jnp
        >>> logits = jnp.array([[0.5, 0.3, 0.2], [0.1, 0.3, 0.6]])
        >>> float(TopKAccuracy.from_model_output(logits, jnp.array([1, 0]), k=2).compute())
        0.5
    """

    correct: jax.Array
    count: jax.Array
    k: int | None = _static_field()

    @classmethod
    def empty(cls) -> "TopKAccuracy":
        zero = jnp.zeros((), jnp.int32)
        return cls(correct=zero, count=zero)

    @classmethod
    def from_model_output(
        cls,
        predictions: ArrayLike,
        labels: ArrayLike,
        mask: ArrayLike | None = None,
        *,
        k: int,
        **_: Any,
    ) -> "TopKAccuracy":
        """Counts one batch.

        Args:
            predictions: [..., C] scores per class (logits or probabilities).
            labels: integer class indices, shape [...].
            mask: bool mask over the labels' leading dimensions.
            k: 1 <= k <= C.

        Returns:
            The metric of this batch.

        Raises:
            TypeError: `labels` are not integers or `k` is not an int.
            ValueError: shapes do not fit, k is outside [1, C], or (outside jit) a label is
                outside `[0, C)`.
        """
        problems = _Problems()
        predictions, labels = jnp.asarray(predictions), jnp.asarray(labels)
        num_classes = predictions.shape[-1] if predictions.ndim else 0
        if predictions.shape[:-1] != labels.shape or predictions.ndim == 0:
            problems.value_errors.append(
                f"predictions of shape {predictions.shape} do not fit labels of shape "
                f"{labels.shape}: expected {labels.shape + ('C',)}, one score per class"
            )
        if isinstance(k, bool) or not isinstance(k, int | np.integer):
            problems.type_errors.append(f"k must be an int, got {_describe(k)}")
        elif not 1 <= k <= num_classes:
            problems.value_errors.append(
                f"k={k} must lie in [1, {num_classes}] for {num_classes} classes (the last "
                "axis of predictions); choose a smaller k or check the predictions' shape"
            )
        labels = _check_labels(labels, max(num_classes, 1), problems)
        mask = _check_mask(mask, labels.shape, problems)
        problems.raise_if_any("TopKAccuracy.from_model_output")
        top = jax.lax.top_k(predictions, int(k))[1]
        hit = (top == labels[..., None]).any(axis=-1)
        mask = mask & (labels >= 0) & (labels < num_classes)
        return cls(
            correct=(hit & mask).sum(dtype=jnp.int32), count=mask.sum(dtype=jnp.int32), k=int(k)
        )

    def merge(self, other: "TopKAccuracy") -> "TopKAccuracy":
        return type(self)(
            correct=self.correct + other.correct,
            count=self.count + other.count,
            k=_merged_setting(self, other, "k"),
        )

    def compute(self) -> jax.Array:
        return jnp.where(self.count > 0, _divide(self.correct, self.count), jnp.nan)


@flax.struct.dataclass(kw_only=True)
class AUROC(clu_metrics.Metric):
    """Binned area under the ROC curve of binary scores in [0, 1], mergeable.

    Keeps, per bin of `num_bins` equal bins of [0, 1], the number of positive and of negative
    labels whose score fell into it (scores outside [0, 1] go to the end bins; pass
    probabilities, e.g. `jax.nn.sigmoid(logits)`). The area is the Mann-Whitney statistic
    over bins: the fraction of (positive, negative) pairs in which the positive is in a higher
    bin, pairs within one bin counting one half. That equals `sklearn.metrics.roc_auc_score`
    on the scores rounded down to their bin exactly, and differs from it on raw scores by at
    most half the fraction of pairs that share a bin (about `1 / num_bins` for spread-out
    scores). NaN until both classes were seen.

    Attributes:
        positives: per-bin counts of positive labels (int32 [num_bins]).
        negatives: per-bin counts of negative labels (int32 [num_bins]).
        num_bins: the number of bins (static).

    Example:
        >>> import jax.numpy as jnp
        >>> scores, labels = jnp.array([0.1, 0.4, 0.35, 0.8]), jnp.array([0, 0, 1, 1])
        >>> float(AUROC.from_model_output(scores, labels).compute())
        0.75
    """

    positives: jax.Array
    negatives: jax.Array
    num_bins: int | None = _static_field()

    @classmethod
    def empty(cls) -> "AUROC":
        zero = jnp.zeros((), jnp.int32)
        return cls(positives=zero, negatives=zero)

    @classmethod
    def from_model_output(
        cls,
        predictions: ArrayLike,
        labels: ArrayLike,
        mask: ArrayLike | None = None,
        *,
        num_bins: int = 1000,
        **_: Any,
    ) -> "AUROC":
        """Counts one batch.

        Args:
            predictions: scores in [0, 1] (probabilities of the positive class), shape [...].
            labels: 0/1 (or bool) labels of the same shape.
            mask: bool mask over the labels' leading dimensions.
            num_bins: the number of equal bins of [0, 1], >= 1 (static).

        Returns:
            The metric of this batch.

        Raises:
            TypeError: `labels` are not integers or `num_bins` is not an int.
            ValueError: the shapes differ, `num_bins` < 1, or (outside jit) a label is not 0/1.
        """
        problems = _Problems()
        predictions, labels = jnp.asarray(predictions), jnp.asarray(labels)
        if predictions.shape != labels.shape:
            problems.value_errors.append(
                f"predictions of shape {predictions.shape} and labels of shape {labels.shape} "
                "must have the same shape (one score of the positive class per label)"
            )
        if isinstance(num_bins, bool) or not isinstance(num_bins, int | np.integer):
            problems.type_errors.append(f"num_bins must be an int, got {_describe(num_bins)}")
            num_bins = 1
        elif num_bins < 1:
            problems.value_errors.append(f"num_bins must be >= 1, got {num_bins}")
        labels = _check_labels(labels, 2, problems)
        mask = _check_mask(mask, labels.shape, problems)
        problems.raise_if_any("AUROC.from_model_output")
        num_bins = int(num_bins)
        scores = predictions.astype(jnp.result_type(predictions, jnp.float32))
        bins = jnp.clip(jnp.floor(scores * num_bins), 0, num_bins - 1).astype(jnp.int32)
        zeros = jnp.zeros(num_bins, jnp.int32)
        return cls(
            positives=zeros.at[bins].add((mask & (labels == 1)).astype(jnp.int32)),
            negatives=zeros.at[bins].add((mask & (labels == 0)).astype(jnp.int32)),
            num_bins=num_bins,
        )

    def merge(self, other: "AUROC") -> "AUROC":
        return type(self)(
            positives=self.positives + other.positives,
            negatives=self.negatives + other.negatives,
            num_bins=_merged_setting(self, other, "num_bins"),
        )

    def compute(self) -> jax.Array:
        positives = jnp.atleast_1d(self.positives).astype(jnp.float32)
        negatives = jnp.atleast_1d(self.negatives).astype(jnp.float32)
        num_positive, num_negative = positives.sum(), negatives.sum()
        # Positives in strictly higher bins than each bin, plus half of those in the same bin.
        above = num_positive - jnp.cumsum(positives)
        wins = (negatives * (above + 0.5 * positives)).sum()
        pairs = num_positive * num_negative
        return jnp.where(pairs > 0, wins / jnp.where(pairs > 0, pairs, 1), jnp.nan)


@flax.struct.dataclass(kw_only=True)
class Perplexity(clu_metrics.Metric):
    """`exp(total / count)`: the exponential of the mean negative log-likelihood per token.

    Keeps the summed negative log-likelihood and the token count, so the value does not
    depend on how tokens were split into batches, microbatches or devices (google-metrax's
    `Perplexity` averages per batch first, which does). NaN while nothing was seen.

    Attributes:
        total: the summed negative log-likelihood (float32).
        count: the number of (unmasked) tokens (int32).

    Example:
        >>> import jax.numpy as jnp
        >>> logits = jnp.zeros((2, 4))  # uniform over 4 classes
        >>> float(Perplexity.from_model_output(logits, jnp.array([0, 3])).compute())
        4.0
    """

    total: jax.Array
    count: jax.Array

    @classmethod
    def empty(cls) -> "Perplexity":
        return cls(total=jnp.zeros((), jnp.float32), count=jnp.zeros((), jnp.int32))

    @classmethod
    def from_model_output(
        cls,
        predictions: ArrayLike,
        labels: ArrayLike,
        mask: ArrayLike | None = None,
        **_: Any,
    ) -> "Perplexity":
        """From logits [..., V] and integer labels [...]: log-softmax, then the labels' NLL.

        Raises:
            TypeError: `labels` are not integers.
            ValueError: the shapes do not fit or (outside jit) a label is outside `[0, V)`.
        """
        problems = _Problems()
        predictions, labels = jnp.asarray(predictions), jnp.asarray(labels)
        if predictions.ndim == 0 or predictions.shape[:-1] != labels.shape:
            problems.value_errors.append(
                f"predictions of shape {predictions.shape} do not fit labels of shape "
                f"{labels.shape}: expected logits of shape {labels.shape + ('V',)}"
            )
        vocab = predictions.shape[-1] if predictions.ndim else 1
        labels = _check_labels(labels, vocab, problems)
        mask = _check_mask(mask, labels.shape, problems)
        problems.raise_if_any("Perplexity.from_model_output")
        log_probs = jax.nn.log_softmax(predictions.astype(jnp.float32), axis=-1)
        picked = jnp.take_along_axis(log_probs, jnp.clip(labels, 0, vocab - 1)[..., None], -1)
        return cls.from_log_likelihood(picked[..., 0], mask & (labels >= 0) & (labels < vocab))

    @classmethod
    def from_log_likelihood(
        cls, log_likelihood: ArrayLike, mask: ArrayLike | None = None
    ) -> "Perplexity":
        """From per-token log-likelihoods (<= 0), e.g. `-TokenLosses.cross_entropy`.

        Example:
            >>> import jax.numpy as jnp
            >>> metric = Perplexity.from_log_likelihood(jnp.log(jnp.array([0.5, 0.5, 0.1])),
            ...                                          mask=jnp.array([True, True, False]))
            >>> float(metric.compute())
            2.0
        """
        log_likelihood = jnp.asarray(log_likelihood)
        problems = _Problems()
        mask = _check_mask(mask, log_likelihood.shape, problems)
        problems.raise_if_any("Perplexity.from_log_likelihood")
        nll = -log_likelihood.astype(jnp.result_type(log_likelihood, jnp.float32))
        return cls(total=jnp.where(mask, nll, 0).sum(), count=mask.sum(dtype=jnp.int32))

    def merge(self, other: "Perplexity") -> "Perplexity":
        return type(self)(total=self.total + other.total, count=self.count + other.count)

    def compute(self) -> jax.Array:
        mean = self.total / jnp.maximum(self.count, 1).astype(jnp.result_type(self.total))
        return jnp.where(self.count > 0, jnp.exp(mean), jnp.nan)
