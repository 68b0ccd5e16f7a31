"""Flax NNX-style stateful metrics over this library's mergeable metrics, and NNX interop.

`Metric`, `Average`, `Accuracy`, `Welford` and `MultiMetric` have the names and API of
`flax.nnx.metrics` (`update(**kwargs)`, `compute()`, `reset()`), but each holds an immutable
CLU metric (`.metric`) that `update()` replaces by `metric.merge(type.from_model_output(...))`:
they work in Flax's `nnx.MultiMetric` and `nnx.jit`, and their state merges like any metric.
`as_summary_metrics` turns an `nnx.MultiMetric` or its `compute()` dict into what
`MetricsManager.write_metrics_summary` takes.

Synopsis:

    metrics = MultiMetric(loss=Average(), accuracy=Accuracy(), f1=Metric(FBeta, average="macro"))

    @nnx.jit
    def eval_step(model, metrics, batch):
        logits = model(batch["x"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
        metrics.update(values=loss, logits=logits, labels=batch["y"])

    ...  # eval_step over the batches
    manager.write_metrics_summary(as_summary_metrics(metrics), step, num_steps=1)
    metrics.reset()
"""

import collections
import dataclasses
import inspect
import logging
import math
import weakref
from collections.abc import Mapping
from typing import Any

import clu.metrics as clu_metrics
import clu.values
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax._src import core as _jax_core

from metrics_manager import metrics as _metrics
from metrics_manager.classification import (
    _REQUIRED,
    AUROC,
    Perplexity,
    TopKAccuracy,
    _arrays,
    _check_mask,
    _ConfusionCounts,
)
from writers._checks import Problems, describe

__all__ = ["Accuracy", "Average", "Metric", "MultiMetric", "Welford", "as_summary_metrics"]

SummaryMetrics = dict[str, clu_metrics.Metric | clu_metrics.Collection | clu.values.Value]
_LOG = logging.getLogger(__name__)
_CLU_VALUE_NAMES = ("Scalar", "Text", "Image", "Audio", "Histogram", "HyperParam", "Summary")
# Their from_model_output reads logits= as its scores (AUROC's are probabilities: predictions=).
_READS_LOGITS = (_ConfusionCounts, TopKAccuracy, Perplexity)
# The loops whose carry keeps its shapes, by JAX's name of the body's trace. JAX's own error
# names the carry's leaves, not the fix; the lookup is JAX's internals, so without them
# (another JAX version) the check is skipped and JAX's error comes as before.
_LOOPS = {"scan": "nnx.scan", "fori_loop": "nnx.fori_loop", "while_body": "nnx.while_loop"}
_CLU_TYPES = (
    clu_metrics.Metric,
    clu_metrics.Collection,  # written as 'key/<field>', as beside metrics alone
    *(getattr(clu.values, name) for name in _CLU_VALUE_NAMES),
)


class Metric(nnx.metrics.Metric):
    """The NNX API over a mergeable CLU metric type.

    `update(**kwargs)` passes `metric_type.from_model_output` the arguments it accepts (so a
    `MultiMetric` can pass all metrics the same ones), renamed by `argnames`, plus `settings`;
    `logits=` becomes `predictions=` for a type that takes only the latter (AUROC's
    probabilities), unless another argument (`predictions=`, or one that `argnames` maps to
    it) supplies them; Precision, Recall, FBeta, TopKAccuracy and Perplexity, which read
    `logits=` themselves, get them as `logits=` (their messages name them so), beside
    `predictions=` too (TopKAccuracy and Perplexity read them beside AUROC's probabilities).

    Args:
        metric_type: a `clu.metrics.Metric` subclass, e.g. `metrics_manager.FBeta`.
        argnames: update argument name -> `from_model_output` parameter name.
        **settings: fixed, hashable keyword arguments of `from_model_output`, e.g. `k=5`.

    Raises:
        TypeError: `metric_type` is not a CLU metric type, or a setting is not hashable or
            not an argument of its `from_model_output` (unless that names none and takes any
            keyword, as CLU's `from_fun` metrics do).

    Example:
        >>> import jax.numpy as jnp
        >>> from metrics_manager.classification import Recall
        >>> recall = Metric(Recall, average="macro")
        >>> recall.update(logits=jnp.array([[2.0, 0.0], [2.0, 0.0]]), labels=jnp.array([0, 1]))
        >>> float(recall.compute())
        0.5
    """

    def __init__(
        self,
        metric_type: type[clu_metrics.Metric],
        *,
        argnames: Mapping[str, str] | None = None,
        **settings: Any,
    ):
        if not (isinstance(metric_type, type) and issubclass(metric_type, clu_metrics.Metric)):
            raise TypeError(
                f"Metric: metric_type must be a clu.metrics.Metric subclass, got "
                f"{describe(metric_type)}; pass the class, e.g. Metric(metrics_manager.FBeta)"
            )
        try:
            hash(tuple(settings.items()))
        except TypeError as err:
            raise TypeError(
                f"Metric({metric_type.__name__}): settings must be hashable Python values "
                f"(they are static under jit), got {settings!r}; pass arrays to update()"
            ) from err
        parameters = _parameters(metric_type)[0]
        named = sorted(parameters)
        # A required static field (TopKAccuracy's k) is a setting, not an update() argument.
        static = {f.name for f in dataclasses.fields(metric_type) if not _is_array(f)}
        # A from_fun/from_output metric names none: any keyword may be its function's.
        if named and (unknown := sorted(set(settings) - set(named))):
            known = [  # static fields and keyword-only options: not the model outputs
                n
                for n, p in sorted(parameters.items())
                if n in static or (p.kind is p.KEYWORD_ONLY and p.default is not p.empty)
            ]
            takes = f"the settings {known}" if known else "no settings"
            raise TypeError(
                f"Metric({metric_type.__name__}): unknown setting(s) {unknown}; "
                f"{metric_type.__name__}.from_model_output takes {takes} "
                f"({[n for n in named if n not in known]} are model outputs, for update())"
            )
        required = [
            n for n in named if n in static and parameters[n].default is inspect.Parameter.empty
        ]
        if missing := [n for n in required if n not in settings]:
            raise TypeError(
                f"Metric({metric_type.__name__}): missing setting(s) {missing}; pass them "
                f"here, e.g. Metric({metric_type.__name__}, {missing[0]}=...)"
            )
        if check := getattr(metric_type, "check_settings", None):
            check(**settings)  # bad values fail here, not at the first update under jit
        # Tuples, not dicts: static pytree attributes must be hashable for jit's cache.
        self.metric_type = metric_type
        self.argnames = tuple(sorted((argnames or {}).items()))
        self.settings = tuple(sorted(settings.items()))
        self.state = nnx.metrics.MetricState(self._empty())
        if _CHECK_RESET[0]:  # fresh: a summary of it holds no window yet
            _SUMMARIZED[self] = (jax.tree.leaves(self.metric), True)

    @property
    def metric(self) -> clu_metrics.Metric:
        """The CLU metric holding everything seen since the last `reset()`."""
        return self.state.get_value()

    def reset(self) -> None:
        """Starts over from `metric_type.empty()`."""
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(self.metric)):
            _SUMMARIZED.clear()  # a copy under nnx.jit: the loop's own object is not seen
            _CHECK_RESET[0] = False
        self.state.set_value(self._empty())
        if _CHECK_RESET[0]:
            _SUMMARIZED[self] = (jax.tree.leaves(self.metric), True)

    def _empty(self) -> clu_metrics.Metric:
        # With the settings that are static fields (TopKAccuracy's k): a carry of nnx.scan,
        # fori_loop or cond keeps its structure after the first update(). Counts per class or
        # bin (Precision, Recall, FBeta, AUROC) take their shape, and `average` its value,
        # from the first batch: update those once before a loop carries them.
        empty = self.metric_type.empty()
        static = {f.name for f in dataclasses.fields(empty) if not _is_array(f)}
        # Defaults too: a fresh FBeta has from_model_output's beta=1.0, as an updated one.
        parameters = _parameters(self.metric_type)[0].values()
        defaults = {p.name: p.default for p in parameters if p.default not in (p.empty, None)}
        fixed = {k: v for k, v in (defaults | dict(self.settings)).items() if k in static}
        empty = empty.replace(**fixed) if fixed else empty
        # CLU's Average and Std count in int32, which wrapped past 2**31 (600 steps of 4M
        # tokens): the window counts in float32 (each batch exactly, in int32; see
        # `COUNT_DTYPE`), in int64 under x64, where a batch counts in int64. Either way a
        # carry keeps its dtype at every merge.
        if issubclass(self.metric_type, clu_metrics.Average | clu_metrics.Std):
            x64 = jax.dtypes.canonicalize_dtype(jnp.int64) == jnp.int64
            return empty.replace(count=jnp.zeros((), jnp.int64 if x64 else _metrics.COUNT_DTYPE))
        return empty

    def update(self, **kwargs: Any) -> None:
        """Merges `metric_type.from_model_output(**kwargs)` into the state."""
        named, var_keyword = _parameters(self.metric_type)
        renamed = dict(self.argnames)
        # logits= stands for predictions= only where nothing else supplies them: beside
        # AUROC's probabilities (predictions= or a mapped name) it is the others' argument.
        supplied = {renamed.get(k, k) for k in kwargs if k != "logits"}
        if "predictions" in named.keys() - supplied and "logits" not in named:
            renamed.setdefault("logits", "predictions")
        # A renamed argument wins over one of its new name, whatever the keyword order:
        # Average("loss") beside Average() in a MultiMetric gets loss=, not values=.
        call = {k: v for k, v in kwargs.items() if k not in renamed}
        call |= {renamed[k]: v for k, v in kwargs.items() if k in renamed}
        call = {k: v for k, v in call.items() if var_keyword or k in named} | dict(self.settings)
        if (
            "predictions" in call
            and "predictions" in named
            and "logits" not in named
            and not issubclass(self.metric_type, _READS_LOGITS)
        ):  # another metric's, beside these predictions; those reading logits= pick
            call.pop("logits", None)  # (TopKAccuracy's beside AUROC's probabilities)
        required = {n for n, p in named.items() if p.default is p.empty or p.default is _REQUIRED}
        if "logits" in call and issubclass(self.metric_type, _READS_LOGITS):
            required.discard("predictions")  # argnames={"scores": "logits"} supplies them
        if missing := sorted(required - call.keys()):
            onto_logits = [k for k in kwargs if k != "logits" and renamed.get(k) == "logits"]
            if "predictions" in missing and onto_logits:  # AUROC: no remap of logits helps
                raise TypeError(
                    f"{type(self).__name__}({self.metric_type.__name__}).update: argnames "
                    f"maps {onto_logits[0]!r} to 'logits', which {self.metric_type.__name__} "
                    "does not read: it takes its scores as predictions=, probabilities in "
                    f"[0, 1]; pass argnames={{{onto_logits[0]!r}: 'predictions'}}"
                )
            # Named as the caller would pass them: 'logits' or 'predictions'.
            names = [
                " or ".join([*(repr(k) for k in renamed if renamed[k] == n), repr(n)])
                for n in missing
            ]
            # Accuracy() takes no argnames: suggested, Accuracy(argnames=...) raised.
            remap = "argnames" in inspect.signature(type(self).__init__).parameters
            raise TypeError(
                f"{type(self).__name__}({self.metric_type.__name__}).update: missing "
                f"{', '.join(names)} among the arguments {sorted(kwargs)}; pass them to update()"
                + (", or map your names with argnames={'yours': 'theirs'}" if remap else "")
            )
        if (
            renamed.get("logits") == "predictions"
            and "logits" in kwargs
            and issubclass(self.metric_type, _READS_LOGITS)
        ):  # passed on as logits=, which these read: their messages name what came
            call["logits"] = call.pop("predictions")
        merged = self.metric.merge(self.metric_type.from_model_output(**call))
        if loop := _carrying_loop(self.metric):
            self._check_carry(merged, loop)
        self.state.set_value(merged)

    def _check_carry(self, merged: clu_metrics.Metric, loop: str) -> None:
        """Refuses a state that changes shape inside a loop carrying it (a fresh or reset
        Precision's counts take their per-class shape from the first batch): JAX's carry
        error came later and named the leaves, not the fix."""
        for field in dataclasses.fields(merged):
            before = jnp.shape(getattr(self.metric, field.name))
            after = jnp.shape(getattr(merged, field.name))
            if _is_array(field) and before != after:
                raise TypeError(
                    f"{type(self).__name__}({self.metric_type.__name__}).update: inside {loop} "
                    f"the state's {field.name} changes shape from {before} to {after} (a fresh "
                    "or reset metric takes its per-class or per-bin shape from its first "
                    "batch), which the loop's carry cannot do; update the metric once before "
                    "the loop carries it"
                )

    def compute(self) -> Any:
        """`compute()` of the state (CLU's `Std` with its formula: clu 0.0.12's crashes)."""
        metric = self.metric
        if type(metric).compute is clu_metrics.Std.compute:
            mean = metric.total / metric.count
            return jnp.sqrt(jnp.maximum(metric.sum_of_squares / metric.count - mean**2, 0.0))
        return metric.compute()


def _carrying_loop(metric: clu_metrics.Metric) -> str | None:
    """The loop (`_LOOPS`) whose body is being traced with `metric`'s arrays as its own
    tracers (its carry), else None (eagerly, under jit, or with other JAX internals)."""
    trace = getattr(getattr(_jax_core, "trace_ctx", None), "trace", None)
    info = getattr(getattr(trace, "frame", None), "debug_info", None)
    loop = _LOOPS.get(getattr(info, "traced_for", None))  # type: ignore[arg-type]
    if loop is None:  # eagerly or under jit: the state's leaves are not looked at
        return None
    leaves = jax.tree.leaves(metric)
    return loop if leaves and all(getattr(x, "_trace", None) is trace for x in leaves) else None


def _is_array(field: dataclasses.Field) -> bool:
    return field.metadata.get("pytree_node", True)


def _parameters(metric_type: type[clu_metrics.Metric]) -> tuple[dict[str, Any], bool]:
    """`from_model_output`'s named parameters by name, and whether it takes any keyword."""
    parameters = inspect.signature(metric_type.from_model_output).parameters.values()
    named = {p.name: p for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return named, any(p.kind is p.VAR_KEYWORD for p in parameters)


class _ValuesMetric(Metric):
    def __init__(self, metric_type: type[clu_metrics.Metric], argname: str):
        super().__init__(metric_type, argnames={argname: "values"})
        self.argname = argname

    def update(self, **kwargs: Any) -> None:
        if self.argname not in kwargs:
            raise TypeError(
                f"{type(self).__name__}.update: expected the keyword argument {self.argname!r} "
                f"(this metric's argname), got {sorted(kwargs)}"
            )
        values, mask = kwargs[self.argname], kwargs.get("mask")
        if jnp.ndim(values) == 0:  # a step's loss: a mask is the others' (Flax)
            kwargs.pop("mask", None)
        elif mask is not None and not _metrics.mask_fits(jnp.shape(mask), jnp.shape(values)):
            fix = _metrics.mask_fix(jnp.shape(mask), jnp.shape(values)) or (
                "; a per-token mask beside per-sequence values needs its own MultiMetric, or "
                "reduce the mask (mask.any(-1))"
            )
            raise ValueError(
                f"{type(self).__name__}.update: mask of shape {jnp.shape(mask)} does not fit "
                f"{self.argname!r} of shape {jnp.shape(values)}: expected the values' leading "
                f"dims {jnp.shape(values)[: max(jnp.ndim(mask), 1)]}{fix}"
            )
        super().update(**kwargs)


class Average(_ValuesMetric):
    """The mean of every value seen (Flax's `nnx.metrics.Average`), NaN until one was seen.

    A `mask` leaves values out (read as bool, as CLU's `Average` reads it; Flax's weighs by
    an integer mask); one beside a scalar value (a step's loss) is the other metrics'.

    Args:
        argname: the `update()` argument holding the values.

    Example:
        >>> import jax.numpy as jnp
        >>> average = Average()
        >>> average.update(values=jnp.array([1, 2, 3, 4]))
        >>> float(average.compute())
        2.5
        >>> average.reset()
        >>> float(average.compute())
        nan
    """

    def __init__(self, argname: str = "values"):
        super().__init__(clu_metrics.Average, argname)

    def update(self, **kwargs: Any) -> None:
        if self.argname in kwargs:
            values = _metrics.host_floats(kwargs[self.argname])  # int64 past 2**31 unwrapped
            kwargs[self.argname] = jnp.asarray(values).astype(jnp.float32)
        super().update(**kwargs)


class Accuracy(Metric):
    """Flax's `nnx.metrics.Accuracy`: argmax (`TopKAccuracy(k=1)`) or a `threshold`.

    As Flax's, a `mask` leaves examples out; unlike Flax's, so does a label outside [0, C)
    (with a threshold: below 0), an ignore index such as -100 (outside jit, unmasked, it is
    refused): Flax counts it as a wrong prediction (with a threshold: as a negative).

    Args:
        threshold: for binary scores: the mean of `(logits >= threshold) == (labels > 0)`.

    Example:
        >>> import jax.numpy as jnp
        >>> accuracy = Accuracy()
        >>> accuracy.update(logits=jnp.array([[0.1, 0.9], [0.8, 0.2]]), labels=jnp.array([1, 1]))
        >>> float(accuracy.compute())
        0.5
    """

    def __init__(self, threshold: float | None = None):
        if isinstance(threshold, np.floating | np.integer) and np.ndim(threshold) == 0:
            threshold = threshold.item()  # a NumPy scalar, as Precision takes it
        if isinstance(threshold, bool) or not isinstance(threshold, int | float | None):
            raise TypeError(
                f"Accuracy: threshold must be a float or None, got {describe(threshold)}"
            )
        if threshold is not None and math.isnan(threshold):  # every score would be below it
            raise ValueError("Accuracy: threshold must be a number, got NaN")
        self.threshold = threshold
        if threshold is None:  # logits=, as Flax's, even beside another metric's predictions=
            super().__init__(TopKAccuracy, argnames={"logits": "predictions"}, k=1)
        else:
            super().__init__(clu_metrics.Average)

    def update(self, **kwargs: Any) -> None:  # type: ignore[override]
        if self.threshold is not None:
            if missing := sorted({"logits", "labels"} - kwargs.keys()):
                raise TypeError(f"Accuracy.update: missing {missing}, got {sorted(kwargs)}")
            # As the other metrics take them: int64 labels beyond int32 (a -2**63 sentinel)
            # stay negative, not wrapped to class 0.
            logits, labels = _arrays(
                type(self), "update", **{k: kwargs[k] for k in ("logits", "labels")}
            )
            if logits.shape != labels.shape:
                raise ValueError(
                    f"Accuracy.update: with a threshold, logits (shape {logits.shape}) and labels "
                    f"(shape {labels.shape}) must have the same shape"
                )
            # In float32 at least: bfloat16 rounded a threshold of 0.7 to 0.69921875 first.
            scores = logits.astype(jnp.result_type(logits, jnp.float32))
            correct = ((scores >= self.threshold) == (labels > 0)).astype(jnp.float32)
            problems = Problems("Accuracy.update")
            mask = _check_mask(kwargs.get("mask"), labels.shape, problems)
            problems.raise_if_any()
            # An ignore index (-100) is left out, as without a threshold: Flax's counts it
            # as a negative (a score below the threshold read as a right prediction).
            ignored = mask & (labels < 0)
            if not any(isinstance(x, jax.core.Tracer) for x in (labels, mask)) and (
                n := int(ignored.sum())
            ):
                raise ValueError(
                    f"Accuracy.update: {n} of {int(mask.sum())} labels where the mask is true "
                    "are negative (an ignore index such as -100?); with a threshold, labels "
                    "are 0 (negative) or above 0 (positive): mask the others out (under jit "
                    "they are left out)"
                )
            # At least 1-d: CLU's Average reads a mask's first dim (a 0-d one raised IndexError).
            kwargs = {"values": correct, "mask": jnp.atleast_1d(mask & ~ignored)}
            super().update(**kwargs)
            return
        try:
            super().update(**kwargs)
        except (TypeError, ValueError) as err:
            # Named as called: "TopKAccuracy.from_model_output: mask of shape ()" was no call
            # of the caller's, who made an Accuracy().
            message = str(err)
            for inner in ("TopKAccuracy.from_model_output: ", "Accuracy(TopKAccuracy).update: "):
                if message.startswith(inner):
                    raise type(err)("Accuracy.update: " + message[len(inner) :]) from None
            raise


class Welford(_ValuesMetric):
    """Flax's `nnx.metrics.Welford`: `compute()` gives the mean, sem and std as `Statistics`.

    Args:
        argname: the `update()` argument holding the values.

    Example:
        >>> import jax.numpy as jnp
        >>> welford = Welford()
        >>> welford.update(values=jnp.array([1, 2, 3, 4]))
        >>> stats = welford.compute()
        >>> [round(float(x), 6) for x in (stats.mean, stats.standard_error_of_mean,
        ...                               stats.standard_deviation)]
        [2.5, 0.559017, 1.118034]
    """

    def __init__(self, argname: str = "values"):
        super().__init__(_metrics.Welford, argname)

    def compute(self) -> nnx.metrics.Statistics:
        state = self.metric
        return nnx.metrics.Statistics(
            mean=jnp.asarray(state.mean),
            standard_error_of_mean=state.sem(),
            standard_deviation=state.std(),
        )


class MultiMetric(nnx.MultiMetric):
    """Flax's `nnx.MultiMetric`, with its members checked.

    Args:
        **metrics: name -> `flax.nnx.metrics.Metric` (the classes here or Flax's own).

    Raises:
        TypeError: a member is not an NNX metric.
        ValueError: a name is one of the methods (`update`, `compute`, `reset`, `split`).

    Example:
        >>> import jax.numpy as jnp
        >>> metrics = MultiMetric(loss=Average(), accuracy=Accuracy())
        >>> metrics.update(values=jnp.array([1.0, 3.0]), logits=jnp.eye(2), labels=jnp.array([0, 0]))
        >>> {k: float(v) for k, v in metrics.compute().items()}
        {'loss': 2.0, 'accuracy': 0.5}
    """

    def __init__(self, **metrics: nnx.metrics.Metric):
        problems = Problems()
        for name, metric in metrics.items():
            if name in ("update", "compute", "reset", "split") or name.startswith("_"):
                problems.value_problem(
                    f"{name!r} cannot name a metric (it is a method or private); rename it"
                )
            if not isinstance(metric, nnx.metrics.Metric):
                problems.type_problem(
                    f"{name!r}: expected a flax.nnx.metrics.Metric, got {describe(metric)}; "
                    "wrap a CLU metric type with metrics_manager.nnx.Metric(type)"
                )
        problems.raise_if_any("MultiMetric")
        super().__init__(**metrics)

    def update(self, **updates: Any) -> None:
        """Flax's `update` (a `mask` dict gives each member its own), naming the member that
        refuses its arguments; then no member keeps the batch (Flax's earlier members did)."""
        mask = updates.pop("mask", None)
        before = jax.tree.map(lambda x: x, nnx.state(self))  # the values now, not the Variables
        for name in self._metric_names:
            member = mask.get(name) if isinstance(mask, dict) else mask
            try:
                getattr(self, name).update(
                    **updates, **({} if member is None else {"mask": member})
                )
            except Exception as err:
                nnx.update(self, before)
                if type(err) not in (TypeError, ValueError):  # e.g. jax's tracer errors
                    err.add_note(f"raised by MultiMetric member {name!r}")
                    raise
                raise type(err)(f"MultiMetric member {name!r}: {err}") from err


# Metric types whose state is scalars (a vector of them: one state per nnx.vmap member).
_SCALAR_STATES = (
    clu_metrics.Average,
    clu_metrics.Std,
    clu_metrics.LastValue,
    _metrics.Sum,
    _metrics.Step,
    _metrics.MeanStd,
    _metrics.Max,
    _metrics.Min,
    TopKAccuracy,
    Perplexity,
)


_STATE_FIX = (
    "the metrics' state, as nnx.state and nnx.split give it; pass the metrics "
    "themselves, e.g. nnx.merge(graphdef, state)"
)


def _is_metric_state(value: Any) -> bool:
    """Whether `value` is an NNX metric's state variable, or an `nnx.State` holding one."""
    if not isinstance(value, nnx.State | nnx.Variable):
        return False
    variables = jax.tree.leaves(value, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return any(isinstance(x, nnx.metrics.MetricState) for x in variables)


def _computes_as(value: Any, *types: type) -> bool:
    """Whether `value`'s `compute()` is one of `types`'; a subclass's own (`exp` of an
    `Average`: a perplexity) is written as it computes, not as the state's base metric."""
    return any(type(value).compute is getattr(kind, "compute", None) for kind in types)


# Metric -> the state arrays `as_summary_metrics` last read, or (True) those its construction
# or `reset()` set. Off once a reset ran under a trace (nnx.jit resets a copy), or after the
# one warning.
_SUMMARIZED: "weakref.WeakKeyDictionary[Metric, tuple[list[Any], bool]]" = (
    weakref.WeakKeyDictionary()
)
_CHECK_RESET = [True]


def _check_reset(key: str, metric: Metric) -> None:
    """Warns once when `metric` was updated since its last summary with no `reset()`: each
    summary would hold the windows already written (a loss of 1, then 2, read 1, then 1.5)."""
    if not _CHECK_RESET[0]:
        return
    (last, fresh), now = _SUMMARIZED.get(metric, ([], False)), jax.tree.leaves(metric.metric)
    # The arrays are compared: each read of `metric.metric` is a new object.
    updated = any(a is not b for a, b in zip(last, now, strict=False))
    if fresh and not updated:  # still empty: a summary at step 0 wrote no window to repeat
        return
    _SUMMARIZED[metric] = (now, False)
    if updated and not fresh:
        _CHECK_RESET[0] = False
        _LOG.warning(
            "as_summary_metrics: %r was updated since its last summary without a reset(), so "
            "this summary also holds the windows already written (averages are cumulative). "
            "Call metrics.reset() after each write_metrics_summary.",
            key,
        )


def _add(key: str, value: Any, out: list[tuple[str, Any]], problems: Problems) -> None:
    """Appends a metric or a `compute()` result under `key` to `out`: NNX metrics as CLU
    metrics where their state maps onto one, dicts and Statistics flattened."""
    scalar_state = isinstance(value, nnx.metrics.Average | nnx.metrics.Welford) or (
        isinstance(value, Metric) and issubclass(value.metric_type, _SCALAR_STATES)
    )  # ours (Average, Accuracy, Welford) are Metrics of scalar-state types
    scalars = jax.tree.leaves(value) if scalar_state else []
    if isinstance(value, Metric) and issubclass(value.metric_type, _ConfusionCounts | AUROC):
        scalars = [value.metric.outside]  # per class or bin counts, one scalar beside them
    if shapes := {np.shape(x) for x in scalars} - {()}:
        name = type(value).__name__
        if type(value) is Metric:
            name = f"Metric({value.metric_type.__name__})"
        problems.value_problem(
            f"{key!r}: {name} holds {'scalars' if scalar_state else 'one set of counts'}, "
            f"but this one holds arrays of shape {sorted(shapes)[0]}: one state per member of "
            "an nnx.vmap? Write each member's compute() as its own key, or average them first"
        )
    elif isinstance(value, _CLU_TYPES):
        out.append((key, value))
    elif isinstance(value, Metric) and _computes_as(value, Metric, Welford):
        _check_reset(key, value)
        out.append((key, value.metric))
    elif isinstance(value, nnx.MultiMetric):
        _add(key, {name: getattr(value, name) for name in value._metric_names}, out, problems)
    elif isinstance(wrapped := getattr(value, "clu_metric", None), clu_metrics.Metric):
        out.append((key, wrapped))  # google-metrax's NnxWrapper
    elif isinstance(value, nnx.metrics.Welford) and _computes_as(value, nnx.metrics.Welford):
        count = jnp.asarray(value.count[...]).astype(_metrics.COUNT_DTYPE)
        m2 = jnp.asarray(value.m2[...])  # Flax keeps the sum of squares; ours its root mean
        welford = _metrics.Welford(
            count=count,
            mean=jnp.asarray(value.mean[...]),
            std_dev=jnp.sqrt(m2 / jnp.maximum(count, 1).astype(m2.dtype)),
        )
        out.append((key, welford))
    elif isinstance(value, nnx.metrics.Average) and _computes_as(value, nnx.metrics.Average):
        # Flax's Accuracy too
        out.append((key, clu_metrics.Average(total=value.total[...], count=value.count[...])))
    elif isinstance(value, nnx.metrics.Metric):
        _add(key, value.compute(), out, problems)
    elif isinstance(value, nnx.metrics.Statistics):
        out.append((key, clu.values.Scalar(value.mean)))
        out.append((f"{key}/sem", clu.values.Scalar(value.standard_error_of_mean)))
        out.append((f"{key}/std", clu.values.Scalar(value.standard_deviation)))
    elif _is_metric_state(value):  # Flax's were written as 'loss/total', 'loss/count'
        problems.type_problem(f"{key!r}: expected metrics, got {describe(value)}: {_STATE_FIX}")
    elif isinstance(value, Mapping):  # as the top-level keys: {"a": {"": m}} was 'a/',
        if not value:  # {"a": {1: m}} 'a/1', and {"a": {}} wrote nothing without a word
            problems.value_problem(
                f"{key!r} is an empty dict, which writes no metric; drop it, or put the "
                "metrics to write under it"
            )
        for name, item in value.items():
            if isinstance(name, str) and name.strip():
                _add(f"{key}/{name}", item, out, problems)
            else:
                problems.type_problem(
                    f"{key!r} holds the key {name!r}; nested keys must be non-empty str names "
                    "such as 'loss', as top-level ones: rename it"
                )
    elif isinstance(value, bool) or not (
        isinstance(value, int | float | np.number) or hasattr(value, "shape")
    ):
        problems.type_problem(
            f"{key!r}: expected a number, an array of one element, a clu Metric, Collection or "
            f"Value, an NNX Metric, Statistics or a dict of those, got {describe(value)}"
        )
    elif np.size(value) != 1:
        problems.value_problem(
            f"{key!r}: expected one number, got {describe(value)}; reduce it (e.g. .mean()) "
            "or write it as a clu.values.Histogram"
        )
    else:
        out.append((key, clu.values.Scalar(value)))


def as_summary_metrics(obj: Any) -> SummaryMetrics:
    """What `MetricsManager.write_metrics_summary` writes for NNX metrics.

    Args:
        obj: an `nnx.MultiMetric` (Flax's or this module's), the dict its `compute()` returns,
            or a dict of NNX metrics.

    Returns:
        name -> CLU metric (this module's, Flax's `Average`, `Accuracy`, `Welford`, metrax's
        wrappers), CLU `Collection` (written as `name/<field>`) or `clu.values.Value`:
        `Scalar`s; `Statistics` as `name`, `name/sem`, `name/std`; dicts as `name/<key>`.

    Raises:
        TypeError: `obj` is neither, a value is not a number, array, metric or value, or a
            key (nested ones too) is not a non-empty str.
        ValueError: a value is an array of more than one element, or an empty dict.

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> metrics = nnx.MultiMetric(loss=nnx.metrics.Average(), stats=nnx.metrics.Welford())
        >>> metrics.update(values=jnp.array([1.0, 2.0, 3.0, 4.0]))
        >>> summary = as_summary_metrics(metrics)
        >>> type(summary["loss"]).__name__, float(summary["loss"].compute())
        ('Average', 2.5)
        >>> values = _metrics.compute_metric_values(summary)
        >>> {k: round(float(v.value), 6) for k, v in sorted(values.items())}
        {'loss': 2.5, 'stats': 2.5, 'stats/sem': 0.559017, 'stats/std': 1.118034}
    """
    problems = Problems()
    out: list[tuple[str, Any]] = []
    if isinstance(obj, nnx.MultiMetric):
        for name in obj._metric_names:
            _add(name, getattr(obj, name), out, problems)
    elif _is_metric_state(obj):
        problems.type_problem(f"expected metrics, got an nnx.State: {_STATE_FIX}")
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            if not isinstance(key, str) or not key:
                problems.type_problem(f"key {key!r}: expected a non-empty str")
            else:
                _add(key, value, out, problems)
    else:
        problems.type_problem(
            f"expected an nnx.MultiMetric or the dict its compute() returns, got "
            f"{describe(obj)}; wrap single metrics in nnx.MultiMetric(name=metric)"
        )
    counts = collections.Counter(key for key, _ in out)
    if twice := sorted(key for key, n in counts.items() if n > 1):
        problems.value_problem(
            f"keys {twice} are written twice (a Statistics 'x' writes 'x/std' "
            "and 'x/sem', a dict 'd' writes 'd/<key>'): one would replace the other; rename one"
        )
    problems.raise_if_any("as_summary_metrics")
    return dict(out)
