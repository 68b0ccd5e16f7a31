"""Input checks shared by every writer, so all backends reject the same things.

The writer contract (see `writers.interface`) says: steps are non-negative
integers, keys are non-empty strings, scalars hold exactly one number, images
are `[H, W, C]` or `[N, H, W, C]` with 1, 3 or 4 channels. Each check looks at
every key of a call before raising, so one error lists every problem.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from writers._problems import Problems


def check_step(step: Any, method: str = "write") -> int:
    """Returns `step` as a Python int, or raises if it is not a non-negative integer.

    Args:
      step: The step passed to a write method: a Python or numpy integer, or an
        integer array holding one element.
      method: Name of the calling method, for the error message.

    Returns:
      The step as a Python int.

    Raises:
      TypeError: `step` is not an integer (a float, a string, a bool...).
      ValueError: `step` is negative.
    """
    if type(step) is int and 0 <= step < MAX_STEP:  # the common case: no ABC isinstance checks
        return step
    value = step
    if isinstance(value, np.ndarray) or _looks_like_array(value):
        arr = np.asarray(value)
        if arr.size == 1 and np.issubdtype(arr.dtype, np.integer):
            value = int(arr.reshape(()))
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{method}: step must be a non-negative integer, got {step!r} of type "
            f"{type(step).__name__}. Pass an int, e.g. int(step)."
        )
    value = int(value)
    if value < 0:
        raise ValueError(
            f"{method}: step must be a non-negative integer, got {value}. Steps count "
            "from 0; check the step counter you pass in."
        )
    if value >= MAX_STEP:
        raise ValueError(
            f"{method}: step must be below 2**63 (TensorBoard and JSONL readers store steps "
            f"as int64), got {value}. Check the step counter you pass in."
        )
    return value


MAX_STEP = 2**63
"""Steps are int64 in TensorBoard's event proto; 2**63 and above read back wrong."""


class Checked(dict):  # type: ignore[type-arg]
    """A mapping already checked at a public entry point (keys, step, values converted).

    The manager checks a call's values once and hands its writers a `Checked`; backends
    built on `writers._base.BaseWriter` skip their own checks for it. Any other writer
    just sees a dict.
    """

    __slots__ = ()


def check_keys(values: Any, method: str) -> None:
    """Raises if `values` is not a mapping whose keys are all non-empty strings.

    Args:
      values: The mapping passed to a write method.
      method: Name of the calling method, for the error message.

    Raises:
      TypeError: `values` is not a mapping, or some keys are not strings.
      ValueError: some keys are empty (or only whitespace).
    """
    if type(values) is not dict and not isinstance(values, Mapping):
        raise TypeError(
            f"{method}: expected a mapping from name to value, got "
            f"{type(values).__name__}. Wrap the value, e.g. {{'loss': value}}."
        )
    if all(type(k) is str and k and not k.isspace() for k in values):
        return  # the common case, in one pass
    problems = Problems(method)
    _key_problems(values, problems)
    problems.raise_if_any()


def _key_problems(values: Mapping[Any, Any], problems: Problems) -> None:
    bad_types = [k for k in values if not isinstance(k, str)]
    if bad_types:
        listed = ", ".join(f"{k!r} ({type(k).__name__})" for k in bad_types)
        problems.type_problem(f"every key must be a str, got {listed}. Convert keys with str().")
    empty = [k for k in values if isinstance(k, str) and not k.strip()]
    if empty:
        problems.value_problem(
            f"keys must be non-empty names, got {empty!r}. Give each value a name such "
            "as 'loss' or 'eval/accuracy'."
        )


def check_call(method: str, step: Any, values: Any) -> int:
    """Checks a write call's step and keys together, so one error lists both problems.

    Args:
      method: Name of the calling method, for the error message.
      step: The step argument.
      values: The mapping argument.

    Returns:
      The step as a Python int.

    Raises:
      TypeError: the step is not an integer, `values` is not a mapping, or a key is
        not a str (if both the step and the keys are wrong, the message has both).
      ValueError: the step is negative or a key is empty.
    """
    problems = Problems(method)
    checked = 0
    try:
        checked = check_step(step, method)
    except (TypeError, ValueError) as err:
        problems.add(type(err), str(err).removeprefix(f"{method}: "))
    try:
        check_keys(values, method)
    except (TypeError, ValueError) as err:
        problems.add(type(err), str(err).removeprefix(f"{method}: "))
    problems.raise_if_any()
    return checked


WRITER_METHODS = (
    "write_summaries",
    "write_scalars",
    "write_images",
    "write_videos",
    "write_audios",
    "write_texts",
    "write_histograms",
    "write_hparams",
    "flush",
    "close",
)


def check_writers(writers: Mapping[str, Any], context: str) -> None:
    """Raises if some objects lack CLU's writer methods (each one and what it lacks is listed).

    Raises:
      TypeError: naming every object that is not a writer and its missing methods.
    """
    problems = Problems(context)
    fix = "pass instances with CLU's MetricWriter methods, e.g. writers.JsonlWriter(path)"
    for name, writer in writers.items():
        if isinstance(writer, type):
            problems.type_problem(
                f"{name!r} is the class {writer.__name__}, not an instance; {fix}"
            )
            continue
        missing = [m for m in WRITER_METHODS if not callable(getattr(writer, m, None))]
        if missing:
            problems.type_problem(
                f"{name!r} ({type(writer).__name__}) lacks {', '.join(missing)}; {fix}"
            )
    problems.raise_if_any()


def to_number(key: str, value: Any) -> int | float:
    """Returns a scalar value as a Python int or float.

    Bools become ints; NaN and infinities are kept (each backend documents how it
    shows them).

    Args:
      key: Name of the value, for the error message.
      value: A Python or numpy number, or an array (numpy, JAX, ...) of size 1.

    Returns:
      A Python int for integer and bool inputs, else a Python float.

    Raises:
      TypeError: `value` is not numeric.
      ValueError: `value` is an array with more or fewer than one element.
    """
    cls = type(value)
    if cls is float or cls is int:  # the common case first: this runs once per value
        return value
    convert = _CONVERTERS.get(cls)
    if convert is not None:  # numpy scalars and bool, without ABC isinstance checks
        return convert(value)
    if isinstance(value, np.generic):
        if isinstance(value, np.floating) or _is_ml_float(value.dtype):
            return float(value)  # bfloat16 and float8 widen to float exactly
        if isinstance(value, np.integer | np.bool_):
            return int(value)
    elif isinstance(value, np.ndarray) or _looks_like_array(value):
        arr = np.asarray(value)
        if arr.size != 1:
            raise ValueError(
                f"scalar {key!r} must hold exactly one number, got an array of shape "
                f"{arr.shape}. Reduce it first (e.g. .mean()) or write it as a histogram."
            )
        if np.issubdtype(arr.dtype, np.floating) or _is_ml_float(arr.dtype):
            return float(arr.reshape(()))
        if np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_:
            return int(arr.reshape(()))
    elif isinstance(value, numbers.Integral):  # bool, IntEnum, ...
        return int(value)
    elif isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(
        f"scalar {key!r} must be a number, got {value!r} of type {type(value).__name__}. "
        "Write strings with write_texts."
    )


# Exact types whose `to_number` conversion depends only on the type: looked up
# by `type(value)` instead of walking isinstance checks against numpy's ABCs.
_CONVERTERS: dict[type, Callable[[Any], int | float]] = {
    float: float,  # float() and int() return an exact float or int itself
    int: int,
    bool: int,
    np.bool_: int,
    **{t: float for t in (np.float16, np.float32, np.float64, np.longdouble)},
    **{
        t: int
        for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
    },
}


def check_numbers(scalars: Mapping[str, Any], method: str) -> dict[str, int | float]:
    """Converts every scalar with `to_number`, raising once with all bad keys.

    Args:
      scalars: Mapping from name to scalar value.
      method: Name of the calling method, for the error message.

    Returns:
      A new dict from name to Python int or float, in the input order.

    Raises:
      TypeError: if any value is not numeric (all such keys are listed).
      ValueError: if any array value does not hold exactly one number.
    """
    converters = _CONVERTERS
    try:  # the common case: every value's type has a converter (one C-level pass)
        return {key: converters[type(value)](value) for key, value in scalars.items()}
    except KeyError:
        pass
    out: dict[str, int | float] = {}
    problems = Problems(method)
    for key, value in scalars.items():
        convert = converters.get(type(value))
        if convert is not None:
            out[key] = convert(value)
            continue
        try:
            out[key] = to_number(key, value)
        except (TypeError, ValueError) as err:
            problems.add(type(err), str(err))
    problems.raise_if_any()
    return out


def check_arrays(
    arrays: Mapping[str, Any],
    method: str,
    check: Callable[[str, np.ndarray], str | None],
) -> dict[str, np.ndarray]:
    """Converts every value to a numpy array and runs `check` on each.

    Args:
      arrays: Mapping from name to array-like.
      method: Name of the calling method, for the error message.
      check: Returns a problem description for a bad array, or None.

    Returns:
      A new dict from name to numpy array.

    Raises:
      ValueError: listing every key whose array failed `check`.
    """
    out = {key: np.asarray(value) for key, value in arrays.items()}
    problems = Problems(method)
    for key, arr in out.items():
        if msg := check(key, arr):
            problems.value_problem(msg)
    problems.raise_if_any()
    return out


def image_problem(key: str, arr: np.ndarray) -> str | None:
    """Describes what is wrong with an image array, or returns None if it is fine."""
    if arr.ndim not in (3, 4) or arr.shape[-1] not in (1, 3, 4):
        return (
            f"image {key!r} must have shape [H, W, C] or [N, H, W, C] with C in (1, 3, 4), "
            f"got shape {arr.shape}. Add a channel axis for grayscale (x[..., None])."
        )
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        return f"image {key!r} must be numeric, got dtype {arr.dtype}."
    return None


def video_problem(key: str, arr: np.ndarray) -> str | None:
    """Describes what is wrong with a video array, or returns None if it is fine."""
    if arr.ndim != 5 or arr.shape[-1] not in (1, 3, 4):
        return (
            f"video {key!r} must have shape [N, T, H, W, C] with C in (1, 3, 4), got "
            f"shape {arr.shape}."
        )
    return None


def audio_problem(key: str, arr: np.ndarray) -> str | None:
    """Describes what is wrong with an audio array, or returns None if it is fine."""
    if arr.ndim != 3 or not np.issubdtype(arr.dtype, np.number):
        return (
            f"audio {key!r} must be a numeric array of shape [N, T, C] with values in "
            f"[-1, 1], got dtype {arr.dtype} and shape {arr.shape}."
        )
    return None


def check_images(images: Mapping[str, Any], method: str) -> dict[str, np.ndarray]:
    """`check_arrays` with `image_problem`: every image is `[H, W, C]` or `[N, H, W, C]`."""
    return check_arrays(images, method, image_problem)


def check_histograms(arrays: Mapping[str, Any], method: str) -> dict[str, np.ndarray]:
    """`check_arrays` with `histogram_problem`: every array is numeric, finite, non-empty."""
    return check_arrays(arrays, method, histogram_problem)


def check_videos(videos: Mapping[str, Any], method: str) -> dict[str, np.ndarray]:
    """`check_arrays` with `video_problem`: every video is `[N, T, H, W, C]`."""
    return check_arrays(videos, method, video_problem)


def check_audios(audios: Mapping[str, Any], sample_rate: Any, method: str) -> dict[str, np.ndarray]:
    """Checks every audio array (`[N, T, C]`) and the sample rate (a positive int).

    Raises:
      TypeError: `sample_rate` is not an integer.
      ValueError: `sample_rate` is not positive, or an array has the wrong shape.
    """
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Integral):
        raise TypeError(
            f"{method}: sample_rate must be an integer number of samples per second, got "
            f"{sample_rate!r} of type {type(sample_rate).__name__}."
        )
    if sample_rate <= 0:
        raise ValueError(f"{method}: sample_rate must be positive, got {sample_rate}.")
    return check_arrays(audios, method, audio_problem)


def histogram_problem(key: str, arr: np.ndarray) -> str | None:
    """Describes what is wrong with a histogram input, or returns None if it is fine."""
    if not np.issubdtype(arr.dtype, np.number):
        return f"histogram {key!r} must be numeric, got dtype {arr.dtype}."
    if arr.size == 0:
        return f"histogram {key!r} is empty (shape {arr.shape}); there is nothing to bin."
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        return (
            f"histogram {key!r} has {bad} NaN/Inf entries out of {arr.size}; bins need "
            "finite values. Filter them (x[np.isfinite(x)]) or log the count as a scalar."
        )
    return None


def check_texts(texts: Mapping[str, Any], method: str) -> dict[str, str]:
    """Checks that every text value is a str.

    Raises:
      TypeError: listing every key whose value is not a str.
    """
    bad = {k: type(v).__name__ for k, v in texts.items() if not isinstance(v, str)}
    if bad:
        raise TypeError(
            f"{method}: text values must be str, got {bad}. Convert with str() or "
            "write numbers with write_scalars."
        )
    return dict(texts)


def is_finite_number(value: int | float) -> bool:
    """True for ints and finite floats."""
    return isinstance(value, int) or math.isfinite(value)


def images_as_uint8(arr: np.ndarray) -> np.ndarray:
    """Returns images as `[N, H, W, C]` uint8.

    Integer images are read as [0, 255], float images as [0, 1] (as TensorBoard
    does); both are clipped, NaN becomes 0.
    """
    if arr.ndim == 3:
        arr = arr[None]
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    if np.issubdtype(arr.dtype, np.integer):
        return np.clip(arr, 0, 255).astype(np.uint8)
    scaled = np.nan_to_num(arr.astype(np.float64), nan=0.0) * 255.0
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8)


def _is_ml_float(dtype: Any) -> bool:
    """bfloat16 and float8 (ml_dtypes, as JAX uses them) are floats NumPy does not know."""
    return np.dtype(dtype).name.startswith(("bfloat16", "float8"))


def _looks_like_array(value: Any) -> bool:
    # JAX, torch and other array types without importing them.
    return hasattr(value, "__array__") and hasattr(value, "shape") and hasattr(value, "dtype")


DEFAULT_NUM_BUCKETS = 30


def bucketize(arr: np.ndarray, num_buckets: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Equal-width histogram of a finite, non-empty array, as TensorFlow builds it.

    Args:
      arr: Finite numeric values of any shape (see `histogram_problem`).
      num_buckets: Number of buckets; None means 30, values below 2 mean 2.

    Returns:
      `(counts, edges)` with `len(edges) == len(counts) + 1`. When every value is
      the same, one bucket `[v - 0.5, v + 0.5]` holds them all.
    """
    flat = np.asarray(arr, dtype=np.float64).reshape(-1)
    buckets = max(2, int(num_buckets or DEFAULT_NUM_BUCKETS))
    low, high = float(flat.min()), float(flat.max())
    if low == high:
        return np.asarray([flat.size], dtype=np.int64), np.asarray([low - 0.5, high + 0.5])
    counts, edges = np.histogram(flat, bins=buckets, range=(low, high))
    return counts.astype(np.int64), edges
