"""Table 7: host cost of system metrics: one `SystemMonitor` sample, one `window_values()`.

A `SystemMonitor` without a background thread (so nothing else samples meanwhile) reads
every sensor this host has: process and host CPU times, process RSS and host memory,
CPU temperature and `jax.Device.memory_stats()` where present, NVML where an NVIDIA GPU
is. Each call is timed on its own with `time.perf_counter`; a figure is the median of
those calls, and the rows are medians over interleaved rounds. Each sensor is also timed
alone. The baseline, measured in the same run, is one `writers.write_values` of 20
scalars to a `NoopWriter`: the cheapest thing a summary does anyway.

Run alone: `python -m benchmarks.system_overhead [--quick]`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from benchmarks import common

SAMPLE_TARGET_US = 1000.0  # "one sample must cost well under 1 ms of host time"


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    """Median microseconds of `calls` calls of `fn`, each timed on its own."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return common.median(times) * 1e6


def run(
    quick: bool = False, *, calls: int | None = None, repeats: int | None = None
) -> common.Table:
    """Microseconds per sample, per `window_values()` and per sensor, vs `write_values`.

    Args:
      quick: fewer calls and rounds (same table).
      calls: calls timed per round (default 500; quick 100).
      repeats: interleaved rounds (default 5; quick 2).

    Returns:
      One row per measured call: median microseconds and the ratio to the baseline.
    """
    import writers  # noqa: PLC0415
    from metrics_manager import system  # noqa: PLC0415

    calls = calls or (100 if quick else 500)
    repeats = repeats or (2 if quick else 5)
    monitor = system.SystemMonitor(None)
    noop = writers.NoopWriter()
    scalars = {f"m/{i}": float(i) for i in range(20)}
    variants: dict[str, Callable[[], Any]] = {
        "write_values, 20 scalars, NoopWriter (baseline)": lambda: writers.write_values(
            noop, 1, scalars
        ),
        "SystemMonitor.sample() (all sensors)": monitor.sample,
        "SystemMonitor.window_values()": monitor.window_values,
    }
    for name, read in monitor._sensors.items():
        variants[f"  sensor: {name}"] = read
    try:
        samples = common.interleaved(
            {name: functools.partial(per_call_us, fn, calls) for name, fn in variants.items()},
            repeats,
        )
    finally:
        monitor.close()
    baseline_name = next(iter(variants))
    baseline = common.median(samples[baseline_name])
    table = common.Table(
        key="system_overhead",
        title="7. System metrics: host cost per sample",
        description=" ".join((__doc__ or "").strip().split("\n\n")[0].split()),
        columns=[
            common.Column("call", "call"),
            common.Column("us", "median (µs)", ".1f"),
            common.Column("ratio", "x baseline", ".2f", "x"),
        ],
    )
    for name in variants:
        us = common.median(samples[name])
        table.rows.append({"call": name, "us": us, "ratio": common.ratio(us, baseline)})
    sample_us = table.rows[1]["us"]
    window = table.rows[2]
    table.targets.append(
        common.Target("one SystemMonitor sample", sample_us, SAMPLE_TARGET_US, unit=" µs")
    )
    table.headlines.append(
        f"system metrics: one sample {sample_us:.0f} µs; window_values {window['us']:.0f} µs "
        f"({window['ratio']:.1f}x one write_values of 20 scalars to a NoopWriter)"
    )
    table.notes.append(f"Sensors present here: {', '.join(monitor._sensors) or 'none'}.")
    return table


if __name__ == "__main__":
    common.main_for(run)
