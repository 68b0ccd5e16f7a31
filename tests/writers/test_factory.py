"""create_default_writer: which writers, where files go, values read back."""

from __future__ import annotations

import io
import json
import logging as py_logging
import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator as ea

import writers


def test_default_set_writes_console_tensorboard_and_jsonl(tmp_path):
    out = io.StringIO()
    w = writers.create_default_writer(
        tmp_path, collection="train", console_stream=out, asynchronous=True
    )
    assert list(w.writers) == ["console", "tensorboard", "jsonl"]  # the console first
    assert all(isinstance(x, writers.AsyncWriter) for x in w.writers.values())
    writers.write_values(w, 4, {"loss": 0.5, "accuracy": 0.75})
    w.close()
    assert out.getvalue() == "step 4 | train\n  accuracy  0.75\n  loss      0.5\n"
    (line,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert (line["step"], line["collection"], line["loss"], line["accuracy"]) == (
        4,
        "train",
        0.5,
        0.75,
    )
    acc = ea.EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(s.step, s.value) for s in acc.Scalars("loss")] == [(4, 0.5)]


def test_empty_logdir_is_the_working_directory_as_in_clu(tmp_path, monkeypatch):
    # CLU's epath.Path("") is "."; the JSONL writer took "" so, and TensorBoardWriter("")
    # then raised a bare FileNotFoundError naming '' (with metrics.jsonl already made).
    monkeypatch.chdir(tmp_path)
    w = writers.create_default_writer("", console=False)
    writers.write_values(w, 3, {"loss": 0.5})
    w.close()
    assert [(r["step"], r["loss"]) for r in writers.read_jsonl(tmp_path)] == [(3, 0.5)]
    acc = ea.EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(s.step, s.value) for s in acc.Scalars("loss")] == [(3, 0.5)]
    with writers.TensorBoardWriter("") as tb:
        assert tb.logdir == os.curdir


def test_no_logdir_means_no_files_and_flags_select_writers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = writers.create_default_writer(None, log=True, asynchronous=False)
    assert sorted(w.writers) == ["console", "log"]
    assert isinstance(w.writers["log"], writers.LoggingWriter)
    w.close()
    assert os.listdir(tmp_path) == []
    only_jsonl = writers.create_default_writer(tmp_path / "run", console=False, tensorboard=False)
    assert sorted(only_jsonl.writers) == ["jsonl"]
    only_jsonl.close()
    assert os.listdir(tmp_path / "run") == ["metrics.jsonl"]
    nothing = writers.create_default_writer(console=False)  # logdir=None, as in CLU
    assert nothing.writers == {}
    nothing.write_scalars(0, {"a": 1.0})
    nothing.close()


def test_clus_just_logging_gives_the_log_writer_alone_and_no_files(tmp_path, caplog):
    # CLU's idiom for multi-host jobs (flax's examples): other hosts only log.
    caplog.set_level(py_logging.INFO, logger="absl")
    w = writers.create_default_writer(tmp_path, just_logging=True, collection="train")
    assert sorted(w.writers) == ["log"]
    w.write_scalars(3, {"loss": 0.25})
    w.close()
    assert os.listdir(tmp_path) == []
    lines = [r.getMessage() for r in caplog.records if r.name == "absl"]
    assert "[3] collection=train loss=0.25" in lines


def test_errors_name_the_backend(tmp_path):
    w = writers.create_default_writer(tmp_path, console=False, asynchronous=False)
    w.writers["jsonl"].close()  # simulate a broken backend: writes now raise
    with pytest.raises(writers.WriterError, match=r"1 writer failed: jsonl: WriterClosedError"):
        w.write_scalars(0, {"a": 1.0})
    w.close()
    acc = ea.EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [s.value for s in acc.Scalars("a")] == [1.0]  # tensorboard still got it


def test_purge_step_total_steps_and_flush_secs_are_passed_on(tmp_path):
    earlier = writers.TensorBoardWriter(tmp_path)  # a run before, to step 6
    for step in range(1, 7):
        earlier.write_scalars(step, {"a": 0.0})
    earlier.close()
    out = io.StringIO()
    w = writers.create_default_writer(
        tmp_path, total_steps=10, purge_step=3, console_stream=out, jsonl=False, asynchronous=False
    )
    w.write_scalars(5, {"a": 1.0})
    w.close()
    assert out.getvalue().startswith("step 5/10 (50.0%)")
    loader_events = ea.EventAccumulator(str(tmp_path))
    loader_events.Reload()
    # Steps 3 to 6 of the run before are purged.
    assert [(s.step, s.value) for s in loader_events.Scalars("a")] == [(1, 0.0), (2, 0.0), (5, 1.0)]
    import fsspec

    fs = fsspec.filesystem("memory")
    w = writers.create_default_writer("memory://factory/run", console=False, flush_secs=0.05)
    w.write_scalars(1, {"a": 1.0})
    deadline = time.monotonic() + 5  # uploaded by each writer's timer (not 10 s), no flush()
    while len(uploaded := fs.find("/factory/run")) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    w.close()
    fs.rm("/factory", recursive=True)
    assert [name.split("/")[3].split(".")[0] for name in uploaded] == ["events", "metrics"]


def test_a_writer_that_cannot_be_built_leaves_nothing_open(tmp_path, monkeypatch):
    import importlib
    import threading

    before = {t.name for t in threading.enumerate()}
    with pytest.raises(ValueError, match="flush_secs must be positive"):
        writers.create_default_writer(tmp_path, flush_secs=0)
    for asynchronous in (True, False):  # as documented, whether or not it is used
        with pytest.raises(ValueError, match="max_queue must be >= 1, got 0"):
            writers.create_default_writer(tmp_path, asynchronous=asynchronous, max_queue=0)
    assert list(tmp_path.iterdir()) == []
    # JSONL, built first, cannot open its file (a directory named metrics.jsonl holds the log)
    (tmp_path / "run" / "metrics.jsonl" / "metrics.jsonl").mkdir(parents=True)
    with pytest.raises(IsADirectoryError):
        writers.create_default_writer(tmp_path / "run")
    assert {t.name for t in threading.enumerate()} <= before
    # The log writer, built last, fails: JSONL, the console and TensorBoard were built.
    factory = importlib.import_module("writers.factory")
    monkeypatch.setattr(factory, "LoggingWriter", lambda **_: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        writers.create_default_writer(tmp_path / "other", log=True)
    assert {t.name for t in threading.enumerate()} <= before  # TensorBoard's timer stopped
    writers.JsonlWriter(tmp_path / "other").close()  # the log is not left locked


@pytest.mark.parametrize(
    "make",
    [
        lambda: writers.create_default_writer(5),
        lambda: writers.JsonlWriter(None),
        lambda: writers.TensorBoardWriter(b"/tmp/x"),
    ],
    ids=["create_default_writer", "JsonlWriter", "TensorBoardWriter"],
)
def test_a_logdir_that_is_no_path_is_refused_naming_the_argument(make):
    # A bare "expected str, bytes or os.PathLike object, not int" named neither.
    with pytest.raises(TypeError, match=r"^\w+: (logdir|path) must be a directory, file or URL"):
        make()


def _gin(model_dir):
    from metrics_manager.gin_utils import write_gin_config

    write_gin_config(model_dir, config_str="a.b = 1\n")


def _manager(summary_dir):
    from metrics_manager import MetricsManager

    MetricsManager("train", summary_dir).close()


@pytest.mark.parametrize(
    "make, what",
    [
        (writers.create_default_writer, "logdir"),
        (writers.JsonlWriter, "path"),
        (writers.TensorBoardWriter, "logdir"),
        (writers.read_jsonl, "path"),
        (_gin, "model_dir"),
        (_manager, "summary_dir"),
    ],
    ids=[
        "create_default_writer",
        "JsonlWriter",
        "TensorBoardWriter",
        "read_jsonl",
        "gin",
        "manager",
    ],
)
def test_a_path_object_of_a_url_is_refused_before_it_writes_a_local_directory(
    make, what, tmp_path, monkeypatch
):
    # pathlib makes "gs://b/run" "gs:/b/run": the run's files went to ./gs:/b/run, not the bucket.
    monkeypatch.chdir(tmp_path)
    for url in ("gs://b/run", "s3://b/run", "memory://b/run/m.jsonl"):
        fixed = re.escape(f"pass the URL as a str, {what}={url!r}")
        with pytest.raises(ValueError, match=rf"{what} Posix.*'//' collapsed.*{fixed}"):
            make(pathlib.Path(url))
    assert list(tmp_path.iterdir()) == []
    writers.JsonlWriter(pathlib.Path("run:/x.jsonl")).close()  # no fsspec protocol: a local path
    assert os.path.exists("run:/x.jsonl")


# Everything that takes a directory or URL, and the name of its argument.
_MAKERS = pytest.mark.parametrize(
    "make, what",
    [
        (writers.create_default_writer, "logdir"),
        (writers.JsonlWriter, "path"),
        (writers.TensorBoardWriter, "logdir"),
        (_gin, "model_dir"),
        (_manager, "summary_dir"),
    ],
    ids=["create_default_writer", "JsonlWriter", "TensorBoardWriter", "gin", "manager"],
)


@_MAKERS
def test_a_str_url_with_one_slash_is_refused_before_it_writes_a_local_directory(
    make, what, tmp_path, monkeypatch
):
    # os.path.normpath("gs://b/run") is "gs:/b/run" too: as a str it was taken, and the run's
    # files went to ./gs:/b/run with no word.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as info:
        make("s3:/bucket/run")
    expected = (
        f"{what} 's3:/bucket/run' is the URL 's3://bucket/run' with its '//' collapsed to '/', "
        f"so it names the local path 's3:/bucket/run'; pass the URL with its '//', "
        f"{what}='s3://bucket/run'"
    )
    assert expected in str(info.value)
    assert list(tmp_path.iterdir()) == []
    writers.JsonlWriter("run:/x.jsonl").close()  # no fsspec protocol: a local path
    assert os.path.exists("run:/x.jsonl")


@_MAKERS
@pytest.mark.parametrize("url", ["gs://", "gs:///run", "s3:///run"])
def test_an_object_store_url_naming_no_bucket_is_refused_before_it_writes(
    make, what, url, tmp_path, monkeypatch
):
    # "gs://" joined with a file name is "gs:/metrics.jsonl": JsonlWriter and write_gin_config
    # wrote ./gs:/metrics.jsonl and ./gs:/config.gin with no word; "gs:///run" was read as
    # the bucket "run".
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as info:
        make(url)
    scheme = url.split(":")[0]
    assert f"{what} {url!r} names no bucket: a {scheme}:// URL is {scheme}://<bucket>/<path>; " in (
        str(info.value)
    )
    assert f"{what}='{scheme}://my-bucket/run'" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_a_path_object_of_a_file_url_is_refused_naming_the_absolute_url():
    # pathlib makes "file:///tmp/run" "file:/tmp/run"; the fix offered read
    # logdir='file://tmp/run', which fsspec reads as ./tmp/run, not /tmp/run.
    with pytest.raises(ValueError) as info:
        writers.JsonlWriter(pathlib.Path("file:///tmp/run/m.jsonl"))
    assert str(info.value).endswith("pass the URL as a str, path='file:///tmp/run/m.jsonl'.")
    with pytest.raises(ValueError, match=re.escape("logdir='gs://b/run'.")):
        writers.TensorBoardWriter(pathlib.Path("gs://b/run"))


@pytest.mark.parametrize("flag", ["console", "tensorboard", "jsonl", "log", "asynchronous"])
def test_a_flag_given_as_a_string_is_refused_before_any_file(flag, tmp_path):
    """gin's `console = 'False'` is a non-empty str, so true: it would do the opposite."""
    with pytest.raises(TypeError, match=rf"{flag} must be True or False, got 'False'.*not 'False'"):
        writers.create_default_writer(tmp_path, **{flag: "False"})
    assert list(tmp_path.iterdir()) == []
    writers.create_default_writer(None, console=np.bool_(False), log=np.True_).close()


@pytest.mark.parametrize(
    ("given", "hint"),
    [
        ("True", "in gin write True, not 'True'."),
        ("false", "in gin write False, not 'false'."),
        ("yes", "in gin write True or False, without quotes."),
    ],
)
def test_a_flag_given_as_a_string_is_told_to_drop_the_quotes_of_what_it_wrote(given, hint):
    # log='True' was told "in gin write False, not 'False'": a value it never wrote.
    with pytest.raises(TypeError) as info:
        writers.create_default_writer(None, log=given)
    assert str(info.value) == (
        f"create_default_writer: log must be True or False, got {given!r} "
        f"(a str such as 'False' is true); {hint}"
    )


def test_a_second_process_refused_by_the_lock_leaves_no_event_file(tmp_path):
    # The TensorBoard writer of a refused (resumed) set used to be built first: its file's
    # purge marker hid the running run's steps after 50 in TensorBoard for good.
    running = writers.create_default_writer(tmp_path, console=False)
    with pytest.raises(ValueError, match="a JsonlWriter of this process holds a lock"):
        writers.create_default_writer(tmp_path, console=False, resume_step=50)
    for step in range(1, 101):
        running.write_scalars(step, {"loss": float(step)})
    running.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1
    accumulator = ea.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert [event.step for event in accumulator.Scalars("loss")] == list(range(1, 101))


def test_a_second_collection_on_one_logdir_is_told_that_collection_adds_no_subdirectory(
    tmp_path,
):
    # CLU's create_default_writer(workdir, collection="eval") beside a "train" one writes
    # <workdir>/eval; here the second call was refused with "Give this run another
    # summary_dir or name", neither of which create_default_writer takes.
    train = writers.create_default_writer(tmp_path, collection="train", console=False)
    with pytest.raises(ValueError) as info:
        writers.create_default_writer(tmp_path, collection="eval", console=False)
    apart = os.path.join(tmp_path, "eval")
    assert str(info.value).startswith("create_default_writer: JsonlWriter: a JsonlWriter of")
    assert str(info.value).endswith(
        "Unlike CLU's, collection='eval' adds no subdirectory: pass "
        f"logdir={apart!r} to write this collection apart."
    )
    evaluation = writers.create_default_writer(apart, collection="eval", console=False)
    train.write_scalars(1, {"loss": 0.5})
    evaluation.write_scalars(1, {"loss": 0.25})
    train.close()
    evaluation.close()
    assert [(r["collection"], r["loss"]) for r in writers.read_jsonl(tmp_path)] == [("train", 0.5)]
    assert [(r["collection"], r["loss"]) for r in writers.read_jsonl(apart)] == [("eval", 0.25)]
    # A logdir that ends in its collection (a manager's <summary_dir>/<name>): as it was.
    run = tmp_path / "train"
    first = writers.create_default_writer(run, collection="train", console=False)
    with pytest.raises(ValueError, match="^JsonlWriter: a JsonlWriter of this process holds"):
        writers.create_default_writer(run, collection="train", console=False)
    first.close()


def test_a_forked_child_does_not_keep_the_log_locked_after_the_parent_closes(tmp_path):
    # A pool or data-loader worker forked while the log is open shares its descriptor, and
    # with it the flock: the next run in the parent was refused while the child lived.
    script = f"""
import os, signal, sys, time
import writers
path = {str(tmp_path / "metrics.jsonl")!r}
w = writers.JsonlWriter(path)
w.write_scalars(1, {{"loss": 1.0}})
child = os.fork()
if child == 0:
    try:
        w.write_scalars(2, {{"loss": 9.0}})
        w.flush()
    except RuntimeError as err:
        with open(path + ".child", "w") as f:
            f.write(str(err))
    time.sleep(60)
    os._exit(0)
# The child runs its at-fork hook when the OS first schedules it: wait for it to have run,
# as any real child has long before the parent closes the log.
while not os.path.exists(path + ".child"):
    time.sleep(0.01)
w.close()
try:
    again = writers.JsonlWriter(path)
    again.write_scalars(2, {{"loss": 2.0}})
    again.close()
    print("reopened")
finally:
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
"""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout == "reopened\n", proc.stderr
    assert [line["step"] for line in writers.read_jsonl(str(tmp_path))] == [1, 2]
    assert (
        (tmp_path / "metrics.jsonl.child")
        .read_text()
        .startswith(f"JsonlWriter({tmp_path / 'metrics.jsonl'}): this process is a fork")
    )


@pytest.mark.parametrize(
    "setting, error, message",
    [
        ({"flush_secs": "30"}, TypeError, "flush_secs must be a number of seconds such as 10.0, "
         "got '30' (str); in gin write a number, without quotes."),
        ({"flush_secs": -1}, ValueError, "flush_secs must be positive and finite, got -1"),
        ({"max_buffer_mb": "64"}, TypeError, "max_buffer_mb must be a number of MiB such as "
         "256.0, got '64' (str); in gin write a number, without quotes."),
        ({"total_steps": "100"}, TypeError, "total_steps must be a positive int or None, got "
         "'100' (str); in gin write it without quotes."),
        ({"purge_step": "5"}, TypeError, "(purge_step=...): step must be a non-negative "
         "integer, got '5' of type str"),
    ],
)  # fmt: skip
def test_a_setting_no_writer_of_the_set_reads_is_checked_too(tmp_path, setting, error, message):
    """console.gin with `flush_secs = '30'` ran: no writer of the console set reads it, and
    the config failed only once TensorBoard or JSONL was switched on (as max_queue is)."""
    flags = {"console": True, "tensorboard": False, "jsonl": False}
    if "total_steps" in setting:  # read by the console writer alone
        flags = {"console": False, "tensorboard": True, "jsonl": True}
    with pytest.raises(error) as raised:
        writers.create_default_writer(tmp_path, **flags, **setting)
    assert str(raised.value).startswith("create_default_writer")
    assert message in str(raised.value)
    assert list(tmp_path.iterdir()) == []
