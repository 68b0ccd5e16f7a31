"""`TensorBoardWriter`: TensorBoard event files, all values of one call in one event.

Unlike tensorboardX's `add_scalar` (one event per value, through a process queue), events go
synchronously to a file of the writer's own (at a URL logdir, one new object per flush; extras
`[gcs]`, `[s3]`): over 100x faster at 50 scalars per call (benchmarks/writer_throughput.py),
and `flush()` means "on disk". Wrap the writer in `AsyncWriter` to take the work off the loop.

Where values land (as TensorBoard's `EventAccumulator` reads them): scalars as `simple_value`
(a float32, as in TensorFlow's writer: integers past 2**24, such as token counts, are rounded
there and kept exact in JSONL; a finite float past float32's range, 1e39, is stored as inf, and
one below its least subnormal, 1e-46, as 0, with no warning, as TensorFlow's writer stores them;
NaN and infinities kept); texts in the text plugin under the key itself (CLU's tag);
images in the images plugin as PNGs; videos as one filmstrip image `[H, T*W, C]` each;
audio as 16-bit WAV clips (`<key>/<i>` when N > 1); histograms as `HistogramProto`
(30 buckets by default); hparams as the HParams plugin's session start at step 0; raw
tensors (`write_summaries`) as tensor protos with the given `SummaryMetadata`. TensorBoard
shows a tag as the kind of its first value, so a value of another kind written later under
that key is in the event file but on no dashboard: warned once per tag and kind (and a
raw tensor without a plugin joins the series of the kind that claims its key, earlier or
later: warned once per tag).

Example:
  >>> import tempfile, writers
  >>> w = writers.TensorBoardWriter(tempfile.mkdtemp())
  >>> w.write_scalars(1, {"loss": 0.5, "accuracy": 0.75})  # one event, two values
  >>> w.close()
"""

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from absl import logging

from writers import _checks, _encode, _storage
from writers._base import BaseWriter, flush_every


class TensorBoardWriter(BaseWriter):
    """Writes TensorBoard event files; all values of one call become one event.

    Args:
      logdir: Directory for the event file (created if missing), or an fsspec URL; `""` is
        the working directory, as for `JsonlWriter` and CLU's writer.
      purge_step: Hide earlier runs' events at or after this step (resumed from step S: S + 1).
      flush_secs: A background timer flushes pending events this often.
      max_buffer_mb: URL logdir only: the most events kept in memory while uploads fail;
        past it the oldest are dropped (logged), never the first events, which hold
        `purge_step`. None: no bound.
      filename_suffix: Appended to the event file name.

    Raises:
      ValueError: `flush_secs` is not positive, `purge_step` is negative,
        `filename_suffix` holds a '/', or `logdir` is a URL whose '//' was made '/'.
      TypeError: `purge_step` is not an integer or `filename_suffix` not a str.
    """

    encodes_media = True

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        *,
        purge_step: int | None = None,
        flush_secs: float = 10.0,
        filename_suffix: str = "",
        max_buffer_mb: float | None = 256.0,
    ):
        from writers import _records, _tb_summary  # here: `import writers` loads no tensorboardX

        _checks.check_options("TensorBoardWriter", filename_suffix=filename_suffix)
        flush_secs = _checks.check_seconds(flush_secs, "TensorBoardWriter")
        if purge_step is not None:
            purge_step = _checks.check_step(purge_step, "TensorBoardWriter(purge_step=...)")
        self._tb = _tb_summary
        # "" is the working directory, as `JsonlWriter` and CLU's `epath.Path("")` take it: it
        # raised a bare FileNotFoundError naming '' (after create_default_writer("") had
        # made its metrics.jsonl there).
        self._logdir = _checks.check_path(logdir, "TensorBoardWriter", "logdir") or os.curdir
        limit = _checks.buffer_bytes(max_buffer_mb, "TensorBoardWriter")
        self._file = _records.EventFile(self._logdir, filename_suffix, limit)
        for data in _tb_summary.first_events(purge_step):
            self._file.write(data, keep=True)
        self._hparams_shown: dict[str, str] | None = None  # the first write_hparams', as repr
        self._kinds: dict[str, str] = {}  # tag -> the kind of its first value
        self._hidden: set[tuple[str, str]] = set()  # (tag, kind) warned about
        self._raw: set[str] = set()  # tags of plugin-less tensors written before any claim
        self._hparams_warned = False
        self._upload_at_close = False  # a close() failed to upload: the next one tries again
        # At a URL writes only buffer: why calls may then overlap, see JsonlWriter's.
        self.takes_overlapping_calls = _storage.is_remote(self._logdir)
        self._stop_timer = flush_every(self, flush_secs, f"TensorBoardWriter({self._logdir})")

    @property
    def logdir(self) -> str:
        """Directory holding the event file."""
        return self._logdir

    @property
    def path(self) -> str:
        """The event file this writer appends to (for a URL logdir: its first part)."""
        return self._file.path

    def _summaries(self, step: int, values: Mapping[str, Any], metadata: Any) -> None:
        if isinstance(metadata, Mapping):  # per key, as CLU's writer takes it
            metas = {k: self._tb.metadata(metadata.get(k)) for k in values}
        else:
            metas = dict.fromkeys(values, self._tb.metadata(metadata))
        kinds: dict[str, list[str]] = {}
        for key, meta in metas.items():
            plugin = meta.plugin_data.plugin_name if meta is not None else ""
            kind = {"text": "texts", "": "tensors"}.get(plugin, plugin)
            # Without a plugin a tensor claims no tag, but joins the series of one claimed.
            if plugin or key in self._kinds:
                kinds.setdefault(kind, []).append(key)
            else:
                self._raw.add(key)
        for kind, tags in kinds.items():
            self._check_kinds("write_summaries", kind, tags)
        self._emit(step, [self._tb.tensor(k, np.asarray(v), metas[k]) for k, v in values.items()])

    def _scalars(self, step: int, numbers: dict[str, int | float]) -> None:
        self._check_kinds("write_scalars", "scalars", numbers)
        self._file.write(self._tb.scalar_event(step, numbers))

    def _images(self, step: int, images: dict[str, np.ndarray]) -> None:
        self._check_kinds("write_images", "images", images)
        pictures = [self._tb.images(k, _checks.images_as_uint8(v)) for k, v in images.items()]
        self._emit(step, pictures)

    def _videos(self, step: int, videos: dict[str, np.ndarray]) -> None:
        self._check_kinds("write_videos", "images", videos)  # filmstrips
        self._emit(step, [self._tb.images(k, _encode.filmstrip(v)) for k, v in videos.items()])

    def _audios(self, step: int, clips: dict[str, np.ndarray], sample_rate: int) -> None:
        self._check_kinds("write_audios", "audio", _checks.audio_tags(clips))
        self._emit(step, [v for k, c in clips.items() for v in self._tb.audios(k, c, sample_rate)])

    def _texts(self, step: int, texts: dict[str, str]) -> None:
        self._check_kinds("write_texts", "texts", texts)
        self._emit(step, [self._tb.text(k, v) for k, v in texts.items()])

    def _histograms(self, step: int, arrays: dict[str, np.ndarray], buckets: dict) -> None:
        self._check_kinds("write_histograms", "histograms", arrays)
        self._emit(step, [self._tb.histogram(k, v, buckets.get(k)) for k, v in arrays.items()])

    def _hparams(self, hparams: Mapping[str, Any]) -> None:
        # TensorBoard's HParams tab shows a run's first session alone: a later call's keys
        # are warned about, and an empty one, which would hide every later one, is not written.
        if not hparams:
            return
        # As written (0.1 and np.float64(0.1) alike); repr so that a NaN equals itself.
        shown = {key: repr(self._tb.hparam(value)) for key, value in hparams.items()}
        if self._hparams_shown is None:
            self._hparams_shown = shown  # so nothing is hidden below
        hidden = sorted(k for k, v in shown.items() if self._hparams_shown.get(k) != v)
        if hidden and not self._hparams_warned:
            self._hparams_warned = True
            logging.warning(
                "TensorBoardWriter(%s): TensorBoard's HParams tab shows the first write_hparams "
                "of a run alone; %s of a later one are not shown there (the other writers have "
                "them). Write every hyperparameter in one call. Warned once.",
                self._logdir,
                hidden,
            )
        self._emit(0, self._tb.hparams(hparams))

    def _flush(self) -> None:
        self._file.flush()  # an fsync locally, a new part remotely

    def close(self) -> None:
        """Stops the flush timer, flushes and closes the event file; idempotent once it went
        through. At a URL, an upload that fails keeps its events and a later `close()`
        uploads them (a second call returned at once, and they were lost)."""
        if self._closed and not self._upload_at_close:
            return
        remote = _storage.is_remote(self._logdir)
        if not self._closed:
            self._closed = True
            # At a URL the timer is stopped but not waited for: the close's upload waits for a
            # timed one under way and fails with it (waited for first, then tried again, a
            # close in an outage took two client retry budgets, 67 s on gcsfs).
            self._stop_timer(timeout=0 if remote else None)
        self._upload_at_close = remote
        try:
            self._file.close()
        finally:
            self._stop_timer()
        self._upload_at_close = False

    def _check_kinds(self, method: str, kind: str, tags: Iterable[str]) -> None:
        # TensorBoard files a tag under the plugin of its first value: no dashboard shows a
        # later value of another kind (a text after a scalar of that key was hidden silently).
        kinds, hidden, joined = self._kinds, {}, []
        for tag in tags:
            if tag not in kinds and tag in self._raw:  # claimed now, over earlier raw tensors
                joined.append(tag)
            if (first := kinds.setdefault(tag, kind)) != kind and (tag, kind) not in self._hidden:
                self._hidden.add((tag, kind))
                hidden[tag] = first
        if hidden:
            logging.warning(
                "TensorBoardWriter(%s).%s: tags %s were first written as %s; TensorBoard shows "
                "a tag as the kind first written to it, so these %s are in the event file but "
                "on no dashboard (the other writers have them). Give each kind its own key, "
                "e.g. 'sample/text'. Warned once per tag and kind.",
                self._logdir,
                method,
                sorted(hidden),
                sorted(set(hidden.values())),
                kind,
            )
        if joined:
            logging.warning(
                "TensorBoardWriter(%s).%s: tags %s already hold tensors of write_summaries "
                "without a plugin, which TensorBoard now reads as %s: a dashboard shows them "
                "wrong or not at all (the other writers have them). Give each kind its own "
                "key, e.g. 'sample/raw'. Warned once per tag.",
                self._logdir,
                method,
                sorted(joined),
                kind,
            )

    def _emit(self, step: int, values: list[Any]) -> None:
        self._file.write(self._tb.event(step, values))
