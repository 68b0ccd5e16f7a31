"""What the benchmarks share: timing, medians, tables, targets, machine facts.

Every benchmark module returns one `Table` from `run(quick=...)`. A table holds its rows
(plain dicts), the columns to show, the targets it checks, the headline lines to print and
free-form notes. `run_all` prints every table and, with `--write_results`, renders them all
into `benchmarks/RESULTS.md`.

Timings on this machine are noisy (2 cores shared with other work), so every benchmark
measures its baseline in the same run, interleaves the variants (`interleaved`), and
reports medians and ratios to that baseline rather than absolute numbers alone.

Synopsis:

    table = Table(title="...", columns=[Column("variant", "variant"), ...])
    samples = interleaved({"a": run_a, "b": run_b}, repeats=5)
    table.rows.append({"variant": "a", "seconds": median(samples["a"])})
    print(format_table(table))
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import datetime
import importlib.metadata
import io
import math
import os
import platform
import pstats
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

LIBRARIES = (
    "jax",
    "jaxlib",
    "numpy",
    "flax",
    "clu",
    "optax",
    "tensorboardX",
    "rich",
    "matplotlib",
    "plotext",
    "jax-metrics-manager",
)


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a table.

    Attributes:
      key: the row-dict key the column shows.
      header: the column title.
      fmt: a `format()` spec for numbers (e.g. ".3f"), or "auto" (thousands separators
        from 1,000 up, 3 significant digits below); strings are shown as they are.
      suffix: text appended to formatted numbers (e.g. "x" for ratios).
    """

    key: str
    header: str
    fmt: str = ""
    suffix: str = ""

    def render(self, row: Mapping[str, Any]) -> str:
        value = row.get(self.key)
        if value is None:
            return "-"
        if isinstance(value, float) and math.isnan(value):
            return "nan"
        if isinstance(value, (int, float)) and not isinstance(value, bool) and self.fmt:
            fmt = self.fmt
            if fmt == "auto":
                fmt = "," if isinstance(value, int) or abs(value) >= 1000 else ".3g"
                fmt = ",.0f" if fmt == "," and isinstance(value, float) else fmt
            return f"{value:{fmt}}{self.suffix}"
        return f"{value}{self.suffix}"


@dataclasses.dataclass
class Target:
    """A target the issue sets, checked against a measured value.

    Attributes:
      name: what is measured, e.g. "overhead (summary every 100 steps)".
      value: the measured value.
      limit: the bound the value must respect.
      kind: "max" (value <= limit) or "min" (value >= limit).
      unit: shown after value and limit ("x" for ratios).
      note: when the target is missed, the cause found by profiling and the fix.
    """

    name: str
    value: float
    limit: float
    kind: str = "max"
    unit: str = "x"
    note: str = ""

    @property
    def met(self) -> bool:
        if math.isnan(self.value):
            return False
        return self.value <= self.limit if self.kind == "max" else self.value >= self.limit

    def describe(self) -> str:
        op = "<=" if self.kind == "max" else ">="
        verdict = "met" if self.met else "MISSED"
        value = f"{self.value:,.0f}" if abs(self.value) >= 1000 else f"{self.value:.3f}"
        limit = f"{self.limit:,.0f}" if abs(self.limit) >= 1000 else f"{self.limit:g}"
        return f"{self.name}: {value}{self.unit} (target {op} {limit}{self.unit}): {verdict}"


@dataclasses.dataclass
class Table:
    """The result of one benchmark.

    Attributes:
      key: short identifier ("overhead", "latency", ...).
      title: the table's heading.
      description: what was measured and how, one paragraph.
      columns: the columns to show, in order.
      rows: one dict per row (keys beyond the columns are kept for tests and notes).
      headlines: lines printed on their own, e.g. "overhead (summary every 100 steps): 1.012x".
      targets: targets checked by this benchmark.
      notes: extra findings (profiles of missed targets, caveats).
      seconds: wall time the benchmark took.
    """

    key: str
    title: str
    description: str
    columns: list[Column]
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    headlines: list[str] = dataclasses.field(default_factory=list)
    targets: list[Target] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


def table_from_rows(
    *, key: str, title: str, description: str, rows: Sequence[Mapping[str, Any]]
) -> Table:
    """A table showing every key of `rows` (in first-seen order), numbers formatted "auto".

    For benchmarks that return plain rows (e.g. `writer_throughput.run`).
    """
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    columns = [Column(k, k, "auto") for k in keys]
    return Table(
        key=key, title=title, description=description, columns=columns, rows=[dict(r) for r in rows]
    )


def median(values: Iterable[float]) -> float:
    """Median of `values`; NaN for an empty sequence."""
    values = list(values)
    return statistics.median(values) if values else float("nan")


def percentile(values: Iterable[float], q: float) -> float:
    """The `q`-th percentile (0..100) by linear interpolation; NaN for an empty sequence."""
    values = sorted(values)
    if not values:
        return float("nan")
    pos = (len(values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def ratio(value: float, baseline: float) -> float:
    """`value / baseline`, NaN when the baseline is zero or missing."""
    if not baseline or math.isnan(baseline):
        return float("nan")
    return value / baseline


def timed(fn: Callable[[], Any]) -> float:
    """Seconds `fn()` takes on the wall clock."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(
    runs: Mapping[str, Callable[[], float]], repeats: int, *, seed: int = 0
) -> dict[str, list[float]]:
    """Runs every variant `repeats` times, in a fresh random order each round.

    Interleaving spreads machine noise (other processes, thermal state) over all variants
    equally instead of letting it land on whichever variant ran during a busy spell.

    Args:
      runs: variant name -> callable that performs one measurement and returns it.
      repeats: rounds; each round runs every variant once.
      seed: seed for the order shuffle, so a run is reproducible.

    Returns:
      variant name -> list of `repeats` measurements, in round order.
    """
    rng = random.Random(seed)
    names = list(runs)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(repeats):
        rng.shuffle(names)
        for name in names:
            samples[name].append(runs[name]())
    return samples


def format_table(table: Table) -> str:
    """Plain-text rendering of `table` for the terminal (aligned columns)."""
    header = [c.header for c in table.columns]
    body = [[c.render(row) for c in table.columns] for row in table.rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(w) if i else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = [
        f"== {table.title} ({table.seconds:.1f} s) ==",
        line(header),
        line(["-" * w for w in widths]),
    ]
    out += [line(cells) for cells in body]
    out += [f"* {target.describe()}" for target in table.targets]
    out += table.headlines
    out += [f"note: {note}" for note in table.notes]
    return "\n".join(out)


def markdown_table(table: Table) -> str:
    """Markdown rendering of `table` (heading, description, table, targets, notes)."""
    out = [f"## {table.title}", "", table.description, ""]
    out.append("| " + " | ".join(c.header for c in table.columns) + " |")
    out.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(table.columns))) + "|")
    for row in table.rows:
        out.append(
            "| " + " | ".join(c.render(row).replace("|", "\\|") for c in table.columns) + " |"
        )
    out.append("")
    if table.targets:
        out += [f"- Target: {target.describe()}" for target in table.targets]
        out.append("")
    for note in table.notes:
        out += [note, ""]
    out.append(f"_Benchmark wall time: {table.seconds:.1f} s._")
    out.append("")
    return "\n".join(out)


def profile(
    fn: Callable[[], Any], *, top: int = 20, sort: str = "tottime", restrict: str | None = None
) -> str:
    """cProfile of `fn()` over every Python thread it starts, as pstats text.

    The calling thread is profiled, and so is every thread started while `fn` runs (the
    summary worker, asynchronous writers): a profiler is installed in each through
    `threading.setprofile`, and all are merged into one report. Threads that existed
    before the call are not seen.

    Args:
      fn: the work to profile.
      top: how many functions to list.
      sort: pstats sort key ("tottime": time in the function itself; "cumulative").
      restrict: a regular expression: list only functions whose "file:line(name)" matches.

    Returns:
      The report: total calls and seconds (summed over threads), then the `top` functions.
    """
    profilers: list[cProfile.Profile] = []
    lock = threading.Lock()

    def install(frame: Any, event: str, arg: Any) -> None:
        sys.setprofile(None)
        profiler = cProfile.Profile()
        with lock:
            profilers.append(profiler)
        profiler.enable()

    main = cProfile.Profile()
    # From Python 3.12 cProfile uses sys.monitoring: one profiler sees every thread, and a
    # second one raises in the thread it starts in.
    per_thread = sys.version_info < (3, 12)
    if per_thread:
        threading.setprofile(install)
    main.enable()
    try:
        fn()
    finally:
        main.disable()
        if per_thread:
            threading.setprofile(None)  # type: ignore[arg-type]
    out = io.StringIO()
    stats = pstats.Stats(main, stream=out)
    with lock:
        for profiler in profilers:
            stats.add(profiler)
    amount: tuple[Any, ...] = (top,) if restrict is None else (restrict, top)
    stats.strip_dirs().sort_stats(sort).print_stats(*amount)
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    return "\n".join(line for line in lines if line.strip())


def machine_info() -> dict[str, str]:
    """Facts about this machine and the library versions, for RESULTS.md."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "os": platform.platform(),
        "python": sys.version.split()[0],
    }
    try:
        load = os.getloadavg()
        info["load average at start (1/5/15 min)"] = " / ".join(f"{x:.2f}" for x in load)
    except OSError:
        pass
    for name in LIBRARIES:
        try:
            info[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info[name] = "not installed"
    info["git commit"] = _git_commit()
    return info


def _git_commit() -> str:
    """The checked-out commit of this repository, or "unknown" outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def run_and_time(run: Callable[..., Table], *args: Any, **kwargs: Any) -> Table:
    """Calls `run(*args, **kwargs)` and records its wall time on the returned table."""
    start = time.perf_counter()
    table = run(*args, **kwargs)
    table.seconds = time.perf_counter() - start
    return table


def main_for(run: Callable[..., Table], argv: Sequence[str] | None = None) -> None:
    """Command-line entry point shared by the benchmark modules: `--quick`, then print.

    Args:
      run: the module's `run(quick: bool) -> Table`.
      argv: arguments (default: sys.argv[1:]).
    """
    parser = argparse.ArgumentParser(description=(run.__module__ or "").rsplit(".", 1)[-1])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, same table")
    args = parser.parse_args(argv)
    table = run_and_time(run, quick=args.quick)
    print(format_table(table))
