"""Table 1: what metrics cost the training loop, side by side with the alternatives.

A ~0.6 ms jitted SGD step of a small model (`benchmarks.model`) returns a 20-metric dict;
the loop runs 2,000 steps and writes a summary every 100 steps, then every step, to
console + TensorBoard + JSONL. Four ways of doing it, plus a reference, measured
interleaved in the same run:

  (a) no metrics at all: the baseline every ratio is taken against;
  (a') the step computes its metrics and the loop drops them (what computing them costs);
  (b) this library as the README shows: metrics merged inside the jitted step with buffer
      donation (`merge_metrics`), summaries through `MetricsManager.write_metrics_summary`;
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
import functools
import gc
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import common, model

VARIANTS = ("none", "computed", "library", "t5x", "naive")
LABELS = {
    "none": "(a) no metrics",
    "computed": "(a') metrics computed in the step, then dropped",
    "library": "(b) this library: in-step merge + MetricsManager",
    "t5x": "(c) T5X: jitted merge per step + per-leaf device_get",
    "naive": "(d) naive: float(loss) per step + add_scalar per value",
}
TARGETS = {100: 1.02, 1: 1.15}


def summary_name(every: int) -> str:
    return "summary every step" if every == 1 else f"summary every {every} steps"


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Sends stdout (the console writers) to /dev/null: their formatting cost still counts."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield


def make_writer(logdir: str | None) -> Any:
    """The writers every variant with writers uses: console + TensorBoard + JSONL, asynchronous."""
    import writers  # noqa: PLC0415

    return writers.create_default_writer(
        logdir, asynchronous=True, console=True, tensorboard=True, jsonl=True
    )


class Loops:
    """The compiled steps of every variant for one model size, and one timed loop per variant."""

    def __init__(self, size: model.ModelSize = model.DEFAULT) -> None:
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
            from metrics_manager import merge_metrics  # noqa: PLC0415

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

        self.step_none = step_none
        self.step_computed = step_t5x  # the reference (a'): the same step, metrics dropped
        self.step_library = step_library
        self.step_t5x = step_t5x
        self.merge_t5x = merge_t5x
        self.step_naive = step_naive

    def fresh_params(self) -> model.Params:
        params = jax.tree.map(jnp.copy, self.params0)
        return jax.block_until_ready(params)

    def run(self, variant: str, num_steps: int, every: int) -> float:
        """One timed loop of `variant`; returns its wall time in seconds."""
        loop: Callable[[str, int, int], float] = getattr(self, f"_run_{variant}")
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

    def _run_none(self, logdir: str, num_steps: int, every: int) -> float:
        del logdir, every
        params, batch = self.fresh_params(), self.batch
        start = time.perf_counter()
        for _ in range(num_steps):
            params = self.step_none(params, batch)
        jax.block_until_ready(params)
        return time.perf_counter() - start

    def _run_computed(self, logdir: str, num_steps: int, every: int) -> float:
        del logdir, every
        params, batch = self.fresh_params(), self.batch
        start = time.perf_counter()
        for _ in range(num_steps):
            params, _ = self.step_computed(params, batch)
        jax.block_until_ready(params)
        return time.perf_counter() - start

    def _run_library(self, logdir: str, num_steps: int, every: int) -> float:
        from metrics_manager import MetricsManager  # noqa: PLC0415

        params, batch = self.fresh_params(), self.batch
        manager = MetricsManager("train", summary_dir=logdir, writer_factory=make_writer)
        try:
            start = time.perf_counter()
            manager.start_duration_timer(block_on=params)
            running = None
            for i in range(num_steps):
                params, running = self.step_library(params, running, batch)
                if (i + 1) % every == 0:
                    manager.write_metrics_summary(running, i + 1, every)
                    running = None
                    manager.start_duration_timer(block_on=params)
            manager.flush()
            jax.block_until_ready(params)
            return time.perf_counter() - start
        finally:
            manager.close()

    def _run_t5x(self, logdir: str, num_steps: int, every: int) -> float:
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
            start = time.perf_counter()
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
            for future in futures:
                future.result()
            writer.flush()
            jax.block_until_ready(params)
            return time.perf_counter() - start
        finally:
            pool.shutdown()
            writer.close()

    def _run_naive(self, logdir: str, num_steps: int, every: int) -> float:
        import tensorboardX  # noqa: PLC0415

        params, batch = self.fresh_params(), self.batch
        tb = tensorboardX.SummaryWriter(os.path.join(logdir, "train"))
        try:
            with open(os.path.join(logdir, "metrics.jsonl"), "w") as jsonl:
                start = time.perf_counter()
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
                tb.flush()
                jsonl.flush()
                jax.block_until_ready(params)
                return time.perf_counter() - start
        finally:
            tb.close()


def run(
    quick: bool = False,
    *,
    num_steps: int | None = None,
    repeats: int | None = None,
    summary_every: tuple[int, ...] = (100, 1),
    size: model.ModelSize = model.DEFAULT,
) -> common.Table:
    """Measures the four variants at each summary frequency, interleaved; medians and ratios.

    Args:
      quick: fewer steps and repetitions (same table).
      num_steps: steps per timed loop (default 2,000; quick 1,000).
      repeats: timed loops per variant and frequency (default 7; quick 3).
      summary_every: summary frequencies, in steps.
      size: model and batch sizes.

    Returns:
      The table: one row per (frequency, variant) with the median seconds, microseconds per
      step and the ratio to variant (a) at the same frequency.
    """
    num_steps = num_steps or (1000 if quick else 2000)
    repeats = repeats or (3 if quick else 7)
    loops = Loops(size)
    loops.warm_up()
    runs = {
        (every, variant): functools.partial(loops.run, variant, num_steps, every)
        for every in summary_every
        for variant in VARIANTS
    }
    samples = common.interleaved(runs, repeats)  # type: ignore[arg-type]

    table = common.Table(
        key="overhead",
        title="1. Training-loop overhead",
        description=(
            f"{num_steps:,} steps of a jitted SGD step of a per-token MLP language model "
            f"(batch {size.batch}x{size.length} tokens, vocabulary {size.vocab}, widths "
            f"{size.embed}/{size.hidden}) returning {model.NUM_METRICS} metrics (T5X's base "
            "metrics via `compute_base_metrics`, learning rate, gradient norm); writers "
            "console (to /dev/null) + TensorBoard + JSONL. Each time covers the loop and "
            "flushing every summary. (a') is the same step as (c): it shows what computing "
            "the metrics in the step costs before anything is merged or written. Median of "
            f"{repeats} interleaved runs per cell; ratio = median / median of (a) at the same "
            "summary frequency."
        ),
        columns=[
            common.Column("summary", "summaries"),
            common.Column("label", "variant"),
            common.Column("seconds", "median time (s)", ".3f"),
            common.Column("us_per_step", "per step (us)", ".1f"),
            common.Column("overhead_us", "overhead per step (us)", ".1f"),
            common.Column("ratio", "ratio to (a)", ".3f", "x"),
        ],
    )
    for every in summary_every:
        baseline = common.median(samples[(every, "none")])
        for variant in VARIANTS:
            seconds = common.median(samples[(every, variant)])
            table.rows.append(
                {
                    "summary": summary_name(every),
                    "every": every,
                    "variant": variant,
                    "label": LABELS[variant],
                    "seconds": seconds,
                    "baseline_seconds": baseline,
                    "samples": samples[(every, variant)],
                    "us_per_step": seconds / num_steps * 1e6,
                    "overhead_us": (seconds - baseline) / num_steps * 1e6,
                    "ratio": common.ratio(seconds, baseline),
                }
            )
    for row in table.rows:
        if row["variant"] == "library":
            table.headlines.append(f"overhead ({row['summary']}): {row['ratio']:.3f}x")
            if row["every"] in TARGETS:
                table.targets.append(
                    common.Target(
                        f"overhead ({row['summary']})", row["ratio"], TARGETS[row["every"]]
                    )
                )
    for row in table.rows:
        if row["variant"] in ("t5x", "naive"):
            name = "T5X's way" if row["variant"] == "t5x" else "naive way"
            table.headlines.append(f"{name} ({row['summary']}): {row['ratio']:.3f}x")
    return table


if __name__ == "__main__":
    common.main_for(run)
