"""`write_values`: writes a mapping of `clu.values` objects with one call per kind.

A metric's `compute_value()` returns a `clu.values.Value` (`Scalar`, `Image`,
`Text`, `Histogram`, `Audio`, `HyperParam`, `Summary`); plain numbers and
one-element arrays count as scalars. `write_values` groups a summary by kind and
calls the writer once per kind, in a fixed order: summaries (one call per
metadata), scalars, images, texts, hparams, histograms, audios (one call per
sample rate).

Differences from CLU's `write_values`: `HyperParam` values go to
`write_hparams(hparams)` without a step (CLU passes a step and breaks); every
value is checked before anything is written, and one `TypeError` names every
unsupported key and type; `clu.values` is only looked at when it is already
imported, so this module does not pull in JAX.

Example:
  >>> import writers
  >>> from clu import values
  >>> class Show(writers.NoopWriter):
  ...   def write_scalars(self, step, scalars):
  ...     print("scalars", step, sorted(scalars))
  ...   def write_texts(self, step, texts):
  ...     print("texts", step, texts)
  >>> writers.write_values(Show(), 7, {"loss": values.Scalar(0.25), "lr": 1e-3,
  ...                                  "note": values.Text("hi")})
  scalars 7 ['loss', 'lr']
  texts 7 {'note': 'hi'}
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from writers._checks import _is_ml_float, _looks_like_array, check_keys, check_step
from writers.interface import MetricWriter

__all__ = ["group_values", "write_values"]

Call = tuple[str, dict[str, Any]]
"""A writer call: method name and keyword arguments (without the step)."""


def write_values(writer: MetricWriter, step: int, values: Mapping[str, Any]) -> None:
    """Writes `values` to `writer` at `step`, one writer call per kind of value.

    Args:
      writer: Any writer with CLU's method names (ours or CLU's).
      step: Non-negative integer step.
      values: Mapping from name to a `clu.values.Value`, a Python or numpy number,
        or an array (numpy, JAX) of one element.

    Raises:
      TypeError: some values are of an unsupported type (all are listed, with
        their keys), a key is not a str, or `step` is not an integer.
      ValueError: `step` is negative or a key is empty.

    Example:
      >>> import writers
      >>> writers.write_values(writers.NoopWriter(), 0, {"loss": 1.0})
    """
    step = check_step(step, "write_values")
    check_keys(values, "write_values")
    for method, kwargs in group_values(values):
        if method == "write_hparams":
            writer.write_hparams(**kwargs)
        else:
            getattr(writer, method)(step=step, **kwargs)


def group_values(values: Mapping[str, Any]) -> list[Call]:
    """The writer calls that write `values`: one per kind, in `write_values`' order.

    Args:
      values: Mapping from name to a `clu.values.Value` or a plain scalar.

    Returns:
      `(method, kwargs)` pairs; every call but `write_hparams` also takes `step`.

    Raises:
      TypeError: naming every key whose value has an unsupported type.
    """
    clu_values = sys.modules.get("clu.values")
    summaries: list[tuple[Any, dict[str, Any]]] = []
    scalars: dict[str, Any] = {}
    images: dict[str, Any] = {}
    texts: dict[str, Any] = {}
    hparams: dict[str, Any] = {}
    histograms: dict[str, Any] = {}
    num_buckets: dict[str, int] = {}
    audios: dict[int, dict[str, Any]] = {}
    unsupported: list[str] = []
    scalar_type = None if clu_values is None else clu_values.Scalar
    for key, value in values.items():
        cls = type(value)
        if cls in _PLAIN_SCALAR_TYPES:
            scalars[key] = value
            continue
        if cls is scalar_type and type(value.value) in _PLAIN_SCALAR_TYPES:
            scalars[key] = value.value  # what compute_value() gives: the common case
            continue
        kind = _kind(value, clu_values)
        if kind == "scalar":
            scalars[key] = getattr(value, "value", value) if _is_clu(value, clu_values) else value
        elif kind == "summary":
            _group_by_metadata(summaries, value.metadata)[key] = value.value
        elif kind == "image":
            images[key] = value.value
        elif kind == "text":
            texts[key] = value.value
        elif kind == "hparam":
            hparams[key] = value.value
        elif kind == "histogram":
            histograms[key] = value.value
            num_buckets[key] = value.num_buckets
        elif kind == "audio":
            audios.setdefault(value.sample_rate, {})[key] = value.value
        else:
            unsupported.append(f"{key!r}: {_describe(value)}")
    if unsupported:
        raise TypeError(
            "write_values: unsupported value types for "
            + ", ".join(unsupported)
            + ". Supported: clu.values (Scalar, Image, Text, HyperParam, Histogram, Audio, "
            "Summary), Python/numpy numbers and arrays of one element (bfloat16 and float16 "
            "included). Reduce arrays to a scalar or wrap them, e.g. "
            "clu.values.Histogram(x, num_buckets=30)."
        )
    calls: list[Call] = [
        ("write_summaries", {"values": group, "metadata": metadata})
        for metadata, group in summaries
    ]
    if scalars:
        calls.append(("write_scalars", {"scalars": scalars}))
    if images:
        calls.append(("write_images", {"images": images}))
    if texts:
        calls.append(("write_texts", {"texts": texts}))
    if hparams:
        calls.append(("write_hparams", {"hparams": hparams}))
    if histograms:
        calls.append(("write_histograms", {"arrays": histograms, "num_buckets": num_buckets}))
    calls += [
        ("write_audios", {"audios": group, "sample_rate": rate}) for rate, group in audios.items()
    ]
    return calls


def _is_clu(value: Any, clu_values: Any) -> bool:
    return clu_values is not None and isinstance(value, clu_values.Scalar)


_CLU_KINDS = (
    ("Summary", "summary"),
    ("Scalar", "scalar"),
    ("Image", "image"),
    ("Text", "text"),
    ("HyperParam", "hparam"),
    ("Histogram", "histogram"),
    ("Audio", "audio"),
)


def _kind(value: Any, clu_values: Any) -> str | None:
    if clu_values is not None:
        kind = _clu_kind(type(value), clu_values)
        if kind is not None:
            if kind == "scalar" and not _is_plain_scalar(value.value):
                return None
            return kind
    return "scalar" if _is_plain_scalar(value) else None


def _clu_kind(cls: type, clu_values: Any) -> str | None:
    """The kind of `clu.values` class `cls` is (a subclass counts), or None."""
    for name, kind in _CLU_KINDS:
        if issubclass(cls, getattr(clu_values, name)):
            return kind
    return None


# Exact types that `_is_plain_scalar` always accepts, checked with one set lookup.
_PLAIN_SCALAR_TYPES = frozenset(
    {float, int, bool, np.bool_, np.float16, np.float32, np.float64, np.longdouble}
    | {np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64}
)


def _is_plain_scalar(value: Any) -> bool:
    if isinstance(value, numbers.Number) and not isinstance(value, complex | np.complexfloating):
        return True
    if type(value) is np.ndarray and value.dtype.kind in "biuf":
        return value.size == 1
    if isinstance(value, np.ndarray) or _looks_like_array(value):
        dtype = np.dtype(value.dtype)
        return int(np.prod(value.shape)) == 1 and (
            np.issubdtype(dtype, np.integer)
            or np.issubdtype(dtype, np.floating)
            or _is_ml_float(dtype)
            or dtype == np.bool_
        )
    return False


def _describe(value: Any) -> str:
    inner = getattr(value, "value", None) if type(value).__name__ == "Scalar" else None
    if inner is not None:
        value = inner
        prefix = "Scalar of "
    else:
        prefix = ""
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"{prefix}{type(value).__name__} of shape {tuple(shape)}"
    return f"{prefix}{type(value).__name__}"


def _group_by_metadata(groups: list[tuple[Any, dict[str, Any]]], metadata: Any) -> dict[str, Any]:
    # Metadata is often an unhashable proto or dict, so compare instead of hashing.
    for existing, group in groups:
        if existing is metadata or _equal(existing, metadata):
            return group
    new: dict[str, Any] = {}
    groups.append((metadata, new))
    return new


def _equal(a: Any, b: Any) -> bool:
    try:
        result = a == b
    except Exception:  # noqa: BLE001  (arbitrary user objects may refuse comparison)
        return False
    return result if isinstance(result, bool) else False
