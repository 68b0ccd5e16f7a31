"""benchmarks/trackers.py runs and its table is consistent (numbers are not judged here)."""

from __future__ import annotations

import math

from benchmarks import common, run_all, trackers


def test_tracker_benchmark_rows_ratios_and_headlines():
    table = trackers.run(True, calls=2, repeats=1)
    assert [row["comparison"] for row in table.rows] == list(trackers.PAIRS)
    for row in table.rows:
        assert row["ours"] > 0 and row["base"] > 0
        assert math.isclose(row["ratio"], row["ours"] / row["base"])
    assert len(table.headlines) == 2 and all("scalars/s" in h for h in table.headlines)
    assert "writer / per key" in common.format_table(table)
    assert run_all.BENCHMARKS["trackers"].__name__ == "_trackers"
