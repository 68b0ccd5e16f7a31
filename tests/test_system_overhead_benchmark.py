"""Smoke test of benchmarks/system_overhead.py at its smallest size: structure and sane figures."""

from __future__ import annotations

import pytest

from benchmarks import common, run_all, system_overhead


def test_table_rows_ratios_and_target():
    table = system_overhead.run(calls=5, repeats=1)
    assert run_all.BENCHMARKS["system_overhead"] is run_all._system_overhead
    calls = [row["call"] for row in table.rows]
    assert calls[:3] == [
        "write_values, 20 scalars, NoopWriter (baseline)",
        "SystemMonitor.sample() (all sensors)",
        "SystemMonitor.window_values()",
    ]
    assert "  sensor: cpu percent" in calls and "  sensor: memory" in calls
    baseline = table.rows[0]["us"]
    for row in table.rows:
        assert row["us"] > 0, row
        assert row["ratio"] == pytest.approx(row["us"] / baseline), row
    (target,) = table.targets
    assert target.value == table.rows[1]["us"] and target.limit == 1000.0
    assert "one sample" in table.headlines[0]
    text = common.format_table(table)
    assert "median (µs)" in text and "7. System metrics" in common.markdown_table(table)
