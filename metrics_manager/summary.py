"""One summary on the host: copied in one transfer, computed, checked, grouped per writer method.

A `MetricsManager`'s worker runs `Summarizer.values` (metrics -> `clu.values.Value`s, with
`perf/*` and `system/*`), then `Summarizer.calls` (values -> the writers' calls). A metric
that fails, or gives a value no writer takes, costs its key, not the summary.

Host-side module: never import it from code traced by jit.
"""

import collections
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Set
from typing import Any, Literal

import clu.metrics as clu_metrics
import clu.values
import jax
import numpy as np
from jax._src import config as _jax_config

import writers
from metrics_manager import metrics as metrics_lib
from metrics_manager.isolation import Failure, Failures, MetricsManagerError
from metrics_manager.packing import PackedMetrics
from writers import _checks
from writers import values as values_lib

_LOG = logging.getLogger("metrics_manager.manager")  # the logger users filter on
_pack = jax.jit(PackedMetrics.pack)
_INT32_NEAR = 2**30  # half of int32's range: a window or two more may wrap it


class Summarizer:
    """Computes a manager's summaries; warns once per key (int32 near its limit, non-finite).

    Args:
      failures: where a failing key or a non-finite stop goes.
      nonfinite: "ignore", "warn" or "stop" (`MetricsManager`'s argument).
      perf: `perf(num_steps, seconds)` -> `perf/*` values, or None.
      monitor: a `SystemMonitor` for `system/*`, or None.
      system_interval_s: the least time between two summaries that carry `system/*`.
    """

    def __init__(
        self,
        failures: Failures,
        *,
        nonfinite: Literal["ignore", "warn", "stop"],
        perf: Callable[..., dict[str, float]] | None,
        monitor: Any,
        system_interval_s: float,
    ) -> None:
        self._failures = failures
        # The last failure this summarizer recorded since the manager set it to None: a
        # summary's own, which fails its future under "raise" (not one another thread recorded).
        self.recorded: Failure | None = None
        self._nonfinite = nonfinite
        self._perf = perf
        self._monitor = monitor
        self._system_interval = system_interval_s
        self._system_next = -math.inf  # when the next system/* sample is due
        self._system_first = math.inf  # when the first was taken
        self._nonfinite_warned: set[str] = set()
        self._int32_warned: set[str] = set()
        # (steps merged, num_steps) of the last 3 summaries; None once warned of cumulative ones.
        self._windows: list[tuple[float, int]] | None = []
        self._warned_short = False
        self._warned_one = False  # each window merged one step: `running = None` every step
        self._no_step_windows = 0  # timed summaries in a row whose window held no train step
        self._warned_perf = False
        self._warned_mfu = False  # perf/mfu above 1: a wrong peak or FLOP count
        self._warned_zero = False
        self._zero_window: set[str] = set()  # the time keys of a 0 s window: not checked
        self._host_only: set[str] = set()  # the summary's system/* keys: warned of, not stopped
        self._host: Mapping[str, Any] = {}  # the summary's host metrics, until its calls
        self._step_key = ""  # the key of a `Step` metric, for that count
        # Keys a writer refuses, by call, left out of that call's writes (set by the manager
        # with several processes, where refusing at the call on process 0 alone would hang
        # the others). By call: a config's `time` was left out after a scalar `time`, which
        # JSONL keeps for its lines alone, and a text 'acc@1' after the scalar MLflow refuses.
        # Every call's entry made now: the caller thread adds keys while the worker reads
        # them, and a call's first entry made then failed the worker's iteration.
        self.refused: dict[str, dict[str, Exception]] = collections.defaultdict(
            dict, {method: {} for method in _checks.WRITER_METHODS}
        )

    def values(
        self,
        metrics: Mapping[str, Any] | PackedMetrics,
        ready: dict[str, Any],
        step: int,
        num_steps: int,
        duration: float | None,
        no_window: str = "",
        no_step: float | None = None,
        host_numbers: bool = True,
    ) -> dict[str, clu.values.Value]:
        """The summary: `ready` values and those of `metrics`, over a window of `duration` s
        (None: no window was open, `no_window` saying why when the manager knows; `no_step`:
        the seconds since the window was opened, if too few for a train step between;
        `host_numbers`: False when every leaf of `metrics` is a JAX array)."""
        owner = self._failures.owner
        near_limit: list[str] = []
        negative: list[str] = []
        # Known metrics of a timed window, as vectors (`HostPlan`): a summary every step of a
        # sub-millisecond loop spent ~1/3 of its worker's CPU computing them one by one.
        plan, buffers = None, None
        if duration and isinstance(metrics, PackedMetrics) and (plan := metrics.host_plan()):
            buffers = _packed_on_host(metrics, step)
            # A count that may have wrapped (each one looked at), or buffers of other dtypes
            # than the layout's (cast after packing): `to_host` says so.
            if any(_int_bounds(buffers)) or not plan.fits(buffers):
                plan = None
        if plan is not None and buffers is not None:
            host = plan.checked_metrics(buffers)
        else:
            host = to_host(metrics, near_limit, step, negative, host_numbers, buffers)
        if near_limit := sorted(set(near_limit) - self._int32_warned):  # once per key
            self._int32_warned.update(near_limit)
            _LOG.warning(
                "%s: at step %d the int32 accumulators of %s are past 2**30 and "
                "wrap silently at 2**31; accumulate in float32 (jnp.sum(x, dtype=jnp.float32)), "
                "write summaries more often, or enable jax_enable_x64.",
                owner,
                step,
                near_limit,
            )
        self._check_windows(host, step, num_steps)
        self._check_opened(host, step, num_steps, duration, no_step)

        def failed(key: str, err: Exception) -> None:
            self._record(Failure(f"metric:{key}", step, (key,), err))

        wrapped = {k: c for k in negative if (c := _wrapped_count(host[k])) is not None}
        for key, count in wrapped.items():
            # A CLU Average's int32 count past 2**31 reads negative, and its value is wrong
            # (0.75 read -1.06), but was written as if right.
            del host[key]
            message = (
                f"metric {key!r}: its int32 count wrapped past 2**31 (it reads {count}) over "
                f"the window ending at step {step}; write summaries more often, or enable "
                "jax_enable_x64"
            )
            failed(key, OverflowError(message))

        if duration is None and any(_has_time(m, unset=True) for m in host.values()):
            # Only the timed keys are lost: a loop that never starts the timer keeps its loss,
            # and a duration the loop set itself (set_time_metrics_duration) is kept.
            host, timed = _without_time(host, unset=True)
            for key in timed:
                message = (
                    f"metric {key!r} measures time, but no window was open: call "
                    "manager.start_duration_timer(block_on=state) at the start of every "
                    f"window{no_window}"
                )
                failed(key, MetricsManagerError(message))

        # A window over which the clock did not advance: its rates are inf, written as they are
        # but left out of the `nonfinite` policy (a coarse clock must not stop a run).
        self._zero_window, self._host_only = set(), set()
        self._host = host
        if duration == 0.0 and any(_has_time(m) for m in host.values()):
            self._zero_window = set(_without_time(host)[1])
            if not self._warned_zero:
                self._warned_zero = True
                _LOG.warning(
                    "%s: the window ending at step %d took 0 s (the clock did not advance, or "
                    "went back): %s measure time over it, and their rates are written as inf (NaN "
                    "for 0 steps), not taken as non-finite values; give the manager a clock "
                    "that advances.",
                    owner,
                    step,
                    sorted(self._zero_window),
                )
        ready = _ready_on_host(ready, failed)
        # A user's metric's compute() may run jnp ops on the host copies (this library's
        # compute them in NumPy): this thread's own work, let through a guard the loop sets
        # for every thread.
        if plan is not None:
            assert buffers is not None and duration
            computed = plan.values(buffers, duration, num_steps)
        else:
            with _transfers_allowed():
                computed = metrics_lib.host_values(host, duration, num_steps, failed)
        summary = {**ready, **computed}
        extra = {}
        if self._perf is not None and duration:
            extra = self._perf(num_steps, duration)
            if (mfu := extra.get("perf/mfu", 0.0)) > 1.0 and not self._warned_mfu:
                self._warned_mfu = True
                _LOG.warning(
                    "%s: perf/mfu is %.4g, above 1 (the devices' peak): peak_flops_per_device "
                    "(%.4g FLOP/s per device) or flops_per_step (%.4g, all devices) is likely "
                    "wrong, or num_devices too small. Pass the FLOPs of step_flops (or a hand "
                    "count over all devices) and the chip's peak "
                    "(peak_flops_per_device(dtype=...)). Warned once.",
                    owner,
                    mfu,
                    extra["perf/tflops_per_second_per_device"] * 1e12 / mfu,
                    extra["perf/flops_per_step"],
                )
        elif self._perf is not None and not self._warned_perf:
            self._warned_perf = True
            _LOG.warning(
                "%s: perf/* needs the window's duration, but %s at step %d: call "
                "manager.start_duration_timer(block_on=state) at the start of every window%s.",
                owner,
                "no window was open" if duration is None else "the window took 0 s",
                step,
                no_window if duration is None else ", and give the manager a clock that advances",
            )
        if self._monitor is not None and time.monotonic() >= self._system_next:
            system = self._monitor.window_values()
            # CPU % needs 0.1 s of CPU times: a summary just after the manager was made (a
            # step-0 eval) has none yet, and the next one brings it, not one 10 s later (a
            # host without it is given 1 s before the interval applies anyway).
            now = time.monotonic()
            self._system_first = min(self._system_first, now)
            if "system/process_cpu_percent" in system or now - self._system_first >= 1.0:
                self._system_next = now + self._system_interval
            extra |= system
            self._host_only = set(system)
        summary.update((key, clu.values.Scalar(value)) for key, value in extra.items())
        return summary

    def _check_windows(self, host: Mapping[str, Any], step: int, num_steps: int) -> None:
        """Warns once each when a `Step` metric's merged count per `num_steps` grew over three
        summaries in a row (cumulative windows: `running = None` forgotten after a summary),
        fell from one to the next (a run's last, shorter window written with the usual
        `num_steps`: per-step averages divided by too many steps), or was 1 for `num_steps` > 1
        three times in a row (`_check_one_step`)."""
        if self._windows is None:
            return
        if not _counts_steps(host.get(self._step_key)):  # a loop sends the same keys: find once
            self._step_key = next((k for k, m in host.items() if _counts_steps(m)), "")
            if not self._step_key:
                return
        merged = float(np.max(host[self._step_key].steps))  # max: one count per device too
        windows = self._windows = [*self._windows[-2:], (merged, num_steps)]
        ratios = [steps / n for steps, n in windows]
        if len(ratios) > 1 and ratios[-1] < ratios[-2] and not self._warned_short:
            self._warned_short = True
            _LOG.warning(
                "%s: the summary at step %d merged %g steps for num_steps=%d, the one before "
                "%g for %d: if this window is shorter (a run's last), pass the steps it holds "
                "as num_steps; per-step averages read %.3gx and steps per second %.3gx their "
                "value otherwise.",
                self._failures.owner,
                step,
                merged,
                num_steps,
                *windows[-2],
                ratios[-1] / ratios[-2],
                ratios[-2] / ratios[-1],
            )
        if len(ratios) == 3 and ratios[0] < ratios[1] < ratios[2] and ratios[2] >= 2 * ratios[0]:
            self._windows = None  # once
            _LOG.warning(
                "%s: the summaries up to step %d merged %s steps for num_steps %s: each window "
                "holds the ones already written. Start every window from running = None after "
                "write_metrics_summary (per-step averages such as loss are cumulative otherwise).",
                self._failures.owner,
                step,
                ", ".join(f"{steps:g}" for steps, _ in windows),
                ", ".join(str(n) for _, n in windows),
            )
        elif merged == 1 and num_steps > 1 and not self._warned_one and len(windows) == 3:
            self._check_one_step(host, step, windows)

    def _check_one_step(
        self, host: Mapping[str, Any], step: int, windows: list[tuple[float, int]]
    ) -> None:
        """Warns once when three summaries in a row each merged one step for `num_steps` > 1,
        every `Step` metric of the last one too: each holds one step's metrics (`running =
        None` before every step, or a step's own metrics passed), so per-step averages read
        that step's total / num_steps. A microbatched step counts one step (`_reduce_merge`);
        a `StepsPerTime` made once per window next to merged metrics counts 1 and is not
        taken: the count is then read from a metric that merged more."""
        if any(steps != 1 or n < 2 for steps, n in windows):
            return
        for key, metric in host.items():
            if _counts_steps(metric) and (merged := float(np.max(metric.steps))) != 1:
                self._step_key, self._windows = key, [(merged, windows[-1][1])]
                return
        self._warned_one = True
        _LOG.warning(
            "%s: the summaries up to step %d each merged 1 step for num_steps %s (%r and every "
            "other Step metric): each holds one step's metrics, as when running = None is set "
            "before every step or a step's own metrics are passed, so per-step averages such "
            "as loss read that step's total / num_steps and the other metrics that step's "
            "alone. Merge every step into running (merge_metrics in the step) and set running "
            "= None only after write_metrics_summary; a metric made once for a whole window "
            "takes steps=num_steps.",
            self._failures.owner,
            step,
            ", ".join(str(n) for _, n in windows),
            self._step_key,
        )

    def _check_opened(
        self,
        host: Mapping[str, Any],
        step: int,
        num_steps: int,
        duration: float | None,
        no_step: float | None,
    ) -> None:
        """Warns once when three timed summaries in a row had their window opened just before
        the call (`start_duration_timer` then `write_metrics_summary`, no train step between):
        each window ends when the step the state came from ends, so it times none of the
        `num_steps` steps, and `timing/*` and `perf/*` rates read far too high."""
        if self._no_step_windows < 0:  # warned
            return
        if no_step is None or duration is None:
            self._no_step_windows = 0
            return
        if self._perf is None and not any(_has_time(m) for m in host.values()):
            return  # nothing reads the window's duration: a summary of untimed keys
        self._no_step_windows += 1
        if self._no_step_windows == 3:
            self._no_step_windows = -1  # once
            _LOG.warning(
                "%s: the windows of the last 3 summaries, up to step %d, were opened by "
                "start_duration_timer %.2g us before write_metrics_summary, with no train step "
                "between: the one at step %d took %.3g s for num_steps=%d, so steps per second "
                "and the other time rates are far too high. Call "
                "manager.start_duration_timer(block_on=state) after write_metrics_summary "
                "(and running = None), so each window holds the next num_steps steps.",
                self._failures.owner,
                step,
                no_step * 1e6,
                step,
                duration,
                num_steps,
            )

    def calls(self, step: int, summary: Mapping[str, Any]) -> list[Any]:
        """The writers' `(method, kwargs)` calls for `summary`, scalars checked once for all."""
        skipped: dict[str, str] = {}
        calls = writers.group_values(summary, skipped)
        # That key is lost, not the summary; recorded under a key process 0 refuses too, as
        # the other processes (nothing refused) record it: under "raise" it stops each alike.
        for key, what in skipped.items():
            unwritable = TypeError(values_lib.unsupported_message({key: what}))
            self._record(Failure(f"metric:{key}", step, (key,), unwritable))
        calls = [call for call in calls if self._checked(step, *call)]
        for method, kwargs in calls:
            if method == "write_scalars":
                scalars = _checks.check_numbers(kwargs["scalars"], "write_metrics_summary")
                kwargs["scalars"] = _checks.Checked(scalars)
                if self._zero_window:
                    scalars = {k: v for k, v in scalars.items() if k not in self._zero_window}
                where = "in the summary window ending at"
                self.check_finite(
                    step, scalars, where, warn_only=self._host_only, metrics=self._host
                )
        self._host = {}
        # Only now, so process 0 checks what the others (no writers, nothing refused) check:
        # a NaN under a refused key stopped them under nonfinite="stop", and not process 0.
        if any(self.refused.values()):  # each call without the keys refused in that call
            for method, kwargs in calls:
                values = next(iter(kwargs.values()))  # scalars, texts, arrays, ...
                for key in self.refused[method].keys() & values.keys():
                    del values[key]
                    kwargs.get("num_buckets", {}).pop(key, None)
            calls = [call for call in calls if next(iter(call[1].values()))]
        return calls

    def _checked(self, step: int, method: str, kwargs: dict[str, Any]) -> bool:
        """Drops, as failed metrics, the keys of an image, histogram, audio, text or hparams
        call that no writer would take (a NaN histogram, an [H, W] image, an unprintable
        HyperParam): each writer refused the whole call, the good keys too, and counted a
        failure toward its quarantine. False: none left."""
        if (spec := _KINDS.get(method)) is None:
            return True
        arg, kind = spec
        values = kwargs[arg]
        bad: dict[str, Exception] = {}
        with jax.transfer_guard("allow"):  # a ready value may still be a device array
            for key, value in values.items():
                problems = _checks.Problems("write_metrics_summary")
                if kind == "text":
                    _checks.collect_texts({key: value}, problems)
                elif kind == "hparam":  # a metric's HyperParam, as write_hparams checks it
                    _checks.flat_hparams({key: value}, problems)
                elif message := _checks.array_problem(kind, key, np.asarray(value)):
                    problems.value_problem(message)
                elif kind == "histogram":
                    buckets = {key: kwargs["num_buckets"].get(key)}
                    _checks.check_buckets(buckets, problems, {key: value})
                if problems:
                    kind_of = TypeError if problems.type_errors else ValueError
                    bad[key] = kind_of(problems.message())
        if kind == "audio":
            try:
                _checks.check_sample_rate(kwargs["sample_rate"], "write_metrics_summary")
            except (TypeError, ValueError) as rate_error:
                bad = dict.fromkeys(values, rate_error)
        for key, error in bad.items():
            del values[key]
            kwargs.get("num_buckets", {}).pop(key, None)  # naming a key not in the call: refused
            self._record(Failure(f"metric:{key}", step, (key,), error))
        return bool(values)

    def _record(self, failure: Failure, fatal: bool | None = None) -> None:
        self.recorded = failure
        self._failures.record(failure, fatal=fatal)

    def check_finite(
        self,
        step: int,
        scalars: Mapping[str, Any],
        where: str,
        warn_only: Set[str] = frozenset(),
        metrics: Mapping[str, Any] = {},
    ) -> None:
        """Applies the `nonfinite` policy to checked numbers `scalars` (written `where` step);
        keys in `warn_only` (system/*, sampled on process 0 alone, whose stop would leave the
        others waiting in their next collective) are warned of under "stop" too; those of
        `metrics` (the summary's, on the host) that hold nothing are named with the likely
        cause and the fix."""
        if self._nonfinite == "ignore":
            return
        bad = sorted(k for k, v in scalars.items() if type(v) is float and not math.isfinite(v))
        empty = _empty_keys(metrics) if bad else set()  # read only then: ~0.5 us a metric
        stop = [k for k in bad if k not in warn_only] if self._nonfinite == "stop" else []
        if stop:
            err = FloatingPointError(
                f"non-finite values {where} step {step} for keys {stop}; the run was stopped "
                f"by nonfinite='stop'{_empty_cause([k for k in stop if k in empty])}"
            )
            self._record(Failure("nonfinite", step, tuple(stop), err), fatal=True)
        if new := sorted(set(bad) - set(stop) - self._nonfinite_warned):  # once per key
            self._nonfinite_warned.update(new)
            _LOG.warning(
                "%s: non-finite values at step %d for %s%s",
                self._failures.owner,
                step,
                new,
                _empty_cause([k for k in new if k in empty]),
            )


_KINDS = {  # the calls whose values are checked per key: method -> (argument, kind)
    "write_images": ("images", "image"),
    "write_histograms": ("arrays", "histogram"),
    "write_audios": ("audios", "audio"),
    "write_texts": ("texts", "text"),
    "write_hparams": ("hparams", "hparam"),
}


def to_host(
    metrics: Mapping[str, Any] | PackedMetrics,
    near_limit: list[str] | None = None,
    step: int | None = None,
    negative: list[str] | None = None,
    host_numbers: bool = True,
    host_buffers: list[np.ndarray] | None = None,
) -> dict[str, Any]:
    """NumPy copies, in one transfer (a PackedMetrics': `host_buffers` if copied already);
    keys with an int32 leaf past 2**30 go to `near_limit`, every key to `negative` if an int
    leaf is below 0 (a count that may have wrapped: one look at each buffer instead of one per
    metric, ~45 us a summary of 20); `step` names the summary in errors. With `host_numbers`
    (leaves that are no JAX arrays), a metric holding one that JAX would change
    (`_changed_on_device`) is computed on the host instead."""
    if not metrics:
        return {}
    kept: dict[str, Any] = {}  # metrics holding a host number the device would change
    narrowed = jax.dtypes.canonicalize_dtype(np.int64) != np.int64  # no jax_enable_x64
    if host_numbers and narrowed and not isinstance(metrics, PackedMetrics):
        kept = {
            k: m for k, m in metrics.items() if any(map(_changed_on_device, jax.tree.leaves(m)))
        }
    if isinstance(metrics, PackedMetrics):
        packed = metrics
        if host_buffers is None:
            host_buffers = _packed_on_host(packed, step)
        on_host: dict[str, Any] = {}
    else:
        try:  # host numbers among the leaves go to the device: the worker's own transfer
            with jax.transfer_guard_host_to_device("allow"):
                packed = _pack({k: m for k, m in metrics.items() if k not in kept})
            host_buffers = _fetch(packed.buffers)
            on_host = {k: _fetch_tree(m) for k, m in kept.items()}
        except Exception as err:  # JAX's bare "Array has been deleted"
            if deleted := _deleted_problem(metrics, step):
                raise deleted from err
            raise
    host = packed.unpack_host(host_buffers)
    if on_host:  # in the metrics' order
        host = {k: on_host[k] if k in on_host else host[k] for k in metrics}
    below, near = _int_bounds(host_buffers)
    if negative is not None and below:
        negative += [k for k in host if k not in on_host]  # an int32 count that wrapped
    if near_limit is not None and near:
        near_limit += [
            k for k, m in host.items() if any(map(_near_int32_limit, jax.tree.leaves(m)))
        ]
    return host


def _packed_on_host(packed: PackedMetrics, step: int | None) -> list[np.ndarray]:
    """The host copies of `packed.buffers`, in one transfer."""
    try:
        return _fetch(packed.buffers)
    except Exception as err:  # JAX's bare "Array has been deleted"
        if deleted := _deleted_problem(packed, step):
            raise deleted from err
        raise


def _int_bounds(host_buffers: list[np.ndarray]) -> tuple[bool, bool]:
    """Whether an int leaf is below 0, and whether an int32 one is past +-2**30."""
    bounds = [(b.min(), b.max(), b.dtype) for b in host_buffers if b.dtype.kind == "i" and b.size]
    below = any(low < 0 for low, _, _ in bounds)
    near = any(
        t == np.int32 and (hi >= _INT32_NEAR or low <= -_INT32_NEAR) for low, hi, t in bounds
    )
    return below, near


def _changed_on_device(leaf: Any) -> bool:
    """Whether JAX without x64 would change host number `leaf`: an int past 32 bits wraps
    there (a NumPy int64 3_000_000_000 read -1294967296, a uint64 2**40 read 0; a Python int
    raised OverflowError, which lost the whole summary) and a float past float32's range
    becomes inf (1e40), and one float32 cannot hold is rounded (a float64 0.1 read
    0.10000000149011612). Such a metric is computed on the host, where it keeps its value."""
    if isinstance(leaf, jax.Array) or isinstance(leaf, bool):
        return False
    if isinstance(leaf, int):
        return not -(2**31) <= leaf < 2**31
    if isinstance(leaf, float):
        with np.errstate(over="ignore"):
            return math.isfinite(leaf) and float(np.float32(leaf)) != leaf
    if not isinstance(leaf, np.ndarray | np.generic) or not leaf.size or leaf.dtype.itemsize < 8:
        return False
    if leaf.dtype.kind in "iu":
        info = np.iinfo(np.int32 if leaf.dtype.kind == "i" else np.uint32)
        return bool(leaf.min() < info.min or leaf.max() > info.max)
    if leaf.dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            return bool(np.any((leaf.astype(np.float32) != leaf) & np.isfinite(leaf)))
    return False


def _fetch_tree(metric: Any) -> Any:
    """`metric` with its device leaves (beside the host numbers kept) copied to the host."""
    with jax.transfer_guard_device_to_host("allow"):
        return jax.device_get(metric)


def _deleted_problem(
    metrics: Mapping[str, Any] | PackedMetrics, step: int | None
) -> ValueError | None:
    """The error naming the metrics' donated arrays and the fix; None if none was donated."""
    packed = isinstance(metrics, PackedMetrics)
    parts: dict[Any, Any]
    if isinstance(metrics, PackedMetrics):
        keys, parts = metrics.keys(), dict(enumerate(metrics.buffers))
    else:
        keys, parts = list(metrics), dict(metrics)
    deleted = [
        f"buffer {name} ({part.dtype}[{part.size}])" if packed else repr(name)
        for name, part in parts.items()
        if any(isinstance(x, jax.Array) and x.is_deleted() for x in jax.tree.leaves(part))
    ]
    if not deleted:
        return None
    if packed:
        what = f"{', '.join(deleted)} {'was' if len(deleted) == 1 else 'were'}"
    else:
        what = f"the arrays of {', '.join(deleted)} were"
    return ValueError(
        f"Cannot copy the metrics {keys}"
        + ("" if step is None else f" of the summary at step {step}")
        + f" to the host: {what} "
        "deleted (donated to a later computation). A step that donates `running` needs "
        "`running = None` after each write_metrics_summary (NNX metrics: `metrics.reset()`), "
        "so the next window starts afresh; otherwise do not donate the metrics you pass (or "
        "pass a copy)."
    )


def _ready_on_host(
    ready: dict[str, Any], failed: Callable[[str, Exception], None]
) -> dict[str, Any]:
    """`ready` with the device arrays inside its values (a step's plain `loss` as a `Scalar`)
    copied in one transfer, as the metrics are; a deleted (donated) one costs its key."""
    on_device = [k for k, v in ready.items() if isinstance(getattr(v, "value", None), jax.Array)]
    if not on_device:
        return ready
    out, fetch = dict(ready), []
    for key in on_device:
        if not ready[key].value.is_deleted():
            fetch.append(key)
            continue
        del out[key]
        failed(key, ValueError(_checks.donated_problem(f"metric {key!r}")))
    try:
        fetched = _fetch(tuple(ready[k].value for k in fetch))
    except Exception:  # JAX's bare "Array has been deleted": the whole summary was lost
        if not any(ready[k].value.is_deleted() for k in fetch):
            raise
        return _ready_on_host(out, failed)  # donated since the look: that key alone is lost
    for key, value in zip(fetch, fetched, strict=True):
        out[key] = dataclasses.replace(ready[key], value=value)
    return out


def _fetch(buffers: tuple[Any, ...]) -> list[np.ndarray]:
    """`jax.device_get(buffers)` (transfer guards allowing it too), less its async copy of
    buffers already in host memory: on CPU that copy cost ~40 us a summary, the read ~2 us."""
    with jax.transfer_guard_device_to_host("allow"):
        for b in buffers:
            if isinstance(b, jax.Array) and {d.platform for d in b.devices()} != {"cpu"}:
                b.copy_to_host_async()  # start every transfer before waiting on the first
        return [np.asarray(b) for b in buffers]


# The guards' effective settings (this thread's, else the global ones): entering
# `jax.transfer_guard("allow")` costs ~10 us, a tenth of a summary's own work, where the
# loop set no guard (almost always); a JAX without these reads enters it every time.
_GUARDS = [
    getattr(_jax_config, f"transfer_guard_{way}", None)
    for way in ("host_to_device", "device_to_host", "device_to_device")
]


def _transfers_allowed() -> contextlib.AbstractContextManager[Any]:
    """`jax.transfer_guard("allow")`, or nothing where every transfer is allowed already."""
    if all(getattr(g, "value", "?") in (None, "allow") for g in _GUARDS):
        return contextlib.nullcontext()
    return jax.transfer_guard("allow")


def _near_int32_limit(array: Any) -> bool:
    return (
        getattr(array, "dtype", None) == np.int32
        and array.size > 0
        and (array.max() >= _INT32_NEAR or array.min() <= -_INT32_NEAR)
    )


def _wrapped_count(metric: Any) -> int | None:
    """The lowest `count` of `metric` (a Collection's fields too) if an int one is below 0:
    wrapped past int32's range (CLU's `Average`, `Accuracy`, `Std` count in int32)."""
    if isinstance(metric, clu_metrics.Collection):
        counts = [_wrapped_count(m) for m in vars(metric).values()]
        return min((c for c in counts if c is not None), default=None)
    count = getattr(metric, "count", None)
    if isinstance(count, np.ndarray | np.integer) and np.issubdtype(count.dtype, np.integer):
        if count.size and (low := int(np.min(count))) < 0:
            return low
    return None


def _empty_keys(host: Mapping[str, Any]) -> set[str]:
    """The keys written for metrics of `host` (a Collection's too) whose `count` is 0: nothing
    was merged into them since they were made or reset, so their value is NaN."""
    empty: set[str] = set()
    for key, metric in host.items():
        if isinstance(metric, clu_metrics.Collection):
            fields = metrics_lib.collection_fields(metric).items()
            items = [(f"{key}/{name}", m) for name, m in fields]
        else:
            items = [(key, metric)]
        for name, m in items:
            count = getattr(m, "count", None)
            if isinstance(count, np.ndarray | np.generic) and count.size == 1 and count == 0:
                empty.update(metrics_lib.written_keys(name, m))
    return empty


def _empty_cause(keys: list[str]) -> str:
    """What the non-finite message adds for `keys` of metrics holding nothing (a count of 0):
    an NNX loop calling `metrics.reset()` before the summary call wrote NaN for every window,
    and was told only that the values were not finite."""
    if not keys:
        return ""
    return (
        f"; {keys} hold no values (a count of 0: nothing was merged into them since they were "
        "made or reset), so they read NaN. An NNX loop that calls metrics.reset() before "
        "write_metrics_summary writes this for every window: call metrics.reset() after it "
        "(the summary reads the metrics at the call)"
    )


def _counts_steps(metric: Any) -> bool:
    return isinstance(metric, metrics_lib.Step) and metric.steps is not None


def _without_time(host: dict[str, Any], unset: bool = False) -> tuple[dict[str, Any], list[str]]:
    """`host` without its time metrics (`unset`: those with no duration), and their keys; a
    Collection's other fields are kept under the keys they write (`c/loss`)."""
    kept, timed = {}, []
    for key, metric in host.items():
        if not _has_time(metric, unset):
            kept[key] = metric
        elif isinstance(metric, clu_metrics.Collection) and not metrics_lib.replicated_problem(
            metric
        ):
            for name, field in metrics_lib.collection_fields(metric).items():
                if _has_time(field, unset):
                    timed.append(f"{key}/{name}")
                else:
                    kept[f"{key}/{name}"] = field
        else:
            timed.append(key)
    return kept, timed


def _has_time(metric: Any, unset: bool = False) -> bool:
    if isinstance(metric, clu_metrics.Collection):
        return any(_has_time(m, unset) for m in vars(metric).values())
    return metrics_lib.is_time_metric(metric) and not (unset and metric.duration is not None)
