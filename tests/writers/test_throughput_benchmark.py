"""benchmarks/writer_throughput.py runs and its table is consistent (numbers are not judged here)."""

from __future__ import annotations

import math

from benchmarks import writer_throughput


def test_benchmark_rows_are_complete_and_ratios_match_the_rates():
    rows = writer_throughput.run(True, total=1_000, repeats=1)
    assert [r["writer"] for r in rows] == list(writer_throughput.VARIANTS)
    baseline = rows[0]
    assert baseline["writer"] == writer_throughput.BASELINE
    for row in rows:
        for size in writer_throughput.SIZES:
            rate = row[f"scalars/s @{size}"]
            assert rate > 0 and math.isfinite(rate)
            expected = rate / baseline[f"scalars/s @{size}"]
            assert math.isclose(row[f"x add_scalar @{size}"], expected)
    targets = writer_throughput.targets(rows)
    assert [t.kind for t in targets] == ["min", "min"]
    assert targets[0].value == rows[1]["x add_scalar @50"]
