"""`write_values`: writes a mapping of `clu.values` objects with one call per kind.

Calls come in a fixed order: summaries (one per metadata), scalars, images, texts, hparams,
histograms, audios (one per sample rate). Unlike CLU's: `HyperParam` values go to
`write_hparams(hparams)` without a step; one `TypeError` names every unsupported value before
anything is written; `clu.values` is only looked at when already imported (no JAX import).

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

import numbers
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from writers._checks import (
    _CONVERTERS,
    _looks_like_array,
    _ml_wider,
    check_keys,
    check_step,
    numpy_dtype,
)
from writers.interface import MetricWriter

__all__ = ["group_values", "write_values"]

Call = tuple[str, dict[str, Any]]  # a writer call: method name and kwargs (without the step)


def write_values(writer: MetricWriter, step: int, metrics: Mapping[str, Any]) -> None:
    """Writes `metrics` to `writer` at `step`, one writer call per kind of value.

    Args:
      writer: Any writer with CLU's method names (ours or CLU's).
      step: The step.
      metrics: name -> `clu.values.Value`, a number, or an array of one element (CLU's
        parameter name: `write_values(writer, step, metrics=...)` works as with CLU's).

    Raises:
      TypeError: unsupported values (every key listed), a non-str key, a non-integer step.
      ValueError: a negative step or an empty key.

    Example:
      >>> import writers
      >>> writers.write_values(writers.NoopWriter(), 0, {"loss": 1.0})
    """
    step = check_step(step, "write_values")
    check_keys(metrics, "write_values")
    for method, kwargs in group_values(metrics):
        if method == "write_hparams":
            writer.write_hparams(**kwargs)
        else:
            getattr(writer, method)(step=step, **kwargs)


def group_values(values: Mapping[str, Any], skipped: dict[str, str] | None = None) -> list[Call]:
    """`write_values`' calls for `values`, as `(method, kwargs)` without the step, in order.

    An unsupported value raises `TypeError`, or, when `skipped` is given, is left out and
    listed there as key -> its type (so a caller can write the rest).
    """
    clu_values = sys.modules.get("clu.values")
    scalar_type = None if clu_values is None else clu_values.Scalar
    summaries: list[tuple[Any, dict[str, Any]]] = []
    groups: dict[str, dict[str, Any]] = {kind: {} for kind in _SIMPLE_CALLS}
    num_buckets: dict[str, int] = {}
    audios: dict[int, dict[str, Any]] = {}
    unsupported: dict[str, str] = {} if skipped is None else skipped
    for key, value in values.items():
        cls = type(value)
        if cls in _CONVERTERS:  # an exact number type
            groups["scalar"][key] = value
        elif cls is scalar_type and type(value.value) in _CONVERTERS:
            groups["scalar"][key] = value.value  # what compute_value() gives: the common case
        elif (kind := _clu_kind(cls, clu_values)) is None and _is_plain_scalar(value):
            groups["scalar"][key] = value
        elif kind is None or (kind == "scalar" and not _is_plain_scalar(value.value)):
            unsupported[key] = _describe(value)
        elif kind == "summary":
            _group_by_metadata(summaries, value.metadata)[key] = value.value
        elif kind == "audio":
            audios.setdefault(value.sample_rate, {})[key] = value.value
        else:
            groups[kind][key] = value.value
            if kind == "histogram":
                num_buckets[key] = value.num_buckets
    if unsupported and skipped is None:
        raise TypeError(unsupported_message(unsupported))
    calls: list[Call] = [
        ("write_summaries", {"values": group, "metadata": metadata})
        for metadata, group in summaries
    ]
    for kind, (method, arg) in _SIMPLE_CALLS.items():
        if groups[kind]:
            calls.append((method, {arg: groups[kind]}))
            if kind == "histogram":
                calls[-1][1]["num_buckets"] = num_buckets
    calls += [
        ("write_audios", {"audios": group, "sample_rate": rate}) for rate, group in audios.items()
    ]
    return calls


_SIMPLE_CALLS = {  # kind -> (method, argument), in the order of the calls
    "scalar": ("write_scalars", "scalars"),
    "image": ("write_images", "images"),
    "text": ("write_texts", "texts"),
    "hyperparam": ("write_hparams", "hparams"),
    "histogram": ("write_histograms", "arrays"),
}
# clu.values classes in the order they are matched; a value's kind is its class name, lowercased.
_CLU_CLASSES = ("Summary", "Scalar", "Image", "Text", "HyperParam", "Histogram", "Audio")


def _clu_kind(cls: type, clu_values: Any) -> str | None:
    if clu_values is not None:
        for name in _CLU_CLASSES:
            if issubclass(cls, getattr(clu_values, name)):
                return name.lower()
    return None


def _is_plain_scalar(value: Any) -> bool:
    # numpy counts timedelta64 as an integer: write_scalars refuses it (units unknown).
    if isinstance(value, numbers.Number) and not isinstance(
        value, complex | np.complexfloating | np.timedelta64
    ):
        return True
    if type(value) is np.ndarray and value.dtype.kind in "biuf":
        return value.size == 1
    if isinstance(value, np.ndarray) or _looks_like_array(value):
        if (dtype := numpy_dtype(value.dtype)) is None:  # torch's: as NumPy reads the tensor
            try:
                value = np.asarray(value)
            except (TypeError, ValueError):  # a JAX PRNG key: unsupported, named below
                return False
            dtype = value.dtype
        return int(np.prod(value.shape)) == 1 and (dtype.kind in "biuf" or _ml_wider(dtype))
    return False


def unsupported_message(unsupported: Mapping[str, str]) -> str:
    """Why `write_values` cannot write the values described in `unsupported`, and the fix."""
    listed = ", ".join(f"{key!r}: {what}" for key, what in unsupported.items())
    return (
        f"write_values: unsupported value types for {listed}. Supported: "
        "clu.values (Scalar, Image, Text, HyperParam, Histogram, Audio, Summary), Python/numpy "
        "numbers and arrays of one element (bfloat16 and float16 included). Reduce arrays to a "
        "scalar or wrap them, e.g. clu.values.Histogram(x, num_buckets=30)."
    )


def _describe(value: Any) -> str:
    prefix = ""
    if type(value).__name__ == "Scalar" and hasattr(value, "value"):
        prefix, value = "Scalar of ", value.value
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    described = prefix + type(value).__name__
    # A timedelta, a str array, a JAX PRNG key (a dtype NumPy cannot interpret).
    if dtype is not None and ((known := numpy_dtype(dtype)) is None or known.kind not in "biuf"):
        described += f" of dtype {dtype}"
    return described + ("" if shape is None else f" of shape {tuple(shape)}")


def _group_by_metadata(groups: list[tuple[Any, dict[str, Any]]], metadata: Any) -> dict[str, Any]:
    # Metadata is often an unhashable proto or dict, so compare instead of hashing.
    for existing, group in groups:
        try:
            if existing is metadata or (existing == metadata) is True:
                return group
        except Exception:  # noqa: BLE001  (arbitrary user objects may refuse comparison)
            pass
    groups.append((metadata, {}))
    return groups[-1][1]
