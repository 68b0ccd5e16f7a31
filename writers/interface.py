"""The `MetricWriter` contract: CLU's writer interface, without TensorFlow.

Every backend in this package (console, TensorBoard, JSONL, absl log) and every
wrapper (`MultiWriter`, `AsyncWriter`) implements `MetricWriter`. The method and
parameter names are CLU's (`clu.metric_writers.MetricWriter`), and the wrappers
forward by keyword, so a writer written against CLU's interface plugs in
unchanged, with or without our base class.

Contract, for every writer here:

* **Steps** are non-negative integers (Python or numpy ints, or integer arrays of
  one element). Negative steps raise `ValueError`, non-integers (floats, bools,
  strings) raise `TypeError`.
* **Keys** are non-empty strings; `/` groups them (`eval/accuracy`). Any other key
  raises before anything of that call is written (`TypeError` for non-strings,
  `ValueError` for empty names). All bad keys of one call are listed in one error.
* **Scalars** are Python or numpy numbers, or arrays (numpy, JAX) holding exactly
  one element. NaN and +-Inf are valid values: each backend documents how it shows
  them (TensorBoard stores them as they are, JSONL as the strings "NaN",
  "Infinity", "-Infinity", the console as `NaN`, `inf`, `-inf`, the absl log as
  CLU does: `nan`, `inf`, `-inf`).
* **Images** are `[H, W, C]` or `[N, H, W, C]`, C in (1, 3, 4); uint8 in [0, 255]
  or floats in [0, 1]. Videos are `[N, T, H, W, C]`. Audios are `[N, T, C]` floats
  in [-1, 1] with an integer `sample_rate`. Histogram inputs are any finite
  numeric array; `num_buckets` is a per-key mapping (missing keys: 30 buckets).
* **Bad input** (wrong types, shapes, NaN in a histogram, a non-positive
  sample rate...) raises `TypeError` or `ValueError` naming every bad key, what
  was expected and what came, before anything of that call is written; what
  earlier calls wrote is kept. (`NoopWriter` checks nothing.)
* **Repeated key at one step**: every call is recorded as given; writing the same
  key twice at one step records two points (TensorBoard shows both, JSONL has two
  lines). Writers never merge or deduplicate.
* **Threads**: call a backend from one thread at a time. `AsyncWriter` may be
  called from any thread; it serializes calls onto its worker in call order.
* **After `close()`**: `close()` is idempotent; `flush()` after close does
  nothing; any write after close raises `WriterClosedError` (a `RuntimeError`).
  Everything written before `close()` is on disk when it returns. Writers that
  buffer (`TensorBoardWriter`, `AsyncWriter`) are closed at interpreter exit if
  the program forgot to.

Example:
  >>> import writers
  >>> class PrintWriter(writers.NoopWriter):
  ...   def write_scalars(self, step, scalars):
  ...     print(step, dict(scalars))
  >>> writers.write_values(PrintWriter(), 3, {"loss": 0.5})
  3 {'loss': 0.5}
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

Array = Any  # numpy or JAX array (or anything with __array__).
Scalar = int | float | np.number | np.ndarray


class WriterClosedError(RuntimeError):
    """Raised by a write to a writer whose `close()` has already been called."""


class WriterError(RuntimeError):
    """One or more wrapped writers failed; the message names every failing writer.

    Raised by `MultiWriter` (one entry per failing writer) and `AsyncWriter` (one
    entry per failed call, named `<writer>.<method>(step=...)`). The original
    exceptions are kept in `failures` (a list of `(name, exception)`); the first one
    is also the `__cause__`, so tracebacks show where it came from.
    """

    def __init__(
        self,
        context: str,
        failures: Sequence[tuple[str, BaseException]],
        *,
        what: str = "writer",
    ):
        self.failures: list[tuple[str, BaseException]] = list(failures)
        details = "; ".join(f"{name}: {type(err).__name__}: {err}" for name, err in self.failures)
        count = len(self.failures)
        super().__init__(f"{context}: {count} {what}{'' if count == 1 else 's'} failed: {details}")


class MetricWriter(abc.ABC):
    """Writes metric values of every kind at integer steps (CLU's interface).

    Subclasses implement every method; see the module docstring for the contract
    all writers share (steps, keys, shapes, repeated keys, threads, close).
    """

    @abc.abstractmethod
    def write_summaries(
        self,
        step: int,
        values: Mapping[str, Array],
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Writes raw tensors with optional backend-specific metadata.

        Args:
          step: Step at which the values were produced.
          values: Mapping from name to array.
          metadata: Backend-specific metadata shared by every value of the call
            (for TensorBoard a `SummaryMetadata` proto or its serialized bytes).
        """

    @abc.abstractmethod
    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        """Writes scalar values.

        Args:
          step: Step at which the values were produced.
          scalars: Mapping from name to a number or a one-element array.
        """

    @abc.abstractmethod
    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        """Writes images of shape `[H, W, C]` or `[N, H, W, C]`, C in (1, 3, 4).

        Args:
          step: Step at which the images were produced.
          images: Mapping from name to image array (uint8 in [0, 255] or floats in [0, 1]).
        """

    @abc.abstractmethod
    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        """Writes videos of shape `[N, T, H, W, C]`.

        Args:
          step: Step at which the videos were produced.
          videos: Mapping from name to video array.
        """

    @abc.abstractmethod
    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        """Writes audio clips of shape `[N, T, C]` with values in [-1, 1].

        Args:
          step: Step at which the clips were produced.
          audios: Mapping from name to audio array.
          sample_rate: Samples per second, shared by every clip of the call.
        """

    @abc.abstractmethod
    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Writes text values (markdown where the backend renders it).

        Args:
          step: Step at which the texts were produced.
          texts: Mapping from name to str.
        """

    @abc.abstractmethod
    def write_histograms(
        self,
        step: int,
        arrays: Mapping[str, Array],
        num_buckets: Mapping[str, int] | None = None,
    ) -> None:
        """Writes histograms of the values of each array.

        Args:
          step: Step at which the arrays were produced.
          arrays: Mapping from name to a numeric array of any shape.
          num_buckets: Optional mapping from name to number of buckets (default 30).
        """

    @abc.abstractmethod
    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Writes the hyperparameters of the run (no step).

        Args:
          hparams: Mapping from name to a bool, number or string; other values are
            written as their `str()`.
        """

    @abc.abstractmethod
    def flush(self) -> None:
        """Makes everything written so far durable (on disk, on screen)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flushes and releases resources. Idempotent; later writes raise."""

    def __enter__(self) -> MetricWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
