"""Builds TensorBoard events and `Summary.Value`s; imported by the first `TensorBoardWriter`."""

import functools
import math
import struct
import time
from collections.abc import Mapping
from itertools import chain
from typing import Any

import numpy as np

from writers import _checks, _encode
from writers._tbx import event_pb2, plugin_hparams_pb2, summary_pb2, tensor_pb2
from writers._tbx import summary as tbx_summary

Value = summary_pb2.Summary.Value

_DTYPES = {
    "float16": 19, "float32": 1, "float64": 2, "int8": 6, "int16": 5, "int32": 3,
    "int64": 9, "uint8": 4, "uint16": 17, "uint32": 22, "uint64": 23, "bool": 10,
    "complex64": 8, "complex128": 18,
}  # numpy dtype name -> TensorFlow DataType enum  # fmt: skip


def event(step: int, values: list[Any]) -> bytes:
    summary = summary_pb2.Summary(value=values)
    return event_pb2.Event(step=step, wall_time=time.time(), summary=summary).SerializeToString()


def first_events(purge_step: int | None) -> list[bytes]:
    """The file version, then a restart at `purge_step`: TensorBoard drops older events from it.

    Twice: TensorBoard's Python reader (the app's `--load_fast=false`) takes a run's first
    START as the session's own, not a restart, so one START purged nothing on a first resume.
    """
    events = [event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")]
    if purge_step is not None:
        start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
        restart = event_pb2.Event(step=purge_step, wall_time=time.time(), session_log=start)
        events += [restart, restart]
    return [e.SerializeToString() for e in events]


def scalar_event(step: int, numbers: Mapping[str, int | float]) -> bytes:
    """An event of `simple_value`s encoded by hand, byte-for-byte protobuf's (a test checks)."""
    # The hot path: a proto object per value costs about 1 us; the tags' bytes are cached.
    packer, prefixes = _summary_packer(tuple(numbers))
    try:  # one struct.pack: tags' bytes and float32 values interleaved
        pairs = zip(prefixes, numbers.values(), strict=True)
        summary = packer.pack(*chain.from_iterable(pairs))
    except (OverflowError, struct.error):  # beyond float32 (an int: struct.error): +-inf
        pairs = zip(prefixes, map(_float32, numbers.values()), strict=True)
        summary = packer.pack(*chain.from_iterable(pairs))
    step_field = b"\x10" + _varint(step) if step else b""  # proto3 omits a zero step
    size = _varint(len(summary))
    return b"".join((b"\x09", _F64.pack(time.time()), step_field, b"\x2a", size, summary))


def _float32(number: int | float) -> int | float:
    try:
        _F32.pack(float(number))
    except OverflowError:  # protobuf stores a float beyond float32 as +-inf
        return math.inf if number > 0 else -math.inf
    return number


@functools.lru_cache(maxsize=1_000)  # summaries repeat the same keys (in call order) every step
def _summary_packer(keys: tuple[str, ...]) -> tuple[struct.Struct, tuple[bytes, ...]]:
    prefixes = tuple(_scalar_prefix(key) for key in keys)
    return struct.Struct("<" + "".join(f"{len(p)}sf" for p in prefixes)), prefixes


_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")


def _scalar_prefix(key: str) -> bytes:
    tag = key.encode("utf-8")
    # Value{tag (field 1, bytes), simple_value (field 2, float32)} as field 1 of Summary.
    value_head = b"\x0a" + _varint(len(tag)) + tag + b"\x15"
    return b"\x0a" + _varint(len(value_head) + 4) + value_head


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def text(key: str, text: str) -> Any:
    (value,) = tbx_summary.text(key, text).value
    value.tag = key  # CLU's tag; tensorboardX would add "/text_summary".
    # A scalar string, as tf.summary.text writes it: tensorboardX's shape [1] is shown as a
    # one-cell table instead of the markdown itself.
    value.tensor.tensor_shape.Clear()
    return value


def images(key: str, batch: np.ndarray) -> Any:
    n, height, width, _ = batch.shape
    # The images plugin's tensor layout: [width, height, png_1, ..., png_n].
    tensor = tensor_pb2.TensorProto(
        dtype="DT_STRING",
        tensor_shape={"dim": [{"size": n + 2}]},
        string_val=[str(width).encode(), str(height).encode()] + [_encode.png(i) for i in batch],
    )
    plugin = summary_pb2.SummaryMetadata.PluginData(plugin_name="images")
    return Value(tag=key, tensor=tensor, metadata=summary_pb2.SummaryMetadata(plugin_data=plugin))


def audios(key: str, clips: np.ndarray, sample_rate: int) -> list[Any]:
    """`[N, T, C]` clips as 16-bit WAV values, tagged `key` (or `key/i` when N > 1)."""
    out = []
    for i, clip in enumerate(clips):
        audio = summary_pb2.Summary.Audio(
            sample_rate=float(sample_rate),
            num_channels=clip.shape[1],
            length_frames=clip.shape[0],
            content_type="audio/wav",
            encoded_audio_string=_encode.wav(clip, sample_rate),
        )
        out.append(Value(tag=key if len(clips) == 1 else f"{key}/{i}", audio=audio))
    return out


def histogram(key: str, arr: np.ndarray, num_buckets: int | None) -> Any:
    """The other writers' buckets (`bucketize`): a constant array's one bucket around it, where
    tensorboardX's own 30 put it in (3.0, 3.033] for 3.0, and a range past float64's split
    without inf edges."""
    values = arr.astype(np.float64)
    # Values near float64's limits: their sum of squares is inf (what TensorBoard stores).
    with np.errstate(over="ignore"):
        edges = _checks.bucketize(values, num_buckets)[1]
        return Value(tag=key, histo=tbx_summary.make_histogram(values, edges))


def hparam(value: object) -> bool | float | str:
    """A hyperparameter as the HParams plugin stores it: a bool, a str or a float."""
    encoded = _encode.hparam(value)
    return encoded if isinstance(encoded, bool | str) else _encode.as_float(encoded)


def hparams(values: Mapping[str, Any]) -> list[Any]:
    plain = {k: hparam(v) for k, v in values.items()}
    # tensorboardX logs "NaN or Inf found in input tensor." per such value, naming no key:
    # it gets 0.0, and the value is set in the plugin data it built.
    nonfinite = {k: v for k, v in plain.items() if isinstance(v, float) and not math.isfinite(v)}
    _, session_start, _ = tbx_summary.hparams(plain | dict.fromkeys(nonfinite, 0.0), {})
    if nonfinite:
        [value] = session_start.value
        data = plugin_hparams_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
        for key, number in nonfinite.items():
            data.session_start_info.hparams[key].number_value = number
        value.metadata.plugin_data.content = data.SerializeToString()
    return list(session_start.value)


def metadata(raw: Any) -> Any:
    """A `SummaryMetadata` from a proto (tensorboardX's, TensorBoard's or TF's) or bytes."""
    if raw is None:
        return None
    data = raw if isinstance(raw, bytes) else raw.SerializeToString()
    return summary_pb2.SummaryMetadata.FromString(data)


def tensor(key: str, arr: np.ndarray, meta: Any) -> Any:
    arr = _checks._widened(arr)  # bfloat16, float8: exact in float32, as in JSONL and .npy
    if arr.dtype.kind in "fc" and arr.dtype.name not in _DTYPES:  # longdouble: TF has none
        arr = arr.astype(np.float64 if arr.dtype.kind == "f" else np.complex128)
    if arr.dtype.name in _DTYPES:
        # tensor_content is little-endian: a big-endian array's bytes read back as other numbers.
        data = np.ascontiguousarray(arr, arr.dtype.newbyteorder("<")).tobytes()
        content = dict(dtype=_DTYPES[arr.dtype.name], tensor_content=data)
    else:  # strings and objects: one string per element, lone surrogates escaped as in texts
        items = [
            x if isinstance(x, bytes) else _checks.plain_str(str(x)).encode()
            for x in arr.reshape(-1).tolist()
        ]
        content = dict(dtype="DT_STRING", string_val=items)
    shape = {"dim": [{"size": d} for d in arr.shape]}
    proto = tensor_pb2.TensorProto(tensor_shape=shape, **content)
    return Value(tag=key, tensor=proto, metadata=meta)  # protobuf skips a None field
