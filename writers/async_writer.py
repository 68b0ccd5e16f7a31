"""`AsyncWriter`: runs a writer's calls on one ordered background thread.

Each `AsyncWriter` owns one `writers._worker.OrderedWorker` (the worker `MetricsManager`
uses too): one thread and one bounded queue. Use it for a writer used on its own; under a
`MetricsManager` writers are called from the manager's worker already, so wrap nothing. Every write is
checked (step and keys) on the caller's thread, then queued and run by the worker
in call order, so the training loop does not wait on disks or terminals.

* **Back-pressure**: the queue holds at most `max_queue` calls. When it is full the
  caller blocks until the worker has caught up. Nothing is ever dropped; a writer
  slower than the training loop slows the loop instead of filling memory.
* **Errors**: an exception raised by the wrapped writer in the worker is kept and
  raised on the caller's next call (after that call's own work has been queued),
  on `flush()` and on `close()`, as a `WriterError` naming this writer, the method
  and the step. The worker goes on with later calls, so one failed write loses
  only that write.
* **flush()** waits until every queued call has run, then flushes the writer.
  **close()** runs everything queued, closes the writer, joins the thread and is
  idempotent; later writes raise `WriterClosedError`. A writer that was never
  closed is closed at interpreter exit, so queued values still reach it.
* Arrays are not copied: do not change a numpy array in place after passing it,
  until `flush()` returns. (The mapping itself is copied.)

Example:
  >>> import writers
  >>> w = writers.AsyncWriter(writers.LoggingWriter(), name="log")
  >>> w.write_scalars(1, {"loss": 0.5})  # returns at once; logged by the worker
  >>> w.close()  # waits for the write
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from writers import _checks, _exit
from writers._worker import OrderedWorker
from writers.interface import Array, MetricWriter, Scalar, WriterClosedError, WriterError


class AsyncWriter(MetricWriter):
    """Runs every call of `writer` on a background thread, in order.

    Args:
      writer: Any writer with CLU's method names (calls are forwarded by keyword).
      name: Name used in error messages (default: the writer's class name).
      max_queue: Most calls waiting at once; a full queue blocks the caller.

    Raises:
      TypeError: `writer` lacks CLU's writer methods.
      ValueError: `max_queue` is below 1.
    """

    def __init__(self, writer: Any, *, name: str | None = None, max_queue: int = 128):
        self._name = name or type(writer).__name__
        _checks.check_writers({self._name: writer}, "AsyncWriter")
        if max_queue < 1:
            raise ValueError(
                f"AsyncWriter({self._name}): max_queue must be >= 1, got {max_queue}. It "
                "bounds the calls waiting for the worker; 128 suits most loops."
            )
        self._writer = writer
        self._errors: list[tuple[str, BaseException]] = []
        self._errors_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._closed = False
        self._worker = OrderedWorker(f"AsyncWriter({self._name})", max_pending=max_queue)
        self._at_exit = _exit.register(self, f"AsyncWriter({self._name})")

    @property
    def name(self) -> str:
        """The name used in error messages."""
        return self._name

    @property
    def writer(self) -> Any:
        """The wrapped writer."""
        return self._writer

    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Queues the call."""
        step = self._begin("write_summaries", step, values)
        self._submit("write_summaries", step=step, values=dict(values), metadata=metadata)

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        """Queues the call."""
        step = self._begin("write_scalars", step, scalars)
        self._submit("write_scalars", step=step, scalars=dict(scalars))

    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        """Queues the call."""
        step = self._begin("write_images", step, images)
        self._submit("write_images", step=step, images=dict(images))

    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        """Queues the call."""
        step = self._begin("write_videos", step, videos)
        self._submit("write_videos", step=step, videos=dict(videos))

    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        """Queues the call."""
        step = self._begin("write_audios", step, audios)
        self._submit("write_audios", step=step, audios=dict(audios), sample_rate=sample_rate)

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Queues the call."""
        step = self._begin("write_texts", step, texts)
        self._submit("write_texts", step=step, texts=dict(texts))

    def write_histograms(
        self,
        step: int,
        arrays: Mapping[str, Array],
        num_buckets: Mapping[str, int] | None = None,
    ) -> None:
        """Queues the call."""
        step = self._begin("write_histograms", step, arrays)
        buckets = dict(num_buckets) if num_buckets is not None else None
        self._submit("write_histograms", step=step, arrays=dict(arrays), num_buckets=buckets)

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Queues the call."""
        self._check_open("write_hparams")
        _checks.check_keys(hparams, f"AsyncWriter({self._name}).write_hparams")
        self._submit("write_hparams", hparams=dict(hparams))

    def flush(self) -> None:
        """Waits for every queued call, flushes the writer, raises errors seen so far.

        Raises:
          WriterError: naming this writer, for every failed call since the last report.
        """
        if self._closed:
            self._raise_errors("flush")
            return
        self._submit("flush", raise_errors=False)
        self._worker.drain()
        self._raise_errors("flush")

    def close(self) -> None:
        """Runs every queued call, closes the writer and joins the thread; idempotent.

        Raises:
          WriterError: naming this writer, for every failed call not yet reported.
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._submit("close", raise_errors=False)
            self._worker.close()
            _exit.unregister(self._at_exit)
        self._raise_errors("close")

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise WriterClosedError(
                f"AsyncWriter({self._name}).{method}: the writer is closed. Create a new "
                "writer, or close it only after the last write."
            )

    def _begin(self, method: str, step: Any, values: Any) -> int:
        self._check_open(method)
        return _checks.check_call(f"AsyncWriter({self._name}).{method}", step, values)

    def _submit(self, method: str, *, raise_errors: bool = True, **kwargs: Any) -> None:
        def call(_: Any) -> None:
            try:
                getattr(self._writer, method)(**kwargs)
            except Exception as err:  # noqa: BLE001  (kept and re-raised on the caller's thread)
                where = f"{self._name}.{method}" + (
                    f"(step={kwargs['step']})" if "step" in kwargs else "()"
                )
                with self._errors_lock:
                    self._errors.append((where, err))

        self._worker.post([(method, call, None)])  # blocks while the queue is full
        if raise_errors:
            self._raise_errors(method)

    def _raise_errors(self, method: str) -> None:
        with self._errors_lock:
            errors, self._errors = self._errors, []
        if errors:
            raise WriterError(
                f"AsyncWriter({self._name}), reported on {method}()", errors, what="call"
            ) from errors[0][1]
