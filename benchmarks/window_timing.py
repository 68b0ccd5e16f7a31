"""Window timing of short steps: the manager's steps/s against the loop's own clock.

A loop of ~50 µs steps (one tiny jitted computation dispatched per step plus host work
up to 50 µs, the shape of a host-bound loop) writes a summary every 100 steps with a
`StepsPerTime` metric. The true rate of a window is 100 steps over the loop's own
`time.perf_counter` between the `start_duration_timer` and `write_metrics_summary` calls;
the reported rate is what the manager writes. A row is the median of measured/true over
the windows of a run, with the 10th-90th percentile spread; runs repeat.

Run alone: `python -m benchmarks.window_timing [--quick]`.
"""

from __future__ import annotations

import time

from benchmarks import common

STEP_S = 50e-6
TARGET = 0.10  # within 10% of the true rate


def one_run(windows: int, every: int = 100) -> list[float]:
    """measured / true steps per second, one value per summary window."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    import writers  # noqa: PLC0415
    from metrics_manager import MetricsManager, StepsPerTime, merge_metrics  # noqa: PLC0415

    @jax.jit
    def step(x, running):
        return x + 1.0, merge_metrics(running, {"sps": StepsPerTime.from_model_output()})

    x = jnp.zeros(8)
    step(x, None)
    x, running = step(x, None)
    step(x, running)  # compile both variants before timing
    futures, true_rates = [], []
    with MetricsManager("t", writer_factory=lambda d: writers.NoopWriter()) as manager:
        for _ in range(windows):
            running = None
            manager.start_duration_timer(block_on=x)
            start = time.perf_counter()
            for i in range(every):
                x, running = step(x, running)
                while time.perf_counter() < start + (i + 1) * STEP_S:
                    pass  # the rest of a 50 us step's host work
            true_rates.append(every / (time.perf_counter() - start))
            futures.append(manager.write_metrics_summary(running, every, every))
        measured = [float(f.result()["sps"].value) for f in futures]
    return [m / t for m, t in zip(measured, true_rates, strict=True)]


def run(quick: bool = False) -> common.Table:
    """One row per run: median measured/true ratio and its spread over the windows."""
    runs, windows = (2, 20) if quick else (5, 50)
    table = common.Table(
        key="window_timing",
        title="Window timing of 50-microsecond steps",
        description=" ".join((__doc__ or "").strip().split("\n\n")[0].split()),
        columns=[
            common.Column("run", "run"),
            common.Column("ratio", "measured / true steps/s (median)", ".3f", "x"),
            common.Column("p10", "p10", ".3f", "x"),
            common.Column("p90", "p90", ".3f", "x"),
        ],
    )
    medians = []
    for i in range(runs):
        ratios = one_run(windows)
        medians.append(common.median(ratios))
        table.rows.append(
            {
                "run": str(i + 1),
                "ratio": medians[-1],
                "p10": common.percentile(ratios, 10),
                "p90": common.percentile(ratios, 90),
            }
        )
    overall = common.median(medians)
    worst = max(abs(m - 1.0) for m in medians)
    table.targets.append(
        common.Target("timing/steps_per_second error, 50 us steps", worst, TARGET, unit="")
    )
    table.headlines.append(
        f"timing of 50 us steps: measured/true steps/s {overall:.3f}x "
        f"(runs {min(medians):.3f}x-{max(medians):.3f}x)"
    )
    return table


if __name__ == "__main__":
    common.main_for(run)
