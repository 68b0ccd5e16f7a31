"""Smoke tests of the benchmarks: each runs at its smallest sizes (seconds, not minutes).

They check the table structure and that every figure is sane: times positive, each ratio
computed from the two numbers measured in the same run. Never a timing threshold: the
benchmarks themselves (`make bench`) are where performance is judged. Where a benchmark
measures something that is not a timing (transfers per summary, one batched copy), that
is asserted exactly.
"""

from __future__ import annotations

import functools
import math
import re
import threading

import jax
import numpy as np
import pytest

from benchmarks import (
    common,
    latency,
    memory,
    microbatching,
    model,
    overhead,
    plot_time,
    run_all,
    summary_leaves,
)


def _check_structure(table: common.Table) -> None:
    assert table.rows, table.title
    for column in table.columns:
        assert any(column.key in row for row in table.rows), column.key
    text = common.format_table(table)
    markdown = common.markdown_table(table)
    for column in table.columns:
        assert column.header in text
        assert column.header in markdown
    assert markdown.count("\n|") >= len(table.rows) + 2  # header, separator, rows


# --- common ----------------------------------------------------------------------------


def test_median_percentile_ratio():
    assert common.median([3.0, 1.0, 2.0]) == 2.0
    assert common.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert math.isnan(common.median([]))
    assert common.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert common.percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    assert common.percentile([7.0], 99) == 7.0
    assert common.ratio(3.0, 2.0) == 1.5
    assert math.isnan(common.ratio(1.0, 0.0))


def test_interleaved_runs_every_variant_each_round_in_varying_order():
    calls: list[str] = []

    def variant(name: str):
        def measure() -> float:
            calls.append(name)
            return float(len(calls))

        return measure

    samples = common.interleaved({n: variant(n) for n in "abcd"}, repeats=6, seed=1)
    assert {n: len(v) for n, v in samples.items()} == {n: 6 for n in "abcd"}
    rounds = [tuple(calls[i : i + 4]) for i in range(0, 24, 4)]
    assert all(sorted(r) == list("abcd") for r in rounds)
    assert len(set(rounds)) > 1  # the order is shuffled between rounds
    # Each sample is what its own call returned.
    assert sorted(x for v in samples.values() for x in v) == [float(i) for i in range(1, 25)]


def test_target_verdicts_and_table_rendering():
    met = common.Target("overhead (summary every 100 steps)", 1.01, 1.02)
    missed = common.Target("growth", 20.0, 16.0, unit=" MiB")
    at_least = common.Target("throughput", 12.0, 10.0, kind="min")
    assert met.met and not missed.met and at_least.met
    assert "1.010x (target <= 1.02x): met" in met.describe()
    assert "MISSED" in missed.describe()
    table = common.Table(
        key="t",
        title="T",
        description="d",
        columns=[common.Column("name", "name"), common.Column("x", "x", ".2f", "x")],
        rows=[{"name": "a|b", "x": 1.234}, {"name": "c", "x": None}],
        targets=[met],
        headlines=["overhead (summary every 100 steps): 1.010x"],
    )
    markdown = common.markdown_table(table)
    assert "| a\\|b | 1.23x |" in markdown
    assert "| c | - |" in markdown
    assert "overhead (summary every 100 steps): 1.010x" in common.format_table(table)


def test_table_from_rows_shows_every_key():
    table = common.table_from_rows(
        key="w",
        title="W",
        description="",
        rows=[{"writer": "tb", "scalars_per_s": 123456.7}, {"writer": "x", "ratio": 0.5}],
    )
    assert [c.key for c in table.columns] == ["writer", "scalars_per_s", "ratio"]
    assert "123,457" in common.format_table(table)
    assert "0.5" in common.markdown_table(table)


# --- transfer counting -------------------------------------------------------------------


def _fresh_leaves(n: int) -> list[jax.Array]:
    return jax.block_until_ready(jax.device_put(list(np.arange(n, dtype=np.float32))))


def test_count_transfers_sees_per_leaf_gets_threads_and_numpy():
    leaves = _fresh_leaves(5)
    with summary_leaves.count_transfers() as per_leaf:
        jax.tree.map(jax.device_get, leaves)
    assert len(per_leaf.arrays) == 5 and per_leaf.device_get_calls == 5

    leaves = _fresh_leaves(4)
    with summary_leaves.count_transfers() as other_thread:
        worker = threading.Thread(target=lambda: [np.asarray(x) for x in leaves])
        worker.start()
        worker.join()
    assert len(other_thread.arrays) == 4 and other_thread.device_get_calls == 0

    with summary_leaves.count_transfers() as twice:
        jax.device_get(leaves)
        jax.device_get(leaves)
    assert len(twice.arrays) == 4 and twice.device_get_calls == 2  # distinct arrays

    originals = (jax.device_get, np.asarray, type(leaves[0]).copy_to_host_async)
    with summary_leaves.count_transfers():
        assert jax.device_get is not originals[0]
    assert (jax.device_get, np.asarray, type(leaves[0]).copy_to_host_async) == originals


# --- the benchmarks at their smallest sizes ------------------------------------------------


def test_overhead_smoke():
    table = overhead.run(
        num_steps=4,
        repeats=2,
        summary_every=(2,),
        size=model.SMALL,
        explain_misses=False,
        pairs=3,
        pair_repeats=2,
    )
    _check_structure(table)
    assert [row["variant"] for row in table.rows] == list(overhead.VARIANTS)
    for row in table.rows:
        assert len(row["samples"]) == 2 and all(s > 0 for s in row["samples"])
        # Shorter than one window: the time is the median of whole runs.
        assert row["seconds"] == row["run_seconds"] == common.median(row["samples"]) > 0
        assert row["ratio"] == row["seconds"] / row["baseline_seconds"]
        assert row["run_ratio"] == row["run_seconds"] / row["baseline_run_seconds"]
        assert row["cpu_seconds"] > 0
        assert row["cpu_ratio"] == row["cpu_seconds"] / row["baseline_cpu_seconds"]
    assert table.rows[0]["ratio"] == table.rows[0]["cpu_ratio"] == 1.0
    library = next(row for row in table.rows if row["variant"] == "library")
    ratios = library["per_run_ratios"]
    assert len(ratios) == 2 and all(r > 0 for r in ratios)
    spread = f"{min(ratios):.3f}x-{max(ratios):.3f}x"
    assert library["spread"] == spread
    # The paired measurement: 2 repeats (each in a fresh process) of 3 pairs of blocks.
    pairs = library["paired_ratios"]
    assert len(pairs) == 6 and all(r > 0 for r in pairs)
    repeat_ratios = [common.median(pairs[:3]), common.median(pairs[3:])]
    assert library["paired_repeat_ratios"] == repeat_ratios
    assert library["paired_ratio"] == common.median(repeat_ratios)
    paired_spread = f"{min(repeat_ratios):.3f}x-{max(repeat_ratios):.3f}x"
    assert library["paired_spread"] == paired_spread
    assert table.headlines[0] == (
        f"overhead (summary every 2 steps): {library['paired_ratio']:.3f}x (paired blocks, "
        f"repeats {paired_spread}); whole runs {library['ratio']:.3f}x (runs {spread})"
    )
    assert [t.value for t in table.targets] == []  # no target for a summary every 2 steps
    pattern = r".+ \(summary every .+\): \d+\.\d{3}x \(runs \d+\.\d{3}x-\d+\.\d{3}x\)"
    assert all(re.fullmatch(pattern, h) for h in table.headlines[1:-1])
    # What the paired blocks resolve: (a) against itself with a 5% sleep after each block.
    resolution = re.fullmatch(
        r"paired blocks, \(a\) made 5% slower over \(a\): (\d+\.\d{3})x \(repeats "
        r"(\d+\.\d{3})x-(\d+\.\d{3})x\): the regression the paired ratios resolve",
        table.headlines[-1],
    )
    assert resolution is not None
    low, high = float(resolution[2]), float(resolution[3])
    assert low <= float(resolution[1]) <= high


def test_estimate_takes_median_windows_plus_median_tail():
    def timing(windows: list[float], tail: float) -> overhead.Timing:
        return overhead.Timing(
            wall=sum(windows) + tail,
            cpu=2 * (sum(windows) + tail),
            windows=windows,
            cpu_windows=[2 * w for w in windows],
            tail=tail,
        )

    # A burst of load spoiled one window of the second run (5.0 instead of ~1.0).
    timings = [timing([1.0, 1.1, 0.9], 0.2), timing([1.0, 5.0, 1.2], 0.4)]
    est = overhead.estimate(timings, num_steps=3 * overhead.WINDOW + 7)
    assert est["seconds"] == pytest.approx(3 * 1.05 + 0.3)
    assert est["cpu_seconds"] == pytest.approx(3 * 2.1 + 0.6)
    assert est["run_seconds"] == pytest.approx((3.2 + 7.6) / 2)
    assert est["samples"] == [t.wall for t in timings]


def test_stopwatch_marks_window_boundaries():
    clock = overhead.Stopwatch()
    for i in range(2 * overhead.WINDOW + 3):
        clock.step_done(i + 1)
    timing = clock.read()
    assert len(timing.windows) == len(timing.cpu_windows) == 2
    assert timing.wall == pytest.approx(sum(timing.windows) + timing.tail)


def test_explain_quotes_a_profile_of_every_thread_and_breaks_a_summary_down():
    loops = overhead.Loops(model.SMALL)
    loops.warm_up()
    note = overhead.explain(loops, every=1, num_steps=3)
    assert "Profile of (b), summary every step" in note
    assert "ncalls" in note and "tottime" in note
    assert "| device_get + unpack_host of the PackedMetrics" in note
    breakdown = overhead.summary_breakdown(loops, calls=3)
    assert len(breakdown) == 9 and all(us > 0 for us in breakdown.values())
    anatomy = overhead.step_anatomy(loops)
    none, computed, packed, per_leaf = anatomy.values()
    # The metrics add compiled work and output buffers; packing leaves two buffers.
    assert none["outputs"] == len(loops.params0)
    assert computed["outputs"] > none["outputs"] and computed["fusions"] > none["fusions"]
    assert packed["outputs"] == len(loops.params0) + 2 < per_leaf["outputs"]


def test_profile_sees_threads_started_inside():
    def worker_function_xyz() -> None:
        sum(range(100_000))

    def fn() -> None:
        thread = threading.Thread(target=worker_function_xyz)
        thread.start()
        thread.join()

    report = common.profile(fn, top=50)
    assert "worker_function_xyz" in report


def test_latency_smoke():
    table = latency.run(fast_calls=3, slow_calls=2, size=model.SMALL)
    _check_structure(table)
    assert len(table.rows) == 4
    for row in table.rows:
        assert row["median_seconds"] > 0 and row["p99_seconds"] >= row["median_seconds"]
        assert row["median_ratio"] == row["median_seconds"] / row["baseline_median_seconds"]
        assert row["p99_ratio"] == row["p99_seconds"] / row["baseline_p99_seconds"]
    slow_baseline = table.rows[2]
    assert slow_baseline["median_seconds"] >= latency.SLOW_SECONDS  # it really waits
    assert len(table.targets) == 2


def test_summary_leaves_smoke_counts_one_batched_transfer():
    table = summary_leaves.run(sizes=(3, 40), repeats=1)
    _check_structure(table)
    for row in table.rows:
        assert row["library_seconds"] > 0 and row["t5x_seconds"] > 0
        assert row["ratio"] == row["library_seconds"] / row["t5x_seconds"]
        # T5X's path copies each leaf on its own; the manager packs them into one copy.
        assert row["t5x_arrays"] == row["t5x_gets"] == row["leaves"]
        assert row["library_arrays"] == 1
    assert any(h.startswith("device-to-host arrays copied per summary") for h in table.headlines)
    linear, one_transfer = table.targets
    assert linear.value == table.rows[1]["us_per_leaf"] / table.rows[0]["us_per_leaf"]
    assert one_transfer.value == 1 and one_transfer.met


def test_microbatching_smoke():
    table = microbatching.run(
        counts=(1, 2, 4, 8), global_batch=8, num_steps=2, repeats=1, size=model.SMALL
    )
    _check_structure(table)
    assert [row["microbatches"] for row in table.rows] == [1, 2, 4, 8]
    assert [row["microbatch_size"] for row in table.rows] == [8, 4, 2, 1]
    for row in table.rows:
        assert row["compile_seconds"] > 0 and row["step_seconds"] > 0
        assert row["compile_ratio"] == row["compile_seconds"] / row["baseline_compile_seconds"]
        assert row["step_ratio"] == row["step_seconds"] / row["baseline_step_seconds"]
    assert table.rows[0]["compile_ratio"] == table.rows[0]["step_ratio"] == 1.0
    # The target compares the largest count that was run (8) with the smallest real loop (4).
    (target,) = table.targets
    assert target.value == table.rows[3]["compile_seconds"] / table.rows[2]["compile_seconds"]


def test_memory_smoke():
    table = memory.run(writer_summaries=100, manager_summaries=50)
    _check_structure(table)
    for path, total in (("writers", 100), ("manager", 50)):
        rows = [row for row in table.rows if row["path"] == path]
        marks = [max(1, total // 50), *range(total // 10, total + 1, total // 10), total]
        assert [row["count"] for row in rows] == marks
        for row in rows:
            assert row["rss_bytes"] > 0
            assert row["ratio"] == row["rss_bytes"] / row["baseline_rss_bytes"]
        assert rows[0]["ratio"] == 1.0
    assert len(table.targets) == 2


def test_plot_time_smoke():
    table = plot_time.run(quick=True, points=200, cli_runs=1)
    _check_structure(table)
    rows = {row["variant"]: row for row in table.rows}
    assert list(rows) == [plot_time.BASELINE, plot_time.READ, plot_time.PNG, plot_time.TERMINAL,
                          plot_time.CLI]  # fmt: skip
    baseline = rows[plot_time.BASELINE]["median_s"]
    for row in table.rows:
        assert row["points"] == 200 and row["median_s"] > 0
        assert row["ratio"] == row["median_s"] / baseline
    assert [t.value for t in table.targets] == [
        rows[name]["median_s"] for name in (plot_time.PNG, plot_time.TERMINAL, plot_time.CLI)
    ]


# --- run_all ----------------------------------------------------------------------------


def test_render_results_has_machine_headlines_targets_and_tables():
    tables = [
        common.Table(
            key=f"t{i}",
            title=f"{i}. Table {i}",
            description="what",
            columns=[common.Column("x", "x", ".1f")],
            rows=[{"x": float(i)}],
            headlines=[f"headline {i}: 1.000x"],
            targets=[common.Target(f"target {i}", 1.0, 2.0)],
        )
        for i in range(1, 7)
    ]
    text = run_all.render_results(tables, {"cpu": "test cpu", "jax": "1.2.3"}, False, 12.0)
    assert "| cpu | test cpu |" in text and "| jax | 1.2.3 |" in text
    assert "make bench" in text
    for i in range(1, 7):
        assert f"## {i}. Table {i}" in text
        assert f"headline {i}: 1.000x" in text
        assert f"target {i}: 1.000x (target <= 2x): met" in text


def test_run_all_writer_throughput_table_has_targets_and_headline(monkeypatch):
    from benchmarks import writer_throughput

    small = functools.partial(writer_throughput.run, total=30, repeats=1)
    monkeypatch.setattr(writer_throughput, "run", small)
    table = run_all.BENCHMARKS["writer_throughput"](True)
    _check_structure(table)
    assert {row["writer"] for row in table.rows} >= {"TensorBoardWriter", "tensorboardX add_scalar"}
    assert len(table.targets) == 2
    assert table.headlines[0].startswith("TensorBoardWriter vs add_scalar (50 scalars/call): ")


def test_update_readme_rewrites_only_the_marked_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Title\n\n## Benchmarks\n\n<!-- benchmarks:begin (note) -->\nold text\n"
        "<!-- benchmarks:end -->\n\n## Development\n"
    )
    table = common.Table(
        key="t",
        title="T",
        description="",
        columns=[],
        headlines=["overhead (summary every 100 steps): 1.010x"],
        targets=[common.Target("overhead (summary every step)", 1.2, 1.15)],
    )
    block = run_all.readme_block([table], {"date": "today", "cores": "2", "cpu": "cpu"})
    assert run_all.update_readme(block, str(readme))
    text = readme.read_text()
    assert text.startswith("# Title\n\n## Benchmarks\n\n<!-- benchmarks:begin (note) -->\n")
    assert text.endswith("<!-- benchmarks:end -->\n\n## Development\n")
    assert "old text" not in text
    assert "overhead (summary every 100 steps): 1.010x" in text
    assert "- overhead (summary every step): 1.200x (target <= 1.15x): MISSED" in text
    assert not run_all.update_readme(block, str(tmp_path / "missing.md"))


def test_run_all_rejects_unknown_benchmarks(capsys):
    with pytest.raises(SystemExit):
        run_all.main(["--only", "nope"])
    assert "unknown benchmark" in capsys.readouterr().err


def test_machine_info_names_versions():
    info = common.machine_info()
    for key in ("date", "cpu", "cores", "python", "jax", "numpy", "tensorboardX"):
        assert info[key]


def test_remote_flush_benchmark_smallest_size(monkeypatch):
    from benchmarks import remote_flush

    monkeypatch.setattr(remote_flush, "PRIORS", (2, 6))
    table = remote_flush.run(repeats=3)
    assert [row["prior"] for row in table.rows] == [2, 6]
    assert all(row["median_ms"] > 0 and row["bytes_per_flush"] > 0 for row in table.rows)
    assert table.rows[0]["ratio"] == 1.0 and len(table.targets) == 1
    assert "remote flush (GCS emulator)" in table.headlines[0]


def test_window_timing_and_guard_overhead_smoke():
    from benchmarks import guard_overhead, window_timing

    ratios = window_timing.one_run(windows=3)
    assert len(ratios) == 3 and all(0.5 < r < 1.5 for r in ratios)  # measured / true steps/s
    ahead = window_timing.one_run_ahead(windows=3, every=5)
    assert len(ahead) == 3 and all(r > 0.0 for r in ahead)
    assert guard_overhead.one_loop("stop", steps=30) > 0.0


def test_device_scalars_smoke():
    from benchmarks import device_scalars

    step, x = device_scalars.make_step(size=32)
    assert all(device_scalars.one_loop(v, step, x, steps=20) > 0.0 for v in device_scalars.VARIANTS)
