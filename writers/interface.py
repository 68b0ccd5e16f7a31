"""The `MetricWriter` contract (CLU's writer interface, without TensorFlow) and `NoopWriter`.

Every backend (console, TensorBoard, JSONL, absl log, trackers) and every wrapper
(`MultiWriter`, `AsyncWriter`) implements `MetricWriter` with CLU's method and parameter names
(`clu.metric_writers.MetricWriter` of clu 0.0.12: the `write_pointcloud` of later releases is
not provided, and calling it raises `AttributeError`); wrappers forward by keyword, so a writer
written against CLU's interface plugs in unchanged. The contract, for every writer here:

* Steps are non-negative integers (Python or numpy ints, or one-element integer arrays):
  negative steps raise `ValueError`, floats, bools and strings `TypeError`.
* Keys are non-empty strings; `/` groups them (`eval/accuracy`). A non-str key raises
  `TypeError`, an empty one `ValueError`.
* Scalars are numbers or one-element arrays. NaN and +-Inf are valid; each backend documents
  how it shows them. Images are `[H, W, C]` or `[N, H, W, C]`, C in (1, 3, 4), integers in
  [0, 255] or floats in [0, 1] (made pixels as CLU's `tf.summary.image` makes them:
  `x * 255.5` truncated, so 0.5 is 127); videos `[T, H, W, C]` or `[N, T, H, W, C]` alike; audio
  `[N, T, C]` floats in [-1, 1] (integer PCM is refused, as is a clip of more channels than
  samples: `[N, C, T]`) with an integer `sample_rate`; none of them empty, and none holding NaN or +-Inf (refused
  as in a histogram). Values outside their range are clipped, and the writers that encode
  them warn once per key.
  Histogram inputs are any finite numeric array that is not empty (bools count as 0 and 1,
  as in `np.histogram`), with `num_buckets` per key: an int >= 1 (a missing key or None:
  30); a key naming no array of the call raises `ValueError` (CLU's writers ignore it, so a
  misspelt key's histogram got 30 buckets). JAX's bfloat16, float8 and int4 values are
  written as float32 and int8 (exactly).
* Texts and hyperparameters are plain strs: a `StrEnum` member is its value, a lone
  surrogate (a non-UTF-8 file name from `os.fsdecode`) a backslash escape.
* Bad input raises `TypeError` or `ValueError` naming every bad key, what was expected and
  what came, before anything of that call is written. (`NoopWriter` checks nothing.) A
  wrapper checks arrays by shape and dtype, without waiting for a device array; what needs
  their values (NaN in a histogram, image or clip) each wrapped writer checks, and
  `MultiWriter` raises it as a `WriterError`, `AsyncWriter` on the next call.
* A key written twice at one step is recorded twice; writers never merge or deduplicate
  (but a W&B row keeps one value per key: `WandbWriter` keeps the last and warns).
* Call a backend from one thread at a time; `AsyncWriter` may be called from any thread.
  A writer whose calls may overlap (its writes only buffer, as `MlflowWriter`'s, and
  `TensorBoardWriter`'s and `JsonlWriter`'s at a URL) says so
  with `takes_overlapping_calls = True`: a `MetricsManager` then goes on calling it while a
  call it abandoned past `writer_deadline_s` is still inside it, instead of quarantining it
  (nor does a signal's flush set it aside as slow).
* `close()` is idempotent and leaves everything written on disk; `flush()` after it does
  nothing, a write (or a `with` block entered) after it raises `WriterClosedError`. Writers that buffer
  (`TensorBoardWriter`, `AsyncWriter`) are closed at interpreter exit if the program forgot.

Example:
  >>> import writers
  >>> class PrintWriter(writers.NoopWriter):
  ...   def write_scalars(self, step, scalars):
  ...     print(step, dict(scalars))
  >>> writers.write_values(PrintWriter(), 3, {"loss": 0.5})
  3 {'loss': 0.5}
"""

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

Array = Any  # numpy or JAX array (or anything with __array__).
Scalar = int | float | np.number | np.ndarray


class WriterClosedError(RuntimeError):
    """Raised by a write to a writer whose `close()` has already been called."""


class WriterError(RuntimeError):
    """Wrapped writers failed; the message names each failure.

    `failures`: `(name, exception)` pairs, one per writer (`MultiWriter`) or per call
    (`AsyncWriter`); the first is also the `__cause__`.
    """

    def __init__(
        self, context: str, failures: Sequence[tuple[str, BaseException]], *, what: str = "writer"
    ):
        self.failures: list[tuple[str, BaseException]] = list(failures)
        details = "; ".join(f"{name}: {type(err).__name__}: {err}" for name, err in self.failures)
        count = len(self.failures)
        super().__init__(f"{context}: {count} {what}{'' if count == 1 else 's'} failed: {details}")


class MetricWriter(abc.ABC):
    """Writes metric values of every kind at integer steps (CLU's interface).

    Every `write_*` method takes the `step` the values were produced at and a mapping from
    key to value of its kind (see the module docstring for shapes and the shared contract).
    """

    @abc.abstractmethod
    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Writes raw tensors; `metadata` is the backend's (TensorBoard: a `SummaryMetadata`
        for all keys, or a mapping of key to one, as CLU's writer takes it)."""

    @abc.abstractmethod
    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        """Writes numbers (or one-element arrays)."""

    @abc.abstractmethod
    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        """Writes images `[H, W, C]` or `[N, H, W, C]`."""

    @abc.abstractmethod
    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        """Writes videos `[T, H, W, C]` (one) or `[N, T, H, W, C]`."""

    @abc.abstractmethod
    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        """Writes audio clips `[N, T, C]` in [-1, 1], `sample_rate` samples per second."""

    @abc.abstractmethod
    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Writes texts (markdown where the backend renders it)."""

    @abc.abstractmethod
    def write_histograms(
        self, step: int, arrays: Mapping[str, Array], num_buckets: Mapping[str, int] | None = None
    ) -> None:
        """Writes a histogram of each array, `num_buckets[key]` buckets (default 30)."""

    @abc.abstractmethod
    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Writes the run's hyperparameters (no step): bools, numbers, strs, else `str()`.

        Nested mappings (a config dict) are flattened to dotted names: `opt.lr`. An
        ml_collections `ConfigDict` and a dataclass instance, which are no `Mapping`, are
        taken (and flattened) too.
        """

    @abc.abstractmethod
    def flush(self) -> None:
        """Makes everything written so far durable (on disk, on screen)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flushes and releases resources. Idempotent; later writes raise."""

    def __enter__(self) -> "MetricWriter":
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        close_keeping_error(self.close, exc, type(self).__name__)


def close_keeping_error(close: Callable[[], None], exc: BaseException | None, what: str) -> None:
    """A `with` block's exit: calls `close`; after the block raised, a failing close is a note
    on the block's own error, which stays the one raised (an AsyncWriter's close replaced it
    with the WriterError of an earlier write, which the loop's `except KeyError` missed)."""
    try:
        close()
    except Exception as close_err:
        if exc is None:
            raise
        exc.add_note(f"While closing {what}: {close_err}")


def close_failed(writer: Any, err: BaseException) -> None:
    """Closes `writer`, of a set that failed to build, as its `with` block would on `err`:
    a tracker's run ends failed (MLflow FAILED, W&B exit code 1). `close()` had ended it
    FINISHED: a second launch on a logdir in use (its JSONL log locked) left an empty run
    that read as complete next to the live one. Anything without `close()` is left as is."""
    exit_ = getattr(writer, "__exit__", None)  # any writer will do: CLU's have no `with`
    if exit_ is not None:
        exit_(type(err), err, err.__traceback__)
    elif callable(close := getattr(writer, "close", None)):
        close()


class NoopWriter(MetricWriter):
    """A writer that discards everything; every method returns immediately.

    For non-zero processes of a multi-host job, tests, and as a base class: it checks nothing, so
    a subclass overriding a few methods acts like a CLU writer with empty methods for the rest.

    Example:
      >>> import writers
      >>> w = writers.NoopWriter()
      >>> w.write_scalars(0, {"loss": 1.0})
      >>> w.close()
    """

    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None: ...
    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None: ...
    def write_images(self, step: int, images: Mapping[str, Array]) -> None: ...
    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None: ...
    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None: ...
    def write_texts(self, step: int, texts: Mapping[str, str]) -> None: ...
    def write_histograms(
        self, step: int, arrays: Mapping[str, Array], num_buckets: Mapping[str, int] | None = None
    ) -> None: ...
    def write_hparams(self, hparams: Mapping[str, Any]) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
