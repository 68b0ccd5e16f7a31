"""Table 6: memory stays bounded over 100,000 summaries of 100 scalars.

Two paths, each writing to TensorBoard + JSONL files in a temporary directory:

  writers: `write_scalars` of 100 fresh floats on `create_default_writer(asynchronous=True)`:
      the loop produces faster than the files absorb, so an unbounded queue would grow
      without limit; a bounded one pushes back and keeps memory flat.
  manager: `MetricsManager.write_metrics_summary` of 100 `Sum` metrics freshly made on the
      device for each summary, back to back, through the same writers (fewer summaries:
      each also copies to the host).

The resident set size (psutil) is sampled every tenth of the run without flushing (queued
work counts); the baseline is the RSS after a warm-up of the first 2% of the summaries,
measured in the same run. The target is on the growth between 10% and 100% of the run.
`run_all` runs this benchmark in a fresh process, so memory freed by earlier benchmarks
cannot hide growth.

Run alone: `python -m benchmarks.memory [--quick]`.
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import psutil

from benchmarks import common

MiB = 1024 * 1024
NUM_SCALARS = 100
GROWTH_TARGET_MIB = 16.0


def rss_bytes() -> int:
    """Resident set size of this process."""
    return psutil.Process().memory_info().rss


def make_writer(logdir: str) -> Any:
    """TensorBoard + JSONL behind the asynchronous workers (no console: 100,000 lines)."""
    import writers  # noqa: PLC0415

    return writers.create_default_writer(
        logdir, asynchronous=True, console=False, tensorboard=True, jsonl=True
    )


def track(
    write: Callable[[int], None], total: int, checkpoints: int = 10
) -> tuple[list[tuple[int, int]], float]:
    """Calls `write(i)` for i in [0, total) and samples the RSS along the way.

    Returns:
      (summaries written, RSS bytes) after the warm-up (2%) and at each tenth, and the
      seconds the loop took.
    """
    warmup = max(1, total // 50)
    marks = {warmup} | {total * k // checkpoints for k in range(1, checkpoints + 1)}
    samples = []
    gc.collect()
    start = time.perf_counter()
    for i in range(total):
        write(i)
        if i + 1 in marks:
            samples.append((i + 1, rss_bytes()))
    return samples, time.perf_counter() - start


def writers_path(total: int) -> tuple[list[tuple[int, int]], float, int]:
    """`total` write_scalars calls on the asynchronous writers; RSS samples, seconds, final RSS."""
    logdir = tempfile.mkdtemp(prefix="bench_memory_")
    writer = make_writer(logdir)
    keys = [f"group{i // 10}/scalar{i:03d}" for i in range(NUM_SCALARS)]
    values = np.random.default_rng(0).standard_normal((1024, NUM_SCALARS)).tolist()
    try:
        samples, seconds = track(
            lambda i: writer.write_scalars(i, dict(zip(keys, values[i % 1024], strict=True))),
            total,
        )
        writer.flush()
        return samples, seconds, rss_bytes()
    finally:
        writer.close()
        shutil.rmtree(logdir, ignore_errors=True)


def manager_path(total: int) -> tuple[list[tuple[int, int]], float, int]:
    """`total` summaries of 100 fresh `Sum` metrics through a MetricsManager; as `writers_path`.

    Every summary gets new device buffers (as a training step makes), so a queue that kept
    pending summaries would keep their buffers too.
    """
    from metrics_manager import MetricsManager, Sum  # noqa: PLC0415

    @jax.jit
    def make_metrics(step: jax.Array) -> dict[str, Any]:
        values = step.astype(np.float32) + np.arange(NUM_SCALARS, dtype=np.float32)
        return {f"group{i // 10}/metric{i:03d}": Sum(total=values[i]) for i in range(NUM_SCALARS)}

    logdir = tempfile.mkdtemp(prefix="bench_memory_")
    manager = MetricsManager("memory", summary_dir=logdir, writer_factory=make_writer)
    try:

        def write(i: int) -> None:
            manager.start_duration_timer()
            manager.write_metrics_summary(make_metrics(np.int32(i)), i, 1)

        samples, seconds = track(write, total)
        manager.flush()
        return samples, seconds, rss_bytes()
    finally:
        manager.close()
        shutil.rmtree(logdir, ignore_errors=True)


def run(
    quick: bool = False,
    *,
    writer_summaries: int | None = None,
    manager_summaries: int | None = None,
) -> common.Table:
    """RSS along 100,000 asynchronous summaries (and fewer through the manager).

    Args:
      quick: fewer summaries (same table).
      writer_summaries: summaries on the writers path (default 100,000; quick 10,000).
      manager_summaries: summaries on the manager path (default 5,000; quick 1,000).

    Returns:
      One row per RSS sample: path, summaries so far, RSS, growth since the warm-up and the
      ratio to the warm-up RSS; the last row of each path is after the final flush.
    """
    writer_summaries = writer_summaries or (10_000 if quick else 100_000)
    manager_summaries = manager_summaries or (1_000 if quick else 5_000)
    table = common.Table(
        key="memory",
        title="6. Memory over many asynchronous summaries",
        description=(
            f"Summaries of {NUM_SCALARS} scalars to TensorBoard + JSONL through "
            "`create_default_writer(asynchronous=True)`, called back to back: "
            f"{writer_summaries:,} `write_scalars` calls (writers path) and "
            f"{manager_summaries:,} `write_metrics_summary` calls with {NUM_SCALARS} device "
            "metrics (manager path). RSS (psutil) sampled without flushing; baseline = RSS "
            "after the first 2% (warm-up), same run."
        ),
        columns=[
            common.Column("path", "path"),
            common.Column("summaries", "summaries", ","),
            common.Column("rss_mib", "RSS (MiB)", ".1f"),
            common.Column("growth_mib", "growth since warm-up (MiB)", "+.1f"),
            common.Column("ratio", "ratio to warm-up", ".3f", "x"),
        ],
    )
    for path, fn, total in (
        ("writers", writers_path, writer_summaries),
        ("manager", manager_path, manager_summaries),
    ):
        samples, seconds, final = fn(total)
        _, base = samples[0]
        for count, rss in samples:
            table.rows.append(_row(path, f"{count:,}", count, rss, base))
        table.rows.append(_row(path, f"{total:,} + flush", total, final, base))
        tenth = next(rss for count, rss in samples if count >= total // 10)
        growth = (max(rss for _, rss in samples[1:] + [(total, final)]) - tenth) / MiB
        table.targets.append(
            common.Target(
                f"{path}: RSS growth from 10% to 100% of {total:,} summaries",
                growth,
                GROWTH_TARGET_MIB,
                unit=" MiB",
            )
        )
        table.headlines.append(
            f"memory ({path}, {total:,} summaries of {NUM_SCALARS} scalars): "
            f"{(final - base) / MiB:+.1f} MiB, {common.ratio(final, base):.3f}x warm-up RSS "
            f"({total / seconds:,.0f} summaries/s)"
        )
    return table


def _row(path: str, label: str, count: int, rss: int, base: int) -> dict[str, Any]:
    return {
        "path": path,
        "summaries": label,
        "count": count,
        "rss_bytes": rss,
        "baseline_rss_bytes": base,
        "rss_mib": rss / MiB,
        "growth_mib": (rss - base) / MiB,
        "ratio": common.ratio(rss, base),
    }


if __name__ == "__main__":
    common.main_for(run)
