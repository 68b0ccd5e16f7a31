"""What keeps one fault from costing the rest: the error collector and the per-writer fan-out.

`Failures` is the one place a `MetricsManager` keeps background failures (a writer's call, a
metric's `compute_value()`, a whole summary); `Fanout` turns a write into one
`OrderedWorker` piece per writer, each failing alone:

* each writer gets its own copies of the dicts of a call, and the arrays (the manager's
  copies) read-only: one that pops a key or changes an array changes nothing another gets;
* a failed call is logged at once (writer, step, keys) and kept in `Failures`; the writer's
  other calls of that write go on. A method raising `NotImplementedError` (CLU's writers do
  for kinds they cannot store), or missing, is not called again on that writer (`health()`:
  unsupported);
* `max_failures` writes in a row whose calls all failed quarantine the writer; it is tried
  again every `quarantine_s` until a write goes through, which ends the quarantine;
* a call past its deadline is abandoned by the worker (`stuck`): the writer is quarantined
  as hung and never called while that call is still inside it, unless it declares
  `takes_overlapping_calls = True` (its writes only buffer, as `MlflowWriter`'s: a flush
  stuck in a client's retries then costs none of the writes after it);
* while a signal's flush races a kill (`hurry`), a writer whose calls have taken the flush's
  per-writer bound in all is set aside, so a slow writer (no call hung) cannot hold the
  others' queued summaries past the kill; not one that `takes_overlapping_calls` (its writes
  cost nothing to let through).

Host-side module: never import it from code traced by jit.
"""

import collections
import contextlib
import dataclasses
import logging
import math
import threading
import time
import traceback
from collections.abc import Mapping
from typing import Any

import numpy as np

from writers._base import ABANDONED
from writers._checks import own_dicts
from writers._worker import Job, Piece
from writers.async_writer import AsyncWriter
from writers.multi import MultiWriter

_LOG = logging.getLogger("metrics_manager.manager")  # the logger users filter on


class MetricsManagerError(RuntimeError):
    """A background job of a `MetricsManager` failed; the message names the writer or metric."""


@dataclasses.dataclass(frozen=True)
class Failure:
    """One background failure: where (`source`), at which step, for which keys, and why."""

    source: str  # "writer:<name>", "metric:<key>", "summary", "nonfinite" or a job's piece
    step: int | None
    keys: tuple[str, ...]
    error: BaseException

    def __str__(self) -> str:
        at = "" if self.step is None else f" at step {self.step}"
        keys = f" (keys {', '.join(self.keys[:5])}{', ...' if len(self.keys) > 5 else ''})"
        return f"{self.source}{at}{keys if self.keys else ''}: {type(self.error).__name__}: {self.error}"


class Failures:
    """The failures of one manager: the last 1,000, their count, and the one to raise next.

    Args:
      owner: how log lines name the manager, e.g. "MetricsManager 'train'".
      raise_all: every failure is fatal (`on_error="raise"`), not only those recorded so.
    """

    def __init__(self, owner: str, raise_all: bool) -> None:
        self.owner = owner
        self._raise_all = raise_all
        self._lock = threading.RLock()  # a signal's close() may run inside `record`
        self._recent: collections.deque[Failure] = collections.deque(maxlen=1000)
        self.count = 0
        self.fatal: Failure | None = None  # to raise at the next call, once
        self._also: list[Failure] = []  # fatal ones recorded while `fatal` waited: named with it

    def record(self, failure: Failure, *, fatal: bool | None = None) -> None:
        """`fatal`: raised at the next call; None: under `raise_all`; False: never."""
        _release_locals(failure.error)
        with self._lock:
            self._recent.append(failure)
            self.count += 1
            if fatal or (fatal is None and self._raise_all):
                if self.fatal is None:
                    self.fatal = failure
                else:
                    self._also.append(failure)
        _LOG.error("%s: %s", self.owner, failure)

    def recent(self) -> list[Failure]:
        with self._lock:
            return list(self._recent)

    def raise_fatal(self) -> None:
        """Raises `MetricsManagerError` for the fatal failure and names those recorded after
        it, once (`recent` keeps them): a second failure before the next call is not lost."""
        with self._lock:
            fatal, also = self.fatal, self._also
            self.fatal, self._also = None, []
        if fatal is not None:
            more = ""
            if also:
                listed = "; ".join(map(str, also[:3])) + ("; ..." if len(also) > 3 else "")
                more = f" (and {len(also)} more since, in `errors`: {listed})"
            raise MetricsManagerError(
                f"{self.owner}: background failure: {fatal}{more}"
            ) from fatal.error


def _inside(writer: Any) -> list[Any]:
    """`writer` and the writers its hung call is inside: an `AsyncWriter`'s, and the one a
    `MultiWriter` is calling (a TensorBoardWriter in `AsyncWriter(MultiWriter([tb]))` waited at
    exit for the lock its abandoned write held, and the process never ended)."""
    chain = [writer]
    while isinstance(last := chain[-1], AsyncWriter | MultiWriter):
        if (inner := last.writer if isinstance(last, AsyncWriter) else last.calling) is None:
            break
        chain.append(inner)
    return chain


def _release_locals(error: BaseException) -> None:
    """Clears the locals of the finished frames in the tracebacks of `error` and the errors it
    chains (a writer's), so a kept failure holds none of its call's values: 200 failed writes
    of 3 MB images held 600 MB. The tracebacks still print each frame's file and line."""
    seen: set[int] = set()
    chain: list[BaseException | None] = [error]
    while chain:
        err = chain.pop()
        if err is not None and id(err) not in seen:
            seen.add(id(err))
            traceback.clear_frames(err.__traceback__)  # but the running ones (that caught it)
            chain += [err.__cause__, err.__context__]


@dataclasses.dataclass(slots=True)
class _WriterState:
    writer: Any
    failures: int = 0
    in_a_row: int = 0
    quarantined: str | None = None  # why, while quarantined
    retry_at: float = 0.0  # monotonic time when a quarantined writer is tried again
    skipped: int = 0  # write calls skipped while quarantined
    busy: bool = False  # a call is inside the writer (an abandoned one, after a deadline)
    held: tuple[Any, ...] = ()  # put in ABANDONED by that call: `_inside` when it was abandoned
    overlap: bool = False  # it takes calls while one is inside it (`takes_overlapping_calls`)
    hurried_s: float = 0.0  # seconds inside the writer since `Fanout.hurry` began
    unsupported: set[str] = dataclasses.field(default_factory=set)  # NotImplementedError
    close_failed: bool = False  # its close raised: `close_again` calls it once more


_ARRAY_CALLS = frozenset(
    ("write_images", "write_videos", "write_audios", "write_histograms", "write_summaries")
)


def _read_only(kwargs: Mapping[str, Any]) -> None:
    """Makes the NumPy arrays of a call read-only: the manager's copies, shared by writers."""
    for value in kwargs.values():
        for array in value.values() if isinstance(value, Mapping) else ():
            if isinstance(array, np.ndarray):
                array.flags.writeable = False


class Fanout:
    """A manager's writers by name, each called in its own piece and failing alone.

    Args:
      writers: name -> synchronous writer.
      failures: where failures go.
      deadline_s: a piece's deadline (None: none).
      max_failures: failed calls in a row that quarantine a writer.
      quarantine_s: how long a quarantined writer stays out before a retry (inf: for good).
      fail_summary: a failed write also fails the summary's future (`on_error="raise"`).
    """

    def __init__(
        self,
        writers: Mapping[str, Any],
        failures: Failures,
        *,
        deadline_s: float | None,
        max_failures: int,
        quarantine_s: float,
        fail_summary: bool,
    ) -> None:
        self.states = {
            n: _WriterState(w, overlap=getattr(w, "takes_overlapping_calls", False) is True)
            for n, w in writers.items()
        }
        self._failures = failures
        self.deadline_s = deadline_s
        self._max_failures = max_failures
        self._quarantine_s = quarantine_s
        self._fail_summary = fail_summary
        self._hurry_s: float | None = None  # `hurry`'s bound on each writer's time
        self._hurry_at = 0.0  # when `hurry` began (monotonic)
        self._held_lock = threading.Lock()  # a call's end and `stuck` abandoning it

    def hurry(self, budget_s: float | None) -> None:
        """While a signal's flush races a kill: a writer that has spent `budget_s` in calls
        since now is quarantined for its remaining calls (None ends it). Without this, a
        writer taking 3 s a call (none hung) held 8 of 17 queued summaries from the others.
        None also ends what it set aside: a process that goes on (a caught Ctrl-C) lost the
        slow writer's values for `quarantine_s` after the flush, not for the flush."""
        self._hurry_at = time.monotonic()  # a call running then counts from here
        for state in self.states.values():
            state.hurried_s = 0.0
            if budget_s is None and (state.quarantined or "").startswith("slow:"):
                state.retry_at = time.monotonic()  # tried at its next write
        self._hurry_s = budget_s

    def health(self) -> dict[str, dict[str, Any]]:
        return {
            n: {
                "failures": s.failures,
                "quarantined": s.quarantined,
                "skipped": s.skipped,
                "flush_failure": getattr(s.writer, "flush_failure", None),
                "unsupported": sorted(s.unsupported),
            }
            for n, s in self.states.items()
        }

    def close_again(self) -> list[Piece]:
        """Pieces closing once more each writer whose close raised (storage down at close:
        a second close uploads what it still buffers), as `pieces` closes them; none for a
        writer whose close went through or is still inside it. Each failed close is claimed
        by one call: two callers do not close a writer twice at once."""
        failed = [n for n, s in self.states.items() if s.close_failed]
        for name in failed:
            self.states[name].close_failed = False  # set again if this close raises too
        return self.pieces(None, [("close", {})], closing=True, only=failed) if failed else []

    def pieces(
        self,
        step: int | None,
        calls: list[Any] | None,
        *,
        closing: bool = False,
        only: list[str] | None = None,
    ) -> list[Piece]:
        """One isolated piece per writer making `calls` (`(method, kwargs)` pairs; None: those
        a summary left in `job.state["calls"]`), at `step` unless None or `write_hparams`.
        `closing`: a quarantined writer is called anyway, unless a call is still inside it.
        `only`: the writers by name to call (None: all)."""
        pieces: list[Piece] = []
        writes = calls is None or calls[0][0].startswith("write")
        for writer_name, state in self.states.items():
            if only is not None and writer_name not in only:
                continue

            def call(job: Job, name: str = writer_name, state: _WriterState = state) -> None:
                job.state["step"] = step  # for `stuck`
                hurry_s = self._hurry_s
                # Not one whose writes only buffer: its flush, bounded as any call, took the
                # time, and skipping its writes saved none (an abandoned flush returning
                # mid-flush lost every summary after it).
                if hurry_s is not None and state.hurried_s >= hurry_s and not state.overlap:
                    self._set_aside(name, state, hurry_s)
                if state.quarantined and (
                    state.busy or not (closing or time.monotonic() >= state.retry_at)
                ):
                    state.skipped += writes
                    return
                state.busy, started = True, time.monotonic()
                failed = wrote = False  # a call of a kind it does not store: neither
                try:
                    for method, kwargs in job.state.get("calls", ()) if calls is None else calls:
                        if method in state.unsupported:
                            continue
                        try:
                            if method in _ARRAY_CALLS:  # ours: one writing in place fails alone
                                _read_only(kwargs)
                            if (write := getattr(state.writer, method, None)) is None:
                                # An optional one (write_images, ...): a kind it cannot store,
                                # as for CLU's NotImplementedError (AttributeErrors counted
                                # toward its quarantine, and its scalars were lost too).
                                raise NotImplementedError(
                                    f"{type(state.writer).__name__} has no {method} method"
                                )
                            if method == "write_hparams" or step is None:
                                write(**own_dicts(kwargs))
                            else:
                                write(step=step, **own_dicts(kwargs))
                            wrote = wrote or method.startswith("write")  # not a flush
                        # BaseException too: SystemExit, KeyboardInterrupt or an asyncio
                        # CancelledError from a writer's own loop cannot end the process from
                        # this thread, only the job, and with it the writers after this one.
                        except BaseException as err:  # noqa: BLE001  (isolated)
                            on_main = threading.current_thread() is threading.main_thread()
                            if isinstance(err, KeyboardInterrupt) and on_main:
                                raise  # Ctrl-C reached a call run inline: the user's to handle
                            keys = [tuple(v) for v in kwargs.values() if isinstance(v, Mapping)]
                            failure = Failure(f"writer:{name}", step, keys[0] if keys else (), err)
                            self._failures.record(failure)
                            state.failures += 1
                            if self._fail_summary:
                                job.state.setdefault("failure", failure)
                            if isinstance(err, NotImplementedError):  # CLU: a kind it cannot store
                                state.unsupported.add(method)
                                _LOG.warning(
                                    "%s: writer %r does not implement %s: its other calls go "
                                    "on, and that method is not called again",
                                    self._failures.owner,
                                    name,
                                    method,
                                )
                            else:
                                failed = True
                                if method == "close":  # a later close() tries it again
                                    state.close_failed = True
                finally:
                    with self._held_lock:  # `stuck` may be abandoning this call right now
                        state.busy = False
                        if state.held:  # this may be the abandoned call, now returned
                            for writer in state.held:
                                ABANDONED.discard(writer)
                            state.held = ()
                    if self._hurry_s is not None:
                        state.hurried_s += time.monotonic() - max(started, self._hurry_at)
                    # A kept failure's traceback keeps this frame (its writer frame's f_back),
                    # and with it the call's values, unless they are dropped here.
                    job = kwargs = None  # type: ignore[assignment]
                if failed and not wrote and writes:  # a failing flush: its writes count
                    self._failed(name, state)
                if not wrote:  # only unsupported kinds, or failures: no sign of life
                    return
                if state.quarantined and state.retry_at <= started:  # a retry went through
                    _LOG.warning(
                        "%s: writer %r is back (quarantined: %s; %d writes skipped)",
                        self._failures.owner,
                        name,
                        state.quarantined,
                        state.skipped,
                    )
                    state.quarantined = None
                state.in_a_row = 0

            pieces.append((f"writer {writer_name!r}", call, self.deadline_s))
        return pieces

    def stuck(self, label: str, cap_s: float | None, job: Job) -> None:
        """The worker abandoned `label`'s piece of `job` past its deadline (or `cap_s`, if
        lower)."""
        # By its piece's label (repr: a name holding a quote or a backslash is not in 's).
        name = next((n for n in self.states if label == f"writer {n!r}"), label)
        outcome = "quarantined"
        if (state := self.states.get(name)) is not None:
            state.failures += 1
            if state.overlap:  # its writes only buffer: skipping them would lose them
                outcome = "left to end on its own; its later calls go on"
            else:
                state.quarantined, state.retry_at = "hung", time.monotonic() + self._quarantine_s
                with self._held_lock:  # a call returned since its deadline holds none
                    for writer in _inside(state.writer) if state.busy else ():
                        with contextlib.suppress(TypeError):  # not weakly referable: no exit hook
                            ABANDONED.add(writer)  # its close at exit would wait for the call
                            state.held += (writer,)
        limit = f"writer_deadline_s={self.deadline_s}"
        if cap_s is not None and cap_s < (self.deadline_s or math.inf):
            limit = f"{cap_s} s, the bound while flushing on a signal"
        err = TimeoutError(f"{label} ran past {limit}: {outcome}")
        failure = Failure(f"writer:{name}", job.state.get("step"), (), err)
        self._failures.record(failure)
        if self._fail_summary:  # as a raising writer's: the summary's future fails
            job.state.setdefault("failure", failure)

    def _set_aside(self, name: str, state: _WriterState, hurry_s: float) -> None:
        """Quarantines a writer that took its share of a signal's flush, once per flush."""
        if state.quarantined and state.retry_at > time.monotonic():
            return
        state.quarantined = f"slow: {state.hurried_s:.1f} s of calls in the flush on a signal"
        state.retry_at = time.monotonic() + self._quarantine_s
        err = TimeoutError(
            f"writer {name!r} took {state.hurried_s:.1f} s of the flush on a signal (bound "
            f"{hurry_s:g} s a writer): its remaining calls are skipped so the other writers "
            "write theirs before the kill"
        )
        state.failures += 1
        self._failures.record(Failure(f"writer:{name}", None, (), err))

    def _failed(self, name: str, state: _WriterState) -> None:
        """A piece whose calls all failed: `max_failures` of them in a row quarantine; a
        quarantined writer's failed retry (after a hang too) waits `quarantine_s` again."""
        state.in_a_row += 1
        if state.in_a_row >= self._max_failures or state.quarantined:
            state.retry_at = time.monotonic() + self._quarantine_s
            if not state.quarantined:
                state.quarantined = f"{state.in_a_row} failures in a row"
                _LOG.error(
                    "%s: writer %r quarantined after %d failures in a row; "
                    "the other writers go on (%s)",
                    self._failures.owner,
                    name,
                    state.in_a_row,
                    f"tried again in {self._quarantine_s:g} s"
                    if math.isfinite(self._quarantine_s)
                    else "for good: quarantine_s=None",
                )
