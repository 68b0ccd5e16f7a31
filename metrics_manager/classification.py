"""Classification metrics that merge inside the compiled step: top-k accuracy, precision,
recall, F-beta, binned AUROC and perplexity.

Each type is a `flax.struct.dataclass` on `clu.metrics.Metric` whose state is counts or sums, so
`merge()` is addition, the same over steps, microbatches and devices; counts are float32 (an
int32 count wraps past 2**31): a batch's exact (counted in int32), a window's exact to 2**24,
then rounded to 24 bits at each merge (see `metrics.COUNT_DTYPE`). Settings (`k`, `average`,
`beta`, `num_bins`) are static fields; merging metrics whose settings differ raises
at trace time. `empty()` holds zero counts of shape `()` and unset settings: an identity of
`merge()`, but not of a real metric's shape, so start a running merge from the first real one.

Values match scikit-learn's defaults (tested against it): `top_k_accuracy_score` where no
scores tie (on a tie the lower class index ranks first; sklearn's the higher),
`precision_score`, `recall_score` and `fbeta_score` (`average` "binary", "micro" or "macro", 0/0
read as 0), `roc_auc_score` of the scores rounded down to `num_bins` bins, and
`exp(log_loss(...))` per token. `TopKAccuracy`, `AUROC` and `Perplexity` are NaN until they have
seen something (`AUROC`: both classes), or once they have counted a NaN score (refused outside
`jit`: argmax, top_k and thresholds would count it as a prediction).

The scores are `predictions`; all but `AUROC`'s (probabilities) may come as `logits=`, as a CLU
`Collection` beside CLU's `Accuracy` passes them. Given both (a Collection with `AUROC` too),
`predictions=` are the scores and `logits=` another metric's, as in `metrics_manager.nnx`.

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

import dataclasses
import difflib
import functools
import math
from collections.abc import Callable
from typing import Any, Literal, get_args

import clu.metrics as clu_metrics
import flax
import jax
import jax.numpy as jnp
import numpy as np

from metrics_manager.metrics import (
    COUNT_DTYPE,
    array_module,
    broadcast_mask,
    check_merge_type,
    exact_count,
    explicit_mesh,
    float_identity,
    host_value,
    mask_mismatch,
    take_last,
    vocab_sharding,
)
from writers._checks import Problems, describe

__all__ = ["AUROC", "FBeta", "Perplexity", "Precision", "Recall", "TopKAccuracy"]

ArrayLike = jax.typing.ArrayLike
Average = Literal["binary", "micro", "macro"]
_AVERAGES = get_args(Average)


def _check_mask(
    mask: ArrayLike | None, shape: tuple[int, ...], problems: Problems, of: str = "labels"
) -> jax.Array:
    if mask is None:
        return jnp.ones(shape, bool)
    broadcast = broadcast_mask(mask := jnp.asarray(mask), shape)
    if broadcast is None:
        problems.value_problem(mask_mismatch(mask.shape, shape, of))
        return jnp.ones(shape, bool)
    return broadcast


def _checked_labels_and_mask(
    labels: jax.Array,
    mask: ArrayLike | None,
    num_classes: int,
    problems: Problems,
    shapes_fit: bool = True,
    fix: str = "check the label vocabulary or the number of classes",
) -> tuple[jax.Array, jax.Array]:
    """Integer labels and a mask that drops out-of-range ones; raises the call's problems.
    The range is checked only if `shapes_fit` (else `num_classes` is unknown)."""
    if labels.dtype == bool or (
        jnp.issubdtype(labels.dtype, jnp.integer) and jnp.iinfo(labels.dtype).bits < 32
    ):  # int8 or uint8 labels would wrap a class count of 128 or 256 in the checks below
        labels = labels.astype(jnp.int32)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        problems.type_problem(
            f"labels must be integer class indices, got {describe(labels)}; cast them with "
            "labels.astype(jnp.int32), or take one-hot labels' labels.argmax(-1)"
        )
        labels = jnp.zeros(labels.shape, jnp.int32)
        shapes_fit = False
    mask = _check_mask(mask, labels.shape, problems)
    # Outside jit, the unmasked labels only (padding is often -100); with numpy, as labels
    # that are a constant inside jit are concrete, but jnp ops on them trace.
    if shapes_fit and not any(isinstance(x, jax.core.Tracer) for x in (labels, mask)):
        unmasked = np.asarray(labels)[np.asarray(mask)]
        if unmasked.size:
            low, high = int(unmasked.min()), int(unmasked.max())
            if low < 0 or high >= num_classes:
                # int64 labels beyond int32 come clipped to its bounds (`_arrays`): a sentinel
                # of -2**63 is no -2**31 in the data.
                bounds = np.iinfo(np.int32)
                low_text = f"{low} or below" if low == bounds.min else str(low)
                high_text = f"{high} or above" if high == bounds.max else str(high)
                problems.value_problem(
                    f"labels must lie in [0, {num_classes}) for {num_classes} classes, got "
                    f"values from {low_text} to {high_text} where the mask is true; {fix} (inside "
                    "jit, out-of-range labels are ignored like masked ones)"
                )
    problems.raise_if_any()
    return labels, mask & (labels >= 0) & (labels < num_classes)


_SETTINGS = ("threshold", "average", "beta", "k", "num_bins")
# num_thresholds: metrax's AUCROC's name (200 of them were read as 1,000 bins).
_ALIASES = {
    "avg": "average",
    "top_k": "k",
    "topk": "k",
    "bins": "num_bins",
    "n_bins": "num_bins",
    "num_thresholds": "num_bins",
}


def _refuse_misspelled(cls: type, others: dict[str, Any], settings: tuple[str, ...]) -> None:
    """Refuses a scalar or str under a misspelling or alias of one of `settings` (`Beta=2.0`
    or `avg=` were silently ignored); arrays and lists are model outputs a CLU `Collection`
    passes to every metric."""
    for name, value in others.items():
        if name in _SETTINGS or not isinstance(value, int | float | str | np.generic):
            continue  # another metric's setting or a model output, passed through a Collection
        close = [_ALIASES[name]] if _ALIASES.get(name) in settings else []
        if close or (close := difflib.get_close_matches(name.lower(), settings, n=1, cutoff=0.8)):
            raise TypeError(
                f"{cls.__name__}.from_model_output: unknown keyword {name!r}; did you mean "
                f"{close[0]!r}? Its settings are {', '.join(settings)}"
            )


class _Required:
    def __repr__(self) -> str:
        return "<required>"


# The default of `predictions` and `labels`: required, but a CLU `Collection` passes model
# outputs by keyword and CLU's `Accuracy` takes `logits=`, which these scores may come as.
_REQUIRED: Any = _Required()


def _outputs(
    cls: type,
    predictions: Any,
    labels: Any,
    others: dict[str, Any],
    probabilities: bool = False,
    class_scores: bool = False,
) -> tuple[jax.Array, jax.Array, str]:
    """`predictions`, or `logits=` in their place unless they are `probabilities`, `labels`
    (both as arrays, by `_arrays`), and the scores' name as passed (for the messages);
    refuses them missing. Beside
    `predictions=`, `logits=` are another metric's (a Collection passes CLU's `Accuracy` and
    `AUROC` the same outputs): `metrics_manager.nnx.Metric` takes `predictions=` then too.
    Except for a metric of `class_scores` only (TopKAccuracy, Perplexity): `predictions=` of
    the labels' shape are then AUROC's probabilities, never its input, and `logits=` of shape
    [..., C] are read instead (by shape alone, so under jit too)."""
    name, logits = f"{cls.__name__}.from_model_output", others.get("logits")
    if predictions is _REQUIRED and logits is not None and probabilities:
        raise TypeError(
            f"{name}: got logits= but no predictions=; AUROC takes scores in [0, 1] as "
            "predictions=, e.g. predictions=jax.nn.sigmoid(logits)"
        )
    scores = "predictions"
    if predictions is _REQUIRED and logits is not None:
        predictions, scores = logits, "logits"
    if missing := [
        n for n, v in (("predictions", predictions), ("labels", labels)) if v is _REQUIRED
    ]:
        also = "" if probabilities else " (the scores may come as logits=)"
        raise TypeError(f"{name}: missing {' and '.join(missing)}; pass them{also}")
    predictions, labels = _arrays(cls, **{scores: predictions, "labels": labels})
    if class_scores and scores == "predictions" and logits is not None:
        shape = np.shape(logits)  # without converting: an unread other output stays as it is
        if predictions.shape == labels.shape and shape[:-1] == labels.shape and len(shape):
            (predictions,) = _arrays(cls, logits=logits)
            scores = "logits"
    return predictions, labels, scores


def _bin_counts(indices: jax.Array, where: jax.Array, length: int) -> jax.Array:
    """How many true `where` fall on each index in [0, length), in int32: a float32
    scatter-add stops growing at 2**24, which one 64x512x512 batch of pixels reaches."""
    counts = jnp.zeros(length, jnp.int32).at[indices]
    if (mesh := explicit_mesh(indices) or explicit_mesh(where)) is None:
        return counts.add(where.astype(jnp.int32), mode="drop")
    replicated = jax.sharding.NamedSharding(mesh, jax.P())  # each device's partial counts, summed
    return counts.add(where.astype(jnp.int32), mode="drop", out_sharding=replicated)


def _add_shape_problem(
    problems: Problems,
    scores: jax.Array,
    labels: jax.Array,
    expected: str,
    name: str,
    others: dict[str, Any],
) -> None:
    beside = (
        "; the logits= passed beside them are not read (another metric's, as CLU's Accuracy "
        "takes): to score those, give this metric a Collection of its own"
        if name == "predictions" and others.get("logits") is not None
        else ""
    )
    if scores.shape == labels.shape and _one_hot(labels):
        beside += "; " + _ONE_HOT_FIX.format(shape=labels.shape[:-1])
    problems.value_problem(
        f"{name} of shape {scores.shape} do not fit labels of shape {labels.shape}: "
        f"expected {expected}{beside}"
    )


def _one_hot(labels: jax.Array) -> bool:
    """Whether concrete `labels` of rank >= 2 look one-hot: 0/1 integers, one 1 per last-axis
    row (class scores of the labels' shape then read as binary ones, or a rank too few)."""
    if labels.ndim < 2 or labels.shape[-1] < 2 or isinstance(labels, jax.core.Tracer):
        return False
    if not (labels.dtype == bool or jnp.issubdtype(labels.dtype, jnp.integer)):
        return False
    values = np.asarray(labels).astype(np.int64)
    return bool(((values == 0) | (values == 1)).all() and (values.sum(-1) == 1).all())


def _binary_fix(labels: jax.Array) -> str:
    """The fix for binary scores outside [0, 1] beside `labels`: logits passed as
    probabilities, or class logits beside one-hot labels."""
    fix = "pass jax.nn.sigmoid(logits), or threshold=0.0 to threshold the logits"
    if _one_hot(labels):  # class logits beside one-hot labels: no binary scores
        fix = _ONE_HOT_FIX.format(shape=labels.shape[:-1]) + ", for class scores; or " + fix
    return fix


_ONE_HOT_FIX = (
    "the labels look one-hot (one 1 per row of their last axis): pass labels.argmax(-1), "
    "integer class indices of shape {shape}"
)


def _arrays(cls: type, method: str = "from_model_output", **arrays: Any) -> list[jax.Array]:
    """`arrays` as JAX arrays; a missing model output (None) or text is refused by name (JAX's
    own error names neither the metric nor the argument)."""
    out = []
    for name, value in arrays.items():
        dtype = getattr(value, "dtype", None)
        if (
            isinstance(dtype, np.dtype)
            and dtype.kind in "iu"
            and dtype.itemsize > 4
            and jax.dtypes.canonicalize_dtype(dtype).itemsize == 4
        ):  # Without x64, JAX wraps int64 to int32: -2**63 (a sentinel) read as class 0.
            # Clipped, a value beyond int32 stays outside [0, C): refused or left out.
            low, high = np.iinfo(np.int32).min if dtype.kind == "i" else 0, 2**31 - 1
            value = np.clip(value, low, high).astype(np.int32)
        try:
            out.append(jnp.asarray(value))
        except (TypeError, ValueError) as err:
            raise TypeError(
                f"{cls.__name__}.{method}: {name} must be an array of numbers, got "
                f"{describe(value)}; check the model output passed in."
            ) from err
    return out


def _outside_unit_interval(
    scores: jax.Array,
    mask: jax.Array,
    problems: Problems,
    fix: str | Callable[[], str],
    name: str = "predictions",
) -> jax.Array:
    """How many `scores` where `mask` is true are outside [0, 1] or NaN (logits passed as
    probabilities); outside jit, a count above 0 raises, naming their range and `fix` (a
    callable: made only then)."""
    scores = scores.astype(jnp.result_type(scores, jnp.float32))
    outside = exact_count(mask & ~((scores >= 0) & (scores <= 1)))
    if not isinstance(outside, jax.core.Tracer) and (n := int(outside)):
        counted = jnp.where(mask, scores, jnp.nan)  # masked-out padding is no problem
        low, high = np.asarray(jnp.nanmin(counted)), np.asarray(jnp.nanmax(counted))
        # str: 0.3, not 0.300..1
        span = "all NaN" if np.isnan(low) else f"from {low!s} to {high!s}, or NaN"
        problems.value_problem(
            f"{name} must be probabilities in [0, 1]; {n} of "
            f"{int(exact_count(jnp.broadcast_to(mask, counted.shape)))} unmasked are not "
            f"({span}): {fix() if callable(fix) else fix}"
        )
        problems.raise_if_any()
    return outside


def _nan_scores(scores: jax.Array, mask: jax.Array, problems: Problems, name: str) -> jax.Array:
    """How many labels where `mask` is true have a NaN score (of any class, for [..., C]
    scores: pass the argmax's, which is NaN if any is): argmax and top_k rank NaN first, a
    threshold reads it as negative, each a plausible prediction. Outside jit, a count above
    0 raises."""
    nan = jnp.isnan(scores) if scores.shape == mask.shape else jnp.isnan(scores).any(axis=-1)
    count = exact_count(mask & nan)
    if not isinstance(count, jax.core.Tracer) and (n := int(count)):
        problems.value_problem(
            f"{name} are NaN for {n} of the {int(exact_count(mask))} labels where the mask is "
            f"true ({mask.size} in all), which would count as predictions (argmax and top_k "
            "rank NaN first, a threshold reads "
            "it as negative); check the model for a divergence or mask them out (under jit "
            "the value is NaN)"
        )
        problems.raise_if_any()
    return count


def _divide(numerator: jax.Array, denominator: jax.Array) -> jax.Array:
    """`numerator / denominator` in float32, 0 where the denominator is 0 (sklearn's default);
    in NumPy for host copies (`array_module`)."""
    xp, (numerator, denominator) = array_module(numerator, denominator)
    numerator, denominator = numerator.astype(jnp.float32), denominator.astype(jnp.float32)
    return xp.where(denominator > 0, numerator / xp.where(denominator > 0, denominator, 1), 0.0)


@flax.struct.dataclass(kw_only=True)
class _Counts(clu_metrics.Metric):
    """Array fields start at float32 zero counts and merge by addition; settings must agree."""

    @classmethod
    def empty(cls) -> Any:
        arrays = [f.name for f in dataclasses.fields(cls) if f.metadata.get("pytree_node", True)]
        return cls(**{name: jnp.zeros((), COUNT_DTYPE) for name in arrays})

    @classmethod
    def check_settings(cls, **settings: Any) -> None:
        """Refuses settings no batch would accept (`nnx.Metric` checks them when it is made).

        Raises:
            TypeError: `k` or `num_bins` is not an int, `beta` or `threshold` not a number.
            ValueError: `average` is not one of sklearn's, `k` or `num_bins` < 1, `beta` not
                finite and > 0, or `threshold` NaN.
        """
        problems = Problems(cls.__name__)
        for name, value in settings.items():
            number = not isinstance(value, bool) and isinstance(value, int | float | np.number)
            if name == "average" and value not in (None, *_AVERAGES):
                problems.value_problem(f"average must be one of {_AVERAGES!r}, got {value!r}")
            elif name in ("k", "num_bins") and not (number and isinstance(value, int | np.integer)):
                problems.type_problem(f"{name} must be an int, got {describe(value)}")
            elif name in ("k", "num_bins") and value < 1:
                problems.value_problem(f"{name} must be at least 1, got {value}")
            elif name in ("beta", "threshold") and not (number or value is None):
                problems.type_problem(f"{name} must be a Python number, got {describe(value)}")
            elif name == "beta" and not (value is not None and 0 < value < math.inf):
                problems.value_problem(f"beta must be a finite number > 0, got {value}")
            elif name == "threshold" and value is not None and math.isnan(value):
                problems.value_problem("threshold must be a number, got NaN")
        problems.raise_if_any()

    def merge(self, other: Any) -> Any:
        check_merge_type(self, other)
        merged: dict[str, Any] = {}
        fields = dataclasses.fields(self)  # settings first: they explain a shape mismatch
        for field in sorted(fields, key=lambda f: f.metadata.get("pytree_node", True)):
            mine, theirs = getattr(self, field.name), getattr(other, field.name)
            if field.metadata.get("pytree_node", True):
                try:
                    jnp.broadcast_shapes(jnp.shape(mine), jnp.shape(theirs))
                except ValueError:
                    raise ValueError(
                        f"{type(self).__name__}.merge: cannot merge {field.name} of shape "
                        f"{jnp.shape(mine)} with shape {jnp.shape(theirs)} (a different number "
                        "of classes or bins); use one per metric key or two keys."
                    ) from None
                merged[field.name] = mine + theirs
            elif mine is None or theirs is None or mine == theirs:
                merged[field.name] = theirs if mine is None else mine  # None: an `empty()`
            else:
                raise ValueError(
                    f"{type(self).__name__}.merge: cannot merge metrics with {field.name}={mine!r} "
                    f"and {field.name}={theirs!r}; use one {field.name} per metric key or two keys."
                )
        return self.replace(**merged)


@flax.struct.dataclass(kw_only=True)
class _ConfusionCounts(_Counts):
    """Per-class true positive, false positive and false negative counts, scored by `_score`."""

    true_positives: jax.Array
    false_positives: jax.Array
    false_negatives: jax.Array
    # Scores that are NaN, or binary ones outside [0, 1] at the default threshold (logits):
    # the value is then NaN.
    outside: ArrayLike = 0
    average: Average | None = flax.struct.field(pytree_node=False, default=None)

    @classmethod
    def from_model_output(
        cls,
        predictions: ArrayLike = _REQUIRED,
        labels: ArrayLike = _REQUIRED,
        mask: ArrayLike | None = None,
        *,
        threshold: float | None = None,
        average: Average | None = None,
        **others: Any,
    ) -> Any:
        """Counts one batch.

        Args:
            predictions: binary scores of the labels' shape, or [..., C] scores (argmax wins);
                or as `logits=`, which beside `predictions=` are another metric's, not read.
            labels: integer class indices (0/1 for binary scores), shape [...].
            mask: bool mask over the labels' leading dimensions; False entries are ignored.
            threshold: binary scores only: where a score becomes a positive prediction.
                None: 0.5, for probabilities; scores outside [0, 1] (logits) are then refused
                (under jit: the value is NaN). Pass 0.0 to threshold logits.
            average: "binary" (default for binary scores), "micro" or "macro" (for C classes).

        Raises:
            TypeError: `labels` are not integers, or `threshold` is not a number.
            ValueError: shapes, `average` or a `threshold` for class scores do not fit, or
                (outside jit) a label is not in [0, C) or a binary score is not in [0, 1] at
                the default threshold.
        """
        _refuse_misspelled(cls, others, ("threshold", "average"))
        problems = Problems(f"{cls.__name__}.from_model_output")
        predictions, labels, name = _outputs(cls, predictions, labels, others)
        num_classes, binary, fits = 2, predictions.shape == labels.shape, True
        if binary:
            if isinstance(threshold, np.floating | np.integer) and np.ndim(threshold) == 0:
                threshold = threshold.item()  # a NumPy scalar: a number like any other
            if threshold is not None and (
                isinstance(threshold, bool) or not isinstance(threshold, int | float)
            ):
                problems.type_problem(
                    f"threshold must be a Python number (it is static under jit), got "
                    f"{describe(threshold)}; pass float(threshold)"
                )
                threshold = None
            elif threshold is not None and math.isnan(threshold):  # every score would be < it
                problems.value_problem("threshold must be a number, got NaN")
                threshold = None
            # In float32 at least: a bf16 score compared to 0.7 rounded it to 0.69921875 first.
            scores = predictions.astype(jnp.result_type(predictions, jnp.float32))
            predicted = (scores >= (0.5 if threshold is None else threshold)).astype(jnp.int32)
        elif predictions.shape[:-1] == labels.shape and predictions.shape[-1] >= 2:
            num_classes = predictions.shape[-1]
            predicted = jnp.argmax(predictions, axis=-1).astype(jnp.int32)
            if threshold is not None:  # ignored, it would give the same numbers at any value
                problems.value_problem(
                    f"threshold={threshold!r} applies to binary scores only, got "
                    f"{num_classes}-class scores of shape {predictions.shape} (argmax wins); "
                    "drop threshold, or pass one class's scores of the labels' shape"
                )
        else:
            shapes = f"{labels.shape} (binary scores) or {labels.shape + ('C',)} with C >= 2"
            expected = shapes + " (one score per class)"
            _add_shape_problem(problems, predictions, labels, expected, name, others)
            predicted, fits = jnp.zeros(labels.shape, jnp.int32), False
        fix = (  # class ids as predictions (sklearn's y_pred) read as binary scores
            f"{name} of the labels' shape are binary scores: for more classes pass "
            "[..., C] scores (logits), or predicted class ids as jax.nn.one_hot(ids, C)"
            if binary
            else "check the label vocabulary or the number of classes"
        )
        labels, mask = _checked_labels_and_mask(labels, mask, num_classes, problems, fits, fix)
        if binary and threshold is None:  # NaN is outside [0, 1]
            outside = _outside_unit_interval(
                predictions, mask, problems, functools.partial(_binary_fix, labels), name
            )
        elif binary:
            outside = _nan_scores(predictions, mask, problems, name)
        else:  # jnp.argmax picks a NaN: its score is NaN if any of the row's is, one read
            outside = _nan_scores(take_last(predictions, predicted), mask, problems, name)
        average = "binary" if average is None and binary else average
        if average is None:  # class scores have no default: "average=None does not fit"
            raise ValueError(
                f"{cls.__name__}.from_model_output: average is required for {num_classes}-class "
                f"scores: pass average='micro' or average='macro' (sklearn's average argument; "
                "'binary' is for binary scores of the labels' shape)"
            )
        if average not in _AVERAGES or (average == "binary" and not binary):
            expected = f"one of {_AVERAGES!r}" if binary else "'micro' or 'macro'"
            raise ValueError(
                f"{cls.__name__}.from_model_output: average={average!r} does not fit "
                f"{'binary scores' if binary else f'{num_classes}-class scores'}; expected "
                f"{expected} (sklearn's average argument)"
                + (
                    "; for binary precision of 2-class scores, pass the positive class's "
                    "probability as binary scores: jax.nn.softmax(logits)[..., 1]"
                    if average == "binary" and num_classes == 2
                    else ""
                )
            )
        # Scatter-adds instead of one-hot products: memory O(C), not O(tokens x C).
        true_positives = _bin_counts(labels, mask & (predicted == labels), num_classes)
        predicted_counts = _bin_counts(predicted, mask, num_classes)
        label_counts = _bin_counts(labels, mask, num_classes)
        return cls(
            true_positives=true_positives.astype(COUNT_DTYPE),
            false_positives=(predicted_counts - true_positives).astype(COUNT_DTYPE),
            false_negatives=(label_counts - true_positives).astype(COUNT_DTYPE),
            outside=outside,
            average=average,
        )

    def _score(self, tp: jax.Array, fp: jax.Array, fn: jax.Array) -> jax.Array:
        raise TypeError(
            f"{type(self).__name__} holds confusion counts only; compute Precision, Recall or "
            "FBeta instead."
        )

    def compute(self) -> ArrayLike:
        counts = (self.true_positives, self.false_positives, self.false_negatives, self.outside)
        xp, (tp, fp, fn, outside) = array_module(*counts)  # NumPy for host copies
        tp, fp, fn = xp.atleast_1d(tp, fp, fn)
        with np.errstate(all="ignore"):  # inf counts: NaN, as jnp gives, without a warning
            if self.average == "binary":
                score = self._score(tp[-1], fp[-1], fn[-1])
            elif self.average == "macro":
                seen = (tp + fp + fn) > 0
                per_class = xp.where(seen, self._score(tp, fp, fn), 0.0)
                score = _divide(per_class.sum(), seen.sum())
            else:
                score = self._score(tp.sum(), fp.sum(), fn.sum())  # micro, or nothing seen yet
        return host_value(xp.where(outside == 0, score, xp.nan))


@flax.struct.dataclass(kw_only=True)
class Precision(_ConfusionCounts):
    """Precision `tp / (tp + fp)`: `sklearn.metrics.precision_score(..., average=average)`.

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
    """Recall `tp / (tp + fn)`: `sklearn.metrics.recall_score(..., average=average)`.

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
    """F-beta `(1 + b^2) tp / ((1 + b^2) tp + b^2 fn + fp)`: `sklearn.metrics.fbeta_score`.

    Example:
        >>> import jax.numpy as jnp
        >>> scores, labels = jnp.array([0.9, 0.8, 0.2, 0.6]), jnp.array([1, 0, 1, 1])
        >>> round(float(FBeta.from_model_output(scores, labels, beta=1.0).compute()), 6)
        0.666667
    """

    beta: float | None = flax.struct.field(pytree_node=False, default=None)

    @classmethod
    def from_model_output(  # type: ignore[override]
        cls,
        predictions: ArrayLike = _REQUIRED,
        labels: ArrayLike = _REQUIRED,
        mask: ArrayLike | None = None,
        *,
        beta: float = 1.0,
        threshold: float | None = None,
        average: Average | None = None,
        **others: Any,
    ) -> "FBeta":
        """Counts one batch; as `Precision.from_model_output`, plus `beta` (> 0, static)."""
        _refuse_misspelled(cls, others, ("beta", "threshold", "average"))
        if isinstance(beta, np.floating | np.integer) and np.ndim(beta) == 0:
            beta = beta.item()  # a NumPy scalar, as `check_settings` takes it
        number = not isinstance(beta, bool) and isinstance(beta, int | float)
        if not (number and 0 < beta < math.inf):  # inf: NaN, not recall
            raise (ValueError if number else TypeError)(
                f"FBeta.from_model_output: beta must be a finite Python number > 0, got "
                f"{describe(beta)}; use beta=1.0 for F1, 0.5 to favour precision, 2.0 recall"
            )
        counts = super().from_model_output(
            predictions, labels, mask, threshold=threshold, average=average, **others
        )
        return counts.replace(beta=float(beta))

    def _score(self, tp: jax.Array, fp: jax.Array, fn: jax.Array) -> jax.Array:
        b2 = (1.0 if self.beta is None else self.beta) ** 2
        tp, fp, fn = (x.astype(jnp.float32) for x in (tp, fp, fn))
        return _divide((1 + b2) * tp, (1 + b2) * tp + b2 * fn + fp)


@flax.struct.dataclass(kw_only=True)
class TopKAccuracy(_Counts):
    """The fraction of labels among the `k` highest-scored classes (ties: lower index first).

    Example:
        >>> import jax.numpy as jnp
        >>> logits = jnp.array([[0.5, 0.3, 0.2], [0.1, 0.3, 0.6]])
        >>> float(TopKAccuracy.from_model_output(logits, jnp.array([1, 0]), k=2).compute())
        0.5
    """

    correct: jax.Array
    count: jax.Array
    outside: ArrayLike = 0  # labels with a NaN score seen: the value is then NaN
    k: int | None = flax.struct.field(pytree_node=False, default=None)

    @classmethod
    def from_model_output(
        cls,
        predictions: ArrayLike = _REQUIRED,
        labels: ArrayLike = _REQUIRED,
        mask: ArrayLike | None = None,
        *,
        k: int,
        **others: Any,
    ) -> "TopKAccuracy":
        """Counts one batch of [..., C] scores per class and integer labels [...], 1 <= k <= C.
        The scores may come as `logits=`, which beside `predictions=` are not read, unless
        those have the labels' shape (AUROC's, in a Collection) and the logits fit.

        Raises:
            TypeError: `labels` are not integers or `k` is not an int.
            ValueError: shapes or `k` do not fit, or (outside jit) a label is outside `[0, C)`.
        """
        _refuse_misspelled(cls, others, ("k",))
        problems = Problems(f"{cls.__name__}.from_model_output")
        predictions, labels, name = _outputs(cls, predictions, labels, others, class_scores=True)
        num_classes = predictions.shape[-1] if predictions.ndim else 0
        fits = predictions.ndim > 0 and predictions.shape[:-1] == labels.shape
        if not fits:
            expected = f"{labels.shape + ('C',)}, one score per class"
            _add_shape_problem(problems, predictions, labels, expected, name, others)
        if isinstance(k, bool) or not isinstance(k, int | np.integer):
            problems.type_problem(f"k must be an int, got {describe(k)}")
        elif k < 1:
            problems.value_problem(f"k={k} must be at least 1; k=1 is the argmax's accuracy")
        elif fits and k > num_classes:
            problems.value_problem(
                f"k={k} must lie in [1, {num_classes}] for {num_classes} classes (the last "
                f"axis of {name}); choose a smaller k or check the {name}' shape"
            )
        labels, mask = _checked_labels_and_mask(labels, mask, num_classes, problems, fits)
        outside = _nan_scores(predictions, mask, problems, name)
        if (sharding := vocab_sharding(predictions)) is not None:
            # top_k refuses a sharded axis; an Auto mesh all-gathers it the same way.
            whole = sharding.update(spec=jax.P(*sharding.spec[:-1], None))
            predictions = jax.sharding.reshard(predictions, whole)
        top = jax.lax.top_k(predictions, int(k))[1]
        hit = (top == labels[..., None]).any(axis=-1) & mask
        return cls(correct=exact_count(hit), count=exact_count(mask), outside=outside, k=int(k))

    def compute(self) -> ArrayLike:
        xp, (correct, count, outside) = array_module(self.correct, self.count, self.outside)
        valid = (count > 0) & (outside == 0)
        with np.errstate(all="ignore"):  # inf / inf: NaN, as jnp gives, without a warning
            return host_value(xp.where(valid, _divide(correct, count), xp.nan))  # NumPy on host


@flax.struct.dataclass(kw_only=True)
class AUROC(_Counts):
    """Area under the ROC curve of binary scores in [0, 1], over `num_bins` equal bins.

    Counts labels per bin: exactly sklearn's `roc_auc_score` of the binned scores
    (`floor(score * num_bins)`, a score of 1.0 in the last bin, with [1 - 1 / num_bins, 1)).
    Against raw scores, a (positive, negative) pair sharing a bin counts 1/2 instead of 0 or
    1, so the area is off by at most half the fraction of pairs that share a bin: about
    `1 / num_bins` when both classes' scores spread over [0, 1], but up to the whole way to
    0.5 when they bunch into a few bins, as a rare-event model's probabilities below
    `1 / num_bins` all fall into bin 0 (or a confident classifier's near 1 into the last).
    The area depends only on the scores' order, so a monotone transform that spreads them
    restores it: `jax.nn.sigmoid(logits - c)` with `c` near the middle of the logits (of
    probabilities `p`, `jax.scipy.special.logit(p)`); or more bins, enough that the scores to
    tell apart are `1 / num_bins` apart. A score outside [0, 1] (a logit passed as a
    probability, or NaN) is refused outside jit; inside it is counted, and the value is NaN,
    since binning such scores would give a plausible wrong area.

    Example:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> scores, labels = jnp.array([0.1, 0.4, 0.35, 0.8]), jnp.array([0, 0, 1, 1])
        >>> float(AUROC.from_model_output(scores, labels).compute())
        0.75
        >>> rare = jnp.array([1e-4, 2e-4, 3e-4, 4e-4])  # all in bin 0 of 1,000: raw area 1.0
        >>> float(AUROC.from_model_output(rare, labels).compute())
        0.5
        >>> spread = jax.nn.sigmoid(jax.scipy.special.logit(rare) + 8.5)  # same order
        >>> float(AUROC.from_model_output(spread, labels).compute())
        1.0
    """

    positives: jax.Array
    negatives: jax.Array
    outside: jax.Array  # scores outside [0, 1] (or NaN) seen: the area is then NaN
    num_bins: int | None = flax.struct.field(pytree_node=False, default=None)

    @classmethod
    def from_model_output(
        cls,
        predictions: ArrayLike = _REQUIRED,
        labels: ArrayLike = _REQUIRED,
        mask: ArrayLike | None = None,
        *,
        num_bins: int = 1000,
        **others: Any,
    ) -> "AUROC":
        """Counts one batch of scores in [0, 1] and 0/1 (or bool) labels of the same shape.

        Raises:
            TypeError: `labels` are not integers or `num_bins` is not an int.
            ValueError: the shapes differ, `num_bins` < 1, or (outside jit) a label is not 0/1.
        """
        _refuse_misspelled(cls, others, ("num_bins",))
        problems = Problems(f"{cls.__name__}.from_model_output")
        predictions, labels, _ = _outputs(cls, predictions, labels, others, probabilities=True)
        if predictions.shape != labels.shape:
            expected = f"{labels.shape}, one score of the positive class per label"
            _add_shape_problem(problems, predictions, labels, expected, "predictions", others)
        if isinstance(num_bins, bool) or not isinstance(num_bins, int | np.integer):
            problems.type_problem(f"num_bins must be an int, got {describe(num_bins)}")
            num_bins = 1
        elif num_bins < 1:
            problems.value_problem(f"num_bins must be >= 1, got {num_bins}")
        labels, mask = _checked_labels_and_mask(labels, mask, 2, problems)
        fix = "pass jax.nn.sigmoid(logits), not the logits"
        outside = _outside_unit_interval(predictions, mask, problems, fix)
        scores = predictions.astype(jnp.result_type(predictions, jnp.float32))
        num_bins = int(num_bins)
        bins = jnp.clip(jnp.floor(scores * num_bins), 0, num_bins - 1).astype(jnp.int32)
        return cls(
            positives=_bin_counts(bins, mask & (labels == 1), num_bins).astype(COUNT_DTYPE),
            negatives=_bin_counts(bins, mask & (labels == 0), num_bins).astype(COUNT_DTYPE),
            outside=outside,
            num_bins=num_bins,
        )

    def compute(self) -> ArrayLike:
        xp, fields = array_module(self.positives, self.negatives, self.outside)  # NumPy on host
        positives, negatives = (xp.atleast_1d(x).astype(jnp.float32) for x in fields[:2])
        with np.errstate(all="ignore"):  # inf counts: NaN, as jnp gives, without a warning
            num_positive, num_negative = positives.sum(), negatives.sum()
            # Positives in strictly higher bins than each bin, plus half of those in the same.
            above = num_positive - xp.cumsum(positives)
            wins = (negatives * (above + 0.5 * positives)).sum()
            pairs = num_positive * num_negative
            valid = (pairs > 0) & (fields[2] == 0)
            return host_value(xp.where(valid, wins / xp.where(pairs > 0, pairs, 1), xp.nan))


_LL_SLACK = 1e-4  # log-likelihoods this far above 0 are rounding, not losses passed by mistake


@flax.struct.dataclass(kw_only=True)
class Perplexity(_Counts):
    """`exp(total / count)`: the exponential of the mean negative log-likelihood per token.

    Log-likelihoods above 0 (losses passed by mistake) are refused outside jit; under jit,
    a window whose mean is above 0 is NaN.

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
        return cls(total=float_identity(), count=jnp.zeros((), COUNT_DTYPE))

    @classmethod
    def from_model_output(
        cls,
        predictions: ArrayLike = _REQUIRED,
        labels: ArrayLike = _REQUIRED,
        mask: ArrayLike | None = None,
        **others: Any,
    ) -> "Perplexity":
        """From logits [..., V] and integer labels [...]: log-softmax, then the labels' NLL.
        The logits come as `predictions` or `logits=` (beside `predictions=`, not read,
        unless those have the labels' shape, AUROC's in a Collection, and the logits fit).
        Probabilities as `predictions=` beside `logits=` are refused outside jit; under jit
        they are read as logits (a wrong value): nothing static tells them apart.

        Raises:
            TypeError: `labels` are not integers.
            ValueError: the shapes do not fit or (outside jit) a label is outside `[0, V)`,
                or the predictions are probabilities (rows in [0, 1] summing to 1).
        """
        problems = Problems(f"{cls.__name__}.from_model_output")
        predictions, labels, name = _outputs(cls, predictions, labels, others, class_scores=True)
        fits = predictions.ndim > 0 and predictions.shape[:-1] == labels.shape
        if not fits:
            expected = f"logits of shape {labels.shape + ('V',)}"
            _add_shape_problem(problems, predictions, labels, expected, name, others)
        vocab = predictions.shape[-1] if predictions.ndim else 1
        labels, mask = _checked_labels_and_mask(labels, mask, vocab, problems, fits)
        log_probs = jax.nn.log_softmax(predictions.astype(jnp.float32), axis=-1)
        if fits and not any(isinstance(x, jax.core.Tracer) for x in (predictions, mask)):
            # Probabilities (metrax's default input) read as logits give a plausible wrong
            # value: 2.13 for 1.02. Rows in [0, 1] summing to 1, not one-hot test logits.
            scores = predictions.astype(jnp.float32)
            unit = ((scores >= 0) & (scores <= 1)).all(-1) & (abs(scores.sum(-1) - 1) < 1e-2)
            inside = ((scores > 0) & (scores < 1)).any(-1)
            if int(exact_count(mask)) and bool((unit | ~mask).all() & (inside & mask).any()):
                problems.value_problem(
                    f"{name} look like probabilities (each unmasked row in [0, 1], "
                    "summing to 1), not logits; pass the logits, or jnp.log(probabilities)"
                )
                problems.raise_if_any()
        picked = take_last(log_probs, jnp.clip(labels, 0, vocab - 1))
        return cls.from_log_likelihood(picked, mask)

    @classmethod
    def from_log_likelihood(
        cls, log_likelihood: ArrayLike, mask: ArrayLike | None = None
    ) -> "Perplexity":
        """From per-token log-likelihoods (<= 0), e.g. `-compute_token_losses(logits,
        targets).loss` (without label smoothing or z-loss, which that loss includes).

        Example:
            >>> import jax.numpy as jnp
            >>> metric = Perplexity.from_log_likelihood(jnp.log(jnp.array([0.5, 0.5, 0.1])),
            ...                                          mask=jnp.array([True, True, False]))
            >>> float(metric.compute())
            2.0
        """
        (log_likelihood,) = _arrays(cls, "from_log_likelihood", log_likelihood=log_likelihood)
        problems = Problems("Perplexity.from_log_likelihood")
        mask = _check_mask(mask, log_likelihood.shape, problems, of="log-likelihoods")
        traced = isinstance(log_likelihood, jax.core.Tracer) or isinstance(mask, jax.core.Tracer)
        if not traced and not problems:  # with numpy: see the labels' check
            ll, kept = np.asarray(log_likelihood, np.float32), np.asarray(mask)
            if n := int((kept & (ll > _LL_SLACK)).sum()):
                problems.value_problem(
                    f"log-likelihoods must be <= 0; {n} of {int(kept.sum())} are positive "
                    f"(up to {float(np.where(kept, ll, 0).max()):.4g}): pass "
                    "-loss (e.g. -compute_token_losses(logits, targets).loss), not the loss"
                )
        problems.raise_if_any()
        nll = -log_likelihood.astype(jnp.result_type(log_likelihood, jnp.float32))
        return cls(total=jnp.where(mask, nll, 0).sum(), count=exact_count(mask))

    def compute(self) -> ArrayLike:
        xp, (total, count) = array_module(self.total, self.count)  # NumPy for host copies
        with np.errstate(all="ignore"):  # inf / inf, exp(89) past float32: NaN, inf as in jnp
            mean = total / xp.maximum(count, 1).astype(xp.result_type(total))
            if xp is np:  # in float64, rounded once: within 1 ulp of jnp.exp (NumPy's float32
                # exp is up to 3 ulp from it; XLA's own differs between devices)
                perplexity = np.exp(mean.astype(np.float64)).astype(mean.dtype)
            else:
                perplexity = jnp.exp(mean)
        # A mean NLL below 0 is no likelihood's: losses were passed as log-likelihoods.
        return host_value(xp.where((count > 0) & (mean >= -_LL_SLACK), perplexity, xp.nan))
