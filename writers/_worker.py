"""`OrderedWorker`: the one background worker of this project (bounded, ordered, deadlines).

Both `writers.AsyncWriter` and `metrics_manager.MetricsManager` run their background work
here. A job is a list of pieces, run in order on one thread, jobs in submission order:

* **Back-pressure**: at most `max_pending` jobs wait behind the running one; `submit`
  blocks until one starts. Nothing is dropped.
* **Deadlines**: a piece may carry a deadline in seconds. A piece that overruns it is
  abandoned: its thread is left behind (a daemon, so the process can still exit), `on_stuck`
  is told, and a fresh thread goes on with the job's next piece and the rest of the queue.
  Overruns are noticed by whoever waits for the worker (a blocked `submit`, `drain`), so a
  loop that never waits never pays for the check.
* **Errors**: an exception from a piece ends its job (later pieces are skipped) and fails the
  job's future; callers that want isolation catch inside the piece.

A piece is `(label, fn, deadline_s)`; `fn(job)` may keep state in `job.state` and set
`job.result`, which becomes the future's value.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

Piece = tuple[str, Callable[["Job"], None], float | None]

_POLL_S = 0.05  # how often a waiting caller looks for an overrun piece


class Job:
    """One unit of ordered work: pieces, shared state, the result and its future."""

    __slots__ = ("pieces", "future", "index", "state", "result")

    def __init__(self, pieces: Sequence[Piece]) -> None:
        self.pieces = list(pieces)
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.index = 0
        self.state: dict[str, Any] = {}
        self.result: Any = None


class OrderedWorker:
    """Runs jobs of pieces in order on one daemon thread with a bounded queue.

    Args:
      name: thread name (shown in error messages and thread dumps).
      max_pending: most jobs waiting at once behind the running one.
      on_stuck: called as `on_stuck(label, job)` (under the worker's lock, so keep it short)
        when a piece overruns its deadline and is abandoned.
    """

    def __init__(
        self,
        name: str,
        *,
        max_pending: int = 16,
        on_stuck: Callable[[str, Job], None] | None = None,
    ) -> None:
        self.name = name
        self._max = max_pending
        self._on_stuck = on_stuck
        self._cond = threading.Condition(threading.RLock())  # re-entrant for signal handlers
        self._queue: collections.deque[Job] = collections.deque()
        self._current: Job | None = None
        self._piece: tuple[str, float | None] | None = None  # (label, monotonic deadline)
        self._generation = 0
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._spawn()

    @property
    def threads(self) -> list[threading.Thread]:
        """Every thread this worker started (more than one after an abandoned piece)."""
        return list(self._threads)

    def on_worker_thread(self) -> bool:
        """True when called from the worker's current thread."""
        return bool(self._threads) and threading.current_thread() is self._threads[-1]

    def submit(self, pieces: Sequence[Piece]) -> concurrent.futures.Future[Any]:
        """Queues a job; blocks while `max_pending` jobs wait. Returns its future.

        Raises:
          RuntimeError: the worker is stopping, or the call comes from the worker itself
            while the queue is full (it would wait for a slot only it can free).
        """
        job = Job(pieces)
        with self._cond:
            while len(self._queue) >= self._max and not self._stopping:
                if self.on_worker_thread():
                    raise RuntimeError(
                        f"{self.name}: called from its own worker thread while {self._max} "
                        "jobs are pending; the call would wait for a slot only this thread "
                        "can free. Call it from the training loop instead."
                    )
                self._wait()
            if self._stopping:
                raise RuntimeError(f"{self.name} is closed; create a new one.")
            self._queue.append(job)
            self._cond.notify_all()
        return job.future

    def drain(self, timeout: float | None = None) -> bool:
        """Waits until every queued job has ended; False if `timeout` passed first."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending():
                if end is not None and time.monotonic() >= end:
                    return False
                self._wait()
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Runs what is queued, then stops the thread; False if `timeout` passed first."""
        drained = self.drain(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if drained:
            self._threads[-1].join(timeout)
        return drained

    def running_label(self) -> str | None:
        """The label of the piece running now, or None."""
        piece = self._piece
        return None if piece is None else piece[0]

    # --------------------------------------------------------------------- internals

    def _pending(self) -> int:
        return len(self._queue) + (self._current is not None)

    def _wait(self) -> None:
        """Waits a little for the worker, abandoning a piece that overran its deadline."""
        self._cond.wait(_POLL_S)
        piece = self._piece
        if piece is not None and piece[1] is not None and time.monotonic() > piece[1]:
            job = self._current
            assert job is not None  # a piece runs only inside the current job
            self._generation += 1
            job.index += 1
            self._piece = None
            if self._on_stuck is not None:
                self._on_stuck(piece[0], job)
            self._spawn()

    def _spawn(self) -> None:
        thread = threading.Thread(
            target=self._run, args=(self._generation,), name=self.name, daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _run(self, generation: int) -> None:
        while True:
            with self._cond:
                if generation != self._generation:
                    return  # this thread was abandoned; a newer one owns the queue
                job = self._current
                if job is None:
                    while not self._queue and not self._stopping:
                        self._cond.wait()
                    if not self._queue:
                        return
                    job = self._current = self._queue.popleft()
                    self._cond.notify_all()  # a queue slot opened
                index = job.index
                if index < len(job.pieces):
                    label, fn, deadline = job.pieces[index]
                    self._piece = (label, None if deadline is None else time.monotonic() + deadline)
            if index >= len(job.pieces):
                self._finish(job, generation)
                continue
            try:
                fn(job)
                failed = None
            except BaseException as err:  # noqa: BLE001  (fails this job's future)
                failed = err
            with self._cond:
                if generation != self._generation:
                    return
                self._piece = None
                if failed is None:
                    job.index = index + 1
                else:
                    job.index = len(job.pieces)
                    job.state["error"] = failed

    def _finish(self, job: Job, generation: int) -> None:
        error = job.state.get("error")
        if error is None:
            job.future.set_result(job.result)
        else:
            job.future.set_exception(error)
        with self._cond:
            if generation == self._generation and self._current is job:
                self._current = None
            self._cond.notify_all()
