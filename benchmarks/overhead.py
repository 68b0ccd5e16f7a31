"""Table 1: what metrics cost the training loop, side by side with the alternatives.

A ~0.6 ms jitted SGD step of a small model (`benchmarks.model`) returns a 20-metric dict;
the loop runs 2,000 steps and writes a summary every 100 steps, then every step, to
console + TensorBoard + JSONL. Four ways of doing it (two settings of this library),
plus a reference, measured interleaved in the same run:

  (a) no metrics at all: the baseline every ratio is taken against;
  (a') the step computes its metrics and the loop drops them (what computing them costs);
  (b) this library, the README's loop: metrics merged inside the jitted step with buffer
      donation (`merge_metrics`, which packs them there into one buffer per dtype),
      summaries through `MetricsManager`;
  (b0) the same with `merge_metrics(..., pack=False)` (one buffer per metric leaf);
  (c) T5X's way: the step returns its metrics, a separate jitted merge is dispatched after
      every step, and at summary time every leaf is fetched with its own `jax.device_get`
      before a background thread computes and writes the values;
  (d) the naive way: `float(loss)` every step, and at summary time `float()` per value and
      tensorboardX `add_scalar` per value.

Each timed run covers the loop plus flushing every summary it wrote (a summary still in a
background queue counts), so work moved off the loop thread is not hidden.

Run alone: `python -m benchmarks.overhead [--quick]`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import gc
import json
import multiprocessing
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import common, model

VARIANTS = ("none", "computed", "library", "dict", "t5x", "naive")
LABELS = {
    "none": "(a) no metrics",
    "computed": "(a') metrics computed in the step, then dropped",
    "library": "(b) this library, the README's loop: merge_metrics (packed inside jit)",
    "dict": "(b0) this library, merge_metrics(pack=False) (one buffer per metric leaf)",
    "t5x": "(c) T5X: jitted merge per step + per-leaf device_get",
    "naive": "(d) naive: float(loss) per step + add_scalar per value",
}
TARGETS = {100: 1.02, 1: 1.15}


WINDOW = 100
BLOCK = 100  # steps per block of the paired measurement (`paired`)


@dataclasses.dataclass
class Timing:
    """One timed loop: totals, and the time of every `WINDOW`-step window in it.

    Attributes:
      wall: wall seconds of the whole loop, final flush included.
      cpu: process CPU seconds (all threads) of the whole loop.
      windows: wall seconds of each complete window of `WINDOW` steps.
      cpu_windows: process CPU seconds of each window.
      tail: wall seconds after the last window boundary (leftover steps, final flush).
    """

    wall: float
    cpu: float
    windows: list[float]
    cpu_windows: list[float]
    tail: float


class Stopwatch:
    """Marks wall and process CPU time at window boundaries of a loop."""

    def __init__(self) -> None:
        self.marks = [(time.perf_counter(), time.process_time())]

    def step_done(self, steps: int) -> None:
        """Call after every step with the number of steps done so far."""
        if steps % WINDOW == 0:
            self.marks.append((time.perf_counter(), time.process_time()))

    def read(self) -> Timing:
        end = (time.perf_counter(), time.process_time())
        walls = [b[0] - a[0] for a, b in zip(self.marks[:-1], self.marks[1:], strict=True)]
        cpus = [b[1] - a[1] for a, b in zip(self.marks[:-1], self.marks[1:], strict=True)]
        start = self.marks[0]
        return Timing(
            wall=end[0] - start[0],
            cpu=end[1] - start[1],
            windows=walls,
            cpu_windows=cpus,
            tail=end[0] - self.marks[-1][0],
        )


def summary_name(every: int) -> str:
    return "summary every step" if every == 1 else f"summary every {every} steps"


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Sends stdout (the console writers) to /dev/null: their formatting cost still counts."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield


def make_writer(logdir: str | None) -> Any:
    """The writers every variant with writers uses: the default set (console + TensorBoard +
    JSONL), synchronous: the manager's worker calls them, as under the README's loop."""
    import writers  # noqa: PLC0415

    return writers.create_default_writer(logdir, console=True, tensorboard=True, jsonl=True)


class Loops:
    """The compiled steps of every variant for one model size, and one timed loop per variant."""

    def __init__(self, size: model.ModelSize = model.DEFAULT) -> None:
        from metrics_manager import merge_metrics  # noqa: PLC0415

        self.size = size
        self.params0 = model.init_params(jax.random.PRNGKey(0), size)
        self.batch = model.make_batch(jax.random.PRNGKey(1), size)

        def grads_and_metrics(params, batch):
            (loss, aux), grads = jax.value_and_grad(model.loss_and_aux, has_aux=True)(params, batch)
            return grads, model.step_metrics(params, grads, batch, loss, aux)

        @functools.partial(jax.jit, donate_argnums=0)
        def step_none(params, batch):
            grads = jax.grad(lambda p, b: model.loss_and_aux(p, b)[0])(params, batch)
            return model.sgd(params, grads)

        @functools.partial(jax.jit, donate_argnums=(0, 1))
        def step_library(params, running, batch):
            grads, metrics = grads_and_metrics(params, batch)
            return model.sgd(params, grads), merge_metrics(running, metrics)

        @functools.partial(jax.jit, donate_argnums=0)
        def step_t5x(params, batch):
            grads, metrics = grads_and_metrics(params, batch)
            return model.sgd(params, grads), metrics

        @jax.jit
        def merge_t5x(a, b):
            # T5X's `_merge_metrics`: Metric.merge key by key of the dict.
            return {k: a[k].merge(b[k]) for k in a}

        @functools.partial(jax.jit, donate_argnums=0)
        def step_naive(params, batch):
            grads, metrics = grads_and_metrics(params, batch)
            loss = metrics["loss"].total
            return model.sgd(params, grads), loss, model.metric_values(metrics)

        @functools.partial(jax.jit, donate_argnums=(0, 1))
        def step_dict(params, running, batch):
            grads, metrics = grads_and_metrics(params, batch)
            return model.sgd(params, grads), merge_metrics(running, metrics, pack=False)

        self.step_dict = step_dict
        self.step_none = step_none
        self.step_computed = step_t5x  # the reference (a'): the same step, metrics dropped
        self.step_library = step_library
        self.step_t5x = step_t5x
        self.merge_t5x = merge_t5x
        self.step_naive = step_naive

    def fresh_params(self) -> model.Params:
        params = jax.tree.map(jnp.copy, self.params0)
        return jax.block_until_ready(params)

    def run(self, variant: str, num_steps: int, every: int) -> Timing:
        """One timed loop of `variant`."""
        loop: Callable[[str, int, int], Timing] = getattr(self, f"_run_{variant}")
        logdir = tempfile.mkdtemp(prefix=f"bench_{variant}_")
        try:
            gc.collect()
            with quiet_stdout():
                return loop(logdir, num_steps, every)
        finally:
            shutil.rmtree(logdir, ignore_errors=True)

    def warm_up(self) -> None:
        """Compiles every path (first step, merge, summary) of every variant, untimed."""
        for variant in VARIANTS:
            self.run(variant, num_steps=4, every=2)

    def _run_none(self, logdir: str, num_steps: int, every: int) -> Timing:
        del logdir, every
        params, batch = self.fresh_params(), self.batch
        clock = Stopwatch()
        for i in range(num_steps):
            params = self.step_none(params, batch)
            clock.step_done(i + 1)
        jax.block_until_ready(params)
        return clock.read()

    def _run_computed(self, logdir: str, num_steps: int, every: int) -> Timing:
        del logdir, every
        params, batch = self.fresh_params(), self.batch
        clock = Stopwatch()
        for i in range(num_steps):
            params, _ = self.step_computed(params, batch)
            clock.step_done(i + 1)
        jax.block_until_ready(params)
        return clock.read()

    def _run_library(self, logdir: str, num_steps: int, every: int) -> Timing:
        return self._run_manager(self.step_library, logdir, num_steps, every)

    def _run_dict(self, logdir: str, num_steps: int, every: int) -> Timing:
        return self._run_manager(self.step_dict, logdir, num_steps, every)

    def _run_manager(
        self, train_step: Callable[..., Any], logdir: str, num_steps: int, every: int
    ) -> Timing:
        """The README's loop: in-step merge with donation, a summary every `every` steps."""
        from metrics_manager import MetricsManager  # noqa: PLC0415

        params, batch = self.fresh_params(), self.batch
        manager = MetricsManager("train", summary_dir=logdir, writer_factory=make_writer)
        try:
            clock = Stopwatch()
            manager.start_duration_timer(block_on=params)
            running = None
            for i in range(num_steps):
                params, running = train_step(params, running, batch)
                if (i + 1) % every == 0:
                    manager.write_metrics_summary(running, i + 1, every)
                    running = None
                    manager.start_duration_timer(block_on=params)
                clock.step_done(i + 1)
            manager.flush()
            jax.block_until_ready(params)
            return clock.read()
        finally:
            manager.close()

    def blocks_none(self, slower: float = 0.0) -> Iterator[float]:
        """(a) as endless blocks of `BLOCK` steps: yields each block's wall seconds.

        Args:
          slower: a block then sleeps this fraction of its own time: a known regression
            (0.05: 5% slower) that shows what the paired measurement can resolve.
        """
        params, batch = self.fresh_params(), self.batch
        while True:
            start = time.perf_counter()
            for _ in range(BLOCK):
                params = self.step_none(params, batch)
            jax.block_until_ready(params)
            if slower:
                time.sleep(slower * (time.perf_counter() - start))
            yield time.perf_counter() - start

    def blocks_library(self, every: int) -> Iterator[float]:
        """(b) as endless blocks of `BLOCK` steps; a block ends once its summaries are written.

        The blocks are offset by half a summary interval, so a summary every `BLOCK` steps
        falls mid-block: its background work runs beside the block's steps, as in the loop,
        instead of spilling into the next block (which may be one of (a)). A block ends when
        the device finished its steps and the block's last summary is written (its future
        resolved): whatever the loop would overlap with later steps is charged here.
        """
        from metrics_manager import MetricsManager  # noqa: PLC0415

        params, batch = self.fresh_params(), self.batch
        logdir = tempfile.mkdtemp(prefix="bench_blocks_")
        manager = MetricsManager("train", summary_dir=logdir, writer_factory=make_writer)
        steps, running, last = 0, None, None

        def advance(count: int) -> None:
            nonlocal params, running, steps, last
            for _ in range(count):
                params, running = self.step_library(params, running, batch)
                steps += 1
                if steps % every == 0:
                    last = manager.write_metrics_summary(running, steps, every)
                    running = None
                    manager.start_duration_timer(block_on=params)

        try:
            manager.start_duration_timer(block_on=params)
            advance(every // 2 % BLOCK)  # untimed
            while True:
                start = time.perf_counter()
                advance(BLOCK)
                jax.block_until_ready(params)
                if last is not None:
                    last.result()
                yield time.perf_counter() - start
        finally:
            manager.close()
            shutil.rmtree(logdir, ignore_errors=True)

    def _run_t5x(self, logdir: str, num_steps: int, every: int) -> Timing:
        import writers  # noqa: PLC0415
        from metrics_manager import (  # noqa: PLC0415
            set_step_metrics_num_steps,
            set_time_metrics_duration,
        )

        def summarize(host_metrics: Mapping[str, Any], step: int, duration: float) -> None:
            final = set_time_metrics_duration(host_metrics, duration)
            final = set_step_metrics_num_steps(final, every)
            summary = {k: v.compute_value() for k, v in final.items()}
            writers.write_values(writer, step, summary)

        params, batch = self.fresh_params(), self.batch
        writer = make_writer(os.path.join(logdir, "train"))
        pool = concurrent.futures.ThreadPoolExecutor(1)
        try:
            clock = Stopwatch()
            futures = []
            window_start = time.monotonic()
            running = None
            for i in range(num_steps):
                params, metrics = self.step_t5x(params, batch)
                running = metrics if running is None else self.merge_t5x(running, metrics)
                if (i + 1) % every == 0:
                    # T5X fetches leaf by leaf: one device_get (and one sync) per leaf.
                    host = jax.tree.map(jax.device_get, running)
                    now = time.monotonic()
                    futures.append(pool.submit(summarize, host, i + 1, now - window_start))
                    window_start = now
                    running = None
                clock.step_done(i + 1)
            for future in futures:
                future.result()
            writer.flush()
            jax.block_until_ready(params)
            return clock.read()
        finally:
            pool.shutdown()
            writer.close()

    def _run_naive(self, logdir: str, num_steps: int, every: int) -> Timing:
        import tensorboardX  # noqa: PLC0415

        params, batch = self.fresh_params(), self.batch
        tb = tensorboardX.SummaryWriter(os.path.join(logdir, "train"))
        try:
            with open(os.path.join(logdir, "metrics.jsonl"), "w") as jsonl:
                clock = Stopwatch()
                loss_sum = 0.0
                for i in range(num_steps):
                    params, loss, values = self.step_naive(params, batch)
                    loss_sum += float(loss)
                    if (i + 1) % every == 0:
                        step = i + 1
                        scalars = {k: float(v) for k, v in values.items()}
                        scalars["loss"] = loss_sum / every
                        loss_sum = 0.0
                        for key, value in scalars.items():
                            tb.add_scalar(key, value, step)
                        print(f"[{step}] " + ", ".join(f"{k}={v:.6g}" for k, v in scalars.items()))
                        jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
                    clock.step_done(i + 1)
                tb.flush()
                jsonl.flush()
                jax.block_until_ready(params)
                return clock.read()
        finally:
            tb.close()


def run(
    quick: bool = False,
    *,
    num_steps: int | None = None,
    repeats: int | None = None,
    summary_every: tuple[int, ...] = (100, 1),
    size: model.ModelSize = model.DEFAULT,
    explain_misses: bool | None = None,
    pairs: int | None = None,
    pair_repeats: int | None = None,
) -> common.Table:
    """Measures every variant at each summary frequency, interleaved; medians and ratios.

    Args:
      quick: fewer steps and repetitions (same table).
      num_steps: steps per timed loop (default 2,000; quick 1,000).
      repeats: timed loops per variant and frequency (default 5; quick 2).
      summary_every: summary frequencies, in steps.
      size: model and batch sizes.
      explain_misses: for each missed target, add a cProfile of (b) at that frequency and
        a breakdown of one summary's host work to the notes (default: unless quick).
      pairs: pairs of blocks per repeat of the paired measurement (default 40; quick 20).
      pair_repeats: repeats of the paired measurement (default 5; quick 3).

    Returns:
      The table: one row per (frequency, variant) with the median wall seconds, microseconds
      per step, the ratio to variant (a) at the same frequency, and the same ratio for
      process CPU time (all threads), which machine load distorts less.
    """
    num_steps = num_steps or (1000 if quick else 2000)
    repeats = repeats or (2 if quick else 5)
    loops = Loops(size)
    loops.warm_up()
    runs = {
        (every, variant): functools.partial(loops.run, variant, num_steps, every)
        for every in summary_every
        for variant in VARIANTS
    }
    samples = common.interleaved(runs, repeats)
    pairs = pairs or (20 if quick else 40)
    pair_repeats = pair_repeats or (3 if quick else 5)
    repeats_paired = [
        in_fresh_process(paired_in_process, size, summary_every, pairs) for _ in range(pair_repeats)
    ]

    def pooled(key: str) -> dict[str, Any]:
        medians = [common.median(repeat[key]) for repeat in repeats_paired]
        return {
            "ratios": [ratio for repeat in repeats_paired for ratio in repeat[key]],
            "ratio": common.median(medians),
            "repeat_ratios": medians,
        }

    paired_ratios = {every: pooled(str(every)) for every in summary_every}
    # What the paired measurement resolves: (a) against itself made 5% slower.
    resolution = pooled("slower")
    table = common.Table(
        key="overhead",
        title="1. Training-loop overhead",
        description=(
            f"{num_steps:,} steps of a jitted SGD step of a per-token MLP language model "
            f"(batch {size.batch}x{size.length} tokens, vocabulary {size.vocab}, widths "
            f"{size.embed}/{size.hidden}) returning {model.NUM_METRICS} metrics (T5X's base "
            "metrics via `compute_base_metrics`, learning rate, gradient norm); writers "
            "console (to /dev/null) + TensorBoard + JSONL. Each time covers the loop and "
            "flushing every summary. (a') is the step of (c) with its metrics dropped: what "
            "computing them costs before anything is merged or written. (b) is the README's "
            "loop (`merge_metrics` packs the window's metrics into one buffer per dtype "
            "inside jit); (b0) is that loop with `pack=False` (one buffer per metric leaf). "
            f"{repeats} interleaved runs per cell; time = median {WINDOW}-step window (over "
            "all windows of all runs) x windows + median final flush, so a burst of load "
            "from another process spoils a window, not a run; ratio = time / time of (a) at "
            "the same summary frequency; CPU ratio = the same for process CPU time (all "
            "threads), which steady load distorts less; median run = median of whole-run "
            "times, with its own ratio. The targets are read from the paired ratio: (a) "
            f"and (b) run as two live loops, a block of {BLOCK} steps of each in turn, and "
            "each (b) block over the (a) block next to it is one ratio; a repeat is "
            f"{pairs} pairs in a fresh process (a process's compiles and memory layout move "
            f"its ratios by a few percent); ratio = median of {pair_repeats} repeats' "
            "medians, spread = their min-max; a summary every 100 steps falls mid-block, and a (b) block ends once "
            "its last summary is written, so no summary work is hidden in the next block. "
            "The same measurement of (a) against (a) made 5% slower (a sleep of 5% of each "
            "block) shows the regression it resolves."
        ),
        columns=[
            common.Column("summary", "summaries"),
            common.Column("label", "variant"),
            common.Column("seconds", "time (s)", ".3f"),
            common.Column("us_per_step", "per step (us)", ".1f"),
            common.Column("overhead_us", "overhead per step (us)", ".1f"),
            common.Column("ratio", "ratio to (a)", ".3f", "x"),
            common.Column("cpu_ratio", "CPU ratio to (a)", ".3f", "x"),
            common.Column("run_seconds", "median run (s)", ".3f"),
            common.Column("run_ratio", "run ratio to (a)", ".3f", "x"),
            common.Column("spread", "per-run ratios (min-max)"),
            common.Column("paired_ratio", "paired ratio to (a)", ".3f", "x"),
            common.Column("paired_spread", "paired, repeats (min-max)"),
        ],
    )
    estimates = {key: estimate(timings, num_steps) for key, timings in samples.items()}
    for every in summary_every:
        base = estimates[(every, "none")]
        for variant in VARIANTS:
            est = estimates[(every, variant)]
            per_run = [
                run_time(t, num_steps) / run_time(b, num_steps)
                for t, b in zip(samples[(every, variant)], samples[(every, "none")], strict=True)
            ]
            table.rows.append(
                {
                    "summary": summary_name(every),
                    "every": every,
                    "variant": variant,
                    "label": LABELS[variant],
                    **est,
                    "baseline_seconds": base["seconds"],
                    "baseline_cpu_seconds": base["cpu_seconds"],
                    "baseline_run_seconds": base["run_seconds"],
                    "us_per_step": est["seconds"] / num_steps * 1e6,
                    "overhead_us": (est["seconds"] - base["seconds"]) / num_steps * 1e6,
                    "ratio": common.ratio(est["seconds"], base["seconds"]),
                    "cpu_ratio": common.ratio(est["cpu_seconds"], base["cpu_seconds"]),
                    "run_ratio": common.ratio(est["run_seconds"], base["run_seconds"]),
                    "per_run_ratios": per_run,
                    "spread": f"{min(per_run):.3f}x-{max(per_run):.3f}x",
                }
            )
            if variant == "library":
                pair = paired_ratios[every]
                table.rows[-1] |= {
                    "paired_ratios": pair["ratios"],
                    "paired_ratio": pair["ratio"],
                    "paired_repeat_ratios": pair["repeat_ratios"],
                    "paired_spread": "{:.3f}x-{:.3f}x".format(
                        min(pair["repeat_ratios"]), max(pair["repeat_ratios"])
                    ),
                }
    names = {
        "library": "overhead",
        "dict": "overhead, unpacked merge (pack=False)",
        "t5x": "T5X's way",
        "naive": "naive way",
    }
    for variant, name in names.items():
        for row in table.rows:
            if row["variant"] == variant and "paired_ratio" in row:
                table.headlines.append(
                    f"{name} ({row['summary']}): {row['paired_ratio']:.3f}x (paired blocks, "
                    f"repeats {row['paired_spread']}); whole runs {row['ratio']:.3f}x "
                    f"(runs {row['spread']})"
                )
            elif row["variant"] == variant:
                table.headlines.append(
                    f"{name} ({row['summary']}): {row['ratio']:.3f}x (runs {row['spread']})"
                )
    repeat_ratios = resolution["repeat_ratios"]
    spread = f"{min(repeat_ratios):.3f}x-{max(repeat_ratios):.3f}x"
    table.headlines.append(
        f"paired blocks, (a) made 5% slower over (a): {resolution['ratio']:.3f}x "
        f"(repeats {spread}): the regression the paired ratios resolve"
    )
    for row in table.rows:
        if row["variant"] == "library" and row["every"] in TARGETS:
            table.targets.append(
                common.Target(
                    f"overhead ({row['summary']}, paired blocks)",
                    row["paired_ratio"],
                    TARGETS[row["every"]],
                )
            )
    if explain_misses is None:
        explain_misses = not quick
    if explain_misses:
        for target in table.targets:
            if not target.met:
                every = next(e for e in summary_every if summary_name(e) in target.name)
                table.notes.append(explain(loops, every, num_steps=min(num_steps, 500)))
    return table


def paired(base: Iterator[float], other: Iterator[float], *, pairs: int) -> list[float]:
    """`other`'s time over `base`'s, from adjacent blocks: the ratios the targets are read from.

    Two live loops run side by side, one block of each in turn (which goes first
    alternates), so each ratio compares two blocks timed ~0.1 s apart: load that drifts over
    seconds, which moves whole runs by +-10% on a shared machine, hits both blocks alike.

    Args:
      base: block times of the baseline loop, e.g. `Loops.blocks_none()`; closed at the end.
      other: block times of the loop measured against it; closed at the end.
      pairs: pairs of blocks to time (after 3 untimed ones).

    Returns:
      Every pair's ratio, in order.
    """
    try:
        for _ in range(3):  # the first blocks pay for a manager's start and first summary
            next(base)
            next(other)
        ratios: list[float] = []
        for i in range(pairs):
            if i % 2:
                b = next(other)
                a = next(base)
            else:
                a = next(base)
                b = next(other)
            ratios.append(b / a)
        return ratios
    finally:
        other.close()
        base.close()


def paired_in_process(
    size: model.ModelSize, summary_every: tuple[int, ...], pairs: int
) -> dict[str, list[float]]:
    """One repeat of the paired measurement, meant for a fresh process (`in_fresh_process`).

    Returns:
      str(every) -> the ratios of (b) over (a) at that summary frequency; "slower" -> the
      ratios of (a) made 5% slower over (a).
    """
    loops = Loops(size)
    with quiet_stdout():
        out = {
            str(every): paired(loops.blocks_none(), loops.blocks_library(every), pairs=pairs)
            for every in summary_every
        }
        out["slower"] = paired(loops.blocks_none(), loops.blocks_none(slower=0.05), pairs=pairs)
    return out


def in_fresh_process(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a new (spawned) Python process: its own JAX, compiles and memory layout.

    The same paired measurement differs by a few percent from one process to the next (it
    read the compiled step alone at 1.064x in one and 1.012x in the next, minutes apart, each
    within +-1.5% over its own 120 pairs), so repeats run in processes of their own.
    """
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()


def run_time(timing: Timing, num_steps: int) -> float:
    """One run's time as `estimate` takes it: median window x windows + the tail."""
    if not timing.windows:
        return timing.wall
    return common.median(timing.windows) * (num_steps // WINDOW) + timing.tail


def estimate(timings: list[Timing], num_steps: int) -> dict[str, Any]:
    """Robust time of one loop from repeated runs: medians of windows, plus the median tail.

    Every run is cut into windows of `WINDOW` steps; the loop's time is the median window
    (over all windows of all runs) times the number of windows, plus the median tail (the
    final flush). A burst of load from another process spoils a few windows, not a whole
    run. Loops shorter than one window fall back to the median of whole runs.
    """
    windows = num_steps // WINDOW
    run_seconds = common.median(t.wall for t in timings)
    run_cpu = common.median(t.cpu for t in timings)
    if not windows:
        seconds, cpu = run_seconds, run_cpu
    else:
        seconds = common.median(w for t in timings for w in t.windows) * windows
        seconds += common.median(t.tail for t in timings)
        cpu = common.median(c for t in timings for c in t.cpu_windows) * windows
        cpu += common.median(t.cpu - sum(t.cpu_windows) for t in timings)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "run_seconds": run_seconds,
        "samples": [t.wall for t in timings],
    }


def explain(loops: Loops, every: int, *, num_steps: int) -> str:
    """Markdown note: a cProfile of (b) at `every`, and where one summary's host time goes."""
    report = common.profile(lambda: loops.run("library", num_steps, every), top=25)
    lines = [
        f"**Profile of (b), {summary_name(every)}** ({num_steps} steps; cProfile over the loop "
        "and every thread it starts, sorted by time spent in the function itself; waits on "
        "locks are other threads holding the GIL or the device):",
        "",
        "```",
        report,
        "```",
    ]
    if every != 1:
        lines += [
            "",
            "**What XLA compiled for each step** (entry computation of the optimized HLO):",
            "",
        ]
        lines += ["| step | fusions | copies | output buffers |", "|---|---:|---:|---:|"]
        lines += [
            f"| {name} | {a['fusions']} | {a['copies']} | {a['outputs']} |"
            for name, a in step_anatomy(loops).items()
        ]
    if every == 1:
        lines += [
            "",
            "**Host work of one summary of the 20 metrics** (median of 200, same run):",
            "",
        ]
        lines += ["| component | us per summary |", "|---|---:|"]
        lines += [f"| {name} | {us:.1f} |" for name, us in summary_breakdown(loops).items()]
    return "\n".join(lines)


def step_anatomy(loops: Loops) -> dict[str, dict[str, int]]:
    """What XLA compiled for each variant's step: fusions, copies, output buffers.

    On XLA:CPU every fusion and copy in the entry computation is one runtime task, and
    every output is one buffer jax allocates and wraps in an Array on each call: the
    per-step costs that metrics add to a small step.
    """
    params = loops.fresh_params()
    packed = jax.eval_shape(loops.step_library, params, None, loops.batch)[1]
    running = jax.eval_shape(loops.step_dict, params, None, loops.batch)[1]
    steps = {
        "(a) no metrics": (loops.step_none, (params, loops.batch)),
        "(a') metrics computed, dropped": (loops.step_computed, (params, loops.batch)),
        "(b) merge_metrics, packed (after the first step)": (
            loops.step_library,
            (params, packed, loops.batch),
        ),
        "(b0) merge_metrics(pack=False) (after the first step)": (
            loops.step_dict,
            (params, running, loops.batch),
        ),
    }
    out = {}
    for name, (fn, args) in steps.items():
        text = fn.lower(*args).compile().as_text()
        entry = text[text.index("\nENTRY") :]
        ops = re.findall(r"= \S+ ([\w-]+)\(", entry)
        outputs = jax.tree.leaves(jax.eval_shape(fn, *args))
        out[name] = {
            "fusions": ops.count("fusion"),
            "copies": ops.count("copy"),
            "outputs": len(outputs),
        }
    return out


def summary_breakdown(loops: Loops, calls: int = 200) -> dict[str, float]:
    """Microseconds per summary for each piece of the manager's background work."""
    import writers  # noqa: PLC0415
    from metrics_manager import (  # noqa: PLC0415
        MetricsManager,
        compute_metric_values,
        set_step_metrics_num_steps,
        set_time_metrics_duration,
    )
    from metrics_manager.summary import to_host as device_get_batched  # noqa: PLC0415

    _, metrics = loops.step_t5x(loops.fresh_params(), loops.batch)
    _, packed = loops.step_library(loops.fresh_params(), None, loops.batch)
    metrics, packed = jax.block_until_ready((metrics, packed))
    host = set_step_metrics_num_steps(
        set_time_metrics_duration(device_get_batched(metrics), 1.0), 1
    )
    values = compute_metric_values(host)
    logdir = tempfile.mkdtemp(prefix="bench_breakdown_")
    devnull = open(os.devnull, "w")  # noqa: SIM115  (closed below)
    backends = {
        "ConsoleWriter (to /dev/null)": writers.ConsoleWriter(devnull),
        "TensorBoardWriter": writers.TensorBoardWriter(os.path.join(logdir, "tb")),
        "JsonlWriter": writers.JsonlWriter(os.path.join(logdir, "metrics.jsonl")),
    }
    manager = MetricsManager(
        "breakdown", summary_dir=logdir, writer_factory=lambda _: writers.NoopWriter()
    )

    def per_call(fn: Callable[[int], Any]) -> float:
        fn(0)
        times = []
        for i in range(1, calls + 1):
            start = time.perf_counter()
            fn(i)
            times.append(time.perf_counter() - start)
        return common.median(times) * 1e6

    def manager_summary(summary_metrics: Any, step: int) -> None:
        manager.start_duration_timer()
        manager.write_metrics_summary(summary_metrics, step, 1).result()

    try:
        out = {
            "jax.device_get of the 20 metrics as a dict (a copy per leaf)": per_call(
                lambda _: jax.device_get(metrics)
            ),
            "jitted pack + one device_get of the dict (the manager's copy for (b0))": per_call(
                lambda _: device_get_batched(metrics)
            ),
            "device_get + unpack_host of the PackedMetrics (the manager's copy for (b))": (
                per_call(lambda _: packed.unpack_host(jax.device_get(packed.buffers)))
            ),
            "compute_metric_values": per_call(lambda _: compute_metric_values(host)),
        }
        for name, writer in backends.items():
            out[f"write_values to {name}"] = per_call(
                lambda step, w=writer: writers.write_values(w, step, values)
            )
        for name, summary_metrics in (("(b)'s PackedMetrics", packed), ("(b0)'s dict", metrics)):
            out[
                f"whole summary of the {name} through MetricsManager to a NoopWriter, until "
                "its future resolves"
            ] = per_call(functools.partial(manager_summary, summary_metrics))
        return out
    finally:
        manager.close()
        for writer in backends.values():
            writer.close()
        devnull.close()
        shutil.rmtree(logdir, ignore_errors=True)


if __name__ == "__main__":
    common.main_for(run)
