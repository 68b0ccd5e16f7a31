"""`OrderedWorker`: the one background worker (bounded, ordered, deadlines) of this project.

`writers.AsyncWriter` and `metrics_manager.MetricsManager` run their background work here. A
job is a list of pieces, run in order on one thread, jobs in submission order:

* **Back-pressure**: at most `max_pending` jobs wait behind the running one; `submit`
  blocks until one starts. Nothing is dropped.
* **Deadlines**: a piece that overruns its deadline (seconds) is abandoned to its thread (a
  daemon, so the process can still exit), `on_stuck` is told, and a fresh thread goes on with
  the job's next piece. Overruns are noticed at the next `submit`/`post` (one clock read) or
  by a caller waiting for the worker or a job's future: no watchdog thread.
* **Errors**: an exception from a piece ends its job and fails its future; to isolate pieces,
  catch inside them. A future cancelled before its job starts skips the job.

A piece is `(label, fn, deadline_s)`; `fn(job)` may keep state in `job.state` and set
`job.result`, the future's value. Only a piece with a deadline, or any while `hurry` bounds
them (which alone can be abandoned), publishes itself under the lock: at a summary per step,
lock rounds were measurable.
"""

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

Piece = tuple[str, Callable[["Job"], None], float | None]

_LOG = logging.getLogger(__name__)
_POLL_S = 0.05  # how often a waiting caller looks for an overrun piece


class _Future(Future):  # type: ignore[type-arg]
    """A job's future: `result()` and `exception()` abandon a piece past its deadline, as
    waiting for the worker does (a loop reading a summary back while a writer hung got no
    result); `concurrent.futures.wait` and callbacks do not."""

    def __init__(self, worker: "OrderedWorker") -> None:
        super().__init__()
        self._worker = worker

    def result(self, timeout: float | None = None) -> Any:
        self._worker._wait_for(self, timeout)
        return super().result(timeout=0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._worker._wait_for(self, timeout)
        return super().exception(timeout=0)


class Job:
    """One unit of ordered work: pieces, shared state, the result and its future."""

    __slots__ = ("pieces", "future", "index", "state", "result")

    def __init__(self, pieces: Sequence[Piece], future: Future[Any] | None = None) -> None:
        self.pieces = list(pieces)
        self.future = future
        self.index = 0
        self.state: dict[str, Any] = {}
        self.result: Any = None


class OrderedWorker:
    """Runs jobs of pieces in order on one daemon thread with a bounded queue.

    Args:
      name: thread name, also used in error messages.
      max_pending: most jobs waiting at once behind the running one.
      on_stuck: `on_stuck(label, job, cap)` when a piece is abandoned, `cap` the `hurry` bound
        that set its deadline (else None), lifted since or not (runs under the lock: be short).
      on_error: `on_error(label, job, error)` when a piece of a job nobody waits on (`post`)
        fails, in place of logging it.
    """

    def __init__(
        self,
        name: str,
        *,
        max_pending: int = 16,
        on_stuck: Callable[[str, Job, float | None], None] | None = None,
        on_error: Callable[[str, Job, BaseException], None] | None = None,
    ) -> None:
        self.name = name
        self._max = max_pending
        self._on_stuck = on_stuck
        self._on_error = on_error
        self._cond = threading.Condition(threading.RLock())  # re-entrant for signal handlers
        self._queue: collections.deque[Job] = collections.deque()
        self._current: Job | None = None
        # (label, monotonic deadline, the `hurry` cap that set that deadline or None)
        self._piece: tuple[str, float, float | None] | None = None
        self.cap: float | None = None  # `hurry`'s bound on every deadline
        self._generation = 0
        self._queued = 0  # jobs queued so far; they end in that order
        self._ended = 0
        self._stopping = False
        self._sealed = False  # the last job is queued (or the worker stopped): no more jobs
        self._threads: list[threading.Thread] = []
        self._orphaned = False  # no thread could be started: waiting callers run the queue
        self._pid = os.getpid()
        self._spawn()

    @property
    def forked(self) -> bool:
        """This is a forked child's copy: its queue and thread are the parent's."""
        return os.getpid() != self._pid

    def _refuse_fork(self) -> None:
        if self.forked:  # a new thread here would run the parent's queue into its files again
            raise RuntimeError(
                f"{self.name} was made in process {self._pid} and is used in a forked child "
                f"({os.getpid()}), where its queue, the parent's, would be written a second "
                "time. Make a new writer in the child, or start it with 'spawn'."
            )

    @property
    def threads(self) -> list[threading.Thread]:
        """Every thread this worker started (more than one after an abandoned piece)."""
        return list(self._threads)

    @property
    def backlog(self) -> int:
        """Jobs queued and not ended yet (the running one included)."""
        with self._cond:
            return self._queued - self._ended

    def submit(self, pieces: Sequence[Piece]) -> Future[Any]:
        """Queues a job; blocks while `max_pending` jobs wait. Returns its future.

        Raises:
          RuntimeError: the worker is closed, or its own thread calls it while the queue is full.
        """
        return self._enqueue(Job(pieces, _Future(self))).future  # type: ignore[return-value]

    def post(
        self, pieces: Sequence[Piece], *, last: bool = False, timeout: float | None = None
    ) -> None:
        """`submit` for a job nobody waits on: no future is made; an error ending it is logged.
        `last`: the job that closes what the pieces write; later jobs are refused, as after
        `close()` (a call queued behind it reached closed writers, and was lost).

        Raises:
          TimeoutError: the queue stayed full for `timeout` seconds (the job is not queued).
        """
        self._enqueue(Job(pieces), last, timeout)

    def refuse_own_thread(self, what: str) -> None:
        """Raises if the worker's own thread (a piece, a future's callback) would wait for
        itself in `what`: it would wait forever, or until a deadline abandoned it."""
        if self._threads and threading.current_thread() is self._threads[-1]:
            raise RuntimeError(
                f"{self.name}: {what} was called from its own worker thread (inside a writer, "
                "or a future's callback), where it would wait for itself forever. Call it from "
                "the training loop."
            )

    def _enqueue(self, job: Job, last: bool = False, timeout: float | None = None) -> Job:
        self._refuse_fork()
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._abandon_overrun()
            while len(self._queue) >= self._max and not self._sealed:
                self.refuse_own_thread(f"queueing with {self._max} jobs pending")
                left = _POLL_S if end is None else min(_POLL_S, end - time.monotonic())
                if left <= 0:
                    raise TimeoutError(
                        f"{self.name}: its queue stayed full ({self._max} jobs pending) for "
                        f"{timeout:.3g} s"
                    )
                self._wait(left)
            if self._sealed:
                raise RuntimeError(f"{self.name} is closed; create a new one.")
            self._queue.append(job)
            self._queued += 1
            self._sealed = last
            self._cond.notify_all()
        return job

    def drain(self, timeout: float | None = None) -> bool:
        """Waits until every job queued before this call has ended; False if `timeout` passed
        first. Jobs queued meanwhile (by a loop on another thread) are not waited for."""
        self._refuse_fork()
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._queued
            if self._ended < target:
                self.refuse_own_thread("waiting for the queue")
            while self._ended < target:
                if end is not None and time.monotonic() >= end:
                    return False
                self._wait()
        return True

    def hurry(self, cap_s: float | None) -> None:
        """Bounds every piece's time by `cap_s`, a piece with no deadline too (the running
        piece's: `cap_s` from now); None undoes it for the pieces that start later.

        For a flush racing a kill (SIGTERM's grace period): a hung piece is abandoned in time
        for the pieces queued behind it to run.
        """
        with self._cond:
            self.cap = cap_s
            if cap_s is None:
                return
            end = time.monotonic() + cap_s
            job = self._current
            if self._piece is not None:
                label, own, capped = self._piece
                self._piece = (label, end, cap_s) if end < own else (label, own, capped)
            elif job is not None and job.index < len(job.pieces):  # running with no deadline
                self._piece = (job.pieces[job.index][0], end, cap_s)

    def close(self, timeout: float | None = None) -> bool:
        """Runs what is queued, then stops the thread; False if `timeout` passed first."""
        drained = self.drain(timeout)
        with self._cond:
            self._stopping = self._sealed = True
            self._cond.notify_all()
        if drained and not self._orphaned:
            self._threads[-1].join(timeout)
        return drained

    def _wait_for(self, future: Future[Any], timeout: float | None) -> None:
        """Waits until `future` is done or `timeout` passed, abandoning overrun pieces."""
        self._refuse_fork()
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if not future.done():
                self.refuse_own_thread("waiting for a job's result")
            while not future.done():
                left = _POLL_S if end is None else min(_POLL_S, end - time.monotonic())
                if left <= 0:
                    return
                self._wait(left)

    def _wait(self, timeout: float = _POLL_S) -> None:
        self._cond.wait(timeout)
        if self._orphaned or not (self._stopping or self._threads[-1].is_alive()):
            if not self._orphaned:
                # Killed by something outside the jobs (a profiler hook raising as the thread
                # started): without a successor every waiter would wait forever.
                _LOG.error("%s: its thread died; a new one goes on with the queue", self.name)
            self._generation += 1
            self._spawn()
            return
        self._abandon_overrun()

    def _abandon_overrun(self) -> None:
        """Under the lock: leaves a piece past its deadline to its thread; a new one goes on."""
        piece = self._piece
        if piece is not None and time.monotonic() > piece[1]:
            job = self._current
            assert job is not None  # a piece runs only inside the current job
            self._generation += 1
            job.index += 1
            self._piece = None
            if self._on_stuck is not None:
                # The cap that armed it, even if `hurry(None)` lifted it since: a signal's
                # flush that gave up first, and a close() that abandoned the piece after it.
                self._on_stuck(piece[0], job, piece[2])
            self._spawn()

    def _spawn(self) -> None:
        thread = threading.Thread(
            target=self._run, args=(self._generation,), name=self.name, daemon=True
        )
        try:
            thread.start()
        except RuntimeError:
            # Python 3.12.0-3.12.1 start no thread while the interpreter shuts down (a close
            # at exit after an abandoned piece): the caller waiting for the worker runs the
            # queue itself, with no deadline, rather than lose it.
            self._orphaned = True
            self._run(self._generation, inline=True)
            return
        self._orphaned = False
        self._threads.append(thread)

    def _run(self, generation: int, inline: bool = False) -> None:
        cond = self._cond
        while True:
            with cond:
                if generation != self._generation:
                    return  # this thread was abandoned; a newer one owns the queue
                job = self._current
                if job is None:
                    while not self._queue and not self._stopping:
                        if inline:
                            return
                        cond.wait()
                    if not self._queue:
                        return
                    job = self._current = self._queue.popleft()
                    cond.notify_all()  # a queue slot opened
                    if job.future is not None and not job.future.set_running_or_notify_cancel():
                        job.index = len(job.pieces)  # cancelled before it started: skipped
                self._arm(job)
            pieces = job.pieces
            while job.index < len(pieces):
                index = job.index
                _, fn, deadline = pieces[index]
                try:
                    fn(job)
                    failed = None
                except BaseException as err:  # noqa: BLE001  (fails this job's future)
                    failed = err
                # Unarmed and still this thread's (`hurry` arms a piece with no deadline, and
                # an abandoned thread must not go on with the job): no lock round.
                if (
                    deadline is None
                    and failed is None
                    and self._piece is None
                    and generation == self._generation
                ):
                    job.index = index + 1
                    if job.index < len(pieces) and pieces[job.index][2] is not None:
                        with cond:
                            self._arm(job)
                    continue
                with cond:
                    if generation != self._generation:
                        return
                    if failed is None:
                        job.index = index + 1
                    else:
                        job.index = len(pieces)
                        job.state["error"], job.state["failed_in"] = failed, pieces[index][0]
                    self._arm(job)
            self._finish(job, generation)

    def _arm(self, job: Job) -> None:
        index, pieces = job.index, job.pieces
        label, _, deadline = pieces[index] if index < len(pieces) else ("", None, None)
        capped = None
        if (
            self.cap is not None
            and index < len(pieces)
            and (deadline is None or self.cap < deadline)
        ):
            deadline = capped = self.cap
        self._piece = None if deadline is None else (label, time.monotonic() + deadline, capped)

    def _finish(self, job: Job, generation: int) -> None:
        error = job.state.get("error")
        if job.future is None:
            if error is not None and self._on_error is not None:
                self._on_error(job.state["failed_in"], job, error)
            elif error is not None:
                _LOG.error("%s: a background job failed: %r", self.name, error)
        elif job.future.cancelled():
            pass  # skipped before it started (`_run`): nobody waits for its result
        elif error is None:
            job.future.set_result(job.result)
        else:
            job.future.set_exception(error)
        with self._cond:
            self._ended += 1
            if generation == self._generation and self._current is job:
                self._current = None
            self._cond.notify_all()
