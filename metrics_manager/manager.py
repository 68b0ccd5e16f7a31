"""`MetricsManager`: T5X's summary contract on one background worker, with isolated writers.

  with MetricsManager("train", summary_dir="runs/exp") as manager:
    running = None
    manager.start_duration_timer(block_on=state)
    for step in range(start + 1, start + num_steps + 1):
      state, running = train_step(state, running, batch)   # merge_metrics inside the step
    manager.write_metrics_summary(running, start + num_steps, num_steps)

The caller's thread checks every argument once (a bad input raises at the call, naming the
key and the fix) and queues a job; one ordered worker thread (`writers._worker.OrderedWorker`)
times the window, computes the summary (`summary.Summarizer`) and hands it to each writer, a
plain synchronous backend isolated by `isolation.Fanout`; every failure goes to one
`isolation.Failures`. This module is the T5X-shaped facade over them, plus the signal handler.
What each fault costs (a raising or hung writer, a failing metric, SIGTERM, SIGKILL) is in
the README's "Failure modes".

Host-side module: never import it from code traced by jit.
"""

import atexit
import concurrent.futures
import dataclasses
import functools
import itertools
import json
import logging
import math
import numbers
import os
import signal
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import clu.metrics
import clu.values
import jax
import numpy as np
from flax import nnx
from jax._src import core as _jax_core

import writers
from metrics_manager import metrics as metrics_lib
from metrics_manager import timer
from metrics_manager.flops import perf_values
from metrics_manager.isolation import Failure, Failures, Fanout, MetricsManagerError
from metrics_manager.nnx import as_summary_metrics
from metrics_manager.packing import PackedMetrics
from metrics_manager.summary import Summarizer
from metrics_manager.system import SystemMonitor
from writers import _checks, _jsonl_log, _storage
from writers._base import TrackerWriter, close_at_exit, keys_problem
from writers._checks import Problems
from writers._worker import Job, OrderedWorker
from writers.interface import close_failed, close_keeping_error
from writers.multi import named_writers

WriterFactory = Callable[..., Any]
"""`writer_factory(logdir)` returns a writer, a `writers.MultiWriter`, or a list or dict of
writers; it also gets `collection=<name>` if it has that keyword defaulting to None, and
`resume_step` if it has one."""

_LOG = logging.getLogger(__name__)
_UPTIME = "timing/uptime"  # T5X's key
_ARRAY_KINDS = {"images": "image", "arrays": "histogram"}  # `_host_write`'s arg -> its checks
_READY_KINDS = {  # a value given ready to write_metrics_summary -> its checks
    clu.values.Image: "image",
    clu.values.Histogram: "histogram",
    clu.values.Audio: "audio",
}
_REQUIRED = ("write_scalars", "write_texts", "write_hparams", "flush", "close")
_OPEN: "weakref.WeakSet[MetricsManager]" = weakref.WeakSet()
_DIRS: dict[str, str] = {}  # summary dir -> where its open manager was made (this process)
_DIRS_LOCK = threading.Lock()
_PREVIOUS_HANDLERS: dict[int, Any] = {}
_DEFAULTS = (signal.SIG_DFL, signal.default_int_handler)
# A signal's flush ends within the usual 30 s grace period before SIGKILL (Kubernetes, GCE
# preemption, Slurm); a writer call running 10 s into it is abandoned so the rest get written.
_SIGNAL_FLUSH_S = 25.0
_SIGNAL_DEADLINE_S = 10.0
# Before a handler of the program's own (set a flag, save a checkpoint, exit), the flush
# takes at most this long, leaving that handler the grace period; `close()` writes the rest.
_SIGNAL_FLUSH_BEFORE_OWN_S = 2.0
_signal_end: float | None = None  # while `_on_signal` flushes: when its flush must end


class MetricsManager:
    """Writes T5X-style metric summaries from a training or evaluation loop.

    Args:
      name: the run's name, e.g. "train" or "eval/glue"; summaries go to
        `<summary_dir>/<name>`. It must stay inside `summary_dir` (no `..`, not absolute).
      summary_dir: root of the experiment's summaries; None (or "", as in T5X) writes no files.
      writer_factory: `writer_factory(logdir)` returns the writer(s); called once, on process
        0 only. A `writers.MultiWriter`, a list or a dict of writers is unpacked so each
        writer is isolated, a `MultiWriter` among them too (its writers keep their names;
        one taken is `outer/inner`). Defaults to `writers.create_default_writer` (console +
        TensorBoard + JSONL). Use `gin_utils.configured(MetricsManager)` to apply gin bindings.
      clock: returns seconds; times the windows (default `time.perf_counter`). A summary
        call's own duration, which the next window counts, is read with `time.perf_counter`.
        A window over which it does not advance (or goes back) takes 0 s: its rates are inf.
      max_pending: most jobs waiting behind the running one; a call blocks while the worker
        is this far behind (back-pressure: nothing is dropped).
      on_error: "warn" (log, count, keep training) or "raise" (T5X: the summary's future
        fails and the next call raises `MetricsManagerError`, after queueing its own work).
      writer_deadline_s: a writer call running longer is abandoned and its writer
        quarantined; None waits forever.
      max_writer_failures: a writer whose calls all fail in this many writes in a row is
        quarantined (a method raising `NotImplementedError` is simply not called again).
      quarantine_s: a quarantined writer is tried again after this long (a hung one, once its
        call has returned): a write that goes through ends the quarantine. None: for good.
      resume_step: the step a restored checkpoint resumes from (an int, or the restored
        scalar `state.step`): the writers drop the values an earlier run wrote after it
        (TensorBoard `purge_step`, JSONL rewrite).
      nonfinite: what a NaN or infinite scalar in a summary or `write_scalar(s)` does (a
        float past float64's range, a long double 1e4000 or a Fraction, is written as inf,
        as TensorBoard stores it, and counts as one):
        "ignore", "warn" (log once per key) or "stop" (a later call raises
        `MetricsManagerError` naming the step and keys: the next one once the worker has
        checked the values, at the latest `close()`). Summaries are checked on every
        process, `write_scalar(s)` values only where there are writers (process 0);
        a summary's `system/*`, sampled on process 0 alone, is only warned of (a key of
        the loop's own under `system/` is checked as any other).
      system_metrics: write `system/*` (CPU, memory, device memory, GPU) with summaries at
        most once per `system_interval_s`: the mean and `/max` of samples taken every second
        (or every `system_interval_s` where that is shorter, no more often than every 0.1 s).
      system_interval_s: least time between two summaries that write `system/*`.
      uptime: add `timing/uptime` to each metrics summary, as T5X's trainer does: seconds from
        this manager's creation to the `write_metrics_summary` call (on `clock`). A summary
        metric written under that key (a Collection `timing`'s `uptime` too) replaces it; a
        `write_scalars` of it is refused.
      flops_per_step: FLOPs of one train step over all devices (`step_flops`); enables
        `perf/tflops_per_second` and, with a known peak, `perf/mfu` (0 for 0, as
        `step_flops` counts a step without arithmetic).
      peak_flops_per_device: override of the devices' peak FLOP/s for `perf/mfu`.
      num_devices: devices the train step runs on, for `perf/*_per_device` and `perf/mfu`
        (default `jax.device_count()`).
      handle_signals: flush on SIGTERM/SIGINT (within 25 s, or 2 s before a handler of the
        program's own; a writer call running 10 s into it is abandoned, a writer whose calls
        took 10 s of it is set aside) before the previous handler runs; close the writers
        instead where that is the default, which ends the process. A repeated signal keeps
        the first one's bounds. A signal the program ignores (SIG_IGN) gets no handler: it
        ends nothing, and the programs the process starts keep ignoring it. Python installs
        handlers only from the main thread: a manager made on another thread is flushed by
        one made on the main thread, else at `close()` and exit. False: neither installs a
        handler nor is flushed by another manager's.
        SIGTERM is left to JAX's preemption service where `jax.distributed` runs one: the
        loop stops at `reached_preemption_sync_point`, and `close()` writes every summary.

    Raises:
      TypeError, ValueError: every bad argument, listed in one message; a summary dir already
        written by another open manager.

    Example:
      >>> import jax.numpy as jnp
      >>> import writers
      >>> from metrics_manager.metrics import Sum
      >>> with MetricsManager("train", writer_factory=lambda d: writers.NoopWriter()) as m:
      ...   m.start_duration_timer()
      ...   summary = m.write_metrics_summary({"loss": Sum(jnp.float32(4.0))}, 2, 2).result()
      >>> float(summary["loss"].value)
      4.0
    """

    def __init__(
        self,
        name: str,
        summary_dir: str | os.PathLike[str] | None = None,
        *,
        writer_factory: WriterFactory | None = None,
        clock: timer.Clock | None = None,
        max_pending: int = 16,
        on_error: Literal["warn", "raise"] = "warn",
        writer_deadline_s: float | None = 60.0,
        max_writer_failures: int = 10,
        quarantine_s: float | None = 300.0,
        resume_step: int | None = None,
        nonfinite: Literal["ignore", "warn", "stop"] = "warn",
        system_metrics: bool = False,
        system_interval_s: float = 10.0,
        uptime: bool = False,
        flops_per_step: float | None = None,
        peak_flops_per_device: float | None = None,
        num_devices: int | None = None,
        handle_signals: bool = True,
    ) -> None:
        problems = _Problems("MetricsManager")
        if not isinstance(name, str):
            problems.type_problem(f"name must be a str such as 'train', got {name!r}")
        elif not name.strip("/ "):
            problems.value_problem(
                f"name must be a non-empty run name such as 'train' or 'eval/<task>', got {name!r}"
            )
        elif os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
            kind = "absolute" if os.path.isabs(name) else "a path through '..'"
            problems.value_problem(
                f"name {name!r} is {kind}, which can write outside summary_dir; use a relative "
                "name without '..', such as 'eval/my_task'"
            )
        if summary_dir is not None and not isinstance(summary_dir, str | os.PathLike):
            problems.type_problem(f"summary_dir must be a path or None, got {summary_dir!r}")
        elif problem := _checks.url_problem(summary_dir, "summary_dir"):
            problems.value_problem(problem)
        for arg, value in (("writer_factory", writer_factory), ("clock", clock)):
            if value is not None and not callable(value):
                hint = "; in gin write a reference, @writers.JsonlWriter, not a str" * (
                    isinstance(value, str)
                )
                if arg == "writer_factory" and callable(getattr(value, "write_scalars", None)):
                    # `@writers.create_default_writer()` in gin: called once, at parsing.
                    hint = (
                        "; that is a writer, not a factory making one in each manager's "
                        "directory: in gin drop the (), @writers.create_default_writer; in "
                        "Python pass lambda logdir: <your writer(s)>"
                    )
                problems.type_problem(f"{arg} must be callable, got {value!r}{hint}")
        if writer_factory is None and hasattr(self, "_create_writer"):  # T5X's writer hook
            problems.type_problem(
                f"{type(self).__name__} overrides _create_writer(name, summary_dir), T5X's hook "
                "for the writer, which MetricsManager never calls (the default writers would "
                "be used); pass writer_factory=lambda logdir: <your writer(s)> instead: it "
                "gets <summary_dir>/<name>, on process 0"
            )
        problems.integer("max_pending", max_pending, minimum=1, gin=True)
        problems.integer("max_writer_failures", max_writer_failures, minimum=1, gin=True)
        if isinstance(resume_step, jax.Array):
            if resume_step.shape == () and resume_step.dtype.kind in "iu":  # a restored step
                resume_step = int(resume_step)  # read once, here
            else:  # not the loop's "keep a host-side counter": a restored step is read once
                problems.type_problem(
                    f"resume_step must be an int or a restored integer state.step, got "
                    f"{resume_step!r}; pass the checkpoint's step as an int (of a step kept "
                    "per device, one device's: int(state.step[0]))"
                )
        if resume_step is not None and not isinstance(resume_step, jax.Array):
            problems.integer("resume_step", resume_step, minimum=0, gin=True)
        if num_devices is not None:
            problems.integer("num_devices", num_devices, minimum=1, gin=True)
        problems.choice("on_error", on_error, ("warn", "raise"))
        problems.choice("nonfinite", nonfinite, ("ignore", "warn", "stop"))
        flags = dict(uptime=uptime, system_metrics=system_metrics, handle_signals=handle_signals)
        for arg, flag in flags.items():
            if not isinstance(flag, bool):
                hint = "; in gin write True or False, without quotes" * isinstance(flag, str)
                problems.type_problem(f"{arg} must be True or False, got {flag!r}{hint}")
        settings = dict(writer_deadline_s=writer_deadline_s, quarantine_s=quarantine_s)
        settings |= dict(flops_per_step=flops_per_step, peak_flops_per_device=peak_flops_per_device)
        settings |= dict(system_interval_s=system_interval_s)
        # What each number counts, and an example of one (a flops_per_step of '2e12' was
        # asked for "seconds or units", with "in gin write 30.0").
        units = dict(writer_deadline_s=("seconds", "60.0"), quarantine_s=("seconds", "300.0"))
        units |= dict(
            flops_per_step=("FLOPs", "2.5e12"), peak_flops_per_device=("FLOP/s", "9.89e14")
        )
        units |= dict(system_interval_s=("seconds", "10.0"))
        for arg, number in settings.items():
            if number is None:
                continue
            if isinstance(number, bool) or not isinstance(number, numbers.Real):
                unit, example = units[arg]
                hint = "; in gin write the number without quotes" * isinstance(number, str)
                problems.type_problem(
                    f"{arg} must be a number of {unit} such as {example}, got {number!r} "
                    f"({type(number).__name__}){hint}"
                )
            # flops_per_step may be 0, as perf_values takes it: step_flops' count of a copy.
            elif not 0 <= float(number) < math.inf or (number == 0 and arg != "flops_per_step"):
                never = "; None: never" if arg in ("writer_deadline_s", "quarantine_s") else ""
                least = ">= 0" if arg == "flops_per_step" else "> 0"
                problems.value_problem(f"{arg} must be {least} and finite, got {number}{never}")
        problems.raise_if_any()
        self.name = name
        # "" writes no files either, as T5X's `os.path.join(summary_dir, name) if summary_dir`.
        root = "" if summary_dir is None else os.fspath(summary_dir)
        self.summary_dir = os.path.join(root, name) if root else None
        self._on_error, self._nonfinite = on_error, nonfinite
        self._clock: timer.Clock = clock or time.perf_counter
        self._real_clock = self._clock is time.perf_counter  # a given clock may be scripted
        self._created = self._clock() if uptime else None
        self._failures = Failures(f"MetricsManager {name!r}", raise_all=on_error == "raise")
        self._closed = self._close_queued = self._close_done = False
        # Re-entrant: a signal handler's close() runs on the thread it interrupted, which may
        # hold it (a close waiting for a queue slot): it waited forever there, as did the process.
        self._close_lock = threading.RLock()
        self._window_open: str | None = None  # the name of the thread that opened it
        self._window_taken: tuple[str, str] | None = None  # (opener, summary's thread) differing
        self._window_start: float | None = None  # worker-side state
        self._start_failed = False  # the last start_duration_timer's wait raised
        self._window_end = -math.inf  # worker-side: when the last summary's metrics were ready
        # Worker-side: when the last device value the worker waited for became ready (a
        # `write_scalar(loss)` before a summary): the loop's later outputs are ready no sooner.
        self._seen_ready = -math.inf
        self._summary_cost = 0.0  # caller-side: the last write_metrics_summary call's own time
        self._timer_returned = -math.inf  # caller-side: when start_duration_timer last returned
        self._last_step: int | None = None
        self._warned_order = False
        self._resumed_from = resume_step  # as passed: _resume_step is cleared once warned of
        self._resume_step: int | None = None  # until warned; set below where an earlier run is
        # The keys the run before wrote at `resume_step`, read from the rewritten JSONL log;
        # None: unknown (no log rewritten here, a URL).
        self._resume_keys: frozenset[str] | None = None
        self._keys_checked: tuple[Any, ...] = ()
        self._uptime = False  # whether the checked metrics leave `timing/uptime` to the manager
        self._host_fields = False  # the checked metrics have NumPy fields
        self._host_numbers = False  # they have leaves that are no JAX arrays
        self._made: Any = None
        self._monitor: Any = None
        named: dict[str, Any] = {}
        self._pid = os.getpid()  # a forked child (a data-loader worker) has no worker thread
        # Checked on every process, so a refusal stops each alike (process 1 went on to wait
        # in its next collective for the one that stopped).
        factory, factory_kwargs = _factory_and_kwargs(name, writer_factory, resume_step)
        self._dir = _claim_dir(name, self.summary_dir)
        if jax.process_index() == 0:
            log = _log_state(self._dir, resume_step)
            # A fresh directory holds no run before whose step `resume_step` a write repeats
            # (a new run that passes its initial state's step 0, as T5X's config write does).
            self._resume_step = resume_step if _may_hold_a_run(self._dir) else None
            try:
                self._made, named = _make_writers(name, self.summary_dir, factory, factory_kwargs)
            except BaseException:
                self._release_dir()
                raise
            if self._resume_step is not None and log is not None and self._dir is not None:
                if _log_state(self._dir, resume_step) != log:  # rewritten: steps <= S alone
                    self._resume_keys = _keys_at_step(self._dir, self._resume_step)
            if log is not None and _log_state(self._dir, resume_step) == log:
                _LOG.warning(
                    "MetricsManager %r: resume_step=%d, but no writer of this set rewrote "
                    "%s/metrics.jsonl, which keeps the earlier run's steps after %d (and "
                    "writers.plot reads it before the event files). Remove it, or keep the "
                    "JSONL writer in the set.",
                    name,
                    resume_step,
                    self._dir,
                    resume_step,
                )
            if system_metrics:
                # Sampled between summaries: each system/* write is the mean and max of its
                # interval's samples, not of one.
                self._monitor = SystemMonitor(interval_s=min(1.0, max(system_interval_s, 0.1)))
        self._fanout = Fanout(
            named,
            self._failures,
            deadline_s=writer_deadline_s,
            max_failures=max_writer_failures,
            quarantine_s=math.inf if quarantine_s is None else quarantine_s,
            fail_summary=on_error == "raise",
        )
        self._reserved = {k: n for n, w in named.items() for k in getattr(w, "reserved_keys", ())}
        # The manager's own keys in each summary: a metric of the loop's under them would be
        # replaced, or replace them, in some summaries and not others.
        self._own_prefixes: dict[str, str] = {}
        if flops_per_step is not None:
            self._own_prefixes["perf/"] = "flops_per_step"
        if system_metrics:
            self._own_prefixes["system/"] = "system_metrics=True"
        self._named = named
        perf = None
        if flops_per_step is not None:
            perf = functools.partial(
                perf_values,
                flops_per_step,
                num_devices=num_devices or jax.device_count(),
                peak_flops_per_device=peak_flops_per_device,
            )
        self._summarizer = Summarizer(
            self._failures,
            nonfinite=nonfinite,
            perf=perf,
            monitor=self._monitor,
            system_interval_s=system_interval_s,
        )
        self._handles_signals = bool(handle_signals)  # False: not flushed by another's handler
        self._worker = OrderedWorker(
            f"MetricsManager[{name}]",
            max_pending=max_pending,
            on_stuck=self._stuck,
            on_error=self._job_failed,
        )
        _OPEN.add(self)
        # Registered after the writers' own hooks, so it runs first (atexit is LIFO): a manager
        # never closed drains its queue into open writers before they close, and its worker
        # stops before the interpreter does (a daemon thread inside JAX then aborts it).
        self._at_exit = close_at_exit(self, f"MetricsManager {name!r}")
        if handle_signals and threading.current_thread() is threading.main_thread():
            for signum in _signals_to_handle():
                current = signal.getsignal(signum)
                # Again where the program put the default back between runs (a sweep); not
                # over a handler of its own (it may call this one), nor over SIG_IGN: an
                # ignored signal ends nothing, and a handler in its place would be the default
                # again in every program the process starts (`exec` resets it), where a shell
                # ignores Ctrl-C for a background job (`python train.py &`) and its children.
                if current == signal.SIG_IGN:
                    continue
                if signum not in _PREVIOUS_HANDLERS or current in _DEFAULTS:
                    _PREVIOUS_HANDLERS[signum] = current
                    signal.signal(signum, _on_signal)

    @property
    def on_error(self) -> str:
        """The `on_error` policy, fixed at construction."""
        return self._on_error

    @property
    def nonfinite(self) -> str:
        """The `nonfinite` policy, fixed at construction."""
        return self._nonfinite

    @property
    def writes(self) -> bool:
        """Whether this process writes (only `jax.process_index() == 0` does)."""
        return bool(self._fanout.states)

    @property
    def writers(self) -> dict[str, Any]:
        """The writers by name (empty on processes that do not write)."""
        return {n: s.writer for n, s in self._fanout.states.items()}

    @property
    def writer(self) -> Any:
        """What `writer_factory` returned, or None on processes that do not write."""
        return self._made

    @property
    def summary_writer(self) -> Any:
        """T5X's name for `writer`, and as in T5X an empty `writers.MultiWriter` on processes
        that do not write. Calls on it bypass the manager's worker and isolation (and race its
        thread): prefer the manager's own `write_*` methods."""
        return writers.MultiWriter([]) if self._made is None else self._made

    @property
    def closed(self) -> bool:
        """Whether `close()` has been called."""
        return self._closed

    @property
    def errors(self) -> list[Failure]:
        """Background failures so far, oldest first (the last 1,000)."""
        return self._failures.recent()

    def health(self) -> dict[str, Any]:
        """Per writer: failures, why it is quarantined (or None), the writes skipped meanwhile,
        why its timed flush is failing (or None: an upload or tracker send retried while
        storage is down, the values kept in memory), and the methods it does not implement
        (`NotImplementedError`: not called again); and the total failure count."""
        return {"failures": self._failures.count, "writers": self._fanout.health()}

    def start_duration_timer(self, block_on: Any = ()) -> None:
        """Opens a summary window that starts when `block_on` (the train state) is ready.

        Returns at once; the worker waits. When the state is already ready (or donated) by
        the time the worker looks, the window starts at this call, less the time the summary
        call before it took (the loop's own cost, which a summary every step makes large), or,
        if later, when the summary before it was ready (the same step's outputs when this call
        follows it).
        """
        self._check_usable("start_duration_timer")
        called = self._clock()
        cost, self._summary_cost = self._summary_cost, 0.0
        self._window_open = threading.current_thread().name

        def start(_: Job) -> None:  # see _ready_time: no earlier than the summary before
            earliest = max(called - cost, self._window_end, self._seen_ready)
            self._start_failed = True  # until the wait returns: its error is recorded
            self._window_start = _ready_time(block_on, earliest, self._clock)
            self._start_failed = False

        self._worker.post([("start_duration_timer", start, None)])
        self._failures.raise_fatal()  # after queueing: the call's own work is not lost
        self._timer_returned = time.perf_counter()  # not `_call_clock`, which tests script

    def write_metrics_summary(
        self, metrics: Any, step: int, num_steps: int
    ) -> concurrent.futures.Future[Mapping[str, clu.values.Value]]:
        """Summarizes and writes `metrics` in the background; returns a future at once.

        Args:
          metrics: name -> CLU metric (merged on the device), a `PackedMetrics`, a CLU
            `Collection` (its fields are the names), or NNX metrics. Device fields are
            read by the worker; NumPy fields are copied now (the loop may reset them).
          step: the step to write at (0 <= step < 2**63).
          num_steps: train steps in the window (>= 1).

        Returns:
          A future of name -> `clu.values.Value` (the same on every process, but `system/*`
          on process 0 alone, which samples its host). It fails when
          the summary cannot be computed, and under `on_error="raise"` when a writer fails.
          Cancelled before the worker starts the summary, it skips that summary.

        Raises:
          TypeError, ValueError: bad metrics, keys or steps (all listed; nothing queued).
          MetricsManagerError: under "raise", an earlier background failure; under
            nonfinite="stop", an earlier non-finite value. This call's summary is queued
            first, so it is still written.
          RuntimeError: the manager is closed.
        """
        opened = time.perf_counter() - self._timer_returned  # no train step between: tiny
        entered = _call_clock()
        self._check_usable("write_metrics_summary")
        called = self._clock()
        problems = _Problems("MetricsManager.write_metrics_summary")
        ready: dict[str, Any] = {}
        if not isinstance(metrics, PackedMetrics):
            metrics, ready = _split_metrics(metrics, problems)
            for key, value in ready.items():  # as write_scalars: a non-number refused now
                if isinstance(value, clu.values.Scalar) and (
                    err := _checks.scalar_problem(key, value.value)
                ):
                    problems.add(type(err), str(err))
                    continue
                if isinstance(value, clu.values.Text):
                    _checks.collect_texts({key: value.value}, problems)
                elif isinstance(value, clu.values.HyperParam):  # as write_hparams takes it
                    _checks.flat_hparams({key: value.value}, problems)
                    ready[key] = dataclasses.replace(value, value=_checks.copied(value.value))
                elif isinstance(value, clu.values.Summary):  # as write_summaries checks it
                    try:
                        _checks.check_metadata(value.metadata, f"summary {key!r}")
                    except TypeError as refused:
                        problems.add(TypeError, str(refused))
                    # Read with the summary's other values: it failed them all, on every process.
                    if problem := _checks.sharded_problem("summary", key, value.value):
                        problems.value_problem(problem)
                elif kind := _READY_KINDS.get(type(value)):  # as write_images checks it
                    _checks.check_shapes(kind, {key: value.value}, problems)
                    if kind == "histogram":
                        _checks.check_buckets({key: value.num_buckets}, problems, {key: 0})
                    elif kind == "audio":
                        if err := _checks.sample_rate_problem(value.sample_rate):
                            problems.add(type(err), f"audio {key!r}: {err}")
                        elif p := _checks.byte_rate_problem(value.sample_rate, {key: value.value}):
                            problems.value_problem(p)
                if isinstance(array := getattr(value, "value", None), np.ndarray):
                    ready[key] = dataclasses.replace(value, value=array.copy())  # as write_images
        step = problems.step("step", step)
        num_steps = problems.integer("num_steps", num_steps, minimum=1)
        keys = (*metrics, *ready)
        # A loop sends the same metrics every time: check once, and again when a key, a
        # metric's type or settings, or a leaf's type, shape or dtype changes (~20 us for 30).
        seen = (keys, _signature(metrics), tuple(map(type, ready.values())))
        uptime, fresh = self._uptime, seen != self._keys_checked
        if fresh:  # the manager's uptime, unless a metric writes its key (a Collection's field)
            written = _written_keys(metrics, ready)
            uptime = _UPTIME not in written
        if uptime and self._created is not None:
            ready = {**ready, _UPTIME: clu.values.Scalar(called - self._created)}
            keys = (*keys, _UPTIME)
        if fresh:
            # By the call each key's value goes to: a Text's key is an MLflow artifact path,
            # not a metric name. Metrics to compute are taken as scalars (almost all are),
            # under the keys they write (a Collection 'c' writes 'c/<name>').
            calls: dict[str, list[str]] = {"write_scalars": _written_keys(metrics, {})}
            for call, kwargs in writers.group_values(ready, skipped={}):  # write_values' routing
                calls.setdefault(call, []).extend(next(iter(kwargs.values())))  # the values
            problems.keys(keys, self._keys_refused(step, calls))
            problems.one_window(metrics)
            problems.not_pytrees(metrics)
            problems.not_numbers(metrics)
            problems.not_scalars(metrics)
            problems.across_processes(metrics)
            problems.written_twice(written)
            problems.own_keys(written, self._own_prefixes)
            # NumPy fields (an eval summed on the host) are read on the worker, and a loop
            # resets them in place after the call: copied now, as write_images copies.
            self._host_fields = any(issubclass(kind, np.ndarray) for kind, *_ in seen[1][1])
            # Host numbers JAX may change (an int64 past 2**31): looked at in each summary.
            self._host_numbers = any(not issubclass(kind, jax.Array) for kind, *_ in seen[1][1])
        problems.raise_if_any()
        self._keys_checked, self._uptime = seen, uptime
        host_numbers = self._host_numbers
        if self._host_fields:
            metrics = jax.tree.map(lambda x: x.copy() if isinstance(x, np.ndarray) else x, metrics)
        self._check_order(step, lambda: _written_keys(metrics, ready))
        window, self._window_open = self._window_open, None
        no_window, thread = "", threading.current_thread().name
        # A window opened on this thread just before this call (`_NO_STEP_S`: no train step
        # dispatched between) times no step; the summarizer warns where its keys use it.
        no_step = opened if window == thread and opened < _NO_STEP_S and self._real_clock else None
        if window is not None:
            self._window_taken = (window, thread) if window != thread else None
        elif self._window_taken and self._window_taken[0] == thread:
            no_window = (
                f"; the window thread {thread!r} opened last was ended by a summary from "
                f"thread {self._window_taken[1]!r} (a manager has one window, as in T5X): give "
                "that thread a MetricsManager of its own"
            )
        block_on = metrics.buffers if isinstance(metrics, PackedMetrics) else metrics
        # Computing at the call (one array: a step's outputs are ready together): the window
        # ends after it, no sooner than a device value the worker waited for (a step's loss).
        computing = not timer.settled(_first_array(metrics))
        if ready:  # a plain device value (the step's `loss`) ends the window too
            block_on = (block_on, [getattr(v, "value", None) for v in ready.values()])

        def prepare(job: Job) -> None:
            job.state["step"], job.state["keys"] = step, keys  # for `_stuck`
            start, self._window_start = self._window_start, None
            why, failed_start, self._start_failed = no_window, self._start_failed, False
            if start is None and failed_start and window is not None:
                why = (
                    "; start_duration_timer was called, but waiting for its block_on failed "
                    "(manager.errors, source 'start_duration_timer')"
                )
            try:
                earliest = max(called, self._seen_ready) if computing else called
                end = self._window_end = _ready_time(block_on, earliest, self._clock, start)
                # A clock that did not advance (coarse, or stepped back): a 0 s window, whose
                # rates are inf (NaN for 0 steps), not the 1e9 steps/s of a made-up 1 ns.
                duration = None if window is None or start is None else max(end - start, 0.0)
                # Its own failures: one another thread records meanwhile (a key refused at a
                # call, process 0 alone) failed this summary's future on that process alone.
                self._summarizer.recorded = None
                summary = self._summarizer.values(
                    metrics, ready, step, num_steps, duration, why, no_step, host_numbers
                )
                if fresh or any(self._summarizer.refused.values()):
                    self._refuse_computed(step, summary)
                calls = self._summarizer.calls(step, summary)
                if "abandoned" not in job.state:  # past a signal's bound the job went on
                    job.result, job.state["calls"] = summary, calls
                if self._on_error == "raise" and self._summarizer.recorded:
                    job.state["failure"] = self._summarizer.recorded  # a metric's: T5X's fails
            except Exception as err:
                self._failures.record(Failure("summary", step, keys, err))
                raise

        future = self._worker.submit(
            [
                ("summary", prepare, None),
                *self._fanout.pieces(step, None),
                ("result", self._result, None),
            ]
        )
        self._failures.raise_fatal()  # after queueing: this summary is still written
        self._summary_cost = _call_clock() - entered
        return future

    def write_scalar(self, key: str, val: Any, step: int) -> None:
        """Writes one scalar at `step`, in call order (in the background), as `write_scalars`."""
        hint = ""
        # write_scalar(key, step, val), CLU's order: an int value and a step that is no int
        # (an integer device array is a device step, T5X's `state.step`: its own hint).
        integral = np.issubdtype(getattr(step, "dtype", np.float64), np.integer)
        if _is_int(val) and not _is_int(step) and not integral:
            hint = (
                "; the arguments are (key, val, step), as in T5X's write_scalar: if "
                f"{int(val)} is the step, call write_scalar({key!r}, value, {int(val)})"
            )
        self._host_write("write_scalar", "scalars", step, {key: val}, step_hint=hint)

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        """Writes numbers at `step`, in call order; checked now, and converted now unless a
        device is still computing them (the worker reads those: the loop does not wait)."""
        self._host_write("write_scalars", "scalars", step, scalars)

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Writes texts (markdown in TensorBoard) at `step`, in call order."""
        self._host_write("write_texts", "texts", step, texts)

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Writes the run's hyperparameters (no step), in call order; values are copied now
        (the program may change its config after the call)."""
        self._host_write("write_hparams", "hparams", None, hparams)

    def write_images(self, step: int, images: Mapping[str, Any]) -> None:
        """Writes images (`[H, W, C]` or `[N, H, W, C]`, C in 1, 3, 4; floats in [0, 1]) at
        `step`, in call order; shapes are checked now, device arrays read by the worker
        (NumPy arrays are copied now: the caller may refill them)."""
        self._host_write("write_images", "images", step, images)

    def write_histograms(
        self, step: int, arrays: Mapping[str, Any], num_buckets: Mapping[str, int] | None = None
    ) -> None:
        """Writes the histogram of each array at `step` (`num_buckets` per key, 30 by
        default), in call order; shapes are checked now, device arrays read by the worker
        (NumPy arrays are copied now: the caller may refill them)."""
        self._host_write("write_histograms", "arrays", step, arrays, num_buckets=num_buckets)

    def flush(self, timeout: float | None = None) -> None:
        """Waits for every queued summary and write, then flushes every writer.

        Args:
          timeout: seconds to wait at most, for a slot in a full queue too (None: until done).

        Raises:
          TimeoutError: `timeout` passed first (what is queued still gets written after).
          TypeError: `timeout` is not a number; ValueError: it is negative or infinite.
          MetricsManagerError: under "raise", a background failure.
        """
        self._check_usable("flush")
        self._worker.refuse_own_thread("MetricsManager.flush()")
        number = isinstance(timeout, numbers.Real) and not isinstance(timeout, bool)
        if timeout is not None and not (number and 0 <= timeout < math.inf):
            raise (ValueError if number else TypeError)(
                f"MetricsManager.flush: timeout must be a number of seconds >= 0 or None "
                f"(wait for everything), got {timeout!r} ({type(timeout).__name__})"
            )
        self._to_all("flush", timeout)
        self._failures.raise_fatal()

    def close(self) -> None:
        """Finishes queued work, closes every writer and stops the worker; idempotent.

        Returns within about `writer_deadline_s` + 5 s even when a writer hangs (that writer
        is named in the log and in `errors`); each further writer hanging in its own close
        (storage that went down just before) adds up to `writer_deadline_s`.

        Called again after a close whose writers' close raised (storage down: what they
        buffered was not uploaded), it closes those writers again, under the same bounds:
        once storage is back, their values are uploaded. After a close that went through, it
        does nothing.

        Raises:
          MetricsManagerError: under "raise", a background failure not yet raised.
        """
        if self._pid != os.getpid():
            return  # a forked child's copy: the parent closes its writers
        if self._close_done:
            self._close_again()
            return
        self._worker.refuse_own_thread("MetricsManager.close()")
        self._closed = True  # no new work from here on
        # An exception while waiting (a signal handler's SystemExit, Ctrl-C) leaves the exit
        # hook registered: at exit, close() goes on draining what is queued.
        with self._close_lock:  # two threads closing: one close job
            if not self._close_queued:
                pieces = self._fanout.pieces(None, [("close", {})], closing=True)
                try:
                    self._worker.post(pieces, last=True)  # a call racing this one: refused
                except RuntimeError:
                    if not self._close_done:
                        raise
                    return  # a signal handler's close() ran inside this wait, and closed
                self._close_queued = True
        self._worker.drain()
        self._close_done = True
        atexit.unregister(self._at_exit)
        try:
            if not self._worker.close(5.0):
                _LOG.error("MetricsManager %r: the worker did not stop in time", self.name)
        finally:
            _OPEN.discard(self)  # only now: a signal during close() waits for it to finish
            if self._monitor is not None:
                self._monitor.close()
            self._release_dir()
        if self._failures.count:
            _LOG.warning(
                "MetricsManager %r closed after %d background failure(s); last: %s",
                self.name,
                self._failures.count,
                self._failures.recent()[-1],
            )
        self._failures.raise_fatal()

    def _close_again(self) -> None:
        """Closes again the writers whose close raised in an earlier `close()`, each bounded
        by `writer_deadline_s` as there, on a worker of its own (the manager's has stopped).
        A second close() returned at once: steps 6 to 10 of 10, buffered when storage went
        down at the first, were lost though storage was back."""
        with self._close_lock:  # two threads closing again: one close each writer
            pieces = self._fanout.close_again()
        if not pieces:
            return
        worker = OrderedWorker(
            f"MetricsManager[{self.name}] close", on_stuck=self._stuck, on_error=self._job_failed
        )
        worker.post(pieces, last=True)
        worker.drain()
        if not worker.close(5.0):
            _LOG.error("MetricsManager %r: the worker did not stop in time", self.name)
        self._failures.raise_fatal()

    def _job_failed(self, label: str, job: Job, err: BaseException) -> None:
        """A posted job's failure (a state that start_duration_timer waits on whose
        computation failed): recorded, not only logged (then not in `errors`, nor raised
        under "raise")."""
        self._failures.record(Failure(label, job.state.get("step"), job.state.get("keys", ()), err))

    def __enter__(self) -> "MetricsManager":
        """The manager itself, refused at once when closed (not at the block's first write)."""
        self._check_usable("__enter__")
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        """Closes the manager; after the block raised, the tracker runs it closes end as
        failed (MLflow FAILED, W&B exit code 1), as a tracker writer's own `with` does: a
        loop that crashed ended its runs FINISHED, as if it had completed."""
        if exc is not None and not self._closed:
            for writer in self._named.values():
                if isinstance(writer, TrackerWriter):
                    writer._failed = True
        close_keeping_error(self.close, exc, f"MetricsManager {self.name!r}")

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("failed" if self._failures.fatal else "open")
        return f"MetricsManager(name={self.name!r}, summary_dir={self.summary_dir!r}, {state})"

    @classmethod
    def close_all(cls) -> None:
        """Closes every open manager of this process, as `close()` does each.

        For a manager whose reference was lost (made in a notebook cell or function that
        raised): it still holds its summary dir, so a new manager there is refused.

        Raises:
          MetricsManagerError: under "raise", the first manager's background failure not yet
            raised (every manager is closed first).
        """
        errors = []
        for manager in _open_managers():
            try:
                manager.close()
            except MetricsManagerError as err:
                errors.append(err)
        if errors:
            raise errors[0]

    def _release_dir(self) -> None:
        with _DIRS_LOCK:
            _DIRS.pop(self._dir or "", None)
            self._dir = None

    def _check_usable(self, method: str) -> None:
        if self._pid != os.getpid():
            raise RuntimeError(
                f"MetricsManager {self.name!r}: {method}() was called in a forked child of the "
                f"process that made it ({self._pid}), which alone writes through it (its "
                "worker thread is not in the child, and the child's values would reach the "
                "parent's files or be lost). Make a manager in the child, on a summary_dir of "
                "its own, or send the values to the parent."
            )
        if self._closed:
            raise RuntimeError(
                f"MetricsManager {self.name!r} is closed; {method}() needs an open manager."
            )
        if not _trace_state_clean():
            raise TypeError(
                f"MetricsManager.{method} was called while JAX traces a function (inside jit, "
                "grad, scan, ...): it would run once, at trace time, with tracers instead of "
                "values. Return the metrics from the step and call it from the Python loop."
            )

    def _check_order(self, step: int, keys: Callable[[], Iterable[str]]) -> None:
        """Warns of a step lower than the last this manager wrote, or of `resume_step`'s
        values written again (`keys`: what the call writes, asked only at `resume_step`)."""
        self._check_resumed(step, keys)
        last, self._last_step = self._last_step, step
        if last is not None and step < last and not self._warned_order:
            self._warned_order = True
            fix = "If the run resumed from a checkpoint, pass resume_step so earlier values "
            fix += "after it are dropped."
            if self._resumed_from is not None:  # passed already: it drops the run before's
                fix = (
                    f"resume_step={self._resumed_from}, passed to this manager, drops only what "
                    f"the run before wrote after step {self._resumed_from}, not this run's own "
                    f"steps: step {last} stays beside step {step}. If the run restored an "
                    "earlier checkpoint again, close this manager and make a new one with that "
                    "checkpoint's step as resume_step; otherwise check the steps the loop passes."
                )
            _LOG.warning(
                "MetricsManager %r: step %d comes after step %d. %s", self.name, step, last, fix
            )

    def _check_resumed(self, step: int | None, keys: Callable[[], Iterable[str]]) -> None:
        resumed = self._resume_step
        if resumed is not None and step == resumed:
            before = self._resume_keys
            if before is not None:
                # The run before's values at this step are known: only its keys written again
                # are there twice. Its others (the train summary at the checkpoint's step,
                # beside a config written at the start step, as T5X does) would be lost with
                # resume_step - 1, as no later write brings them back.
                again = sorted(before.intersection(keys()))
                if not again:
                    return
                self._resume_step = None  # once
                fix = (
                    f"pass resume_step={resumed - 1} if this run writes all of step {step} again "
                    f"(the run before's {sorted(before)} there are then dropped first)"
                    if resumed
                    else f"if this run writes all of step 0 again ({sorted(before)}), remove the "
                    "run's old summaries first (resume_step=0 keeps only step 0's)"
                )
                _LOG.warning(
                    "MetricsManager %r: step %d is resume_step, where the run before wrote %s, "
                    "kept by the writers: readers see them at step %d twice. Leave them out of "
                    "this write (the run before has them), or %s.",
                    self.name,
                    step,
                    again,
                    step,
                    fix,
                )
                return
            self._resume_step = None  # once
            fix = (
                f"pass resume_step={resumed - 1} so that the new values replace the old"
                if resumed
                else "remove the run's old summaries first (resume_step=0 keeps only step 0's)"
            )
            _LOG.warning(
                "MetricsManager %r: step %d is resume_step, whose values the writers keep from "
                "the run before (where it wrote them), so readers may see step %d twice. If the "
                "resumed run writes step %d again (an eval or config at the restored step), %s.",
                self.name,
                step,
                step,
                step,
                fix,
            )

    def _stuck(self, label: str, job: Job, cap: float | None) -> None:
        """The worker abandoned `label`'s piece of `job` (under its lock): a writer's call past
        its deadline, or, past a signal's bound, the summary's computation or a wait for device
        values, whose writers then get nothing and whose future fails (it resolved to None,
        recorded as a writer 'summary' quarantined)."""
        if label.startswith("writer "):
            self._fanout.stuck(label, cap, job)
            return
        bound = "" if cap is None else f"{cap:g} s, "
        values = label == "summary" or label.startswith("read ")  # not a window's start
        err = TimeoutError(
            f"{label} ran past {bound}the bound while flushing on a signal: abandoned"
            + (", and the writers get none of its values" if values else "")
        )
        failure = Failure(label, job.state.get("step"), job.state.get("keys", ()), err)
        job.state["abandoned"] = job.state["failure"] = failure
        self._failures.record(failure)

    def _result(self, job: Job) -> None:
        failure = job.state.get("failure")
        if failure is not None:
            raise MetricsManagerError(
                f"MetricsManager {self.name!r}: summary at step {failure.step}: {failure}"
            ) from failure.error

    def _host_write(
        self, method: str, arg: str, step: Any, values: Any, step_hint: str = "", **extra: Any
    ) -> None:
        self._check_usable(method)
        problems = _Problems(f"MetricsManager.{method}")
        # write_images({"img": x}, 20): the mapping came first. One problem naming the order,
        # not a second one for the step in the mapping's place.
        swapped = arg != "hparams" and isinstance(step, Mapping) and not isinstance(values, Mapping)
        if swapped:
            order = "step, arrays, num_buckets" if arg == "arrays" else f"step, {arg}"
            step_hint = f"; the arguments are ({order}), as in CLU's writers"
            if _is_int(values):
                step_hint += f": if {int(values)} is the step, call {method}({int(values)}, {arg})"
        step = None if arg == "hparams" else problems.step("step", step, hint=step_hint)
        if arg == "hparams":
            values = _checks.as_mapping(values)
        if not isinstance(values, Mapping) and not swapped:
            example = _MAPPING_EXAMPLES[arg]
            problems.type_problem(
                f"{arg} must be a mapping such as {example}, got {_brief(values)}"
            )
        values = dict(values) if isinstance(values, Mapping) else {}
        if arg == "hparams":  # its keys are checked flat; values copied: read on the worker
            values = {
                k: _checks.copied(v) for k, v in _checks.flat_hparams(values, problems).items()
            }
        call = "write_histograms" if arg == "arrays" else f"write_{arg}"  # write_scalar: -s
        problems.keys(values, self._keys_refused(step, {call: list(values)}))
        if step is not None:  # as a summary's: the manager's own perf/mfu at that step too
            problems.own_keys(values, self._own_prefixes)
            if self._created is not None and _UPTIME in values:  # a summary's replaces it
                problems.value_problem(
                    f"key {_UPTIME!r} is written by the manager itself with uptime=True, at "
                    "each summary's step: one would sit beside the other; rename yours, drop "
                    "uptime=True, or pass yours in the summary's metrics (where it replaces it)"
                )
        deferred: list[str] = []  # keys of device values still being computed: the worker reads
        if arg == "scalars":  # a ready device scalar is read now (under any transfer guard)
            with jax.transfer_guard_device_to_host("allow"):
                values = _checks.collect_numbers(values, problems, deferred)
        elif arg == "texts":
            values = _checks.collect_texts(values, problems)
        elif arg != "hparams":  # images, histograms: shapes now, values on the worker
            _checks.check_buckets(extra.get("num_buckets"), problems, values)  # None: nothing
            values.update(_checks.check_shapes(_ARRAY_KINDS[arg], values, problems))
            deferred = list(values)
        problems.raise_if_any()
        # Left out only once checked: process 1, which has no writers to refuse them, raised
        # on a bad value under such a key, and process 0 went on to wait for it.
        if refused := self._refused(call).keys() & values.keys():
            values = {k: v for k, v in values.items() if k not in refused}
            deferred = [k for k in deferred if k not in refused]
        if step is not None:  # hparams have none
            self._check_order(step, values.keys)
        if arg in _ARRAY_KINDS and self._fanout.states:  # read on the worker: a loop may
            # refill its NumPy buffer once this call returns
            values = {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in values.items()}
        if self._fanout.states and not deferred:
            checked = values if arg == "hparams" else _checks.Checked(values)
            pieces = self._fanout.pieces(step, [(call, {arg: checked})])
            if arg == "scalars" and self._nonfinite != "ignore":  # the policy, on the worker
                pieces.insert(0, ("nonfinite", lambda _: self._check_finite(step, values), None))
            self._worker.post(pieces)
        elif self._fanout.states:

            def read(job: Job) -> None:
                # For `_stuck`: abandoned, the call's ready values are lost with the rest.
                job.state["step"], job.state["keys"] = step, tuple(values)
                arrays = [x for key in deferred for x in jax.tree.leaves(values[key])]
                failed = False
                if not all(map(timer.settled, arrays)):  # ready just now: no later output sooner
                    try:
                        timer.block_until_ready_or_deleted(arrays)  # the reads below do not wait
                    except Exception:  # noqa: BLE001  (a computation failed: each key waits below)
                        failed = True
                    self._seen_ready = self._clock()
                for key in deferred:
                    try:
                        if failed:  # its own wait: a failed computation costs its key alone
                            timer.block_until_ready_or_deleted(values[key])
                        with jax.transfer_guard_device_to_host("allow"):
                            values[key] = _read_value(arg, key, values[key])
                    except Exception as err:  # noqa: BLE001  (costs that key, not the call)
                        del values[key]
                        self._failures.record(Failure(f"metric:{key}", step, (key,), err))
                if arg == "scalars":
                    self._check_finite(step, values)
                checked = _checks.Checked(values) if arg == "scalars" else values
                kwargs = dict(extra)
                if isinstance(buckets := kwargs.get("num_buckets"), Mapping):  # not a key left out
                    kwargs["num_buckets"] = {k: n for k, n in buckets.items() if k in values}
                if values and "abandoned" not in job.state:  # past a signal's bound: none
                    job.state["calls"] = [(call, {arg: checked, **kwargs})]

            self._worker.post([(f"read {arg}", read, None), *self._fanout.pieces(step, None)])
        self._failures.raise_fatal()  # after queueing: this call's values are still written

    def _keys_refused(
        self, step: int | None, calls: Mapping[str, Sequence[Any]], computed: bool = False
    ) -> str | None:
        """Why a writer would refuse some keys of `calls` (method -> keys), for the call to
        raise. With several processes (or `computed`: a summary's, on the worker) the keys
        are left out of the writes instead, and each recorded as a failure once: only process
        0 has writers, and its error alone left the others waiting in their next collective.
        A computed one in one process fails its summary under "raise", as a failed metric."""
        found = [p for call, ks in calls.items() if (p := self._key_problem(call, ks))]
        several = jax.process_count() > 1
        if not found or not (several or computed):
            return "; ".join(found) or None
        instead = (
            "Its metric computes this kind, known only once computed: the key is left out of "
            "these writes instead"
            if computed
            else "With several processes the key is left out of every write instead: process "
            "0 alone raising left the others waiting"
        )
        for call, keys in calls.items():
            refused = self._refused(call)
            for key in keys:
                if key not in refused and (problem := self._key_problem(call, [key])):
                    problem = problem.replace("nothing was written; ", "").rstrip(".")
                    refused[key] = ValueError(f"{problem}. {instead}.")
                    failure = Failure(f"metric:{key}", step, (key,), refused[key])
                    if several:  # not fatal under "raise" either: process 0 alone has it
                        self._failures.record(failure, fatal=False)
                    else:  # one process: the summary's own failed metric, as a NaN histogram
                        self._summarizer.recorded = failure
                        self._failures.record(failure)
        found = [  # what no single key explains is still refused at the call
            p
            for call, ks in calls.items()
            if (p := self._key_problem(call, [k for k in ks if k not in self._refused(call)]))
        ]
        return "; ".join(found) or None

    def _refuse_computed(self, step: int, summary: Mapping[str, Any]) -> None:
        """Leaves out a key from the kind of write its metric computes, known only now (the
        call checked metrics as scalars): a histogram, image or text under a key a writer
        refuses in that kind (an artifact path MLflow refuses, or one refused as a scalar with
        several processes) failed the whole call in that writer, the call's other keys too, at
        each summary. Checked when the summary's keys or types change."""
        found = {k: v for k, v in summary.items() if type(v) is not clu.values.Scalar}
        calls: dict[str, list[str]] = {}  # audios: a call per sample rate
        for call, kwargs in writers.group_values(found, skipped={}):
            if call != "write_scalars":  # checked as scalars at the call
                calls.setdefault(call, []).extend(next(iter(kwargs.values())))
        if calls:
            self._keys_refused(step, calls, computed=True)

    def _refused(self, call: str) -> dict[str, Exception]:
        """The keys left out of `call`'s writes."""
        return self._summarizer.refused[call]

    def _key_problem(self, method: str, keys: Any) -> str | None:
        """Why a writer would refuse some of `keys` (reserved or, for MLflow, invalid names)."""
        if not self._named or not all(isinstance(k, str) for k in keys):
            return None
        return keys_problem(self._named, method, keys, self._reserved)

    def _check_finite(self, step: int, scalars: Mapping[str, Any]) -> None:
        self._summarizer.check_finite(step, scalars, "passed to write_scalars at")

    def _to_all(self, method: str, timeout: float | None) -> None:
        end = None if timeout is None else time.monotonic() + timeout
        queued = False
        try:  # queueing waits while the queue is full: it counts against `timeout` too
            self._worker.post(self._fanout.pieces(None, [(method, {})]), timeout=timeout)
            queued = True
            done = self._worker.drain(None if end is None else max(end - time.monotonic(), 0.0))
        except TimeoutError:
            done = False
        if not done:
            what = f"summaries, writes, the {method}" if queued else "summaries, writes"
            raise TimeoutError(
                f"MetricsManager {self.name!r}: {method}() not done in {timeout:.3g} s; "
                f"{self._worker.backlog} job(s) ({what}) still queued"
            )


def _read_value(arg: str, key: str, value: Any) -> Any:
    """A deferred value, read on the worker (waiting for the device) and checked."""
    if arg == "scalars":
        return _checks.to_number(key, value)
    try:
        array = np.asarray(value)
    except Exception as err:  # JAX's bare "Array has been deleted with shape=..."
        if not getattr(value, "is_deleted", bool)():
            raise
        raise ValueError(_checks.donated_problem(f"{_ARRAY_KINDS[arg]} {key!r}")) from err
    if message := _checks.array_problem(_ARRAY_KINDS[arg], key, array):
        raise ValueError(message)
    return array


_MAPPING_EXAMPLES = {
    "scalars": "{'loss': value}",
    "texts": "{'note': 'text'}",
    "images": "{'samples': array}",
    "arrays": "{'weights': array}",
    "hparams": "{'lr': 0.1} (or a dataclass)",
}


def _brief(value: Any, keys: int = 8) -> str:
    """`value` for an error message, short: a mapping by its type and first `keys` keys, an
    array by its type, shape and dtype (never its values), anything else by a cut repr.

    Example:
      >>> _brief({"img": np.zeros((64, 64, 3))})
      "dict with keys ['img']"
      >>> _brief(np.zeros((64, 64, 3)))
      'ndarray of shape (64, 64, 3) and dtype float64'
      >>> _brief(0.5)
      '0.5 (float)'
    """
    if isinstance(value, Mapping):
        names = [repr(k) for k in itertools.islice(value, keys)]
        more = f", ... ({len(value)} keys)" if len(value) > keys else ""
        return f"{type(value).__name__} with keys [{', '.join(names)}{more}]"
    if getattr(value, "ndim", 0):  # a 0-d array reads as its value: Array(3, dtype=int32)
        return _checks.describe(value)
    text = repr(value)
    return f"{text if len(text) <= 60 else text[:57] + '...'} ({type(value).__name__})"


def _computed_brief(computed: Any) -> str:
    """What a traced compute() returned that is no array, for an error message: None, or a
    container by its type and keys or length (its leaves are shapes, not values)."""
    if computed is None:
        return "None"
    if isinstance(computed, Mapping):
        return f"a {_brief(computed)}"
    if isinstance(computed, list | tuple):
        return f"a {type(computed).__name__} of {len(computed)} values"
    return f"a {type(computed).__name__}"


def _is_int(value: Any) -> bool:
    """Whether `value` is an integer a step could be: a Python or NumPy int, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


class _Problems(Problems):
    """`Problems` with the checks of the manager's public calls."""

    def integer(
        self,
        what: str,
        value: Any,
        *,
        minimum: int,
        gin: bool = False,
        hint: str = "",
        fix: str = "",
    ) -> int:
        """`value` as an int, or a problem naming `what`, with `hint` after the usual one;
        `fix` for anything else that is not an integer (a bool, a str, None, 1.5, nan, a list,
        a dict, a float array) when there is no `hint`."""
        if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu":
            value = int(value)  # NumPy scalars are `numbers.Integral` already; 0-d arrays not
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            extra, hint = hint, ""
            if isinstance(value, jax.Array):
                hint = (
                    "; in the loop keep a host-side counter (step += 1): int(jax.Array) blocks it"
                )
                if np.issubdtype(value.dtype, np.integer) and value.ndim <= 1:  # no float cut
                    one = f"int({what})" if value.ndim == 0 else f"int({what}[0])"  # per device
                    hint += f"; for a one-off write outside it, pass {one}"
            elif isinstance(value, bool):  # int(True) is 1: no step or count the loop meant
                hint = "" if extra else fix
            elif (
                isinstance(value, numbers.Real)
                and math.isfinite(value)
                and float(value).is_integer()
            ):  # T5X: int(step)
                hint = f"; pass int({what})"
            elif gin and isinstance(value, str):
                hint = "; in gin write a number, without quotes"
            elif not extra:  # 1.5, nan, None, "3", [3], a dict, a float array
                hint = fix
            self.type_problem(f"{what} must be an int, got {_brief(value)}{hint}{extra}")
            return 0
        if int(value) < minimum:
            self.value_problem(f"{what} must be >= {minimum}, got {value}")
        return int(value)

    def step(self, what: str, value: Any, hint: str = "") -> int:
        """`value` as a step; a bool, a str or None is refused naming the counter to pass."""
        fix = (
            "; pass the loop's step counter as an int: a Python int counter, or "
            "int(state.step) on the host"
        )
        step = self.integer(what, value, minimum=0, hint=hint, fix=fix)
        if step >= _checks.MAX_STEP:
            self.value_problem(f"{what} must be below 2**63 (steps are int64), got {step}")
        return step

    def choice(self, what: str, value: Any, options: tuple[str, ...]) -> None:
        if value not in options:
            self.value_problem(f"{what} must be one of {list(options)}, got {value!r}")

    def one_window(self, metrics: Mapping[str, Any] | PackedMetrics) -> None:
        """Refuses a window per device (`jax.pmap`) or per member (`jax.vmap`)."""
        if isinstance(metrics, PackedMetrics):
            if problem := metrics.mapped_axis_problem():
                self.value_problem(f"metrics: {problem}")
        elif rows := {k: n for k, m in metrics.items() if (n := _rows_per_device(m))}:
            self.value_problem(
                f"metrics {sorted(rows)} hold one window per device ({max(rows.values())} "
                "rows, one on each device, as jax.pmap or a shard_map with out_specs=P(axis) "
                "returns them); merge the devices' windows first: "
                "metrics_manager.merge_windows(metrics) (as pieces of the same steps, right "
                "for every metric; a lax.psum of the fields in the step is right only for "
                "sums such as Sum and Average, not for Max, Min or MeanStd). Fields that are "
                "vectors sharded over as many devices as they have rows look the same: "
                "replicate them (jax.device_put(m, NamedSharding(mesh, P())))"
            )

    def across_processes(self, metrics: Mapping[str, Any] | PackedMetrics) -> None:
        """Refuses leaves sharded over processes: gathering them for the copy is a collective,
        which on the worker raced the loop's own and deadlocked a job (a per-row vector)."""
        if isinstance(metrics, PackedMetrics):
            return  # packed in the step: gathered there, in the loop's order
        if sharded := sorted(
            key
            for key, metric in metrics.items()
            if any(
                not getattr(x, "is_fully_addressable", True) and not x.is_fully_replicated
                for x in jax.tree.leaves(metric)
            )
        ):
            self.value_problem(
                f"metrics {sharded} hold arrays sharded over processes, which "
                "the manager would have to gather on its own thread (a collective out of the "
                "loop's order can deadlock the job); pack them in the step, where the gather "
                "runs with the step's own: running = merge_metrics(running, metrics) in the "
                "jitted step (not pack=False), or reduce them to replicated values there"
            )

    def not_pytrees(self, metrics: Mapping[str, Any] | PackedMetrics) -> None:
        """Refuses a metric JAX cannot flatten: it failed the whole summary on the worker."""
        if isinstance(metrics, PackedMetrics):
            return
        is_leaf = jax.tree_util.all_leaves
        if leaves := [f"{k!r} ({type(m).__name__})" for k, m in metrics.items() if is_leaf([m])]:
            self.type_problem(
                f"metrics {', '.join(leaves)} are not pytrees JAX can flatten: a subclass of a "
                "CLU metric needs its own @flax.struct.dataclass decorator"
            )

    def not_numbers(self, metrics: Mapping[str, Any] | PackedMetrics) -> None:
        """Refuses a metric field JAX cannot hold (a NumPy array of str, object or datetime,
        a str): sent through the device with the others, it failed the whole summary on the
        worker with JAX's "Error interpreting argument", every other key lost too."""
        if isinstance(metrics, PackedMetrics):
            return  # packed by JAX already
        bad = [
            f"{key!r}{jax.tree_util.keystr(path)} ({_checks.describe(leaf)})"
            for key, metric in metrics.items()
            for path, leaf in jax.tree_util.tree_flatten_with_path(metric)[0]
            if not _number_leaf(leaf)
        ]
        if bad:
            self.type_problem(
                f"metric fields {', '.join(bad)} are not numbers, which the summary computes "
                "with JAX; give metrics numeric fields (int, float or bool arrays or numbers), "
                "and write text with write_texts or clu.values.Text among the metrics"
            )

    def not_scalars(self, metrics: Mapping[str, Any] | PackedMetrics) -> None:
        """Refuses a metric written as a scalar whose compute() is not one (a T5X-style
        `Sum(x.sum(axis=0))`; None, a dict or a list): the worker dropped its key. compute()
        is traced, not run."""
        if isinstance(metrics, PackedMetrics):
            metrics = metrics.abstract()  # the same checks, from the layout
        members = {}
        for key, metric in metrics.items():
            if isinstance(metric, clu.metrics.Collection):  # its fields, under the keys written
                fields = metrics_lib.collection_fields(metric).items()
                members.update({f"{key}/{name}": m for name, m in fields})
            else:
                members[key] = metric
        shapes, checked, complex_, containers = {}, 0, [], {}
        for key, metric in members.items():
            if getattr(type(metric), "compute_value", None) is not clu.metrics.Metric.compute_value:
                continue  # its own: a Histogram, a MeanStdScalar, ...
            # A Time's duration (a Step's count, if unset) is set on the worker: placeholders
            # let compute() trace, or a vmapped StepsPerTime went unchecked and was written.
            if isinstance(metric, metrics_lib.Time) and metric.duration is None:
                metric = metric.replace(duration=1.0)
            if isinstance(metric, metrics_lib.Step) and metric.steps is None:
                metric = metric.replace(steps=1)
            try:
                computed = jax.eval_shape(type(metric).compute, metric)
            except Exception:  # noqa: BLE001 - host-side code: the worker says
                continue
            shape = getattr(computed, "shape", None)
            if shape is None:  # None, a dict, a list: the worker dropped its key
                containers[key] = _computed_brief(computed)
                continue
            if np.dtype(getattr(computed, "dtype", np.float32)).kind == "c":
                complex_.append(key)  # the worker left its key out of every summary
            checked += 1
            if shape is not None and math.prod(shape) != 1 and not _rows_per_device(metric):
                shapes[key] = tuple(shape)
        if shapes:
            leading = {shape[0] if shape else 0 for shape in shapes.values()}
            windows = (
                " If they are windows stacked by the step (a shard_map with out_specs=P(axis), "
                "a vmap), merge them first: merge_windows(metrics)."
                if len(shapes) == checked and len(leading) == 1 and 0 not in leading
                else ""
            )
            self.value_problem(
                f"metrics {sorted(shapes)} compute arrays of shapes {list(shapes.values())}, "
                "not scalars; reduce them in the step (Sum.from_model_output(x) sums every "
                "element of x), or write an array with write_histograms or "
                f"clu.values.Histogram(x) among the metrics.{windows}"
            )
        if complex_:
            self.type_problem(
                f"metrics {sorted(complex_)} compute complex numbers, which no writer stores; "
                "make them from real values in the step (abs(x) or x.real)"
            )
        if containers:
            listed = ", ".join(f"{k!r} ({containers[k]})" for k in sorted(containers))
            self.type_problem(
                f"compute() of metrics {listed} returns no number, which no writer stores; "
                "return a scalar array from it, and write several values as several metrics "
                "(one key each)"
            )

    def written_twice(self, written: list[str]) -> None:
        """Refuses two metrics that write one key (a Welford 'x' writes 'x/std' too)."""
        if len(set(written)) < len(written):
            twice = sorted({k for k in written if written.count(k) > 1})
            self.value_problem(
                f"metrics: keys {twice} would be written twice (a MeanStd or Welford 'x' also "
                "writes 'x/std', a Welford 'x/sem', a Collection 'c' writes 'c/<name>'): one "
                "would replace the other; rename one"
            )

    def own_keys(self, keys: Any, prefixes: Mapping[str, str]) -> None:
        for prefix, setting in prefixes.items():
            if mine := [k for k in keys if isinstance(k, str) and k.startswith(prefix)]:
                self.value_problem(
                    f"keys {mine} are under '{prefix}', which the manager writes itself with "
                    f"{setting}: one would replace the other; rename yours, or drop {setting}"
                )

    def keys(self, keys: Any, writer_problem: str | None) -> None:
        if bad := [k for k in keys if not isinstance(k, str) or not k.strip()]:
            listed = ", ".join(repr(k) for k in bad)
            self.type_problem(f"every key must be a non-empty str such as 'loss', got {listed}")
        if surrogates := _checks.surrogate_problem(keys):
            self.value_problem(surrogates)
        if writer_problem:
            self.value_problem(writer_problem)


def _number_leaf(leaf: Any) -> bool:
    """Whether JAX takes metric field `leaf` as an array: a number, or an array of numbers
    (ml_dtypes' bfloat16 and int4 too)."""
    if isinstance(leaf, jax.Array | bool | int | float | complex):
        return True
    dtype = getattr(leaf, "dtype", None)
    if not isinstance(leaf, np.ndarray | np.generic) or dtype is None:
        return False
    return dtype.kind in "biufc" or _checks._ml_wider(dtype) is not None


def _written_keys(metrics: Mapping[str, Any] | PackedMetrics, ready: Mapping) -> list[str]:
    """The keys a summary of `metrics` and `ready` writes, known from the types."""
    if isinstance(metrics, PackedMetrics):
        metrics = metrics.abstract()  # the types, from the layout
    written = [k for key, m in metrics.items() for k in metrics_lib.written_keys(key, m)]
    return written + list(ready)


def _first_array(metrics: Mapping[str, Any] | PackedMetrics) -> Any:
    """The first device array of `metrics` (None if none), without walking every metric."""
    if isinstance(metrics, PackedMetrics):
        return metrics.buffers[0] if metrics.buffers else None
    arrays = (x for m in metrics.values() for x in jax.tree.leaves(m) if isinstance(x, jax.Array))
    return next(arrays, None)


def _signature(metrics: Mapping[str, Any] | PackedMetrics) -> Any:
    """What the call's checks depend on besides the keys: the tree structure (each metric's
    type and static settings) and each leaf's type, shape, dtype and whether it is sharded
    over processes (a per-row vector replicated at the first call and sharded at the next,
    from a step with other output shardings, was let through unchecked to the worker)."""
    leaves, structure = jax.tree.flatten(metrics)
    multi = jax.process_count() > 1  # one process: every array is addressable (0.5 us a leaf)
    described = (
        (
            type(x),
            getattr(x, "shape", None),
            getattr(x, "dtype", None),
            multi and not getattr(x, "is_fully_addressable", True) and not x.is_fully_replicated,
        )
        for x in leaves
    )
    return structure, tuple(described)


def _rows_per_device(metric: Any) -> int:
    """n when every array of `metric` has n > 1 rows, one on each of n devices (as `jax.pmap`
    returns them); else 0. Static sharding data only: no device work."""
    counts = set()
    for x in jax.tree.leaves(metric):
        if isinstance(x, jax.Array):
            rows = x.shape[0] if x.ndim else 0
            per_device = rows > 1 and len(x.sharding.device_set) == rows
            if per_device:
                shard = x.sharding.shard_shape(x.shape)  # PmapSharding's drops the mapped axis
                per_device = len(shard) < x.ndim or shard[0] == 1
            counts.add(rows if per_device else 0)
    return counts.pop() if len(counts) == 1 else 0


def _split_metrics(obj: Any, problems: _Problems) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics to compute on the host, values ready to write) from a dict, a CLU
    `Collection` (its fields name the metrics, as its `compute()` does) or NNX metrics."""
    if isinstance(obj, clu.metrics.Collection):
        if replicated := metrics_lib.replicated_problem(obj):
            problems.value_problem(f"metrics: {replicated}")
            return {}, {}
        obj = metrics_lib.collection_fields(obj)
    if not isinstance(obj, Mapping | nnx.MultiMetric):
        why = " (no step merged into `running` since its reset to None)" if obj is None else ""
        if isinstance(obj, nnx.metrics.Metric):  # one metric: no key to write it under
            why = (
                " (one NNX metric, with no key to write it under); name it: "
                "{'loss': metric} or nnx.MultiMetric(loss=metric)"
            )
        problems.type_problem(
            f"metrics must be a mapping from names to CLU metrics, a CLU Collection, a "
            f"PackedMetrics or an nnx.MultiMetric, got {type(obj).__name__}{why}"
        )
        return {}, {}
    if not isinstance(obj, Mapping) or any(not metrics_lib.is_metric_obj(v) for v in obj.values()):
        try:
            obj = as_summary_metrics(obj)
        except (TypeError, ValueError) as err:
            problems.add(type(err), f"metrics: {err}")
            return {}, {}
    metrics = {k: v for k, v in obj.items() if metrics_lib.is_metric_obj(v)}
    return metrics, {k: v for k, v in obj.items() if k not in metrics}


def _log_state(directory: str | None, resume_step: int | None) -> Any:
    """(inode, mtime) of the JSONL log in `directory` when resuming (on a URL, or copied down
    from one, the names of its parts, and whether an object is at its own path: a log copied
    up), else None: a resumed JSONL writer rewrites it, so the same state after the writers
    are made means none did."""
    if resume_step is None or directory is None:
        return None
    log = _jsonl_log.as_url(_storage.join(directory, _jsonl_log.LOG_NAME))  # a URL log copied down
    if _storage.is_remote(log):
        try:
            fs, parts = _storage.filesystem(log + ".d")
            names = tuple(sorted(_storage.names_in(fs, parts)))
            return (names, True) if fs.exists(parts.removesuffix(".d")) else names or None
        except Exception:  # noqa: BLE001  (storage down: the writers will say)
            return None
    try:
        stat = os.stat(os.path.join(directory, _jsonl_log.LOG_NAME))
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def _keys_at_step(directory: str, step: int) -> frozenset[str] | None:
    """The keys of the lines at `step` in `directory`'s local JSONL log, rewritten on resume
    to end at `step`: read back from its end to a line of an earlier step (16 MiB at most),
    hyperparameter lines (no step) skipped. None: unknown (a URL, or the log unreadable)."""
    if _storage.is_remote(directory):
        return None
    keys: set[str] = set()
    try:
        with open(os.path.join(directory, _jsonl_log.LOG_NAME), "rb") as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(max(0, end - (1 << 24)))
            tail = f.read()
    except OSError:
        return None
    lines = tail.split(b"\n")
    if end > len(tail):
        lines = lines[1:]  # the first may be cut
    for line in reversed(lines):
        line_step = _jsonl_log.line_step(line) if line.strip() else None
        if line_step is None:
            continue
        if line_step < step:
            break
        if line_step == step:
            try:
                keys.update(json.loads(line))
            except ValueError:
                return None
    return frozenset(keys.difference(writers.JsonlWriter.reserved_keys))


def _may_hold_a_run(directory: str | None) -> bool:
    """Whether `directory` may hold files of an earlier run: a local directory with an entry,
    or a URL (not listed here); not a missing or empty directory, nor None (no files)."""
    if directory is None:
        return False
    if _storage.is_remote(directory):
        return True
    try:
        with os.scandir(directory) as entries:
            return next(entries, None) is not None
    except OSError:  # missing, or not a directory: the writers will say
        return False


def _claim_dir(name: str, summary_dir: str | None) -> str | None:
    """Claims `summary_dir` for a new manager of this process; None for no files."""
    if summary_dir is None:
        return None
    path = summary_dir if "://" in summary_dir else os.path.realpath(summary_dir)
    with _DIRS_LOCK:
        if path in _DIRS:
            raise ValueError(
                f"MetricsManager({name!r}): {summary_dir} is already written by another open "
                f"MetricsManager in this process, made at {_DIRS[path]}; close it first "
                "(MetricsManager.close_all() closes one whose reference was lost, as to a "
                "notebook cell that raised), or give this manager another name or summary_dir."
            )
        _DIRS[path] = _caller()
    return path


# Writers whose first parameter is no directory: that parameter, and the gin writer set.
_NO_DIRECTORY = {
    writers.ConsoleWriter: ("stream", "include 'writers/console.gin'"),
    writers.LoggingWriter: (
        "collection",
        "writers.create_default_writer.log = True (writers/cluster.gin has it)",
    ),
}


def _factory_and_kwargs(
    name: str, factory: WriterFactory | None, resume_step: int | None
) -> tuple[WriterFactory, dict[str, Any]]:
    """The writer factory and the arguments it is called with besides the directory."""
    factory = factory or writers.create_default_writer
    tracker = factory.func if isinstance(factory, functools.partial) else factory
    # gin's wrapper of a class reports (*args, **kwargs): "would take the summary dir as its
    # args"; its __init__'s parameters are read instead.
    takes = [arg for arg in _checks.parameters(tracker) or {} if arg != "self"]
    if isinstance(tracker, type) and issubclass(tracker, TrackerWriter):
        kind = tracker.__name__  # its first parameter is a project or experiment, not a dir
        raise TypeError(
            f"MetricsManager({name!r}): writer_factory is {kind}, which would take the summary "
            f"dir as its {takes[0] if takes else 'first argument'}; pass "
            f"writer_factory=functools.partial(writers.create_tracker_writer, tracker="
            f"functools.partial(writers.{kind}, ...)), the default writers and it (gin: "
            f"configs/writers/{kind.removesuffix('Writer').lower()}.gin)"
        )
    for base, (first, gin_set) in _NO_DIRECTORY.items():
        # ConsoleWriter said only "stream must be a text stream ..., got '<summary_dir>'". A
        # subclass taking a directory first is left alone.
        if isinstance(tracker, type) and issubclass(tracker, base) and takes[:1] == [first]:
            kind = tracker.__name__
            raise TypeError(
                f"MetricsManager({name!r}): writer_factory is {kind}, which would take the "
                f"summary dir as its {first} (it writes no files); pass writer_factory=lambda "
                f"logdir, collection=None: writers.{kind}(collection=collection), or in gin a "
                f"writer set: {gin_set}, with metrics_manager.MetricsManager.writer_factory = "
                "@writers.create_default_writer (as configs/console.gin has)"
            )
    parameters = _checks.parameters(factory) or {}  # a gin-registered class: its __init__'s
    kwargs: dict[str, Any] = {}
    collection = parameters.get("collection")
    if collection is not None and collection.default is None:
        kwargs["collection"] = name
    if resume_step is not None:
        if not _checks.takes_keyword(parameters, "resume_step"):  # **kwargs: passed on
            raise TypeError(  # it named create_default_writer alone: no fix for a lambda
                f"MetricsManager({name!r}): resume_step={resume_step} needs a "
                "writer_factory taking resume_step, to drop the logged steps after it, such as "
                "writers.create_default_writer; declare it in yours and pass it on: "
                "lambda logdir, resume_step=None: writers.create_default_writer(logdir, "
                "resume_step=resume_step)"
            )
        kwargs["resume_step"] = resume_step
    return factory, kwargs


def _make_writers(
    name: str, summary_dir: str | None, factory: WriterFactory, kwargs: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """What `factory` returned, and its writers by name (a `MultiWriter` unpacked), checked."""
    try:
        made: Any = factory(summary_dir, **kwargs)
    except OSError as err:  # a full disk said only "[Errno 28] No space left on device"
        fix = _storage.os_error_fix(err)
        err.add_note(
            f"MetricsManager({name!r}): the writer factory failed making its writers in "
            f"{summary_dir}; {fix}, or give another summary_dir"
        )
        raise
    context = f"MetricsManager({name!r}): writer_factory's writers"
    many = isinstance(made, list | tuple | Mapping)  # [JsonlWriter(d), TensorBoardWriter(d)]
    try:
        if many:
            named = _unpacked(named_writers(made, context))
        elif isinstance(made, writers.MultiWriter):
            named = _unpacked(made.writers)
        else:
            named = {type(made).__name__: made}
        fix = "return a writers.MetricWriter (e.g. writers.create_default_writer(logdir))"
        _checks.check_writers(named, context, _REQUIRED, fix)
    except TypeError as err:
        # As create_tracker_writer's: a tracker's run ends failed, not FINISHED and empty.
        for writer in made.values() if isinstance(made, Mapping) else made if many else [made]:
            close_failed(writer, err)
        raise
    return made, named


def _unpacked(named: dict[str, Any]) -> dict[str, Any]:
    """`named` with each `MultiWriter`'s writers in its place, so each is isolated (in
    `[create_default_writer(d), tracker]`, a failing TensorBoard quarantined the JSONL log
    with it); `outer/inner` where an inner name is taken."""
    out: dict[str, Any] = {}
    for outer, writer in named.items():
        if not isinstance(writer, writers.MultiWriter):
            out[outer] = writer
            continue
        for inner, each in _unpacked(writer.writers).items():
            taken = inner in out or inner in named
            out[f"{outer}/{inner}" if taken else inner] = each
    return out


def _caller() -> str:
    """`file:line` of the first frame outside this package and gin: who made the manager."""
    frame, own = sys._getframe(1), ("metrics_manager", "gin")
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] in own:
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


# The duration of a summary call, which its next window counts (real seconds, whatever clock
# the manager is given: reading that clock again would shift a test's scripted readings).
_call_clock = time.perf_counter

# Less than any train step's dispatch between the calls (a jitted call of one scalar took
# 5.4 us at the least on two shared cores), more than start_duration_timer's return into
# write_metrics_summary with nothing between (0.3-0.7 us median there).
_NO_STEP_S = 1e-6


def _ready_time(tree: Any, called: float, clock: timer.Clock, start: float | None = None) -> float:
    """When `tree` became ready: `clock()` after waiting for it, or `called` if it already
    was ready (or donated) when the worker looked, so a busy worker never shifts a window.

    For a window's start, `called` is the later of the call and the previous summary's ready
    time (a donated state is that step's output, ready after the call when the host runs
    ahead). For an end, `start` is given too: a `called` before it gives way to `clock()`.
    """
    leaves = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]
    if all(map(timer.settled, leaves)):
        return called if start is None or called > start else clock()
    timer.block_until_ready_or_deleted(leaves)
    return clock()


# True outside any JAX trace; ~0.3 us (a tree walk for tracers would cost more per summary).
_trace_state_clean: Callable[[], bool] = getattr(_jax_core, "trace_state_clean", lambda: True)


def _signals_to_handle() -> tuple[int, ...]:
    """SIGTERM and SIGINT, less SIGTERM where JAX's preemption service holds it (a multi-host
    job): replacing its handler would kill the process at once, before the loop reaches
    `multihost_utils.reached_preemption_sync_point` (T5X, Orbax) and saves a checkpoint."""
    if jax.distributed.is_initialized() and getattr(
        jax.config, "jax_enable_preemption_service", True
    ):
        return (signal.SIGINT,)
    return (signal.SIGTERM, signal.SIGINT)


def _open_managers() -> list[MetricsManager]:
    """The open managers of this process (a forked child's copies are its parent's)."""
    return [m for m in list(_OPEN) if m._pid == os.getpid()]


def _previous_handlers_in_child() -> None:
    """A forked child (a pool's or data loader's worker) gets the handlers it had before the
    manager: its copy has nothing to flush, and a Python handler runs only when the main
    thread runs Python, which a child blocked in a wait may never do again (it would then
    outlive a group's SIGTERM that the default kills it with at once)."""
    for signum, previous in list(_PREVIOUS_HANDLERS.items()):
        try:
            if signal.getsignal(signum) is _on_signal:
                signal.signal(signum, previous)
                del _PREVIOUS_HANDLERS[signum]  # a manager the child makes installs its own
        except ValueError:  # forked from a thread other than the main one: not its to set
            return


os.register_at_fork(after_in_child=_previous_handlers_in_child)


def _on_signal(signum: int, frame: types.FrameType | None) -> None:
    """Flushes every open manager within the grace period, then runs the previous handler;
    closes their writers instead where that is the default, which ends the process at once:
    W&B, whose run file grows in 32 KiB blocks until its run finishes, lost every summary."""
    global _signal_end
    previous = _PREVIOUS_HANDLERS.get(signum)
    ending = previous == signal.SIG_DFL
    own = callable(previous) and previous is not signal.default_int_handler
    budget = _SIGNAL_FLUSH_BEFORE_OWN_S if own else _SIGNAL_FLUSH_S
    end = time.monotonic() + budget
    managers = [m for m in _open_managers() if m._handles_signals]
    outer = _signal_end is None
    if _signal_end is None:
        for manager in managers:  # a hung or slow writer must not hold the others' past a kill
            manager._worker.hurry(min(_SIGNAL_DEADLINE_S, budget))
            manager._fanout.hurry(min(_SIGNAL_DEADLINE_S, budget))
    else:  # a repeat inside the first one's flush (a scheduler resending): its bounds hold
        end = min(end, _signal_end)
    _signal_end = end
    if ending:  # the trackers' runs closed now end as killed, not FINISHED
        TrackerWriter.ending_signal = signum
    try:
        _flush_on_signal(managers, end, ending, own)
    finally:
        if outer:
            _signal_end = None
            for manager in managers:
                manager._worker.hurry(None)
                manager._fanout.hurry(None)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)  # die as the default would: status 128 + signum
        os.kill(os.getpid(), signum)


def _flush_on_signal(managers: list[MetricsManager], end: float, ending: bool, own: bool) -> None:
    """`_on_signal`'s flush (`close` where the signal ends the process) of each of `managers`
    until `end` (monotonic)."""
    for manager in managers:
        left = max(end - time.monotonic(), 0.0)
        try:
            closing = manager._closed
            # A close() still waiting for a queue slot for its close (the queue was full) is
            # flushed, or closed, as an open manager: waiting for the queue alone left the
            # writers unclosed at the kill (a W&B run unfinished, a gs:// upload not made).
            if not closing or not manager._close_queued:
                try:
                    manager._to_all("close" if ending else "flush", left)
                except RuntimeError:
                    if not manager._closed:
                        raise
                    closing = True  # another thread's close() sealed the queue meanwhile
            left = max(end - time.monotonic(), 0.0)
            if closing and not manager._worker.drain(left):  # let close() end first
                raise TimeoutError(f"close() not done in {left:.1f} s")
        except Exception as err:  # noqa: BLE001  (the process is going down: log and go on)
            level, rest = (
                (logging.WARNING, "; close() writes the rest") if own else (logging.ERROR, "")
            )
            _LOG.log(
                level, "MetricsManager %r: flush on signal failed: %s%s", manager.name, err, rest
            )
