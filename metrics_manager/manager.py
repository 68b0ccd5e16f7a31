"""`MetricsManager`: T5X's summary contract with a background worker and pluggable writers.

Plug it into any training loop:

  with MetricsManager("train", summary_dir="runs/exp") as manager:
    metrics = None
    manager.start_duration_timer(block_on=state)
    for step in range(start, start + num_steps):
      state, step_metrics = train_step(state, batch)
      metrics = merge_metrics(metrics, step_metrics)
    future = manager.write_metrics_summary(metrics, start + num_steps, num_steps)

`metrics` is a dict of metrics or a `PackedMetrics` (`merge_metrics(...,
pack=True)` inside the jitted step: one buffer per dtype, the cheaper choice
for sub-millisecond steps).

What happens where:

* Caller's thread: cheap checks and two queue submissions; it never waits for
  the device or a writer, unless `max_pending` jobs are already waiting (see
  back-pressure below).
* Timer thread (`timer.DurationTimer`): the window runs from "`block_on`
  ready" to "metrics ready"; donated buffers count as ready.
* Summary worker (one thread, jobs in call order): waits for the window's
  duration, copies all metrics to the host in one batched transfer
  (`host_copy.device_get_batched`; for a `PackedMetrics`, one `jax.device_get`
  of its few buffers and `unpack_host`, with no device dispatch), sets
  durations (`set_time_metrics_duration`) and steps
  (`set_step_metrics_num_steps`), calls `compute_value()` per metric and
  `writers.write_values`. `write_scalar(s)`, `write_texts`,
  `write_hparams` and `flush` go through the same worker, so everything reaches
  the writer in call order.

Only `jax.process_index() == 0` builds a writer (so only it creates files).
Other processes still time the window and compute the summary (the returned
future holds the same values on every process, so decisions taken from it
agree across hosts) but skip every write and never call the writer factory.

Back-pressure: at most `max_pending` jobs (summaries and direct writes, the
running one included) wait for the worker. Every pending summary keeps its
metrics' device buffers alive, so a loop that summarizes faster than its
writers absorb blocks in the submitting call until a job finishes, instead of
queueing without limit; nothing is dropped. This is the policy of
`writers.AsyncWriter` (`max_queue`), one level up: with the default 16 the
loop never waits unless the writers fall 16 jobs behind.

A failure in the background (a metric's `compute_value()`, a writer) is kept:
the returned future raises it, and so do the next call, `flush()` and
`close()`, naming the metric or writer. After a failure the manager refuses new
work; `close()` still releases the writer and threads, then raises. Writers
that queue work on threads of their own (`writers.AsyncWriter`) report a
failure on their next call, so it surfaces one manager call later; the configs
in `configs/` therefore build synchronous writers, which the manager's worker
already keeps off the training loop.

Host-side module: never import it from code traced by jit.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import numbers
import os
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import clu.metrics as clu_metrics
import clu.values
import jax
import numpy as np

import writers
from metrics_manager import gin_utils, host_copy
from metrics_manager import metrics as metrics_lib
from metrics_manager.packing import PackedMetrics
from metrics_manager.timer import Clock, DurationTimer

WriterFactory = Callable[..., Any]
"""`writer_factory(logdir)` returns a writer with CLU's `MetricWriter` methods.

`logdir` is the manager's `summary_dir` (None when the manager has none). A
factory with a `collection` keyword defaulting to None is also given
`collection=<manager name>`.
"""

_R = TypeVar("_R")
_LOG = logging.getLogger(__name__)

_WRITER_METHODS = ("write_scalars", "write_texts", "write_hparams", "flush", "close")


class MetricsManagerError(RuntimeError):
    """A background job of a `MetricsManager` failed (or an earlier one did).

    The message names the failing metric or writer and the step; `__cause__`
    holds the original exception.
    """


class _Checks:
    """Collects every problem with a call's arguments, then raises once.

    The error is a TypeError when any problem is about a type, else a ValueError.
    """

    def __init__(self, method: str) -> None:
        self.method = method
        self.type_problems: list[str] = []
        self.value_problems: list[str] = []

    def step(self, value: Any, what: str, *, minimum: int) -> int:
        """Returns `value` as an int (0 when it is wrong; `raise_if_any` reports it)."""
        if isinstance(value, jax.Array):
            self.type_problems.append(
                f"{what} must be a Python or NumPy int, got a jax.Array "
                f"({value.dtype}{list(value.shape)}); converting it would block the training "
                "loop until the device catches up, so keep a host-side counter (step += 1)"
            )
            return 0
        if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu":
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            self.type_problems.append(
                f"{what} must be an int, got {value!r} of type {type(value).__name__}"
            )
            return 0
        if value < minimum:
            self.value_problems.append(f"{what} must be >= {minimum}, got {value}")
        return int(value)

    def mapping(self, values: Any, what: str) -> dict[str, Any]:
        """Returns a shallow copy of `values` (empty when it is not a mapping)."""
        if not isinstance(values, Mapping):
            self.type_problems.append(
                f"{what} must be a mapping from names to values, got {type(values).__name__} "
                "(wrap a single value, e.g. {'loss': value})"
            )
            return {}
        snapshot = dict(values)
        bad = [k for k in snapshot if not isinstance(k, str) or not k]
        if bad:
            self.type_problems.append(
                f"every key of {what} must be a non-empty str such as 'loss' or "
                f"'eval/accuracy', got {', '.join(repr(k) for k in bad)}"
            )
        return snapshot

    def strings(self, values: Mapping[str, Any], what: str) -> None:
        bad = {k: type(v).__name__ for k, v in values.items() if not isinstance(v, str)}
        if bad:
            self.type_problems.append(
                f"every value of {what} must be a str, got "
                + ", ".join(f"{k!r}: {t}" for k, t in bad.items())
            )

    def raise_if_any(self) -> None:
        problems = self.type_problems + self.value_problems
        if problems:
            error = TypeError if self.type_problems else ValueError
            raise error(f"MetricsManager.{self.method}: " + "; ".join(problems) + ".")


def _build_writer(factory: WriterFactory, logdir: str | None, name: str) -> Any:
    """Calls `factory(logdir)`, adding `collection=name` where the factory takes one.

    A factory whose `collection` parameter defaults to None (such as
    `writers.create_default_writer`) gets the manager's name, so console lines
    and JSONL records say which run they belong to. A factory that fixed its
    own collection (e.g. `functools.partial(..., collection="x")`) keeps it.
    """
    try:
        parameter = inspect.signature(factory).parameters.get("collection")
    except (TypeError, ValueError):  # no signature (e.g. some builtins)
        parameter = None
    if (
        parameter is not None
        and parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD)
        and parameter.default is None
    ):
        return factory(logdir, collection=name)
    return factory(logdir)


def _writer_name(writer: Any) -> str:
    name = getattr(writer, "name", None)
    return name if isinstance(name, str) and name else type(writer).__name__


class MetricsManager:
    """Writes T5X-style metric summaries from a training or evaluation loop.

    Args:
      name: the run's name, e.g. "train" or "eval/glue"; summaries go to
        `<summary_dir>/<name>`.
      summary_dir: root directory of the experiment's summaries, or None to
        write no files (the writer factory then gets `logdir=None`; the
        default factory shows the console only).
      writer_factory: `writer_factory(logdir)` returns the writer used for
        everything this manager writes; it is called once, on process 0 only.
        If it has a `collection` parameter defaulting to None, it also gets
        `collection=name`. Defaults to `writers.create_default_writer`
        (console + TensorBoard + JSONL) with the bindings of any parsed gin
        config (see `gin_utils.configured`). In gin:
        `metrics_manager.MetricsManager.writer_factory =
        @writers.create_default_writer`.
      clock: returns the current time in seconds, used to time summary
        windows; defaults to `time.perf_counter`. Inject a fake in tests.
      max_pending: most background jobs (summaries and direct writes, the
        running one included) waiting at once; a submitting call blocks while
        the worker is this far behind (back-pressure; nothing is dropped).
        Bounds the memory pinned by pending summaries.

    Call a manager from one thread (the training loop), not from callbacks of
    the futures it returns or from its writer: those run on its worker, which
    `flush()` and `close()` wait for, and which alone frees queue slots (such a
    call raises RuntimeError when the queue is full instead of hanging).

    Attributes:
      name: the run's name.
      summary_dir: `<summary_dir>/<name>` (on every process), or None.

    Raises:
      TypeError: a wrong argument type, or a factory result that lacks the
        writer methods the manager calls.
      ValueError: an empty name, or `max_pending` < 1.

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
        clock: Clock | None = None,
        max_pending: int = 16,
    ) -> None:
        problems: list[str] = []
        if not isinstance(name, str):
            problems.append(f"name must be a str such as 'train', got {type(name).__name__}")
        if summary_dir is not None and not isinstance(summary_dir, str | os.PathLike):
            problems.append(
                f"summary_dir must be a path (str or os.PathLike) or None, got "
                f"{type(summary_dir).__name__}"
            )
        if writer_factory is not None and not callable(writer_factory):
            problems.append(
                f"writer_factory must be callable as writer_factory(logdir), got "
                f"{type(writer_factory).__name__}"
            )
        if clock is not None and not callable(clock):
            problems.append(f"clock must be callable returning seconds, got {type(clock).__name__}")
        if isinstance(max_pending, bool) or not isinstance(max_pending, numbers.Integral):
            problems.append(
                f"max_pending must be an int such as 16, got {type(max_pending).__name__}"
            )
        if problems:
            raise TypeError("MetricsManager: " + "; ".join(problems) + ".")
        if not name.strip("/ "):
            raise ValueError(
                f"MetricsManager: name must be a non-empty run name such as 'train' or "
                f"'eval/<task>', got {name!r}."
            )
        if max_pending < 1:
            raise ValueError(
                f"MetricsManager({name!r}): max_pending must be >= 1, got {max_pending}. It "
                "bounds the summaries and writes waiting for the worker; 16 suits most loops."
            )

        self.name = name
        self.summary_dir: str | None = (
            None if summary_dir is None else os.path.join(os.fspath(summary_dir), name)
        )
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._closed = False
        # One slot per pending job, taken by the submitting call, freed when the job ends.
        self._pending = threading.BoundedSemaphore(int(max_pending))
        self._writer: Any = None
        if jax.process_index() == 0:
            if writer_factory is None:
                writer_factory = gin_utils.configured(writers.create_default_writer)
            self._writer = _build_writer(writer_factory, self.summary_dir, name)
            missing = [m for m in _WRITER_METHODS if not callable(getattr(self._writer, m, None))]
            if missing:
                close = getattr(self._writer, "close", None)
                if callable(close):
                    close()  # release what the factory opened before refusing it
                raise TypeError(
                    f"MetricsManager({name!r}): writer_factory returned "
                    f"{type(self._writer).__name__}, which lacks {', '.join(missing)}; return a "
                    "writers.MetricWriter (e.g. writers.create_default_writer(logdir))."
                )
        thread_name = f"MetricsManager[{name}]"
        self._timer = DurationTimer(clock=clock, thread_name=f"{thread_name}.timer")
        self._worker = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"{thread_name}.summary"
        )
        # Start the thread now, not inside the first write_metrics_summary call, and learn
        # which thread it is (a call from it must not wait for a slot only it can free).
        self._worker_thread = self._worker.submit(threading.current_thread).result()

    # ----------------------------------------------------------------- state

    @property
    def writes(self) -> bool:
        """Whether this process writes (only `jax.process_index() == 0` does)."""
        return self._writer is not None

    @property
    def writer(self) -> Any:
        """The writer built by `writer_factory`, or None on processes that do not write."""
        return self._writer

    @property
    def closed(self) -> bool:
        """Whether `close()` has been called."""
        return self._closed

    def _record(self, err: BaseException) -> None:
        with self._lock:
            first = self._error is None
            if first:
                self._error = err
        if first:
            # Logged now, since the loop may run long before its next call raises it.
            _LOG.error("MetricsManager %r: %s (the next call raises this)", self.name, err)

    def _raise_if_failed(self) -> None:
        err = self._error
        if err is not None:
            raise MetricsManagerError(
                f"MetricsManager {self.name!r}: a background job failed, so this manager "
                f"refuses further work: {err}"
            ) from err

    def _check_usable(self, method: str) -> None:
        if self._closed:
            raise RuntimeError(
                f"MetricsManager {self.name!r} is closed; {method}() needs an open manager. "
                "Create a new MetricsManager."
            )
        self._raise_if_failed()

    def _take_slot(self) -> None:
        """Takes a pending-job slot, waiting while `max_pending` jobs are pending."""
        if self._pending.acquire(blocking=False):
            return
        if threading.current_thread() is self._worker_thread:
            raise RuntimeError(
                f"MetricsManager {self.name!r} was called from its own summary worker (its "
                "writer, or a callback of a future it returned) while max_pending jobs are "
                "waiting; the "
                "call would wait for a slot only this thread can free. Call the manager from "
                "the training loop instead."
            )
        self._pending.acquire()

    def _submit(
        self, job: Callable[[], _R], *, after_failure: bool = False, reserved: bool = False
    ) -> concurrent.futures.Future[_R]:
        """Runs `job` on the summary worker, recording its error before the future fails.

        Takes a pending slot first (blocking while `max_pending` jobs wait)
        unless the caller already took one (`reserved`); the slot is freed when
        the job ends.
        """
        if not reserved:
            self._take_slot()

        def run() -> _R:
            try:
                if not after_failure and self._error is not None:
                    raise MetricsManagerError(
                        f"skipped: an earlier background job of MetricsManager {self.name!r} "
                        f"failed: {self._error}"
                    ) from self._error
                try:
                    return job()
                except BaseException as err:
                    self._record(err)
                    raise
            finally:
                self._pending.release()

        try:
            return self._worker.submit(run)
        except BaseException:
            self._pending.release()
            raise

    def _call_writer(self, step: int | None, what: str, call: Callable[[Any], None]) -> None:
        """Calls the writer (worker thread), translating errors to name it."""
        try:
            call(self._writer)
        except Exception as err:
            at = "" if step is None else f" at step {step}"
            raise MetricsManagerError(
                f"writer {_writer_name(self._writer)} raised in {what}{at} "
                f"(MetricsManager {self.name!r}): {type(err).__name__}: {err}"
            ) from err

    # --------------------------------------------------------------- summary

    def start_duration_timer(self, block_on: Any = ()) -> None:
        """Starts the summary window once `block_on` is ready; returns at once.

        Call it at the start of every summary window (after evaluation or
        checkpointing, so they are not counted as training time).

        Args:
          block_on: pytree to wait for, usually the train state; donated
            (deleted) buffers count as ready.

        Raises:
          RuntimeError: the manager is closed.
          MetricsManagerError: an earlier background job failed.
        """
        self._check_usable("start_duration_timer")
        self._timer.start(block_on)

    def write_metrics_summary(
        self, metrics: Mapping[str, Any] | PackedMetrics, step: int, num_steps: int
    ) -> concurrent.futures.Future[Mapping[str, clu.values.Value]]:
        """Summarizes and writes `metrics` in the background; returns at once.

        Blocks only while `max_pending` jobs are already waiting for the
        worker (back-pressure). Stops the duration timer (the window ends when
        `metrics` are ready),
        then in the summary worker: one batched device-to-host copy, the
        window's duration into every Time metric, `num_steps` into every Step
        metric, `compute_value()` per metric, and `write_values` at `step`.

        Args:
          metrics: name -> CLU metric (or `Collection`), usually merged over the
            window on the device; or a `PackedMetrics` (`merge_metrics(...,
            pack=True)`), whose few buffers are awaited by the timer and copied
            in one `jax.device_get`, then unpacked on the host.
          step: the step the summary is written at (usually `start + num_steps`).
          num_steps: number of train steps the metrics cover (> 0).

        Returns:
          A future of the summary, name -> `clu.values.Value` (a `Collection`
          under `k` gives `k/<field>`, a `MeanStd` gives `k` and `k/std`). It
          raises `MetricsManagerError` naming the metric or writer if the
          summary fails. The same values on every process; only process 0
          writes them.

        Raises:
          TypeError: `metrics` is not a `PackedMetrics` or a mapping with str
            keys, or `step` or
            `num_steps` is not an int.
          ValueError: `step` < 0 or `num_steps` < 1.
          RuntimeError: the manager is closed, or this is called from its own
            worker while `max_pending` jobs wait.
          MetricsManagerError: an earlier background job failed.
        """
        self._check_usable("write_metrics_summary")
        checks = _Checks("write_metrics_summary")
        snapshot: dict[str, Any] | PackedMetrics
        block_on: Any
        if isinstance(metrics, PackedMetrics):
            snapshot, block_on = metrics, metrics.buffers
        else:
            snapshot = block_on = checks.mapping(metrics, "metrics")
        step = checks.step(step, "step", minimum=0)
        num_steps = checks.step(num_steps, "num_steps", minimum=1)
        checks.raise_if_any()
        # Wait for a slot before the timer holds on to the metrics too.
        self._take_slot()
        try:
            duration = self._timer.stop(block_on=block_on)
        except BaseException:
            self._pending.release()
            raise
        return self._submit(
            lambda: self._summarize(snapshot, step, num_steps, duration), reserved=True
        )

    def _summarize(
        self,
        metrics: dict[str, Any] | PackedMetrics,
        step: int,
        num_steps: int,
        duration_future: concurrent.futures.Future[float | None],
    ) -> dict[str, clu.values.Value]:
        try:
            duration = duration_future.result()
        except Exception as err:
            raise MetricsManagerError(
                f"summary at step {step} (MetricsManager {self.name!r}): waiting for the train "
                f"state or the metrics to be ready failed: {type(err).__name__}: {err}"
            ) from err
        host = _to_host(metrics)
        if duration is None:
            timed = sorted(k for k, m in host.items() if _contains_time_metric(m))
            if timed:
                raise MetricsManagerError(
                    f"summary at step {step} (MetricsManager {self.name!r}): metrics {timed} "
                    "measure time, but no window was open: call "
                    "manager.start_duration_timer(block_on=state) at the start of every "
                    "summary window."
                )
        else:
            host = metrics_lib.set_time_metrics_duration(host, duration)
        host = metrics_lib.set_step_metrics_num_steps(host, num_steps)

        try:
            summary = metrics_lib.compute_metric_values(host)
        except Exception:
            summary, failures = {}, []
            for key, metric in host.items():  # again one by one, to name every failing metric
                try:
                    summary.update(metrics_lib.compute_metric_values({key: metric}))
                except Exception as err:
                    failures.append((key, metric, err))
        else:
            failures = []
        if failures:
            listed = "; ".join(
                f"metric {key!r} ({type(m).__name__}): {type(e).__name__}: {e}"
                for key, m, e in failures
            )
            raise MetricsManagerError(
                f"summary at step {step} (MetricsManager {self.name!r}): compute_value() "
                f"failed for {listed}"
            ) from failures[0][2]
        if self._writer is not None:
            self._call_writer(
                step, "write_values", lambda w: writers.write_values(w, step, summary)
            )
        return summary

    # ------------------------------------------------------- direct writes

    def write_scalar(self, key: str, val: Any, step: int) -> None:
        """Writes one scalar at `step` (in the background, in call order).

        Args:
          key: the scalar's name, e.g. "timing/compilation_seconds".
          val: a number or a one-element array.
          step: the step to write at.

        Raises:
          TypeError, ValueError: a bad key or step.
          RuntimeError: the manager is closed (or called from its worker with a
            full queue).
          MetricsManagerError: an earlier background job failed.
        """
        self.write_scalars(step, {key: val}, _method="write_scalar")

    def write_scalars(
        self, step: int, scalars: Mapping[str, Any], *, _method: str = "write_scalars"
    ) -> None:
        """Writes scalars at `step` (in the background, in call order).

        Args:
          step: the step to write at.
          scalars: name -> number or one-element array.

        Raises:
          TypeError, ValueError: a bad key or step.
          RuntimeError: the manager is closed (or called from its worker with a
            full queue).
          MetricsManagerError: an earlier background job failed.
        """
        self._write(_method, step, scalars, "scalars", lambda w, s, v: w.write_scalars(s, v))

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Writes texts (markdown in TensorBoard) at `step`, in call order.

        Args:
          step: the step to write at.
          texts: name -> str.

        Raises:
          TypeError, ValueError: a bad key, value or step.
          RuntimeError: the manager is closed (or called from its worker with a
            full queue).
          MetricsManagerError: an earlier background job failed.
        """
        self._write(
            "write_texts", step, texts, "texts", lambda w, s, v: w.write_texts(s, v), strings=True
        )

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Writes the run's hyperparameters (no step), in call order.

        Args:
          hparams: name -> bool, number or str.

        Raises:
          TypeError: `hparams` is not a mapping with str keys.
          RuntimeError: the manager is closed (or called from its worker with a
            full queue).
          MetricsManagerError: an earlier background job failed.
        """
        self._write("write_hparams", None, hparams, "hparams", lambda w, _, v: w.write_hparams(v))

    def _write(
        self,
        method: str,
        step: int | None,
        values: Mapping[str, Any],
        what: str,
        call: Callable[[Any, Any, dict[str, Any]], None],
        *,
        strings: bool = False,
    ) -> None:
        self._check_usable(method)
        checks = _Checks(method)
        if step is not None:
            step = checks.step(step, "step", minimum=0)
        snapshot = checks.mapping(values, what)
        if strings:
            checks.strings(snapshot, what)
        checks.raise_if_any()
        if self._writer is None:
            return
        self._submit(lambda: self._call_writer(step, method, lambda w: call(w, step, snapshot)))

    # ------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        """Waits for every pending summary and write, then flushes the writer.

        Raises:
          RuntimeError: the manager is closed (or called from its worker with a
            full queue).
          MetricsManagerError: a background job failed (this one or earlier).
        """
        self._check_usable("flush")
        if self._writer is not None:
            job = self._submit(lambda: self._call_writer(None, "flush", lambda w: w.flush()))
        else:
            job = self._submit(lambda: None)
        concurrent.futures.wait([job])
        self._raise_if_failed()

    def close(self) -> None:
        """Finishes pending work, closes the writer and joins the manager's threads.

        Idempotent: later calls do nothing. The writer is closed and every
        thread the manager started has ended when this returns, even when it
        raises.

        Raises:
          MetricsManagerError: a background job failed (now or earlier, even if
            an earlier call already raised it); it names the metric or writer.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if self._writer is not None:
                self._submit(
                    lambda: self._call_writer(None, "close", lambda w: w.close()),
                    after_failure=True,
                )
        finally:
            self._worker.shutdown(wait=True)
            self._timer.close()
        self._raise_if_failed()

    def __enter__(self) -> MetricsManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as close_err:
            # Keep the loop's own exception; report the background one with it.
            _LOG.error("%s", close_err)
            if hasattr(exc, "add_note"):  # Python >= 3.11
                exc.add_note(f"While closing MetricsManager {self.name!r}: {close_err}")

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("failed" if self._error else "open")
        return (
            f"MetricsManager(name={self.name!r}, summary_dir={self.summary_dir!r}, "
            f"writer={_writer_name(self._writer) if self._writer is not None else None}, {state})"
        )


def _to_host(metrics: dict[str, Any] | PackedMetrics) -> dict[str, Any]:
    """The metrics with NumPy leaves, in one batched transfer (summary worker)."""
    if not isinstance(metrics, PackedMetrics):
        return host_copy.device_get_batched(metrics)
    buffers = metrics.buffers
    deleted = [
        f"buffer {i} ({b.dtype}[{b.size}])"
        for i, b in enumerate(buffers)
        if isinstance(b, jax.Array) and b.is_deleted()
    ]
    if deleted:
        raise ValueError(
            f"Cannot copy the PackedMetrics of {metrics.keys()} to the host: "
            f"{', '.join(deleted)} was deleted (donated to a later computation). Do not donate "
            "metrics passed to write_metrics_summary (or pass a copy)."
        )
    return metrics.unpack_host(jax.device_get(buffers))


def _contains_time_metric(metric: Any) -> bool:
    if isinstance(metric, clu_metrics.Collection):
        return any(_contains_time_metric(m) for m in vars(metric).values())
    return metrics_lib.is_time_metric(metric)
