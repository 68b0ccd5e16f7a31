"""MultiWriter: fan-out, one failing writer stops none, errors name the writer."""

from __future__ import annotations

import json

import numpy as np
import pytest

import writers
from tests.writers.failing import BrokenDiskWriter, CluInterfaceWriter


def test_a_writer_raising_oserror_does_not_stop_the_others(tmp_path):
    jsonl = writers.JsonlWriter(tmp_path / "m.jsonl", clock=lambda: 0.0)
    clu = CluInterfaceWriter()
    broken = BrokenDiskWriter()
    multi = writers.MultiWriter({"jsonl": jsonl, "broken": broken, "clu": clu})
    for step in range(3):
        with pytest.raises(
            writers.WriterError,
            match=r"MultiWriter.write_scalars: 1 writer failed: broken: OSError",
        ) as info:
            multi.write_scalars(step, {"loss": float(step)})
        assert isinstance(info.value.__cause__, OSError)
        assert [name for name, _ in info.value.failures] == ["broken"]
    with pytest.raises(writers.WriterError, match="broken"):
        multi.write_texts(3, {"note": "hi"})
    with pytest.raises(writers.WriterError, match="broken"):
        multi.flush()
    with pytest.raises(writers.WriterError, match=r"MultiWriter.close: 1 writer failed: broken"):
        multi.close()
    assert clu.scalars == [(0, {"loss": 0.0}), (1, {"loss": 1.0}), (2, {"loss": 2.0})]
    assert clu.texts == [(3, {"note": "hi"})] and clu.flushed == 1 and clu.closed
    assert jsonl.closed
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [line.get("loss", line.get("note")) for line in lines] == [0.0, 1.0, 2.0, "hi"]
    assert broken.calls == ["write_scalars"] * 3 + ["write_texts", "flush", "close"]


def test_a_writer_that_pops_or_changes_keys_changes_nothing_the_next_one_gets():
    class Meddling(writers.NoopWriter):
        def write_scalars(self, step, scalars):
            scalars["loss"] /= 100
            scalars.pop("lr")

        def write_histograms(self, step, arrays, num_buckets=None):
            arrays.clear()
            num_buckets.clear()

    clu = CluInterfaceWriter()
    multi = writers.MultiWriter({"meddling": Meddling(), "clu": clu})
    multi.write_scalars(1, {"loss": 40.0, "lr": 0.5})
    multi.write_histograms(2, {"h": np.arange(3)}, num_buckets={"h": 2})
    assert clu.scalars == [(1, {"loss": 40.0, "lr": 0.5})]
    assert list(clu.histograms[0][1]) == ["h"] and clu.histograms[0][2] == {"h": 2}


def test_clu_style_writer_gets_num_buckets_as_the_caller_passed_it():
    # None reached a wrapped writer as {} and {"h": None} as {}: a CLU writer reading
    # `num_buckets[key]` whenever num_buckets is not None raised KeyError.
    clu = CluInterfaceWriter()
    multi = writers.MultiWriter([writers.AsyncWriter(clu)])
    multi.write_histograms(1, {"h": np.arange(3)})
    multi.write_histograms(2, {"h": np.arange(3)}, num_buckets={"h": None})
    multi.write_histograms(3, {"h": np.arange(3), "g": np.ones(2)}, num_buckets={"h": np.int64(4)})
    multi.flush()
    assert [(step, buckets) for step, _, buckets in clu.histograms] == [
        (1, None),
        (2, {"h": None}),
        (3, {"h": 4}),
    ]


def test_every_failure_is_reported():
    multi = writers.MultiWriter([BrokenDiskWriter(), BrokenDiskWriter(), writers.NoopWriter()])
    with pytest.raises(writers.WriterError) as info:
        multi.write_scalars(0, {"a": 1.0})
    assert [name for name, _ in info.value.failures] == ["BrokenDiskWriter#0", "BrokenDiskWriter#1"]
    assert "2 writers failed" in str(info.value)


def test_clu_style_writer_gets_every_kind_by_keyword():
    clu = CluInterfaceWriter()
    multi = writers.MultiWriter([clu])
    multi.write_audios(1, {"a": np.zeros((1, 4, 1))}, sample_rate=8000)
    multi.write_histograms(2, {"h": np.arange(3)}, num_buckets={"h": 2})
    multi.write_hparams({"lr": 0.1})
    multi.write_summaries(3, {"t": np.ones(2)}, metadata=b"meta")
    assert clu.audios[0][0] == 1 and clu.audios[0][2] == 8000
    assert clu.histograms[0][0] == 2 and clu.histograms[0][2] == {"h": 2}
    assert clu.hparams == [{"lr": 0.1}] and clu.summaries[0][2] == b"meta"
    writers.write_values(multi, 4, {"x": 1.0})
    assert clu.scalars == [(4, {"x": 1.0})]


def test_bad_input_reaches_no_writer_and_close_is_idempotent():
    clu = CluInterfaceWriter()
    multi = writers.MultiWriter([clu])
    with pytest.raises(TypeError, match=r"MultiWriter.write_scalars: every key must be a str"):
        multi.write_scalars(0, {1: 1.0})
    with pytest.raises(ValueError, match="non-negative"):
        multi.write_scalars(-1, {"a": 1.0})
    with pytest.raises(TypeError) as info:  # arrays by shape and dtype, before any writer
        multi.write_scalars(0, {"v": np.ones(3), "d": np.datetime64("2020-01-01"), "s": "x"})
    message = str(info.value)
    assert message.startswith("MultiWriter.write_scalars: 3 problems:")
    assert "'v' must hold exactly one number, got an array of shape (3,)" in message
    assert "'d' must be a number, got an array of dtype datetime64[D]" in message
    assert "'s' must be a number, got 'x'" in message
    assert clu.scalars == []
    multi.close()
    multi.close()
    multi.flush()
    with pytest.raises(writers.WriterClosedError):
        multi.write_scalars(0, {"a": 1.0})
    assert clu.closed


def test_bad_nested_hparam_keys_reach_no_writer(tmp_path):
    # Only top-level keys were checked before the dict was flattened: a lone surrogate
    # reached every writer (each failed), "" became the name "x.", and 1 became "x.1".
    jsonl = writers.JsonlWriter(tmp_path)
    multi = writers.MultiWriter([jsonl, writers.TensorBoardWriter(tmp_path)])
    with pytest.raises(ValueError, match=r"^MultiWriter.write_hparams: .*surrogate"):
        multi.write_hparams({"x": {"bad\udcff": 1}})
    with pytest.raises(TypeError) as info:
        multi.write_hparams({"x": {"": 1, 1: 2, "ok": 3}, "y": {"z": {" ": 4}}})
    assert str(info.value) == (
        "MultiWriter.write_hparams: 3 problems:\n"
        "  - hyperparameter 'x' holds the key 1; nested keys must be non-empty str names, as "
        "top-level ones\n"
        "  - hyperparameter 'x' holds the key ''; nested keys must be non-empty str names, as "
        "top-level ones\n"
        "  - hyperparameter 'y.z' holds the key ' '; nested keys must be non-empty str names, "
        "as top-level ones"
    )
    # A bad top-level key was raised alone; the nested one came up only once it was fixed.
    with pytest.raises(TypeError) as info:
        multi.write_hparams({3: 4, "a": {"": 1}})
    assert str(info.value) == (
        "MultiWriter.write_hparams: 2 problems:\n"
        "  - every key must be a str, got 3 (int). Convert keys with str().\n"
        "  - hyperparameter 'a' holds the key ''; nested keys must be non-empty str names, as "
        "top-level ones"
    )
    multi.write_hparams({"x": {"ok": 3}})
    multi.close()
    lines = writers.read_jsonl(tmp_path / "metrics.jsonl")
    assert [line.get("hparams") for line in lines] == [{"x.ok": 3}]


def test_objects_that_are_not_writers_are_rejected_up_front():
    class HalfWriter:
        def write_scalars(self, step, scalars):
            pass

    with pytest.raises(TypeError) as info:
        writers.MultiWriter(
            {"half": HalfWriter(), "cls": writers.NoopWriter, "ok": writers.NoopWriter()}
        )
    message = str(info.value)
    assert "'half' (HalfWriter) lacks write_summaries, write_images" in message
    assert "'cls' is the class NoopWriter, not an instance" in message and "'ok'" not in message
    with pytest.raises(TypeError, match=r"'HalfWriter' \(HalfWriter\) lacks"):
        writers.AsyncWriter(HalfWriter())
    with pytest.raises(TypeError, match="every key must be a str"):
        writers.MultiWriter({1: writers.NoopWriter()})


def test_writers_that_cannot_take_clus_keywords_are_rejected_up_front():
    class Positional(writers.NoopWriter):
        def write_texts(self, step, text_dict):  # type: ignore[no-untyped-def,override]
            pass

    for owner, make in (
        ("MultiWriter", lambda: writers.MultiWriter([Positional()])),
        ("AsyncWriter", lambda: writers.AsyncWriter(Positional())),
    ):
        with pytest.raises(TypeError) as info:
            make()
        assert str(info.value) == (
            f"{owner}: 'Positional' (Positional).write_texts(step, text_dict) cannot take "
            "write_texts(step=..., texts=...): missing a required argument: 'text_dict'; accept "
            "MetricWriter's parameters by those names (callers pass them by keyword) and give "
            "any other a default"
        )


def test_writers_with_async_def_methods_are_rejected_up_front():
    # Each call made a coroutine nobody awaited: nothing was written, and no error said so.
    class Awaiting(writers.NoopWriter):
        async def write_scalars(self, step, scalars):  # type: ignore[no-untyped-def,override]
            pass

    for owner, make in (
        ("MultiWriter", lambda: writers.MultiWriter([Awaiting()])),
        ("AsyncWriter", lambda: writers.AsyncWriter(Awaiting())),
    ):
        with pytest.raises(TypeError) as info:
            make()
        assert str(info.value) == (
            f"{owner}: 'Awaiting' (Awaiting).write_scalars is async def: its calls would return "
            "coroutines nobody awaits and write nothing; make it a plain def that runs the "
            "coroutine (asyncio.run, or a loop of the writer's own)"
        )


def test_a_key_reserved_by_one_writer_is_refused_before_any_writes_it(tmp_path):
    # TensorBoard stored the tag "step" before JSONL refused it: the logs disagreed.
    w = writers.create_default_writer(str(tmp_path), console=False)
    assert set(w.reserved_keys) == {"step", "time", "collection"}
    with pytest.raises(
        ValueError, match=r"keys \['step'\] are reserved by writer\(s\) \['jsonl'\]"
    ):
        w.write_scalars(4, {"step": 1.0, "loss": 2.0})
    w.write_scalars(5, {"train/step": 1.0})
    w.write_scalars(6, {})  # an empty write: no line
    w.close()
    assert [
        json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ] == [5]
    events = [e for f in tmp_path.glob("events.out.tfevents*") for e in _tags(f)]
    assert events == ["train/step"]


def _tags(path):
    from tensorboard.backend.event_processing import event_file_loader

    return [
        v.tag
        for event in event_file_loader.EventFileLoader(str(path)).Load()
        for v in event.summary.value
    ]


def test_one_writer_not_in_a_list_is_refused_with_the_fix():
    # "'NoopWriter' object is not iterable", naming neither the argument nor the fix.
    for make in (writers.MultiWriter, writers.AsyncMultiWriter):
        with pytest.raises(TypeError, match=r"got NoopWriter; wrap a single writer in a list"):
            make(writers.NoopWriter())


def test_async_multi_writer_refusing_a_writer_leaves_no_thread_running():
    import threading

    before = threading.active_count()
    for _ in range(3):
        with pytest.raises(TypeError, match="'int' \\(int\\) lacks write_summaries"):
            writers.AsyncMultiWriter([writers.NoopWriter(), 3])
    assert threading.active_count() == before  # one AsyncWriter thread was left per call
    multi = writers.AsyncMultiWriter({"a": writers.NoopWriter()})  # names kept
    assert list(multi.writers) == ["a"]
    multi.close()


@pytest.mark.parametrize("error", [SystemExit, KeyboardInterrupt])
def test_a_writer_raising_a_base_exception_leaves_no_writer_marked_as_called(error):
    class Quitting(writers.NoopWriter):
        def write_scalars(self, step, scalars):
            raise error(f"at step {step}")

    quitting = Quitting()
    multi = writers.MultiWriter({"quitting": quitting, "none": writers.NoopWriter()})
    with pytest.raises(error, match="at step 3"):
        multi.write_scalars(3, {"loss": 0.5})
    # A manager abandoning a later call inside `multi` holds `calling` as the hung writer.
    assert multi.calling is None
