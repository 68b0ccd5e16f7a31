"""Two real processes in one `jax.distributed` cluster report what one process reports.

`tests/multiprocess_worker.py` runs the README's language-model loop (microbatches,
T5X's base metrics, `merge_metrics`) with a `MetricsManager` in every process, on a
global batch sharded over 2 processes x 2 fake CPU devices (gloo collectives over
127.0.0.1). The same global batch in one process on one device is the reference. Both
cluster processes must exit 0 within a bounded time (else both are killed and the test
fails), agree with the reference to 1e-6 on every base metric (a rate as its count, since
the wall-clock windows differ), and only process 0 may create files.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from tensorboard.backend.event_processing import event_accumulator as ea

import writers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_all(commands: dict[str, list[str]], logs_dir) -> None:
    """Runs the commands at once; kills all and fails if any is still running after TIMEOUT_S."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    procs = {}
    for name, args in commands.items():
        log = open(logs_dir / f"{name}.log", "w")  # noqa: SIM115  (closed below)
        procs[name] = (
            subprocess.Popen(
                [sys.executable, "-m", "tests.multiprocess_worker", *args],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            ),
            log,
        )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while any(p.poll() is None for p, _ in procs.values()):
            if time.monotonic() > deadline:
                pytest.fail(f"processes still running after {TIMEOUT_S:.0f} s: killed (a hang)")
            time.sleep(0.1)
    finally:
        for proc, log in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    for name, (proc, _) in procs.items():
        log = (logs_dir / f"{name}.log").read_text()[-3000:]
        assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{log}"


def test_two_processes_report_the_one_process_summaries(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    port = str(_free_port())
    _run_all(
        {
            "reference": ["0", "1", "0", "1", str(one)],
            "process0": ["0", "2", port, "2", str(two)],
            "process1": ["1", "2", port, "2", str(two)],
        },
        tmp_path,
    )
    reference = json.loads((one / "result0.json").read_text())["summaries"]
    results = [json.loads((two / f"result{i}.json").read_text()) for i in (0, 1)]
    assert [r["writes"] for r in results] == [True, False]

    for result in results:  # every process gets the same summaries back
        assert result["summaries"].keys() == reference.keys() == {"2", "4"}
        for step, expected in reference.items():
            got = result["summaries"][step]
            assert got.keys() == expected.keys()
            assert {"loss", "accuracy", "z_loss", "timing/seqs"} <= got.keys()
            for key, value in expected.items():
                if key == "timing/seconds":
                    assert got[key] > 0
                elif "per_second" in key:
                    # Wall-clock windows differ between runs: compare what they count (at most
                    # 1.1e-7 apart, measured).
                    got_count = got[key] * got["timing/seconds"]
                    count = value * expected["timing/seconds"]
                    assert got_count == pytest.approx(count, rel=1e-6), (step, key)
                else:
                    assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-6), (step, key)

    # Only process 0 created files; they hold the same values as the futures.
    assert sorted(os.listdir(two)) == ["p0", "result0.json", "result1.json"]
    run_dir = two / "p0" / "train"
    lines = writers.read_jsonl(run_dir / "metrics.jsonl")
    summaries = {str(line["step"]): line for line in lines if "loss" in line}
    for step, expected in results[0]["summaries"].items():
        assert summaries[step]["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    acc = ea.EventAccumulator(str(run_dir))
    acc.Reload()
    assert [(s.step, s.value) for s in acc.Scalars("accuracy")] == [
        (2, pytest.approx(reference["2"]["accuracy"], rel=1e-6)),
        (4, pytest.approx(reference["4"]["accuracy"], rel=1e-6)),
    ]
    # Host-local values: gathered and written per process, or process 0's value alone.
    (gathered,) = [line for line in lines if "input_seconds/process0" in line]
    assert (gathered["input_seconds/process0"], gathered["input_seconds/process1"]) == (1.0, 2.0)
    assert [line["host_value"] for line in lines if "host_value" in line] == [1.0]
    # A sharded global array: refused in both processes with the fix, written once gathered
    # (all 16 x 8 tokens of the last batch, as the 1-process run writes them directly).
    assert json.loads((one / "result0.json").read_text())["refused"] == ""
    for result in results:
        assert result["refused"] == (
            "MetricsManager.write_histograms: histogram 'tokens' of shape (16, 8) is sharded "
            "over processes, and process 0, which writes, holds only its own shards; gather it "
            "on every process first: multihost_utils.process_allgather(x, tiled=True)"
        )
    # The same array as a scalar: refused for its shape in every run, as in one process.
    for result in (json.loads((one / "result0.json").read_text()), *results):
        assert result["refused_scalar"] == (
            "MetricsManager.write_scalars: scalar 'tokens' must hold exactly one number, got an "
            "array of shape (16, 8). Reduce it first (e.g. .mean()) or write it as a histogram."
        )
    # A metrics dict with a leaf sharded over processes: refused in both (a gather on the
    # worker deadlocked a probe's two processes); written in the 1-process run.
    assert json.loads((one / "result0.json").read_text())["refused_rows"] == ""
    for result in results:
        assert result["refused_rows"].startswith(
            "MetricsManager.write_metrics_summary: metrics ['rows'] hold arrays sharded over "
            "processes"
        )
    # The same array as a raw tensor (`clu.values.Summary`) in a metrics dict: refused in both
    # (read with the summary, it failed every key of it on both); written in the 1-process run.
    assert json.loads((one / "result0.json").read_text())["refused_raw"] == ""
    (tensor,) = [
        line["token_tensor"]
        for line in writers.read_jsonl(one / "p0" / "train")
        if "token_tensor" in line
    ]
    assert (tensor["shape"], len(tensor["values"])) == ([16, 8], 16)
    for result in results:
        assert result["refused_raw"] == (
            "MetricsManager.write_metrics_summary: summary 'token_tensor' of shape (16, 8) is "
            "sharded over processes, and process 0, which writes, holds only its own shards; "
            "gather it on every process first: multihost_utils.process_allgather(x, tiled=True)"
        )
    # Bad constructions: refused on every process with the same error, as in one process.
    refused_made = json.loads((one / "result0.json").read_text())["refused_made"]
    assert refused_made["same directory"].startswith("ValueError: MetricsManager('train'): ")
    assert refused_made["resume_step"] == (
        "TypeError: MetricsManager('eval'): resume_step=3 needs a writer_factory taking "
        "resume_step, to drop the logged steps after it, such as writers.create_default_writer"
    )  # up to the first ';'
    assert [r["refused_made"]["resume_step"] for r in results] == [refused_made["resume_step"]] * 2
    for i, result in enumerate(results):
        assert result["refused_made"]["same directory"] == refused_made["same directory"].replace(
            str(one / "p0"), str(two / f"p{i}")
        )
    (hist,) = [line["gathered_tokens"] for line in lines if "gathered_tokens" in line]
    (direct,) = [
        line["tokens"] for line in writers.read_jsonl(one / "p0" / "train") if "tokens" in line
    ]
    assert hist["count"] == 16 * 8 and hist == direct
