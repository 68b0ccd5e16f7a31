"""AsyncWriter: ordered worker, bounded queue that blocks, errors named, close joins."""

from __future__ import annotations

import asyncio
import json
import math
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

import writers
from tests.signals import signal_after
from tests.writers.failing import BrokenDiskWriter, CluInterfaceWriter, GatedWriter


def test_calls_run_in_order_and_flush_waits_for_them(tmp_path):
    jsonl = writers.JsonlWriter(tmp_path / "m.jsonl", clock=lambda: 0.0)
    w = writers.AsyncWriter(jsonl, name="jsonl")
    for step in range(200):
        w.write_scalars(step, {"loss": float(step)})
    w.flush()
    steps = [json.loads(line)["step"] for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert steps == list(range(200))
    w.close()
    assert jsonl.closed


def test_clu_style_writer_plugs_in_unchanged():
    clu = CluInterfaceWriter()
    w = writers.AsyncWriter(clu)
    w.write_scalars(1, {"a": 1.0})
    w.write_audios(2, {"x": [[[0.0]]]}, sample_rate=100)
    w.write_histograms(3, {"h": [1.0]}, num_buckets={"h": 5})
    w.write_hparams({"lr": 0.1})
    w.close()
    assert clu.scalars == [(1, {"a": 1.0})] and clu.audios[0][2] == 100
    assert clu.histograms[0][2] == {"h": 5} and clu.hparams == [{"lr": 0.1}] and clu.closed
    assert w.name == "CluInterfaceWriter"


def test_full_queue_blocks_the_caller_and_drops_nothing():
    inner = GatedWriter()
    w = writers.AsyncWriter(inner, max_queue=2)
    w.write_scalars(0, {"a": 0})  # taken by the worker, which then blocks on the gate
    assert inner.entered.wait(30)
    w.write_scalars(1, {"a": 1})
    w.write_scalars(2, {"a": 2})  # the queue is now full
    returned = threading.Event()

    def producer():
        w.write_scalars(3, {"a": 3})
        returned.set()

    thread = threading.Thread(target=producer)
    thread.start()
    assert not returned.wait(0.2)  # blocked by back-pressure, not dropped
    inner.gate.set()
    thread.join(30)
    assert returned.is_set()
    w.close()
    assert [step for step, _ in inner.scalars] == [0, 1, 2, 3]


def test_errors_are_raised_on_the_next_call_with_the_writer_name():
    broken = BrokenDiskWriter()
    w = writers.AsyncWriter(broken, name="tensorboard")
    w.write_scalars(5, {"a": 1.0})
    with pytest.raises(writers.WriterError) as info:
        w.flush()
    message = str(info.value)
    assert "AsyncWriter(tensorboard)" in message
    assert "tensorboard.write_scalars(step=5): OSError" in message
    assert "tensorboard.flush(): OSError" in message
    assert isinstance(info.value.__cause__, OSError)
    # Reported once; a later write call reports the failures that happened since.
    w.write_texts(6, {"t": "x"})
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, "the failure was never reported"
        try:
            w.write_hparams({"n": 1})
        except writers.WriterError as err:
            assert "tensorboard.write_texts(step=6): OSError" in str(err)
            break
    with pytest.raises(writers.WriterError, match=r"tensorboard.close\(\)"):
        w.close()
    assert broken.calls[:3] == ["write_scalars", "flush", "write_texts"]
    assert broken.calls[-1] == "close"
    # Its close failed: a later close() calls it again (a writer at a URL uploads then what
    # it could not), reporting only that call's failure.
    with pytest.raises(writers.WriterError) as again:
        w.close()
    assert [name for name, _ in again.value.failures] == ["tensorboard.close()"]
    assert broken.calls.count("close") == 2


def test_with_keeps_the_loops_error_and_notes_the_close_error():
    # The close's WriterError (of an earlier write) replaced the loop's KeyError, which the
    # program's `except KeyError` then missed.
    broken = BrokenDiskWriter()
    with pytest.raises(KeyError, match="loop") as info:
        with writers.AsyncWriter(broken, name="tensorboard") as w:
            w.write_scalars(5, {"a": 1.0})
            raise KeyError("loop")
    [note] = info.value.__notes__
    assert note.startswith("While closing AsyncWriter: AsyncWriter(tensorboard), reported on close")
    assert "tensorboard.write_scalars(step=5): OSError" in note
    assert broken.calls[-1] == "close" and w.closed
    with pytest.raises(writers.WriterError, match=r"write_scalars\(step=5\)"):  # no loop error
        with writers.AsyncWriter(BrokenDiskWriter(), name="tensorboard") as w:
            w.write_scalars(5, {"a": 1.0})


def test_hparams_scalars_and_texts_are_written_as_they_were_at_the_call():
    # The worker read the caller's lists: a config changed after write_hparams was written
    # changed ([64, 64, 128]), as the manager's had been before it copied them.
    inner = GatedWriter()
    w = writers.AsyncWriter(inner)
    w.write_scalars(0, {"a": 0})  # the worker blocks on the gate
    assert inner.entered.wait(30)
    config = {"layers": [64, 64], "opt": {"betas": [0.9, 0.99]}}
    w.write_hparams(config)
    config["layers"].append(128)
    config["opt"]["betas"][0] = 0.5
    # A loop reusing its dict of scalars or texts between calls: each call's own values.
    scalars, texts = {"loss": 1.0}, {"note": "first"}
    w.write_scalars(1, scalars)
    w.write_texts(1, texts)
    scalars["loss"], scalars["lr"], texts["note"] = 2.0, 0.1, "second"
    inner.gate.set()
    w.close()
    assert inner.hparams == [{"layers": [64, 64], "opt.betas": [0.9, 0.99]}]
    assert inner.scalars == [(0, {"a": 0}), (1, {"loss": 1.0})]
    assert inner.texts == [(1, {"note": "first"})]


@pytest.mark.parametrize("error", [SystemExit(3), asyncio.CancelledError("loop stopped")])
def test_a_writer_raising_a_base_exception_is_reported_like_any_error(error):
    class Exiting(writers.NoopWriter):
        def write_scalars(self, step, scalars):
            raise error  # from the worker thread it cannot end the process

    w = writers.AsyncWriter(Exiting(), name="exiting")
    w.write_scalars(5, {"a": 1.0})
    name = type(error).__name__  # a CancelledError was only logged: flush() raised nothing
    with pytest.raises(writers.WriterError, match=rf"exiting.write_scalars\(step=5\): {name}"):
        w.flush()
    w.close()


def test_inside_multiwriter_the_others_get_every_value_and_close_closes_all(tmp_path):
    jsonl = writers.JsonlWriter(tmp_path / "m.jsonl", clock=lambda: 0.0)
    clu = CluInterfaceWriter()
    multi = writers.MultiWriter(
        {
            "broken": writers.AsyncWriter(BrokenDiskWriter(), name="broken"),
            "jsonl": writers.AsyncWriter(jsonl, name="jsonl"),
            "clu": writers.AsyncWriter(clu, name="clu"),
        }
    )
    reported = []
    for step in range(20):
        try:
            multi.write_scalars(step, {"loss": float(step)})
        except writers.WriterError as err:
            reported.append(str(err))
    with pytest.raises(writers.WriterError, match="broken") as info:
        multi.close()
    reported.append(str(info.value))
    # Every failed call is reported exactly once, with the writer's name.
    text = " ".join(reported)
    steps = re.findall(r"broken.write_scalars\(step=(\d+)\)", text)
    assert sorted(int(s) for s in steps) == list(range(20))
    assert text.count("broken.close()") == 1
    assert jsonl.closed and clu.closed
    assert [s for s, _ in clu.scalars] == list(range(20))
    assert [
        json.loads(line)["loss"] for line in (tmp_path / "m.jsonl").read_text().splitlines()
    ] == [float(s) for s in range(20)]


def test_bad_input_raises_at_the_call_site_and_after_close():
    clu = CluInterfaceWriter()
    w = writers.AsyncWriter(clu, name="clu")
    with pytest.raises(ValueError, match=r"AsyncWriter\(clu\).write_scalars: step must be"):
        w.write_scalars(-1, {"a": 1.0})
    with pytest.raises(TypeError, match="every key must be a str"):
        w.write_scalars(0, {2: 1.0})
    with pytest.raises(TypeError, match=r"write_histograms: num_buckets must map keys .* got 8"):
        w.write_histograms(0, {"h": np.ones(3)}, num_buckets=8)
    with pytest.raises(ValueError, match="max_queue must be >= 1"):
        writers.AsyncWriter(clu, max_queue=0)
    for bad in ("128", None, 2.5, True):  # a str raised "'<' not supported"; 2.5 was taken
        with pytest.raises(TypeError) as info:
            writers.AsyncWriter(clu, max_queue=bad)
        assert str(info.value) == (
            f"AsyncWriter(CluInterfaceWriter): max_queue must be an int >= 1, got {bad!r} "
            f"({type(bad).__name__}); 128 suits most loops."
        )
    w.close()
    with pytest.raises(writers.WriterClosedError, match=r"AsyncWriter\(clu\)"):
        w.write_scalars(0, {"a": 1.0})
    w.flush()
    assert clu.scalars == []


def test_scalars_that_are_no_numbers_are_refused_at_the_call_arrays_read_by_the_worker(tmp_path):
    class ArrayLike:  # records the thread that reads it, as a device array would be waited on
        shape, dtype = (), "float32"
        read_on: list[str] = []

        def __array__(self, dtype=None, copy=None):
            self.read_on.append(threading.current_thread().name)
            return np.asarray(2.5, np.float32)

    jsonl = writers.JsonlWriter(tmp_path / "m.jsonl")
    w = writers.AsyncWriter(writers.MultiWriter([jsonl]), name="async")
    with pytest.raises(TypeError) as info:
        w.write_scalars(1, {"ok": 1.0, "name": "abc", "nothing": None})
    message = str(info.value)
    assert "AsyncWriter(async).write_scalars" in message
    assert "scalar 'name' must be a number, got 'abc'" in message and "'nothing'" in message
    assert "Write strings with write_texts" in message
    w.write_scalars(2, {"x": ArrayLike()})
    w.close()
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [(line["step"], line["x"]) for line in lines] == [(2, 2.5)]  # none of the refused call
    assert ArrayLike.read_on and threading.main_thread().name not in ArrayLike.read_on


def test_a_device_array_donated_before_the_worker_reads_it_is_named_with_the_fix(tmp_path):
    import jax
    import jax.numpy as jnp

    gate = threading.Event()

    class GatedJsonl(writers.JsonlWriter):
        def write_scalars(self, step, scalars):
            assert gate.wait(timeout=30)
            super().write_scalars(step, scalars)

    w = writers.AsyncWriter(GatedJsonl(tmp_path / "m.jsonl"), name="async")
    w.write_scalars(1, {"loss": 1.0})  # the worker waits here
    image = jnp.zeros((4, 4, 1)) + 0.5
    w.write_images(1, {"map": image})
    w.write_histograms(1, {"w": image})
    jax.jit(lambda x: x + 1.0, donate_argnums=0)(image)
    assert image.is_deleted()
    gate.set()
    with pytest.raises(writers.WriterError) as info:
        w.close()
    message = str(info.value)
    # It was JAX's bare "RuntimeError: Array has been deleted with shape=float32[4,4,1]".
    assert "2 calls failed" in message and "Array has been deleted" not in message
    for call, named in (("write_images", "image 'map'"), ("write_histograms", "histogram 'w'")):
        assert (
            f"async.{call}(step=1): ValueError: {named}: a device array deleted (donated to a "
            "later computation) before it was read. Pass a copy, or do not donate it."
        ) in message
    lines = writers.read_jsonl(tmp_path / "m.jsonl")
    assert [{k: v for k, v in x.items() if k not in ("time", "collection")} for x in lines] == [
        {"step": 1, "loss": 1.0}
    ]


def test_a_writer_error_after_it_read_a_since_donated_array_is_its_own(tmp_path):
    import jax
    import jax.numpy as jnp

    read, donated = threading.Event(), threading.Event()

    class Flaky(writers.NoopWriter):
        def write_images(self, step, images):
            copies = {k: np.array(v, copy=True) for k, v in images.items()}
            read.set()
            assert donated.wait(timeout=30) and copies
            raise RuntimeError("tracker answered 503: Service Unavailable")

    w = writers.AsyncWriter(Flaky(), name="async")
    image = jnp.zeros((4, 4, 1)) + 0.5
    w.write_images(1, {"map": image})
    assert read.wait(timeout=30)
    jax.jit(lambda x: x + 1.0, donate_argnums=0)(image)  # the loop's next step, after the read
    assert image.is_deleted()
    donated.set()
    with pytest.raises(writers.WriterError) as info:
        w.close()
    # It read "ValueError: image 'map': a device array deleted ... before it was read":
    # the tracker's 503 was named as a donation the writer never met.
    assert str(info.value).endswith(
        "async.write_images(step=1): RuntimeError: tracker answered 503: Service Unavailable"
    )


def test_donated_summaries_name_their_kind_and_keys(tmp_path):
    import jax.numpy as jnp

    w = writers.AsyncWriter(writers.JsonlWriter(tmp_path / "m.jsonl"), name="async")
    one, two, three = jnp.ones(3), jnp.ones(2), jnp.ones(1)
    for x in (one, two, three):
        x.delete()
    w.write_summaries(1, {"x": one})
    w.write_summaries(2, {"y": two, "z": three})
    with pytest.raises(writers.WriterError) as info:
        w.close()
    message = str(info.value)
    # "summaries" lost its "s" alone: "summarie 'x'".
    assert (
        "async.write_summaries(step=1): ValueError: summary 'x': a device array deleted "
        "(donated to a later computation) before it was read. Pass a copy, or do not "
        "donate it."
    ) in message
    assert (
        "async.write_summaries(step=2): ValueError: summaries 'y', 'z': device arrays deleted "
        "(donated to a later computation) before they were read. Pass a copy, or do not "
        "donate them."
    ) in message


def test_a_writer_never_closed_is_drained_at_interpreter_exit(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "m.jsonl"
    script = (
        "import writers\n"
        f"w = writers.AsyncWriter(writers.JsonlWriter({str(path)!r}), name='jsonl')\n"
        "for step in range(500):\n"
        "    w.write_scalars(step, {'loss': float(step)})\n"
        "# no close(): the atexit hook must still write everything\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
    assert steps == list(range(500))


_CTRL_C_DURING_CLOSE = """
import signal, sys, time
import writers

class Slow(writers.JsonlWriter):
    def write_scalars(self, step, scalars):
        time.sleep(0.1)
        super().write_scalars(step, scalars)

w = writers.AsyncWriter(Slow(sys.argv[1]), name="jsonl")
for step in range(1, 31):  # 3 s of writes queued
    w.write_scalars(step, {"loss": float(step)})
print("closing", flush=True)
try:
    w.close()
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_a_close_ended_by_ctrl_c_is_finished_at_exit(tmp_path):
    # The exit hook's close() took the writer for closed and returned at once: the worker, a
    # daemon, died with the interpreter, and 4 of 30 queued writes reached the file.
    path = tmp_path / "m.jsonl"
    proc, out = signal_after(
        _CTRL_C_DURING_CLOSE, [str(path)], "closing\n", signal.SIGINT, delay=0.5
    )
    assert proc.returncode == 0 and out == "interrupted\n", out
    assert [line["step"] for line in writers.read_jsonl(str(path))] == list(range(1, 31))


_HANDLER_CLOSES_SCRIPT = """
import signal, sys, time
import writers

class Slow(writers.JsonlWriter):
    def write_scalars(self, step, scalars):
        time.sleep(1.0)
        super().write_scalars(step, scalars)

w = writers.AsyncWriter(Slow(sys.argv[1]), name="jsonl", max_queue=1)

def on_sigterm(signum, frame):  # the program's own: close the writer, then stop
    w.close()
    print("closed by the handler", flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, on_sigterm)
for step in range(1, 11):
    w.write_scalars(step, {"loss": float(step)})  # waits about 1 s for a slot from step 3
    print("issued", step, flush=True)
"""


def test_a_signal_handler_closing_the_writer_during_a_write_closes_it(tmp_path):
    # The handler's close() ran on the main thread, which held the writer's lock while its
    # write waited for a queue slot: the handler waited forever, and so did the process.
    path = tmp_path / "m.jsonl"
    proc, out = signal_after(
        _HANDLER_CLOSES_SCRIPT, [str(path)], "issued 3\n", signal.SIGTERM, timeout=30
    )
    assert proc.returncode == 0 and out == "closed by the handler\n", out
    assert [line["step"] for line in writers.read_jsonl(str(path))] == [1, 2, 3]


def test_a_key_the_wrapped_writer_reserves_is_refused_at_the_call(tmp_path):
    # It failed on the worker before, one call late, as a WriterError of a later call.
    w = writers.AsyncWriter(writers.JsonlWriter(tmp_path / "m.jsonl"), name="jsonl")
    with pytest.raises(ValueError, match=r"AsyncWriter.*keys \['time'\] are reserved by .*jsonl"):
        w.write_scalars(1, {"time": 3.0})
    w.write_scalars(2, {"train/time": 3.0})
    w.close()
    assert [line["train/time"] for line in writers.read_jsonl(str(tmp_path / "m.jsonl"))] == [3.0]


def test_a_close_from_another_thread_keeps_every_accepted_write(tmp_path):
    """Writes racing a close(): each either reaches the file or raises WriterClosedError."""
    for trial in range(10):
        path = tmp_path / f"m{trial}.jsonl"
        w = writers.AsyncWriter(writers.JsonlWriter(path, clock=lambda: 0.0), max_queue=1)
        accepted, refused, other = [], [], []

        def write(thread: int, w=w, accepted=accepted, refused=refused, other=other) -> None:
            for i in range(10_000):
                try:
                    w.write_scalars(i, {f"w{thread}": float(i)})
                except writers.WriterClosedError:
                    refused.append(thread)
                    return
                except Exception as err:  # noqa: BLE001  (counted, then asserted empty)
                    other.append(err)
                    return
                accepted.append((thread, i))

        threads = [threading.Thread(target=write, args=(t,)) for t in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while not accepted:  # the close races writes under way, not threads yet to start
            assert time.monotonic() < deadline, "no write was accepted"
            time.sleep(0.001)
        w.close()  # raises nothing: no write ran after the wrapped writer closed
        for t in threads:
            t.join()
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        written = sorted((int(k[1:]), x["step"]) for x in lines for k in x if k.startswith("w"))
        assert other == [] and sorted(refused) == [0, 1, 2]
        assert written == sorted(accepted) and len(written) > 0


def test_a_close_from_inside_the_wrapped_writer_is_refused_and_leaves_it_open():
    # The close marked the writer closed before its wait raised RuntimeError: step 2 was
    # refused as written to a closed writer, and the loop's close() returned at once, 1 s
    # before the wrapped writer closed. A wrapped close() calling it waited forever.
    class Closing(writers.NoopWriter):
        refused: list[str] = []
        closed_at = math.inf

        def write_scalars(self, step, scalars):
            if step == 1:
                with pytest.raises(RuntimeError) as info:
                    w.close()
                self.refused.append(str(info.value))
                tried.set()
            time.sleep(0.5)

        def close(self):
            self.closed_at = time.monotonic()
            if not self.refused[1:]:
                with pytest.raises(RuntimeError) as info:
                    w.close()
                self.refused.append(str(info.value))

    inner, tried = Closing(), threading.Event()
    w = writers.AsyncWriter(inner)
    w.write_scalars(1, {"a": 1.0})
    assert tried.wait(10)
    w.write_scalars(2, {"a": 2.0})  # accepted: the writer is still open
    w.close()
    closed = time.monotonic()
    assert inner.closed_at <= closed
    assert inner.refused == 2 * [
        "AsyncWriter(Closing): close() was called from its own worker thread (inside a writer, "
        "or a future's callback), where it would wait for itself forever. Call it from the "
        "training loop."
    ]


def test_clus_async_names_work_as_in_clu(tmp_path):
    """`AsyncMultiWriter`, `ensure_flushes` and `num_workers=1` (CLU's default)."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    multi = writers.AsyncMultiWriter([writers.JsonlWriter(a), writers.JsonlWriter(b)])
    single = writers.AsyncWriter(writers.JsonlWriter(tmp_path / "c.jsonl"), num_workers=1)
    with writers.ensure_flushes(multi, single) as first:
        assert first is multi
        first.write_scalars(4, {"loss": 0.5})
        single.write_scalars(5, {"loss": 0.25})
    # Flushed on leaving the block, before any close.
    for path, step, loss in ((a, 4, 0.5), (b, 4, 0.5), (tmp_path / "c.jsonl", 5, 0.25)):
        [line] = [json.loads(x) for x in path.read_text().splitlines()]
        assert (line["step"], line["loss"]) == (step, loss)
    multi.close()
    single.close()
    for workers in (2, None, True):
        with pytest.raises(ValueError, match=rf"num_workers must be 1 .*got {workers!r}"):
            writers.AsyncWriter(writers.NoopWriter(), num_workers=workers)


def test_ensure_flushes_flushes_every_writer_and_keeps_the_blocks_error(tmp_path):
    # A failing first writer left the second unflushed, and its error replaced the block's.
    path = tmp_path / "m.jsonl"
    jsonl = writers.AsyncWriter(writers.JsonlWriter(path, clock=lambda: 0.0))
    with pytest.raises(KeyError, match="loop") as info:
        with writers.ensure_flushes(BrokenDiskWriter(), jsonl):
            jsonl.write_scalars(3, {"loss": 0.5})
            raise KeyError("loop")
    assert [json.loads(line)["loss"] for line in path.read_text().splitlines()] == [0.5]
    assert info.value.__notes__ == [
        "While flushing: ensure_flushes: 1 writer failed: BrokenDiskWriter: OSError: "
        "[Errno 28] No space left on device"
    ]
    with pytest.raises(writers.WriterError, match=r"1 writer failed: BrokenDiskWriter: OSError"):
        with writers.ensure_flushes(BrokenDiskWriter(), jsonl):
            jsonl.write_scalars(4, {"loss": 0.25})
    assert [json.loads(line)["loss"] for line in path.read_text().splitlines()] == [0.5, 0.25]
    jsonl.close()


_FORK_CHILD_FLUSHES = """
import os, sys, threading
import writers

gate = threading.Event()


class Slow(writers.TensorBoardWriter):
    def write_scalars(self, step, scalars):
        gate.wait()  # the parent's calls wait in the queue when the child forks
        super().write_scalars(step, scalars)


w = writers.AsyncWriter(Slow(sys.argv[1]))
for step in range(5):
    w.write_scalars(step, {"loss": float(step)})
if (pid := os.fork()) == 0:  # a fork-started data-loader worker that flushes, writes, closes
    gate.set()
    for call in (w.flush, lambda: w.write_scalars(100, {"loss": 100.0})):
        try:
            call()
        except RuntimeError as err:
            print("child:", err, flush=True)
    w.close()  # the parent's to close: nothing happens
    os._exit(0)
print("child ended with", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
gate.set()
w.close()
"""


def test_a_forked_child_cannot_write_the_parents_queue_again(tmp_path):
    """A child's flush started a new thread on its copy of the queue: each of the parent's
    queued calls reached the event file twice (200 events for 100 steps), and the child's
    own values went into the parent's file."""
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_CHILD_FLUSHES, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    refused = (
        r"child: AsyncWriter\(Slow\) was made in process \d+ and is used in a forked child "
        r"\(\d+\), where its queue, the parent's, would be written a second time. Make a new "
        r"writer in the child, or start it with 'spawn'."
    )
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and all(re.fullmatch(refused, line) for line in lines[:2]), lines
    assert lines[2] == "child ended with 0"
    events = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    steps = [e.step for e in events.Scalars("loss")]
    assert steps == [0, 1, 2, 3, 4]


def test_ensure_flushes_of_no_writer_says_so():
    # CLU's and ours raised IndexError ('tuple index out of range') at the with.
    entered = []
    with pytest.raises(TypeError, match="ensure_flushes: expected at least one writer, got none"):
        with writers.ensure_flushes():
            entered.append(1)
    assert entered == []
