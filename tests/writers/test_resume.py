"""Resuming a run: each step once in TensorBoard and in metrics.jsonl, crash-safe rewrites.

A run is preempted after step 100 and restarted from its checkpoint at step 50: the
second run writes steps 51..100 again. Readers (TensorBoard's EventAccumulator and a
plain `json.loads` per line) must see steps 1..100 once each, with the second run's
values after 50. The JSONL rewrite is killed (SIGKILL, a real process) in the middle to
show that the log is always the complete old or the complete new one.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import stat
import subprocess
import sys
import time

import fsspec
import pytest
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.backend.event_processing import plugin_event_accumulator as pea
from tensorboard.util import tensor_util

import writers
from metrics_manager.gin_utils import write_gin_config
from writers import _jsonl_log

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(logdir, steps, offset, resume_step=None):
    w = writers.create_default_writer(
        logdir, collection="train", console=False, resume_step=resume_step
    )
    if resume_step is None:
        w.write_hparams({"lr": 0.1})
    for step in steps:
        w.write_scalars(step, {"loss": offset + step})
    w.close()


def _tensorboard_loss(logdir):
    acc = ea.EventAccumulator(str(logdir), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return [(s.step, s.value) for s in acc.Scalars("loss")]


def test_run_100_resume_at_50_run_to_100_gives_each_step_once(tmp_path):
    _run(tmp_path, range(1, 101), 0.0)
    _run(tmp_path, range(51, 101), 1000.0, resume_step=50)
    expected = [(s, float(s)) for s in range(1, 51)] + [(s, 1000.0 + s) for s in range(51, 101)]

    assert _tensorboard_loss(tmp_path) == expected
    # The TensorBoard app's Python reader (--load_fast=false) took a run's first restart for
    # the session's start: it showed steps 51..100 twice.
    app = pea.EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    app.Reload()
    assert [
        (e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in app.Tensors("loss")
    ] == (expected)
    with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    assert lines[0]["step"] is None and lines[0]["hparams"] == {"lr": 0.1}  # kept: no step
    assert [(line["step"], line["loss"]) for line in lines[1:]] == expected
    assert writers.read_jsonl(tmp_path / "metrics.jsonl") == lines


def test_resume_on_a_url_switches_generations_and_readers_never_see_both(tmp_path):
    fs = fsspec.filesystem("memory")
    url = "memory://resume-bucket/run"
    try:
        _run(url, range(1, 101), 0.0)
        _run(url, range(51, 101), 1000.0, resume_step=50)
        expected = [(s, float(s)) for s in range(1, 51)] + [(s, 1000.0 + s) for s in range(51, 101)]
        lines = writers.read_jsonl(f"{url}/metrics.jsonl")
        assert [(line["step"], line["loss"]) for line in lines[1:]] == expected
        parts = fs.ls("/resume-bucket/run/metrics.jsonl.d", detail=False)
        assert {os.path.basename(p)[:6] for p in parts} == {"000001"}  # old generation gone
        for name in fs.ls("/resume-bucket/run", detail=False):
            if "tfevents" in name:
                (tmp_path / os.path.basename(name)).write_bytes(fs.cat_file(name))
        assert _tensorboard_loss(tmp_path) == expected

        # A crash after the new generation was written, before the old one was deleted:
        # readers already use the new one, and the next writer removes the stale parts.
        fs.pipe_file("/resume-bucket/run/metrics.jsonl.d/000000-00000000.jsonl", b'{"step": 7}\n')
        assert writers.read_jsonl(f"{url}/metrics.jsonl") == lines
        writers.JsonlWriter(f"{url}/metrics.jsonl").close()
        assert not fs.exists("/resume-bucket/run/metrics.jsonl.d/000000-00000000.jsonl")
    finally:
        fs.rm("/resume-bucket", recursive=True)


def test_resume_step_and_purge_step_are_checked(tmp_path):
    with pytest.raises(ValueError, match=r"purge_step=3 disagrees with resume_step=5"):
        writers.create_default_writer(tmp_path, resume_step=5, purge_step=3)
    with pytest.raises(ValueError, match="non-negative"):
        writers.JsonlWriter(tmp_path / "m.jsonl", resume_step=-1)
    assert list(tmp_path.iterdir()) == []


def test_resume_drops_an_incomplete_last_line_and_keeps_unreadable_complete_ones(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "a": 1}\n{"a": "no step"}\n{"step": 9, "a": 9}\n{"step": 2, "a"')
    writers.JsonlWriter(path, resume_step=5).close()
    assert path.read_bytes() == b'{"step": 1, "a": 1}\n{"a": "no step"}\n'


@pytest.mark.parametrize(
    "tail",
    [b'{"step": 4, "a"', b"\0" * 4096, b'{"step": 4, "a"' + b"\0" * 100],
    ids=["torn", "nul-fill", "torn-then-nul"],
)
def test_a_resume_names_the_log_and_the_bytes_of_a_partial_last_line_it_drops(
    tmp_path, caplog, tail
):
    """A resume warned "dropping an incomplete last line b''" for a crash's zero fill: no log
    named (a train and an eval log are rewritten side by side) and, for NUL bytes, a line of
    nothing shown. It now says what a writer opening the log without a resume says."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "a": 1}\n' + tail)
    writers.JsonlWriter(path, resume_step=5).close()
    assert path.read_bytes() == b'{"step": 1, "a": 1}\n'
    (dropped,) = [r.getMessage() for r in caplog.records if "dropping" in r.getMessage()]
    assert dropped == (
        f"JsonlWriter({path}): dropping a partial last line ({len(tail)} bytes) left by a "
        "process that ended, or a machine that crashed, while writing it"
    )


def test_resume_keeps_a_whole_last_line_without_its_newline_as_appending_does(tmp_path):
    # Step 3 lacks only its newline: an appending writer keeps it, a resume at 5 dropped it.
    path = tmp_path / "metrics.jsonl"
    for resume_step in (None, 5):
        path.write_bytes(b'{"step": 1, "a": 1}\n{"step": 3, "a": 3}')
        with writers.JsonlWriter(path, resume_step=resume_step, clock=lambda: 0.0) as w:
            w.write_scalars(6, {"a": 6})
        assert path.read_bytes() == (
            b'{"step": 1, "a": 1}\n{"step": 3, "a": 3}\n'
            b'{"step": 6, "time": 0.0, "collection": null, "a": 6}\n'
        )
    path.write_bytes(b'{"step": 1, "a": 1}\n{"step": 3, "a": 3}\0\0\0')  # a crash's zero fill
    writers.JsonlWriter(path, resume_step=5).close()
    assert path.read_bytes() == b'{"step": 1, "a": 1}\n{"step": 3, "a": 3}\n'
    path.write_bytes(b'{"step": 1, "a": 1}\n\0\0\0')
    writers.JsonlWriter(path, resume_step=5).close()
    assert path.read_bytes() == b'{"step": 1, "a": 1}\n'


def test_a_resume_rewrites_a_symlinked_logs_target_and_keeps_the_link(tmp_path):
    # os.replace put a regular file in the link's place: the target kept steps 1-3 and later
    # lines went to the new file.
    (tmp_path / "store").mkdir()
    target = tmp_path / "store" / "real.jsonl"
    target.write_bytes(b'{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 3, "a": 3}\n')
    link = tmp_path / "metrics.jsonl"
    link.symlink_to(target)
    with writers.JsonlWriter(link, resume_step=1, clock=lambda: 0.0) as w:
        w.write_scalars(2, {"a": 20})
    assert link.is_symlink() and sorted(os.listdir(tmp_path / "store")) == ["real.jsonl"]
    assert target.read_bytes() == (
        b'{"step": 1, "a": 1}\n{"step": 2, "time": 0.0, "collection": null, "a": 20}\n'
    )
    (tmp_path / "store" / ".real.jsonl.0123456789ab.tmp").write_bytes(b"a killed rewrite's")
    writers.JsonlWriter(link).close()  # the next writer removes it, beside the target
    assert sorted(os.listdir(tmp_path / "store")) == ["real.jsonl"]


def test_the_copy_a_killed_rewrite_left_is_removed_by_the_next_writer(tmp_path):
    # A resume SIGKILLed while it rewrote the log leaves `.metrics.jsonl.<hex>.tmp` (as big
    # as the log); the next writer to hold the lock removes it, and only it.
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n')
    (tmp_path / ".metrics.jsonl.0123456789ab.tmp").write_bytes(b'{"step": 1, "a": 1}\n')
    (tmp_path / ".other.jsonl.0123456789ab.tmp").write_bytes(b"not this log's")
    (tmp_path / ".metrics.jsonl.old.0123456789ab.tmp").write_bytes(b"metrics.jsonl.old's")
    writer = writers.JsonlWriter(path)
    writer.write_scalars(3, {"a": 3})
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".metrics.jsonl.old.0123456789ab.tmp",
        ".other.jsonl.0123456789ab.tmp",
        "metrics.jsonl",
    ]
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


def test_steps_going_backwards_without_resume_warn_once(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    with writers.JsonlWriter(path) as w:
        for step in range(1, 6):
            w.write_scalars(step, {"a": 1.0})
    caplog.set_level(logging.WARNING)
    with writers.JsonlWriter(path) as w:  # restarted from step 3, no resume_step
        for step in (3, 4, 5, 2):
            w.write_scalars(step, {"a": 2.0})
    warnings = [r.getMessage() for r in caplog.records if "comes after step" in r.getMessage()]
    assert len(warnings) == 1 and "step 3 comes after step 5" in warnings[0]
    assert "resume_step" in warnings[0]
    caplog.clear()
    with writers.JsonlWriter(path, resume_step=5) as w:
        w.write_scalars(6, {"a": 3.0})
    assert not [r for r in caplog.records if "comes after step" in r.getMessage()]


# The child rewrites a large log with resume_step; os.replace is wrapped so that the
# parent can kill it exactly between "new log durable" and "new log in place", and the
# random-time runs kill it anywhere (reading, writing the temporary file, renaming).
_CHILD = """
import os, sys, time
import writers
mode = sys.argv[2]
if mode == "at-replace":
    real_replace = os.replace
    def replace(src, dst):
        print("REPLACING", flush=True)
        time.sleep(60)
        real_replace(src, dst)
    os.replace = replace
print("START", flush=True)
writers.JsonlWriter(sys.argv[1], resume_step=50_000).close()
print("DONE", flush=True)
"""


def _start_child(path, mode):
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def _wait_for(child, word, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        if line.strip() == word:
            return
        if not line and child.poll() is not None:
            break
    child.kill()
    pytest.fail(f"the child never printed {word!r} (exit code {child.poll()})")


def test_killing_the_process_during_the_rewrite_leaves_the_old_or_the_new_log(tmp_path):
    path = tmp_path / "metrics.jsonl"
    line = '{{"step": {}, "time": 1.0, "collection": "train", "loss": 0.25, "acc": 0.5}}\n'
    old = "".join(line.format(step) for step in range(1, 200_001)).encode()  # 15 MB
    new = old[: old.index(b'{"step": 50001,')]
    assert _jsonl_log.line_step(new.splitlines()[-1]) == 50_000

    outcomes = []
    tries = [("at-replace", None)] + [("random", random.uniform(0.0, 1.0)) for _ in range(4)]
    for mode, delay in tries:
        path.write_bytes(old)
        child = _start_child(path, mode)
        _wait_for(child, "REPLACING" if mode == "at-replace" else "START")
        if delay is not None:
            time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
        content = path.read_bytes()
        assert content in (old, new), f"{mode}: a log of {len(content)} bytes is neither"
        outcomes.append("old" if content == old else "new")
        if mode == "at-replace":
            assert content == old  # killed before the rename: the old log, untouched
            # Resuming again (the restarted run) still gives the new log.
            writers.JsonlWriter(path, resume_step=50_000).close()
            assert path.read_bytes() == new
    print("outcomes of the kills:", outcomes)


_LOADED_FIRST = """
import sys
import writers
from writers import _jsonl_log
real = _jsonl_log.kept_lines
def kept_lines(*args):
    print("LOADED" if "writers._tb_summary" in sys.modules else "NOT LOADED", flush=True)
    return real(*args)
_jsonl_log.kept_lines = kept_lines
writers.create_default_writer(sys.argv[1], console=False, resume_step=1).close()
"""


def test_a_resumed_default_set_loads_tensorboard_before_it_cuts_the_log(tmp_path):
    # A restart killed between cutting the log back and making its TensorBoard file (0.3 s
    # of tensorboardX's import in between) left the log at resume_step and TensorBoard
    # showing the old run's later steps: 1 restart in 29 under random kills.
    with writers.create_default_writer(tmp_path, console=False) as w:
        w.write_scalars(1, {"a": 1.0})
        w.write_scalars(2, {"a": 2.0})
    out = subprocess.run(
        [sys.executable, "-c", _LOADED_FIRST, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=True,
    ).stdout
    assert out.split() == ["LOADED"]
    assert [r["step"] for r in writers.read_jsonl(tmp_path / "metrics.jsonl")] == [1]


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["022", "077"])
def test_files_honour_the_umask(tmp_path, umask):
    old_umask = os.umask(umask)
    try:
        write_gin_config(tmp_path, config_str="a.b = 1\n")
        w = writers.create_default_writer(tmp_path / "train", console=False, asynchronous=False)
        w.write_scalars(1, {"a": 1.0})
        w.close()
        writers.JsonlWriter(tmp_path / "train" / "metrics.jsonl", resume_step=0).close()
    finally:
        os.umask(old_umask)
    (events,) = [p for p in (tmp_path / "train").iterdir() if "tfevents" in p.name]
    for path in (tmp_path / "config.gin", tmp_path / "train" / "metrics.jsonl", events):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path.name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.gin", "train"]  # no temp files
