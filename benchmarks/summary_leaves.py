"""Table 4: summary cost as the number of metric leaves grows (10 to 10,000).

For each size, a dict of `Sum` metrics (one leaf each) lives on the device; one summary is
written with `MetricsManager.write_metrics_summary` to a writer that does nothing (so the
table measures the manager, not a backend) and timed from the call until its future
resolves. The baseline, measured in the same run, is T5X's path on the same metrics and
writer: one `jax.device_get` per leaf, then `compute_value()` per metric and
`write_values`.

Device-to-host transfers are counted by instrumenting every way host code reads a
`jax.Array` (see `count_transfers`), in a separate untimed pass. Every summary uses freshly
made device arrays, so no host copy cached by an earlier summary is reused.

Run alone: `python -m benchmarks.summary_leaves [--quick]`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
from jax._src import array as jax_array

from benchmarks import common

SIZES = (10, 100, 1_000, 10_000)
LINEAR_TARGET = 1.5


@dataclasses.dataclass
class Transfers:
    """Device-to-host reads seen while `count_transfers` was active.

    Attributes:
      arrays: distinct `jax.Array`s whose data was copied (or started copying) to the host.
      device_get_calls: calls of `jax.device_get` (each may move many arrays at once).
    """

    arrays: set[int] = dataclasses.field(default_factory=set)
    device_get_calls: int = 0
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def add_array(self, array: Any) -> None:
        with self._lock:
            self.arrays.add(id(array))


@contextlib.contextmanager
def count_transfers() -> Iterator[Transfers]:
    """Counts device-to-host copies of `jax.Array` data, from any thread.

    Wraps the paths host code uses to read an array: `jax.device_get`, the
    `copy_to_host_async` and `_value` members of JAX's array type (which `float()`,
    `.tolist()`, `.item()`, `__array__` and `jax.device_get` all go through) and
    `numpy.asarray`/`numpy.array`/`numpy.asanyarray` on a `jax.Array` (on CPU those read the
    buffer directly, bypassing `_value`). Each distinct array counts once per pass; one
    whose host copy JAX already cached (accelerators; CPU arrays are read in place and
    never cached) is not counted. The wrappers cost time: count in an untimed pass.

    Yields:
      The `Transfers` record, filled in as transfers happen.
    """
    record = Transfers()
    cls = jax_array.ArrayImpl
    orig_value = cls.__dict__["_value"]
    orig_async = cls.copy_to_host_async
    orig_device_get = jax.device_get
    orig_numpy = {name: getattr(np, name) for name in ("asarray", "array", "asanyarray")}

    def value(self: Any) -> np.ndarray:
        if self._npy_value is None:
            record.add_array(self)
        return orig_value.fget(self)

    def copy_to_host_async(self: Any) -> None:
        if self._npy_value is None:
            record.add_array(self)
        return orig_async(self)

    def device_get(x: Any) -> Any:
        with record._lock:
            record.device_get_calls += 1
        return orig_device_get(x)

    def numpy_wrapper(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapped(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(obj, jax.Array) and getattr(obj, "_npy_value", 0) is None:
                record.add_array(obj)
            return fn(obj, *args, **kwargs)

        return wrapped

    cls._value = property(value)
    cls.copy_to_host_async = copy_to_host_async
    jax.device_get = device_get
    for name, fn in orig_numpy.items():
        setattr(np, name, numpy_wrapper(fn))
    try:
        yield record
    finally:
        cls._value = orig_value
        cls.copy_to_host_async = orig_async
        jax.device_get = orig_device_get
        for name, fn in orig_numpy.items():
            setattr(np, name, fn)


def fast_writer() -> Any:
    """A writer that accepts everything and does nothing (isolates the manager's cost)."""
    import writers  # noqa: PLC0415

    return writers.NoopWriter()


def make_metrics(num_leaves: int, seed: int) -> dict[str, Any]:
    """`num_leaves` fresh device-resident `Sum` metrics (one leaf each)."""
    from metrics_manager import Sum  # noqa: PLC0415

    values = np.random.default_rng(seed).standard_normal(num_leaves).astype(np.float32)
    leaves = jax.device_put(list(values))
    metrics = {f"group{i // 100:03d}/metric{i:05d}": Sum(total=x) for i, x in enumerate(leaves)}
    return jax.block_until_ready(metrics)


def t5x_summary(writer: Any, metrics: Mapping[str, Any], step: int, num_steps: int) -> Any:
    """T5X's summary path: per-leaf device_get, then compute_value per metric, then write."""
    import writers  # noqa: PLC0415
    from metrics_manager import (  # noqa: PLC0415
        set_step_metrics_num_steps,
        set_time_metrics_duration,
    )

    host = jax.tree.map(jax.device_get, dict(metrics))
    host = set_time_metrics_duration(host, 1.0)
    host = set_step_metrics_num_steps(host, num_steps)
    summary = {k: v.compute_value() for k, v in host.items()}
    writers.write_values(writer, step, summary)
    return summary


class Summarizers:
    """One timed summary through the manager or through T5X's path."""

    def __init__(self) -> None:
        from metrics_manager import MetricsManager  # noqa: PLC0415

        self.writer = fast_writer()
        self.logdir = tempfile.mkdtemp(prefix="bench_leaves_")
        self.manager = MetricsManager(
            "leaves", summary_dir=self.logdir, writer_factory=lambda logdir: fast_writer()
        )
        self.step = 0

    def close(self) -> None:
        import shutil  # noqa: PLC0415

        self.manager.close()
        self.writer.close()
        shutil.rmtree(self.logdir, ignore_errors=True)

    def timed(self, method: str, num_leaves: int, seeds: Iterator[int]) -> float:
        """Times one summary by `method` on fresh metrics (made before the clock starts)."""
        metrics = make_metrics(num_leaves, next(seeds))
        return getattr(self, method)(metrics)

    def library(self, metrics: Mapping[str, Any]) -> float:
        self.step += 1
        start = time.perf_counter()
        self.manager.start_duration_timer()
        self.manager.write_metrics_summary(metrics, self.step, 1).result()
        return time.perf_counter() - start

    def t5x(self, metrics: Mapping[str, Any]) -> float:
        self.step += 1
        start = time.perf_counter()
        t5x_summary(self.writer, metrics, self.step, 1)
        return time.perf_counter() - start


def run(
    quick: bool = False, *, sizes: tuple[int, ...] = SIZES, repeats: int | None = None
) -> common.Table:
    """Times one summary and counts its transfers at each number of leaves.

    Args:
      quick: fewer repetitions (same table).
      sizes: numbers of metric leaves.
      repeats: timed summaries per method and size (default 7; quick 3).

    Returns:
      One row per size: first-summary time (includes compiling the manager's packing),
      median time per summary for the manager and for T5X's path, their ratio, time per
      leaf, and transfers (distinct arrays copied, `device_get` calls) per summary.
    """
    repeats = repeats or (3 if quick else 7)
    table = common.Table(
        key="summary_leaves",
        title="4. Summary cost as metric leaves grow",
        description=(
            "One summary of N device-resident `Sum` metrics (one leaf each) to a writer that "
            "does nothing, timed from `write_metrics_summary` until its future resolves; "
            "baseline: T5X's path (one `jax.device_get` per leaf, `compute_value`, "
            f"`write_values`) on the same metrics and writer. Median of {repeats} "
            "interleaved summaries, each on fresh device arrays; the first summary of each "
            "size (compilation of the manager's packing function) is reported apart. "
            "Transfers are counted in a separate untimed pass by instrumenting "
            "`jax.device_get`, `jax.Array.copy_to_host_async`/`_value` and `numpy.asarray` "
            "on `jax.Array`s."
        ),
        columns=[
            common.Column("leaves", "leaves", ","),
            common.Column("first_ms", "first summary (ms)", ".1f"),
            common.Column("library_ms", "MetricsManager (ms)", ".2f"),
            common.Column("t5x_ms", "T5X per-leaf (ms)", ".2f"),
            common.Column("ratio", "ratio to T5X", ".3f", "x"),
            common.Column("us_per_leaf", "manager per leaf (us)", ".2f"),
            common.Column("library_arrays", "manager arrays copied", ","),
            common.Column("library_gets", "manager device_get calls", ","),
            common.Column("t5x_arrays", "T5X arrays copied", ","),
            common.Column("t5x_gets", "T5X device_get calls", ","),
        ],
    )
    bench = Summarizers()
    try:
        for n in sizes:
            first = bench.library(make_metrics(n, seed=0))
            bench.t5x(make_metrics(n, seed=1))  # warm T5X's path too
            lib_metrics, t5x_metrics = make_metrics(n, seed=2), make_metrics(n, seed=3)
            with count_transfers() as lib_count:
                bench.library(lib_metrics)
            with count_transfers() as t5x_count:
                bench.t5x(t5x_metrics)
            seeds = iter(range(10, 10 + 4 * repeats))
            samples = common.interleaved(
                {
                    "library": functools.partial(bench.timed, "library", n, seeds),
                    "t5x": functools.partial(bench.timed, "t5x", n, seeds),
                },
                repeats,
            )
            library = common.median(samples["library"])
            t5x = common.median(samples["t5x"])
            table.rows.append(
                {
                    "leaves": n,
                    "first_ms": first * 1e3,
                    "library_ms": library * 1e3,
                    "t5x_ms": t5x * 1e3,
                    "library_seconds": library,
                    "t5x_seconds": t5x,
                    "ratio": common.ratio(library, t5x),
                    "us_per_leaf": library / n * 1e6,
                    "library_arrays": len(lib_count.arrays),
                    "library_gets": lib_count.device_get_calls,
                    "t5x_arrays": len(t5x_count.arrays),
                    "t5x_gets": t5x_count.device_get_calls,
                }
            )
    finally:
        bench.close()
    if len(table.rows) >= 2:
        small, large = table.rows[0], table.rows[-1]
        growth = common.ratio(large["library_seconds"], small["library_seconds"])
        table.headlines.append(
            f"summary cost ({large['leaves']:,} vs {small['leaves']:,} leaves): {growth:.1f}x "
            f"for {large['leaves'] / small['leaves']:,.0f}x the leaves"
        )
        # Linear growth: the time per leaf of the two largest sizes (fixed costs dominate
        # small sizes) stays within LINEAR_TARGET.
        below, top = table.rows[-2], table.rows[-1]
        table.targets.append(
            common.Target(
                f"time per leaf, {top['leaves']:,} vs {below['leaves']:,} leaves (linear growth)",
                common.ratio(top["us_per_leaf"], below["us_per_leaf"]),
                LINEAR_TARGET,
            )
        )
    most = max(row["library_arrays"] for row in table.rows)
    table.targets.append(
        common.Target(
            "device-to-host arrays copied per summary, any size (one batched transfer)",
            most,
            1,
            unit="",
        )
    )
    table.headlines.append(f"device-to-host arrays copied per summary (any size): at most {most}")
    return table


if __name__ == "__main__":
    common.main_for(run)
