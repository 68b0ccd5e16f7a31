"""Table 5: compile time and step time against the number of microbatches.

A jitted SGD step of the benchmark model computes its gradients and 20 metrics with
`metrics_manager.accumulate_grads_microbatched` at a fixed global batch, split into 1, 2,
4, 8 and 16 microbatches (the issue's counts) and 64 (to show the trend beyond them). Compile time (trace + lower + XLA compile of a fresh function,
so nothing is cached) should not grow with the count: the microbatch loop must be one
compiled loop body. Step time shows what splitting costs at run time. Every figure is a
ratio to 1 microbatch, measured in the same run.

When the target is missed, the notes quote a cProfile of tracing and compiling the
library's step at the largest count.

Run alone: `python -m benchmarks.microbatching [--quick]`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import common, model

COUNTS = (1, 2, 4, 8, 16, 64)  # the counts, and 64 to show the trend beyond them
TARGET_COUNT = 16  # the target compares this count with the smallest count that loops
LOOPS_FROM = 3  # 1: no loop; 2: a one-trip scan, which XLA inlines; from 3: a real loop
GLOBAL_BATCH = 64
COMPILE_TARGET = 1.25


def loss_fn(params: model.Params, microbatch: model.Batch) -> tuple[jax.Array, dict[str, Any]]:
    """Cross-entropy of one microbatch and its metrics (base metrics + logit extrema)."""
    import metrics_manager as mm  # noqa: PLC0415

    loss, (logits, z_loss) = model.loss_and_aux(params, microbatch)
    metrics = mm.compute_base_metrics(
        logits,
        microbatch["targets"],
        microbatch["weights"],
        loss,
        z_loss,
        loss_normalizing_factor=model.normalizing_factor(microbatch),
        num_devices=1,
    )
    metrics["logits/max"] = mm.Max.from_model_output(logits)
    metrics["logits/min"] = mm.Min.from_model_output(logits)
    metrics["logits/mean_std"] = mm.MeanStd.from_model_output(logits)
    return loss, metrics


def make_step(num_microbatches: int) -> Callable[..., Any]:
    """A fresh jitted train step (a new function, so no compilation cache is shared)."""
    from metrics_manager import accumulate_grads_microbatched  # noqa: PLC0415

    def step(params: model.Params, batch: model.Batch) -> tuple[model.Params, dict[str, Any]]:
        grads, metrics = accumulate_grads_microbatched(loss_fn, params, batch, num_microbatches)
        return model.sgd(params, grads), metrics

    return jax.jit(step, donate_argnums=0)


def compile_seconds(num_microbatches: int, params: model.Params, batch: model.Batch) -> float:
    """Seconds to trace, lower and compile a fresh step."""
    step = make_step(num_microbatches)
    start = time.perf_counter()
    step.lower(params, batch).compile()
    return time.perf_counter() - start


class Stepper:
    """A compiled step per microbatch count and a timed run of it."""

    def __init__(self, size: model.ModelSize, counts: tuple[int, ...], global_batch: int):
        self.params0 = model.init_params(jax.random.PRNGKey(0), size)
        self.batch = model.make_batch(
            jax.random.PRNGKey(1), dataclasses.replace(size, batch=global_batch)
        )
        self.steps = {n: make_step(n) for n in counts}

    def run(self, num_microbatches: int, num_steps: int) -> float:
        """Seconds per step over `num_steps` steps (compilation excluded)."""
        step = self.steps[num_microbatches]
        params = jax.block_until_ready(jax.tree.map(jnp.copy, self.params0))
        params, metrics = step(params, self.batch)  # compiled on first use
        jax.block_until_ready((params, metrics))
        start = time.perf_counter()
        for _ in range(num_steps):
            params, metrics = step(params, self.batch)
        jax.block_until_ready((params, metrics))
        return (time.perf_counter() - start) / num_steps


def run(
    quick: bool = False,
    *,
    counts: tuple[int, ...] = COUNTS,
    global_batch: int = GLOBAL_BATCH,
    num_steps: int | None = None,
    repeats: int | None = None,
    size: model.ModelSize = model.DEFAULT,
    explain_misses: bool | None = None,
) -> common.Table:
    """Compile time and step time per microbatch count, as ratios to the first count.

    Args:
      quick: fewer steps and repetitions (same table).
      counts: numbers of microbatches; the first is the baseline.
      global_batch: sequences per step, divisible by every count.
      num_steps: steps per timed run (default 100; quick 20).
      repeats: compilations and timed runs per count (default 5; quick 1).
      size: model sizes (its batch is replaced by `global_batch`).
      explain_misses: when the compile target is missed, quote a cProfile of tracing and
        compiling the library's step at the largest count (default: unless quick).

    Returns:
      One row per count: median compile seconds and step milliseconds, each as a ratio to
      the first count.
    """
    num_steps = num_steps or (20 if quick else 100)
    repeats = repeats or (1 if quick else 5)
    stepper = Stepper(size, counts, global_batch)
    compiles = common.interleaved(
        {n: functools.partial(compile_seconds, n, stepper.params0, stepper.batch) for n in counts},
        repeats,
    )
    steps = common.interleaved(
        {n: functools.partial(stepper.run, n, num_steps) for n in counts}, repeats
    )
    table = common.Table(
        key="microbatching",
        title="5. Microbatching: compile time and step time",
        description=(
            f"A jitted SGD step of the benchmark model at a global batch of {global_batch} "
            f"sequences of {size.length} tokens; gradients and 20 metrics (base metrics, "
            "Max, Min, MeanStd of the logits) from `accumulate_grads_microbatched`. "
            "Compile = trace + lower + XLA compile of a fresh function; step = mean over "
            f"{num_steps} steps. Medians of {repeats} interleaved repetitions; ratios to "
            f"{counts[0]} microbatch(es). Microbatch 0 runs before the `lax.scan` over the "
            "others, so 1 microbatch compiles a program without a loop and 2 a one-trip "
            "scan that XLA inlines; from 3 on the program is the same loop whatever the "
            f"count, so the target compares {TARGET_COUNT} microbatches with the smallest "
            "count above 2; 64 is beyond the issue's counts, measured to show the trend."
        ),
        columns=[
            common.Column("microbatches", "microbatches"),
            common.Column("microbatch_size", "microbatch size"),
            common.Column("compile_s", "compile (s)", ".3f"),
            common.Column("compile_ratio", "compile ratio", ".3f", "x"),
            common.Column("step_ms", "step (ms)", ".3f"),
            common.Column("step_ratio", "step ratio", ".3f", "x"),
        ],
    )
    base_compile = common.median(compiles[counts[0]])
    base_step = common.median(steps[counts[0]])
    for n in counts:
        compile_s, step_s = common.median(compiles[n]), common.median(steps[n])
        table.rows.append(
            {
                "microbatches": n,
                "microbatch_size": global_batch // n,
                "compile_s": compile_s,
                "compile_seconds": compile_s,
                "baseline_compile_seconds": base_compile,
                "compile_ratio": common.ratio(compile_s, base_compile),
                "step_ms": step_s * 1e3,
                "step_seconds": step_s,
                "baseline_step_seconds": base_step,
                "step_ratio": common.ratio(step_s, base_step),
            }
        )
    looping = [row for row in table.rows if row["microbatches"] >= LOOPS_FROM]
    target_count = min(TARGET_COUNT, counts[-1])
    for high in looping[1:]:
        if high["microbatches"] not in (target_count, looping[-1]["microbatches"]):
            continue
        low = looping[0]
        growth = common.ratio(high["compile_seconds"], low["compile_seconds"])
        name = f"compile time, {high['microbatches']} vs {low['microbatches']} microbatches"
        table.headlines.append(f"{name}: {growth:.3f}x")
        if high["microbatches"] == target_count:
            table.targets.append(common.Target(name, growth, COMPILE_TARGET))
    first = table.rows[0]
    last = next((row for row in table.rows if row["microbatches"] == target_count), table.rows[-1])
    table.headlines.append(
        f"step time, {last['microbatches']} vs {first['microbatches']} microbatches: "
        f"{last['step_ratio']:.3f}x"
    )
    n = counts[-1]
    if explain_misses is None:
        explain_misses = not quick
    if explain_misses and any(not target.met for target in table.targets):
        table.notes.append(explain(stepper, n))
    return table


def explain(stepper: Stepper, num_microbatches: int) -> str:
    """Markdown note: cProfile of tracing + compiling the library's step, merging calls."""
    report = common.profile(
        lambda: make_step(num_microbatches).lower(stepper.params0, stepper.batch).compile(),
        top=12,
        sort="cumulative",
        restrict=r"merging|_reduce_merge|scan|compile|lower",
    )
    return "\n".join(
        [
            f"**Profile of tracing and compiling the library's step at {num_microbatches} "
            "microbatches** (cProfile, cumulative time, functions of the merge and "
            "compile path):",
            "",
            "```",
            report,
            "```",
        ]
    )


if __name__ == "__main__":
    common.main_for(run)
