"""`AsyncWriter`: runs a writer's calls on one ordered background thread.

Each `AsyncWriter` owns one `writers._worker.OrderedWorker` (the worker `MetricsManager` uses
too). Use it for a writer used on its own; a `MetricsManager` calls its writers from its own
worker already. Every write's step and keys, and scalars that are not numbers, are refused
on the caller's thread; the call is then queued and run in call order (arrays, device arrays
included, are read by the worker), so the training loop does not wait on disks or terminals.

* Back-pressure: at most `max_queue` calls wait; a full queue blocks the caller (nothing
  is dropped, a slow writer slows the loop instead of filling memory).
* Errors raised by the wrapped writer are kept and raised on the caller's next call (after
  its own work is queued), on `flush()` and on `close()`, as a `WriterError` naming the
  writer, the method and the step. Later calls still run: a failed write loses only itself.
* `flush()` and `close()` wait for every queued call; a writer never closed is closed at exit,
  as is one whose `close()` an exception ended (Ctrl-C, a signal handler's `sys.exit`).
* In a forked child, calls raise `RuntimeError` and `close()` does nothing: the queue is the
  parent's (a child's flush wrote each queued call a second time).
* Mappings and hyperparameters are copied, arrays are not: do not change an array in place
  until `flush()`.

Example:
  >>> import writers
  >>> w = writers.AsyncWriter(writers.LoggingWriter(), name="log")
  >>> w.write_scalars(1, {"loss": 0.5})  # returns at once; logged by the worker
  >>> w.close()  # waits for the write
"""

import atexit
import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from writers import _checks
from writers._base import ForwardingWriter, close_at_exit
from writers._worker import OrderedWorker
from writers.interface import WriterClosedError, WriterError
from writers.multi import MultiWriter, named_writers


class AsyncWriter(ForwardingWriter):
    """Runs every call of `writer` on a background thread, in order.

    Args:
      writer: Any writer with CLU's method names (calls are forwarded by keyword).
      name: Name used in error messages (default: the writer's class name).
      max_queue: Most calls waiting at once.
      num_workers: CLU's argument; only its default, 1, is taken: calls run in order.

    Raises:
      TypeError: `writer` lacks CLU's writer methods, or `max_queue` is not an int.
      ValueError: `max_queue` is below 1, or `num_workers` is not 1.
    """

    def __init__(
        self, writer: Any, *, name: str | None = None, max_queue: int = 128, num_workers: int = 1
    ):
        self._label = name or type(writer).__name__
        _checks.check_writers({self._label: writer}, "AsyncWriter")
        if isinstance(max_queue, bool) or not hasattr(max_queue, "__index__"):  # ints, NumPy's
            raise TypeError(  # a str or None raised "'<' not supported between ..."
                f"{self._where()}: max_queue must be an int >= 1, got {max_queue!r} "
                f"({type(max_queue).__name__}); 128 suits most loops."
            )
        if max_queue < 1:
            raise ValueError(
                f"{self._where()}: max_queue must be >= 1, got {max_queue}; 128 suits most loops."
            )
        if num_workers != 1 or isinstance(num_workers, bool):
            raise ValueError(
                f"{self._where()}: num_workers must be 1 (CLU's default), got {num_workers!r}: "
                "calls run in order on one thread. To write to several writers in parallel, "
                "give each its own: AsyncMultiWriter([...]) or MultiWriter of AsyncWriters."
            )
        self._writer = writer
        self._reserve({self._label: writer})
        self._errors: list[tuple[str, BaseException]] = []
        self._errors_lock = threading.Lock()
        # Both re-entrant: a signal handler calling close() runs on the thread it interrupted,
        # which may hold them (a write or close waiting for a queue slot, or a close waiting
        # for the queue): with plain locks that handler, and the process, waited forever.
        self._close_lock = threading.RLock()
        # Held from the closed check to the queueing of a call: a call from another thread is
        # queued before close() queues the close, or refused with WriterClosedError.
        self._post_lock = threading.RLock()
        self._close_again = False  # the writer's close() raised: a later close() calls it again
        # The close call is queued, and the worker has run it (not while an exception, Ctrl-C
        # or a handler's SystemExit, ended the wait: a later close(), the exit hook's too,
        # waits again; it returned at once, and 26 of 30 queued writes never reached the file).
        self._close_posted = False
        self._close_done = False
        self._worker = OrderedWorker(self._where(), max_pending=max_queue)
        self._at_exit = close_at_exit(self, self._where())

    @property
    def name(self) -> str:
        return self._label

    @property
    def writer(self) -> Any:
        return self._writer

    def flush(self) -> None:
        """Waits for every queued call, flushes the writer, raises errors seen so far.

        Raises:
          WriterError: every failed call since the last report.
        """
        with self._post_lock:
            posted = not self._closed
            if posted:
                try:
                    self._post("flush", {})
                except WriterClosedError:  # a signal handler's close() wrote everything
                    posted = False
        if posted:
            self._worker.drain()
        self._raise_errors("flush")

    def close(self) -> None:
        """Runs every queued call, closes the writer and joins the thread; idempotent once the
        writer's close went through (a later call closes it again, on the caller's thread: a
        writer at a URL keeps what it could not upload for it). A close whose wait an exception
        ended (Ctrl-C, a signal handler's `sys.exit`) is finished by the next one, at exit too.
        In a forked child it does nothing: the parent closes its writer.

        Raises:
          WriterError: every failed call not yet reported.
          RuntimeError: called from the wrapped writer (its worker thread), which the close
            would wait for; the writer stays open.
        """
        if self._worker.forked:
            return
        # Before it is marked closed: a later close() from the loop still waits and reports.
        self._worker.refuse_own_thread("close()")
        with self._close_lock:
            with self._post_lock:
                if self._close_done and not self._close_again:
                    return
                again, self._close_again = self._close_done, False
                self._closed = True
                if not self._close_posted:
                    try:
                        self._post("close", {})
                    except WriterClosedError:  # a signal handler's close() did it all
                        return
                    self._close_posted = True
            if again:  # the thread has ended
                try:
                    self._writer.close()
                except Exception as err:  # noqa: BLE001  (reported below, as the thread's are)
                    self._close_again = True
                    with self._errors_lock:
                        self._errors.append((f"{self._label}.close()", err))
            else:
                self._worker.close()
                self._close_done = True
                atexit.unregister(self._at_exit)
        self._raise_errors("close")

    def _where(self) -> str:
        return f"AsyncWriter({self._label})"

    def _forward(self, method: str, **kwargs: Any) -> None:
        kwargs = {k: dict(v) if isinstance(v, Mapping) else v for k, v in kwargs.items()}
        if method == "write_hparams":  # read by the worker: a config changed after the call
            kwargs["hparams"] = {k: _checks.copied(v) for k, v in kwargs["hparams"].items()}
        with self._post_lock:
            self._check_open(method)  # again: another thread may have closed it since _begin
            self._post(method, kwargs)
        self._raise_errors(method)

    def _post(self, method: str, kwargs: dict[str, Any]) -> None:
        def call(_: Any) -> None:
            try:
                getattr(self._writer, method)(**kwargs)
            # BaseException, as the manager's writers: an asyncio CancelledError from a writer's
            # own loop was only logged, never reported (Ctrl-C on the main thread is the user's).
            except BaseException as err:  # noqa: BLE001  (re-raised on the caller's thread)
                if isinstance(err, KeyboardInterrupt) and threading.current_thread() is (
                    threading.main_thread()
                ):
                    raise
                step = f"step={kwargs['step']}" if "step" in kwargs else ""
                named = _checks.named_if_donated(method, kwargs, err)  # not JAX's bare words
                with self._errors_lock:
                    self._errors.append((f"{self._label}.{method}({step})", named))
                if method == "close":
                    self._close_again = True

        try:
            self._worker.post([(method, call, None)])  # blocks while the queue is full
        except RuntimeError:
            # A signal handler's close() ran on this thread while it waited for a slot, and
            # stopped the worker: this call is refused as one racing a close.
            if not self._close_done:
                raise
            self._check_open(method)

    def _raise_errors(self, method: str) -> None:
        with self._errors_lock:
            errors, self._errors = self._errors, []
        if errors:
            raise WriterError(
                f"AsyncWriter({self._label}), reported on {method}()", errors, what="call"
            ) from errors[0][1]


class AsyncMultiWriter(MultiWriter):
    """CLU's `AsyncMultiWriter`: a `MultiWriter` of one `AsyncWriter` per writer."""

    def __init__(self, writers: Sequence[Any] | Mapping[str, Any], *, num_workers: int = 1):
        wrapped: dict[str, AsyncWriter] = {}
        try:  # a writer refused: no worker thread of the others left running
            for name, writer in named_writers(writers, "AsyncMultiWriter").items():
                wrapped[name] = AsyncWriter(writer, name=name, num_workers=num_workers)
        except Exception:
            for done in wrapped.values():
                done.close()
            raise
        super().__init__(wrapped)


@contextlib.contextmanager
def ensure_flushes(*writers: Any) -> Iterator[Any]:
    """CLU's context manager that flushes every writer on exit; yields the first.

    Every writer is flushed even if one fails (a `WriterError` then names each failure), and
    an error raised inside the block stays the one raised, the flush's failures noted on it.

    Example:
      >>> import writers
      >>> with writers.ensure_flushes(writers.AsyncWriter(writers.NoopWriter())) as w:
      ...   w.write_scalars(0, {"loss": 1.0})
    """
    if not writers:  # CLU's raised IndexError at writers[0]
        raise TypeError("ensure_flushes: expected at least one writer, got none; pass the writers")
    try:
        yield writers[0]
    except BaseException as err:
        if failed := _flush_each(writers):
            err.add_note(f"While flushing: {WriterError('ensure_flushes', failed)}")
        raise
    if failed := _flush_each(writers):
        raise WriterError("ensure_flushes", failed) from failed[0][1]


def _flush_each(writers: Sequence[Any]) -> list[tuple[str, BaseException]]:
    """Flushes every writer; the failures by writer name. (CLU's loop stopped at the first,
    leaving the writers after it unflushed, and replaced the block's own error.)"""
    failed: list[tuple[str, BaseException]] = []
    for name, writer in named_writers(writers, "ensure_flushes").items():
        try:
            writer.flush()
        except Exception as err:  # noqa: BLE001  (reported with the writer's name)
            failed.append((name, err))
    return failed
