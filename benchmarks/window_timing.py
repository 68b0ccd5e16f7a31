"""Window timing of short steps: the manager's steps/s against the loop's own clock.

A loop of ~50 µs steps (one tiny jitted computation dispatched per step plus host work
up to 50 µs, the shape of a host-bound loop) writes a summary every 100 steps with a
`StepsPerTime` metric. The true rate of a window is 100 steps over the loop's own
`time.perf_counter` from the previous `write_metrics_summary` call (the first window: the
`start_duration_timer` call) to this one, since the manager counts a summary call's own time
in the next window; the reported rate is what the manager writes. A row is the median of measured/true over
the windows of a run, with the 10th-90th percentile spread; runs repeat.

A second kind of run is device-bound, as the README loop is: each ~1 ms step donates its
state, so the host dispatches steps far ahead of the device and the state passed to
`start_duration_timer` is gone before the manager's worker looks at it. Summaries every 20
steps; the true rate is the run's steps over the device's time for them (ready to ready),
since the host's clock at the calls says nothing about the device there.

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
        summary_called = None
        for _ in range(windows):
            running = None
            manager.start_duration_timer(block_on=x)
            start = time.perf_counter()
            for i in range(every):
                x, running = step(x, running)
                while time.perf_counter() < start + (i + 1) * STEP_S:
                    pass  # the rest of a 50 us step's host work
            called = time.perf_counter()
            true_rates.append(every / (called - (summary_called or start)))
            futures.append(manager.write_metrics_summary(running, every, every))
            summary_called = called
        measured = [float(f.result()["sps"].value) for f in futures]
    return [m / t for m, t in zip(measured, true_rates, strict=True)]


def one_run_ahead(windows: int, every: int = 20) -> list[float]:
    """measured / true steps per second of a device-bound loop that donates its state."""
    import functools  # noqa: PLC0415

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    import writers  # noqa: PLC0415
    from metrics_manager import MetricsManager, StepsPerTime, merge_metrics  # noqa: PLC0415

    w = jax.random.normal(jax.random.key(0), (512, 512)) / 23

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(x, running):
        return jnp.tanh(x @ w), merge_metrics(running, {"sps": StepsPerTime.from_model_output()})

    x, running = step(jnp.ones((1024, 512)), None)
    x, running = step(x, running)  # both variants compiled
    futures = []
    with MetricsManager("t", writer_factory=lambda d: writers.NoopWriter()) as manager:
        jax.block_until_ready(x)
        began = time.perf_counter()
        running = None
        manager.start_duration_timer(block_on=x)
        for i in range(1, windows * every + 1):
            x, running = step(x, running)
            if i % every == 0:
                futures.append(manager.write_metrics_summary(running, i, every))
                running = None
                manager.start_duration_timer(block_on=x)
        jax.block_until_ready(x)
        true_rate = windows * every / (time.perf_counter() - began)
        measured = [float(f.result()["sps"].value) for f in futures]
    return [m / true_rate for m in measured]


def run(quick: bool = False) -> common.Table:
    """One row per run: median measured/true ratio and its spread over the windows."""
    runs, windows = (2, 20) if quick else (5, 50)
    table = common.Table(
        key="window_timing",
        title="10. Window timing of short steps",
        description=" ".join((__doc__ or "").strip().split("\n\n")[0].split()),
        columns=[
            common.Column("run", "run"),
            common.Column("ratio", "measured / true steps/s (median)", ".3f", "x"),
            common.Column("p10", "p10", ".3f", "x"),
            common.Column("p90", "p90", ".3f", "x"),
        ],
    )
    kinds = (("50 us steps", one_run), ("host ahead, donated state", one_run_ahead))
    for kind, one in kinds:
        medians = []
        for i in range(runs):
            ratios = one(windows)
            medians.append(common.median(ratios))
            table.rows.append(
                {
                    "run": f"{kind} {i + 1}",
                    "ratio": medians[-1],
                    "p10": common.percentile(ratios, 10),
                    "p90": common.percentile(ratios, 90),
                }
            )
        worst = max(abs(m - 1.0) for m in medians)
        table.targets.append(
            common.Target(f"timing/steps_per_second error, {kind}", worst, TARGET, unit="")
        )
        table.headlines.append(
            f"timing of {kind}: measured/true steps/s {common.median(medians):.3f}x "
            f"(runs {min(medians):.3f}x-{max(medians):.3f}x)"
        )
    return table


if __name__ == "__main__":
    common.main_for(run)
