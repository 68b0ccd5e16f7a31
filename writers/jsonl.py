"""`JsonlWriter`: one JSON object per write call, one line each, for `jq` and pandas.

Each call appends `{"step": 10, "time": 1700000000.5, "collection": "train", "loss": 0.25}`
(`time` in Unix seconds, `collection` null when unset). A local file is appended to and
line-buffered (`tail -f` sees each line; `flush()` fsyncs); a pipe or device just gets the
lines, and `/dev/stdout` (`/dev/stderr`, `/dev/fd/N`) is the program's own stream, shared with
its prints (never locked, rewritten or cut, even when redirected to a file). A URL
(`gs://b/run/m.jsonl`, any fsspec protocol) is written as numbered parts under `<path>.d/`, one
per flush, and so is a local path with such parts (a URL log copied down: continued as on
the URL); `writers.read_jsonl(path)` reads either back (at a URL, an object at `path` itself,
such as a local log copied there, before the parts). Every line is strict JSON:

* NaN and infinities are the strings `"NaN"`, `"Infinity"`, `"-Infinity"` (`float(x)`
  turns them back); ints stay ints; texts are strings (so a text that is exactly "NaN" or
  "Infinity" reads back as a number to a reader that converts those strings).
* Arrays are summarized: images, videos, audio as `{"type", "shape"}` (audio adds
  `sample_rate`); histograms as `{"type": "histogram", "count", "min", "max", "mean",
  "edges", "counts"}`; raw tensors as `{"type": "tensor", "shape", "dtype", "values"}`,
  `values` only up to `max_array_size` elements (bytes decoded as UTF-8, as strings).
* Hyperparameters are one line with `"step": null` and `"hparams": {...}` (nested mappings
  as dotted names, `"opt.lr"`; values other than bool, number and str as their `str()`; a
  float32 0.1 as 0.1, the shortest decimal of its dtype, not 0.10000000149011612).
  An empty write, of hyperparameters or anything else, writes no line.
* `resume_step=S` first rewrites the log atomically to keep only lines with a step <= S
  (and lines without one). Without it the log is appended to, and a step below one already
  logged is warned about once.
* `step`, `time` and `collection` are reserved keys: a value with one of them raises
  (a hyperparameter may have one: it goes under `hparams`).

Example:
  >>> import json, os, tempfile, writers
  >>> path = os.path.join(tempfile.mkdtemp(), "metrics.jsonl")
  >>> w = writers.JsonlWriter(path, collection="train", clock=lambda: 100.0)
  >>> w.write_scalars(1, {"loss": 0.5, "bad": float("nan")})
  >>> w.close()
  >>> with open(path) as f:
  ...   json.loads(f.readline())
  {'step': 1, 'time': 100.0, 'collection': 'train', 'loss': 0.5, 'bad': 'NaN'}
"""

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from absl import logging

from writers import _checks, _encode, _jsonl_log, _storage
from writers._base import BaseWriter, flush_every

_RESERVED = dict.fromkeys(("step", "time", "collection"), "JsonlWriter")
# allow_nan=False: a non-finite float that slipped through fails loudly instead of writing a
# line that strict JSON readers reject. Built once, not per `json.dumps` call.
_ENCODER = json.JSONEncoder(allow_nan=False)


class JsonlWriter(BaseWriter):
    """Appends one JSON object per write call to a `.jsonl` file (or remote parts).

    Args:
      path: File to append to (a name ending in `.jsonl`, `.ndjson`, `.json` or `.log`, in
        any case, or an existing file such as `/dev/stdout`), or a directory (an existing one whatever
        its name, or any other path, such as a manager's `logdir`), which gets
        `metrics.jsonl`; parent directories are created.
        Either may be a URL any fsspec protocol can write (`gs://`, `s3://`, ...); a local
        log copied down from one (its `.d/` parts there) is continued as parts too.
      collection: The `collection` field of every line (null when None).
      clock: Unix seconds for the `time` field (patch it in tests).
      max_array_size: Largest raw tensor (`write_summaries`) written element by element
        (`math.inf`: every one).
      resume_step: The step a resumed run restarts from (see the module docstring); None appends.
      flush_secs: Logs in parts only: a background timer uploads the buffered lines this often
        (`flush()` uploads at once).
      max_buffer_mb: Logs in parts only: the most lines kept in memory while uploads fail;
        past it the oldest are dropped (logged). None: no bound.

    Raises:
      TypeError: `resume_step` is not an integer, `max_array_size` not a number, `collection`
        not a str, or `clock` not callable.
      ValueError: `resume_step` is negative or given for a pipe, `flush_secs` is not
        positive, or `path` is a URL with one '/' (`gs:/b`, or `Path("gs://b")`: pass `"gs://b"`).
      ImportError: `path` is a URL whose fsspec backend (gcsfs, s3fs) is missing.
    """

    reserved_keys = tuple(_RESERVED)
    """Keys a value may not have: every line's own fields (a manager refuses them at the call)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        collection: str | None = None,
        clock: Callable[[], float] = time.time,
        max_array_size: float = 1024,
        resume_step: int | None = None,
        flush_secs: float = 10.0,
        max_buffer_mb: float | None = 256.0,
    ):
        path = _jsonl_log.log_file(_checks.check_path(path, "JsonlWriter", "path"))
        self._path = _jsonl_log.as_url(path)  # a URL log copied down: continued as parts
        if resume_step is not None:
            resume_step = _checks.check_step(resume_step, "JsonlWriter(resume_step=...)")
        options = dict(collection=collection, clock=clock, max_array_size=max_array_size)
        _checks.check_options("JsonlWriter", **options)
        flush_secs = _checks.check_seconds(flush_secs, "JsonlWriter")
        limit = _checks.buffer_bytes(max_buffer_mb, "JsonlWriter")
        self._collection = collection
        self._clock = clock
        self._max_array_size = max_array_size
        self._log: _jsonl_log.LocalLog | _jsonl_log.RemoteLog
        self._stop_timer: Callable[..., bool] | None = None
        self._upload_at_close = False  # a close() failed to upload: the next one tries again
        # In parts writes only buffer (an upload holds no lock a write takes): a manager whose
        # flush() was abandoned in a dead network's upload goes on calling it (quarantined, it
        # skipped every write of the next `quarantine_s`, also once storage was back).
        self.takes_overlapping_calls = _storage.is_remote(self._path)
        if _storage.is_remote(self._path):
            self._log = _jsonl_log.RemoteLog(self._path, resume_step, limit)
            self._stop_timer = flush_every(self, flush_secs, f"JsonlWriter({self._path})")
        else:
            self._log = _jsonl_log.LocalLog(self._path, resume_step)
        # The highest step in the log so far: a lower one warns.
        self._max_step = -1 if self._log.last_step is None else self._log.last_step
        self._warned_backwards = False
        # A resumed run's steps up to resume_step (a config at step 0) are no sign of a resume
        # without it: not warned about.
        self._resumed = -1 if resume_step is None else resume_step

    @property
    def path(self) -> str:
        """The file (or URL) this writer appends to."""
        return self._path

    def _summaries(self, step: int, values: Mapping[str, Any], metadata: Any) -> None:
        self._write_line(step, {k: self._tensor(np.asarray(v)) for k, v in values.items()})

    def _scalars(self, step: int, numbers: dict[str, int | float]) -> None:
        try:
            finite = all(map(math.isfinite, numbers.values()))
        except OverflowError:  # an int too big for a float: the slow path writes it as it is
            finite = False
        if not finite:
            numbers = {k: _json_number(v) for k, v in numbers.items()}  # type: ignore[misc]
        self._write_line(step, numbers)

    def _media(
        self, step: int, kind: str, arrays: dict[str, np.ndarray], sample_rate: int | None = None
    ) -> None:
        extra = {} if sample_rate is None else {"sample_rate": int(sample_rate)}
        shapes = {k: {"type": kind, "shape": list(v.shape), **extra} for k, v in arrays.items()}
        self._write_line(step, shapes)

    def _texts(self, step: int, texts: dict[str, str]) -> None:
        self._write_line(step, texts)

    def _histograms(self, step: int, arrays: dict[str, np.ndarray], buckets: dict) -> None:
        hists = {k: _encode.histogram(v, buckets.get(k)) for k, v in arrays.items()}
        self._write_line(step, {k: {"type": "histogram", **h} for k, h in hists.items()})

    def _hparams(self, hparams: Mapping[str, Any]) -> None:
        if hparams:  # an empty call writes no line, as every empty write
            encoded = {k: _json_number(_encode.hparam(v)) for k, v in hparams.items()}
            self._write_line(None, {"hparams": encoded})

    def _flush(self) -> None:
        self._log.flush()  # an fsync locally, an upload remotely

    def close(self) -> None:
        """Flushes and closes the log; idempotent once it went through. At a URL, an upload
        that fails keeps its lines and a later `close()` uploads them (a second call returned
        at once, as if they had gone up, and they were lost)."""
        if self._closed and not self._upload_at_close:
            return
        if not self._closed:
            self._closed = True
            if self._stop_timer is not None:  # a URL's: not waited for yet (TensorBoardWriter)
                self._stop_timer(timeout=0)
        self._upload_at_close = isinstance(self._log, _jsonl_log.RemoteLog)
        try:
            self._log.close()
        finally:
            if self._stop_timer is not None:
                self._stop_timer()
        self._upload_at_close = False

    def _begin(self, method: str, step: Any, values: Mapping[str, Any]) -> int:
        checked = super()._begin(method, step, values)
        if problem := _checks.reserved_problem(values, _RESERVED):
            raise ValueError(f"JsonlWriter.{method}: {problem}")
        return checked

    def _write_line(self, step: int | None, values: Mapping[str, Any]) -> None:
        if not values:  # an empty write: no line of fields alone
            return
        record = {
            "step": step,
            "time": float(self._clock()),
            "collection": self._collection,
            **values,
        }
        self._log.write(_ENCODER.encode(record) + "\n")
        if step is not None:
            if step < self._max_step and not self._warned_backwards and step > self._resumed:
                self._warned_backwards = True
                fix = (
                    "If this run resumed from a checkpoint, the log holds those steps twice: "
                    "pass resume_step=<the restored step> (MetricsManager(..., resume_step=...)) "
                    "to drop the stale lines."
                )
                if self._resumed >= 0:  # passed already: it dropped the run before's lines
                    fix = (
                        f"resume_step={self._resumed} dropped only the lines the run before "
                        f"wrote after step {self._resumed}, not this run's own. If the run "
                        "restored an earlier checkpoint again, make a new writer with that "
                        "checkpoint's step as resume_step; otherwise check the steps passed."
                    )
                logging.warning(
                    "JsonlWriter(%s): step %d comes after step %d: the log's steps go "
                    "backwards. %s Warned once.",
                    self._path,
                    step,
                    self._max_step,
                    fix,
                )
            self._max_step = max(self._max_step, step)

    def _tensor(self, arr: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "tensor", "shape": list(arr.shape), "dtype": str(arr.dtype)}
        if arr.size <= self._max_array_size:
            out["values"] = _json_array(arr)
        return out


def _json_number(value: int | float | str) -> int | float | str:
    if not isinstance(value, float) or math.isfinite(value):  # ints, bools and strs as they are
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _json_array(arr: np.ndarray) -> Any:
    arr = _checks._widened(arr)  # bfloat16, float8: exact in float32
    if arr.dtype.kind == "f":  # as float64: tolist() keeps a longdouble, which json refuses
        arr = arr.astype(np.float64)
        if not np.all(np.isfinite(arr)):
            return np.vectorize(_json_number, otypes=[object])(arr).tolist()
    if arr.dtype.kind in "biuf":  # not complex or timedelta64, which JSON has no number for
        return arr.tolist()
    return np.vectorize(_json_str, otypes=[object])(arr).tolist()


def _json_str(item: Any) -> str:
    """One element of a string or object tensor as text: bytes decoded as UTF-8 (as TensorBoard
    shows a string tensor), not their repr "b'x'"; undecodable bytes and lone surrogates as
    backslash escapes (`b"\\xff"` as "\\xff"), as `write_texts` escapes lone surrogates."""
    if isinstance(item, bytes):
        return item.decode("utf-8", errors="backslashreplace")
    return _checks.plain_str(str(item))
