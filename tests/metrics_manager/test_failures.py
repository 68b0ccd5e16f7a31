"""Never lose a value: writer isolation, hung writers, signals, bad input refused at the call.

Faults are real: writers that raise or never return, subprocesses killed with SIGTERM and
SIGKILL, two `jax.distributed` processes. What reached disk is read back with TensorBoard's
own reader and `json.loads`, and counted.
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import fractions
import functools
import gc
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from typing import Any

import clu.values
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from clu import metrics as clu_metrics
from tensorboard.backend.event_processing import event_accumulator

import writers
from metrics_manager import (
    AveragePerStep,
    Max,
    MeanStd,
    MetricsManager,
    MetricsManagerError,
    Sum,
    Welford,
    compute_base_metrics,
    compute_weighted_cross_entropy,
    merge_metrics,
    merge_windows,
)
from tests.metrics_manager.fault_loop import files_and
from tests.metrics_manager.test_manager import PerClass
from tests.metrics_manager.test_manager_files import read_jsonl, read_tensorboard
from tests.signals import signal_after
from tests.writers.failing import GatedWriter
from tests.writers.tracker_stores import wandb_history, wandb_records, wandb_run_files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class RaisingWriter(writers.NoopWriter):
    def write_scalars(self, step, scalars):
        raise OSError(f"disk error at step {step}")


def isolated_factory(logdir, collection=None):
    """The default writer set (TensorBoard + JSONL) plus a writer that raises on every call."""
    return files_and(last={"broken": RaisingWriter()})(logdir, collection)


def tb_steps(logdir: str, tag: str = "loss") -> list[int]:
    acc = read_tensorboard(logdir)
    return (
        [e.step for e in acc.Tensors(tag)]
        if tag in acc.Tags()["tensors"]
        else [e.step for e in acc.Scalars(tag)]
    )


def test_a_raising_writer_costs_the_others_nothing_under_warn(tmp_path):
    with MetricsManager(
        "train", tmp_path, writer_factory=isolated_factory, max_writer_failures=10**6
    ) as manager:
        for step in range(1, 1001):
            manager.write_metrics_summary({"loss": Sum(np.float32(step))}, step, 1)
    logdir = str(tmp_path / "train")
    lines = read_jsonl(logdir)
    assert [line["step"] for line in lines] == list(range(1, 1001))
    assert [line["loss"] for line in lines] == [float(s) for s in range(1, 1001)]
    assert tb_steps(logdir) == list(range(1, 1001))
    assert manager.health()["writers"]["broken"]["failures"] == 1000
    assert manager.health()["writers"]["jsonl"]["failures"] == 0


@pytest.mark.parametrize(
    "error",
    [
        SystemExit,  # sys.exit(1), as rich's console did on a broken pipe
        asyncio.CancelledError,  # a writer on an asyncio loop (gcsfs) whose task was cancelled
        KeyboardInterrupt,  # raised by a writer, not by Ctrl-C: that goes to the main thread
        GeneratorExit,
    ],
)
def test_a_writer_that_raises_a_base_exception_fails_alone(tmp_path, error):
    # CancelledError, KeyboardInterrupt and GeneratorExit ended the job before: the writers
    # after this one lost 6 of 20 summaries, with nothing logged or in manager.errors.
    class Exiting(writers.NoopWriter):
        def write_scalars(self, step, scalars):
            raise error(1)

    factory = files_and(first={"exiting": Exiting()})  # called before JSONL and TensorBoard

    with MetricsManager(
        "train", tmp_path, writer_factory=factory, max_writer_failures=10**6
    ) as manager:
        futures = [
            manager.write_metrics_summary({"loss": Sum(np.float32(step))}, step, 1)
            for step in range(1, 21)
        ]
    assert [float(f.result()["loss"].value) for f in futures] == [float(s) for s in range(1, 21)]
    logdir = str(tmp_path / "train")
    assert [line["step"] for line in read_jsonl(logdir)] == list(range(1, 21))
    assert tb_steps(logdir) == list(range(1, 21))
    assert manager.health()["writers"]["exiting"]["failures"] == 20
    assert "writer:exiting at step 1" in str(manager.errors[0])
    assert type(manager.errors[0].error) is error


@flax.struct.dataclass
class _TextMetric(Sum):
    def compute_value(self):
        return clu.values.Text(f"total {float(self.total)}")


def test_a_kind_a_writer_does_not_implement_costs_it_nothing_else(tmp_path, caplog):
    # CLU's writers raise NotImplementedError for kinds they cannot store (PyTorch's texts).
    # Such a call skipped the writer's later calls of the summary (its scalars), and after
    # 10 summaries quarantined it: the scalars of steps 11-15 were lost too.
    class ScalarsOnly(writers.NoopWriter):
        def __init__(self):
            self.scalars, self.texts_tried = [], 0

        def write_scalars(self, step, scalars):
            self.scalars.append((step, dict(scalars)))

        def write_texts(self, step, texts):
            self.texts_tried += 1
            raise NotImplementedError("ScalarsOnly does not support writing texts.")

    only = ScalarsOnly()
    factory = files_and(first={"only": only})
    with MetricsManager("train", tmp_path, writer_factory=factory, uptime=False) as manager:
        for step in range(1, 16):
            metrics = {"note": _TextMetric(jnp.float32(step)), "loss": Sum(np.float32(step))}
            manager.write_metrics_summary(metrics, step, 1)
    assert only.scalars == [(s, {"loss": float(s)}) for s in range(1, 16)]
    assert only.texts_tried == 1  # not called again
    health = manager.health()["writers"]["only"]
    assert (health["failures"], health["quarantined"], health["unsupported"]) == (
        1,
        None,
        ["write_texts"],
    )
    assert [str(e) for e in manager.errors] == [
        "writer:only at step 1 (keys note): NotImplementedError: ScalarsOnly does not support "
        "writing texts."
    ]
    assert (
        "MetricsManager 'train': writer 'only' does not implement write_texts: its other calls "
        "go on, and that method is not called again"
    ) in [r.getMessage() for r in caplog.records]
    by_step: dict[int, dict] = {}  # the other writers: both kinds, every step
    for line in read_jsonl(str(tmp_path / "train")):
        by_step.setdefault(line.pop("step"), {}).update(line)
    assert {s: (x["loss"], x["note"]) for s, x in by_step.items()} == {
        s: (float(s), f"total {float(s)}") for s in range(1, 16)
    }


def test_a_writer_without_an_optional_method_is_not_quarantined_for_it():
    # Only write_scalars, write_texts, write_hparams, flush and close are required: a writer
    # without write_images raised AttributeError at each image write, was quarantined after
    # 3 of them, and lost the scalars of step 6.
    class Minimal:
        def __init__(self):
            self.scalars = []

        def write_scalars(self, step, scalars):
            self.scalars.append((step, dict(scalars)))

        def write_texts(self, step, texts): ...
        def write_hparams(self, hparams): ...
        def flush(self): ...
        def close(self): ...

    writer = Minimal()
    with MetricsManager(
        "t", writer_factory=lambda d: {"mini": writer}, max_writer_failures=3, uptime=False
    ) as manager:
        for step in range(1, 6):
            manager.write_images(step, {"img": np.zeros((4, 4, 3), np.float32)})
        manager.write_scalars(6, {"loss": 0.5})
    assert writer.scalars == [(6, {"loss": 0.5})]
    health = manager.health()["writers"]["mini"]
    assert (health["failures"], health["quarantined"], health["unsupported"]) == (
        1,
        None,
        ["write_images"],
    )
    assert [str(e) for e in manager.errors] == [
        "writer:mini at step 1 (keys img): NotImplementedError: Minimal has no write_images method"
    ]


def test_kept_failures_hold_none_of_their_calls_values():
    # Each failure in `errors` kept its traceback's frames and their locals: the call's images
    # (200 failed writes of 3 MB images held 600 MB; `errors` keeps 1,000).
    given = []

    class NoImages(writers.NoopWriter):  # its scalars go through: never quarantined
        def write_images(self, step, images):
            given.append(weakref.ref(images["img"]))
            raise ConnectionError("artifact store down")

    with MetricsManager("t", writer_factory=lambda d: {"w": NoImages()}) as manager:
        for step in range(1, 21):
            manager.write_images(step, {"img": np.zeros((4, 8, 8, 3), np.float32)})
            manager.write_scalars(step, {"loss": 1.0})
        manager.flush()
        gc.collect()
        assert [ref() is None for ref in given] == [True] * 20
        assert len(manager.errors) == 20
        printed = "".join(traceback.format_exception(manager.errors[-1].error))
        assert 'raise ConnectionError("artifact store down")' in printed  # still printable


def test_errors_keeps_the_last_1000_failures_and_health_counts_every_one():
    with MetricsManager(
        "t", writer_factory=lambda d: {"broken": RaisingWriter()}, max_writer_failures=10**6
    ) as manager:
        for step in range(1, 1003):
            manager.write_scalars(step, {"loss": 1.0})
        manager.flush()
        assert len(manager.errors) == 1000
        assert "disk error at step 3" in str(manager.errors[0])  # steps 1 and 2 dropped
        assert manager.health()["failures"] == 1002


def test_a_writer_failing_on_one_kind_keeps_writing_the_others_and_is_not_quarantined(tmp_path):
    class NoTexts(RaisingWriter):  # a bug in its texts: each call raises
        def __init__(self):
            self.steps = []

        def write_scalars(self, step, scalars):
            self.steps.append(step)

        def write_texts(self, step, texts):
            raise OSError("cannot write texts")

    writer = NoTexts()
    with MetricsManager(
        "t", writer_factory=lambda d: writer, max_writer_failures=3, uptime=False
    ) as manager:
        for step in range(1, 11):
            metrics = {"note": _TextMetric(jnp.float32(step)), "loss": Sum(np.float32(step))}
            manager.write_metrics_summary(metrics, step, 1)
    assert writer.steps == list(range(1, 11))
    health = manager.health()["writers"]["NoTexts"]
    assert (health["failures"], health["quarantined"], health["skipped"]) == (10, None, 0)


def test_a_write_of_an_unsupported_kind_neither_ends_a_quarantine_nor_delays_one():
    class Broken(writers.NoopWriter):  # a full disk, and no texts at all
        def write_scalars(self, step, scalars):
            raise OSError("No space left on device")

        def write_texts(self, step, texts):
            raise NotImplementedError("texts")

    with MetricsManager(
        "t", writer_factory=lambda d: {"broken": Broken()}, max_writer_failures=3, uptime=False
    ) as manager:
        for step in range(20):
            manager.write_scalars(step, {"loss": 1.0})
            manager.write_texts(step, {"note": "x"})  # skipped: reset the count, once
        manager.flush()
        health = manager.health()["writers"]["broken"]
        assert (health["quarantined"], health["failures"]) == ("3 failures in a row", 4)
    with MetricsManager(
        "t2",
        writer_factory=lambda d: {"broken": Broken()},
        max_writer_failures=2,
        quarantine_s=0.05,
        uptime=False,
    ) as manager:
        manager.write_texts(0, {"note": "x"})  # unsupported from now on
        manager.write_scalars(1, {"loss": 1.0})
        manager.write_scalars(2, {"loss": 1.0})
        manager.flush()
        time.sleep(0.1)  # the retry is due
        manager.write_texts(3, {"note": "x"})  # nothing written: not back
        manager.flush()
        assert manager.health()["writers"]["broken"]["quarantined"] == "2 failures in a row"


def test_a_writer_that_changes_what_it_is_given_changes_nothing_the_others_get(tmp_path):
    # One dict (and the caller's own arrays) went to every writer: a writer dividing the
    # scalars by 100 and popping `lr` before JSONL left JSONL with loss 0.4 and no lr.
    class Meddling(writers.NoopWriter):
        def write_scalars(self, step, scalars):
            for key in scalars:
                scalars[key] /= 100
            scalars.pop("lr", None)

        def write_images(self, step, images):
            images.pop("extra")
            images["img"] *= 0  # the manager's read-only copy: this call fails alone

        def write_histograms(self, step, arrays, num_buckets=None):
            num_buckets.clear()

    image = np.full((2, 2, 1), 200, np.uint8)
    factory = files_and(first={"meddling": Meddling()})
    with MetricsManager("train", tmp_path, writer_factory=factory, uptime=False) as manager:
        manager.write_scalars(1, {"loss": 40.0, "lr": 0.5})
        manager.write_metrics_summary({"loss": Sum(np.float32(40.0))}, 2, 1)
        manager.write_images(3, {"img": image, "extra": image})
        image[:] = 7  # a loop refilling its buffer once the call returned
        manager.write_histograms(3, {"h": np.arange(4.0)}, num_buckets={"h": 2})
    assert [(x["step"], x.get("loss"), x.get("lr")) for x in read_jsonl(str(tmp_path / "train"))][
        :2
    ] == [(1, 40.0, 0.5), (2, 40.0, None)]
    acc = read_tensorboard(str(tmp_path / "train"))
    for key in ("img", "extra"):  # as at the call, from the manager's own copy
        (event,) = acc.Tensors(key)
        png = writers._encode.png(np.full((2, 2, 1), 200, np.uint8))
        assert event.tensor_proto.string_val[2] == png
    (histogram,) = acc.Histograms("h")
    assert histogram.histogram_value.bucket == [0.0, 2.0, 2.0]  # 2 buckets: num_buckets kept
    (failure,) = manager.errors
    assert "writer:meddling at step 3 (keys img, extra)" in str(failure)
    assert "read-only" in str(failure)


def test_metrics_with_numpy_fields_are_written_as_at_the_call(tmp_path):
    # An eval summed on the host into NumPy accumulators, reset in place once the call
    # returned: the worker read them late, and wrote 0 (or 0/0) instead of every value.
    gated = GatedWriter()
    total, count = np.array(30.0, np.float32), np.array(10, np.int32)
    factory = files_and(first={"gated": gated})
    with MetricsManager("eval", tmp_path, writer_factory=factory, uptime=False) as manager:
        manager.write_scalars(0, {"warm": 1.0})  # holds the worker in the gated call
        assert gated.entered.wait(10)
        futures = []
        for step in (1, 2):
            metrics = {"loss": clu_metrics.Average(total=total, count=count), "sum": Sum(total)}
            futures.append(manager.write_metrics_summary(metrics, step, 1))
            total[...], count[...] = 0.0, 1  # the next window starts
            total += 40.0 * step
            count += 1
        gated.gate.set()
        values = [{k: float(v.value) for k, v in f.result(10).items()} for f in futures]
    assert values == [{"loss": 3.0, "sum": 30.0}, {"loss": 20.0, "sum": 40.0}]
    lines = read_jsonl(str(tmp_path / "eval"))[1:]
    assert [(x["step"], x["loss"], x["sum"]) for x in lines] == [(1, 3.0, 30.0), (2, 20.0, 40.0)]


def test_hyperparameters_are_written_as_at_the_call(tmp_path):
    # The worker read them late: a list the program appended to after the call, or an array
    # it changed, was written changed.
    gated = GatedWriter()
    layers, scale = [64, 64], np.array([1.0, 2.0])
    factory = files_and(first={"gated": gated})
    with MetricsManager("train", tmp_path, writer_factory=factory, uptime=False) as manager:
        manager.write_scalars(0, {"warm": 1.0})  # holds the worker in the gated call
        assert gated.entered.wait(10)
        manager.write_hparams({"layers": layers, "opt": {"scale": scale}, "lock": threading.Lock()})
        ready = {"loss": Sum(np.float32(1.0)), "heads": clu.values.HyperParam(layers)}
        manager.write_metrics_summary(ready, 1, 1)
        layers.append(128)
        scale[0] = 99.0
        gated.gate.set()
    line, summary = [x for x in read_jsonl(str(tmp_path / "train")) if "hparams" in x]
    assert summary["hparams"] == {"heads": "[64, 64]"}
    assert line["hparams"]["layers"] == "[64, 64]"
    assert line["hparams"]["opt.scale"] == "[1. 2.]"
    assert line["hparams"]["lock"].startswith("<unlocked _thread.lock object")  # no copy


def test_a_cancelled_summary_is_skipped_and_the_manager_goes_on(tmp_path):
    # concurrent.futures' contract (T5X's futures come from a ThreadPoolExecutor): a future
    # cancelled before its summary starts skips it. Before, setting its result killed the
    # worker thread, and the next flush() or close() waited forever.
    gated = GatedWriter()
    factory = files_and(last={"gated": gated})
    with MetricsManager("train", tmp_path, writer_factory=factory) as manager:
        futures = [
            manager.write_metrics_summary({"loss": Sum(np.float32(step))}, step, 1)
            for step in range(1, 6)
        ]
        assert gated.entered.wait(10)  # summary 1 is being written: it cannot be cancelled
        assert [f.cancel() for f in futures[:4]] == [False, True, True, True]
        gated.gate.set()
        manager.flush(timeout=10)
        later = manager.write_metrics_summary({"loss": Sum(np.float32(6.0))}, 6, 1)
    assert float(later.result(0)["loss"].value) == 6.0
    logdir = str(tmp_path / "train")
    assert [line["step"] for line in read_jsonl(logdir)] == [1, 5, 6]
    assert tb_steps(logdir) == [1, 5, 6]
    assert manager.errors == []


def test_a_raising_writer_stops_the_loop_with_a_clear_error_under_raise(tmp_path):
    manager = MetricsManager("train", tmp_path, writer_factory=isolated_factory, on_error="raise")
    for step in range(1, 1001):
        try:
            manager.write_metrics_summary({"loss": Sum(np.float32(step))}, step, 1)
        except MetricsManagerError as err:  # a loop that saves a checkpoint, then stops
            assert re.search(r"writer:broken at step \d+.*disk error", str(err)), err
            break
    try:
        manager.close()
    except MetricsManagerError as err:  # a later failure of "broken", if one came unraised
        assert "writer:broken at step" in str(err), err
    written = [line["step"] for line in read_jsonl(str(tmp_path / "train"))]
    # The others kept theirs, the raising call's summary included (it was dropped before).
    assert step < 1000 and written == list(range(1, step + 1))
    assert tb_steps(str(tmp_path / "train")) == written


def test_a_failure_recorded_before_the_last_one_was_raised_is_named_under_raise(tmp_path):
    """Steps 1 and 2 both fail before the loop's next call: the error names both, not the first
    alone (step 2's was dropped, and close() returned as if nothing else had failed)."""
    gated = GatedWriter()  # holds step 1 until step 2 is queued: neither fails before
    factory = files_and(first={"gated": gated}, last={"broken": RaisingWriter()})
    manager = MetricsManager("train", tmp_path, writer_factory=factory, on_error="raise")
    futures = [manager.write_metrics_summary({"loss": Sum(np.float32(s))}, s, 1) for s in (1, 2)]
    gated.gate.set()
    for future in futures:  # both writes failed ("raise" fails the summary's future)
        with pytest.raises(
            MetricsManagerError, match=r"writer:broken at step \d \(keys loss\): OSError"
        ):
            future.result()
    with pytest.raises(MetricsManagerError) as raised:
        manager.flush()
    message = str(raised.value)
    assert "writer:broken at step 1 (keys loss): OSError: disk error at step 1" in message
    assert "and 1 more since, in `errors`: writer:broken at step 2 (keys loss)" in message
    manager.close()  # both were raised: nothing is left to raise
    assert [(e.source, e.step) for e in manager.errors] == [
        ("writer:broken", 1),
        ("writer:broken", 2),
    ]
    assert [line["step"] for line in read_jsonl(str(tmp_path / "train"))] == [1, 2]


def test_the_error_policies_are_fixed_at_construction(tmp_path):
    """Setting one later would change nothing (the worker holds it): it is refused instead."""
    with MetricsManager("train", tmp_path, writer_factory=isolated_factory) as manager:
        for attr in ("on_error", "nonfinite"):
            with pytest.raises(AttributeError):
                setattr(manager, attr, "raise")
        assert (manager.on_error, manager.nonfinite) == ("warn", "warn")
        manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, 1, 1).result()
    assert [e.source for e in manager.errors] == ["writer:broken"]  # warned, not raised


def test_a_full_disk_under_one_writer_costs_the_others_nothing(tmp_path):
    # A real ENOSPC from the kernel: /dev/full refuses every write with "No space left".
    def factory(logdir):
        return writers.MultiWriter(
            {
                "full": writers.JsonlWriter("/dev/full"),
                "tensorboard": writers.TensorBoardWriter(logdir),
                "jsonl": writers.JsonlWriter(os.path.join(logdir, "metrics.jsonl")),
            }
        )

    with MetricsManager("train", tmp_path, writer_factory=factory) as manager:
        for step in range(1, 101):
            manager.write_metrics_summary({"loss": Sum(np.float32(step))}, step, 1)
    logdir = str(tmp_path / "train")
    assert [line["loss"] for line in read_jsonl(logdir)] == [float(s) for s in range(1, 101)]
    assert tb_steps(logdir) == list(range(1, 101))
    health = manager.health()["writers"]
    assert health["full"]["quarantined"] == "10 failures in a row"
    assert health["tensorboard"]["failures"] == health["jsonl"]["failures"] == 0
    failures = manager.errors
    assert [f.step for f in failures[:10]] == list(range(1, 11))  # then quarantined
    assert all(f.source == "writer:full" for f in failures)
    assert all(getattr(f.error, "errno", None) == errno.ENOSPC for f in failures)


@pytest.mark.parametrize("on_error", ["warn", "raise"])
def test_a_summarys_future_resolves_past_a_hung_writers_deadline_with_no_other_call(
    tmp_path, on_error
):
    # Overruns were noticed only at the next manager call: a loop reading the summary back
    # (a T5X-style eval, then a collective) waited forever, and so did every other process.
    # Under "raise" the future fails, as for a writer that raises (it succeeded, naming no step).
    hung = GatedWriter()
    factory = files_and(first={"hung": hung})
    with MetricsManager(
        "train",
        tmp_path,
        writer_factory=factory,
        writer_deadline_s=1.0,
        uptime=False,
        on_error=on_error,
    ) as manager:
        started = time.monotonic()
        future = manager.write_metrics_summary({"loss": Sum(np.float32(3.0))}, 1, 1)
        if on_error == "warn":
            assert float(future.result(timeout=30)["loss"].value) == 3.0
        else:
            with pytest.raises(
                MetricsManagerError,
                match=r"summary at step 1: writer:hung at step 1: TimeoutError: writer 'hung' "
                r"ran past writer_deadline_s=1.0: quarantined",
            ):
                future.result(timeout=30)
        waited = time.monotonic() - started
        assert 1.0 <= waited < 5.0, waited
        assert "at step 1: TimeoutError: writer 'hung' ran past writer_deadline_s=1.0" in str(
            manager.errors[0]
        )
        if on_error == "raise":
            with pytest.raises(MetricsManagerError):  # once more at the next call, queued first
                manager.write_metrics_summary({"loss": Sum(np.float32(4.0))}, 2, 1)
        else:
            manager.write_metrics_summary({"loss": Sum(np.float32(4.0))}, 2, 1).result(5)
        hung.gate.set()
    assert [(x["step"], x["loss"]) for x in read_jsonl(str(tmp_path / "train"))] == [
        (1, 3.0),
        (2, 4.0),
    ]


def test_a_writer_quarantined_after_failures_in_a_row_is_not_called_again(tmp_path):
    calls = []

    class Counting(RaisingWriter):
        def write_scalars(self, step, scalars):
            calls.append(step)
            super().write_scalars(step, scalars)

    with MetricsManager("t", writer_factory=lambda d: Counting(), max_writer_failures=3) as m:
        for step in range(1, 11):
            m.write_scalar("x", 1.0, step)
    assert calls == [1, 2, 3]
    assert m.health()["writers"]["Counting"]["quarantined"] == "3 failures in a row"


_FULL_AT_START = """
import resource, signal, sys
from metrics_manager import MetricsManager
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: EFBIG, not death
resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
MetricsManager("train", sys.argv[1])
"""


def test_a_disk_full_when_the_manager_is_made_names_the_manager_and_the_directory(tmp_path):
    # The bare "[Errno 27] File too large" named neither.
    run = subprocess.run(
        [sys.executable, "-c", _FULL_AT_START, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    assert run.returncode == 1
    assert f"OSError: [Errno {errno.EFBIG}] File too large" in run.stderr
    assert (
        f"MetricsManager('train'): the writer factory failed making its writers in "
        f"{tmp_path / 'train'}; free space there, or give another summary_dir"
    ) in run.stderr


@pytest.mark.parametrize("in_the_way", ["run directory", "collection directory"])
def test_a_file_where_the_run_directory_should_be_is_not_called_a_full_disk(tmp_path, in_the_way):
    # Any OSError of the writer factory got the full disk's note: "free space there" for a
    # file standing where summary_dir/train should be made.
    summary_dir = tmp_path / "run"
    summary_dir.mkdir()
    blocker = summary_dir if in_the_way == "run directory" else summary_dir / "train"
    if blocker.is_dir():
        blocker.rmdir()
    blocker.write_text("not a directory\n")
    with pytest.raises(OSError) as raised:
        MetricsManager("train", summary_dir)
    assert raised.value.errno in (errno.ENOTDIR, errno.EEXIST)
    assert raised.value.__notes__ == [
        f"MetricsManager('train'): the writer factory failed making its writers in "
        f"{summary_dir / 'train'}; a file stands where a directory of that path should be: "
        "move it, or give another summary_dir"
    ]
    assert blocker.read_text() == "not a directory\n"


def test_files_another_program_cuts_get_later_writes_at_their_new_end(tmp_path):
    # The event file was written at its old offset: a run of zero bytes at its start, after
    # which TensorBoard's reader saw nothing of the rest of the run.
    logdir = tmp_path / "train"
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        for step in range(1, 21):
            if step == 11:
                manager.flush()
                for path in logdir.iterdir():
                    os.truncate(path, 0)  # a log cleaner, `> file`
            manager.write_scalars(step, {"loss": float(step)})
    assert [line["step"] for line in read_jsonl(str(logdir))] == list(range(11, 21))
    assert tb_steps(str(logdir)) == list(range(11, 21))
    assert manager.errors == []


@pytest.mark.parametrize("deleted", ["run directory", "log file"])
def test_files_deleted_while_open_are_written_again_at_the_next_flush(tmp_path, caplog, deleted):
    # Every later write went to the unlinked files: nothing reached a reader, with no error.
    logdir = tmp_path / "train"
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        for step in range(1, 21):
            if step == 11:
                manager.flush()
                if deleted == "run directory":
                    shutil.rmtree(tmp_path)
                else:
                    os.unlink(logdir / "metrics.jsonl")
            manager.write_scalars(step, {"loss": float(step)})
        manager.flush()
        manager.write_scalars(21, {"loss": 21.0})  # after the files are back
    assert [line["step"] for line in read_jsonl(str(logdir))] == list(range(1, 22))
    assert tb_steps(str(logdir)) == list(range(1, 22))
    assert manager.errors == []
    restored = sorted(r.getMessage().split(":")[0] for r in caplog.records if "deleted" in r.msg)
    assert restored == (
        ["EventFile", "JsonlWriter"] if deleted == "run directory" else ["JsonlWriter"]
    )


def test_a_deleted_log_is_not_written_over_the_log_a_new_run_made_at_its_path(tmp_path, caplog):
    # The run directory removed while the run lived, and a new run started there: each flush
    # of each replaced the other's log, and the new run's lines were lost.
    logdir = str(tmp_path / "train")
    old = writers.JsonlWriter(logdir)
    old.write_scalars(1, {"loss": 1.0})
    old.flush()
    shutil.rmtree(logdir)
    new = writers.JsonlWriter(logdir)
    for step in range(1, 5):
        new.write_scalars(step, {"loss": 10.0 + step})
        new.flush()
        old.write_scalars(step + 1, {"loss": step + 1.0})
        old.flush()
    old.close()
    new.close()
    assert [(line["step"], line["loss"]) for line in read_jsonl(logdir)] == [
        (step, 10.0 + step) for step in range(1, 5)
    ]
    warned = [r.getMessage() for r in caplog.records if "deleted" in r.getMessage()]
    assert warned == [
        f"JsonlWriter: {logdir}/metrics.jsonl was deleted while open, and a new file is there "
        "now, left as it is; later writes go to the deleted file, which no reader sees"
    ]


def test_a_deleted_log_that_cannot_be_written_back_is_warned_about_once(tmp_path, caplog):
    # A file where the run directory was (or no /proc to read the deleted bytes from): every
    # flush raised, and the writer was quarantined.
    logdir = tmp_path / "train"
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        manager.write_scalars(1, {"loss": 1.0})
        manager.flush()
        shutil.rmtree(logdir)
        logdir.write_text("not a directory")
        for step in range(2, 12):
            manager.write_scalars(step, {"loss": float(step)})
            manager.flush()
    assert manager.errors == []
    assert logdir.read_text() == "not a directory"
    warned = sorted(r.getMessage() for r in caplog.records if "deleted" in r.getMessage())
    assert [m.split(":")[0] for m in warned] == ["EventFile", "JsonlWriter"]
    assert all("cannot be written there again" in m for m in warned), warned


def test_a_log_deleted_after_another_writer_kept_its_deleted_file_is_still_written_back(
    tmp_path, caplog
):
    # Files kept deleted were remembered by inode for the whole process: a later writer's
    # file, given the inode again once the first was closed, was never written back.
    first = writers.JsonlWriter(str(tmp_path / "a"))
    first.write_scalars(1, {"x": 1.0})
    shutil.rmtree(tmp_path / "a")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.jsonl").write_text("")  # something new at its path
    first.close()
    for run in range(5):  # each run's log likely takes the inode just freed
        logdir = str(tmp_path / f"b{run}")
        writer = writers.JsonlWriter(logdir)
        for step in range(1, 4):
            writer.write_scalars(step, {"y": float(step)})
        shutil.rmtree(logdir)
        writer.close()
        assert [line["step"] for line in read_jsonl(logdir)] == [1, 2, 3]
    kept = [r for r in caplog.records if "a new file is there now" in r.getMessage()]
    assert len(kept) == 1


_KILLED_RESTORING = """
import os, shutil, sys, time
import writers

logdir = sys.argv[1]
writer = writers.TensorBoardWriter(logdir, flush_secs=3600)
for step in range(1, 101):
    writer.write_scalars(step, {"loss": float(step)})
writer.flush()
shutil.rmtree(logdir)
fsync, calls = os.fsync, []

def slow_fsync(fd):  # the copy's fsync: wide enough a window to be killed in
    calls.append(fd)
    if len(calls) == 2:
        print("restoring", flush=True)
        time.sleep(60)
    fsync(fd)

os.fsync = slow_fsync
writer.flush()
"""


def test_a_process_killed_while_writing_a_deleted_event_file_back_leaves_no_copy(tmp_path):
    # The copy had a name with "tfevents" in it until linked: killed meanwhile (preemption's
    # SIGKILL), it stayed, and TensorBoard read it as a second event file of the run.
    logdir = tmp_path / "train"
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_RESTORING, str(logdir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    with child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == "restoring\n"
        finally:
            child.kill()
    assert sorted(os.listdir(logdir)) == []
    writer = writers.TensorBoardWriter(str(logdir))
    writer.write_scalars(200, {"loss": 2.0})
    writer.close()
    assert tb_steps(str(logdir)) == [200]


def test_closing_a_restored_log_releases_it_for_the_next_writer(tmp_path):
    # close() closed the file it began with; the one a restoring flush opened stayed open and
    # locked, so a resumed writer on the same path in this process was refused.
    logdir = str(tmp_path / "train")
    writer = writers.JsonlWriter(logdir)
    for step in range(1, 4):
        writer.write_scalars(step, {"loss": float(step)})
    writer.flush()
    os.unlink(tmp_path / "train" / "metrics.jsonl")
    writer.close()
    resumed = writers.JsonlWriter(logdir, resume_step=2)
    resumed.write_scalars(3, {"loss": 30.0})
    resumed.close()
    assert [(line["step"], line["loss"]) for line in read_jsonl(logdir)] == [
        (1, 1.0),
        (2, 2.0),
        (3, 30.0),
    ]


def test_a_loop_flushing_after_each_summary_quarantines_after_max_writer_failures_summaries():
    # A full disk fails the write and the flush: each summary counted twice, so the writer
    # was quarantined after 5 summaries, not the documented 10.
    class Full(writers.NoopWriter):
        def write_scalars(self, step, scalars):
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    kept = []

    class Kept(writers.NoopWriter):
        def write_scalars(self, step, scalars):
            kept.append(step)

    def factory(logdir):
        return writers.MultiWriter({"full": Full(), "kept": Kept()})

    with MetricsManager("train", None, writer_factory=factory) as manager:
        for step in range(1, 13):
            manager.write_scalars(step, {"loss": 1.0})
            manager.flush()
        health = manager.health()["writers"]["full"]
        steps_failed = [e.step for e in manager.errors if e.step is not None]
    assert steps_failed == list(range(1, 11))  # 10 summaries tried, then quarantined
    assert (health["quarantined"], health["skipped"]) == ("10 failures in a row", 2)
    assert kept == list(range(1, 13))


def test_a_multiwriter_among_the_writers_is_unpacked_so_each_fails_alone():
    # In `{"default": create_default_writer(d), ...}` the MultiWriter was one writer: a full
    # disk under its TensorBoard writer quarantined its JSONL log with it (10 of 20 written).
    class Full(writers.NoopWriter):
        def write_scalars(self, step, scalars):
            raise OSError(errno.ENOSPC, "No space left on device")

    class Kept(writers.NoopWriter):
        def __init__(self):
            self.steps = []

        def write_scalars(self, step, scalars):
            self.steps.append(step)

    inner, outer = Kept(), Kept()

    def factory(logdir):
        return {"default": writers.MultiWriter({"full": Full(), "kept": inner}), "kept": outer}

    with MetricsManager("train", None, writer_factory=factory) as manager:
        for step in range(1, 21):
            manager.write_scalars(step, {"loss": 1.0})
        manager.flush()
        health = manager.health()["writers"]
    assert {name: h["quarantined"] for name, h in health.items()} == {
        "full": "10 failures in a row",
        "default/kept": None,  # its name is the outer writer's
        "kept": None,
    }
    assert inner.steps == outer.steps == list(range(1, 21))


def test_a_quarantined_writer_is_tried_again_after_quarantine_s_and_comes_back(tmp_path, caplog):
    class Tracker(writers.NoopWriter):  # a tracker server that is down, then back
        down, calls, steps = True, 0, []

        def write_scalars(self, step, scalars):
            self.calls += 1
            if self.down:
                raise ConnectionError(f"tracker down at step {step}")
            self.steps.append(step)

    tracker = Tracker()

    def factory(logdir):
        jsonl = writers.JsonlWriter(os.path.join(logdir, "metrics.jsonl"))
        return writers.MultiWriter({"tracker": tracker, "jsonl": jsonl})

    def write(manager, steps):
        for step in steps:
            manager.write_scalars(step, {"loss": float(step)})
        manager.flush()
        return manager.health()["writers"]["tracker"]

    with MetricsManager(
        "train", tmp_path, writer_factory=factory, max_writer_failures=3, quarantine_s=1.0
    ) as manager:
        health = write(manager, range(1, 11))  # 3 failures, then 7 calls skipped
        assert (tracker.calls, health["failures"], health["skipped"]) == (3, 3, 7)
        assert health["quarantined"] == "3 failures in a row"
        time.sleep(1.1)
        health = write(manager, range(11, 13))  # tried again at 11, still down: 1 s more
        assert (tracker.calls, health["failures"], health["skipped"]) == (4, 4, 8)
        tracker.down = False
        health = write(manager, [13])
        assert tracker.calls == 4 and health["quarantined"] == "3 failures in a row"
        time.sleep(1.1)
        health = write(manager, range(14, 21))
    assert tracker.steps == list(range(14, 21))
    assert (health["failures"], health["skipped"], health["quarantined"]) == (4, 9, None)
    back = [r.getMessage() for r in caplog.records if "is back" in r.getMessage()]
    assert back == [
        "MetricsManager 'train': writer 'tracker' is back (quarantined: 3 failures in a row; "
        "9 writes skipped)"
    ]
    assert [line["step"] for line in read_jsonl(str(tmp_path / "train"))] == list(range(1, 21))


def test_a_hung_writer_is_tried_again_only_once_its_call_has_returned(tmp_path):
    release = threading.Event()

    class Mount(writers.NoopWriter):  # a network mount that hangs once, then recovers
        steps: list[int] = []

        def write_scalars(self, step, scalars):
            release.wait()
            self.steps.append(step)

    mount = Mount()
    with MetricsManager(
        "t", writer_factory=lambda d: mount, writer_deadline_s=0.3, quarantine_s=0.3
    ) as manager:
        manager.write_scalars(1, {"loss": 1.0})
        manager.flush()  # abandons the call after 0.3 s
        time.sleep(0.4)
        manager.write_scalars(2, {"loss": 2.0})
        manager.flush()  # past quarantine_s, but the first call is still inside the writer
        assert manager.health()["writers"]["Mount"] == {
            "failures": 1,
            "quarantined": "hung",
            "skipped": 1,  # the write at step 2
            "flush_failure": None,
            "unsupported": [],
        }
        assert mount in writers._base.ABANDONED  # not closed at exit while the call hangs
        release.set()
        deadline = time.monotonic() + 10
        while mount.steps != [1]:  # the abandoned call returns
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.4)
        manager.write_scalars(3, {"loss": 3.0})
        manager.flush()
    assert mount.steps == [1, 3]
    assert manager.health()["writers"]["Mount"]["quarantined"] is None
    assert mount not in writers._base.ABANDONED


@pytest.mark.parametrize("name", ["bob's mount", "mount\\2"])
def test_a_hung_writer_named_with_a_quote_or_backslash_is_quarantined(name):
    # Its piece's label is `writer {name!r}`; stripping 's off it did not give the name back,
    # so the writer was never quarantined: called again at every write, each abandoned.
    release = threading.Event()

    class Mount(writers.NoopWriter):
        steps: list[int] = []

        def write_scalars(self, step, scalars):
            self.steps.append(step)
            release.wait()

    mount = Mount()
    try:
        with MetricsManager(
            "t", writer_factory=lambda d: {name: mount}, writer_deadline_s=0.2
        ) as manager:
            for step in (1, 2):
                manager.write_scalars(step, {"loss": 1.0})
                manager.flush()
            health = manager.health()["writers"][name]
            assert (mount.steps, health["failures"], health["quarantined"]) == ([1], 1, "hung")
            assert mount in writers._base.ABANDONED
            assert [f.source for f in manager.errors] == [f"writer:{name}"]
    finally:
        release.set()


def test_a_call_returning_as_its_deadline_is_noticed_leaves_no_writer_abandoned(tmp_path):
    entered, go = threading.Event(), threading.Event()

    class Slow(writers.NoopWriter):
        steps: list[int] = []
        closes = 0

        def write_scalars(self, step, scalars):
            entered.set()
            go.wait()
            self.steps.append(step)

        def close(self):
            self.closes += 1

    slow = Slow()
    with MetricsManager("t", writer_factory=lambda d: slow, writer_deadline_s=0.2) as manager:
        state = manager._fanout.states["Slow"]
        manager.write_scalars(1, {"loss": 1.0})
        assert entered.wait(10)
        time.sleep(0.3)  # past the deadline, not noticed yet
        with manager._worker._cond:  # the call returns before the overrun is noticed
            go.set()
            deadline = time.monotonic() + 10
            while state.busy:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            manager.write_scalars(2, {"loss": 2.0})  # notices it: abandoned as hung
        manager.flush()
        assert slow.steps == [1]
        assert manager.health()["writers"]["Slow"]["quarantined"] == "hung"
        assert slow not in writers._base.ABANDONED  # no call inside: closed at exit
        hook = writers._base.close_at_exit(slow, "Slow")
        hook()
        atexit.unregister(hook)
        assert slow.closes == 1


def test_a_hung_writer_whose_retry_fails_waits_quarantine_s_again(tmp_path):
    release = threading.Event()

    class Mount(writers.NoopWriter):  # a mount that hangs, then comes back failing (EIO)
        steps: list[int] = []

        def write_scalars(self, step, scalars):
            self.steps.append(step)
            if step == 1:
                release.wait()
            raise OSError(errno.EIO, "Input/output error")

    mount = Mount()
    with MetricsManager(
        "t", writer_factory=lambda d: mount, writer_deadline_s=0.3, quarantine_s=2.0
    ) as manager:
        manager.write_scalars(1, {"loss": 1.0})
        manager.flush()  # abandons the call after 0.3 s: quarantined as hung
        release.set()
        deadline = time.monotonic() + 10
        while manager.health()["failures"] < 2:  # the abandoned call returns, failing
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(2.2)
        for step in range(2, 7):  # tried again at 2, which fails: 3-6 wait 2 s more
            manager.write_scalars(step, {"loss": float(step)})
            manager.flush()
        health = manager.health()["writers"]["Mount"]
    # It was called at every write after the failed retry, 9 (max_writer_failures - 1) more.
    assert mount.steps == [1, 2]
    # Failures: the deadline, the abandoned call's OSError once it returned, the retry's.
    assert (health["failures"], health["skipped"], health["quarantined"]) == (3, 4, "hung")


def write_through_an_outage(
    manager: MetricsManager, gate: Any, failed: Any
) -> tuple[int, int, float]:
    """Writes a summary every ~5 ms: 20, then through a cut of `gate` lasting at least 3 s and
    until `failed()`, then 20 after it is restored. Returns (last step, summaries written
    during the cut, the slowest call in seconds)."""
    step, worst = 0, 0.0

    def write() -> None:
        nonlocal step, worst
        step += 1
        called = time.perf_counter()
        manager.write_metrics_summary({"loss": Sum(np.float32(step))}, step, 1)
        worst = max(worst, time.perf_counter() - called)
        time.sleep(0.005)

    while step < 20:
        write()
    gate.cut()
    cut, before = time.monotonic(), step
    while time.monotonic() - cut < 3 or not failed():
        assert time.monotonic() - cut < 60, "nothing failed during the outage"
        write()
    during = step - before
    gate.restore()
    for _ in range(20):
        write()
    return step, during, worst


def test_a_storage_outage_neither_blocks_the_loop_nor_loses_a_summary(tmp_path, caplog):
    # A real outage between the writers and S3 (moto's server): a proxy resets every
    # connection for a few seconds, long enough for both writers' timed uploads to fail.
    from tests import storage_servers

    server, gate, config = storage_servers.s3_behind_a_gate(
        max_attempts=2
    )  # a failed upload: ~1.5 s
    run = f"s3://{storage_servers.BUCKET}/outage"

    def failed_timers() -> set[str]:
        logged = (r.getMessage() for r in caplog.records)
        return {m.split(":")[0] for m in logged if "a timed flush failed" in m}

    def factory(logdir):
        return writers.create_default_writer(logdir, console=False, flush_secs=0.2)

    with (
        storage_servers.serving(server, "s3", config),
        MetricsManager("train", run, writer_factory=factory, max_pending=1) as manager,
    ):
        step, during, worst = write_through_an_outage(
            manager, gate, lambda: len(failed_timers()) == 2
        )
        manager.close()
        assert failed_timers() == {"TensorBoardWriter", "JsonlWriter"}
        assert manager.health()["failures"] == 0  # every write was buffered; no upload was lost
        assert worst < 0.5 and during >= 100  # the loop never waited on a failing upload
        lines = writers.read_jsonl(f"{run}/train/metrics.jsonl")
        assert [line["loss"] for line in lines] == [float(s) for s in range(1, step + 1)]
        storage_servers.copy_event_files(f"{run}/train", str(tmp_path))
    server.stop()
    assert tb_steps(str(tmp_path)) == list(range(1, step + 1))


def test_a_flush_stuck_in_a_dead_network_costs_no_later_summary(tmp_path):
    # A network that drops packets (no reset: uploads hang) under a flush() after a
    # checkpoint: past writer_deadline_s, both writers were quarantined as hung for
    # quarantine_s, and every summary of the next 300 s was skipped, also once storage was
    # back (40 of 160 reached S3). Their writes only buffer: they are called on.
    from tests import storage_servers

    server, gate, config = storage_servers.s3_behind_a_gate(max_attempts=1)
    run = f"s3://{storage_servers.BUCKET}/dead-network"

    def factory(logdir):
        return writers.create_default_writer(logdir, console=False, flush_secs=0.2)

    with (
        storage_servers.serving(server, "s3", config),
        MetricsManager("train", run, writer_factory=factory, writer_deadline_s=2) as manager,
    ):
        for step in range(1, 21):
            manager.write_scalars(step, {"loss": float(step)})
        manager.flush()
        gate.cut()  # the connections open now: reset; new ones are taken but never answered
        gate.restore()
        with gate._lock:
            for step in range(21, 41):
                manager.write_scalars(step, {"loss": float(step)})
            manager.flush()  # abandoned past the deadline, in each writer
            for step in range(41, 61):
                manager.write_scalars(step, {"loss": float(step)})
        for step in range(61, 161):  # storage is back
            manager.write_scalars(step, {"loss": float(step)})
        manager.close()
        health = manager.health()["writers"]
        assert {name: health[name]["quarantined"] for name in health} == {
            "tensorboard": None,
            "jsonl": None,
        }
        lines = writers.read_jsonl(f"{run}/train/metrics.jsonl")
        storage_servers.copy_event_files(f"{run}/train", str(tmp_path))
    server.stop()
    assert [line["loss"] for line in lines] == [float(s) for s in range(1, 161)]
    assert tb_steps(str(tmp_path)) == list(range(1, 161))


def _jsonl_and_mlflow(made: dict[str, Any], url: Any, name: str, flush_secs: float) -> Any:
    """A writer_factory: JSONL and an MlflowWriter at `url()`, kept in `made["mlflow"]`."""

    def factory(logdir):
        made["mlflow"] = writers.MlflowWriter(name, tracking_uri=url(), flush_secs=flush_secs)
        jsonl = writers.JsonlWriter(f"{logdir}/metrics.jsonl")
        return writers.MultiWriter({"jsonl": jsonl, "mlflow": made["mlflow"]})

    return factory


def test_an_mlflow_server_outage_neither_blocks_the_loop_nor_loses_a_summary(
    tmp_path, caplog, monkeypatch
):
    # A real `mlflow server` behind a proxy that resets every connection for 3 s. MLflow's
    # client retries a failed request for about 2 minutes by default, on the writer's timer
    # thread; one try per send here, so that the outage and the recovery fit in seconds.
    from mlflow import MlflowClient

    from tests import storage_servers
    from tests.writers.tracker_stores import mlflow_server

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    made: dict[str, Any] = {}
    factory = _jsonl_and_mlflow(made, lambda: gate.url, "outage", flush_secs=0.2)

    def failed_sends() -> int:
        return sum("a timed flush failed" in r.getMessage() for r in caplog.records)

    def flush_failure() -> str | None:
        return manager.health()["writers"]["mlflow"]["flush_failure"]

    seen: list[str] = []

    def failing() -> bool:  # health() shows the outage while the writes go through
        seen.extend(f for f in [flush_failure()] if f)
        return bool(seen)

    with mlflow_server(str(tmp_path)) as port:
        gate = storage_servers.Gate(port)
        with MetricsManager("train", tmp_path, writer_factory=factory, max_pending=1) as manager:
            step, during, worst = write_through_an_outage(manager, gate, failing)
            assert seen[0].startswith(f"MlflowException: API request to {gate.url}/"), seen
            deadline = time.monotonic() + 10
            while flush_failure() is not None:  # the timer's next send, after restore()
                assert time.monotonic() < deadline, flush_failure()
                time.sleep(0.02)
        assert failed_sends() == 1  # logged once for the outage
        assert manager.errors == []  # every write was buffered; no send was lost
        assert worst < 0.5 and during >= 100  # the loop never waited on the tracker
        lines = read_jsonl(str(tmp_path / "train"))
        assert [line["loss"] for line in lines] == [float(s) for s in range(1, step + 1)]
        client = MlflowClient(f"http://127.0.0.1:{port}")
        history = client.get_metric_history(made["mlflow"].run_id, "loss")
        assert sorted((m.step, m.value) for m in history) == [
            (s, float(s)) for s in range(1, step + 1)
        ]
        assert client.get_run(made["mlflow"].run_id).info.status == "FINISHED"


def test_a_flush_stuck_in_mlflows_retries_costs_none_of_the_later_writes(tmp_path, monkeypatch):
    # A flush() during the outage waited in the client's retries past writer_deadline_s: the
    # writer was quarantined as hung and every write of the next quarantine_s (300 s) was
    # skipped, also those after the server was back. Its writes only buffer: they go on.
    from mlflow import MlflowClient

    from tests import storage_servers
    from tests.writers.tracker_stores import mlflow_server

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")  # 6-9 s of retries
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    made: dict[str, Any] = {}
    factory = _jsonl_and_mlflow(made, lambda: gate.url, "stuck", flush_secs=3600)

    with mlflow_server(str(tmp_path)) as port:
        gate = storage_servers.Gate(port)
        # a send to the server takes well under 3 s, on a loaded machine too
        manager = MetricsManager("train", tmp_path, writer_factory=factory, writer_deadline_s=3.0)
        for step in range(1, 41):
            if step == 11:
                manager.flush()
                gate.cut()
            if step == 16:
                manager.flush()  # abandoned after 3 s, still inside the client's retries
            if step == 26:
                gate.restore()
                with made["mlflow"]._sending:  # the abandoned send has failed by now
                    pass
            manager.write_scalars(step, {"loss": step / 4})
        manager.close()
        [error] = [str(f.error) for f in manager.errors]
        assert (
            "writer 'mlflow' ran past writer_deadline_s=3.0: left to end on its own; its "
            "later calls go on" in error
        )
        assert manager.health()["writers"]["mlflow"]["quarantined"] is None
        client = MlflowClient(f"http://127.0.0.1:{port}")
        history = client.get_metric_history(made["mlflow"].run_id, "loss")
        assert sorted((m.step, m.value) for m in history) == [(s, s / 4) for s in range(1, 41)]
        assert client.get_run(made["mlflow"].run_id).info.status == "FINISHED"
    assert [line["loss"] for line in read_jsonl(str(tmp_path / "train"))] == [
        s / 4 for s in range(1, 41)
    ]


def test_a_long_storage_outage_drops_the_oldest_writes_past_max_buffer_mb(tmp_path, caplog):
    # Uploads to a real S3 server fail behind a cut proxy while 200 lines of ~70 bytes
    # accumulate against a 4 KiB bound: each failed flush drops the oldest writes, whole.
    from tests import storage_servers

    server, gate, config = storage_servers.s3_behind_a_gate(max_attempts=1)
    run = f"s3://{storage_servers.BUCKET}/long-outage"
    bound = 4096 / 2**20
    with storage_servers.serving(server, "s3", config):
        jsonl = writers.JsonlWriter(f"{run}/metrics.jsonl", flush_secs=3600, max_buffer_mb=bound)
        tb = writers.TensorBoardWriter(run, flush_secs=3600, max_buffer_mb=bound)
        log = jsonl._log._stream
        for step in range(1, 11):
            writers.write_values(jsonl, step, {"loss": float(step)})
            writers.write_values(tb, step, {"loss": float(step)})
        jsonl.flush(), tb.flush()
        gate.cut()
        for step in range(11, 211):
            jsonl.write_scalars(step, {"loss": float(step)})
            tb.write_scalars(step, {"loss": float(step)})
            if step % 50 == 0:
                for writer in (jsonl, tb):
                    with pytest.raises(Exception) as failed:
                        writer.flush()
                    if step >= 150:  # past 4 KiB by then: every failure notes the drops
                        assert "oldest writes" in "".join(failed.value.__notes__)
                assert log._size <= 4096  # the bound holds after every failed upload
        gate.restore()
        jsonl.close(), tb.close()
        lines = writers.read_jsonl(f"{run}/metrics.jsonl")
        storage_servers.copy_event_files(run, str(tmp_path))
    server.stop()
    dropped = log.dropped.count
    assert 100 < dropped < 200
    assert [line["loss"] for line in lines] == [*range(1, 11), *range(11 + dropped, 211)]
    events = tb._file._file.dropped.count
    assert tb_steps(str(tmp_path)) == [*range(1, 11), *range(11 + events, 211)]
    warned = [r.getMessage() for r in caplog.records if "dropping the oldest" in r.getMessage()]
    assert len(warned) == 2  # once per writer for the outage
    assert all("the buffer's 4 KiB hold" in message for message in warned)  # not "0 MiB"


def test_a_flush_that_waited_on_a_failing_upload_fails_with_it_and_does_not_try_again(tmp_path):
    # In a gs:// outage a flush waited for the timer's retrying upload (~34 s on gcsfs), then
    # made its own attempt (~34 s more): past writer_deadline_s, its writer was quarantined as
    # hung and lost what came after. Of two overlapping flushes, one uploads; the other fails
    # when that upload fails, and the data stays buffered for the next flush.
    from tests import storage_servers

    server, gate, config = storage_servers.s3_behind_a_gate(
        max_attempts=2
    )  # a failed upload: ~1.5 s
    run = f"s3://{storage_servers.BUCKET}/overlap"
    errors: list[str] = []

    def flush(writer: writers.TensorBoardWriter) -> None:
        try:
            writer.flush()
        except Exception as err:  # noqa: BLE001
            errors.append(str(err))

    with storage_servers.serving(server, "s3", config):
        tb = writers.TensorBoardWriter(run, flush_secs=3600)
        tb.write_scalars(1, {"loss": 1.0})
        tb.flush()
        gate.cut()
        tb.write_scalars(2, {"loss": 2.0})
        threads = [threading.Thread(target=flush, args=(tb,)) for _ in range(2)]
        threads[0].start()
        parts = tb._file._file  # the remote event file's parts (`_storage.PartStream`)
        for _ in range(600):  # until the first upload is under way (0.3 s missed it under load)
            if parts._upload.locked():
                break
            time.sleep(0.005)
        threads[1].start()
        for thread in threads:
            thread.join()
        gate.restore()
        tb.write_scalars(3, {"loss": 3.0})
        tb.close()
        storage_servers.copy_event_files(run, str(tmp_path))
    server.stop()
    waited = [e for e in errors if "the upload under way when this flush began failed" in e]
    assert len(errors) == 2 and len(waited) == 1, errors
    assert tb_steps(str(tmp_path)) == [1, 2, 3]


def test_a_long_mlflow_outage_drops_the_oldest_values_past_max_buffer_mb(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from tests import storage_servers
    from tests.writers.tracker_stores import mlflow_server

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with mlflow_server(str(tmp_path)) as port:
        gate = storage_servers.Gate(port)
        bound = 100 * 180 / 2**20  # 100 buffered metrics
        writer = writers.MlflowWriter(
            "outage", tracking_uri=gate.url, flush_secs=3600, max_buffer_mb=bound
        )
        writer.write_scalars(1, {"loss": 1.0})
        writer.flush()
        gate.cut()
        for step in range(2, 302):
            writer.write_scalars(step, {"loss": float(step)})
            if step % 100 == 1:
                with pytest.raises(Exception) as failed:
                    writer.flush()
                assert len(writer._pending_metrics) <= 100
        assert "oldest writes dropped" in "".join(failed.value.__notes__)
        gate.restore()
        writer.close()
        history = MlflowClient(f"http://127.0.0.1:{port}").get_metric_history(writer.run_id, "loss")
    kept = sorted(int(m.step) for m in history)
    assert writer.dropped.count == 200  # 100 at each of the last two failed sends
    assert kept == [1, *range(2 + writer.dropped.count, 302)]


_EXIT_WITHOUT_CLOSE = """
import sys, writers
w = writers.MlflowWriter("exit", tracking_uri=sys.argv[1], flush_secs=3600, close_timeout_s=2.0)
w.write_scalars(1, {"loss": 1.0})
print(w.run_id, flush=True)
sys.stdin.readline()  # the parent cuts the network, then lets it end without close()
"""


def test_an_mlflow_server_that_stops_answering_delays_close_and_exit_by_close_timeout_s(
    tmp_path,
):
    # MLflow's client retries each request for about 2 minutes (its default, kept here);
    # close(), and the close at exit of a writer never closed, give up after close_timeout_s.
    from mlflow import MlflowClient

    from tests import storage_servers
    from tests.writers.tracker_stores import mlflow_server

    with mlflow_server(str(tmp_path)) as port:
        gate = storage_servers.Gate(port)
        writer = writers.MlflowWriter("close", tracking_uri=gate.url, close_timeout_s=2.0)
        for step in range(1, 11):
            writer.write_scalars(step, {"loss": float(step)})
        gate.cut()
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=r"gave up after 2 s .* up to 10 metric\(s\)"):
            writer.close()
        assert 2.0 <= time.monotonic() - start < 4.0  # the bound, plus slack for a busy CI host
        gate.restore()  # back before the process ends: the send still goes through
        client = MlflowClient(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 90
        while len(client.get_metric_history(writer.run_id, "loss")) < 10:
            assert time.monotonic() < deadline, "the buffered values never reached the server"
            time.sleep(0.5)
        steps = sorted(int(m.step) for m in client.get_metric_history(writer.run_id, "loss"))
        assert steps == list(range(1, 11))

        child = subprocess.Popen(
            [sys.executable, "-c", _EXIT_WITHOUT_CLOSE, gate.url],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip()  # its run exists; step 1 is buffered
        gate.cut()
        start = time.monotonic()
        _, err = child.communicate("\n", timeout=60)
        assert child.returncode == 0, err
        assert time.monotonic() - start < 2.0 + 5.0, err
        assert "gave up after 2 s" in err and "up to 1 metric(s)" in err, err


def run_loop(*args: str, timeout: float = 60, **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.metrics_manager.fault_loop", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def test_forked_children_neither_flush_nor_close_the_parents_manager(tmp_path):
    # Data-loader workers are forked: they inherit the manager's memory, signal handler and
    # atexit hooks, but not its worker thread. Were they acted on, a SIGTERM'd worker would
    # wait out the 25 s signal flush, and a child exiting normally would hang in close().
    proc = run_loop("fork", str(tmp_path))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    terminated = float(out.split("terminated in ")[1].split(" s")[0])
    assert terminated < 5.0 and "with [-15, -15]" in out, out  # SIGTERM's usual status
    exited = float(out.split("exited in ")[1].split(" s")[0])
    assert exited < 5.0 and "s with 0" in out, out
    # The handler it had before the manager: the default kills a child blocked in a wait at
    # once, where a Python handler waits for the child to run Python again.
    assert "child's SIGTERM handler <Handlers.SIG_DFL: 0>" in out, out
    # Its write was queued where no thread runs (or, the queue full, run by a thread started
    # in the child into the parent's files): now refused, naming the fix.
    assert (
        "child's write: MetricsManager 'train': write_scalars() was called in a forked child of "
        "the process that made it"
    ) in out, out
    assert "flush on signal failed" not in out
    parent = out.split("parent ")[1].split()[0]
    # Only the parent closed its writers: a child closing its copy would send buffers twice.
    assert (tmp_path / "closed_by").read_text().split() == [parent]
    assert [line["step"] for line in read_jsonl(str(tmp_path / "train"))] == list(range(1, 11))
    assert tb_steps(str(tmp_path / "train")) == list(range(1, 11))


_FORK_UNDER_HANDLERS = """
import os, signal, sys, time
import writers
from metrics_manager import MetricsManager

manager = MetricsManager("t", sys.argv[1], writer_factory=writers.JsonlWriter)
if sys.argv[2] == "chaining":  # the program's own, set after the manager's and calling it
    manager_handler = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: manager_handler(signum, frame))
for child_makes_a_manager in (False, True):
    if (pid := os.fork()) == 0:
        if child_makes_a_manager:
            own = MetricsManager("c", sys.argv[1], writer_factory=writers.JsonlWriter)
            print(f"child's own manager handles it: {signal.getsignal(signal.SIGTERM).__name__}")
            own.write_scalars(1, {"x": 1.0})
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        os._exit(0)  # survived the signal
    print(f"child ended with {os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}", flush=True)
manager.close()
"""


@pytest.mark.parametrize("handlers", ["manager's", "chaining"])
def test_a_forked_child_ends_on_sigterm_as_without_the_manager(tmp_path, handlers):
    # A program's handler set after the manager's calls it: in the child it must still reach
    # the default action. A manager the child makes flushes its own values on the signal
    # (through the program's handler where there is one, as in the parent).
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_UNDER_HANDLERS, str(tmp_path), handlers],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    handler = "<lambda>" if handlers == "chaining" else "_on_signal"
    assert proc.stdout.splitlines() == [
        "child ended with -15",
        f"child's own manager handles it: {handler}",
        "child ended with -15",
    ], proc.stderr
    assert [line["x"] for line in read_jsonl(str(tmp_path / "c"))] == [1.0]


def test_a_write_racing_close_is_either_written_or_refused(tmp_path):
    # A call that passed the closed check could queue behind close()'s job: it returned as
    # accepted, and its values reached closed writers (WriterClosedError), in 2 of 5 trials.
    for trial in range(10):
        logdir = tmp_path / f"run{trial}"
        manager = MetricsManager(f"run{trial}", tmp_path, writer_factory=files_and())
        accepted: list[int] = []
        refused: list[BaseException] = []

        def evaluate(
            manager: MetricsManager = manager,
            accepted: list[int] = accepted,
            refused: list[BaseException] = refused,
        ) -> None:
            for step in range(1, 100_000):
                try:
                    manager.write_scalars(step, {"accuracy": step / 10})
                except RuntimeError as err:
                    refused.append(err)
                    return
                accepted.append(step)

        thread = threading.Thread(target=evaluate)
        thread.start()
        deadline = time.monotonic() + 30
        while not accepted:  # the close races writes under way, not a thread yet to start
            assert time.monotonic() < deadline, "no write was accepted"
            time.sleep(0.001)
        time.sleep(0.05 + trial * 0.01)
        manager.close()
        thread.join(timeout=30)
        assert len(refused) == 1 and "is closed" in str(refused[0]), refused
        assert manager.errors == [], (trial, manager.errors)
        assert [line["step"] for line in read_jsonl(str(logdir))] == accepted
        assert tb_steps(str(logdir), "accuracy") == accepted


def test_flush_or_close_from_the_managers_own_thread_raises_at_once(tmp_path):
    # From inside a writer, flush() waited for its own thread: 60 s, then the writer was
    # quarantined as hung; with no deadline, forever. From a summary's done-callback, which
    # runs outside any deadline, close() and the process exit hung.
    manager: MetricsManager
    seen: list[str] = []

    added = threading.Event()  # the callback is added before the summary ends

    class Flushing(writers.NoopWriter):
        def write_scalars(self, step: int, scalars: Any) -> None:
            if step == 3:
                added.wait(10)
            for call in (manager.flush, manager.close):
                try:
                    call()
                except RuntimeError as err:
                    seen.append(f"writer: {err}")

    def callback(future: Any) -> None:
        try:
            manager.flush()
        except RuntimeError as err:
            seen.append(f"callback: {err}")

    start = time.monotonic()
    with MetricsManager(
        "train", tmp_path, writer_factory=files_and(last={"flushing": Flushing()})
    ) as manager:
        for step in range(1, 4):
            manager.write_scalars(step, {"loss": float(step)})
        future = manager.write_metrics_summary({"loss": Sum(np.float32(4.0))}, 4, 1)
        future.add_done_callback(callback)
        added.set()
        manager.flush()
    assert time.monotonic() - start < 10
    own = (
        "was called from its own worker thread (inside a writer, or a future's callback), "
        "where it would wait for itself forever. Call it from the training loop."
    )
    assert seen[:8] == [
        f"writer: MetricsManager[train]: MetricsManager.{call}() {own}"
        for _ in range(4)
        for call in ("flush", "close")
    ]
    assert seen[8:] == [f"callback: MetricsManager[train]: MetricsManager.flush() {own}"]
    assert [line["step"] for line in read_jsonl(str(tmp_path / "train"))] == [1, 2, 3, 4]
    assert tb_steps(str(tmp_path / "train")) == [1, 2, 3, 4]
    assert manager.errors == []


_KEEP_ALL = ("tensors", "scalars", "histograms")


@flax.struct.dataclass
class _Computed(clu_metrics.Metric):
    """A metric computing an image or a histogram (`kind`), as a sample grid or weights."""

    array: jax.Array
    kind: str = flax.struct.field(pytree_node=False, default="image")
    buckets: int | None = flax.struct.field(pytree_node=False, default=None)

    def merge(self, other: _Computed) -> _Computed:
        return other

    def compute(self) -> jax.Array:
        return self.array

    def compute_value(self) -> Any:
        array = np.asarray(self.array)
        if self.kind == "image":
            return clu.values.Image(array)
        return clu.values.Histogram(array, self.buckets)


def test_a_computed_value_no_writer_takes_loses_that_key_alone(tmp_path):
    # An [H, W] image or a NaN histogram from compute_value() reached every writer, which
    # refused the whole call: the good images and histograms of the summary were lost too,
    # and after 10 summaries every writer was quarantined, later scalars lost with them.
    grid = np.linspace(0, 1, 4 * 5 * 3, dtype=np.float32).reshape(4, 5, 3)
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        for step in range(1, 13):
            metrics = {
                "loss": Sum(np.float32(step)),
                "samples": _Computed(jnp.asarray(grid)),
                "gray": _Computed(jnp.zeros((4, 5))),  # no channel axis
                "bias": _Computed(jnp.arange(3.0), kind="histogram"),
                "weights": _Computed(jnp.array([jnp.nan, 1.0]), kind="histogram"),  # diverged
                "coarse": _Computed(jnp.arange(3.0), kind="histogram", buckets=0),
            }
            manager.write_metrics_summary(metrics, step, 1)
        manager.write_scalars(13, {"accuracy": 0.5})
    logdir = str(tmp_path / "train")
    keys: dict[int, set[str]] = {}
    for line in read_jsonl(logdir):
        keys.setdefault(line["step"], set()).update(set(line) - {"step", "time", "collection"})
    assert keys == {
        **{step: {"bias", "loss", "samples"} for step in range(1, 13)},
        13: {"accuracy"},
    }
    acc = event_accumulator.EventAccumulator(logdir, size_guidance=dict.fromkeys(_KEEP_ALL, 0))
    acc.Reload()
    assert [e.step for e in acc.Tensors("samples")] == list(range(1, 13))
    assert [e.step for e in acc.Histograms("bias")] == list(range(1, 13))
    assert {e.histogram_value.num for e in acc.Histograms("bias")} == {3}
    assert "gray" not in acc.Tags()["tensors"] and "weights" not in acc.Tags()["histograms"]
    assert tb_steps(logdir, "accuracy") == [13]
    health = manager.health()["writers"]
    assert {name: state["failures"] for name, state in health.items()} == {
        "tensorboard": 0,
        "jsonl": 0,
    }
    failed = sorted({(f.source, str(f.error).split(": ", 1)[1][:40]) for f in manager.errors})
    assert failed == [
        ("metric:coarse", "num_buckets must map keys to bucket coun"),
        ("metric:gray", "image 'gray' must have shape [H, W, C] o"),
        ("metric:weights", "histogram 'weights' has 1 NaN/Inf entrie"),
    ]


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (clu.values.Image(np.zeros((4, 5))), ValueError, r"image 'v' must have shape \[H, W, C\]"),
        (clu.values.Histogram(np.array([]), None), ValueError, r"histogram 'v'"),
        (clu.values.Text(5), TypeError, r"text 'v' must be a str, got int"),
        (clu.values.Audio(np.zeros((100, 1)), 16000), ValueError, r"audio 'v' must be a float"),
        (clu.values.Histogram(np.arange(3.0), 0), ValueError, r"num_buckets .* got \{'v': 0\}"),
        (clu.values.Audio(np.zeros((1, 100, 1)), 0), ValueError, r"audio 'v': sample_rate must"),
        (clu.values.Audio(np.zeros((1, 2, 40000)), 8000), ValueError, r"'v' has 40000 channels"),
        (clu.values.Audio(np.zeros((1, 100, 1)), 2**31), ValueError, r"too high for the WAV"),
        (clu.values.HyperParam({"a": {1: 2}}), TypeError, r"'v.a' holds the key 1; nested keys"),
        (
            clu.values.HyperParam({"a.b": 1, "a": {"b": 2}}),
            ValueError,
            r"hyperparameter 'v.a.b' is given twice",
        ),
        (
            clu.values.Summary(np.ones(3, np.float32), "pr_curve"),
            TypeError,
            r"summary 'v': metadata must be a SummaryMetadata proto.*got str 'pr_curve'",
        ),
    ],
    ids=[
        "image",
        "histogram",
        "text",
        "audio",
        "buckets",
        "sample rate",
        "channels",
        "byte rate",
        "hparam key",
        "hparam twice",
        "summary metadata",
    ],
)
def test_a_ready_value_no_writer_takes_is_refused_at_the_call(tmp_path, value, error, match):
    # Accepted, then refused by every writer on the worker, with the call's other values.
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        with pytest.raises(error, match=match):
            manager.write_metrics_summary({"loss": Sum(np.float32(1.0)), "v": value}, 1, 1)
        manager.write_metrics_summary({"loss": Sum(np.float32(2.0))}, 2, 1)
    assert [(x["step"], x["loss"]) for x in read_jsonl(str(tmp_path / "train"))] == [(2, 2.0)]
    assert manager.errors == []


def test_nan_in_an_image_or_clip_is_left_out_as_in_a_histogram(tmp_path):
    # NaN and infinities in an image or clip were written as black pixels and silence (inf
    # as white, a full-scale sample), where a NaN histogram is left out, logged and counted.
    grid = np.full((1, 2, 2, 3), 0.5, np.float32)
    nan_grid = grid.copy()
    nan_grid[0, 0, 0, 0] = np.nan
    clip = np.array([[[0.25], [np.inf]]], np.float32)
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        summary = {
            "loss": Sum(np.float32(1.0)),
            "samples": clu.values.Image(grid),
            "diverged": clu.values.Image(nan_grid),
            "speech": clu.values.Audio(clip, 8000),
        }
        manager.write_metrics_summary(summary, 1, 1)
        manager.write_images(2, {"host": nan_grid, "device": jnp.asarray(nan_grid)})
    logdir = str(tmp_path / "train")
    assert [sorted(set(x) - {"time", "collection"}) for x in read_jsonl(logdir)] == [
        ["loss", "step"],
        ["samples", "step"],
    ]
    acc = read_tensorboard(logdir)
    assert acc.Tags()["tensors"] == ["samples"]  # the images and clips TensorBoard holds
    failed = sorted((f.source, f.step, str(f.error).split(": ", 1)[-1]) for f in manager.errors)
    assert [(source, step) for source, step, _ in failed] == [
        ("metric:device", 2),
        ("metric:diverged", 1),
        ("metric:host", 2),
        ("metric:speech", 1),
    ]
    assert failed[1][2].startswith("image 'diverged' has 1 NaN/Inf values out of 12; pixels")
    assert failed[3][2].startswith("audio 'speech' has 1 NaN/Inf values out of 2; samples")
    assert manager.health()["writers"]["jsonl"]["failures"] == 0


_SIGNAL_DURING_CLOSE = """
import os, signal, sys, threading, time
import writers
from metrics_manager import MetricsManager

out = sys.argv[1]


class SlowClose(writers.NoopWriter):  # a tracker finishing its run
    def close(self):
        time.sleep(1.0)
        open(os.path.join(out, "closed"), "w").write("closed")


manager = MetricsManager("train", None, writer_factory=lambda logdir: SlowClose())
manager.write_scalars(1, {"loss": 1.0})
pieces = manager._fanout.pieces


def widened(step, calls, **kwargs):  # the handler between its closed check and its post
    if calls[0][0] == "close" and threading.current_thread() is threading.main_thread():
        threading.Thread(target=manager.close).start()
        time.sleep(0.3)
    return pieces(step, calls, **kwargs)


manager._fanout.pieces = widened
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(10)
"""


def test_a_summary_abandoned_at_a_signals_bound_fails_its_future_and_writes_nothing(monkeypatch):
    # A summary whose computation outlived the signal's flush bound resolved to None, its
    # writer steps ran with no values, and it was recorded as a writer 'summary' quarantined.
    from metrics_manager import manager as manager_lib
    from tests.writers.recording import RecordingWriter

    gate = threading.Event()

    @flax.struct.dataclass
    class Blocking(Sum):
        def compute_value(self):
            assert gate.wait(timeout=30)
            return clu.values.Scalar(float(self.total))

    monkeypatch.setattr(manager_lib, "_SIGNAL_DEADLINE_S", 0.3)
    recorder = RecordingWriter()
    manager = MetricsManager("train", writer_factory=lambda _: recorder)
    chained: list[int] = []  # the program's own handler: the flush before it takes <= 2 s
    monkeypatch.setitem(
        manager_lib._PREVIOUS_HANDLERS, signal.SIGTERM, lambda s, _: chained.append(s)
    )
    stuck = manager.write_metrics_summary({"x": Blocking(np.float32(1.0))}, 1, 1)
    after = manager.write_metrics_summary({"y": Sum(np.float32(2.0))}, 2, 1)
    manager_lib._on_signal(signal.SIGTERM, None)
    assert chained == [signal.SIGTERM]
    with pytest.raises(MetricsManagerError, match=r"summary ran past 0.3 s, the bound while flush"):
        stuck.result(timeout=0)
    assert float(after.result(timeout=0)["y"].value) == 2.0  # the summary queued behind it
    gate.set()  # the abandoned computation ends now: its values still reach no writer
    manager._worker.threads[0].join(timeout=30)
    manager.close()
    assert [(c[0], *c[1][:1]) for c in recorder.calls] == [
        ("write_scalars", 2),
        ("flush",),
        ("close",),
    ]
    assert [(f.source, f.step, f.keys) for f in manager.errors] == [("summary", 1, ("x",))]
    assert "abandoned, and the writers get none of its values" in str(manager.errors[0])


def test_a_writer_set_aside_as_slow_in_a_signals_flush_is_back_after_it(monkeypatch, caplog):
    # A program that goes on after the signal (a caught Ctrl-C) lost the slow writer's
    # values for quarantine_s (300 s), where the README sets it aside for the flush alone.
    from metrics_manager import manager as manager_lib

    class Slow(writers.NoopWriter):
        steps: list[int] = []

        def write_scalars(self, step, scalars):
            time.sleep(0.2)
            self.steps.append(step)

    monkeypatch.setattr(manager_lib, "_SIGNAL_DEADLINE_S", 0.5)
    slow = Slow()
    with MetricsManager("t", writer_factory=lambda d: {"slow": slow}) as manager:
        monkeypatch.setitem(manager_lib._PREVIOUS_HANDLERS, signal.SIGINT, lambda s, _: None)
        for step in range(1, 9):
            manager.write_scalars(step, {"loss": float(step)})
        manager_lib._on_signal(signal.SIGINT, None)  # 0.6 s of calls: steps 4-8 set aside
        written = len(slow.steps)
        assert slow.steps == list(range(1, written + 1)) and written < 8
        assert manager.health()["writers"]["slow"]["skipped"] == 8 - written
        for step in range(9, 12):
            manager.write_scalars(step, {"loss": float(step)})
        manager.flush()
        assert manager.health()["writers"]["slow"]["quarantined"] is None
    assert slow.steps == [*range(1, written + 1), 9, 10, 11]
    (back,) = [r.getMessage() for r in caplog.records if "is back" in r.getMessage()]
    assert re.fullmatch(
        r"MetricsManager 't': writer 'slow' is back \(quarantined: slow: \d+\.\d s of calls in "
        rf"the flush on a signal; {8 - written} writes skipped\)",
        back,
    ), back


def test_a_writer_whose_writes_only_buffer_is_not_set_aside_in_a_signals_flush(monkeypatch):
    # Its flush, abandoned at the 0.3 s bound, returned mid-flush: the 0.3 s it took counted
    # toward the writer's share, and steps 4-6, which would only have been buffered, were
    # skipped and lost (and the signal's own flush too), to save no time.
    from metrics_manager import manager as manager_lib

    entered, release = threading.Event(), threading.Event()

    class Buffering(writers.NoopWriter):
        takes_overlapping_calls = True
        steps: list[int] = []

        def write_scalars(self, step, scalars):
            if step == 3:  # the abandoned flush returns, past the writer's share
                release.set()
                while manager._fanout.states["mlflow"].hurried_s < 0.3:
                    time.sleep(0.01)
            self.steps.append(step)

        def flush(self):
            if not entered.is_set():
                entered.set()
                assert release.wait(30)

    monkeypatch.setattr(manager_lib, "_SIGNAL_DEADLINE_S", 0.3)
    buffering = Buffering()
    with MetricsManager("t", writer_factory=lambda d: {"mlflow": buffering}) as manager:
        monkeypatch.setitem(manager_lib._PREVIOUS_HANDLERS, signal.SIGINT, lambda s, _: None)
        manager.write_scalars(1, {"loss": 1.0})
        with pytest.raises(TimeoutError):
            manager.flush(timeout=0.05)  # a server in retries
        assert entered.wait(10)
        for step in range(2, 7):
            manager.write_scalars(step, {"loss": float(step)})
        manager_lib._on_signal(signal.SIGINT, None)
        assert buffering.steps == [1, 2, 3, 4, 5, 6]
        health = manager.health()["writers"]["mlflow"]
        assert (health["quarantined"], health["skipped"], health["failures"]) == (None, 0, 1)


def test_a_call_begun_before_a_signal_counts_only_its_time_in_the_flush(monkeypatch):
    # Its 1.2 s before the signal counted toward the flush's 1 s bound a writer: a writer
    # that took 0.1 s of the flush was set aside, and lost steps 2 and 3.
    from metrics_manager import manager as manager_lib

    entered, release = threading.Event(), threading.Event()

    class Mount(writers.NoopWriter):
        steps: list[int] = []

        def write_scalars(self, step, scalars):
            entered.set()
            release.wait()
            self.steps.append(step)

    monkeypatch.setattr(manager_lib, "_SIGNAL_DEADLINE_S", 1.0)
    mount = Mount()
    with MetricsManager("t", writer_factory=lambda d: {"mount": mount}) as manager:
        monkeypatch.setitem(manager_lib._PREVIOUS_HANDLERS, signal.SIGINT, lambda s, _: None)
        for step in (1, 2, 3):
            manager.write_scalars(step, {"loss": float(step)})
        assert entered.wait(10)
        time.sleep(1.2)
        threading.Timer(0.1, release.set).start()  # 0.1 s into the flush
        manager_lib._on_signal(signal.SIGINT, None)
        assert mount.steps == [1, 2, 3]
        assert manager.health()["writers"]["mount"]["skipped"] == 0


def test_write_scalars_abandoned_at_a_signals_bound_names_every_key_it_loses(monkeypatch):
    # The wait for `loss` outlived the bound: the call's ready `lr` was lost with it, but the
    # failure named `loss` alone.
    from metrics_manager import manager as manager_lib
    from metrics_manager import timer as timer_lib
    from tests.writers.recording import RecordingWriter

    gate, loss = threading.Event(), jnp.float32(3.0)
    real_wait = timer_lib.block_until_ready_or_deleted

    def wait(tree: Any) -> None:
        if any(x is loss for x in jax.tree.leaves(tree)):
            assert gate.wait(timeout=30)
        real_wait(tree)

    monkeypatch.setattr(timer_lib, "block_until_ready_or_deleted", wait)
    monkeypatch.setattr(timer_lib, "settled", lambda x: x is not loss)
    monkeypatch.setattr(writers._checks, "_unready", lambda x: x is loss)
    monkeypatch.setattr(manager_lib, "_SIGNAL_DEADLINE_S", 0.3)
    recorder = RecordingWriter()
    manager = MetricsManager("train", writer_factory=lambda _: recorder)
    monkeypatch.setitem(manager_lib._PREVIOUS_HANDLERS, signal.SIGTERM, lambda s, _: None)
    manager.write_scalars(1, {"loss": loss, "lr": 0.5})
    manager_lib._on_signal(signal.SIGTERM, None)
    gate.set()
    manager._worker.threads[0].join(timeout=30)
    manager.close()
    assert [c[0] for c in recorder.calls] == ["flush", "close"]
    assert [(f.source, f.step, f.keys) for f in manager.errors] == [
        ("read scalars", 1, ("loss", "lr"))
    ]


def test_sigterm_while_another_thread_closes_waits_for_that_close(tmp_path):
    # The handler checked `closed`, then another thread's close() sealed the queue: the
    # handler's own close was refused, and the default action killed the process while the
    # writers were still closing (a W&B run never finished).
    proc = subprocess.run(
        [sys.executable, "-c", _SIGNAL_DURING_CLOSE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert (tmp_path / "closed").read_text() == "closed"
    assert "flush on signal failed" not in proc.stderr


def test_a_hanging_writer_is_abandoned_and_the_process_exits(tmp_path):
    start = time.monotonic()
    proc = run_loop("hang", str(tmp_path))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    closed_in = float(out.split("closed in ")[1].split(" s")[0])
    assert closed_in < 1.0 + 5.0  # writer_deadline_s + 5 s
    assert "writer:stuck" in out and "writer_deadline_s=1.0" in out
    steps = [line["step"] for line in read_jsonl(str(tmp_path / "train"))]
    assert steps == list(range(1, 21))  # the healthy writer got every summary
    assert time.monotonic() - start < 45


_HUNG_EVENT_FILE = r"""
import sys
import threading

import writers
from metrics_manager import MetricsManager
from writers import _records

write = _records.EventFile.write


def hanging(self, data, keep=False):  # the disk stops answering inside the fourth write
    self.writes = getattr(self, "writes", 0) + 1
    if self.writes == 4:
        with self._lock:
            threading.Event().wait()
    write(self, data, keep)


_records.EventFile.write = hanging


WRAPS = {
    "plain": lambda tb: tb,
    "async": writers.AsyncWriter,
    "multi": lambda tb: writers.MultiWriter([tb]),
    "async multi": lambda tb: writers.AsyncMultiWriter([tb]),
    "async of multi": lambda tb: writers.AsyncWriter(writers.MultiWriter([tb])),
}


def factory(logdir):
    tb = WRAPS[sys.argv[2]](writers.TensorBoardWriter(logdir))
    return {"tb": tb, "jsonl": writers.JsonlWriter(logdir)}


with MetricsManager("train", sys.argv[1], writer_factory=factory, writer_deadline_s=0.5) as m:
    for step in range(1, 6):
        m.write_scalars(step, {"loss": float(step)})
print("closed")
"""


@pytest.mark.parametrize("wrapped", ["plain", "async", "multi", "async multi", "async of multi"])
def test_a_writer_hung_holding_its_own_lock_does_not_hold_up_the_exit(tmp_path, wrapped):
    # close() returned past the deadline, then TensorBoardWriter's own close at exit waited
    # for the lock its abandoned write held: the process never ended (inside an AsyncWriter,
    # which was skipped, the TensorBoardWriter's own close still waited; inside a
    # MultiWriter given in a dict of writers, it was not even skipped).
    proc = subprocess.run(
        [sys.executable, "-c", _HUNG_EVENT_FILE, str(tmp_path), wrapped],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0 and proc.stdout == "closed\n", proc.stderr
    assert "not closed at exit: a call abandoned as hung is inside it" in proc.stderr
    assert [line["step"] for line in read_jsonl(str(tmp_path / "train"))] == [1, 2, 3, 4, 5]


def signal_loop(proc: subprocess.Popen[str], signum: int, issued: list[int]) -> str:
    """Sends `signum` and waits for the loop to end; adds the steps it issued meanwhile to
    `issued`; returns the rest of its output."""
    proc.send_signal(signum)
    try:
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()  # it ignored the signal: leave no loop running after the test
    issued += _issued(rest)
    return rest


def _issued(out: str) -> list[int]:
    """The steps of the loop's `issued <step>` lines. Run unbuffered (PYTHONUNBUFFERED=1), a
    line's newline is its own write, so a C++ log line from JAX can follow the step on it."""
    return [int(step) for step in re.findall(r"^issued (\d+)", out, re.MULTILINE)]


def wait_for_issued(proc: subprocess.Popen[str], count: int) -> list[int]:
    issued = []
    assert proc.stdout is not None
    while len(issued) < count:
        line = proc.stdout.readline()
        assert line, "the loop ended early"
        issued += _issued(line)
    return issued


@pytest.mark.parametrize("mode", ["every_step", "periodic"])
def test_sigterm_loses_no_issued_summary(tmp_path, mode):
    rng = random.Random(0)
    for kill in range(5):
        run_dir = tmp_path / str(kill)
        proc = run_loop(mode, str(run_dir), "0.2")
        issued = wait_for_issued(proc, rng.randint(3, 8))
        time.sleep(rng.uniform(0.0, 0.2))  # between flushes, at a random point
        rest = signal_loop(proc, signal.SIGTERM, issued)
        assert proc.returncode == -signal.SIGTERM, rest  # the default action still ran
        logdir = str(run_dir / "train")
        jsonl = [line["step"] for line in read_jsonl(logdir)]
        assert set(issued) <= set(jsonl), (issued, jsonl)
        assert set(issued) <= set(tb_steps(logdir))


def test_sigterm_loses_no_issued_summary_in_w_and_b(tmp_path):
    # W&B's offline run file grows in 32 KiB blocks until the run finishes, and a flush does
    # not finish it: the run file held none of 60 summaries after a SIGTERM.
    proc = run_loop("wandb", str(tmp_path), "0.2")
    issued = wait_for_issued(proc, 30)
    rest = signal_loop(proc, signal.SIGTERM, issued)
    assert proc.returncode == -signal.SIGTERM, rest
    logdir = str(tmp_path / "train")
    (run_file,) = wandb_run_files(logdir)
    assert set(issued) <= set(wandb_history(run_file)), (issued, rest)
    # Killed, not finished: exit code 143 as the process's (it was 0, a completed run).
    exits = [r.exit for r in wandb_records(run_file) if r.WhichOneof("record_type") == "exit"]
    assert [e.exit_code for e in exits] == [128 + signal.SIGTERM]
    assert set(issued) <= {line["step"] for line in read_jsonl(logdir)}


def test_sigterm_while_the_main_thread_waits_on_the_device_flushes_at_once(tmp_path):
    # Python runs a signal handler on the main thread, between bytecodes. JAX checks for
    # signals while it waits in block_until_ready, so the flush does not wait for the
    # computation (hours here) to end, nor the process for SIGKILL.
    proc = run_loop("long_call", str(tmp_path))
    issued = wait_for_issued(proc, 5)
    assert proc.stdout is not None and proc.stdout.readline() == "computing\n"
    time.sleep(0.5)
    start = time.monotonic()
    rest = signal_loop(proc, signal.SIGTERM, issued)
    assert proc.returncode == -signal.SIGTERM, rest
    assert time.monotonic() - start < 10.0, rest  # the queue takes about 4 s
    logdir = str(tmp_path / "train")
    assert [line["step"] for line in read_jsonl(logdir)] == issued == [1, 2, 3, 4, 5]
    assert tb_steps(logdir) == issued


def test_sigint_loses_no_issued_summary_and_still_raises_keyboard_interrupt(tmp_path):
    # Ctrl-C: the manager flushes, then Python's own handler raises KeyboardInterrupt in
    # the loop, which ends the program with SIGINT's usual status.
    proc = run_loop("every_step", str(tmp_path))
    issued = wait_for_issued(proc, 20)
    rest = signal_loop(proc, signal.SIGINT, issued)
    assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in rest, rest
    logdir = str(tmp_path / "train")
    assert set(issued) <= set(line["step"] for line in read_jsonl(logdir)), issued
    assert set(issued) <= set(tb_steps(logdir))


def test_sigterm_is_left_to_jaxs_preemption_service_in_a_distributed_job(tmp_path):
    # Under jax.distributed, SIGTERM belongs to JAX's preemption notifier: the loop learns of
    # it at reached_preemption_sync_point, saves and ends. Replacing that handler killed the
    # process at once (status -15) with the sync point never reached.
    proc = run_loop("preemption", str(tmp_path))
    issued = wait_for_issued(proc, 10)
    rest = signal_loop(proc, signal.SIGTERM, issued)
    assert proc.returncode == 0, rest
    assert f"sync point at {issued[-1]}" in rest and "closed" in rest, rest
    assert "SIGINT: _on_signal" in rest  # Ctrl-C still flushes
    logdir = str(tmp_path / "train")
    assert (
        [line["step"] for line in read_jsonl(logdir)] == issued == list(range(1, len(issued) + 1))
    )
    assert tb_steps(logdir) == issued


def test_sigterm_during_close_lets_close_finish_first(tmp_path):
    # Preemption at the end of training: close() is still writing 40 queued summaries
    # (a slow writer takes 0.1 s each) when SIGTERM arrives.
    proc = run_loop("close_signal", str(tmp_path))
    issued = wait_for_issued(proc, 40)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM and "closed" not in rest, rest
    logdir = str(tmp_path / "train")
    assert [line["step"] for line in read_jsonl(logdir)] == issued == list(range(1, 41))
    assert tb_steps(logdir) == issued


@pytest.mark.parametrize(
    ("mode", "returncode"), [("close_exit", 143), ("close_ctrl_c", -signal.SIGINT)]
)
def test_close_interrupted_by_an_exception_finishes_at_exit(tmp_path, mode, returncode):
    # A signal handler's sys.exit (or Ctrl-C's KeyboardInterrupt) ends close() while it waits
    # for 3 s of queued writes: the exit hook goes on writing them (16 of 30 reached disk).
    proc = run_loop(mode, str(tmp_path))
    issued = wait_for_issued(proc, 30)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == returncode and "closed" not in rest, rest
    logdir = str(tmp_path / "train")
    assert [line["step"] for line in read_jsonl(logdir)] == issued == list(range(1, 31))
    assert tb_steps(logdir) == issued
    assert "WriterClosedError" not in rest, rest


def test_a_handler_the_program_restored_between_runs_is_replaced_again(tmp_path):
    proc = run_loop("restored_handler", str(tmp_path))
    issued = wait_for_issued(proc, 10)
    rest = signal_loop(proc, signal.SIGTERM, issued)
    assert proc.returncode == -signal.SIGTERM, rest  # flushed, then the default action
    logdir = str(tmp_path / "train")
    assert set(issued) <= {line["step"] for line in read_jsonl(logdir)}, (issued, rest)
    assert set(issued) <= set(tb_steps(logdir))


_HANDLER_SCRIPT = """
import os, signal, sys, time
import writers
from metrics_manager import MetricsManager
from tests.metrics_manager.fault_loop import SlowWriter, files_and

run_dir = sys.argv[2]
if sys.argv[1] == "ignored":  # Ctrl-C ignored while a second manager is made, then restored
    first = MetricsManager("first", run_dir, writer_factory=files_and())
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
    manager = MetricsManager("train", run_dir, writer_factory=files_and())
    signal.signal(signal.SIGINT, saved)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        print("swallowed", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    manager.close()
    first.close()
elif sys.argv[1] == "opted_out":  # a manager with handle_signals=False after one without
    MetricsManager("first", run_dir, writer_factory=files_and()).close()
    slow = files_and(last={"slow": SlowWriter(0.2)})  # 6 s of writes queued
    manager = MetricsManager(
        "train", run_dir, writer_factory=slow, max_pending=100, handle_signals=False
    )
    for step in range(1, 31):
        manager.write_scalars(step, {"loss": float(step)})
    print(time.time(), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    print("survived", flush=True)
else:  # the program's handler calls the one it replaced (the first manager's)
    MetricsManager("first", run_dir, writer_factory=files_and()).close()
    saved = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: saved(signum, frame))
    slow = files_and(last={"slow": SlowWriter(0.2)})  # 6 s: past a program handler's 2 s
    manager = MetricsManager("train", run_dir, writer_factory=slow, max_pending=100)
    for step in range(1, 31):
        manager.write_scalars(step, {"loss": float(step)})
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    print("survived", flush=True)
"""


@pytest.mark.parametrize("case", ["ignored", "chained", "opted_out"])
def test_handlers_the_program_sets_around_managers_still_end_it(tmp_path, case):
    # A manager made while Ctrl-C was ignored took SIG_IGN as the handler to chain to, and
    # Ctrl-C was swallowed for good; a program's handler calling the one it saved cut the
    # signal's flush short (19 of 30 summaries). A manager made with handle_signals=False
    # was flushed anyway (6 s here) by the handler an earlier manager left installed.
    proc = subprocess.run(
        [sys.executable, "-c", _HANDLER_SCRIPT, case, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if case == "ignored":
        assert proc.returncode == 0 and proc.stdout == "interrupted\n", proc.stderr
        return
    if case == "opted_out":
        assert proc.returncode == -signal.SIGTERM and "survived" not in proc.stdout, proc.stderr
        assert time.time() - float(proc.stdout) < 2.0, proc.stderr  # the default's exit
        return
    assert proc.returncode == -signal.SIGTERM and "survived" not in proc.stdout, proc.stderr
    logdir = str(tmp_path / "train")
    assert [line["step"] for line in read_jsonl(logdir)] == list(range(1, 31))
    assert tb_steps(logdir) == list(range(1, 31))


_IGNORED_SCRIPT = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a background job
import jax.numpy as jnp
from metrics_manager import MetricsManager, Sum
from tests.metrics_manager.fault_loop import files_and

manager = MetricsManager("train", sys.argv[1], writer_factory=files_and())
for step in range(1, 6):
    manager.write_metrics_summary({"loss": Sum(jnp.float32(step))}, step, 1)
child = "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout)
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.5)
manager.close()
print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN, flush=True)
"""


def test_a_signal_the_program_ignores_stays_ignored_in_the_programs_it_starts(tmp_path):
    # A shell starts a background job (`python train.py &`) with Ctrl-C ignored. The manager's
    # handler took its place, which `exec` resets to the default: a program the run started
    # afterwards (a spawned data worker) died on the Ctrl-C the run itself ignored.
    proc = subprocess.run(
        [sys.executable, "-c", _IGNORED_SCRIPT, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.split() == ["True", "True"], proc.stderr
    logdir = str(tmp_path / "train")
    assert [line["step"] for line in read_jsonl(logdir)] == list(range(1, 6))
    assert tb_steps(logdir) == list(range(1, 6))


_HANDLER_CLOSES_SCRIPT = """
import signal, sys
import jax.numpy as jnp
from metrics_manager import MetricsManager, Sum
from tests.metrics_manager.fault_loop import SlowWriter, files_and

manager = MetricsManager(
    "train", sys.argv[1], writer_factory=files_and(last={"slow": SlowWriter(1.0)}), max_pending=2
)

def on_sigterm(signum, frame):  # the program's own: close the metrics, then stop
    manager.close()
    print("closed by the handler", flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, on_sigterm)
for step in range(1, 6):
    manager.write_metrics_summary({"loss": Sum(jnp.float32(step))}, step, 1)
print("closing", flush=True)
manager.close()  # waits about 1 s for a queue slot for its close: the signal comes then
"""


def test_a_signal_handler_closing_the_manager_during_close_closes_it(tmp_path):
    # The handler's close() ran on the main thread, which held the close lock while its own
    # close() waited for a queue slot: the handler waited forever, and so did the process.
    proc, out = signal_after(
        _HANDLER_CLOSES_SCRIPT, [str(tmp_path)], "closing\n", signal.SIGTERM, timeout=30, cwd=ROOT
    )
    assert proc.returncode == 0 and out == "closed by the handler\n", out
    logdir = str(tmp_path / "train")
    assert [line["step"] for line in read_jsonl(logdir)] == list(range(1, 6))
    assert tb_steps(logdir) == list(range(1, 6))


_CLOSE_WAITING_SCRIPT = """
import os, sys
import jax.numpy as jnp
from metrics_manager import MetricsManager, Sum
from tests.metrics_manager.fault_loop import CloseRecorder, SlowWriter, files_and

closed_by = os.path.join(sys.argv[1], "closed_by")
factory = files_and(first={"slow": SlowWriter(1.0)}, last={"recorder": CloseRecorder(closed_by)})
manager = MetricsManager("train", sys.argv[1], writer_factory=factory, max_pending=2)
for step in range(1, 6):
    manager.write_metrics_summary({"loss": Sum(jnp.float32(step))}, step, 1)
print("closing", flush=True)
manager.close()  # waits about 1 s for a queue slot for its close: the signal comes then
print("closed", flush=True)
"""


def test_sigterm_while_close_waits_for_a_queue_slot_still_closes_the_writers(tmp_path):
    # The signal's flush took the manager for closing and only drained the queue: the close
    # job, not queued yet, never ran, and no writer was closed before the kill (a W&B run
    # left unfinished, a gs:// log not uploaded).
    proc, out = signal_after(
        _CLOSE_WAITING_SCRIPT, [str(tmp_path)], "closing\n", signal.SIGTERM, cwd=ROOT
    )
    assert proc.returncode == -signal.SIGTERM and out == "", out
    assert (tmp_path / "closed_by").read_text() == f"{proc.pid}\n"
    logdir = str(tmp_path / "train")
    assert [line["step"] for line in read_jsonl(logdir)] == list(range(1, 6))
    assert tb_steps(logdir) == list(range(1, 6))


def test_close_from_two_threads_at_once_closes_each_writer_once(tmp_path):
    class Counting(writers.NoopWriter):
        closes = 0

        def write_scalars(self, step, scalars):
            time.sleep(0.01)

        def close(self):
            Counting.closes += 1

    for trial in range(5):
        Counting.closes = 0
        manager = MetricsManager(
            f"t{trial}", tmp_path, writer_factory=lambda d: Counting(), max_pending=4
        )
        for step in range(1, 21):
            manager.write_scalars(step, {"loss": 1.0})
        other = threading.Thread(target=manager.close)
        other.start()
        manager.close()
        other.join(30)
        assert Counting.closes == 1, trial


def test_sigterm_chains_to_the_programs_own_handler_within_2_s_with_a_hung_writer(tmp_path):
    # The program's own handler (installed before the manager) sets a flag that stops its
    # loop, which would save a checkpoint: it must get the grace period, not wait out the
    # manager's flush behind a hung writer (10 s); close() then writes every summary.
    proc = run_loop("own_handler", str(tmp_path))
    issued = wait_for_issued(proc, 17)  # 1 running + max_pending (16): the loop now blocks
    time.sleep(0.5)
    signalled = time.monotonic()
    rest = signal_loop(proc, signal.SIGTERM, issued)
    assert proc.returncode == 0, rest  # the program's handler decided: it ended normally
    handled = float(rest.split("own handler ran at ")[1].split()[0])
    assert 0 < handled - signalled < 4.0, rest  # the flush before it took at most 2 s
    assert "ran past 2.0 s, the bound while flushing on a signal" in rest
    logdir = str(tmp_path / "train")
    assert (
        [line["step"] for line in read_jsonl(logdir)] == issued == list(range(1, len(issued) + 1))
    )
    assert tb_steps(logdir) == issued


def test_sigterm_on_cloud_storage_loses_no_issued_summary(tmp_path):
    # Preemption of a run whose summary_dir is a gs:// URL (the GCS emulator): what waits in
    # memory for the next timed upload is uploaded by the signal's flush.
    from tests import storage_servers

    server = storage_servers.GcsServer()
    run = f"gs://{storage_servers.BUCKET}/preempted"
    proc = run_loop("every_step", run, env=dict(os.environ, **server.environment()))
    issued = wait_for_issued(proc, 50)
    rest = signal_loop(proc, signal.SIGTERM, issued)
    assert proc.returncode == -signal.SIGTERM, rest
    try:
        with storage_servers.serving(server, "gs"):
            jsonl = [line["step"] for line in writers.read_jsonl(f"{run}/train/metrics.jsonl")]
            storage_servers.copy_event_files(f"{run}/train", str(tmp_path))
    finally:
        server.stop()
    assert set(issued) <= set(jsonl) and len(issued) >= 50, (issued, jsonl)
    assert set(issued) <= set(tb_steps(str(tmp_path)))


@pytest.mark.parametrize(
    "mode, seconds, message, repeats",
    [
        # The hung writer is first in every job, so every other write waits behind it; its
        # deadline (60 s) is past the usual 30 s grace period, so the signal's flush bounds it.
        (
            "hang_signal",
            (10.0, 20.0),
            "writer 'stuck' ran past 10.0 s, the bound while flushing",
            1,
        ),
        # With no deadline at all the same: the process never ended, its queue full behind the
        # hung call, and the handler's own flush waiting for a slot in it.
        (
            "hang_no_deadline",
            (10.0, 20.0),
            "writer 'stuck' ran past 10.0 s, the bound while flushing",
            1,
        ),
        # No call of the 3 s writer reaches that bound, yet its 17 queued calls take 51 s: it
        # held 8 of 17 summaries from the others past the 25 s flush. It is now set aside once
        # its calls have taken 10 s of the flush (4 of 3 s), then the queue drains at once.
        ("slow_signal", (9.0, 16.0), "bound 10 s a writer): its remaining calls are skipped", 1),
        # A scheduler repeating SIGTERM (every 4 s here) keeps the first one's bounds: each
        # repeat restarted both, and the process ended past 20 s, after a 30 s grace's kill.
        ("slow_signal", (9.0, 16.0), "bound 10 s a writer): its remaining calls are skipped", 3),
    ],
)
def test_sigterm_with_a_hung_or_slow_writer_writes_every_issued_summary_to_the_others(
    tmp_path, mode, seconds, message, repeats
):
    proc = run_loop(mode, str(tmp_path))
    issued = wait_for_issued(proc, 17)  # 1 running + max_pending (16): the loop now blocks
    time.sleep(0.5)
    signalled = time.monotonic()
    for repeat in range(repeats):
        time.sleep(4.0 if repeat else 0.0)
        proc.send_signal(signal.SIGTERM)
    try:
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()  # it never ended: leave no loop running after the test
            proc.communicate()
    waited = time.monotonic() - signalled
    issued += _issued(rest)
    assert proc.returncode == -signal.SIGTERM, rest
    assert seconds[0] <= waited < seconds[1], rest
    assert message in rest
    logdir = str(tmp_path / "train")
    assert [line["step"] for line in read_jsonl(logdir)] == issued == list(range(1, 18))
    assert tb_steps(logdir) == issued


def test_sigkill_leaves_readable_files_and_loses_at_most_the_queue(tmp_path):
    proc = run_loop("every_step", str(tmp_path))
    issued = wait_for_issued(proc, 30)
    proc.kill()
    proc.communicate(timeout=60)
    logdir = str(tmp_path / "train")
    jsonl = [line["step"] for line in read_jsonl(logdir)]
    tb = tb_steps(logdir)
    # Documented bound: the summaries queued or running when the kill came (max_pending + 1).
    assert len(set(issued) - set(jsonl)) <= 17 and len(set(issued) - set(tb)) <= 17
    assert tb == sorted(tb) and jsonl == sorted(jsonl)


def test_a_manager_never_closed_writes_every_summary_and_the_process_exits_0(tmp_path):
    proc = run_loop("unclosed", str(tmp_path))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out  # not an abort from the worker thread inside JAX
    logdir = str(tmp_path / "train")
    assert [line["step"] for line in read_jsonl(logdir)] == list(range(1, 51))
    assert tb_steps(logdir) == list(range(1, 51))


def _two_processes(tmp_path, mode: str) -> list[str]:
    """Runs `mode` of fault_loop as two `jax.distributed` processes; their outputs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "COORDINATOR": f"127.0.0.1:{port}",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    }
    procs = [run_loop(mode, str(tmp_path), str(i), env=env) for i in range(2)]
    outs = []
    deadline = time.monotonic() + 90
    for proc in procs:
        try:
            outs.append(proc.communicate(timeout=max(1, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
                p.communicate()
            pytest.fail("a process hung")
    assert [p.returncode for p in procs] == [0, 0], outs
    return outs


def test_a_writer_failing_on_process_0_does_not_hang_process_1(tmp_path):
    outs = _two_processes(tmp_path, "multiprocess")
    # 4 devices hold 1 each: step s sums 4 * s; process 0 logged 10 failures, process 1 none.
    assert "process 0 done loss=40.0 errors=10" in outs[0]
    assert "process 1 done loss=40.0 errors=0" in outs[1]
    assert [line["loss"] for line in read_jsonl(str(tmp_path / "train"))] == [
        4.0 * s for s in range(1, 11)
    ]


def test_a_key_a_writer_reserves_is_left_out_on_every_process_alike(tmp_path):
    """Two processes write `step` (a metric) and `time` (a scalar), which JSONL keeps for its
    own fields. Refused at the call on process 0 alone (the only one with writers), process 0
    stopped and process 1 waited in its next collective."""
    outs = _two_processes(tmp_path, "multiprocess_refused")
    assert "process 0 done loss=40.0 errors=2" in outs[0]  # one failure per key, not per call
    assert "process 1 done loss=40.0 errors=0" in outs[1]
    for key, writer in (("step", "jsonl"), ("time", "jsonl")):
        assert f"keys ['{key}'] are reserved by writer(s) ['{writer}']" in outs[0]
    assert "With several processes the key is left out of every write instead" in outs[0]
    logdir = str(tmp_path / "train")
    lines = read_jsonl(logdir)
    summaries = [line for line in lines if "loss" in line]
    # The line's own step, not the metric's 100 * s.
    assert [(line["step"], line["loss"]) for line in summaries] == [
        (s, 4.0 * s) for s in range(1, 11)
    ]
    scalars = [line for line in lines if "lr" in line]
    assert [(line["step"], line["lr"]) for line in scalars] == [(s, 0.1) for s in range(1, 11)]
    assert all(line["time"] > 1e9 for line in lines)  # JSONL's wall time, not the 1.0 written
    tags = read_tensorboard(logdir).Tags()
    assert "step" not in tags["tensors"] + tags["scalars"]  # left out of every writer alike
    assert tb_steps(logdir, "lr") == list(range(1, 11))


@pytest.mark.parametrize("process", [0, 1])
def test_bad_values_under_a_reserved_key_are_refused_on_every_process_alike(
    tmp_path, monkeypatch, process
):
    # Process 0 left `step` out before checking its value, so it accepted these calls while
    # process 1, which has no writers, refused them: one process stopped, the other waited.
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: process)
    refused = []
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        for call in (
            lambda: manager.write_scalars(1, {"step": "abc", "loss": 1.0}),
            lambda: manager.write_images(1, {"step": np.ones(3)}),
            lambda: manager.write_texts(1, {"step": 5}),
        ):
            with pytest.raises((TypeError, ValueError)) as err:
                call()
            refused.append(str(err.value).split(":")[1].strip())
        # Buckets for the left-out key: not "a key no array of the call has" on process 0.
        arrays = {"step": np.arange(5.0), "h": np.arange(3.0)}
        manager.write_histograms(2, arrays, num_buckets={"step": 4, "h": 3})
    assert refused == [
        "scalar 'step' must be a number, got 'abc' of type str. Write strings with write_texts.",
        "image 'step' must have shape [H, W, C] or [N, H, W, C] with C in (1, 3, 4), got shape "
        "(3,).",
        "text 'step' must be a str, got int 5; convert with str(), or write numbers with "
        "write_scalars",
    ]
    if process == 0:
        (line,) = read_jsonl(str(tmp_path / "train"))
        assert (line["step"], line["h"]["count"], line["h"]["counts"]) == (2, 3, [1, 1, 1])


@pytest.mark.parametrize("process", [0, 1])
def test_a_left_out_key_whose_value_no_writer_takes_stops_every_process_alike(
    tmp_path, monkeypatch, process
):
    # A metric named `step` (JSONL's own field) giving a vector. Process 1 (no writers, nothing
    # left out) recorded it unwritable at each summary, fatal under "raise"; process 0 only
    # recorded the refusal, not fatal: process 1 stopped at step 2, process 0 went on to wait.
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: process)
    factory = files_and()
    manager = MetricsManager("train", tmp_path, writer_factory=factory, on_error="raise")
    raised = []
    for step in (1, 2, 3):
        metrics = {"loss": Sum(jnp.float32(step)), "step": PerClass(jnp.float32(1))}
        manager.write_metrics_summary(metrics, step, 1)
        with pytest.raises(MetricsManagerError) as err:
            manager.flush()
        raised.append(
            f"at step {step} (keys step): TypeError: write_values: unsupported" in str(err.value)
        )
    manager.close()
    assert raised == [True, True, True]
    failures = [(f.source, f.step, type(f.error)) for f in manager.errors]
    unwritable = [("metric:step", s, TypeError) for s in (1, 2, 3)]
    if process == 1:
        assert failures == unwritable
        return
    assert failures == [("metric:step", 1, ValueError), *unwritable]  # reserved, once
    lines = read_jsonl(str(tmp_path / "train"))
    assert [(line["step"], line["loss"]) for line in lines] == [(1, 1.0), (2, 2.0), (3, 3.0)]


def test_a_left_out_metric_computing_a_histogram_is_left_out_of_the_histograms(
    tmp_path, monkeypatch
):
    # A metric named `step` computing a histogram was left out of the scalars alone (the
    # kind the call takes a metric for): JSONL refused each summary's write_histograms
    # whole, and lost the other metric's histogram 'h' at every step, a writer failure each.
    @flax.struct.dataclass
    class Spread(Sum):
        def compute_value(self):
            return clu.values.Histogram(self.total + np.arange(4.0), 3)

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        for step in (1, 2):
            metrics = {"step": Spread(np.float32(0.0)), "h": Spread(np.float32(step))}
            manager.write_metrics_summary({**metrics, "loss": Sum(np.float32(step))}, step, 1)
        manager.flush()
        assert manager.health()["writers"]["jsonl"]["failures"] == 0
    lines = read_jsonl(str(tmp_path / "train"))
    assert [(x["step"], x.get("loss"), x.get("h", {}).get("min")) for x in lines] == [
        (1, 1.0, None),
        (1, None, 1.0),
        (2, 2.0, None),
        (2, None, 2.0),
    ]
    # Once per key and kind: as a scalar at the call, as a histogram at the first summary.
    assert [(f.source, f.step) for f in manager.errors] == [("metric:step", 1)] * 2


def test_a_metric_computing_a_histogram_under_a_key_mlflow_refuses_as_a_path(tmp_path, monkeypatch):
    # 'a/ b' is a fine MLflow metric name, so the call took it (metrics are checked as
    # scalars), but no artifact path: MLflow refused each summary's write_histograms whole,
    # losing the histogram 'h' at steps 1 and 2, a writer failure each toward quarantine.
    from tests.writers.tracker_stores import sqlite_store

    @flax.struct.dataclass
    class Spread(Sum):
        def compute_value(self):
            return clu.values.Histogram(self.total + np.arange(4.0), 3)

    monkeypatch.chdir(tmp_path)  # the store's artifacts: ./mlruns
    url = sqlite_store(str(tmp_path / "mlflow"))
    factory = _jsonl_and_mlflow({}, lambda: url, "computed", flush_secs=60.0)
    with MetricsManager("train", tmp_path, writer_factory=factory) as manager:
        for step in (1, 2):
            metrics = {"a/ b": Spread(np.float32(0.0)), "h": Spread(np.float32(step))}
            manager.write_metrics_summary({**metrics, "loss": Sum(np.float32(step))}, step, 1)
        manager.flush()
        assert manager.health()["writers"]["mlflow"]["failures"] == 0
    found = sorted(
        p.relative_to(tmp_path / "mlruns").parts[4:]
        for p in tmp_path.glob("mlruns/*/*/artifacts/histograms/*/*")
    )
    assert found == [("h", "step_00000001.json"), ("h", "step_00000002.json")]
    # Left out of every writer's histograms, as a key refused at the call is.
    lines = read_jsonl(str(tmp_path / "train"))
    assert [(x["step"], x.get("loss"), x.get("h", {}).get("min")) for x in lines] == [
        (1, 1.0, None),
        (1, None, 1.0),
        (2, 2.0, None),
        (2, None, 2.0),
    ]
    assert not any("a/ b" in x for x in lines)
    (failure,) = manager.errors  # once, at the first summary
    assert (failure.source, failure.step) == ("metric:a/ b", 1)
    assert "histograms/<key>" in str(failure) and "left out of these writes" in str(failure)


def test_a_computed_histogram_under_a_refused_key_fails_its_summary_under_raise(tmp_path):
    # One process, on_error="raise": a metric computing a histogram under a key a writer
    # refuses as a histogram was left out and logged, but the summary's future held it and
    # the run went on, where a NaN histogram (a value no writer takes) fails both.
    @flax.struct.dataclass
    class Spread(Sum):
        def compute_value(self):
            return clu.values.Histogram(self.total + np.arange(4.0), 3)

    class Picky(writers.JsonlWriter):
        def key_problem(self, method, keys):
            bad = [k for k in keys if k.startswith("bad") and method == "write_histograms"]
            return f"refuses the histograms {bad}" if bad else None

    manager = MetricsManager("train", tmp_path, writer_factory=Picky, on_error="raise")
    metrics = {"bad": Spread(np.float32(0.0)), "h": Spread(np.float32(1.0))}
    future = manager.write_metrics_summary({**metrics, "loss": Sum(np.float32(1.0))}, 1, 1)
    with pytest.raises(MetricsManagerError, match=r"metric:bad at step 1 .*refuses the histog"):
        future.result()
    with pytest.raises(MetricsManagerError, match="metric:bad at step 1"):
        manager.flush()
    manager.close()
    assert [(f.source, f.step) for f in manager.errors] == [("metric:bad", 1)]
    lines = read_jsonl(str(tmp_path / "train"))  # the other keys still written
    assert [(x["step"], x.get("loss"), x.get("h", {}).get("min")) for x in lines] == [
        (1, 1.0, None),
        (1, None, 1.0),
    ]


def test_a_key_left_out_of_scalars_is_still_written_as_a_hyperparameter(tmp_path, monkeypatch):
    # JSONL keeps `time` for its lines' wall time, but takes it as a hyperparameter: with
    # several processes, a scalar `time` left the config's `time` out of every later write.
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        manager.write_scalars(1, {"time": 1.0, "lr": 0.1})
        manager.write_hparams({"time": 3, "lr": 0.1})
        manager.write_metrics_summary({"time": clu.values.HyperParam(4), "loss": Sum(2.0)}, 2, 1)
    lines = read_jsonl(str(tmp_path / "train"))
    assert [(x["step"], x.get("lr"), x.get("loss"), x.get("hparams")) for x in lines] == [
        (1, 0.1, None, None),
        (None, None, None, {"time": 3, "lr": 0.1}),
        (2, None, 2.0, None),
        (None, None, None, {"time": 4}),  # a summary's hyperparameter: no step either
    ]
    assert [f.source for f in manager.errors] == ["metric:time"]  # the scalar alone


def test_a_hyperparameter_name_left_out_is_recorded_without_a_step(monkeypatch):
    # write_hparams has no step, but its refused name was recorded "at step 0".
    from tests.writers.recording import RecordingWriter

    class Refusing(RecordingWriter):  # as W&B refuses the hyperparameter '_wandb'
        def key_problem(self, method, keys):
            return "'_wandb' is W&B's own" if "_wandb" in keys else None

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with MetricsManager("t", writer_factory=lambda d: Refusing()) as manager:
        manager.write_hparams({"_wandb": 1, "lr": 0.1})
    assert manager.writer.calls[0] == ("write_hparams", ({"lr": 0.1},), {})
    (failure,) = manager.errors
    assert (failure.source, failure.step) == ("metric:_wandb", None)
    assert str(failure).startswith("metric:_wandb (keys _wandb): ValueError: Refusing: '_wandb'")


def test_a_key_mlflow_refuses_as_a_metric_is_still_written_as_a_text(tmp_path, monkeypatch):
    # 'acc@1' is no MLflow metric name, but a fine artifact path: with several processes the
    # scalar was left out, and so were the texts under that key (every writer's, no failure).
    from tests.writers.tracker_stores import sqlite_store

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    url = sqlite_store(str(tmp_path / "mlflow"))
    factory = _jsonl_and_mlflow({}, lambda: url, "refused", flush_secs=60.0)
    with MetricsManager("train", tmp_path, writer_factory=factory) as manager:
        manager.write_scalars(1, {"acc@1": 0.5, "loss": 2.0})
        manager.write_texts(2, {"acc@1": "a text"})
        summary = {"acc@1": clu.values.Text("in a summary"), "loss": Sum(3.0)}
        manager.write_metrics_summary(summary, 3, 1)
    lines = read_jsonl(str(tmp_path / "train"))
    assert [(x["step"], x.get("acc@1"), x.get("loss")) for x in lines] == [
        (1, None, 2.0),
        (2, "a text", None),
        (3, None, 3.0),
        (3, "in a summary", None),
    ]
    assert [(f.source, f.step) for f in manager.errors] == [("metric:acc@1", 1)]


@pytest.mark.parametrize("processes", [1, 2])
def test_keys_a_summary_writes_under_a_metric_are_checked_as_written(
    tmp_path, monkeypatch, processes
):
    # The metric keys were checked, not the keys written: a Collection 'acc@1' writes
    # 'acc@1/loss', and a MeanStd under 248 characters writes its '/std' past MLflow's 250.
    # In one process the MeanStd passed the call; with several, both were sent to MLflow,
    # which refused each summary's scalars whole (loss too), a failure toward quarantine.
    from tests.writers.tracker_stores import sqlite_store

    monkeypatch.setattr(jax, "process_count", lambda: processes)
    url = sqlite_store(str(tmp_path / "mlflow"))
    factory = _jsonl_and_mlflow({}, lambda: url, "written", flush_secs=60.0)
    long_key = "k" * 248
    accuracy = clu_metrics.Collection.create(loss=clu_metrics.Average)
    with MetricsManager("train", tmp_path, writer_factory=factory) as manager:
        for step in (1, 2):
            summary = {
                "acc@1": accuracy.single_from_model_output(values=np.array([2.0])),
                long_key: MeanStd.from_model_output(np.array([1.0, 3.0], np.float32)),
                "loss": Sum(np.float32(step)),
            }
            if processes == 1:
                with pytest.raises(ValueError) as raised:
                    manager.write_metrics_summary(summary, step, 1)
                assert f"'{long_key}/std'" in str(raised.value)
                assert "'acc@1/loss'" in str(raised.value)
            else:
                manager.write_metrics_summary(summary, step, 1)
        manager.flush()
        failures = manager.health()["writers"]["mlflow"]["failures"]
    lines = read_jsonl(str(tmp_path / "train"))
    if processes == 1:
        assert lines == []
        return
    assert failures == 0
    assert [(x["step"], x["loss"], x[long_key], "acc@1/loss" in x) for x in lines] == [
        (1, 1.0, 2.0, False),
        (2, 2.0, 2.0, False),
    ]
    assert [(f.source, f.step) for f in manager.errors] == [
        ("metric:acc@1/loss", 1),
        (f"metric:{long_key}/std", 1),
    ]


@pytest.mark.parametrize("process", [0, 1])
def test_a_reserved_key_with_several_processes_is_not_raised_under_raise(
    tmp_path, monkeypatch, process
):
    # Under on_error="raise" the key left out was recorded as fatal: process 0 raised at the
    # call ("process 0 alone raising left the others waiting", its message said), process 1
    # went on to wait for it.
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: process)
    factory = lambda d: writers.JsonlWriter(d)  # noqa: E731
    with MetricsManager("train", tmp_path, writer_factory=factory, on_error="raise") as manager:
        manager.write_scalars(1, {"step": 1.0, "a": 1.0})
        manager.write_metrics_summary({"time": Sum(np.float32(2.0)), "loss": Sum(3.0)}, 2, 1)
        manager.write_scalars(3, {"a": 3.0})
        manager.flush()
    if process == 1:
        assert not os.path.exists(tmp_path / "train") and manager.errors == []
        return
    lines = read_jsonl(str(tmp_path / "train"))
    assert [(x["step"], x.get("a"), x.get("loss")) for x in lines] == [
        (1, 1.0, None),
        (2, None, 3.0),
        (3, 3.0, None),
    ]
    assert [(f.source, f.step) for f in manager.errors] == [("metric:step", 1), ("metric:time", 2)]


@pytest.mark.parametrize("process", [0, 1])
def test_a_key_refused_while_a_summary_computes_does_not_fail_that_summary(
    tmp_path, monkeypatch, process
):
    # Under "raise" a summary's future failed when any failure was recorded while it was
    # computed: a key refused meanwhile at a call on the loop's thread, which process 0 alone
    # records, failed process 0's summary ("summary at step 2: metric:step ...") and not
    # process 1's, and a loop reading the result raised on process 0 alone.
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: process)
    computing, go_on = threading.Event(), threading.Event()

    @flax.struct.dataclass
    class Gated(Sum):
        def compute_value(self):
            computing.set()
            go_on.wait(10)
            return super().compute_value()

    factory = lambda d: writers.JsonlWriter(d)  # noqa: E731
    with MetricsManager("train", tmp_path, writer_factory=factory, on_error="raise") as manager:
        future = manager.write_metrics_summary({"loss": Gated(np.float32(2.0))}, 1, 1)
        assert computing.wait(10)
        manager.write_scalars(2, {"step": 1.0, "a": 3.0})
        go_on.set()
        assert float(future.result()["loss"].value) == 2.0
    assert [(f.source, f.step) for f in manager.errors] == [("metric:step", 2)] * (process == 0)


def test_a_reserved_key_with_several_processes_is_one_failure_per_kind_of_write(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        for step in (1, 2):
            manager.write_scalars(step, {"step": 1.0, "a": 1.0})
        for step in (3, 4):
            manager.write_texts(step, {"step": "x", "b": "y"})
        manager.write_histograms(5, {"step": np.arange(3.0)})
    lines = read_jsonl(str(tmp_path / "train"))
    assert [(x["step"], x.get("a"), x.get("b")) for x in lines] == [
        (1, 1.0, None),
        (2, 1.0, None),
        (3, None, "y"),
        (4, None, "y"),
    ]
    assert [(f.source, f.step) for f in manager.errors] == [
        ("metric:step", 1),
        ("metric:step", 3),
        ("metric:step", 5),
    ]


# --------------------------------------------------------------- bad input at the call

GOOD = {"loss": Sum(np.float32(1.0))}


def _per_device(pack: bool) -> Any:
    """A window per device, as a `jax.pmap` step returns it (each device's sum is 2)."""
    step = jax.pmap(lambda x: merge_metrics(None, {"loss": Sum(x.sum())}, pack=pack))
    return step(jnp.ones((jax.local_device_count(), 2)))


class _Undecorated(Sum):  # a subclass without its own @flax.struct.dataclass: no pytree
    pass


class _NoFloat(fractions.Fraction):
    """A `numbers.Real` whose float() raises, as a program's own number type's can."""

    def __float__(self) -> float:
        return float(1 / 0)


def _holding_itself() -> dict[str, Any]:
    """A config with a loop, as `config["parent"] = config` makes one."""
    config: dict[str, Any] = {"lr": 0.1}
    config["parent"] = config
    return config


class _NoText:
    """A value whose str() (or only repr()) fails, as an object's own __str__ can."""

    def __init__(self, fails: Any = str) -> None:
        self.fails = fails

    def __str__(self) -> str:
        return str(1 / 0) if self.fails is str else "ok"

    def __repr__(self) -> Any:
        return 1 if self.fails is repr else "ok"


@flax.struct.dataclass
class _ComputesNoNumber(clu_metrics.Metric):
    """A metric whose compute() returns None, a dict or a list (`kind`), not a number."""

    total: jax.Array
    kind: str = flax.struct.field(pytree_node=False, default="none")

    def merge(self, other: _ComputesNoNumber) -> _ComputesNoNumber:
        return other

    def compute(self) -> Any:
        return {"none": None, "dict": {"a": self.total, "b": self.total}}.get(
            self.kind, [self.total, self.total]
        )


BAD_CALLS: dict[str, tuple[Any, type[Exception], str]] = {
    "metric subclass not a pytree": (  # the worker's copy failed, and the whole summary
        lambda m: m.write_metrics_summary({"n": _Undecorated(jnp.float32(1))}, 1, 1),
        TypeError,
        r"metrics 'n' \(_Undecorated\) are not pytrees.*@flax.struct.dataclass",
    ),
    "string scalar": (lambda m: m.write_scalar("x", "abc", 1), TypeError, "'x'.*must be a number"),
    "a ready int of 5,000 digits": (
        lambda m: m.write_metrics_summary({"n": clu.values.Scalar(-(10**5000))}, 1, 1),
        ValueError,
        r"scalar 'n' is an int of more than 4300 digits",
    ),
    # Each text writer failed in the background with CPython's int-to-str limit, naming
    # no key (an int of 400 digits is written: exact in JSONL, inf in TensorBoard).
    "an int of 5,000 digits": (
        lambda m: m.write_scalars(1, {"x": 10**5000}),
        ValueError,
        r"scalar 'x' is an int of more than 4300 digits, which Python refuses to write as "
        r"text .* Pass float\(value\) \(inf past 1.8e308",
    ),
    # JSONL failed naming 'hparam' as a scalar, TensorBoard with CPython's message, no key.
    "an hparam int of 5,000 digits": (
        lambda m: m.write_hparams({"opt": {"seed": 10**5000}}),
        ValueError,
        r"hyperparameter 'opt.seed' is an int of more than 4300 digits, which Python refuses",
    ),
    # In a list, as the writers write it (its str()), both failed in the background: every
    # hyperparameter of the call was lost, with CPython's message naming no key.
    "an hparam list holding an int of 5,000 digits": (
        lambda m: m.write_hparams({"seeds": [1, (2, 10**5000)], "lr": 0.1}),
        ValueError,
        r"hyperparameter 'seeds' holds an int of more than 4300 digits, which Python refuses",
    ),
    # A Fraction (written as 'numerator/denominator') and a NumPy object array of such an
    # int: every writer failed in the background, naming no key, and lost the call's 'lr'.
    "an hparam Fraction of 5,000-digit terms": (
        lambda m: m.write_hparams({"ratio": fractions.Fraction(10**5000 + 1, 10**5000)}),
        ValueError,
        r"hyperparameter 'ratio' holds an int of more than 4300 digits, which Python refuses",
    ),
    "an hparam object array holding an int of 5,000 digits": (
        lambda m: m.write_hparams({"seeds": np.array([1, 10**5000], object), "lr": 0.1}),
        ValueError,
        r"hyperparameter 'seeds' holds an int of more than 4300 digits, which Python refuses",
    ),
    # Each writer takes its str() or repr(): every one failed in the background, naming no
    # key, and lost the call's 'lr' too.
    "an hparam whose str() raises": (
        lambda m: m.write_hparams({"h": _NoText(), "lr": 0.1}),
        ValueError,
        r"hyperparameter 'h' \(_NoText\) cannot be turned into text, as the writers write "
        r"it: str\(\) raised ZeroDivisionError: division by zero",
    ),
    "an hparam whose repr() is no str": (
        lambda m: m.write_hparams({"opt": {"h": _NoText(repr)}}),
        TypeError,
        r"hyperparameter 'opt.h' \(_NoText\) .* repr\(\) raised TypeError: __repr__ returned",
    ),
    # Flattened without end: a bare RecursionError naming no key.
    "an hparam config that holds itself": (
        lambda m: m.write_hparams({"opt": _holding_itself(), "seed": 1}),
        ValueError,
        r"write_hparams: hyperparameter 'opt.parent' is a config that holds itself \(a "
        r"cycle\), which has no end to flatten into names; pass a copy without the loop$",
    ),
    "a T5X Sum built on a vector": (  # its key was dropped on the worker
        lambda m: m.write_metrics_summary({"n": Sum(jnp.ones(3)), "ok": Sum(jnp.ones(()))}, 1, 1),
        ValueError,
        r"metrics \['n'\] compute arrays of shapes \[\(3,\)\], not scalars; reduce them in "
        r"the step \(Sum.from_model_output\(x\) sums every element of x\)",
    ),
    "a Sum of complex values": (  # its key was left out of every summary on the worker
        lambda m: m.write_metrics_summary(
            {"z": Sum.from_model_output(jnp.array([1j, 2.0])), "ok": Sum(jnp.ones(()))}, 1, 1
        ),
        TypeError,
        r"metrics \['z'\] compute complex numbers, which no writer stores; make them from real "
        r"values in the step \(abs\(x\) or x\.real\)$",
    ),
    "a T5X Sum built on a vector, packed": (  # the README loop's window: dropped on the worker
        lambda m: m.write_metrics_summary(
            merge_metrics(None, {"n": Sum(jnp.ones(3)), "ok": Sum(jnp.ones(()))}, pack=True), 1, 1
        ),
        ValueError,
        r"metrics \['n'\] compute arrays of shapes \[\(3,\)\], not scalars",
    ),
    # Accepted at the call, then the worker dropped the key ("unsupported value types").
    "a metric computing None": (
        lambda m: m.write_metrics_summary({"c": _ComputesNoNumber(jnp.float32(1))}, 1, 1),
        TypeError,
        r"write_metrics_summary: compute\(\) of metrics 'c' \(None\) returns no number, which "
        r"no writer stores; return a scalar array from it, and write several values as several "
        r"metrics \(one key each\)$",
    ),
    "a metric computing a dict": (
        lambda m: m.write_metrics_summary(
            {"loss": Sum(1.0), "c": _ComputesNoNumber(jnp.float32(1), "dict")}, 1, 1
        ),
        TypeError,
        r"compute\(\) of metrics 'c' \(a dict with keys \['a', 'b'\]\) returns no number.*"
        r"return a scalar array from it, and write several values as several metrics",
    ),
    "a metric computing a list, packed": (
        lambda m: m.write_metrics_summary(
            merge_metrics(None, {"c": _ComputesNoNumber(jnp.float32(1), "list")}, pack=True),
            1,
            1,
        ),
        TypeError,
        r"compute\(\) of metrics 'c' \(a list of 2 values\) returns no number.*return a "
        r"scalar array",
    ),
    "a key a packed MeanStd writes too": (  # the worker dropped the user's own 'x/std'
        lambda m: m.write_metrics_summary(
            merge_metrics(
                None,
                {"x": MeanStd.from_model_output(jnp.ones(3)), "x/std": Sum(jnp.ones(()))},
                pack=True,
            ),
            1,
            1,
        ),
        ValueError,
        r"keys \['x/std'\] would be written twice",
    ),
    "a bucket count beyond memory": (  # a MemoryError on the worker
        lambda m: m.write_histograms(1, {"w": np.ones(3)}, {"w": 10**12}),
        ValueError,
        r"num_buckets for \['w'\] must be at most 1,048,576, got 1,000,000,000,000: every "
        r"writer builds and stores each bucket",
    ),
    "a str writer_deadline_s from gin": (
        lambda m: MetricsManager("other", None, writer_deadline_s="30"),
        TypeError,
        r"writer_deadline_s must be a number of seconds such as 60.0, got '30' \(str\); in "
        r"gin write the number without quotes",
    ),
    "a list quarantine_s": (  # no gin quoting hint: a list is no quoted number
        lambda m: MetricsManager("other", None, quarantine_s=[60]),
        TypeError,
        r"quarantine_s must be a number of seconds such as 300.0, got \[60\] \(list\)$",
    ),
    # Sent through the device with the others: JAX's "Error interpreting argument" on the
    # worker lost the whole summary, 'ok' too.
    "a metric field of NumPy str": (
        lambda m: m.write_metrics_summary(
            {"n": Sum(np.array("7")), "ok": Sum(np.float32(1.0))}, 1, 1
        ),
        TypeError,
        r"metric fields 'n'.total \(ndarray of shape \(\) and dtype <U1\) are not numbers, "
        r"which the summary computes with JAX; give metrics numeric fields",
    ),
    "metric fields of object and datetime": (
        lambda m: m.write_metrics_summary(
            {
                "a": clu_metrics.Average(total=np.float32(1), count=np.array([1], object)),
                "d": Sum(np.datetime64("2026-01-01")),
            },
            1,
            1,
        ),
        TypeError,
        r"metric fields 'a'.count \(ndarray of shape \(1,\) and dtype object\), 'd'.total "
        r"\(datetime64 of shape \(\) and dtype datetime64\[D\]\) are not numbers",
    ),
    "a str flops_per_step from gin": (  # was asked for "seconds or units", as 30.0
        lambda m: MetricsManager("other", None, flops_per_step="2e12"),
        TypeError,
        r"flops_per_step must be a number of FLOPs such as 2.5e12, got '2e12' \(str\); in gin "
        r"write the number without quotes",
    ),
    "a str peak_flops_per_device": (
        lambda m: MetricsManager("other", None, peak_flops_per_device="989e12"),
        TypeError,
        r"peak_flops_per_device must be a number of FLOP/s such as 9.89e14, got '989e12'",
    ),
    "a missing model output": (  # JAX's "None is not a valid value for jnp.array"
        lambda m: Sum.from_model_output(None),
        TypeError,
        r"Sum.from_model_output: values must be an array or a number, got NoneType None; "
        r"check the model output",
    ),
    "None scalar": (lambda m: m.write_scalar("x", None, 1), TypeError, "'x'.*number"),
    "vector scalar": (
        lambda m: m.write_scalars(1, {"v": np.ones(3)}),
        ValueError,
        "'v'.*exactly one number.*histogram",
    ),
    # Both were told "Write strings with write_texts".
    "complex scalar": (
        lambda m: m.write_scalars(1, {"c": 1j}),
        TypeError,
        r"scalar 'c' must be a number, got 1j of type complex\. Pass a real number: abs\(x\) "
        r"or x\.real\.$",
    ),
    "complex array scalar": (
        lambda m: m.write_scalar("c", np.complex64(1), 1),
        TypeError,
        r"scalar 'c' must be a number, got an array of dtype complex64\. Pass a real number: "
        r"abs\(x\) or x\.real\.$",
    ),
    # A Real whose float() raised: its bare ZeroDivisionError named no key, nor the other.
    "a Real whose float() raises": (
        lambda m: m.write_scalars(1, {"r": _NoFloat(1, 3), "s": "abc", "ok": 1.0}),
        TypeError,
        r"write_scalars: 2 problems:\n  - scalar 's' must be a number, got 'abc' .*\n  - "
        r"scalar 'r' must be a number, got _NoFloat _NoFloat\(1, 3\), whose float\(\) raised "
        r"ZeroDivisionError: division by zero\. Pass a float or int\.$",
    ),
    "timedelta scalar": (
        lambda m: m.write_scalars(1, {"t": np.timedelta64(5, "s")}),
        TypeError,
        r"'t' must be a number, got an array of dtype timedelta64\[s\]",
    ),
    "metrics None (a window no step merged into)": (
        lambda m: m.write_metrics_summary(None, 1, 1),
        TypeError,
        r"got NoneType \(no step merged into `running` since its reset to None\)",
    ),
    "channels-first images (PyTorch's [N, C, H, W])": (
        lambda m: m.write_images(1, {"img": np.zeros((2, 3, 8, 8), np.float32)}),
        ValueError,
        r"'img' must have shape \[H, W, C\] .* got shape \(2, 3, 8, 8\)\. Move the channel "
        r"axis last \(np\.moveaxis\(x, -3, -1\)\)",
    ),
    "a summary's Scalar of None": (
        lambda m: m.write_metrics_summary({"lr": clu.values.Scalar(None)}, 1, 1),
        TypeError,
        r"'lr' must be a number, got None of type NoneType\. Write strings with write_texts",
    ),
    "a summary's Scalar of a device vector": (
        lambda m: m.write_metrics_summary({"lr": clu.values.Scalar(jnp.ones(3))}, 1, 1),
        ValueError,
        r"'lr' must hold exactly one number, got an array of shape \(3,\)\. Reduce it first",
    ),
    "metric named step": (
        lambda m: m.write_metrics_summary({"step": Sum(1.0)}, 1, 1),
        ValueError,
        r"\['step'\] are reserved.*rename",
    ),
    "metric named time": (
        lambda m: m.write_metrics_summary({"time": Sum(1.0)}, 1, 1),
        ValueError,
        r"\['time'\] are reserved",
    ),
    "scalar named collection": (
        lambda m: m.write_scalars(1, {"collection": 1.0}),
        ValueError,
        "'train/collection'",
    ),
    "text named step": (lambda m: m.write_texts(1, {"step": "x"}), ValueError, "reserved"),
    "step 2**63": (lambda m: m.write_scalar("x", 1.0, 2**63), ValueError, "below 2\\*\\*63"),
    "step 2**70": (lambda m: m.write_metrics_summary(GOOD, 2**70, 1), ValueError, "2\\*\\*63"),
    "negative step": (lambda m: m.write_scalar("x", 1.0, -1), ValueError, "step must be >= 0"),
    # 1.5, a float array or a dict named what came and no fix.
    "float step": (
        lambda m: m.write_scalar("x", 1.0, 1.5),
        TypeError,
        r"write_scalar: step must be an int, got 1\.5 \(float\); pass the loop's step counter "
        r"as an int: a Python int counter, or int\(state\.step\) on the host$",
    ),
    "float array step": (
        lambda m: m.write_metrics_summary(GOOD, np.array([3.0]), 1),
        TypeError,
        r"step must be an int, got ndarray of shape \(1,\) and dtype float64; pass the loop's "
        r"step counter as an int",
    ),
    "dict step": (
        lambda m: m.write_scalars({"step": 3}, {"loss": 1.0}),
        TypeError,
        r"write_scalars: step must be an int, got dict with keys \['step'\]; pass the loop's "
        r"step counter",
    ),
    "whole float step": (
        lambda m: m.write_scalar("x", 1.0, 3.0),
        TypeError,
        r"write_scalar: step must be an int, got 3\.0 \(float\); pass int\(step\)$",
    ),
    # A bool, a str or None was refused naming what came, not the fix (a bool's was int(step)).
    "bool step": (
        lambda m: m.write_scalar("x", 1.0, True),
        TypeError,
        r"step must be an int, got True \(bool\); pass the loop's step counter as an int: a "
        r"Python int counter, or int\(state\.step\) on the host$",
    ),
    "numpy bool step": (
        lambda m: m.write_scalar("x", 1.0, np.bool_(True)),
        TypeError,
        r"write_scalar: step must be an int, got np\.True_ \(bool\); pass the loop's step "
        r"counter as an int: a Python int counter, or int\(state\.step\) on the host$",
    ),
    "str step": (
        lambda m: m.write_scalar("x", 1.0, "3"),
        TypeError,
        r"step must be an int, got '3' \(str\); pass the loop's step counter as an int",
    ),
    "None step": (
        lambda m: m.write_metrics_summary(GOOD, None, 1),
        TypeError,
        r"write_metrics_summary: step must be an int, got None \(NoneType\); pass the loop's "
        r"step counter as an int: a Python int counter, or int\(state\.step\) on the host$",
    ),
    # A nan or inf step, or a list or tuple, named what came and no fix either.
    "nan step": (
        lambda m: m.write_scalar("x", 1.0, float("nan")),
        TypeError,
        r"write_scalar: step must be an int, got nan \(float\); pass the loop's step counter "
        r"as an int: a Python int counter, or int\(state\.step\) on the host$",
    ),
    "inf step": (
        lambda m: m.write_metrics_summary(GOOD, np.float32("inf"), 1),
        TypeError,
        r"step must be an int, got np\.float32\(inf\) \(float32\); pass the loop's step counter",
    ),
    "list step": (
        lambda m: m.write_scalar("x", 1.0, [3]),
        TypeError,
        r"write_scalar: step must be an int, got \[3\] \(list\); pass the loop's step counter "
        r"as an int: a Python int counter, or int\(state\.step\) on the host$",
    ),
    "tuple step": (
        lambda m: m.write_scalars((3,), {"loss": 1.0}),
        TypeError,
        r"write_scalars: step must be an int, got \(3,\) \(tuple\); pass the loop's step counter",
    ),
    "jax step": (
        lambda m: m.write_metrics_summary(GOOD, jnp.int32(3), 1),
        TypeError,
        "host-side counter",
    ),
    "zero num_steps": (
        lambda m: m.write_metrics_summary(GOOD, 1, 0),
        ValueError,
        "num_steps must be >= 1",
    ),
    "empty key": (lambda m: m.write_scalars(1, {"": 1.0}), TypeError, "non-empty str"),
    "int key": (lambda m: m.write_scalars(1, {3: 1.0}), TypeError, "non-empty str.*got 3"),
    "blank key": (lambda m: m.write_scalars(1, {"  ": 1.0}), TypeError, "non-empty str"),
    # Nested keys were written as 'a/' and 'a/1' (a top-level int key is refused), and an
    # empty nested dict wrote nothing, without a word.
    "empty nested metric key": (
        lambda m: m.write_metrics_summary({"a": {"": Sum(jnp.float32(1))}}, 1, 1),
        TypeError,
        r"write_metrics_summary: metrics: as_summary_metrics: 'a' holds the key ''; nested keys "
        r"must be non-empty str names such as 'loss', as top-level ones: rename it$",
    ),
    "int nested metric key": (
        lambda m: m.write_metrics_summary({"a": {"b": {1: Sum(jnp.float32(1))}}}, 1, 1),
        TypeError,
        r"'a/b' holds the key 1; nested keys must be non-empty str names such as 'loss'",
    ),
    "blank nested metric key": (
        lambda m: m.write_metrics_summary({"loss": Sum(1.0), "a": {" ": Sum(1.0)}}, 1, 1),
        TypeError,
        r"'a' holds the key ' '; nested keys must be non-empty str names",
    ),
    "empty nested metrics dict": (
        lambda m: m.write_metrics_summary({"loss": Sum(1.0), "a": {}}, 1, 1),
        ValueError,
        r"metrics: as_summary_metrics: 'a' is an empty dict, which writes no metric; drop it, "
        r"or put the metrics to write under it$",
    ),
    "metrics a list": (
        lambda m: m.write_metrics_summary([GOOD], 1, 1),
        TypeError,
        "mapping from names",
    ),
    "metrics a str": (
        lambda m: m.write_metrics_summary("loss", 1, 1),
        TypeError,
        "mapping from names.*got str",
    ),
    "scalars a list": (lambda m: m.write_scalars(1, [1.0]), TypeError, "mapping.*'loss'"),
    "text not str": (lambda m: m.write_texts(1, {"t": 3}), TypeError, "'t'.*int 3.*write_scalars"),
    "text of bytes": (
        lambda m: m.write_texts(1, {"t": b"hi"}),
        TypeError,
        r"text 't' must be a str, got bytes b'hi'; \.decode\(\) bytes first",
    ),
    "hparams not mapping": (lambda m: m.write_hparams(["lr"]), TypeError, "mapping"),
    "hparam named twice": (
        lambda m: m.write_hparams({"opt.lr": 0.1, "opt": {"lr": 0.2}}),
        ValueError,
        "'opt.lr' is given twice.*rename one",
    ),
    "bad on_error": (
        lambda m: MetricsManager("x", on_error="ignore"),
        ValueError,
        r"on_error must be one of \['warn', 'raise'\]",
    ),
    "string flush_secs in gin": (
        lambda m: writers.create_default_writer(m.summary_dir, flush_secs="30", console=False),
        TypeError,
        r"flush_secs must be a number of seconds.*got '30' \(str\); in gin write a number, "
        "without quotes",
    ),
    "string flush_secs of a JSONL writer": (
        lambda m: writers.JsonlWriter(os.path.join(m.summary_dir, "other.jsonl"), flush_secs="5"),
        TypeError,
        r"JsonlWriter: flush_secs .* got '5' \(str\); in gin write a number, without quotes",
    ),
    "string max_queue in gin": (
        lambda m: writers.create_default_writer(m.summary_dir, asynchronous=True, max_queue="5"),
        TypeError,
        r"max_queue must be an int >= 1, got '5' \(str\); in gin write 512, not '512'",
    ),
    # Writer settings that failed only at the first write, on the worker: the writer was lost.
    "a console writer's stream that is no stream": (
        lambda m: writers.ConsoleWriter("stdout"),
        TypeError,
        r"ConsoleWriter: stream must be a text stream such as sys.stderr \(with write\(\)\)",
    ),
    "a console writer's clock that is no function": (
        lambda m: writers.ConsoleWriter(clock=0.0),
        TypeError,
        r"ConsoleWriter: clock must be a function returning seconds, such as time.time, got 0.0",
    ),
    "a console writer's color as a str": (  # 'no' is true: colours were on
        lambda m: writers.ConsoleWriter(color="no"),
        TypeError,
        r"ConsoleWriter: color must be True, False or None, got 'no' \(str\); in gin write it",
    ),
    "a collection that is not a str": (  # JSONL stored it as a number in every line
        lambda m: writers.JsonlWriter(os.path.join(m.summary_dir, "o.jsonl"), collection=3),
        TypeError,
        r"JsonlWriter: collection must be a str such as 'train', or None, got 3 \(int\)",
    ),
    "a str max_array_size": (
        lambda m: writers.JsonlWriter(os.path.join(m.summary_dir, "o.jsonl"), max_array_size="9"),
        TypeError,
        r"JsonlWriter: max_array_size must be a number of elements >= 0 .*got '9' \(str\); in gin write it",
    ),
    "a TensorBoard filename_suffix that is a path": (
        lambda m: writers.TensorBoardWriter(m.summary_dir, filename_suffix="/../x"),
        ValueError,
        r"TensorBoardWriter: filename_suffix must be a str without '/', such as '.train'",
    ),
    "a console_stream that is no stream": (
        lambda m: writers.create_default_writer(None, console_stream="stdout"),
        TypeError,
        r"console_stream must be a text stream such as sys.stderr \(with write\(\)\)",
    ),
    "zero max_buffer_mb": (
        lambda m: writers.create_default_writer(m.summary_dir, max_buffer_mb=0, console=False),
        ValueError,
        "create_default_writer: max_buffer_mb must be positive and finite, got 0; None for no "
        "bound",
    ),
    "zero close_timeout_s": (
        lambda m: writers.MlflowWriter(close_timeout_s=0, process_index=1),
        ValueError,
        "MlflowWriter: close_timeout_s must be positive and finite, got 0; None waits for the server",
    ),
    "name escaping summary_dir": (
        lambda m: MetricsManager("../..", "runs"),
        ValueError,
        r"name '../..' is a path through '..', which can write outside summary_dir; use a rel",
    ),
    "a name through '..' back inside summary_dir": (  # said it would write outside
        lambda m: MetricsManager("eval/../train", "runs"),
        ValueError,
        r"name 'eval/../train' is a path through '..', which can write outside summary_dir",
    ),
    "absolute name": (
        lambda m: MetricsManager("/etc", "runs"),
        ValueError,
        "name '/etc' is absolute, which can write outside summary_dir",
    ),
    "second manager on the dir": (
        lambda m: MetricsManager("train", os.path.dirname(m.summary_dir)),
        ValueError,
        "already written by another open MetricsManager",
    ),
    "called inside jit": (
        lambda m: jax.jit(lambda x: m.write_metrics_summary({"loss": Sum(x)}, 1, 1) and x)(
            jnp.float32(1.0)
        ),
        TypeError,
        r"called while JAX traces a function \(inside jit.*call it from the Python loop",
    ),
    "a window per device (pmap)": (
        lambda m: m.write_metrics_summary(_per_device(pack=False), 1, 1),
        ValueError,
        r"\['loss'\] hold one window per device \(8 rows.*: metrics_manager.merge_windows",
    ),
    "a packed window per device (pmap)": (
        lambda m: m.write_metrics_summary(_per_device(pack=True), 1, 1),
        ValueError,
        r"has shape \(8, 1\), expected \(1,\).*metrics_manager.merge_windows\(packed\)",
    ),
    "a tracker class as writer_factory": (  # it would take the summary dir as its project
        lambda m: MetricsManager("x", "runs", writer_factory=writers.WandbWriter),
        TypeError,
        r"writer_factory is WandbWriter, which would take the summary dir as its project; "
        r"pass writer_factory=functools.partial\(writers.create_tracker_writer, tracker=",
    ),
    "bad deadline": (
        lambda m: MetricsManager("x", writer_deadline_s="5"),
        TypeError,
        "writer_deadline_s",
    ),
    "a Welford's x/std beside a metric named x/std": (
        lambda m: m.write_metrics_summary(
            {"w": Welford.from_model_output(jnp.arange(4.0)), "w/std": Sum(np.float32(1.0))}, 1, 1
        ),
        ValueError,
        r"keys \['w/std'\] would be written twice \(a MeanStd or Welford 'x' also writes",
    ),
    "a Collection's MeanStd x/std beside a metric named c/x/std": (  # dropped on the worker
        lambda m: m.write_metrics_summary(
            {
                "c": clu_metrics.Collection.create_collection(
                    x=MeanStd.from_model_output(jnp.arange(4.0))
                ),
                "c/x/std": Sum(np.float32(1.0)),
            },
            1,
            1,
        ),
        ValueError,
        r"keys \['c/x/std'\] would be written twice",
    ),
    "a key UTF-8 cannot encode (os.fsdecode of a Latin-1 name)": (
        lambda m: m.write_scalars(1, {"eval/caf\udce9": 1.0}),
        ValueError,
        r"keys \['eval/caf\\udce9'\] hold lone surrogates.*errors='replace'",
    ),
    "system_metrics as a str (gin's 'False')": (
        lambda m: MetricsManager("x", system_metrics="False"),
        TypeError,
        "system_metrics must be True or False, got 'False'",
    ),
    "num_buckets naming no array": (  # the typo's array got the default 30 buckets
        lambda m: m.write_histograms(1, {"w": np.ones(4)}, num_buckets={"W": 8}),
        ValueError,
        r"num_buckets names \['W'\], which no array of the call has \(arrays \['w'\]\)",
    ),
    "handle_signals a str": (  # truthy: the handlers were installed
        lambda m: MetricsManager("x", handle_signals="no"),
        TypeError,
        "handle_signals must be True or False, got 'no'",
    ),
    "a mask as AveragePerStep's steps": (  # [6, inf, 6]: the mask divided the total
        lambda m: AveragePerStep.from_model_output(jnp.ones(3), jnp.array([1, 0, 1])),
        TypeError,
        r"steps must be one number of steps \(default 1\), got ArrayImpl of shape \(3,\); "
        r"pass a mask by keyword",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_input_is_refused_at_the_call_and_later_summaries_still_arrive(tmp_path, case):
    call, error, match = BAD_CALLS[case]
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        with pytest.raises(error, match=match):
            call(manager)
        manager.write_metrics_summary({"loss": Sum(np.float32(2.0))}, 5, 1)
    logdir = str(tmp_path / "train")
    assert [(x["step"], x["loss"]) for x in read_jsonl(logdir)] == [(5, 2.0)]
    assert tb_steps(logdir) == [5]
    assert manager.errors == []


def test_a_metric_computing_an_unprintable_hyperparam_loses_that_key_alone(tmp_path):
    # Checked at the call when ready, not when a metric computed it: each writer refused the
    # summary's write_hparams whole at every step, losing 'lr', a failure toward quarantine.
    @flax.struct.dataclass
    class Hparam(Sum):
        def compute_value(self):
            total = float(self.total)
            return clu.values.HyperParam(_NoText() if total < 0 else total)

    with MetricsManager("train", tmp_path, writer_factory=files_and(), uptime=False) as manager:
        for step in (1, 2):
            metrics = {"bad": Hparam(jnp.float32(-1)), "lr": Hparam(jnp.float32(0.5))}
            manager.write_metrics_summary({**metrics, "loss": Sum(np.float32(step))}, step, 1)
    assert [str(e) for e in manager.errors] == [
        f"metric:bad at step {step} (keys bad): ValueError: write_metrics_summary: "
        "hyperparameter 'bad' (_NoText) cannot be turned into text, as the writers write it: "
        "str() raised ZeroDivisionError: division by zero; pass str(value) where it works, or "
        "a number, str or list in its place"
        for step in (1, 2)
    ]
    assert {w: h["failures"] for w, h in manager.health()["writers"].items()} == {
        "tensorboard": 0,
        "jsonl": 0,
    }
    lines = read_jsonl(str(tmp_path / "train"))
    assert [x["hparams"] for x in lines if "hparams" in x] == [{"lr": 0.5}, {"lr": 0.5}]
    assert [(x["step"], x["loss"]) for x in lines if "loss" in x] == [(1, 1.0), (2, 2.0)]


@pytest.mark.parametrize(
    ("key", "setting", "metric"),
    [
        ("perf/mfu", "flops_per_step", Sum(0.5)),
        ("system/host_cpu_percent", "system_metrics=True", Sum(0.5)),
        # A Collection 'perf' writes 'perf/mfu': the check read the top-level keys only.
        ("perf", "flops_per_step", clu_metrics.Collection.create_collection(mfu=Sum(0.5))),
    ],
    ids=["perf", "system", "collection"],
)
def test_a_metric_under_the_managers_own_keys_is_refused(tmp_path, key, setting, metric):
    # The manager's perf/* replaced the loop's own perf/mfu with no word; system/* only in
    # the summaries where the monitor had a window.
    refused = "perf/mfu" if key == "perf" else key
    settings = {"flops_per_step": 1e9, "peak_flops_per_device": 1e12, "num_devices": 1}
    with MetricsManager(
        "train", tmp_path, writer_factory=files_and(), system_metrics=True, **settings
    ) as manager:
        manager.start_duration_timer()
        with pytest.raises(
            ValueError, match=rf"keys \['{refused}'\] are under .*{setting}.*rename"
        ):
            manager.write_metrics_summary({"loss": Sum(np.float32(2.0)), key: metric}, 5, 1)
        manager.write_metrics_summary({"loss": Sum(np.float32(2.0))}, 6, 1)
    (line,) = read_jsonl(str(tmp_path / "train"))
    assert (line["step"], line["loss"], line["perf/flops_per_step"]) == (6, 2.0, 1e9)
    # One device of peak 1e12 FLOP/s: the fraction of the peak is the TFLOP/s.
    assert 0 < line["perf/mfu"] == pytest.approx(line["perf/tflops_per_second"])
    assert manager.errors == []


def test_a_metric_changing_under_the_same_keys_is_checked_again(tmp_path):
    # The checks ran again only when the keys or the first metric's first shape changed: a
    # vector Sum, or an undecorated subclass, after a good summary with the same keys was
    # accepted, then dropped on the worker (the subclass: the whole summary, loss included).
    bad_ones = [
        (Sum(jnp.ones(3)), ValueError, r"metrics \['n'\] compute arrays of shapes \[\(3,\)\]"),
        (_Undecorated(jnp.float32(1)), TypeError, r"metrics 'n' \(_Undecorated\) are not pytrees"),
    ]
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        for step, (bad, error, match) in zip((20, 30), bad_ones, strict=True):
            good = {"loss": Sum(np.float32(step)), "n": Sum(jnp.float32(1))}
            manager.write_metrics_summary(good, step, 1)
            with pytest.raises(error, match=match):
                manager.write_metrics_summary({**good, "n": bad}, step + 1, 1)
    logdir = str(tmp_path / "train")
    assert [(x["step"], x["loss"], x["n"]) for x in read_jsonl(logdir)] == [
        (20, 20.0, 1.0),
        (30, 30.0, 1.0),
    ]
    assert tb_steps(logdir) == [20, 30]
    assert manager.errors == []


def test_a_window_per_device_merged_as_the_message_says_is_written(tmp_path):
    # The library's own base metrics hold a Time() with no arrays: CLU's reduce(), which
    # the message named before, raised "scan got no values" on it.
    n = jax.local_device_count()
    logits = jax.random.normal(jax.random.PRNGKey(0), (n, 2, 4, 8))
    targets = jax.random.randint(jax.random.PRNGKey(1), (n, 2, 4), 0, 8)

    def step(logits, targets, pack):
        loss, _, _ = compute_weighted_cross_entropy(logits, targets)
        base = compute_base_metrics(logits, targets, None, loss, num_devices=n)
        return merge_metrics(None, {**base, "top": Max.from_model_output(loss)}, pack=pack)

    one = compute_base_metrics(
        logits.reshape(-1, 4, 8), targets.reshape(-1, 4), None, jnp.float32(0.0), num_devices=n
    )
    losses = [compute_weighted_cross_entropy(logits[i], targets[i])[0] for i in range(n)]
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        for packed, at in ((False, 1), (True, 2)):
            per_device = jax.pmap(functools.partial(step, pack=packed))(logits, targets)
            with pytest.raises(ValueError, match="merge_windows"):
                manager.write_metrics_summary(per_device, at, 1)
            manager.start_duration_timer()
            manager.write_metrics_summary(merge_windows(per_device), at, 1)
        # Same keys as the merged window: refused again (the keys were checked once before).
        with pytest.raises(ValueError, match="hold one window per device"):
            manager.write_metrics_summary(
                jax.pmap(functools.partial(step, pack=False))(logits, targets), 3, 1
            )
    lines = read_jsonl(str(tmp_path / "train"))
    assert [x["step"] for x in lines] == [1, 2] and manager.errors == []
    for line in lines:
        assert line["loss"] == pytest.approx(float(sum(losses)), rel=1e-5)
        assert line["top"] == pytest.approx(float(max(losses)), rel=1e-5)
        assert line["accuracy"] == pytest.approx(float(one["accuracy"].compute()), rel=1e-6)
        assert line["timing/seqs"] == 2 * n


def test_a_lost_managers_dir_is_refused_naming_where_it_was_made_until_close_all(tmp_path):
    """A notebook cell that raised after making a manager loses the reference; the manager
    stays open (its writes are kept) and holds its dir until `close_all()`."""

    def cell() -> None:
        manager = MetricsManager("train", tmp_path, writer_factory=files_and())
        manager.write_metrics_summary({"loss": Sum(np.float32(1.5))}, 1, 1)
        raise KeyboardInterrupt  # the user stops the cell

    with pytest.raises(KeyboardInterrupt):
        cell()
    made_at = f"{__file__}:{cell.__code__.co_firstlineno + 1}"
    with pytest.raises(ValueError) as info:
        MetricsManager("train", tmp_path, writer_factory=files_and())
    assert f"another open MetricsManager in this process, made at {made_at}; " in str(info.value)
    assert "MetricsManager.close_all() closes one whose reference was lost" in str(info.value)
    MetricsManager.close_all()
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        manager.write_metrics_summary({"loss": Sum(np.float32(2.5))}, 2, 1)
    logdir = str(tmp_path / "train")
    assert [(x["step"], x["loss"]) for x in read_jsonl(logdir)] == [(1, 1.5), (2, 2.5)]
    assert tb_steps(logdir) == [1, 2]


def test_bfloat16_and_float16_scalars_are_written_exactly(tmp_path):
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        manager.write_metrics_summary(
            {
                "bf16": Sum(jnp.sum(jnp.asarray([1.5, 2.25], jnp.bfloat16))),
                "f16": AveragePerStep.from_model_output(jnp.float16(0.125)),
            },
            1,
            1,
        ).result()
        manager.write_scalars(2, {"bf16": jnp.bfloat16(3.5)})
    lines = read_jsonl(str(tmp_path / "train"))
    assert lines[0]["bf16"] == 3.75 and lines[0]["f16"] == 0.125 and lines[1]["bf16"] == 3.5
    assert manager.errors == []


def test_numpy_strs_are_written_as_texts(tmp_path):
    label = np.array(["cat", "dog"])[1]  # a numpy str_, a subclass of str
    with MetricsManager("train", tmp_path, writer_factory=files_and()) as manager:
        manager.write_texts(1, {"label": label})
    [line] = read_jsonl(str(tmp_path / "train"))
    assert line["label"] == "dog" and manager.errors == []


def test_a_step_going_backwards_warns_once(caplog):
    with MetricsManager("t", writer_factory=lambda d: writers.NoopWriter()) as manager:
        for step in (10, 5, 3):
            manager.write_metrics_summary({"loss": Sum(1.0)}, step, 1)
    warnings = [r.getMessage() for r in caplog.records if "comes after step" in r.getMessage()]
    assert warnings == [
        "MetricsManager 't': step 5 comes after step 10. If the run resumed from a checkpoint, "
        "pass resume_step so earlier values after it are dropped."
    ]


def test_a_step_going_backwards_after_resume_step_does_not_ask_for_resume_step(tmp_path, caplog):
    """A manager made with resume_step=50 writing step 60 after step 100 was told, by itself
    and by its JSONL writer, to pass resume_step; the advice now fits what was passed."""
    factory = functools.partial(writers.create_default_writer, console=False)
    with MetricsManager("train", tmp_path, writer_factory=factory) as manager:
        for step in (10, 50, 80):
            manager.write_scalars(step, {"loss": 1.0})
    with MetricsManager("train", tmp_path, writer_factory=factory, resume_step=50) as manager:
        manager.write_scalars(100, {"loss": 0.5})
        manager.write_scalars(60, {"loss": 0.25})
    assert [line["step"] for line in read_jsonl(str(tmp_path / "train"))] == [10, 50, 100, 60]
    warnings = [r.getMessage() for r in caplog.records if "comes after step" in r.getMessage()]
    assert warnings[0] == (
        "MetricsManager 'train': step 60 comes after step 100. resume_step=50, passed to this "
        "manager, drops only what the run before wrote after step 50, not this run's own "
        "steps: step 100 stays beside step 60. If the run restored an earlier checkpoint "
        "again, close this manager and make a new one with that checkpoint's step as "
        "resume_step; otherwise check the steps the loop passes."
    )
    assert len(warnings) == 2 and warnings[1].endswith(
        "step 60 comes after step 100: the log's steps go backwards. resume_step=50 dropped "
        "only the lines the run before wrote after step 50, not this run's own. If the run "
        "restored an earlier checkpoint again, make a new writer with that checkpoint's step "
        "as resume_step; otherwise check the steps passed. Warned once."
    )


@pytest.mark.parametrize("call", ["write_scalars", "write_texts", "write_images"])
def test_a_step_going_backwards_in_a_host_write_warns_once_too(tmp_path, caplog, call):
    """A TensorBoard-only set held step 20 twice with no word: only summaries were checked."""
    value = {"write_scalars": 1.0, "write_texts": "a", "write_images": np.zeros((2, 2, 3))}[call]
    tb = functools.partial(writers.create_default_writer, console=False, jsonl=False)
    with MetricsManager("t", tmp_path, writer_factory=tb) as manager:
        manager.write_hparams({"lr": 0.1})  # no step: nothing to compare
        for step in (10, 20, 30, 20, 40, 5):
            getattr(manager, call)(step, {"x": value})
    warnings = [r.getMessage() for r in caplog.records if "comes after step" in r.getMessage()]
    assert warnings == [
        "MetricsManager 't': step 20 comes after step 30. If the run resumed from a "
        "checkpoint, pass resume_step so earlier values after it are dropped."
    ]


def test_nonfinite_stop_names_the_window_and_key():
    with MetricsManager(
        "t", writer_factory=lambda d: writers.NoopWriter(), nonfinite="stop"
    ) as manager:
        for step in range(1, 37):
            manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, step, 1)
        manager.write_metrics_summary({"loss": Sum(np.float32(np.nan))}, 37, 1).result()
        with pytest.raises(MetricsManagerError, match=r"step 37.*\['loss'\]"):
            manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, 38, 1)


def test_nonfinite_stop_checks_summaries_on_every_process_and_write_scalars_on_process_0(
    monkeypatch,
):
    # As the README's "Many hosts" says: process 1 has no writers, so a NaN passed to
    # write_scalar there is dropped unchecked, but a summary's NaN stops it as process 0.
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    with MetricsManager("t", nonfinite="stop") as manager:
        assert not manager.writes
        manager.write_scalar("host", float("nan"), 1)
        manager.flush()
        manager.write_scalar("host", 2.0, 2)  # no error
        manager.write_metrics_summary({"loss": Sum(np.float32(np.nan))}, 3, 1).exception()
        with pytest.raises(MetricsManagerError, match=r"summary window ending at step 3.*'loss'"):
            manager.write_scalar("host", 4.0, 4)


@pytest.mark.parametrize("process", [0, 1])
def test_nonfinite_stop_on_a_summary_key_a_writer_refuses_stops_every_process(
    tmp_path, monkeypatch, process
):
    # Process 0 left the key JSONL reserves out before the check, so a NaN under it stopped
    # process 1 (no writers, nothing left out) while process 0 went on to wait for it.
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: process)
    factory = lambda d: writers.JsonlWriter(d)  # noqa: E731
    manager = MetricsManager("t", tmp_path, writer_factory=factory, nonfinite="stop")
    summary = {"step": Sum(np.float32(np.nan)), "loss": Sum(np.float32(1.0))}
    # Raised once, after queueing (the call's own values are still written): at the summary's
    # own call if the worker checked it first (numpy values are ready at once), else later.
    raised = []
    for call in (
        lambda: manager.write_metrics_summary(summary, 1, 1).result(),
        lambda: manager.write_scalar("x", 2.0, 2),
        manager.close,
    ):
        try:
            call()
        except MetricsManagerError as err:
            raised.append(str(err))
    assert len(raised) == 1 and "ending at step 1 for keys ['step']" in raised[0], raised
    if process == 1:
        assert not os.path.exists(tmp_path / "t")
        return
    # Both calls are still written, the summary without the key (its line's step is 1).
    assert [(x["step"], x.get("loss"), x.get("x")) for x in read_jsonl(str(tmp_path / "t"))] == [
        (1, 1.0, None),
        (2, None, 2.0),
    ]


@pytest.mark.parametrize(("process", "errors"), [(0, 1), (1, 0)])
def test_a_nan_histogram_under_raise_stops_process_0_alone(monkeypatch, process, errors):
    # As the README's "Many processes" says: only process 0 reads write_histograms' values,
    # so a NaN there raises on process 0 alone, and the others wait in their next collective.
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: process)
    with MetricsManager("t", writer_factory=lambda d: writers.NoopWriter(), on_error="raise") as m:
        m.write_histograms(1, {"h": np.array([np.nan, 1.0])})
        m.write_scalar("x", 1.0, 2)
        if errors:
            with pytest.raises(MetricsManagerError, match="histogram 'h' has 1 NaN/Inf entries"):
                m.flush()
        else:
            m.flush()
    assert len(m.errors) == errors


def test_nonfinite_stop_covers_write_scalars_and_the_raising_call_is_still_written(tmp_path):
    # write_scalar passed NaN and infinities through under "stop", unchecked; and the call
    # that raised lost its own summary.
    slow = jax.jit(lambda x: jnp.log(jnp.sum(x @ x)) * -jnp.inf)  # -inf, still computing
    with MetricsManager("train", tmp_path, nonfinite="stop", writer_factory=files_and()) as m:
        m.write_scalar("host", 1.0, 1)
        m.write_scalar("host", float("inf"), 2)
        with pytest.raises(MetricsManagerError, match=r"write_scalars at step 2 .*\['host'\]"):
            m.flush()
        m.write_scalar("host", slow(jnp.ones((500, 500))), 3)  # read and checked by the worker
        m.write_metrics_summary({"loss": Sum(np.float32(4.0))}, 4, 1).result()  # after step 3
        with pytest.raises(MetricsManagerError, match=r"write_scalars at step 3 .*\['host'\]"):
            m.write_scalar("host", 5.0, 5)
        m.write_scalar("host", 6.0, 6)  # raised once: a loop that caught it goes on
    lines = read_jsonl(str(tmp_path / "train"))
    assert [(x["step"], x.get("host"), x.get("loss")) for x in lines] == [
        (1, 1.0, None),
        (2, "Infinity", None),
        (3, "-Infinity", None),
        (4, None, 4.0),
        (5, 5.0, None),  # the raising call's value: lost before
        (6, 6.0, None),
    ]


@pytest.mark.parametrize("policy", ["warn", "stop"])
def test_a_float_past_float64s_range_is_written_as_inf_under_the_nonfinite_policy(
    tmp_path, caplog, policy
):
    # np.longdouble("1e4000") is finite, but past float64's 1.8e308: every writer gets inf,
    # which the policy takes as any other inf (warned of once by key, or the run stopped).
    with MetricsManager("train", tmp_path, nonfinite=policy, writer_factory=files_and()) as m:
        m.write_scalars(1, {"x": np.longdouble("1e4000"), "y": np.longdouble("-1e4000")})
        if policy == "stop":
            with pytest.raises(MetricsManagerError, match=r"step 1 for keys \['x', 'y'\]"):
                m.flush()
        m.write_scalars(2, {"x": np.longdouble("1e300"), "y": 1.0})  # in range: as it is
    lines = read_jsonl(str(tmp_path / "train"))
    assert [(line["step"], line["x"], line["y"]) for line in lines] == [
        (1, "Infinity", "-Infinity"),
        (2, 1e300, 1.0),
    ]
    warned = [r.getMessage() for r in caplog.records if "non-finite values at step" in r.message]
    assert warned == (
        []
        if policy == "stop"
        else ["MetricsManager 'train': non-finite values at step 1 for ['x', 'y']"]
    )


def test_nonfinite_warn_writes_every_summary(tmp_path):
    with MetricsManager(
        "train",
        tmp_path,
        nonfinite="warn",
        writer_factory=files_and(),
    ) as m:
        for step in range(1, 6):
            m.write_metrics_summary({"loss": Sum(np.float32(np.nan if step > 2 else 1.0))}, step, 1)
    assert [x["loss"] for x in read_jsonl(str(tmp_path / "train"))] == [1.0, 1.0] + ["NaN"] * 3


def test_an_empty_window_is_nan_reported_once_by_the_nonfinite_policy(tmp_path, caplog):
    # Nothing seen in a window (an eval whose tokens are all padding): CLU's Average and
    # Accuracy compute 0/0 = NaN. This suite runs with warnings as errors, as many do, so
    # numpy's "invalid value encountered in divide" used to drop both keys as failures.
    import clu.metrics as clu_metrics

    empty = {"loss": clu_metrics.Average.empty(), "accuracy": clu_metrics.Accuracy.empty()}
    with MetricsManager("eval", tmp_path, writer_factory=files_and()) as manager:
        manager.start_duration_timer()
        summary = manager.write_metrics_summary({**empty, "seen": Sum(np.int32(0))}, 1, 1)
        assert np.isnan(summary.result()["loss"].value)
        manager.write_metrics_summary({"loss": clu_metrics.Average.empty()}, 2, 1).result()
        nan_too = {"loss": clu_metrics.Average.empty(), "q": Sum(np.float32(np.inf))}
        manager.write_metrics_summary(nan_too, 3, 1).result()
    assert manager.errors == []
    lines = read_jsonl(str(tmp_path / "eval"))
    assert [(x["loss"], x.get("accuracy"), x.get("seen")) for x in lines] == [
        ("NaN", "NaN", 0),
        ("NaN", None, None),
        ("NaN", None, None),
    ]
    events = read_tensorboard(str(tmp_path / "eval")).Scalars("loss")
    assert [e.step for e in events] == [1, 2, 3]
    assert all(np.isnan(e.value) for e in events)
    reports = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert len(reports) == 2 and "['accuracy', 'loss']" in reports[0]
    assert reports[1].endswith("at step 3 for ['q']")  # once per key: not 'loss' again


def test_a_second_process_on_the_same_directory_is_refused_until_the_first_dies(tmp_path):
    proc = run_loop("periodic", str(tmp_path), "0.05")
    try:
        wait_for_issued(proc, 3)
        with pytest.raises(ValueError) as info:
            MetricsManager("train", tmp_path, writer_factory=isolated_factory)
        message = str(info.value)
        assert str(tmp_path / "train" / "metrics.jsonl") in message
        assert "another process" in message and "summary_dir" in message
        assert proc.poll() is None  # the first run was not disturbed
    finally:
        proc.kill()  # SIGKILL: the kernel drops its lock, no stale lock file is left
        proc.communicate(timeout=60)
    before = [line["step"] for line in read_jsonl(str(tmp_path / "train"))]
    assert before and before == sorted(before)
    with MetricsManager("train", tmp_path, writer_factory=isolated_factory) as manager:
        manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, before[-1] + 1, 1)
    after = [line["step"] for line in read_jsonl(str(tmp_path / "train"))]
    assert after == [*before, before[-1] + 1]
    assert not [name for name in os.listdir(tmp_path / "train") if "lock" in name]


def test_flush_with_a_timeout_says_what_is_still_queued_and_loses_none_of_it(tmp_path):
    gated = GatedWriter()
    with MetricsManager("train", tmp_path, writer_factory=files_and(first={"gated": gated})) as m:
        for step in (1, 2, 3):
            m.write_scalar("loss", float(step), step)
        assert gated.entered.wait(10)
        with pytest.raises(TimeoutError, match=r"flush\(\) not done in 0.2 s; 4 job\(s\)"):
            m.flush(timeout=0.2)  # steps 1 (in the gated call), 2, 3 and the flush
        for bad, error in ((-1, ValueError), (float("nan"), ValueError), ("1", TypeError)):
            with pytest.raises(error, match=r"timeout must be a number of seconds >= 0"):
                m.flush(timeout=bad)
        with pytest.raises(TypeError, match=r"or None \(wait for everything\), got True \(bool\)"):
            m.flush(timeout=True)
        gated.gate.set()
        m.flush(timeout=10)
    assert [line["loss"] for line in read_jsonl(str(tmp_path / "train"))] == [1.0, 2.0, 3.0]


def test_flush_with_a_timeout_returns_in_time_while_the_queue_is_full(tmp_path):
    # The queue full behind a writer's long call: flush(timeout=0.2) waited for a slot first,
    # as long as the call took (here 3 s, until the gate opens; forever behind a hung call).
    gated = GatedWriter()
    factory = files_and(first={"gated": gated})
    with MetricsManager("train", tmp_path, writer_factory=factory, max_pending=2) as m:
        for step in (1, 2, 3):  # 1 in the gated call, 2 and 3 fill the queue
            m.write_scalar("loss", float(step), step)
        assert gated.entered.wait(10)
        opener = threading.Timer(3.0, gated.gate.set)
        opener.start()
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=r"0.2 s; 3 job\(s\) \(summaries, writes\) still"):
            m.flush(timeout=0.2)
        assert time.monotonic() - start < 1.5
        opener.join()
    assert [line["loss"] for line in read_jsonl(str(tmp_path / "train"))] == [1.0, 2.0, 3.0]


def test_every_calls_refused_keys_exist_before_the_first_is_refused(tmp_path, monkeypatch):
    # The caller thread adds refused keys while the worker iterates over them; a call's first
    # refused key made its entry then, and "dictionary changed size during iteration" could
    # fail the worker's summary. The entries are made with the manager now.
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with MetricsManager("train", tmp_path) as manager:
        refused = manager._summarizer.refused
        before = dict(refused)
        manager.write_scalars(1, {"step": 1.0, "a": 1.0})
        manager.write_texts(2, {"collection": "c", "b": "text"})
        assert refused.keys() == before.keys()
        assert all(refused[method] is before[method] for method in before)
    assert list(refused["write_scalars"]) == ["step"]
    assert list(refused["write_texts"]) == ["collection"]
    assert [(x["step"], x.get("a"), x.get("b")) for x in read_jsonl(str(tmp_path / "train"))] == [
        (1, 1.0, None),
        (2, None, "text"),
    ]


@pytest.mark.parametrize(
    ("call", "key", "setting"),
    [
        (lambda m, k: m.write_scalars(5, {k: 0.25}), "perf/mfu", "flops_per_step"),
        (lambda m, k: m.write_scalar(k, 0.25, 5), "system/host_cpu_percent", "system_metrics=True"),
        (lambda m, k: m.write_texts(5, {k: "x"}), "perf/mfu", "flops_per_step"),
    ],
    ids=["scalars", "scalar", "texts"],
)
def test_a_write_under_the_managers_own_keys_is_refused(tmp_path, call, key, setting):
    # write_scalars took 'perf/mfu' while the summary at the same step wrote the manager's
    # own: two values of one key at step 5, as the summary refuses a metric's.
    settings = {"flops_per_step": 1e9, "peak_flops_per_device": 1e12, "num_devices": 1}
    with MetricsManager(
        "train", tmp_path, writer_factory=files_and(), system_metrics=True, **settings
    ) as manager:
        manager.start_duration_timer()
        with pytest.raises(ValueError, match=rf"keys \['{key}'\] are under .*{setting}.*rename"):
            call(manager, key)
        manager.write_scalars(5, {"lr": 0.5})  # a key of the loop's own still goes through
        manager.write_metrics_summary({"loss": Sum(np.float32(2.0))}, 5, 1)
    lines = read_jsonl(str(tmp_path / "train"))
    assert [line["lr"] for line in lines if "lr" in line] == [0.5]
    (summary,) = [line for line in lines if "loss" in line]
    assert 0 < summary["perf/mfu"] == pytest.approx(summary["perf/tflops_per_second"])
    assert manager.errors == []


def test_a_second_close_closes_again_only_the_writers_whose_close_failed(tmp_path):
    # A second close() after one whose writer's close raised (storage down) did nothing: the
    # values that writer still buffered were lost once storage came back.
    from tests.writers.recording import RecordingWriter

    class UploadAtClose(RecordingWriter):
        def __init__(self, outages: int) -> None:
            super().__init__()
            self.outages, self.uploaded = outages, []

        def close(self):
            self._record("close")
            if self.outages:
                self.outages -= 1
                raise ConnectionError("storage is down")
            self.uploaded = [c[1][0] for c in self.calls if c[0] == "write_scalars"]

    down, fine = UploadAtClose(outages=2), UploadAtClose(outages=0)
    manager = MetricsManager(
        "train", tmp_path, writer_factory=lambda d: {"down": down, "fine": fine}, on_error="raise"
    )
    for step in (1, 2, 3):
        manager.write_scalars(step, {"loss": float(step)})
    for attempt in (1, 2):  # storage still down at the second
        with pytest.raises(MetricsManagerError, match="writer:down.*storage is down"):
            manager.close()
        assert [c[0] for c in down.calls].count("close") == attempt
    manager.close()  # storage is back
    manager.close()  # it went through: nothing more to do
    assert [c[0] for c in down.calls].count("close") == 3
    assert [c[0] for c in fine.calls].count("close") == 1  # its close went through at once
    assert (down.uploaded, fine.uploaded) == ([1, 2, 3], [1, 2, 3])
    assert [str(f.error) for f in manager.errors] == ["storage is down"] * 2
