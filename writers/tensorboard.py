"""`TensorBoardWriter`: TensorBoard event files through tensorboardX, one event per call.

All values of one write call go into one `Summary` proto, written as one event
(tensorboardX's `add_scalar` writes one event per value; batching is about 17x
faster). Events are written synchronously into tensorboardX's record writer, so
`flush()` really means "on disk" (tensorboardX's own queue may still hold events
after its `flush()`); wrap the writer in `AsyncWriter` to take the work off the
training loop. A background timer also flushes every `flush_secs`.

Where values land (as TensorBoard's `EventAccumulator` reads them):

* scalars: `simple_value` under the key (NaN and infinities kept as they are);
* texts: the text plugin, under the key itself (CLU's tag; tensorboardX's
  `add_text` would add `/text_summary`);
* images: the images plugin, one tag per key holding all N images as PNG;
* videos `[N, T, H, W, C]`: each video as one filmstrip image `[H, T*W, C]`;
* audio `[N, T, C]`: 16-bit WAV clips under the key (`<key>/<i>` when N > 1);
* histograms: `HistogramProto` with `num_buckets` equal-width buckets (30 by default);
* hparams: the HParams plugin's session-start info, at step 0;
* raw tensors (`write_summaries`): tensor protos with the given `SummaryMetadata`.

`purge_step` is the resume fix: TensorBoard hides events at or after that step
written by earlier runs into the same directory.

Example:
  >>> import tempfile, writers
  >>> w = writers.TensorBoardWriter(tempfile.mkdtemp())
  >>> w.write_scalars(1, {"loss": 0.5, "accuracy": 0.75})  # one event, two values
  >>> w.close()
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from writers import _checks, _encode
from writers._base import BaseWriter
from writers.interface import Array, Scalar

_DTYPES = {
    "float16": 19,
    "float32": 1,
    "float64": 2,
    "int8": 6,
    "int16": 5,
    "int32": 3,
    "int64": 9,
    "uint8": 4,
    "uint16": 17,
    "uint32": 22,
    "uint64": 23,
    "bool": 10,
}  # numpy dtype name -> TensorFlow DataType enum value


class TensorBoardWriter(BaseWriter):
    """Writes TensorBoard event files; all values of one call become one event.

    Args:
      logdir: Directory for the event file (created if missing).
      purge_step: When resuming at this step, hide events at or after it from
        earlier runs in `logdir`.
      flush_secs: A background timer flushes pending events this often.
      filename_suffix: Appended to the event file name.
    """

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        *,
        purge_step: int | None = None,
        flush_secs: float = 10.0,
        filename_suffix: str = "",
    ):
        # tensorboardX is imported here so that `import writers` stays light.
        from tensorboardX import summary as tbx_summary
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2

        self._pb = event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
        self._tbx_summary = tbx_summary
        self._logdir = os.fspath(logdir)
        os.makedirs(self._logdir, exist_ok=True)
        self._events = EventsWriter(os.path.join(self._logdir, "events"), filename_suffix)
        if purge_step is not None:
            start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
            step = _checks.check_step(purge_step, "TensorBoardWriter(purge_step=...)")
            self._events.write_event(
                event_pb2.Event(step=step, wall_time=time.time(), session_log=start)
            )
        self._pending = False
        self._stop = threading.Event()
        self._flusher = threading.Thread(
            target=self._flush_periodically,
            args=(flush_secs,),
            daemon=True,
            name=f"TensorBoardWriter-flush({self._logdir})",
        )
        self._flusher.start()

    @property
    def logdir(self) -> str:
        """Directory holding the event file."""
        return self._logdir

    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Writes raw tensors, each with `metadata` (a `SummaryMetadata` proto or its bytes)."""
        step = self._begin("write_summaries", step, values)
        meta = self._metadata(metadata)
        self._emit(step, [self._tensor_value(k, np.asarray(v), meta) for k, v in values.items()])

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        """Writes every scalar of the call as one `simple_value` in one event."""
        step = self._begin("write_scalars", step, scalars)
        numbers = _checks.check_numbers(scalars, "TensorBoardWriter.write_scalars")
        value = self._pb[1].Summary.Value
        self._emit(step, [value(tag=k, simple_value=v) for k, v in numbers.items()])

    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        """Writes each `[H, W, C]` or `[N, H, W, C]` array under its key as PNGs."""
        step = self._begin("write_images", step, images)
        arrays = _checks.check_arrays(
            images, "TensorBoardWriter.write_images", _checks.image_problem
        )
        self._emit(
            step, [self._image_value(k, _checks.images_as_uint8(v)) for k, v in arrays.items()]
        )

    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        """Writes each `[N, T, H, W, C]` video as a filmstrip image `[H, T*W, C]`."""
        step = self._begin("write_videos", step, videos)
        arrays = _checks.check_arrays(videos, "TensorBoardWriter.write_videos", _video_problem)
        strips = {}
        for key, video in arrays.items():
            n, t, h, w, c = video.shape
            strips[key] = _checks.images_as_uint8(
                video.transpose(0, 2, 1, 3, 4).reshape(n, h, t * w, c)
            )
        self._emit(step, [self._image_value(k, v) for k, v in strips.items()])

    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        """Writes each `[N, T, C]` array as N 16-bit WAV clips."""
        step = self._begin("write_audios", step, audios)
        arrays = _checks.check_arrays(audios, "TensorBoardWriter.write_audios", _audio_problem)
        summary_pb2 = self._pb[1]
        values = []
        for key, clips in arrays.items():
            for i, clip in enumerate(clips):
                audio = summary_pb2.Summary.Audio(
                    sample_rate=float(sample_rate),
                    num_channels=clip.shape[1],
                    length_frames=clip.shape[0],
                    content_type="audio/wav",
                    encoded_audio_string=_encode.wav(clip, sample_rate),
                )
                tag = key if len(clips) == 1 else f"{key}/{i}"
                values.append(summary_pb2.Summary.Value(tag=tag, audio=audio))
        self._emit(step, values)

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Writes texts (markdown) to the text plugin under their keys."""
        step = self._begin("write_texts", step, texts)
        values = []
        for key, text in _checks.check_texts(texts, "TensorBoardWriter.write_texts").items():
            (value,) = self._tbx_summary.text(key, text).value
            value.tag = key
            values.append(value)
        self._emit(step, values)

    def write_histograms(
        self,
        step: int,
        arrays: Mapping[str, Array],
        num_buckets: Mapping[str, int] | None = None,
    ) -> None:
        """Writes a histogram per array with `num_buckets[key]` buckets (default 30)."""
        step = self._begin("write_histograms", step, arrays)
        checked = _checks.check_arrays(
            arrays, "TensorBoardWriter.write_histograms", _checks.histogram_problem
        )
        buckets = num_buckets or {}
        value = self._pb[1].Summary.Value
        self._emit(
            step,
            [
                value(
                    tag=k,
                    histo=self._tbx_summary.make_histogram(
                        arr.astype(np.float64),
                        max(2, buckets.get(k) or _checks.DEFAULT_NUM_BUCKETS),
                    ),
                )
                for k, arr in checked.items()
            ],
        )

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Writes hyperparameters for TensorBoard's HParams plugin (at step 0)."""
        self._check_open("write_hparams")
        _checks.check_keys(hparams, "TensorBoardWriter.write_hparams")
        plain = {k: _hparam(v) for k, v in hparams.items()}
        _, session_start, _ = self._tbx_summary.hparams(plain, {})
        self._emit(0, list(session_start.value))

    def flush(self) -> None:
        """Writes buffered events to disk and fsyncs the event file."""
        if not self._closed:
            self._pending = False
            self._events.flush()

    def close(self) -> None:
        """Stops the flush timer, flushes and closes the event file; idempotent."""
        if self._closed:
            return
        self._stop.set()
        self._flusher.join()
        try:
            self._events.close()
        finally:
            self._closed = True

    def _emit(self, step: int, values: list[Any]) -> None:
        event_pb2, summary_pb2 = self._pb[0], self._pb[1]
        event = event_pb2.Event(
            step=step, wall_time=time.time(), summary=summary_pb2.Summary(value=values)
        )
        self._events.write_event(event)
        self._pending = True

    def _flush_periodically(self, flush_secs: float) -> None:
        while not self._stop.wait(flush_secs):
            if self._pending:
                self._pending = False
                self._events.flush()

    def _image_value(self, key: str, images: np.ndarray) -> Any:
        _, summary_pb2, tensor_pb2, shape_pb2 = self._pb
        n, h, w, _ = images.shape
        # The images plugin's tensor layout: [width, height, png_1, ..., png_n].
        tensor = tensor_pb2.TensorProto(
            dtype=7,
            tensor_shape=shape_pb2.TensorShapeProto(
                dim=[shape_pb2.TensorShapeProto.Dim(size=n + 2)]
            ),
            string_val=[str(w).encode(), str(h).encode()] + [_encode.png(img) for img in images],
        )
        plugin = summary_pb2.SummaryMetadata.PluginData(plugin_name="images")
        return summary_pb2.Summary.Value(
            tag=key, tensor=tensor, metadata=summary_pb2.SummaryMetadata(plugin_data=plugin)
        )

    def _metadata(self, metadata: Any) -> Any:
        if metadata is None:
            return None
        cls = self._pb[1].SummaryMetadata
        raw = (
            metadata
            if isinstance(metadata, bytes)
            else getattr(metadata, "SerializeToString", None)
        )
        if raw is None:
            raise TypeError(
                "TensorBoardWriter.write_summaries: metadata must be a SummaryMetadata proto, "
                f"its serialized bytes, or None; got {type(metadata).__name__}."
            )
        return cls.FromString(raw if isinstance(raw, bytes) else raw())

    def _tensor_value(self, key: str, arr: np.ndarray, metadata: Any) -> Any:
        _, summary_pb2, tensor_pb2, shape_pb2 = self._pb
        dims = [shape_pb2.TensorShapeProto.Dim(size=d) for d in arr.shape]
        shape = shape_pb2.TensorShapeProto(dim=dims)
        if arr.dtype.name in _DTYPES:
            tensor = tensor_pb2.TensorProto(
                dtype=_DTYPES[arr.dtype.name],
                tensor_shape=shape,
                tensor_content=np.ascontiguousarray(arr).tobytes(),
            )
        else:
            strings = [
                str(x).encode() if not isinstance(x, bytes) else x for x in arr.reshape(-1).tolist()
            ]
            tensor = tensor_pb2.TensorProto(dtype=7, tensor_shape=shape, string_val=strings)
        value = summary_pb2.Summary.Value(tag=key, tensor=tensor)
        if metadata is not None:
            value.metadata.CopyFrom(metadata)
        return value


def _video_problem(key: str, arr: np.ndarray) -> str | None:
    if arr.ndim != 5 or arr.shape[-1] not in (1, 3, 4):
        return (
            f"video {key!r} must have shape [N, T, H, W, C] with C in (1, 3, 4), got {arr.shape}."
        )
    return None


def _audio_problem(key: str, arr: np.ndarray) -> str | None:
    if arr.ndim != 3 or not np.issubdtype(arr.dtype, np.number):
        return f"audio {key!r} must be a numeric array of shape [N, T, C], got {arr.dtype} {arr.shape}."
    return None


def _hparam(value: Any) -> bool | float | str:
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float | np.number):
        return float(_checks.to_number("hparam", value))
    return str(value)
