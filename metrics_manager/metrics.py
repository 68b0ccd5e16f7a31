"""Metric types that a loss function returns and the train step merges on the device.

Immutable `flax.struct.dataclass` pytrees on `clu.metrics.Metric` that merge with CLU's and
google-metrax's metrics in one dict. `Sum`, `Step`, `AveragePerStep`, `Time`, `TimeRate` and
`StepsPerTime` keep T5X's names and meaning (`steps` and `duration` are set on the host); `Max`,
`Min`, `MeanStd` and `Welford` are added (clu 0.0.12's `Std.compute()` crashes on current JAX,
so summaries compute it in NumPy, and its sum of squares loses precision when the mean is large
against the spread). Constructors are keyword-only where T5X's
positional order is a trap (its `AveragePerStep(5, 1.0)` means `steps=5`), and every `empty()`
is a two-sided identity of `merge()`.

Synopsis:

    def loss_fn(params, batch):
        per_example = ...
        return per_example.sum(), {
            "loss": AveragePerStep.from_model_output(per_example),
            "loss_stats": MeanStd.from_model_output(per_example),
            "seqs_per_second": TimeRate.from_model_output(per_example.shape[0]),
        }

    # On the host, once per summary window, after a device-to-host copy:
    metrics = set_step_metrics_num_steps(set_time_metrics_duration(metrics, seconds), num_steps)
    values = compute_metric_values(metrics)  # {key: clu.values.Value}
"""

import dataclasses
import functools
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar, overload

import clu.metrics as clu_metrics
import clu.values
import flax
import jax
import jax.numpy as jnp
import numpy as np

from writers._checks import describe

__all__ = [
    "AveragePerStep",
    "Max",
    "MeanStd",
    "MeanStdScalar",
    "Min",
    "Step",
    "StepsPerTime",
    "Sum",
    "Time",
    "TimeRate",
    "Welford",
    "WelfordScalar",
    "compute_metric_values",
    "create_metrics_dict",
    "is_metric_obj",
    "is_time_metric",
    "set_step_metrics_num_steps",
    "set_time_metrics_duration",
    "set_time_rate_metrics_duration",
    "shape_obj_to_defined_obj",
]

ArrayLike = jax.typing.ArrayLike
# Counts are float32: an int32 count (CLU's Average) wraps past 2**31 (500 steps of 4M tokens)
# and reads NaN. A batch counts in int32 (a float32 sum or scatter-add stops growing at 2**24),
# cast once; a window's count is exact to 2**24, then each merge rounds it by at most 6e-8 of
# the count.
COUNT_DTYPE = jnp.float32


def exact_count(mask: jax.Array) -> jax.Array:
    """The number of true entries of `mask`, exact (summed in int32), as a `COUNT_DTYPE`."""
    return mask.sum(dtype=jnp.int32).astype(COUNT_DTYPE)


def explicit_mesh(x: Any) -> Any:
    """The mesh of `x` if an axis it is sharded on is `Explicit` (`jax.make_mesh`'s default),
    else None: such an array's sharding is part of its type, so a gather or scatter-add over
    its sharded dimension needs an output sharding."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    if sharding is None or not any(sharding.spec):
        return None
    kinds = dict(zip(sharding.mesh.axis_names, sharding.mesh.axis_types, strict=True))
    used = [
        a for part in sharding.spec if part for a in ((part,) if isinstance(part, str) else part)
    ]
    if all(kinds.get(axis) != jax.sharding.AxisType.Explicit for axis in used):
        return None
    return sharding.mesh


def vocab_sharding(x: Any) -> Any:
    """The sharding of `x` if its last axis is sharded over an `Explicit` mesh axis (logits
    sharded over the vocabulary), else None. Only `Explicit` axes are part of an array's type,
    so `Auto` meshes and batch-only sharding get None and keep their compiled code."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    if sharding is None or not sharding.spec or sharding.spec[-1] is None:
        return None
    return sharding


def take_last(x: jax.Array, indices: jax.Array) -> jax.Array:
    """`x[..., indices]`: one entry of `x`'s last axis per position of `indices`.

    Over a vocabulary sharded on an `Explicit` axis JAX refuses the gather without an output
    sharding. Given one, `.at[].get(out_sharding=)` all-gathered the indices and all-reduced
    the whole output; under `auto_axes` the gather compiles as on an `Auto` mesh instead: each
    device reads its slice, then one all-reduce over the vocabulary's axis.
    """

    def take(x: jax.Array, indices: jax.Array) -> jax.Array:
        return jnp.take_along_axis(x, indices[..., None], axis=-1)[..., 0]

    if (sharding := vocab_sharding(x)) is None:
        return take(x, indices)
    out = sharding.update(spec=jax.P(*sharding.spec[:-1]))
    return jax.sharding.auto_axes(take, out_sharding=out)(x, indices)


def array_module(*fields: Any) -> tuple[Any, list[Any]]:
    """`(np, fields)`, each a NumPy array of the dtype jnp gives it (float32 for a Python or
    float64 number without x64), when no field is a `jax.Array`; else `(jnp, fields)` as is.

    The manager's worker computes host copies: with jnp they went to the device and back on
    every summary (refused under `jax.transfer_guard("disallow")`) and came back a JAX Array.
    A `compute()` written against the module returned runs in NumPy there, and in jnp under
    jit (tracers are jax.Arrays too) and on device arrays; `host_value` ends it."""
    if any(isinstance(x, jax.Array) for x in fields):
        return jnp, list(fields)
    return np, [np.asarray(x, jnp.result_type(x)) for x in fields]


def host_value(x: Any) -> Any:
    """A 0-d NumPy array (`np.where`'s) as a NumPy number, as `TopKAccuracy` gives; else `x`."""
    return x[()] if isinstance(x, np.ndarray) else x


def float_identity(value: float = 0.0) -> jax.Array:
    """`empty()`'s value in the default float dtype (float64 under x64, so a `lax.scan` carry
    from `empty()` matches the sums), strongly typed (a weak one compiles a jitted step twice)."""
    return jnp.full((), value, jax.dtypes.canonicalize_dtype(jnp.float64))


def broadcast_mask(mask: jax.Array, shape: tuple[int, ...]) -> jax.Array | None:
    """`mask` as bool, broadcast to `shape` by CLU's rule (`Average`'s `_broadcast_masks`): its
    first dim that of `shape`, its others equal or 1, missing trailing dims added, so a
    (B,) or (B, 1) mask is per example; None if it does not fit. A 0-d mask has no first dim:
    it fits 0-d `shape` only (as in CLU, which raises on one), not a batch (see `mask_fix`)."""
    if not mask_fits(mask.shape, shape):
        return None
    mask = mask.astype(bool).reshape(mask.shape + (1,) * (len(shape) - mask.ndim))
    return jnp.broadcast_to(mask, shape)


def mask_fits(mask: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether a mask of shape `mask` fits `shape` by `broadcast_mask`'s rule."""
    rest = zip(mask[1:], shape[1:], strict=False)
    return len(mask) <= len(shape) and mask[:1] == shape[:1] and all(m in (1, s) for m, s in rest)


def host_floats(values: Any) -> Any:
    """Host integer or bool `values` (a NumPy array or scalar, a Python int, or a list or
    tuple of those) as a NumPy array of the default float dtype (float32, float64 under x64);
    anything else as it came.

    Without x64 `jnp.asarray` made int64 int32 first: 3_000_000_000 read as -1294967296 (a
    Python int past 2**31 raised OverflowError, also in a list). Converted on the host, it
    reads 3e9. A JAX array or tracer (already int32 inside `jit`), a list holding one, and
    float values pass untouched: nothing more runs on the device.
    """
    if isinstance(values, list | tuple) and all(
        isinstance(leaf, int | np.integer | np.bool_)
        or (isinstance(leaf, np.ndarray) and leaf.dtype.kind in "biu")
        for leaf in jax.tree.leaves(values)
    ):
        try:  # ints past 2**64 make an object array, which converts as Python ints do
            as_array = np.asarray(values)
            if as_array.dtype.kind in "biuO":
                values = as_array.astype(jax.dtypes.canonicalize_dtype(np.float64))
        except (TypeError, ValueError):  # ragged: jnp.asarray's error is named by the caller
            pass
        return values
    if isinstance(values, int | np.integer | np.bool_) or (
        isinstance(values, np.ndarray) and values.dtype.kind in "biu"
    ):
        return np.asarray(values, jax.dtypes.canonicalize_dtype(np.float64))
    return values


def _values_and_mask(
    values: ArrayLike, mask: ArrayLike | None, metric: str
) -> tuple[jax.Array, jax.Array]:
    """`values` (at least 1-d) as floats, and a bool mask over its leading dims broadcast to it."""
    try:
        values = jnp.asarray(host_floats(values))
    # None from a missing model output: JAX's own error names no metric.
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"{metric}.from_model_output: values must be an array or a number, got "
            f"{describe(values)}; check the model output passed in."
        ) from err
    batched, values = values.ndim > 0, jnp.atleast_1d(values)
    if jnp.issubdtype(values.dtype, jnp.integer) or values.dtype == bool:
        # No int overflow; float64 under jax_enable_x64, where int64 counts pass 2**24.
        values = values.astype(jax.dtypes.canonicalize_dtype(jnp.float64))
    else:
        values = values.astype(jnp.result_type(values, jnp.float32))  # no bf16 rounding
    if mask is None:
        return values, jnp.ones(values.shape, bool)
    mask = jnp.asarray(mask)
    # Beside a 0-d value (a step's loss, made (1,) above) a 0-d mask keeps or drops it; beside
    # a batch it is refused, as the classification metrics and CLU refuse it.
    broadcast = broadcast_mask(mask if batched else jnp.atleast_1d(mask), values.shape)
    if broadcast is None:
        # The shape as passed for the message: a 0-d mask was reported as of shape (1,).
        raise ValueError(
            f"{metric}.from_model_output: "
            f"{mask_mismatch(mask.shape, values.shape, 'leading dimensions of values')}."
        )
    return values, broadcast


def mask_mismatch(mask: tuple[int, ...], shape: tuple[int, ...], of: str) -> str:
    """Why a mask of shape `mask` does not fit `of` of `shape`, naming the mask shapes
    `broadcast_mask` takes for it, for an error message."""
    ones = shape[:1] + (1,) * (len(shape) - 1)
    shapes = f"{shape[:1]} or {ones} (per example) or {shape} (per element)"
    shapes = shapes if len(shape) >= 2 else f"{shape}, one per value"
    return (
        f"mask of shape {mask} does not match the {of} of shape {shape}; expected a mask of "
        f"shape {shapes}{mask_fix(mask, shape)}"
    )


def mask_fix(mask: tuple[int, ...], shape: tuple[int, ...]) -> str:
    """For a 0-d `mask` refused beside batched `shape`, the fix, for an error message; else ""."""
    if mask or not shape:
        return ""
    return (
        "; a 0-d mask is not spread over the batch (CLU's metrics refuse it too): to keep or "
        f"drop the whole batch, pass mask=jnp.full({shape[:1]}, mask)"
    )


def check_merge_type(metric: Any, other: Any) -> None:
    """Refuses to merge `metric` with a metric of another type, as `merge_metrics` refuses it:
    `Sum.merge(Average)` added Average's total and dropped its count, `Max.merge(Min)` kept the
    larger of a max and a min, `Step.merge(AveragePerStep)` dropped the total. A type check at
    trace time only; nothing runs on the device."""
    if type(other) is not type(metric):
        name = type(metric).__qualname__
        raise TypeError(
            f"{name}.merge: expected {name}, got {type(other).__qualname__}; merge metrics of "
            "one type (keep one metric type per key)"
        )


def _masked_sum(values: ArrayLike, mask: ArrayLike | None, metric: str) -> jax.Array:
    values, mask = _values_and_mask(values, mask, metric)
    return jnp.where(mask, values, 0).sum()


@flax.struct.dataclass
class Sum(clu_metrics.Metric):
    """The sum of every value seen (T5X `Sum`).

    Example:
        >>> import jax.numpy as jnp
        >>> float(Sum.from_model_output(jnp.array([[1, 2], [2, 3], [3, 4]])).compute())
        15.0
    """

    total: ArrayLike

    @classmethod
    def empty(cls) -> "Sum":
        return cls(float_identity())

    @classmethod
    def from_model_output(cls, values: ArrayLike, mask: ArrayLike | None = None, **_: Any) -> "Sum":
        """Sums all elements of `values` (where `mask` is true, if given)."""
        return cls(_masked_sum(values, mask, cls.__name__))

    def merge(self, other: "Sum") -> "Sum":
        check_merge_type(self, other)
        return type(self)(self.total + other.total)

    def compute(self) -> ArrayLike:
        return self.total


class _ByKeyword:
    """Refuses positional fields naming the keywords (Python's error named neither); a
    subclass's own fields, not keyword-only, may still come positionally."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        fields = dataclasses.fields(cls) if args else ()  # type: ignore[arg-type]
        keywords = [f"{f.name}=..." for f in fields if f.kw_only is True]
        if len(args) > len(fields) - len(keywords):
            call = ", ".join([f.name for f in fields if f.kw_only is not True] + keywords)
            raise TypeError(
                f"{cls.__name__} takes its fields by keyword, {cls.__name__}({call}); got "
                f"{len(args)} positional"
            )
        return super().__new__(cls)


@flax.struct.dataclass(kw_only=True)
class Step(_ByKeyword, clu_metrics.Metric):
    """A count of train steps (T5X `Step`), the base of every per-step metric.

    Example:
        >>> Step(steps=3).merge(Step(steps=2)).compute()
        5
    """

    steps: ArrayLike | None = 1

    @classmethod
    def empty(cls) -> "Step":
        return cls(steps=0)

    @classmethod
    def from_model_output(cls, steps: ArrayLike = 1, **_: Any) -> "Step":
        return cls(steps=steps)

    def _merged_steps(self, other: "Step") -> ArrayLike:
        check_merge_type(self, other)  # every Step's merge comes here first
        if self.steps is None or other.steps is None:  # compute()'s error blamed compute()
            sides = " and ".join(
                n for n, m in (("self", self), ("other", other)) if m.steps is None
            )
            raise ValueError(
                f"{type(self).__name__}.merge: steps is None in {sides}; merged steps add up, so "
                "each metric needs a count: make them with steps=1 (the default) and set the "
                "window's count after merging, with set_step_metrics_num_steps(metrics, num_steps)."
            )
        return self.steps + other.steps

    def merge(self, other: "Step") -> "Step":
        return self.replace(steps=self._merged_steps(other))

    def _reduce_merge(self, other: "Step") -> "Step":
        # The pieces of one global batch (devices, microbatches) make one step, not one each.
        return self.merge(other).replace(steps=self.steps)

    def replace_steps(self, steps: ArrayLike) -> "Step":
        """Returns a copy with `steps` replaced (T5X's name)."""
        return self.replace(steps=steps)

    def compute(self) -> ArrayLike:
        if self.steps is None:
            raise ValueError(
                f"{type(self).__name__}.steps is None. Set it on the host before compute() with "
                "set_step_metrics_num_steps(metrics, num_steps), where num_steps is the number "
                "of train steps in the summary window."
            )
        return self.steps


@flax.struct.dataclass(kw_only=True)
class AveragePerStep(Step):
    """`total / steps`: a per-step average of per-microbatch sums (not means) (T5X).

    Example:
        >>> import jax.numpy as jnp
        >>> metric = AveragePerStep.from_model_output(jnp.array([1.0, 2.0, 3.0]))
        >>> round(float(set_step_metrics_num_steps({"m": metric}, 5)["m"].compute()), 6)
        1.2
    """

    total: ArrayLike

    @classmethod
    def empty(cls) -> "AveragePerStep":
        return cls(total=float_identity(), steps=0)

    @classmethod
    def from_model_output(  # type: ignore[override]
        cls, values: ArrayLike, steps: ArrayLike = 1, mask: ArrayLike | None = None, **_: Any
    ) -> "AveragePerStep":
        """Sums `values` (where `mask` is true, if given) as one step's total."""
        if isinstance(steps, str | bool) or np.ndim(steps) != 0:  # a mask given by position
            raise TypeError(
                f"{cls.__name__}.from_model_output: steps must be one number of steps (default "
                f"1), got {type(steps).__name__} of shape {np.shape(steps)}; pass a mask by "
                "keyword: from_model_output(values, mask=mask)"
            )
        return cls(total=_masked_sum(values, mask, cls.__name__), steps=steps)

    def merge(self, other: "AveragePerStep") -> "AveragePerStep":  # type: ignore[override]
        return type(self)(total=self.total + other.total, steps=self._merged_steps(other))

    def compute(self) -> ArrayLike:
        return _divide(self.total, super().compute())


def _divide(a: Any, b: Any) -> Any:
    """`a / b`; for Python and NumPy numbers inf (by `a`'s sign) or NaN where `b` is 0, as
    arrays divide: a 0 s window's rate, not a ZeroDivisionError (nor NumPy's warning)."""
    if type(b) in _PLAIN_REALS and b:  # the common case, without the ABC checks (~1 us each)
        return a / b
    if isinstance(b, numbers.Real) and isinstance(a, numbers.Real) and b == 0:
        return math.copysign(math.inf, a) if a else math.nan
    return a / b


_PLAIN_REALS = frozenset((float, int, np.float16, np.float32, np.float64, np.int32, np.int64))


def _check_durations_unset(a: "Time", b: "Time") -> None:
    check_merge_type(a, b)  # every Time's merge comes here first
    if a.duration is not None or b.duration is not None:
        raise ValueError(
            f"Cannot merge {type(a).__name__} metrics after their duration was set (durations "
            f"{a.duration!r} and {b.duration!r}). Merge on the device first and call "
            "set_time_metrics_duration once, on the host, just before compute()."
        )


@flax.struct.dataclass(kw_only=True)
class Time(_ByKeyword, clu_metrics.Metric):
    """Seconds in the summary window (T5X `Time`), set on the host; merges only while unset.

    Example:
        >>> set_time_metrics_duration({"t": Time()}, 2.5)["t"].compute()
        2.5
    """

    duration: float | None = None

    @classmethod
    def empty(cls) -> "Time":
        return cls()

    @classmethod
    def from_model_output(cls, **_: Any) -> "Time":
        return cls()

    def merge(self, other: "Time") -> "Time":
        _check_durations_unset(self, other)
        return self

    def replace_duration(self, duration: float) -> "Time":
        """Returns a copy with `duration` replaced (T5X's name)."""
        return self.replace(duration=duration)

    def compute(self) -> Any:
        if self.duration is None:
            raise ValueError(
                f"{type(self).__name__}.duration is None. Set it on the host before compute() "
                "with set_time_metrics_duration(metrics, seconds)."
            )
        return self.duration


@flax.struct.dataclass(kw_only=True)
class TimeRate(Time):
    """`numerator / duration`, e.g. sequences or tokens per second (T5X `TimeRate`).

    Example:
        >>> metric = TimeRate.from_model_output(3)
        >>> float(set_time_metrics_duration({"rate": metric}, 2.0)["rate"].compute())
        1.5
    """

    numerator: ArrayLike

    @classmethod
    def empty(cls) -> "TimeRate":
        return cls(numerator=float_identity())

    @classmethod
    def from_model_output(cls, numerator: ArrayLike, **_: Any) -> "TimeRate":  # type: ignore[override]
        """Counts `numerator` (summed if an array) towards the window's rate."""
        return cls(numerator=_masked_sum(numerator, None, cls.__name__))

    def merge(self, other: "TimeRate") -> "TimeRate":  # type: ignore[override]
        _check_durations_unset(self, other)
        return type(self)(numerator=self.numerator + other.numerator)

    def compute(self) -> Any:
        return _divide(self.numerator, super().compute())


@flax.struct.dataclass(kw_only=True)
class StepsPerTime(Step, Time):
    """`steps / duration`: train steps per second (T5X `StepsPerTime`).

    Example:
        >>> metrics = {"steps_per_second": StepsPerTime(steps=8)}
        >>> metrics = set_time_metrics_duration(metrics, 2.0)
        >>> set_step_metrics_num_steps(metrics, 8)["steps_per_second"].compute()
        4.0
    """

    def merge(self, other: "StepsPerTime") -> "StepsPerTime":  # type: ignore[override]
        _check_durations_unset(self, other)
        return type(self)(steps=self._merged_steps(other))

    def compute(self) -> Any:
        return _divide(Step.compute(self), Time.compute(self))


@flax.struct.dataclass
class _Extremum(clu_metrics.Metric):
    """`Max` and `Min`: one value, reduced and merged by `_ufunc`."""

    value: ArrayLike

    _ufunc: ClassVar[Any]  # jnp.maximum or jnp.minimum (typed as a Protocol jnp lacks)
    _identity: ClassVar[float]

    @classmethod
    def empty(cls) -> Any:
        return cls(float_identity(cls._identity))

    @classmethod
    def from_model_output(cls, values: ArrayLike, mask: ArrayLike | None = None, **_: Any) -> Any:
        values, mask = _values_and_mask(values, mask, cls.__name__)
        return cls(cls._ufunc.reduce(values, axis=None, where=mask, initial=cls._identity))

    def merge(self, other: Any) -> Any:
        check_merge_type(self, other)
        return type(self)(type(self)._ufunc(self.value, other.value))

    def compute(self) -> ArrayLike:
        return self.value


@flax.struct.dataclass
class Max(_Extremum):
    """The largest value seen (where `mask` is true); `empty()` holds -inf, not 0.

    Example:
        >>> import jax.numpy as jnp
        >>> float(Max.from_model_output(jnp.array([-3.0, -1.0])).merge(Max.empty()).compute())
        -1.0
    """

    _ufunc = jnp.maximum
    _identity = -math.inf


@flax.struct.dataclass
class Min(_Extremum):
    """The smallest value seen (where `mask` is true); `empty()` holds +inf.

    Example:
        >>> import jax.numpy as jnp
        >>> float(Min.from_model_output(jnp.array([3.0, 1.0])).merge(Min.empty()).compute())
        1.0
    """

    _ufunc = jnp.minimum
    _identity = math.inf


@dataclasses.dataclass(eq=False)
class MeanStdScalar(clu.values.Scalar):
    """A `clu.values.Scalar` of a mean that carries its standard deviation (`<key>/std`)."""

    std: Any

    def extra_values(self) -> dict[str, Any]:
        """What `compute_metric_values` writes next to the mean, as `<key>/<suffix>`."""
        return {"std": self.std}


@dataclasses.dataclass(eq=False)
class WelfordScalar(MeanStdScalar):
    """A `MeanStdScalar` that also carries the standard error of the mean (`<key>/sem`)."""

    sem: Any

    def extra_values(self) -> dict[str, Any]:
        return {"sem": self.sem, "std": self.std}


def _power_of_two_above(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A power of two `s` with `x / s` in [1, 2) (wider where clipped), and `1 / s`: deviations
    divided by it square and sum without overflow (their squares near 1e38 overflow float32
    where their root mean square does not), and exactly, so the result is that of the plain
    sum wherever no square overflows. Both are normal numbers, which GPUs do not flush to 0."""
    limit = -jnp.finfo(x.dtype).minexp  # 126 in float32: 2**126 and 2**-126 are normal
    exponent = jnp.clip(jnp.frexp(x)[1] - 1, -limit, limit)
    one = jnp.ones((), x.dtype)
    return jnp.ldexp(one, exponent), jnp.ldexp(one, -exponent)


@flax.struct.dataclass(kw_only=True)
class MeanStd(_ByKeyword, clu_metrics.Metric):
    """Mean and population standard deviation with a numerically stable parallel merge.

    Keeps the count, mean and `std_dev` (the population standard deviation, 0 when nothing was
    seen) and merges with Chan et al.'s update, exact when the mean is large against the spread.
    It keeps the deviation, not its sum of squares `m2`: in float32 `m2` overflows to inf for
    values around 1e20 (or a thousand around 1e19), whose deviation is a float32 number;
    values near float32's largest (3e38 and -3e38) are summed and subtracted over a power of
    two, so their mean and deviation stay finite too.
    `compute()` is the mean (NaN when nothing was seen), `std()` the standard deviation,
    `compute_value()` a `MeanStdScalar`.

    Example:
        >>> import jax.numpy as jnp
        >>> a = MeanStd.from_model_output(jnp.array([1.0, 2.0]))
        >>> b = MeanStd.from_model_output(jnp.array([3.0, 4.0]))
        >>> merged = a.merge(b)
        >>> float(merged.compute()), round(float(merged.std()), 6)
        (2.5, 1.118034)
    """

    count: jax.Array
    mean: jax.Array
    std_dev: jax.Array

    @classmethod
    def empty(cls) -> "MeanStd":
        return cls(
            count=jnp.zeros((), COUNT_DTYPE), mean=float_identity(), std_dev=float_identity()
        )

    @classmethod
    def from_model_output(
        cls, values: ArrayLike, mask: ArrayLike | None = None, **_: Any
    ) -> "MeanStd":
        """Mean and standard deviation of `values` where `mask` is true."""
        values, mask = _values_and_mask(values, mask, cls.__name__)
        count = exact_count(mask)
        total = jnp.maximum(count, 1).astype(values.dtype)
        # Values near float32's limit: [3e38, 3e38] summed to inf (mean inf, std inf) and
        # 3e38 - -3e38 overflows. Only there, everything below is over a power of two `size`
        # with count * largest / size < 2**(maxexp - 3), so no sum or difference overflows;
        # elsewhere it is 1 and every value keeps its bits. Exponents, not a division by the
        # largest float: jit makes that a product with its subnormal inverse, flushed to 0.
        largest = jnp.abs(jnp.where(mask, values, 0)).max(initial=0)
        exponent = jnp.frexp(largest)[1] + jnp.frexp(total)[1] - jnp.finfo(values.dtype).maxexp
        size = jnp.ldexp(jnp.ones((), values.dtype), jnp.maximum(exponent + 3, 0))
        values = values * (1 / size)
        first = jnp.where(mask, values, 0).sum() / total
        # A second pass over what is left: the float32 sum of values near 1e7 is off by about
        # 2 (and m2 around it by 40%); their differences from it are exact, their sum close.
        differences = jnp.where(mask, values - first, 0)
        correction = differences.sum() / total
        correction = jnp.where(jnp.isfinite(correction), correction, 0)  # none past float32
        mean = first + correction
        # Deviations from `mean` are at most this: found in the pass above, not in a third one.
        largest = jnp.abs(differences).max(initial=0) + jnp.abs(correction)
        scale, inverse = _power_of_two_above(largest)
        scaled = jnp.where(mask, (values - mean) * inverse, 0)
        std_dev = jnp.sqrt(jnp.square(scaled).sum() / total) * scale
        return cls(count=count, mean=mean * size, std_dev=std_dev * size)

    def merge(self, other: "MeanStd") -> "MeanStd":
        check_merge_type(self, other)
        dtype = jnp.result_type(self.mean, other.mean, self.std_dev, other.std_dev)
        n_a, n_b = (jnp.asarray(m.count).astype(dtype) for m in (self, other))
        total = jnp.maximum(n_a + n_b, 1)
        fraction_a, fraction_b = n_a / total, n_b / total
        delta = other.mean - self.mean
        mean = self.mean + delta * fraction_b
        # Means of opposite signs near float32's limit: 3e38 - -3e38 is inf (the mean read
        # -inf). Only there, the delta and deviations below are halved (exactly).
        fits = jnp.isfinite(delta)
        halved = other.mean * 0.5 - self.mean * 0.5
        mean = jnp.where(fits, mean, (self.mean * 0.5 + halved * fraction_b) * 2)
        delta, half = jnp.where(fits, delta, halved), jnp.where(fits, 1, 0.5).astype(dtype)
        # m2 / n = f_a std_a**2 + f_b std_b**2 + f_a f_b delta**2, each over the same power of
        # two, so no square overflows where the deviations are float32 numbers.
        std_a, std_b = self.std_dev * half, other.std_dev * half
        largest = jnp.maximum(jnp.maximum(std_a, std_b), jnp.abs(delta))
        scale, inverse = _power_of_two_above(jnp.asarray(largest, dtype))
        a, b, d = (jnp.square(x * inverse) for x in (std_a, std_b, delta))
        std_dev = jnp.sqrt(fraction_a * a + fraction_b * b + fraction_a * fraction_b * d)
        std_dev = std_dev * scale / half
        # An empty side returns the other side bit for bit, so empty() is an exact identity.
        a_empty, b_empty = self.count == 0, other.count == 0
        mean = jnp.where(a_empty, other.mean, jnp.where(b_empty, self.mean, mean))
        std_dev = jnp.where(a_empty, other.std_dev, jnp.where(b_empty, self.std_dev, std_dev))
        return type(self)(count=self.count + other.count, mean=mean, std_dev=std_dev)

    def compute(self) -> ArrayLike:
        xp, (count, mean) = array_module(self.count, self.mean)
        return host_value(xp.where(count > 0, mean, xp.nan))

    def _float_count(self) -> tuple[Any, Any, Any]:
        """The array module, the count in the deviation's dtype, and the deviation."""
        xp, (count, std_dev) = array_module(self.count, self.std_dev)
        return xp, xp.asarray(count).astype(xp.result_type(std_dev)), std_dev

    def std(self) -> ArrayLike:
        """The population standard deviation (NaN when nothing was seen)."""
        xp, count, std_dev = self._float_count()
        return host_value(xp.where(count > 0, std_dev, xp.nan))

    def compute_value(self) -> MeanStdScalar:
        return MeanStdScalar(self.compute(), self.std())


@flax.struct.dataclass(kw_only=True)
class Welford(MeanStd):
    """`MeanStd` plus the standard error of the mean (Flax NNX's `Welford`).

    Example:
        >>> import jax.numpy as jnp
        >>> stats = Welford.from_model_output(jnp.array([1.0, 2.0, 3.0, 4.0]))
        >>> float(stats.compute()), round(float(stats.sem()), 6), round(float(stats.std()), 6)
        (2.5, 0.559017, 1.118034)
    """

    def sem(self) -> ArrayLike:
        """`std / sqrt(count)` (NaN when nothing was seen)."""
        xp, count, _ = self._float_count()
        with np.errstate(all="ignore"):  # an inf count and deviation: NaN, as jnp gives
            return host_value(self.std() / xp.sqrt(xp.maximum(count, 1)))

    def compute_value(self) -> WelfordScalar:
        return WelfordScalar(self.compute(), self.std(), self.sem())


def is_metric_obj(obj: Any) -> bool:
    """Whether `obj` is a CLU `Metric` or `Collection` (a value of a metrics dict).

    Example:
        >>> is_metric_obj(Sum(1.0)), is_metric_obj(1.0)
        (True, False)
    """
    return isinstance(obj, clu_metrics.Metric | clu_metrics.Collection)


def is_time_metric(obj: Any) -> bool:
    """Whether `obj` is a `Time` metric, whose duration is set on the host.

    Example:
        >>> is_time_metric(StepsPerTime()), is_time_metric(Step())
        (True, False)
    """
    return isinstance(obj, Time)


def _as_mapping(metrics: Any, function: str, also: str = "") -> Mapping[str, Any]:
    """`metrics`, or the dict a `PackedMetrics` (what `merge_metrics` returns) packs; `also`
    names what else `function` takes, for its error."""
    from metrics_manager.packing import PackedMetrics  # noqa: PLC0415  (it imports this module)

    if isinstance(metrics, PackedMetrics):
        return metrics.unpack()
    if not isinstance(metrics, Mapping):
        raise TypeError(
            f"{function} expects a mapping from names to metrics (or what merge_metrics "
            f"returns){also}, got {type(metrics).__name__}."
        )
    return metrics


# One metric or a CLU `Collection`, which T5X's setters (a tree map) take as they take a dict.
_OneMetric = TypeVar("_OneMetric", clu_metrics.Metric, clu_metrics.Collection)
_ONE_TOO = ", one CLU metric or a CLU Collection"


@overload
def set_step_metrics_num_steps(metrics: Mapping[str, Any], num_steps: int) -> dict[str, Any]: ...
@overload
def set_step_metrics_num_steps(metrics: _OneMetric, num_steps: int) -> _OneMetric: ...
def set_step_metrics_num_steps(metrics: Any, num_steps: int) -> Any:
    """Host side: sets `steps` of every `Step` metric to the number of train steps merged.

    Args:
        metrics: name -> metric (or what `merge_metrics` returns), or -> a dict, list or
            tuple of them; other values pass through. Or one metric, or a CLU `Collection`,
            as in T5X.
        num_steps: the number of train steps the metrics cover, > 0 (an int or 0-d array).

    Returns:
        A new dict (one metric or `Collection`: a new one); the input is not changed.

    Raises:
        TypeError: `metrics` is no mapping, metric or Collection, or `num_steps` no integer.
        ValueError: `num_steps` is not positive.

    Example:
        >>> set_step_metrics_num_steps({"steps": Step(steps=16)}, 4)["steps"].compute()
        4
    """
    one = is_metric_obj(metrics)
    metrics = metrics if one else _as_mapping(metrics, "set_step_metrics_num_steps", _ONE_TOO)
    num_steps = _host_scalar(num_steps)
    if isinstance(num_steps, bool) or not isinstance(num_steps, int | np.integer):
        raise TypeError(
            f"set_step_metrics_num_steps: num_steps must be an int, got {num_steps!r} of type "
            f"{type(num_steps).__name__}."
        )
    if num_steps <= 0:
        raise ValueError(
            f"set_step_metrics_num_steps: num_steps must be positive, got {num_steps}; pass "
            "the number of train steps the metrics were merged over."
        )
    return _set_in(metrics, None, int(num_steps), one)


@overload
def set_time_metrics_duration(metrics: Mapping[str, Any], duration: float) -> dict[str, Any]: ...
@overload
def set_time_metrics_duration(metrics: _OneMetric, duration: float) -> _OneMetric: ...
def set_time_metrics_duration(metrics: Any, duration: float) -> Any:
    """Host side: sets `duration` of every `Time` metric, after merging, before `compute()`.

    Args:
        metrics: as for `set_step_metrics_num_steps`.
        duration: seconds in the summary window, a finite number >= 0 (or 0-d array).

    Returns:
        A new dict (one metric or `Collection`: a new one); the input is not changed.

    Raises:
        TypeError: `metrics` is no mapping, metric or Collection, or `duration` no number.
        ValueError: `duration` is negative or not finite.

    Example:
        >>> metrics = set_time_metrics_duration({"rate": TimeRate(numerator=3.0)}, 2.0)
        >>> metrics["rate"].compute()
        1.5
    """
    one = is_metric_obj(metrics)
    metrics = metrics if one else _as_mapping(metrics, "set_time_metrics_duration", _ONE_TOO)
    duration = _host_scalar(duration)
    if isinstance(duration, bool) or not isinstance(
        duration, int | float | np.integer | np.floating
    ):
        raise TypeError(
            f"set_time_metrics_duration: duration must be a number of seconds, got "
            f"{duration!r} of type {type(duration).__name__}."
        )
    if not math.isfinite(duration) or duration < 0:
        raise ValueError(
            f"set_time_metrics_duration: duration must be finite and >= 0 seconds, got {duration}."
        )
    return _set_in(metrics, float(duration), None, one)


def _host_scalar(x: Any) -> Any:
    """A 0-d NumPy or concrete JAX array as its Python number, as T5X's setters take one
    (`np.array(2)` and `jnp.int32(2)` were refused); anything else as it is."""
    if isinstance(x, np.ndarray | jax.Array) and x.ndim == 0 and not isinstance(x, jax.core.Tracer):
        return x.item()
    return x


def _set_in(metrics: Any, duration: float | None, num_steps: int | None, one: bool) -> Any:
    """The setters' result: `metrics` (one metric, or a dict whose values may nest metrics in
    dicts, lists or tuples, reached as T5X's tree map reaches them) with the fields set."""
    if one:
        return _set_host_fields(metrics, duration, num_steps)
    set_one = functools.partial(_set_host_fields, duration=duration, num_steps=num_steps)
    return {
        key: set_one(m) if is_metric_obj(m) else jax.tree.map(set_one, m, is_leaf=is_metric_obj)
        for key, m in metrics.items()
    }


# The name T5X's documentation uses.
set_time_rate_metrics_duration = set_time_metrics_duration


def create_metrics_dict(float_metrics_dict: Mapping[str, ArrayLike]) -> dict[str, Sum]:
    """T5X's `create_metrics_dict`: each scalar of `float_metrics_dict` as a `Sum`.

    Example:
        >>> create_metrics_dict({"num_tokens": 8.0})["num_tokens"].compute()
        8.0
    """
    return {key: Sum(value) for key, value in float_metrics_dict.items()}


def shape_obj_to_defined_obj(obj: Any) -> Any:
    """T5X's `shape_obj_to_defined_obj`: a metric with `obj`'s fields' shapes and dtypes
    (`obj` from `jax.eval_shape`), to start a merge from, as T5X's microbatch loop does.

    T5X fills every field with zeros, which is no identity for `Max`, `Min` or `LastValue`
    (a `Max` of losses below 0 read 0). Each field here holds the metric's `empty()` value
    broadcast to that shape and dtype; zeros, as in T5X, for a metric whose `empty()` has
    other fields or does not broadcast, or that keeps CLU's base `empty()`. Fields without
    a shape (a `Time`'s unset duration) are kept. A dict of them (`jax.eval_shape` of a step's
    metrics dict) gives a dict of each one's result, as the setters take dicts.

    Raises:
        TypeError: `obj` is neither a metric, a `Collection` nor a dict of them.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> shape = jax.eval_shape(lambda: Max.from_model_output(jnp.array([-3.0, -1.0])))
        >>> start = shape_obj_to_defined_obj(shape)
        >>> float(start.merge(Max.from_model_output(jnp.array([-3.0, -1.0]))).compute())
        -1.0
    """
    if isinstance(obj, Mapping):
        return {key: shape_obj_to_defined_obj(value) for key, value in obj.items()}
    if not is_metric_obj(obj):
        raise TypeError(
            "shape_obj_to_defined_obj expects a clu Metric or Collection (or a dict of them), "
            f"as jax.eval_shape returns it, got {describe(obj)}; pass the metrics alone, "
            "e.g. jax.eval_shape(step)[1] of a step returning (loss, metrics)."
        )
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype) if hasattr(x, "shape") else x, obj)
    if isinstance(obj, clu_metrics.Collection):
        fields = collection_fields(obj).items()
        return zeros.replace(**{name: shape_obj_to_defined_obj(m) for name, m in fields})
    if getattr(type(obj).empty, "__func__", None) is clu_metrics.Metric.empty.__func__:
        return zeros  # CLU's base `empty()`, which only raises: the metric defines no identity
    empty = type(obj).empty()
    if jax.tree.structure(empty) != jax.tree.structure(obj):  # type: ignore[operator]
        return zeros
    try:
        return jax.tree.map(  # a field without a shape (a Python steps=1) is kept, as in zeros
            lambda e, x: jnp.broadcast_to(e, x.shape).astype(x.dtype) if hasattr(x, "shape") else x,
            empty,
            obj,
        )
    except (TypeError, ValueError):  # an identity that does not broadcast to these shapes
        return zeros


def compute_metric_values(metrics: Mapping[str, Any]) -> dict[str, clu.values.Value]:
    """Host side: `compute_value()` of every metric, flattened for `writers.write_values`.

    Args:
        metrics: name -> metric or `Collection` (or what `merge_metrics` returns), with
            durations and steps set.

    Returns:
        name -> `clu.values.Value`: a `Collection` gives `key/<field>`, a `MeanStdScalar` `key`
        and `key/std` (and `key/sem`). A mean of nothing seen (0/0) is NaN, no numpy warning.

    Raises:
        TypeError: a value is neither a metric nor a `Collection`.

    Example:
        >>> import jax.numpy as jnp
        >>> values = compute_metric_values({"x": MeanStd.from_model_output(jnp.array([1.0, 3.0]))})
        >>> sorted(values), float(values["x/std"].value)
        (['x', 'x/std'], 1.0)
    """
    metrics = _as_mapping(metrics, "compute_metric_values")
    if bad := {k: type(v).__name__ for k, v in metrics.items() if not is_metric_obj(v)}:
        raise TypeError(
            "compute_metric_values: expected clu Metric or Collection values, got "
            + ", ".join(f"{k!r}: {t}" for k, t in sorted(bad.items()))
        )
    out: dict[str, clu.values.Value] = {}
    with _nan_quietly():
        for key, metric in metrics.items():
            _add_values(out, key, metric)
    return out


# An empty window's mean is 0/0, NaN as in CLU: a value to write (for the manager's `nonfinite`
# policy), not numpy's RuntimeWarning, which under `-W error` would drop the key.
def _nan_quietly() -> np.errstate:
    return np.errstate(divide="ignore", invalid="ignore", over="ignore")


def replicated_problem(collection: clu_metrics.Collection) -> str:
    """Why CLU's `compute()` refuses `collection` (still replicated by `pmap`), or ""."""
    counter: Any = getattr(vars(collection).get("_reduction_counter"), "value", None)
    if getattr(counter, "ndim", 0) == 0:
        return ""
    return (
        f"the {type(collection).__name__} collection is still replicated (counter shape "
        f"{tuple(counter.shape)}), and CLU's compute() refuses it: flax.jax_utils.unreplicate() "
        "it if the step made it with gather_from_model_output (every device holds all of it: "
        ".reduce() would count it once per device), or .reduce() it if each device made its "
        "own (single_from_model_output)"
    )


def _compute_value(metric: Any) -> clu.values.Value:
    """`metric.compute_value()`, or for CLU's own `Std` its formula in NumPy: clu 0.0.12's
    calls `jnp.clip(a_min=...)`, which current JAX no longer takes."""
    if type(metric).compute is clu_metrics.Std.compute:
        mean = metric.total / metric.count
        return clu.values.Scalar(
            np.sqrt(np.maximum(metric.sum_of_squares / metric.count - mean**2, 0.0))
        )
    return metric.compute_value()


def collection_fields(obj: Any) -> Any:
    """A CLU `Collection` as the dict of its metrics (named as `compute()` names them)."""
    if isinstance(obj, clu_metrics.Collection):
        return {k: v for k, v in vars(obj).items() if k != "_reduction_counter"}
    return obj


def written_keys(key: str, metric: Any) -> list[str]:
    """The keys a summary writes for `metric` under `key` (a MeanStd's `/std`, a Welford's
    `/sem` and `/std`, a Collection's fields), known from its type: no device work."""
    if isinstance(metric, clu_metrics.Collection):
        fields = collection_fields(metric).items()
        return [k for name, m in fields for k in written_keys(f"{key}/{name}", m)]
    if isinstance(metric, MeanStd):
        return [key, f"{key}/std", *([f"{key}/sem"] if isinstance(metric, Welford) else [])]
    return [key]


def _add_values(out: dict[str, clu.values.Value], key: str, metric: Any) -> None:
    if isinstance(metric, clu_metrics.Collection):
        if replicated := replicated_problem(metric):
            raise ValueError(replicated)
        fields = collection_fields(metric)
        items = {f"{key}/{name}": _compute_value(m) for name, m in fields.items()}
    else:
        value = _compute_value(metric)
        if type(value) is clu.values.Scalar and key not in out:  # the common case, at once
            out[key] = value
            return
        items = {key: value}
    produced = {}
    for name, value in items.items():
        # The exact type test skips a slow `typing.Protocol` isinstance for plain Scalars.
        if type(value) is not clu.values.Scalar and isinstance(value, MeanStdScalar):
            produced[name] = clu.values.Scalar(value.value)
            for suffix, extra in value.extra_values().items():
                produced[f"{name}/{suffix}"] = clu.values.Scalar(extra)
        else:
            produced[name] = value
    if not out.keys().isdisjoint(produced):  # one key would silently replace the other
        raise ValueError(
            f"metric {key!r} writes {sorted(out.keys() & produced.keys())}, which another "
            "metric of this summary writes too (MeanStd or Welford 'x' also writes 'x/std', "
            "a Collection 'c' writes 'c/<name>'); rename one of them"
        )
    out.update(produced)


def host_values(
    metrics: Mapping[str, Any],
    duration: float | None,
    num_steps: int,
    failed: Callable[[str, Exception], None],
) -> dict[str, clu.values.Value]:
    """The manager's path for checked metrics (host leaves): steps and duration set, then
    `compute_value()`, in one pass; a key that raises is left out and passed to `failed`."""
    out: dict[str, clu.values.Value] = {}
    with _nan_quietly():
        for key, metric in metrics.items():
            try:
                _add_values(out, key, _set_host_fields(metric, duration, num_steps))
            except Exception as err:  # noqa: BLE001  (that key is skipped, the rest written)
                failed(key, err)
    return out


def _set_host_fields(metric: Any, duration: float | None, num_steps: int | None) -> Any:
    """`metric` (or each one in a `Collection`) with the checked fields that are not None set."""
    fields: dict[str, Any] = {}
    if isinstance(metric, Step) and num_steps is not None:
        fields["steps"] = num_steps
    if isinstance(metric, Time) and duration is not None:
        fields["duration"] = duration
    if isinstance(metric, clu_metrics.Collection):
        return metric.replace(
            **{n: _set_host_fields(m, duration, num_steps) for n, m in vars(metric).items()}
        )
    if not fields:
        return metric
    # The fields are trusted numbers, so skip dataclasses.replace's re-validation (4x slower).
    new = object.__new__(type(metric))
    new.__dict__.update(metric.__dict__, **fields)
    return new


# What `HostPlan` computes, by exact class (a subclass may compute otherwise): a ratio of two
# fields, a field itself, a field over the window's steps or seconds, steps over seconds, or
# the seconds, each as `host_values` computes it once the steps and duration are set.
_RATIO, _FIELD, _PER_STEP, _RATE, _STEPS_RATE, _TIME = range(6)
_PLAN_KINDS: dict[type, tuple[int, str, str]] = {
    clu_metrics.Average: (_RATIO, "total", "count"),
    clu_metrics.Accuracy: (_RATIO, "total", "count"),
    clu_metrics.LastValue: (_RATIO, "total", "count"),
    Sum: (_FIELD, "total", ""),
    Max: (_FIELD, "value", ""),
    Min: (_FIELD, "value", ""),
    AveragePerStep: (_PER_STEP, "total", ""),
    TimeRate: (_RATE, "numerator", ""),
    StepsPerTime: (_STEPS_RATE, "", ""),
    Time: (_TIME, "", ""),
}
# A packed leaf: its buffer, start, stop, shape and weak type.
Leaf = tuple[int, int, int, tuple[int, ...], bool]


class HostPlan:
    """`host_values` of a packed summary whose metrics are all of the classes above with 0-d
    fields (T5X's base metrics, CLU's `Average`s), as vectors over its host buffers: one
    division per pair of buffers, not a dataclass, a `compute()` and a `_divide` per metric.
    The same values, of the same types. Made by `PackedMetrics.host_plan()`, once per layout.
    """

    def __init__(
        self, indexed: Mapping[str, Any], leaves: tuple[Leaf, ...], specs: tuple[Any, ...]
    ) -> None:
        """`indexed`: the layout's dict of metrics with each leaf replaced by its index;
        `specs`: each buffer's (dtype, shape)."""
        self.keys = tuple(indexed)
        self._leaves = leaves
        self._specs = specs
        # (kind, top buffer, bottom buffer) -> (positions, top offsets, bottom offsets)
        groups: dict[tuple[int, int, int], tuple[list[int], list[int], list[int]]] = {}
        self._singles: list[tuple[int, int, int]] = []  # (position, kind, leaf)
        self._checked: list[tuple[str, type, dict[str, Any]]] = []  # see checked_metrics
        for position, (key, metric) in enumerate(indexed.items()):
            kind, top, bottom = _PLAN_KINDS[type(metric)]
            fields = vars(metric)
            if kind in (_RATIO, _PER_STEP, _RATE):
                t, b = fields[top], fields[bottom] if bottom else None
                group = groups.setdefault(
                    (kind, leaves[t][0], -1 if b is None else leaves[b][0]), ([], [], [])
                )
                group[0].append(position)
                group[1].append(leaves[t][1])
                if b is not None:
                    group[2].append(leaves[b][1])
            else:
                self._singles.append((position, kind, fields[top] if top else -1))
            timed = any(issubclass(c, Time) for _, c, _ in self._checked)
            if isinstance(metric, Step) or (isinstance(metric, Time) and not timed):
                self._checked.append((key, type(metric), dict(fields)))
        self._groups = [
            (kind, top, bottom, positions, np.array(tops), np.array(bottoms))
            for (kind, top, bottom), (positions, tops, bottoms) in groups.items()
        ]

    @classmethod
    def build(
        cls,
        treedef: Any,
        leaves: tuple[Leaf, ...],
        classes: tuple[type, ...],
        specs: tuple[Any, ...],
    ) -> "HostPlan | None":
        """The plan for a layout, or None where a metric is of another class or a leaf is not
        0-d: those take `host_values`."""
        if not all(c in _PLAN_KINDS for c in classes) or any(leaf[3] != () for leaf in leaves):
            return None
        indexed = jax.tree.unflatten(treedef, list(range(len(leaves))))
        for metric in indexed.values():  # every field it reads is a leaf (an Average's count)
            _, top, bottom = _PLAN_KINDS[type(metric)]
            if any(not isinstance(vars(metric)[f], int) for f in (top, bottom) if f):
                return None
        return cls(indexed, leaves, specs)

    def fits(self, buffers: Sequence[np.ndarray]) -> bool:
        """Whether `buffers` have the layout's dtypes and shapes, as `unpack_host` requires: a
        PackedMetrics whose buffers were cast (`jax.tree.map(lambda b: b.astype(...), packed)`)
        fails there with its TypeError, not computed here over other dtypes."""
        return tuple((b.dtype, b.shape) for b in buffers) == self._specs

    def _view(self, buffers: Sequence[np.ndarray], leaf: int) -> np.ndarray:
        b, start, stop, shape, _ = self._leaves[leaf]
        return buffers[b][start:stop].reshape(shape)  # as unpack_host makes each leaf

    def values(
        self, buffers: Sequence[np.ndarray], duration: float, num_steps: int
    ) -> dict[str, clu.values.Value]:
        """Each metric's value, as `host_values(unpack_host(buffers), duration, num_steps)`."""
        out: list[Any] = [None] * len(self.keys)
        with _nan_quietly():
            for kind, top, bottom, positions, tops, bottoms in self._groups:
                if kind == _RATIO:
                    computed = buffers[top][tops] / buffers[bottom][bottoms]
                else:  # `_divide` by a nonzero number: a plain division
                    computed = buffers[top][tops] / (num_steps if kind == _PER_STEP else duration)
                for position, value in zip(positions, computed, strict=True):
                    out[position] = value  # a NumPy scalar, as a 0-d division gives
        for position, kind, leaf in self._singles:
            if kind == _FIELD:
                out[position] = self._view(buffers, leaf)  # compute() returns the field
            else:
                out[position] = _divide(num_steps, duration) if kind == _STEPS_RATE else duration
        return {key: clu.values.Scalar(value) for key, value in zip(self.keys, out, strict=True)}

    def checked_metrics(self, buffers: Sequence[np.ndarray]) -> dict[str, Any]:
        """What the summary's checks read: every `Step` metric (its count), and a `Time` one if
        any (whether the window's duration is used), in key order."""
        out = {}
        for key, kind, fields in self._checked:
            metric: Any = object.__new__(kind)  # as `_set_host_fields`: trusted fields
            metric.__dict__.update(
                {n: self._view(buffers, v) if isinstance(v, int) else v for n, v in fields.items()}
            )
            out[key] = metric
        return out
