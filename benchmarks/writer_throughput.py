"""Writer throughput: scalars per second each writer sustains at 10, 50 and 500 scalars per call, against tensorboardX `add_scalar` (one event per value) measured side by side in the same run.

Each measurement creates a fresh writer in a temporary directory (not timed), then
times `calls` write calls of the same mapping of numpy float32 scalars plus the
final `close()`, so buffered and queued work is counted (for `AsyncWriter` and
the default writer, the time until everything is on disk). The baseline writes
the same values with `SummaryWriter.add_scalar`, one call per value, and is timed
the same way (its `close()` drains tensorboardX's queue). Variants are
interleaved in a random order each round and the median of the rounds is
reported; ratios are to the baseline's median at the same size. The console
writes to os.devnull (no colour), the absl log to a handler on os.devnull.

Run: `python -m benchmarks.writer_throughput [--quick]`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging as py_logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging as absl_logging

import writers
from benchmarks import common

SIZES = (10, 50, 500)
BASELINE = "tensorboardX add_scalar"
TARGET_WRITER = "TensorBoardWriter"
TARGET_RATIO = 10.0
TARGET_RATE = 200_000.0

# name -> factory(logdir, null_stream) returning (write(step, scalars), close())
Factory = Callable[[str, Any], tuple[Callable[[int, dict], None], Callable[[], None]]]


def _add_scalar(logdir: str, _: Any):
    from tensorboardX import SummaryWriter

    w = SummaryWriter(logdir)

    def write(step: int, scalars: dict) -> None:
        for key, value in scalars.items():
            w.add_scalar(key, value, step)

    return write, w.close


def _ours(make: Callable[[str, Any], writers.MetricWriter]) -> Factory:
    def factory(logdir: str, null: Any):
        w = make(logdir, null)
        return w.write_scalars, w.close

    return factory


VARIANTS: dict[str, Factory] = {
    BASELINE: _add_scalar,
    "TensorBoardWriter": _ours(lambda d, _: writers.TensorBoardWriter(d)),
    "AsyncWriter(TensorBoardWriter)": _ours(
        lambda d, _: writers.AsyncWriter(writers.TensorBoardWriter(d))
    ),
    "JsonlWriter": _ours(lambda d, _: writers.JsonlWriter(os.path.join(d, "m.jsonl"))),
    "ConsoleWriter (null stream)": _ours(lambda d, null: writers.ConsoleWriter(null, color=False)),
    "LoggingWriter (absl)": _ours(lambda d, _: writers.LoggingWriter(collection="train")),
    "MultiWriter(TensorBoard, JSONL)": _ours(
        lambda d, _: writers.MultiWriter(
            [writers.TensorBoardWriter(d), writers.JsonlWriter(os.path.join(d, "m.jsonl"))]
        )
    ),
    "create_default_writer (async console+TB+JSONL)": _ours(
        lambda d, null: writers.create_default_writer(d, console_stream=null)
    ),
}


@contextlib.contextmanager
def _quiet_absl_log(null: Any) -> Iterator[None]:
    """Sends absl INFO lines to `null` (formatted as usual) instead of the terminal."""
    logger = py_logging.getLogger("absl")
    saved = (logger.handlers[:], logger.propagate, absl_logging.get_verbosity())
    handler = py_logging.StreamHandler(null)
    handler.setFormatter(py_logging.Formatter("%(levelname)s %(asctime)s %(message)s"))
    logger.handlers[:] = [handler]
    logger.propagate = False
    absl_logging.set_verbosity(absl_logging.INFO)
    try:
        yield
    finally:
        logger.handlers[:], logger.propagate = saved[0], saved[1]
        absl_logging.set_verbosity(saved[2])


def _scalars(size: int) -> dict[str, np.float32]:
    return {f"train/metric_{i:03d}": np.float32(0.001 * i + 0.5) for i in range(size)}


def _measure(factory: Factory, size: int, calls: int, null: Any) -> float:
    """Scalars per second for `calls` calls of `size` scalars, close() included."""
    scalars = _scalars(size)
    with tempfile.TemporaryDirectory() as logdir:
        write, close = factory(logdir, null)
        start = time.perf_counter()
        for step in range(calls):
            write(step, scalars)
        close()
        seconds = time.perf_counter() - start
    return calls * size / seconds


def run(
    quick: bool, *, total: int | None = None, repeats: int | None = None
) -> list[dict[str, Any]]:
    """Measures every writer at 10, 50 and 500 scalars per call.

    Args:
      quick: fewer scalars per measurement and fewer rounds (same table).
      total: scalars per measurement (overrides `quick`'s choice; tests use a few).
      repeats: rounds per variant (overrides `quick`'s choice).

    Returns:
      One row per writer: `writer`, `scalars/s @<n>` for each size and
      `x add_scalar @<n>` (ratio to the baseline's median at the same size).
    """
    default_total, default_repeats = (5_000, 3) if quick else (25_000, 5)
    total = total or default_total
    repeats = repeats or default_repeats
    medians: dict[tuple[str, int], float] = {}
    with open(os.devnull, "w") as null, _quiet_absl_log(null):
        for size in SIZES:
            calls = max(2, total // size)
            samples = common.interleaved(
                {
                    name: functools.partial(_measure, factory, size, calls, null)
                    for name, factory in VARIANTS.items()
                },
                repeats,
                seed=size,
            )
            for name, values in samples.items():
                medians[name, size] = common.median(values)
    rows = []
    for name in VARIANTS:
        row: dict[str, Any] = {"writer": name}
        for size in SIZES:
            row[f"scalars/s @{size}"] = medians[name, size]
        for size in SIZES:
            row[f"x add_scalar @{size}"] = common.ratio(
                medians[name, size], medians[BASELINE, size]
            )
        rows.append(row)
    return rows


def targets(rows: Sequence[dict[str, Any]]) -> list[common.Target]:
    """The issue's targets for TensorBoardWriter at 50 scalars per call."""
    row = next(r for r in rows if r["writer"] == TARGET_WRITER)
    return [
        common.Target(
            "TensorBoardWriter vs add_scalar @50 scalars/call",
            row["x add_scalar @50"],
            TARGET_RATIO,
            kind="min",
        ),
        common.Target(
            "TensorBoardWriter scalars/s @50 scalars/call",
            row["scalars/s @50"],
            TARGET_RATE,
            kind="min",
            unit=" scalars/s",
        ),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """Prints the throughput table and the verdict on each target."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, same table")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = run(args.quick)
    table = common.table_from_rows(
        key="writer_throughput",
        title="Writer throughput",
        description=__doc__.split("\n\n")[0],
        rows=rows,
    )
    table.targets = targets(rows)
    table.seconds = time.perf_counter() - start
    print(common.format_table(table))  # includes the verdict on each target


if __name__ == "__main__":
    main()
