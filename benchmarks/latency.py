"""Table 3: how long `write_metrics_summary` holds the training loop's thread.

The loop calls `MetricsManager.write_metrics_summary` with the 20 device-resident metrics
of the overhead benchmark's model; only the call itself is timed (the work it hands to
the background worker is not). Two writers: a fast one that does nothing, and a slow one
that sleeps 100 ms in every call. The baseline, measured in the same run with the same
writer, is a synchronous summary on the caller's thread (`jax.device_get`,
`compute_value()` per metric, `write_values`): what a loop without a background worker
pays.

Run alone: `python -m benchmarks.latency [--quick]`.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import jax

from benchmarks import common, model

SLOW_SECONDS = 0.1
# The manager's design brief: the caller's share of a summary stays well under 1 ms, whatever
# the writer does.
P99_TARGET_MS = 1.0
# With the slow writer, calls come this many write-times apart: the loop trains between
# summaries. A loop that outruns its writers for longer than the manager's `max_pending`
# summaries waits for them instead (bounded memory: table 6).
SPACING = 1.2


def make_writer(delay: float) -> Any:
    """A writer that does nothing but sleep `delay` seconds in every write call."""
    import writers  # noqa: PLC0415

    class SleepyWriter(writers.NoopWriter):
        def _sleep(self, *args: Any, **kwargs: Any) -> None:
            time.sleep(delay)

        write_summaries = write_scalars = write_images = write_videos = _sleep
        write_audios = write_texts = write_histograms = write_hparams = _sleep

    return SleepyWriter() if delay > 0 else writers.NoopWriter()


def make_metrics(size: model.ModelSize = model.DEFAULT) -> dict[str, Any]:
    """The model's 20 metrics for one step, on the device."""

    @jax.jit
    def metrics_of(params: model.Params, batch: model.Batch) -> dict[str, Any]:
        (loss, aux), grads = jax.value_and_grad(model.loss_and_aux, has_aux=True)(params, batch)
        return model.step_metrics(params, grads, batch, loss, aux)

    params = model.init_params(jax.random.PRNGKey(0), size)
    batch = model.make_batch(jax.random.PRNGKey(1), size)
    return jax.block_until_ready(metrics_of(params, batch))


def synchronous_summary(writer: Any, metrics: Mapping[str, Any], step: int) -> None:
    """A summary done entirely on the caller's thread (the baseline)."""
    import writers  # noqa: PLC0415
    from metrics_manager import (  # noqa: PLC0415
        set_step_metrics_num_steps,
        set_time_metrics_duration,
    )

    host = jax.device_get(dict(metrics))
    host = set_step_metrics_num_steps(set_time_metrics_duration(host, 1.0), 1)
    writers.write_values(writer, step, {k: v.compute_value() for k, v in host.items()})


def measure_manager(metrics: Mapping[str, Any], delay: float, calls: int) -> list[float]:
    """Caller-thread seconds of `calls` summaries through a manager with a `delay` writer."""
    from metrics_manager import MetricsManager  # noqa: PLC0415

    logdir = tempfile.mkdtemp(prefix="bench_latency_")
    manager = MetricsManager(
        "latency", summary_dir=logdir, writer_factory=lambda _: make_writer(delay)
    )
    try:
        manager.start_duration_timer()
        manager.write_metrics_summary(metrics, 0, 1).result()  # warm-up: compiles the copy
        samples = []
        for step in range(1, calls + 1):
            manager.start_duration_timer()
            start = time.perf_counter()
            manager.write_metrics_summary(metrics, step, 1)
            samples.append(time.perf_counter() - start)
            # The loop trains between summaries; with the slow writer, a bit longer than
            # one write, so the writer keeps up on average.
            time.sleep(delay * SPACING if delay else 0.001)
        return samples
    finally:
        manager.close()
        shutil.rmtree(logdir, ignore_errors=True)


def measure_synchronous(metrics: Mapping[str, Any], delay: float, calls: int) -> list[float]:
    """Caller-thread seconds of `calls` synchronous summaries with a `delay` writer."""
    writer = make_writer(delay)
    synchronous_summary(writer, metrics, 0)  # warm-up
    samples = []
    for step in range(1, calls + 1):
        start = time.perf_counter()
        synchronous_summary(writer, metrics, step)
        samples.append(time.perf_counter() - start)
    writer.close()
    return samples


def run(
    quick: bool = False,
    *,
    fast_calls: int | None = None,
    slow_calls: int | None = None,
    size: model.ModelSize = model.DEFAULT,
) -> common.Table:
    """Median and p99 caller-thread latency with a fast and a 100 ms writer.

    Args:
      quick: fewer calls (same table).
      fast_calls: calls with the fast writer (default 500; quick 100).
      slow_calls: calls with the slow writer (default 20; quick 8); the synchronous
        baseline makes at most 10 of them (each takes 100 ms).
      size: model sizes (the metrics' shapes).

    Returns:
      One row per (writer, method): median and p99 in milliseconds and both as ratios to
      the synchronous baseline with the same writer.
    """
    fast_calls = fast_calls or (100 if quick else 500)
    slow_calls = slow_calls or (8 if quick else 20)
    metrics = make_metrics(size)
    table = common.Table(
        key="latency",
        title="3. Caller-thread latency of write_metrics_summary",
        description=(
            f"Time the calling thread spends in `write_metrics_summary` for {model.NUM_METRICS} "
            "device-resident metrics; baseline: the same summary done synchronously on the "
            "caller's thread (`jax.device_get`, `compute_value`, `write_values`) with the same "
            f"writer. Fast writer: does nothing ({fast_calls} calls, 1 ms apart). Slow "
            f"writer: sleeps {SLOW_SECONDS * 1e3:.0f} ms per call ({slow_calls} calls "
            f"{SLOW_SECONDS * SPACING * 1e3:.0f} ms apart, as a loop that trains between "
            "summaries; a loop that outruns its writers for more than the manager's "
            "`max_pending` summaries waits for them instead, which keeps memory bounded, "
            "table 6; baseline with at most 10 calls)."
        ),
        columns=[
            common.Column("writer", "writer"),
            common.Column("method", "method"),
            common.Column("calls", "calls"),
            common.Column("median_ms", "median (ms)", ".3f"),
            common.Column("p99_ms", "p99 (ms)", ".3f"),
            common.Column("median_ratio", "median / baseline", ".4f", "x"),
            common.Column("p99_ratio", "p99 / baseline", ".4f", "x"),
        ],
    )
    for writer_name, delay, calls in (
        ("fast (no-op)", 0.0, fast_calls),
        (f"slow ({SLOW_SECONDS * 1e3:.0f} ms per call)", SLOW_SECONDS, slow_calls),
    ):
        baseline = measure_synchronous(metrics, delay, min(calls, 10) if delay else calls)
        managed = measure_manager(metrics, delay, calls)
        base_median = common.median(baseline)
        base_p99 = common.percentile(baseline, 99)
        for method, samples in (
            ("synchronous on caller (baseline)", baseline),
            ("MetricsManager.write_metrics_summary", managed),
        ):
            med, p99 = common.median(samples), common.percentile(samples, 99)
            table.rows.append(
                {
                    "writer": writer_name,
                    "delay": delay,
                    "method": method,
                    "calls": len(samples),
                    "median_ms": med * 1e3,
                    "p99_ms": p99 * 1e3,
                    "median_seconds": med,
                    "p99_seconds": p99,
                    "baseline_median_seconds": base_median,
                    "baseline_p99_seconds": base_p99,
                    "median_ratio": common.ratio(med, base_median),
                    "p99_ratio": common.ratio(p99, base_p99),
                }
            )
        row = table.rows[-1]
        table.targets.append(
            common.Target(
                f"caller p99 ({writer_name} writer)", row["p99_ms"], P99_TARGET_MS, unit=" ms"
            )
        )
        table.headlines.append(
            f"caller latency ({writer_name} writer): median {row['median_ms']:.3f} ms, "
            f"p99 {row['p99_ms']:.3f} ms ({row['median_ratio']:.4f}x synchronous)"
        )
    return table


if __name__ == "__main__":
    common.main_for(run)
