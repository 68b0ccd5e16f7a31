"""Table 7: time to plot 10,000 logged points with `writers.plot` (PNG and terminal).

One run's `metrics.jsonl` of 10,000 lines (`step`, `time`, `collection`, `loss`), as
`JsonlWriter` writes them, is read and drawn, in this process: read only
(`load_series`: parse, keep the last value per step, smooth), read + PNG (matplotlib
Agg, 1200x800) and read + terminal plot (plotext, 100x30). The baseline, measured in the
same run, is parsing the file with `json.loads` per line and nothing else. A last row
runs the command line (`python -m writers.plot RUN --out ...`) in a fresh interpreter:
what a user waits for, imports included.

Run alone: `python -m benchmarks.plot_time [--quick]`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from benchmarks import common

POINTS = 10_000
TARGET_SECONDS = 2.0
BASELINE = "json.loads per line (baseline)"
READ = "read (load_series)"
PNG = "read + PNG 1200x800"
TERMINAL = "read + terminal 100x30"
CLI = "command line, fresh process (PNG)"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_log(path: str, points: int = POINTS) -> None:
    """A JSONL log of `points` summaries of one key, written by `JsonlWriter`."""
    import writers  # noqa: PLC0415

    writer = writers.JsonlWriter(path, collection="train", clock=lambda: 1.7e9)
    for step in range(1, points + 1):
        writer.write_scalars(step, {"loss": 1.0 / step + (step % 7) * 1e-3})
    writer.close()


def parse_only(path: str) -> int:
    """The baseline: `json.loads` of every line, nothing else."""
    with open(path) as f:
        return len([json.loads(line) for line in f])


def run(quick: bool = False, *, points: int = POINTS, cli_runs: int | None = None) -> common.Table:
    """Median seconds to read and draw `points` points, each next to its ratio to parsing.

    Args:
      quick: fewer repeats (same table).
      points: lines in the log.
      cli_runs: runs of the command line (default 3; quick 2).

    Returns:
      One row per variant: median seconds, ratio to the parse-only baseline, and the
      number of points plotted.
    """
    from writers.plot import load_series, plot_runs  # noqa: PLC0415

    repeats = 3 if quick else 7
    workdir = tempfile.mkdtemp(prefix="bench_plot_")
    try:
        run_dir = os.path.join(workdir, "exp", "train")
        write_log(os.path.join(run_dir, "metrics.jsonl"), points)
        png = os.path.join(workdir, "plot.png")
        counts: dict[str, int] = {}

        def timed(name: str, fn: Callable[[], int]) -> Callable[[], float]:
            def measure() -> float:
                start = time.perf_counter()
                counts[name] = fn()
                return time.perf_counter() - start

            return measure

        log = os.path.join(run_dir, "metrics.jsonl")
        variants = {
            name: timed(name, fn)
            for name, fn in (
                (BASELINE, lambda: parse_only(log)),
                (READ, lambda: load_series([run_dir])[1][0].steps.size),
                (PNG, lambda: plot_runs([run_dir], out=png).series[0].steps.size),
                (
                    TERMINAL,
                    lambda: (
                        plot_runs([run_dir], terminal=True, cols=100, rows=30).series[0].steps.size
                    ),
                ),  # fmt: skip
            )
        }
        for measure in variants.values():
            measure()  # warm-up: imports matplotlib and plotext once
        samples = common.interleaved(variants, repeats)
        command = [sys.executable, "-m", "writers.plot", run_dir, "--out", png]
        cli = [
            common.timed(lambda: subprocess.run(command, cwd=REPO, check=True, capture_output=True))
            for _ in range(cli_runs or (2 if quick else 3))
        ]
        samples[CLI] = cli
        counts[CLI] = points
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    baseline = common.median(samples[BASELINE])
    table = common.Table(
        key="plot_time",
        title="8. Plotting from the logs (writers.plot)",
        description=" ".join((__doc__ or "").split("\n\n")[1].split()),
        columns=[
            common.Column("variant", "variant"),
            common.Column("points", "points", ","),
            common.Column("runs", "runs"),
            common.Column("median_s", "median (s)", ".3f"),
            common.Column("ratio", "x json.loads baseline", ".1f", "x"),
        ],
    )
    for name, values in samples.items():
        median = common.median(values)
        table.rows.append(
            {
                "variant": name,
                "points": counts[name],
                "runs": len(values),
                "median_s": median,
                "ratio": common.ratio(median, baseline),
            }
        )
    rows = {row["variant"]: row for row in table.rows}
    for name in (PNG, TERMINAL, CLI):
        table.targets.append(
            common.Target(
                f"plot {points:,} points, {name}", rows[name]["median_s"], TARGET_SECONDS, unit=" s"
            )
        )
    table.headlines.append(
        f"plot {points:,} points: PNG {rows[PNG]['median_s']:.3f} s ({rows[PNG]['ratio']:.1f}x "
        f"json.loads), terminal {rows[TERMINAL]['median_s']:.3f} s, command line "
        f"{rows[CLI]['median_s']:.2f} s"
    )
    return table


if __name__ == "__main__":
    common.main_for(run)
