"""Runs every benchmark, prints the tables and headlines, and writes benchmarks/RESULTS.md.

    python -m benchmarks.run_all                  # every table (what `make bench` runs)
    python -m benchmarks.run_all --quick          # same tables, fewer repetitions
    python -m benchmarks.run_all --write_results  # also (re)write benchmarks/RESULTS.md
    python -m benchmarks.run_all --only overhead,latency

RESULTS.md holds the machine, library versions and date, the headline lines, every
target with its verdict, every table (medians of repeated, interleaved runs, each
figure next to its ratio to a baseline measured in the same run) and the hand-written
analysis kept in benchmarks/ANALYSIS.md (causes of missed targets, found by profiling).
The same run rewrites the summary between the README's `benchmarks:begin`/`end` markers.
A benchmark that fails is reported and the others still run; the exit status is then 1
and RESULTS.md is left untouched.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence

from benchmarks import common

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_PATH = os.path.join(HERE, "RESULTS.md")
ANALYSIS_PATH = os.path.join(HERE, "ANALYSIS.md")


def _overhead(quick: bool) -> common.Table:
    from benchmarks import overhead  # noqa: PLC0415

    return overhead.run(quick)


def _writer_throughput(quick: bool) -> common.Table:
    from benchmarks import writer_throughput  # noqa: PLC0415

    rows = writer_throughput.run(quick)
    doc = (writer_throughput.__doc__ or "").strip().split("\n\n")
    table = common.table_from_rows(
        key="writer_throughput",
        title="2. Writer throughput",
        description=" ".join(" ".join(doc[:2]).split()),
        rows=rows,
    )
    table.targets = writer_throughput.targets(rows)
    for row in rows:
        if row["writer"] == writer_throughput.TARGET_WRITER:
            table.headlines.append(
                f"TensorBoardWriter vs add_scalar (50 scalars/call): "
                f"{row['x add_scalar @50']:.1f}x, {row['scalars/s @50']:,.0f} scalars/s"
            )
    return table


def _latency(quick: bool) -> common.Table:
    from benchmarks import latency  # noqa: PLC0415

    return latency.run(quick)


def _summary_leaves(quick: bool) -> common.Table:
    from benchmarks import summary_leaves  # noqa: PLC0415

    return summary_leaves.run(quick)


def _microbatching(quick: bool) -> common.Table:
    from benchmarks import microbatching  # noqa: PLC0415

    return microbatching.run(quick)


def _memory(quick: bool) -> common.Table:
    from benchmarks import memory  # noqa: PLC0415

    # A fresh process: memory that earlier benchmarks freed (and the allocator kept) would
    # otherwise absorb new allocations and hide growth.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(memory.run, quick).result()


def _system_overhead(quick: bool) -> common.Table:
    from benchmarks import system_overhead  # noqa: PLC0415

    return system_overhead.run(quick)


def _plot_time(quick: bool) -> common.Table:
    from benchmarks import plot_time  # noqa: PLC0415

    return plot_time.run(quick)


def _guard_overhead(quick: bool) -> common.Table:
    from benchmarks import guard_overhead  # noqa: PLC0415

    return guard_overhead.run(quick)


def _window_timing(quick: bool) -> common.Table:
    from benchmarks import window_timing  # noqa: PLC0415

    return window_timing.run(quick)


def _remote_flush(quick: bool) -> common.Table:
    from benchmarks import remote_flush  # noqa: PLC0415

    return remote_flush.run(quick)


def _device_scalars(quick: bool) -> common.Table:
    from benchmarks import device_scalars  # noqa: PLC0415

    return device_scalars.run(quick)


def _trackers(quick: bool) -> common.Table:
    from benchmarks import trackers  # noqa: PLC0415

    return trackers.run(quick)


BENCHMARKS: dict[str, Callable[[bool], common.Table]] = {
    "overhead": _overhead,
    "writer_throughput": _writer_throughput,
    "latency": _latency,
    "summary_leaves": _summary_leaves,
    "microbatching": _microbatching,
    "memory": _memory,
    "system_overhead": _system_overhead,
    "plot_time": _plot_time,
    "remote_flush": _remote_flush,
    "window_timing": _window_timing,
    "guard_overhead": _guard_overhead,
    "device_scalars": _device_scalars,
    "trackers": _trackers,
}


def render_results(
    tables: Sequence[common.Table], info: dict[str, str], quick: bool, seconds: float
) -> str:
    """The text of RESULTS.md."""
    command = "make bench-quick" if quick else "make bench"
    out = [
        "# Benchmark results",
        "",
        f"Written by `{command}` (`python -m benchmarks.run_all"
        f"{' --quick' if quick else ''} --write_results`) in {seconds:.0f} s. "
        "Every figure is a median of repeated runs, interleaved so machine noise hits every "
        "variant alike, and is shown next to its ratio to a baseline measured in the same "
        "run. The machine is shared (other processes were running), so absolute times are "
        "noisy; the ratios are what to read.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
    ]
    out += [f"| {key} | {value} |" for key, value in info.items()]
    out += ["", "## Headlines", "", "```"]
    for table in tables:
        out += table.headlines
    out += ["```", "", "## Targets", ""]
    targets = [target for table in tables for target in table.targets]
    out += [f"- {target.describe()}" for target in targets] or ["- (none checked)"]
    out.append("")
    for table in tables:
        out.append(common.markdown_table(table))
    if os.path.exists(ANALYSIS_PATH):
        with open(ANALYSIS_PATH) as f:
            out += [f.read().rstrip(), ""]
    return "\n".join(out)


README_PATH = os.path.join(os.path.dirname(HERE), "README.md")
README_BEGIN = "<!-- benchmarks:begin"
README_END = "<!-- benchmarks:end -->"


def readme_block(tables: Sequence[common.Table], info: dict[str, str]) -> str:
    """The README's benchmark summary: where the tables are, the headlines, missed targets."""
    lines = [
        "Full tables: [benchmarks/RESULTS.md](benchmarks/RESULTS.md) (`make bench`, or "
        f"`make bench-quick`), measured {info.get('date', '')} on {info.get('cores', '?')} "
        f"cores ({info.get('cpu', '')}). Ratios are to a baseline measured in the same run; "
        "the overhead lines are training-loop time with metrics over time without.",
        "",
        "```text",
    ]
    lines += [line for table in tables for line in table.headlines]
    lines.append("```")
    missed = [t for table in tables for t in table.targets if not t.met]
    if missed:
        lines += ["", "Targets missed in that run (causes found by profiling, and fixes, are in"]
        lines += ["RESULTS.md's analysis):", ""]
        lines += [f"- {target.describe()}" for target in missed]
    return "\n".join(lines)


def update_readme(block: str, path: str = README_PATH) -> bool:
    """Replaces the text between the README's benchmark markers; False if they are missing."""
    if not os.path.exists(path):
        return False
    with open(path) as f:
        text = f.read()
    begin = text.find(README_BEGIN)
    end = text.find(README_END)
    if begin < 0 or end < begin:
        return False
    begin = text.index("\n", begin) + 1  # keep the marker line itself
    with open(path, "w") as f:
        f.write(text[:begin] + block + "\n" + text[end:])
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, same tables")
    parser.add_argument("--write_results", action="store_true", help="write benchmarks/RESULTS.md")
    parser.add_argument(
        "--only", default="", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}"
    )
    args = parser.parse_args(argv)
    names = [name for name in args.only.split(",") if name] or list(BENCHMARKS)
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")

    info = common.machine_info()
    start = time.perf_counter()
    tables: list[common.Table] = []
    failed: list[str] = []
    for name in names:
        print(f"-- running {name} ...", flush=True)
        try:
            table = common.run_and_time(BENCHMARKS[name], args.quick)
        except Exception:  # noqa: BLE001  (report it, run the others, exit 1 at the end)
            traceback.print_exc()
            failed.append(name)
            continue
        tables.append(table)
        print(common.format_table(table), "\n", flush=True)
    seconds = time.perf_counter() - start

    print("== Headlines ==")
    for table in tables:
        for line in table.headlines:
            print(line)
    missed = [t for table in tables for t in table.targets if not t.met]
    for target in missed:
        print(f"MISSED: {target.describe()}")
    print(f"(total {seconds:.0f} s)")
    if failed:
        print(f"FAILED benchmarks: {', '.join(failed)}; RESULTS.md not written.", file=sys.stderr)
        return 1
    if args.write_results:
        if set(names) != set(BENCHMARKS):
            print("RESULTS.md is only written by a run of every benchmark.", file=sys.stderr)
            return 1
        with open(RESULTS_PATH, "w") as f:
            f.write(render_results(tables, info, args.quick, seconds))
        print(f"wrote {RESULTS_PATH}")
        if update_readme(readme_block(tables, info)):
            print(f"updated the benchmark summary in {README_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
