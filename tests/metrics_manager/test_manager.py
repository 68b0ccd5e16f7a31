"""Tests for MetricsManager: summaries, ordering, process 0, errors, threads, lifecycle.

Writers here are real `writers.MetricWriter`s (a recorder from the writers tests,
and small subclasses that fail on purpose); the clock is faked so durations are
exact. Files written through the default writers are checked in
`test_manager_files.py`.
"""

from __future__ import annotations

import doctest
import functools
import itertools
import json
import logging
import re
import threading
import time
from typing import Any

import clu.metrics as clu_metrics
import clu.values
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import writers
from metrics_manager import manager as manager_lib
from metrics_manager import timer as timer_lib
from metrics_manager.classification import AUROC, Perplexity, Precision
from metrics_manager.manager import MetricsManager, MetricsManagerError
from metrics_manager.merging import merge_metrics
from metrics_manager.metrics import (
    AveragePerStep,
    MeanStd,
    StepsPerTime,
    Sum,
    Time,
    TimeRate,
    Welford,
    set_time_metrics_duration,
)
from metrics_manager.packing import PackedMetrics
from tests.writers.recording import RecordingWriter


@flax.struct.dataclass
class TextMetric(clu_metrics.Metric):
    """T5X's test metric: compute_value() is a Text."""

    def compute_value(self) -> clu.values.Text:
        return clu.values.Text("test metric")


@flax.struct.dataclass
class MergeableText(TextMetric):
    """TextMetric that can sit in a merged accumulator (the text does not change)."""

    def merge(self, other: MergeableText) -> MergeableText:
        return self


@flax.struct.dataclass
class BrokenMetric(clu_metrics.Metric):
    total: jax.Array

    def compute_value(self) -> clu.values.Scalar:
        raise ValueError("cannot compute this one")


class BrokenWriter(writers.NoopWriter):
    """A writer whose scalar writes fail (e.g. a full disk)."""

    def write_scalars(self, step: int, scalars: Any) -> None:
        raise OSError("disk full")


class FakeClock:
    def __init__(self, *times: float) -> None:
        self._times = list(times)

    def __call__(self) -> float:
        return self._times.pop(0)


def t5x_metrics() -> dict[str, Any]:
    return {
        "loss": Sum(jnp.float32(40.0)),
        "accuracy": AveragePerStep(total=jnp.float32(20.0)),
        "steps_per_second": StepsPerTime(),
        "text": TextMetric(),
    }


def make(writer: writers.MetricWriter | None = None, **kwargs: Any) -> MetricsManager:
    writer = writer if writer is not None else RecordingWriter()
    kwargs.setdefault("clock", FakeClock(0.0, 40.0))
    return MetricsManager("train", writer_factory=lambda logdir: writer, **kwargs)


def written(recorder: RecordingWriter) -> list[tuple[Any, ...]]:
    return [(method, *args) for method, args, _ in recorder.calls]


def test_docstring_examples_run():
    result = doctest.testmod(manager_lib)
    assert result.attempted >= 5
    assert result.failed == 0


def test_t5x_case_summary_and_writer_calls():
    recorder = RecordingWriter()
    with make(recorder) as manager:
        manager.start_duration_timer(block_on={"params": jnp.ones(3)})
        summary = manager.write_metrics_summary(t5x_metrics(), step=4, num_steps=2).result()
    assert set(summary) == {"loss", "accuracy", "steps_per_second", "text"}
    assert float(summary["loss"].value) == 40.0
    assert float(summary["accuracy"].value) == 10.0  # total 20 over num_steps 2
    assert float(summary["steps_per_second"].value) == pytest.approx(0.05)  # 2 steps / 40 s
    assert summary["text"] == clu.values.Text("test metric")
    calls = written(recorder)
    assert calls[0][:2] == ("write_scalars", 4)
    assert {k: float(v) for k, v in calls[0][2].items()} == pytest.approx(
        {"loss": 40.0, "accuracy": 10.0, "steps_per_second": 0.05}
    )
    assert calls[1:] == [("write_texts", 4, {"text": "test metric"}), ("close",)]


def test_t5x_case_through_a_packed_accumulator_matches_the_dict_path():
    """Two steps merged into a PackedMetrics give T5X's summary, as the dict path does."""

    def step_metrics() -> dict[str, Any]:
        return {
            "loss": Sum(jnp.float32(20.0)),
            "accuracy": AveragePerStep(total=jnp.float32(10.0)),
            "steps_per_second": StepsPerTime(),
            "text": MergeableText(),
        }

    merge = jax.jit(merge_metrics)
    packed = merge(merge_metrics(None, step_metrics(), pack=True), step_metrics())
    plain = merge(merge_metrics(None, step_metrics()), step_metrics())
    assert isinstance(packed, PackedMetrics) and isinstance(plain, dict)
    results = []
    for metrics in (packed, plain):
        recorder = RecordingWriter()
        with make(recorder) as manager:
            manager.start_duration_timer(block_on={"params": jnp.ones(3)})
            summary = manager.write_metrics_summary(metrics, step=4, num_steps=2).result()
        results.append((summary, written(recorder)))
    (packed_summary, packed_calls), (plain_summary, plain_calls) = results
    assert float(packed_summary["loss"].value) == 40.0
    assert float(packed_summary["accuracy"].value) == 10.0
    assert float(packed_summary["steps_per_second"].value) == pytest.approx(0.05)
    assert packed_summary["text"] == clu.values.Text("test metric")
    assert packed_summary.keys() == plain_summary.keys()
    for key, value in plain_summary.items():
        np.testing.assert_array_equal(np.asarray(packed_summary[key].value), value.value)
    assert packed_calls[0][:2] == plain_calls[0][:2] == ("write_scalars", 4)
    assert {k: float(v) for k, v in packed_calls[0][2].items()} == {
        k: float(v) for k, v in plain_calls[0][2].items()
    }
    assert packed_calls[1:] == plain_calls[1:]


def test_packed_metrics_are_copied_in_one_fetch_without_dispatch(monkeypatch):
    from metrics_manager import summary as summary_lib

    packed = merge_metrics(None, t5x_metrics(), pack=True)
    fetches: list[Any] = []
    real_fetch = summary_lib._fetch
    monkeypatch.setattr(summary_lib, "_fetch", lambda x: fetches.append(x) or real_fetch(x))
    monkeypatch.setattr(summary_lib, "_pack", None)  # a PackedMetrics needs no pack dispatch
    with make() as manager:
        manager.start_duration_timer()
        summary = manager.write_metrics_summary(packed, step=4, num_steps=2).result()
    assert float(summary["loss"].value) == 40.0
    assert len(fetches) == 1 and fetches[0] is packed.buffers


def test_fetch_reads_cpu_buffers_like_device_get():
    from metrics_manager.summary import _fetch

    buffers = (jnp.arange(5, dtype=jnp.float32) * 1.5, jnp.arange(3, dtype=jnp.int32))
    host = _fetch(buffers)
    expected = jax.device_get(buffers)
    assert all(type(h) is np.ndarray for h in host)
    for h, e in zip(host, expected, strict=True):
        assert h.dtype == e.dtype and h.tolist() == e.tolist()


def test_donated_packed_metrics_say_what_happened():
    packed = merge_metrics(None, {"loss": Sum(jnp.float32(1.0))}, pack=True)
    for buffer in packed.buffers:
        buffer.delete()
    manager = make(clock=lambda: 0.0)
    future = manager.write_metrics_summary(packed, step=1, num_steps=1)
    with pytest.raises(
        ValueError,
        match=r"\['loss'\] of the summary at step 1 to the host: buffer 0 \(float32\[1\]\) was del",
    ):
        future.result()
    manager.close()  # on_error="warn": the failure is kept in errors, close() does not raise
    assert "was deleted" in str(manager.errors[0])
    assert "`running = None` after each write_metrics_summary" in str(manager.errors[0])


def test_donated_metrics_of_a_dict_say_what_happened_too():
    # merge_metrics(..., pack=False): packing them on the worker raised JAX's bare
    # "RuntimeError: Array has been deleted with shape=int32[]", with no word of the fix.
    metrics = {"loss": AveragePerStep.from_model_output(jnp.float32(1.0)), "n": Sum(jnp.ones(()))}
    metrics["n"].total.delete()
    manager = make(clock=lambda: 0.0)
    future = manager.write_metrics_summary(metrics, step=3, num_steps=1)
    with pytest.raises(ValueError) as info:
        future.result()
    manager.close()
    assert str(info.value) == (
        "Cannot copy the metrics ['loss', 'n'] of the summary at step 3 to the host: the "
        "arrays of 'n' were deleted (donated to a later computation). A step that donates "
        "`running` needs `running = None` after each write_metrics_summary (NNX metrics: "
        "`metrics.reset()`), so the next window starts afresh; otherwise do not donate the "
        "metrics you pass (or pass a copy)."
    )


def test_a_plain_value_donated_while_the_worker_copies_it_costs_only_its_key(monkeypatch):
    # The loop's next step donated `loss` between the worker's look and its copy: JAX's bare
    # "Array has been deleted" failed the whole summary, `total` and `acc` too.
    from metrics_manager import summary as summary_lib

    fetch, racing = summary_lib._fetch, []

    def donated_meanwhile(buffers):
        if racing and any(b is racing[0] for b in buffers):  # after the look, before the copy
            racing.pop().delete()
        return fetch(buffers)

    monkeypatch.setattr(summary_lib, "_fetch", donated_meanwhile)
    loss, acc = jnp.asarray(2.0) + 1.0, jnp.asarray(0.5) + 0.25
    recorder = RecordingWriter()
    with make(recorder, clock=lambda: 0.0) as manager:
        racing.append(loss)
        metrics = {"loss": loss, "acc": acc, "total": Sum(np.float32(5.0))}
        summary = manager.write_metrics_summary(metrics, 7, 1).result()
    assert {k: float(v.value) for k, v in summary.items()} == {"acc": 0.75, "total": 5.0}
    assert written(recorder)[:1] == [("write_scalars", 7, {"acc": 0.75, "total": 5.0})]
    assert [(f.source, f.step) for f in manager.errors] == [("metric:loss", 7)]
    assert (
        "metric 'loss': a device array deleted (donated to a later computation) before it was "
        "read. Pass a copy, or do not donate it."
    ) in str(manager.errors[0])


def _window_warnings(
    caplog: Any,
    merges_per_step: int,
    windows: list[int],
    reset: bool,
    num_steps: Any = None,
    every_step: bool = False,
) -> list:
    """Runs a loop that does not donate, passing `num_steps` (default: `windows`), resetting
    `running` before every step too where `every_step`; returns its warnings about window
    lengths and its losses."""
    step = jax.jit(
        lambda running, x: merge_metrics(running, {"loss": AveragePerStep.from_model_output(x)})
    )
    recorder, losses = RecordingWriter(), []
    with caplog.at_level(logging.WARNING, logger="metrics_manager.manager"):
        with make(recorder, clock=time.perf_counter) as manager:
            running, at = None, 0
            for window, passed in zip(windows, num_steps or windows, strict=True):
                for merge in range(window * merges_per_step):  # T5X merges microbatches so
                    running = None if every_step and merge % merges_per_step == 0 else running
                    running = step(running, jnp.float32(1.0))
                at += window
                summary = manager.write_metrics_summary(running, at, passed).result()
                losses.append(float(summary["loss"].value))
                running = None if reset else running
    warnings = [r.getMessage() for r in caplog.records if " merged " in r.getMessage()]
    caplog.clear()
    return [warnings, losses]


def test_a_loop_that_keeps_merging_into_written_windows_is_warned_once(caplog):
    warnings, losses = _window_warnings(caplog, 1, [10, 10, 10, 10], reset=False)
    assert losses == [1.0, 2.0, 3.0, 4.0]  # the per-step loss is 1: the windows are cumulative
    assert warnings == [
        "MetricsManager 'train': the summaries up to step 30 merged 10, 20, 30 steps for "
        "num_steps 10, 10, 10: each window holds the ones already written. Start every window "
        "from running = None after write_metrics_summary (per-step averages such as loss are "
        "cumulative otherwise)."
    ]
    # Loops that reset are never warned: windows of any length, 2 merges a step or 1.
    assert _window_warnings(caplog, 2, [10, 3, 25, 7, 1], reset=True) == [[], [2.0] * 5]
    assert _window_warnings(caplog, 1, [5, 50, 500], reset=True) == [[], [1.0] * 3]


def test_a_short_last_window_written_with_the_usual_num_steps_is_warned_once(caplog):
    # 25 steps with a summary every 10: the last window holds 5 steps, and the loop says 10.
    warnings, losses = _window_warnings(caplog, 2, [10, 10, 5], True, num_steps=[10, 10, 10])
    assert losses == [2.0, 2.0, 1.0]  # 2 merges a step: a per-step loss of 2, read as 1
    assert warnings == [
        "MetricsManager 'train': the summary at step 25 merged 10 steps for num_steps=10, the "
        "one before 20 for 10: if this window is shorter (a run's last), pass the steps it "
        "holds as num_steps; per-step averages read 0.5x and steps per second 2x their value "
        "otherwise."
    ]
    # With the window's own steps: no warning, and the right loss.
    assert _window_warnings(caplog, 2, [10, 10, 5], True) == [[], [2.0] * 3]


def test_a_loop_that_starts_every_step_from_running_none_is_warned_once(caplog):
    # `running = None` before every step (not after each summary): each summary holds the
    # last step alone, and its per-step loss of 1 reads 1/10.
    warnings, losses = _window_warnings(caplog, 1, [10] * 4, True, every_step=True)
    assert losses == pytest.approx([0.1] * 4)
    assert warnings == [
        "MetricsManager 'train': the summaries up to step 30 each merged 1 step for num_steps "
        "10, 10, 10 ('loss' and every other Step metric): each holds one step's metrics, as "
        "when running = None is set before every step or a step's own metrics are passed, so "
        "per-step averages such as loss read that step's total / num_steps and the other "
        "metrics that step's alone. Merge every step into running (merge_metrics in the step) "
        "and set running = None only after write_metrics_summary; a metric made once for a "
        "whole window takes steps=num_steps."
    ]
    # A summary every step, or windows of 2 steps of 2 merges each (microbatches): the loops
    # that merge every step into the window are not warned.
    assert _window_warnings(caplog, 1, [1] * 5, True, every_step=True) == [[], [1.0] * 5]
    assert _window_warnings(caplog, 2, [2] * 5, True) == [[], [2.0] * 5]


def test_a_step_count_made_once_a_window_next_to_merged_metrics_is_not_warned(caplog):
    # A StepsPerTime made on the host at each summary counts 1 step; `loss`, merged every
    # step, counts the window's 4: the loop is right, and not warned whichever key is first.
    step = jax.jit(
        lambda running, x: merge_metrics(running, {"loss": AveragePerStep.from_model_output(x)})
    )
    with caplog.at_level(logging.WARNING, logger="metrics_manager.manager"):
        with make(RecordingWriter(), clock=time.perf_counter) as manager:
            manager.start_duration_timer()
            for at in range(4, 40, 4):
                running = None
                for _ in range(4):
                    running = step(running, jnp.float32(1.0))
                metrics = {"sps": StepsPerTime(), **running}
                summary = manager.write_metrics_summary(metrics, at, 4).result()
                manager.start_duration_timer()
                assert float(summary["loss"].value) == 1.0
    assert manager._summarizer._step_key == "loss"  # the count read once "sps" read 1 thrice
    assert [r.getMessage() for r in caplog.records if " merged " in r.getMessage()] == []


def _timer_warnings(
    caplog: Any, timer_first: bool, num_steps: int, keys: tuple[str, ...], **kwargs: Any
) -> list[list[Any]]:
    """Runs 20 windows of a jitted loop whose summary opens the next window after it (the
    README's loop) or, `timer_first`, just before it; returns the warnings about windows
    opened just before their summary and the steps per second written."""

    def metrics(x: jax.Array) -> dict[str, Any]:
        made = {
            "loss": AveragePerStep.from_model_output(x),
            "sps": StepsPerTime.from_model_output(),
        }
        return {key: made[key] for key in keys}

    step = jax.jit(lambda x, running: (x + 1.0, merge_metrics(running, metrics(x))))
    kwargs.setdefault("clock", time.perf_counter)
    recorder, rates = RecordingWriter(), []
    with caplog.at_level(logging.WARNING, logger="metrics_manager.manager"):
        with make(recorder, **kwargs) as manager:
            state, running = jnp.float32(1.0), None
            manager.start_duration_timer(block_on=state)
            for at in range(1, 20 * num_steps + 1):
                state, running = step(state, running)
                if at % num_steps == 0:
                    if timer_first:
                        manager.start_duration_timer(block_on=state)
                    summary = manager.write_metrics_summary(running, at, num_steps).result()
                    rates.append(float(summary["sps"].value) if "sps" in summary else None)
                    running = None
                    if not timer_first:
                        manager.start_duration_timer(block_on=state)
    warnings = [r.getMessage() for r in caplog.records if "no train step" in r.getMessage()]
    caplog.clear()
    return [warnings, rates]


def test_a_window_opened_just_before_its_summary_is_warned_once(caplog):
    # start_duration_timer then write_metrics_summary: the window opens when the step that
    # made the summary's metrics ends, and closes as they are ready then: it times no step.
    warnings, rates = _timer_warnings(caplog, True, 5, ("loss", "sps"))
    assert len(rates) == 20 and len(warnings) == 1, warnings
    pattern = (
        r"MetricsManager 'train': the windows of the last 3 summaries, up to step (\d+), were "
        r"opened by start_duration_timer ([\d.e-]+) us before write_metrics_summary, with no "
        r"train step between: the one at step \1 took ([\d.e-]+) s for num_steps=5, so steps "
        r"per second and the other time rates are far too high. Call "
        r"manager.start_duration_timer\(block_on=state\) after write_metrics_summary \(and "
        r"running = None\), so each window holds the next num_steps steps.$"
    )
    match = re.match(pattern, warnings[0])
    assert match is not None, warnings[0]
    assert int(match[1]) % 5 == 0 and float(match[2]) < 1.0
    # The README's loop, 5 steps a window or 1: its windows hold their steps, no warning.
    assert _timer_warnings(caplog, False, 5, ("loss", "sps"))[0] == []
    assert _timer_warnings(caplog, False, 1, ("loss", "sps"))[0] == []
    # Nothing reads the window's duration (no timed key), or the loop's own clock times it.
    assert _timer_warnings(caplog, True, 5, ("loss",)) == [[], [None] * 20]
    ticks = itertools.count(0.0, 0.25)  # seconds of a scripted clock, on every reading
    warnings, rates = _timer_warnings(caplog, True, 5, ("sps",), clock=lambda: next(ticks))
    assert warnings == [] and len(rates) == 20 and all(0 < rate <= 20 for rate in rates)


def test_summary_dir_is_dir_slash_name(tmp_path, monkeypatch):
    seen = []
    manager = MetricsManager(
        "eval/glue", tmp_path, writer_factory=lambda d: seen.append(d) or writers.NoopWriter()
    )
    manager.close()
    assert manager.summary_dir == str(tmp_path / "eval" / "glue")
    assert seen == [manager.summary_dir]
    no_dir = MetricsManager(
        "train", writer_factory=lambda d: seen.append(d) or writers.NoopWriter()
    )
    no_dir.close()
    assert no_dir.summary_dir is None and seen[-1] is None
    # T5X: `os.path.join(summary_dir, name) if summary_dir else None`: "" writes no files.
    monkeypatch.chdir(tmp_path)
    with MetricsManager("empty", "") as empty:
        empty.write_scalar("x", 1.0, 1)
    assert empty.summary_dir is None and not (tmp_path / "empty").exists()


def test_a_t5x_create_writer_override_is_refused_naming_writer_factory(tmp_path):
    # A T5X subclass that plugs its writer in through `_create_writer` got the default
    # writers instead, silently: its writer was never made, its metrics never reached it.
    class WithOwnWriter(MetricsManager):
        def _create_writer(self, name: str, summary_dir: str | None = None) -> Any:
            return RecordingWriter()

    with pytest.raises(TypeError) as refused:
        WithOwnWriter("train", tmp_path)
    assert str(refused.value) == (
        "MetricsManager: WithOwnWriter overrides _create_writer(name, summary_dir), T5X's hook "
        "for the writer, which MetricsManager never calls (the default writers would be used); "
        "pass writer_factory=lambda logdir: <your writer(s)> instead: it gets "
        "<summary_dir>/<name>, on process 0"
    )
    assert not (tmp_path / "train").exists()
    recorder = RecordingWriter()  # with a writer_factory the hook is the subclass's own
    with WithOwnWriter("train", tmp_path, writer_factory=lambda d: recorder) as manager:
        manager.write_scalar("x", 2.0, 3)
    assert written(recorder)[0] == ("write_scalars", 3, {"x": 2.0})


def test_collections_and_mean_std_flatten_and_rates_use_the_window():
    clock = FakeClock(10.0, 14.0)
    with make(clock=clock) as manager:
        manager.start_duration_timer()
        metrics = {
            "seqs_per_second": TimeRate(numerator=jnp.float32(8.0)),
            "x": MeanStd.from_model_output(jnp.array([1.0, 3.0])),
        }
        summary = manager.write_metrics_summary(metrics, step=10, num_steps=5).result()
    assert float(summary["seqs_per_second"].value) == 2.0  # 8 / (14 - 10)
    assert float(summary["x"].value) == 2.0
    assert float(summary["x/std"].value) == 1.0


# CLU's `class TrainMetrics(Collection)` (its annotations, which this file's
# `from __future__ import annotations` would turn into strings).
CluTrainMetrics = clu_metrics.Collection.create(
    loss=clu_metrics.Average.from_output("loss"),
    loss_std=clu_metrics.Std.from_output("loss"),  # clu 0.0.12's compute() fails on this JAX
    accuracy=clu_metrics.Accuracy,
    steps_per_second=StepsPerTime,
)


def test_a_clu_collection_is_written_under_its_field_names():
    # CLU's own loop: the Collection merges itself inside the step; the manager takes it as
    # it is, as `collection.compute()` would name it.
    @jax.jit
    def step(running, loss, logits, labels):
        metrics = CluTrainMetrics.single_from_model_output(loss=loss, logits=logits, labels=labels)
        return metrics if running is None else running.merge(metrics)

    logits = jnp.array([[0.0, 1.0], [1.0, 0.0]])
    running = None
    for loss, labels in ((1.0, [1, 1]), (2.0, [1, 0]), (6.0, [0, 0])):
        running = step(running, jnp.float32(loss), logits, jnp.array(labels))
    recorder = RecordingWriter()
    with make(recorder, clock=FakeClock(10.0, 12.0)) as manager:
        manager.start_duration_timer()
        summary = manager.write_metrics_summary(running, step=3, num_steps=3).result()
    assert {k: float(v.value) for k, v in summary.items()} == {
        "loss": 3.0,  # (1 + 2 + 6) / 3
        "loss_std": pytest.approx(np.std([1.0, 2.0, 6.0])),
        "accuracy": 4 / 6,  # argmax (1, 0): labels right 1 + 2 + 1 times of 6
        "steps_per_second": 1.5,  # 3 steps in 12 - 10 s
    }
    assert written(recorder)[0] == (
        "write_scalars",
        3,
        {
            "loss": 3.0,
            "loss_std": pytest.approx(np.std([1.0, 2.0, 6.0])),
            "accuracy": 4 / 6,
            "steps_per_second": 1.5,
        },
    )
    assert manager.errors == []
    # In a dict beside other metrics, under its key (the call's scalar check raised on it).
    recorder = RecordingWriter()
    with make(recorder, clock=FakeClock(10.0, 12.0)) as manager:
        manager.start_duration_timer()
        metrics = {"train": running, "n": Sum(jnp.float32(4))}
        summary = manager.write_metrics_summary(metrics, step=3, num_steps=3).result()
    assert {k: float(v.value) for k, v in summary.items()} == pytest.approx(
        {"train/loss": 3.0, "train/loss_std": np.std([1.0, 2.0, 6.0])}
        | {"train/accuracy": 4 / 6, "train/steps_per_second": 1.5, "n": 4.0}
    )
    assert manager.errors == []
    vector = jax.tree.map(lambda x: jnp.stack([x, x]), running.loss)  # a field of 2 values
    with make() as manager, pytest.raises(ValueError, match=r"metrics \['train/loss'\] compute"):
        manager.write_metrics_summary({"train": running.replace(loss=vector)}, step=3, num_steps=3)
    replicated = jax.tree.map(lambda x: jnp.stack([x, x]), running)  # as pmap returns it
    with make() as manager, pytest.raises(ValueError, match=r"still replicated.*\.reduce\(\)"):
        manager.write_metrics_summary(replicated, step=3, num_steps=3)


def test_a_gathered_pmap_collection_is_refused_naming_unreplicate_not_reduce():
    """A CLU Collection gathered in a pmap step is whole on every device: the refusal said
    ".reduce() or unreplicate()", and .reduce() counts it once per device (8 devices: a
    per-step loss total of 28 read 224, a count of 8 read 64)."""

    Metrics = clu_metrics.Collection.create(
        loss=AveragePerStep.from_output("loss"), n=Sum.from_output("n")
    )

    def step(loss):
        return Metrics.gather_from_model_output(loss=loss, n=jnp.float32(1.0))

    gathered = jax.pmap(step, axis_name="batch")(jnp.arange(8.0))
    with (
        make() as manager,
        pytest.raises(
            ValueError,
            match=r"unreplicate\(\) it if the step made it with gather_from_model_output",
        ),
    ):
        manager.write_metrics_summary(gathered, step=1, num_steps=1)
    with make() as manager:
        summary = manager.write_metrics_summary(
            flax.jax_utils.unreplicate(gathered), step=1, num_steps=1
        ).result()
    assert {k: float(v.value) for k, v in summary.items()} == {"loss": 28.0, "n": 8.0}
    assert float(gathered.reduce().compute()["loss"]) == 224.0  # what .reduce() would give


def test_everything_reaches_the_writer_in_call_order():
    recorder = RecordingWriter()
    with make(recorder, clock=FakeClock(0.0, 1.0, 1.0, 3.0)) as manager:
        manager.write_hparams({"lr": 0.1})
        manager.write_scalar("timing/compilation_seconds", 2.0, 0)
        manager.start_duration_timer()
        manager.write_metrics_summary({"loss": Sum(jnp.float32(1.0))}, 1, 1)
        manager.write_texts(1, {"note": "hello"})
        manager.start_duration_timer()
        manager.write_metrics_summary({"loss": Sum(jnp.float32(2.0))}, 2, 1)
        manager.write_scalars(2, {"learning_rate": 0.5})
        manager.flush()
        calls = written(recorder)
    assert calls == [
        ("write_hparams", {"lr": 0.1}),
        ("write_scalars", 0, {"timing/compilation_seconds": 2.0}),
        ("write_scalars", 1, {"loss": np.float32(1.0)}),
        ("write_texts", 1, {"note": "hello"}),
        ("write_scalars", 2, {"loss": np.float32(2.0)}),
        ("write_scalars", 2, {"learning_rate": 0.5}),
        ("flush",),
    ]


def test_caller_never_waits_for_the_device_or_the_writer(monkeypatch):
    """Calls return while the metrics are "still computing" and the writer is busy.

    Gates stand in for an unfinished device computation and a slow writer; if
    any call waited for them on the caller's thread, the test would deadlock
    before opening them.
    """
    device_done, writer_free = threading.Event(), threading.Event()
    real_wait = timer_lib.block_until_ready_or_deleted

    def gated_wait(tree: Any) -> None:
        assert device_done.wait(timeout=30)
        real_wait(tree)

    class SlowWriter(RecordingWriter):
        def write_scalars(self, step: int, scalars: Any) -> None:
            assert writer_free.wait(timeout=30)
            super().write_scalars(step, scalars)

    monkeypatch.setattr(timer_lib, "block_until_ready_or_deleted", gated_wait)
    recorder = SlowWriter()
    manager = make(recorder, clock=FakeClock(0.0, 2.0, 2.0, 4.0))
    manager.start_duration_timer(block_on=jnp.ones(2))
    first = manager.write_metrics_summary({"loss": Sum(jnp.float32(1.0))}, 1, 1)
    manager.write_scalar("lr", 0.1, 1)
    manager.start_duration_timer(block_on=jnp.ones(2))
    second = manager.write_metrics_summary({"loss": Sum(jnp.float32(2.0))}, 2, 1)
    assert not first.done() and not second.done()
    device_done.set()
    writer_free.set()
    assert float(second.result()["loss"].value) == 2.0
    manager.close()
    assert [c[:2] for c in written(recorder)] == [
        ("write_scalars", 1),
        ("write_scalars", 1),
        ("write_scalars", 2),
        ("close",),
    ]


_slow = jax.jit(lambda x: jax.lax.fori_loop(0, 50, lambda i, m: jnp.tanh(m @ m), x))


def still_computing() -> jax.Array:
    """A real device value that takes about half a second to compute (50 1000x1000 matmuls)."""
    x = jax.random.normal(jax.random.key(0), (1000, 1000)) / 32
    _slow(x).block_until_ready()  # compiled before, so the call below only dispatches
    # So are the eager ops the tests apply to its result: compiling them took 0.1 s on a quiet
    # machine, and on a busy one longer than the computation the tests must not wait for.
    jax.block_until_ready((x[0, 0], x.mean(), x[0, :2], x[:8, :8, None] * 0))
    return _slow(x)


def test_device_scalars_still_computing_are_read_by_the_worker_not_the_loop(tmp_path):
    # `write_scalar(key, loss, step)` with the step's own output: reading it on the caller's
    # thread would wait for the step, the stall this library exists to avoid.
    with MetricsManager("train", tmp_path) as manager:
        matrix = still_computing()
        manager.write_scalars(1, {"lr": 0.5, "top_left": matrix[0, 0], "mean": matrix.mean()})
        manager.write_scalar("x", jnp.bfloat16(1.5), 2)  # ready: converted at the call
        assert not matrix.is_ready()  # the calls returned before the device finished
        with pytest.raises(ValueError, match=r"'row' must hold exactly one number.*\(2,\)"):
            manager.write_scalar("row", matrix[0, :2], 3)  # refused by shape, without waiting
        assert not matrix.is_ready()
    lines = writers.read_jsonl(tmp_path / "train" / "metrics.jsonl")
    assert [{k: v for k, v in x.items() if k not in ("time", "collection")} for x in lines] == [
        {"step": 1, "lr": 0.5, "top_left": float(matrix[0, 0]), "mean": float(matrix.mean())},
        {"step": 2, "x": 1.5},
    ]
    assert manager.errors == []


def test_device_images_and_histograms_still_computing_are_read_by_the_worker(tmp_path):
    with MetricsManager("train", tmp_path) as manager:
        matrix = still_computing()
        manager.write_histograms(1, {"weights": matrix})
        manager.write_images(1, {"map": matrix[:8, :8, None] * 0})
        assert not matrix.is_ready()  # the calls returned before the device finished
        with pytest.raises(ValueError, match=r"image 'flat' must have shape \[H, W, C\]"):
            manager.write_images(2, {"flat": matrix})  # refused by shape, without waiting
        assert not matrix.is_ready()
    hist, image = writers.read_jsonl(tmp_path / "train")
    assert hist["weights"]["count"] == 10**6 and hist["weights"]["max"] == float(matrix.max())
    assert image["map"] == {"type": "image", "shape": [8, 8, 1]}


def test_a_device_value_donated_before_the_worker_reads_it_costs_only_its_key(tmp_path):
    worker_free = threading.Event()

    class GatedJsonl(writers.JsonlWriter):
        def write_texts(self, step: int, texts: Any) -> None:
            assert worker_free.wait(timeout=30)
            super().write_texts(step, texts)

    path = tmp_path / "log.jsonl"
    donate = jax.jit(lambda m: m + 1.0, donate_argnums=0)
    with MetricsManager("train", writer_factory=lambda _: GatedJsonl(path)) as manager:
        manager.write_texts(1, {"note": "the worker waits here"})
        matrix = still_computing()
        corner = matrix[0, 0]
        manager.write_scalars(2, {"corner": corner, "lr": 0.5})  # set aside: not ready
        row = matrix[0]
        manager.write_histograms(2, {"row": row})
        manager.write_images(2, {"map": row[:16].reshape(4, 4, 1)})
        donate(corner)  # before the worker could read it
        donate(row)  # the histogram's and, through the reshape's input, not the image's
        assert corner.is_deleted() and row.is_deleted()
        worker_free.set()
        manager.write_scalar("after", 1.0, 3)
        worker_free.clear()
        manager.write_texts(4, {"note": "the worker waits here again"})
        loss = jnp.asarray(2.0) + 1.0
        manager.write_metrics_summary({"loss": loss, "total": Sum(jnp.float32(5.0))}, 5, 1)
        donate(loss)  # a plain value of a summary, donated before the worker copies it
        worker_free.set()
    matrix.block_until_ready()  # the device is idle again for the tests after this one
    lines = writers.read_jsonl(path)
    assert [
        {k: v for k, v in x.items() if k not in ("time", "collection", "note")} for x in lines
    ] == [
        {"step": 1},
        {"step": 2, "lr": 0.5},
        {"step": 2, "map": {"type": "image", "shape": [4, 4, 1]}},
        {"step": 3, "after": 1.0},
        {"step": 4},
        {"step": 5, "total": 5.0},
    ]
    assert [(f.source, f.step, f.keys) for f in manager.errors] == [
        ("metric:corner", 2, ("corner",)),
        ("metric:row", 2, ("row",)),
        ("metric:loss", 5, ("loss",)),
    ]
    for failure, what in zip(
        manager.errors, ("scalar 'corner'", "histogram 'row'", "metric 'loss'"), strict=True
    ):
        assert (
            f"{what}: a device array deleted (donated to a later computation) before it was "
            "read. Pass a copy, or do not donate it."
        ) in str(failure)


def test_a_device_computation_that_failed_is_recorded_and_raised_under_raise(monkeypatch):
    # An XLA runtime error surfaces when the worker waits for the computation's output: the
    # state start_duration_timer waits on, a scalar or an image still being computed. Each
    # was only logged as 'a background job failed': not in `errors`, not raised under
    # on_error="raise", and the other keys of the write were lost with it.
    state, loss, image = jnp.zeros(2), jnp.float32(3.0), jnp.zeros((2, 2, 1))
    failed = lambda x: any(x is f for f in (state, loss, image))  # noqa: E731
    real_wait = timer_lib.block_until_ready_or_deleted

    def wait(tree: Any) -> None:
        if any(map(failed, jax.tree.leaves(tree))):
            raise RuntimeError("INTERNAL: the computation failed")
        real_wait(tree)

    monkeypatch.setattr(timer_lib, "block_until_ready_or_deleted", wait)
    monkeypatch.setattr(timer_lib, "settled", lambda x: not failed(x))
    monkeypatch.setattr(writers._checks, "_unready", failed)
    recorder = RecordingWriter()
    manager = make(recorder, on_error="raise", clock=time.perf_counter)
    manager.start_duration_timer(block_on=state)
    manager._worker.drain()
    with pytest.raises(MetricsManagerError, match="start_duration_timer: RuntimeError: INTERNAL"):
        manager.write_scalars(1, {"loss": loss, "lr": 0.5})
    manager._worker.drain()
    with pytest.raises(MetricsManagerError, match="metric:loss at step 1 .keys loss.: Runtime"):
        manager.write_images(2, {"map": image, "ok": np.zeros((2, 2, 1))})
    with pytest.raises(MetricsManagerError, match="metric:map at step 2 .keys map.: Runtime"):
        manager.close()
    calls = written(recorder)  # the other keys of each write are written
    assert [c[:2] for c in calls] == [("write_scalars", 1), ("write_images", 2), ("close",)]
    assert calls[0][2] == {"lr": 0.5} and list(calls[1][2]) == ["ok"]
    assert [(f.source, f.step, f.keys) for f in manager.errors] == [
        ("start_duration_timer", None, ()),
        ("metric:loss", 1, ("loss",)),
        ("metric:map", 2, ("map",)),
    ]


def test_a_window_whose_start_failed_says_so_not_that_no_timer_was_started(monkeypatch):
    # The time metrics' failure said "call manager.start_duration_timer", which the loop did.
    state = jnp.zeros(2)
    real_wait = timer_lib.block_until_ready_or_deleted

    def wait(tree: Any) -> None:
        if any(x is state for x in jax.tree.leaves(tree)):
            raise RuntimeError("INTERNAL: the computation failed")
        real_wait(tree)

    monkeypatch.setattr(timer_lib, "block_until_ready_or_deleted", wait)
    monkeypatch.setattr(timer_lib, "settled", lambda x: x is not state)
    with make(RecordingWriter(), clock=time.perf_counter) as manager:
        manager.start_duration_timer(block_on=state)
        rate = {"steps_per_second": StepsPerTime.from_model_output(), "loss": Sum(1.0)}
        assert sorted(manager.write_metrics_summary(rate, 10, 10).result()) == ["loss"]
        manager.start_duration_timer()  # the next window starts as usual
        summary = manager.write_metrics_summary(rate, 20, 10).result()
        assert sorted(summary) == ["loss", "steps_per_second"]
    assert [(e.source, e.step) for e in manager.errors] == [
        ("start_duration_timer", None),
        ("metric:steps_per_second", 10),
    ]
    assert str(manager.errors[1].error).endswith(
        "; start_duration_timer was called, but waiting for its block_on failed "
        "(manager.errors, source 'start_duration_timer')"
    )


def test_a_plain_device_value_in_a_summary_ends_the_window_and_is_copied_with_the_rest(
    tmp_path,
):
    # A hand-rolled loop's `{"loss": loss}`: no CLU metric, just the step's output.
    with MetricsManager("train", tmp_path) as manager:
        matrix = still_computing()
        called = time.perf_counter()
        manager.start_duration_timer()
        metrics = {"loss": matrix.mean(), "rate": StepsPerTime.from_model_output(steps=1)}
        future = manager.write_metrics_summary(metrics, 1, 1)
        assert not matrix.is_ready()
        matrix.block_until_ready()
        ready_after = time.perf_counter() - called
        summary = future.result(timeout=30)
        seconds = time.perf_counter() - called
    # The window ended when `loss` was ready (about 0.5 s), not at the call (microseconds).
    assert 1 / seconds <= summary["rate"].value <= 2 / ready_after
    assert type(summary["loss"].value) is np.ndarray  # a host copy, like the metrics'
    assert summary["loss"].value == pytest.approx(float(matrix.mean()))
    [line] = writers.read_jsonl(tmp_path / "train" / "metrics.jsonl")
    assert line["loss"] == pytest.approx(float(matrix.mean())) and manager.errors == []


def test_windows_of_a_loop_ahead_of_the_device_are_timed_by_the_device(tmp_path):
    # The README's loop: each step donates the state, and the host dispatches steps far
    # faster than the device runs them. The state given to start_duration_timer is gone
    # before the worker looks, so the window starts when the summary before it was ready
    # (the same step's outputs), not at the call: that was the step's dispatch, many steps
    # before the device got there (windows read 2-8x too long, the median 4x).
    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(x, running):
        for _ in range(4):  # about 40 ms on 2 CPU cores
            x = jnp.tanh(x @ x)
        return x, merge_metrics(running, {"rate": StepsPerTime.from_model_output()})

    x = jax.random.normal(jax.random.key(0), (1000, 1000)) / 32
    x, running = step(x, None)  # compiles both variants
    x, running = step(x, running)
    jax.block_until_ready(x)
    futures = []
    with MetricsManager("train", tmp_path) as manager:
        running = None
        began = time.perf_counter()
        manager.start_duration_timer(block_on=x)
        for i in range(1, 17):
            x, running = step(x, running)
            if i % 2 == 0:
                futures.append(manager.write_metrics_summary(running, i, 2))
                running = None
                manager.start_duration_timer(block_on=x)
        assert not x.is_ready()  # the host is ahead of the device
        jax.block_until_ready(x)
        run_s = time.perf_counter() - began  # the device's time for the 16 steps
        rates = [float(f.result(timeout=60)["rate"].value) for f in futures]
    # Measured against the same run, not a separate one: two cores' speed drifts by 20%
    # between runs. Windows timed from the call would overlap and read about 4x too long.
    assert 0.6 * 16 / run_s < float(np.median(rates)) < 1.5 * 16 / run_s, (run_s, rates)
    seconds = sum(2 / r for r in rates)  # windows follow each other: their sum is the run's
    assert 0.95 * run_s < seconds < 1.05 * run_s, (run_s, seconds, rates)
    assert manager.errors == []


def test_donated_train_state_counts_as_ready(monkeypatch):
    """The timer waits on a state that the next step donates: the window still closes."""
    timer_may_look = threading.Event()
    real_wait = timer_lib.block_until_ready_or_deleted

    def wait_after_donation(tree: Any) -> None:
        assert timer_may_look.wait(timeout=30)
        real_wait(tree)

    monkeypatch.setattr(timer_lib, "block_until_ready_or_deleted", wait_after_donation)
    train_step = jax.jit(lambda s: (s + 1.0, {"loss": Sum(jnp.sum(s))}), donate_argnums=0)
    state = jnp.zeros(2)
    with make(clock=FakeClock(0.0, 6.0)) as manager:
        manager.start_duration_timer(block_on=state)
        first_state = state
        state, metrics = train_step(state)
        state, more = train_step(state)
        assert first_state.is_deleted()
        timer_may_look.set()
        merged = {"loss": metrics["loss"].merge(more["loss"]), "sps": StepsPerTime()}
        summary = manager.write_metrics_summary(merged, 2, 2).result()
    assert float(summary["loss"].value) == 2.0  # sum(0, 0) + sum(1, 1)
    assert float(summary["sps"].value) == pytest.approx(2 / 6.0)


def test_t5x_summary_writer_is_the_factorys_writer(tmp_path):
    # T5X code passes manager.summary_writer to its own writes (summarize_gin_config): it
    # raised AttributeError here.
    factory = functools.partial(writers.create_default_writer, console=False, tensorboard=False)
    with MetricsManager("train", tmp_path, writer_factory=factory) as manager:
        assert manager.summary_writer is manager.writer
        manager.summary_writer.write_texts(0, {"config": "lr = 0.1"})
    ((line,),) = [writers.read_jsonl(tmp_path / "train")]
    assert (line["step"], line["collection"], line["config"]) == (0, "train", "lr = 0.1")


def test_other_processes_compute_but_write_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    factory_calls = []
    root = tmp_path / "runs"
    manager = MetricsManager(
        "train",
        root,
        writer_factory=lambda d: factory_calls.append(d) or writers.NoopWriter(),
        clock=FakeClock(0.0, 40.0),
    )
    assert manager.summary_dir == str(root / "train")
    assert not manager.writes and manager.writer is None
    # T5X's empty MultiWriter there: code writing to it on every process runs.
    assert isinstance(manager.summary_writer, writers.MultiWriter)
    manager.summary_writer.write_texts(4, {"config": "x"})
    manager.start_duration_timer()
    summary = manager.write_metrics_summary(t5x_metrics(), 4, 2).result()
    manager.write_scalar("x", 1.0, 4)
    manager.write_texts(4, {"t": "x"})
    manager.write_hparams({"lr": 0.1})
    manager.flush()
    manager.close()
    assert float(summary["steps_per_second"].value) == pytest.approx(0.05)
    assert factory_calls == []
    assert not root.exists()


# ------------------------------------------------------------- background errors


def test_time_metrics_without_a_started_timer_cost_their_keys_and_say_how_to_fix():
    # A loop that never calls start_duration_timer lost every key, its loss too, in every
    # summary; now only the keys that need the window's duration are left out.
    recorder = RecordingWriter()
    with make(recorder) as manager:
        for step in (2, 4):
            summary = manager.write_metrics_summary(t5x_metrics(), step, 2).result()
            assert sorted(summary) == ["accuracy", "loss", "text"]
    assert [(m, step, sorted(values)) for m, step, values in written(recorder)[:-1]] == [
        ("write_scalars", 2, ["accuracy", "loss"]),
        ("write_texts", 2, ["text"]),
        ("write_scalars", 4, ["accuracy", "loss"]),
        ("write_texts", 4, ["text"]),
    ]
    assert [(e.source, e.step, e.keys) for e in manager.errors] == [
        ("metric:steps_per_second", 2, ("steps_per_second",)),
        ("metric:steps_per_second", 4, ("steps_per_second",)),
    ]
    assert str(manager.errors[0].error) == (
        "metric 'steps_per_second' measures time, but no window was open: call "
        "manager.start_duration_timer(block_on=state) at the start of every window"
    )


def test_a_duration_the_loop_set_itself_is_kept_without_a_window():
    # set_time_metrics_duration before the summary, no start_duration_timer: the key was
    # dropped as "no window was open" though its duration was given.
    recorder = RecordingWriter()
    with make(recorder) as manager:
        timed = set_time_metrics_duration({"sps": StepsPerTime.from_model_output()}, 2.0)
        summary = manager.write_metrics_summary(
            {**timed, "rate": TimeRate(numerator=1.0)}, 10, 10
        ).result()
        assert float(summary["sps"].value) == 10 / 2.0
        assert sorted(summary) == ["sps"]
    assert [(e.source, e.step) for e in manager.errors] == [("metric:rate", 10)]


def test_a_window_ended_by_another_threads_summary_is_named_in_the_failure():
    """An eval thread's summary on the loop's manager ends the loop's window (one timer per
    manager, as in T5X): the loop's timed keys fail, and the failure said only to call
    start_duration_timer, which the loop did."""
    recorder = RecordingWriter()
    with make(recorder, clock=time.perf_counter) as manager:
        rate = {"steps_per_second": StepsPerTime.from_model_output(), "loss": Sum(1.0)}
        manager.start_duration_timer()
        manager.write_metrics_summary(rate, 10, 10).result()  # the loop's own window: timed
        manager.start_duration_timer()
        thread = threading.Thread(
            target=lambda: manager.write_metrics_summary({"eval/acc": Sum(0.5)}, 10, 1).result(),
            name="eval",
        )
        thread.start()
        thread.join()
        assert "steps_per_second" not in manager.write_metrics_summary(rate, 20, 10).result()
        manager.start_duration_timer()  # its own window again: timed, and no stale blame
        assert "steps_per_second" in manager.write_metrics_summary(rate, 30, 10).result()
        manager.write_metrics_summary(rate, 40, 10).result()  # no timer started: its own slip
    assert [(e.source, e.step) for e in manager.errors] == [
        ("metric:steps_per_second", 20),
        ("metric:steps_per_second", 40),
    ]
    fix = "call manager.start_duration_timer(block_on=state) at the start of every window"
    assert str(manager.errors[0].error) == (
        f"metric 'steps_per_second' measures time, but no window was open: {fix}; the window "
        "thread 'MainThread' opened last was ended by a summary from thread 'eval' (a manager "
        "has one window, as in T5X): give that thread a MetricsManager of its own"
    )
    assert str(manager.errors[1].error).endswith(fix)


def test_a_collection_in_a_dict_without_a_started_timer_keeps_its_other_fields():
    # The whole Collection was left out (its loss too) when one of its fields measured time.
    fields = {"loss": clu_metrics.Average.from_output("loss"), "rate": StepsPerTime}
    # Made with type(): this module's annotations are strings (__future__), CLU's need types.
    Train = flax.struct.dataclass(
        type("Train", (clu_metrics.Collection,), {"__annotations__": fields})
    )
    train = Train.single_from_model_output(loss=jnp.float32(2.0)).replace(rate=StepsPerTime())
    recorder = RecordingWriter()
    with make(recorder) as manager:
        summary = manager.write_metrics_summary({"train": train, "n": Sum(3.0)}, 2, 1).result()
    assert {k: float(v.value) for k, v in summary.items()} == {"train/loss": 2.0, "n": 3.0}
    assert [(e.source, e.step, e.keys) for e in manager.errors] == [
        ("metric:train/rate", 2, ("train/rate",))
    ]


# -------------------------------------------------------------- lifecycle


def test_close_is_idempotent_and_joins_every_manager_thread():
    before = set(threading.enumerate())
    manager = make()
    manager.start_duration_timer(block_on=jnp.ones(2))
    manager.write_metrics_summary(t5x_metrics(), 4, 2).result()
    names = {t.name for t in threading.enumerate()} - {t.name for t in before}
    ours = {n for n in names if "Manager" in n or "Timer" in n or "Writer" in n}
    assert ours == {"MetricsManager[train]"}  # one worker thread per manager, no more
    manager.close()
    manager.close()
    assert manager.closed
    assert set(threading.enumerate()) <= before


def test_context_manager_closes_and_keeps_the_loop_error():
    recorder = RecordingWriter()
    with pytest.raises(KeyError, match="loop bug"):
        with make(recorder) as manager:
            manager.write_scalar("x", 1.0, 0)
            raise KeyError("loop bug")
    assert manager.closed
    assert written(recorder) == [("write_scalars", 0, {"x": 1.0}), ("close",)]


def test_context_manager_adds_the_background_error_to_the_loop_error():
    with pytest.raises(KeyError) as info:
        with make(BrokenWriter(), on_error="raise") as manager:
            manager.write_scalar("loss", 1.0, 3)
            manager._worker.drain()
            raise KeyError("loop bug")
    assert info.value.__notes__ == [
        "While closing MetricsManager 'train': MetricsManager 'train': background failure: "
        "writer:BrokenWriter at step 3 (keys loss): OSError: disk full"
    ]


def test_calls_after_close_are_refused():
    manager = make()
    manager.close()
    for name, call in NEXT_CALLS.items():
        if name != "close":
            with pytest.raises(RuntimeError, match="closed"):
                call(manager)


# ------------------------------------------------------------ input checks


def test_bad_constructor_arguments_are_listed_together():
    with pytest.raises(TypeError) as info:
        MetricsManager(3, summary_dir=4.0, writer_factory="tb", clock=1)  # type: ignore[arg-type]
    message = str(info.value)
    for part in ("name must be a str", "summary_dir must be a path", "writer_factory", "clock"):
        assert part in message
    with pytest.raises(ValueError, match="non-empty run name"):
        MetricsManager("", writer_factory=lambda d: writers.NoopWriter())
    with pytest.raises(ValueError) as info:
        MetricsManager(
            "t",
            writer_factory=lambda d: writers.NoopWriter(),
            flops_per_step=float("inf"),  # every perf/* value infinite
            writer_deadline_s=float("inf"),
            system_interval_s=0.0,
        )
    for part in (
        "flops_per_step must be >= 0 and finite, got inf",
        "writer_deadline_s must be > 0 and finite, got inf; None: never",
        "system_interval_s must be > 0 and finite, got 0.0",
    ):
        assert part in str(info.value)


def test_factory_returning_a_non_writer_is_a_type_error():
    with pytest.raises(TypeError, match="lacks write_scalars.*create_default_writer"):
        MetricsManager("train", writer_factory=lambda d: object())

    class HalfWriter:
        closed = False

        def close(self) -> None:
            self.closed = True

    half = HalfWriter()
    with pytest.raises(TypeError, match=r"\(HalfWriter\) lacks write_scalars, write_texts"):
        MetricsManager("train", writer_factory=lambda d: half)
    assert half.closed


def test_a_factory_returning_a_list_or_dict_of_writers_gets_each_isolated(tmp_path):
    """`lambda logdir: [JsonlWriter(logdir), TensorBoardWriter(logdir)]` works as a
    MultiWriter would: both files land in the run's directory, each writer by name."""

    def both(logdir):
        return [writers.JsonlWriter(logdir), writers.TensorBoardWriter(logdir)]

    def named(logdir):
        return {"log": writers.JsonlWriter(logdir), "rec": RecordingWriter()}

    for name, factory in (("listed", both), ("named", named)):
        with MetricsManager(name, tmp_path, writer_factory=factory) as manager:
            manager.write_scalars(7, {"lr": 0.5})
        listed = {"listed": ["JsonlWriter", "TensorBoardWriter"], "named": ["log", "rec"]}
        assert list(manager.writers) == listed[name]
        (line,) = writers.read_jsonl(tmp_path / name)
        assert (line["step"], line["lr"]) == (7, 0.5)
    assert manager.writers["rec"].calls[0] == ("write_scalars", (7, {"lr": 0.5}), {})
    assert len(list((tmp_path / "listed").glob("events.out.tfevents.*"))) == 1

    class HalfWriter:
        closed = False

        def close(self) -> None:
            self.closed = True

    half, full = HalfWriter(), RecordingWriter()
    with pytest.raises(TypeError, match=r"'HalfWriter' \(HalfWriter\) lacks write_scalars"):
        MetricsManager("train", writer_factory=lambda d: (full, half))
    assert half.closed and full.calls == [("close", (), {})]  # nothing left open


def test_a_writer_with_async_def_methods_is_refused_at_construction():
    # Its write_scalars returned a coroutine nobody awaited: 0 of 3 writes stored, and
    # health() counted no failure.
    class Awaiting(writers.NoopWriter):
        async def write_scalars(self, step, scalars):  # type: ignore[no-untyped-def,override]
            pass

    with pytest.raises(TypeError, match=r"'Awaiting' \(Awaiting\).write_scalars is async def"):
        MetricsManager("train", writer_factory=lambda d: Awaiting())


def test_a_writer_whose_parameters_are_not_clus_is_refused_at_construction():
    """The manager calls writers by keyword (`write_scalars(step=, scalars=)`): a writer with
    other parameter names would fail every summary, so it is refused before the loop runs."""

    class Renamed(writers.NoopWriter):
        closed = False

        def write_scalars(self, step: int, values: Any) -> None:  # type: ignore[override]
            pass

        def flush(self, now: bool) -> None:  # type: ignore[override]
            pass

        def close(self) -> None:
            self.closed = True

    renamed = Renamed()
    with pytest.raises(TypeError) as info:
        MetricsManager("train", writer_factory=lambda d: renamed)
    message = str(info.value)
    assert message.startswith("MetricsManager('train'): writer_factory's writers: 2 problems:")
    assert (
        "'Renamed' (Renamed).write_scalars(step, values) cannot take "
        "write_scalars(step=..., scalars=...): missing a required argument: 'values'"
    ) in message
    assert (
        "'Renamed' (Renamed).flush(now) cannot take flush(): missing a required argument: 'now'"
        in message
    )
    assert "by keyword" in message and renamed.closed

    class Extra(writers.NoopWriter):  # other names are fine where they have defaults
        def write_scalars(self, step: int, scalars: Any, *, prefix: str = "") -> None:
            self.got = (step, prefix, dict(scalars))

    extra = Extra()
    with MetricsManager("train", writer_factory=lambda d: extra) as manager:
        manager.write_scalars(3, {"a": 1.5})
    assert extra.got == (3, "", {"a": 1.5})


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (([1.0], 1, 1), TypeError, "metrics must be a mapping"),
        (({1: Sum(1.0)}, 1, 1), TypeError, "non-empty str such as .*, got 1"),
        (({"x": Sum(1.0)}, 1.5, 1), TypeError, "step must be an int"),
        (({"x": Sum(1.0)}, jnp.int32(3), 1), TypeError, "host-side counter"),
        (({"x": Sum(1.0)}, -1, 1), ValueError, "step must be >= 0"),
        (({"x": Sum(1.0)}, 1, 0), ValueError, "num_steps must be >= 1"),
    ],
)
def test_write_metrics_summary_checks_inputs_on_the_callers_thread(args, error, match):
    with make() as manager:
        with pytest.raises(error, match=match):
            manager.write_metrics_summary(*args)


@pytest.mark.parametrize(
    ("step", "fix"), [(jnp.int32(3), "int(step)"), (jnp.array([3, 3]), "int(step[0])")]
)
def test_a_device_array_step_is_refused_with_the_fix_outside_the_loop_too(step, fix):
    # T5X writes timing/compilation_seconds once at train_state.step: the only advice was
    # the loop's "keep a host-side counter", where int(state.step) is the fix for a one-off.
    with make() as manager:
        with pytest.raises(TypeError) as raised:
            manager.write_scalar("timing/compilation_seconds", 12.5, step)
    message = str(raised.value)
    assert "host-side counter (step += 1)" in message
    assert f"for a one-off write outside it, pass {fix}" in message


@pytest.mark.parametrize("step", [5.5, np.ones((2, 2), np.int32)], ids=["float", "2-D"])
def test_a_device_array_step_int_cannot_read_gets_no_one_off_fix(step):
    # int() of a float step cuts 5.5 to 5, silently; int(step[0]) of a 2-D step raises.
    with make() as manager:
        with pytest.raises(TypeError) as raised:
            manager.write_scalar("x", 1.0, jnp.asarray(step))
    assert "host-side counter (step += 1)" in str(raised.value)
    assert "one-off" not in str(raised.value)


def test_one_error_lists_every_bad_argument():
    with make() as manager:
        with pytest.raises(TypeError) as info:
            manager.write_metrics_summary([1.0], 1.5, 0)  # type: ignore[arg-type]
        message = str(info.value)
        assert "metrics must be a mapping" in message
        assert "step must be an int, got 1.5" in message
        assert "num_steps must be >= 1, got 0" in message
        with pytest.raises(
            TypeError, match="(?s)step must be an int.*text 'b' must be a str, got int"
        ):
            manager.write_texts("3", {"a": "fine", "b": 2})  # type: ignore[arg-type]
        manager.write_scalar("x", 1.0, np.array(3))  # a 0-d NumPy int is a fine step


def test_a_float_step_is_refused_naming_int():
    """A float step (T5X's trainer passes int(step)) was refused with "step must be an int,
    got 5.0 (float)" and no fix; it is still refused, not rounded."""
    with make() as manager:
        with pytest.raises(TypeError) as info:
            manager.write_metrics_summary({"x": Sum(1.0)}, 5.0, np.float32(2))
        assert str(info.value) == (
            "MetricsManager.write_metrics_summary: 2 problems:\n"
            "  - step must be an int, got 5.0 (float); pass int(step)\n"
            "  - num_steps must be an int, got np.float32(2.0) (float32); pass int(num_steps)"
        )
        # Not int(step): int() would lose the .5. Named no fix, now the step counter.
        with pytest.raises(TypeError, match=r"got 1\.5 \(float\); pass the loop's step counter"):
            manager.write_scalar("x", 1.0, 1.5)


def test_write_scalar_with_step_and_value_swapped_names_the_argument_order():
    """write_scalar("loss", 20, 1.0) (key, step, value) was refused with "pass int(step)",
    which wrote 20 at step 1, and ("loss", 20, 0.5) with no fix; the message now gives T5X's
    order and the call."""
    writer = RecordingWriter()
    with make(writer) as manager:
        with pytest.raises(TypeError) as info:
            manager.write_scalar("loss", 20, 0.5)
        assert str(info.value) == (
            "MetricsManager.write_scalar: step must be an int, got 0.5 (float); the arguments "
            "are (key, val, step), as in T5X's write_scalar: if 20 is the step, call "
            "write_scalar('loss', value, 20)"
        )
        with pytest.raises(TypeError, match=r"if 3 is the step"):
            manager.write_scalar("loss", np.int64(3), jnp.float32(0.25))  # a device loss
        with pytest.raises(TypeError) as info:  # a device step in T5X's order: its own fix
            manager.write_scalar("examples", 1024, jnp.int32(7))
        assert "pass int(step)" in str(info.value) and "is the step" not in str(info.value)
        manager.write_scalar("loss", 0.5, 20)
    assert [c for c in written(writer) if c[0] == "write_scalars"] == [
        ("write_scalars", 20, {"loss": 0.5})
    ]


def test_entering_a_closed_manager_raises_at_once():
    """`with manager:` on a closed manager entered silently; only the block's first write
    raised, after any work before it. It now raises there, as that write would."""
    writer = RecordingWriter()
    manager = make(writer)
    manager.write_scalars(1, {"loss": 0.5})
    manager.close()
    entered = []
    with pytest.raises(RuntimeError) as info:
        with manager:
            entered.append(True)
            manager.write_scalars(2, {"loss": 0.25})
    assert entered == []
    assert str(info.value) == (
        "MetricsManager 'train' is closed; __enter__() needs an open manager."
    )
    assert [c for c in written(writer) if c[0] == "write_scalars"] == [
        ("write_scalars", 1, {"loss": 0.5})
    ]
    with make(RecordingWriter()) as fresh:  # an open one still enters
        fresh.write_scalars(1, {"loss": 0.5})


def test_write_calls_with_step_and_mapping_swapped_name_the_argument_order():
    """write_images({"img": array}, 20) printed the whole dict of arrays as the step it was
    not, then a second problem for the 20; it now names the mapping by its keys, the order
    and the call. Arguments of the wrong type are described by type, shape and keys too."""
    writer = RecordingWriter()
    image = np.full((64, 64, 3), 0.25, np.float32)
    with make(writer) as manager:
        with pytest.raises(TypeError) as info:
            manager.write_images({"img": image}, 20)
        assert str(info.value) == (
            "MetricsManager.write_images: step must be an int, got dict with keys ['img']; the "
            "arguments are (step, images), as in CLU's writers: if 20 is the step, call "
            "write_images(20, images)"
        )
        with pytest.raises(TypeError) as info:
            manager.write_histograms({"w": np.zeros(5000)}, 7)
        assert str(info.value) == (
            "MetricsManager.write_histograms: step must be an int, got dict with keys ['w']; the "
            "arguments are (step, arrays, num_buckets), as in CLU's writers: if 7 is the step, "
            "call write_histograms(7, arrays)"
        )
        many = {f"k{i}": jnp.ones(3) for i in range(10)}
        with pytest.raises(TypeError) as info:
            manager.write_scalars(many, 3)
        assert str(info.value).startswith(
            "MetricsManager.write_scalars: step must be an int, got dict with keys ['k0', 'k1', "
            "'k2', 'k3', 'k4', 'k5', 'k6', 'k7', ... (10 keys)]; the arguments are (step, "
            "scalars)"
        )
        with pytest.raises(TypeError) as info:
            manager.write_texts({"note": "hi"}, 4)
        assert "got dict with keys ['note']; the arguments are (step, texts)" in str(info.value)
        with pytest.raises(TypeError) as info:
            manager.write_images(20, image)
        assert str(info.value) == (
            "MetricsManager.write_images: images must be a mapping such as {'samples': array}, "
            "got ndarray of shape (64, 64, 3) and dtype float32"
        )
        with pytest.raises(TypeError) as info:
            manager.write_hparams(np.zeros(100))
        assert str(info.value) == (
            "MetricsManager.write_hparams: hparams must be a mapping such as {'lr': 0.1} (or a "
            "dataclass), got ndarray of shape (100,) and dtype float64"
        )
        with pytest.raises(TypeError) as info:
            manager.write_scalars(np.zeros(500), {"loss": 0.5})
        assert str(info.value) == (
            "MetricsManager.write_scalars: step must be an int, got ndarray of shape (500,) and "
            "dtype float64; pass the loop's step counter as an int: a Python int counter, or "
            "int(state.step) on the host"
        )
        manager.write_images(20, {"img": image})
    [(method, step, images)] = [c for c in written(writer) if c[0] == "write_images"]
    assert (method, step, list(images)) == ("write_images", 20, ["img"])
    np.testing.assert_array_equal(images["img"], image)


def test_write_texts_needs_strings():
    with make() as manager:
        with pytest.raises(
            TypeError, match="text 'a' must be a str, got int 1; convert with str()"
        ):
            manager.write_texts(0, {"a": 1, "b": "fine"})


def test_max_pending_is_checked():
    with pytest.raises(ValueError, match="max_pending must be >= 1, got 0"):
        make(max_pending=0)
    with pytest.raises(TypeError, match="max_pending must be an int"):
        make(max_pending=2.5)


NEXT_CALLS = {
    "write_metrics_summary": lambda m: m.write_metrics_summary({"loss": Sum(1.0)}, 5, 1),
    "write_scalar": lambda m: m.write_scalar("x", 1.0, 5),
    "write_scalars": lambda m: m.write_scalars(5, {"x": 1.0}),
    "write_texts": lambda m: m.write_texts(5, {"x": "y"}),
    "write_hparams": lambda m: m.write_hparams({"x": 1}),
    "start_duration_timer": lambda m: m.start_duration_timer(),
    "flush": lambda m: m.flush(),
    "close": lambda m: m.close(),
}


def _summary_with_a_broken_metric(manager: MetricsManager) -> dict[str, Any]:
    manager.start_duration_timer()
    return manager.write_metrics_summary(
        {"loss": Sum(jnp.float32(1.0)), "bad_metric": BrokenMetric(jnp.float32(0.0))}, 3, 1
    ).result()


def test_a_failing_metric_is_left_out_and_the_rest_written():
    recorder = RecordingWriter()
    with make(recorder) as manager:
        summary = _summary_with_a_broken_metric(manager)
    assert set(summary) == {"loss"}
    assert written(recorder)[0] == ("write_scalars", 3, {"loss": 1.0})
    (failure,) = manager.errors
    assert failure.source == "metric:bad_metric" and failure.step == 3
    assert "cannot compute this one" in str(failure)


@flax.struct.dataclass
class PerClass(Sum):  # its own compute_value: the call cannot tell what it gives
    def compute_value(self) -> clu.values.Scalar:
        return clu.values.Scalar(np.broadcast_to(self.total, (3,)))


def test_a_value_no_writer_takes_is_left_out_and_the_rest_written(tmp_path):
    # (A Sum of a vector, whose compute() shows it, is refused at the call: test_failures.)
    with MetricsManager("train", tmp_path) as manager:
        for step in (1, 2):
            manager.start_duration_timer()
            summary = manager.write_metrics_summary(
                {"loss": Sum(jnp.float32(step)), "vector": PerClass(jnp.float32(1))}, step, 1
            ).result()
    assert summary["vector"].value.tolist() == [1.0, 1.0, 1.0]  # computed, but not writable
    text = (tmp_path / "train" / "metrics.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert [(line["step"], line["loss"], "vector" in line) for line in lines] == [
        (1, 1.0, False),
        (2, 2.0, False),
    ]
    assert [(f.source, f.step, f.keys) for f in manager.errors] == [
        ("metric:vector", 1, ("vector",)),
        ("metric:vector", 2, ("vector",)),
    ]
    assert "'vector': Scalar of ndarray of shape (3,)" in str(manager.errors[0])
    assert "clu.values.Histogram(x" in str(manager.errors[0])  # the fix


@pytest.mark.parametrize("next_call", sorted(NEXT_CALLS))
def test_under_raise_a_background_failure_raises_on_the_next_call(next_call):
    recorder = RecordingWriter()
    manager = make(recorder, on_error="raise", clock=lambda: 0.0)
    with pytest.raises(MetricsManagerError, match="summary at step 3: metric:bad_metric"):
        _summary_with_a_broken_metric(manager)  # its future fails (T5X's), loss still written
    assert written(recorder)[0] == ("write_scalars", 3, {"loss": 1.0})
    with pytest.raises(MetricsManagerError, match="metric:bad_metric at step 3.*cannot compute"):
        NEXT_CALLS[next_call](manager)
    manager.close()  # raised once; close() releases the writer
    assert written(recorder)[-1] == ("close",)
    own = {  # the raising call's own values were queued first: lost before
        "write_metrics_summary": ("write_scalars", 5, {"loss": 1.0}),
        "write_scalar": ("write_scalars", 5, {"x": 1.0}),
        "write_scalars": ("write_scalars", 5, {"x": 1.0}),
        "write_texts": ("write_texts", 5, {"x": "y"}),
        "write_hparams": ("write_hparams", {"x": 1}),
    }
    if next_call in own:
        assert written(recorder)[-2] == own[next_call]


def test_under_raise_the_future_of_the_failed_write_fails_naming_writer_and_step():
    manager = make(BrokenWriter(), on_error="raise")
    manager.start_duration_timer()
    future = manager.write_metrics_summary({"loss": Sum(jnp.float32(1.0))}, 3, 1)
    with pytest.raises(MetricsManagerError, match="writer:BrokenWriter at step 3.*disk full"):
        future.result()
    with pytest.raises(MetricsManagerError, match="disk full"):
        manager.close()


def test_under_warn_a_failing_writer_is_logged_at_once_and_training_goes_on(caplog):
    manager = make(BrokenWriter(), clock=lambda: 0.0)
    with caplog.at_level(logging.ERROR, logger="metrics_manager.manager"):
        for step in (1, 2):
            manager.start_duration_timer()
            manager.write_metrics_summary({"loss": Sum(jnp.float32(1.0))}, step, 1).result()
    assert "writer:BrokenWriter at step 1 (keys loss)" in caplog.records[0].getMessage()
    manager.close()
    assert [f.step for f in manager.errors] == [1, 2]
    assert manager.health()["writers"]["BrokenWriter"] == {
        "failures": 2,
        "quarantined": None,
        "skipped": 0,
        "flush_failure": None,
        "unsupported": [],
    }


def test_a_full_queue_blocks_the_caller_until_a_job_starts_and_drops_nothing():
    writer_free = threading.Event()

    class GatedWriter(RecordingWriter):
        def write_scalars(self, step: int, scalars: Any) -> None:
            assert writer_free.wait(timeout=30)
            super().write_scalars(step, scalars)

    recorder = GatedWriter()
    manager = make(recorder, clock=lambda: 0.0, max_pending=1)
    returned: list[int] = []

    def loop() -> None:
        for step in (1, 2, 3):
            manager.write_metrics_summary({"loss": Sum(jnp.float32(step))}, step, 1)
            returned.append(step)

    caller = threading.Thread(target=loop)
    caller.start()
    deadline = time.monotonic() + 30
    while len(returned) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    caller.join(timeout=0.3)
    assert returned == [1, 2]  # 1 runs (gated), 2 waits; 3 finds the queue full
    writer_free.set()
    caller.join(timeout=30)
    assert returned == [1, 2, 3]
    manager.close()
    assert [(c[0], c[1], dict(c[2])) for c in written(recorder)[:3]] == [
        ("write_scalars", s, {"loss": float(s)}) for s in (1, 2, 3)
    ]


def test_a_call_from_the_worker_with_a_full_queue_raises_instead_of_hanging():
    manager: MetricsManager

    class CallingWriter(RecordingWriter):
        def write_scalars(self, step: int, scalars: Any) -> None:
            manager.write_scalar("echo", 1.0, step)
            manager.write_scalar("echo", 1.0, step)

    manager = make(CallingWriter(), clock=lambda: 0.0, max_pending=1)
    manager.write_metrics_summary({"loss": Sum(jnp.float32(1.0))}, 1, 1).result()
    manager.close()
    assert str(manager.errors[0]) == (
        "writer:CallingWriter at step 1 (keys loss): RuntimeError: MetricsManager[train]: "
        "queueing with 1 jobs pending was called from its own worker thread (inside a writer, "
        "or a future's callback), where it would wait for itself forever. Call it from the "
        "training loop."
    )


@pytest.fixture
def transfer_guard_disallow():
    """`jax_transfer_guard="disallow"` for every thread, as a loop set up to catch its own
    implicit transfers has it (the context manager of that name covers one thread only)."""
    previous = jax.config.jax_transfer_guard
    jax.config.update("jax_transfer_guard", "disallow")
    yield
    jax.config.update("jax_transfer_guard", previous)


def test_a_loop_under_a_global_transfer_guard_writes_everything(tmp_path, transfer_guard_disallow):
    # Made before the guard, as a loop's arrays are; the metrics are eager, with a Python
    # int leaf (`steps=1`) that only the worker puts on the device.
    with jax.transfer_guard("allow"):
        loss, weights = jnp.float32(2.5), jnp.arange(4.0)
        metrics = {"loss": AveragePerStep.from_model_output(jnp.bfloat16(1.5)), "sum": Sum(loss)}
    with pytest.raises(jax.errors.JaxRuntimeError, match="Disallowed host-to-device"):
        jnp.float32(1.0)  # the guard is on
    with MetricsManager(
        "train", summary_dir=str(tmp_path), writer_factory=writers.JsonlWriter
    ) as m:
        m.write_scalar("step_loss", loss, 1)
        m.write_histograms(1, {"w": weights})
        m.start_duration_timer()
        summary = m.write_metrics_summary(metrics, 2, num_steps=1).result()
        assert m.errors == []
    text = (tmp_path / "train" / "metrics.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert [(x["step"], x.get("step_loss"), x.get("w", {}).get("count")) for x in lines[:2]] == [
        (1, 2.5, None),
        (1, None, 4),
    ]
    assert {k: lines[2][k] for k in ("step", "loss", "sum")} == {"step": 2, "loss": 1.5, "sum": 2.5}
    assert float(summary["loss"].value) == 1.5


@flax.struct.dataclass
class RootMetric(clu_metrics.Metric):
    """A user's metric whose compute() runs a jnp op on the worker's host copy."""

    total: jax.Array

    def compute(self) -> jax.Array:
        return jnp.sqrt(self.total)


def test_metrics_whose_compute_runs_jnp_ops_are_written_under_a_global_transfer_guard(
    tmp_path, transfer_guard_disallow
):
    # A compute() running jnp ops on the worker's host copies makes the worker's own
    # transfers, which the guard lost the key to before.
    with jax.transfer_guard("allow"):
        metrics = {"root": RootMetric(total=jnp.float32(6.25))}
    with MetricsManager(
        "train", summary_dir=str(tmp_path), writer_factory=writers.JsonlWriter
    ) as m:
        m.write_metrics_summary(metrics, 1, num_steps=1).result()
        assert m.errors == []
    (line,) = [
        json.loads(x) for x in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    assert line["root"] == 2.5


def test_library_metrics_compute_host_copies_in_numpy_as_written(tmp_path):
    """Their compute() ran jnp on the worker's host copies: each summary sent them to the
    device and back, and its values were JAX Arrays. NumPy float32 numbers now, as jnp
    computes them on the device."""
    scores, labels = jnp.array([0.9, 0.8, 0.2, 0.6]), jnp.array([1, 0, 0, 1])
    logits, tokens = jnp.log(jnp.array([[0.5, 0.3, 0.2], [0.1, 0.2, 0.7]])), jnp.array([0, 2])
    metrics = {
        "x": Welford.from_model_output(jnp.array([1.0, 2.0, 4.0])),
        "auc": AUROC.from_model_output(scores, labels),
        "precision": Precision.from_model_output(scores, labels),
        "perplexity": Perplexity.from_model_output(logits, tokens),
        "empty": MeanStd.empty(),
    }
    on_device = {k: v.compute() for k, v in metrics.items()}
    on_device |= {"x/std": metrics["x"].std(), "x/sem": metrics["x"].sem()}
    on_device |= {"empty/std": metrics["empty"].std()}
    with MetricsManager(
        "train", summary_dir=str(tmp_path), writer_factory=writers.JsonlWriter
    ) as m:
        summary = m.write_metrics_summary(metrics, 1, num_steps=1).result()
        assert m.errors == []
    assert {k: type(v.value) for k, v in summary.items()} == dict.fromkeys(on_device, np.float32)
    (line,) = writers.read_jsonl(tmp_path / "train")
    assert (line["empty"], line["empty/std"]) == ("NaN", "NaN")  # JSON has no NaN
    written = {k: line[k] for k in on_device if not k.startswith("empty")}
    assert written == {k: float(on_device[k]) for k in written}  # bit for bit, as float32
    assert (line["auc"], line["precision"]) == (0.75, float(np.float32(2 / 3)))
    assert line["perplexity"] == pytest.approx(1 / np.sqrt(0.5 * 0.7), rel=1e-6)


def test_a_jitted_donating_loop_under_a_global_transfer_guard_writes_every_summary(
    tmp_path, transfer_guard_disallow
):
    # The README loop's shape: metrics merged into a PackedMetrics inside jit, state and
    # window donated, a device loss passed to write_scalar. On an accelerator the guard also
    # refuses the loop's own device-to-host reads (on the CPU it does not: no copy is made).
    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(w, running, x):
        loss = jnp.mean((x * w) ** 2)
        metrics = {
            "loss": AveragePerStep.from_model_output(loss),
            "rate": StepsPerTime.from_model_output(),
        }
        return w * 0.5, merge_metrics(running, metrics), loss

    with jax.transfer_guard("allow"):
        x, w = jnp.arange(1.0, 5.0), jnp.ones(4)
    expected = [np.mean((np.arange(1.0, 5.0) * 0.5**t) ** 2) for t in range(12)]
    with MetricsManager(
        "train", summary_dir=str(tmp_path), writer_factory=writers.JsonlWriter
    ) as m:
        running = None
        m.start_duration_timer(block_on=w)
        for step in range(1, 13):
            w, running, loss = train_step(w, running, x)
            m.write_scalar("step_loss", loss, step)
            if step % 4 == 0:
                m.write_metrics_summary(running, step, num_steps=4)
                running = None
                m.start_duration_timer(block_on=w)
        if jax.default_backend() != "cpu":  # the loop's own read is still refused
            with pytest.raises(jax.errors.JaxRuntimeError, match="Disallowed device-to-host"):
                float(jnp.sum(w))  # (not `loss`: the manager's read left a host copy in it)
        m.flush()
        assert m.errors == []
    lines = writers.read_jsonl(tmp_path / "train")
    steps = [x["step_loss"] for x in lines if "step_loss" in x]
    np.testing.assert_allclose(steps, expected, rtol=1e-6)
    summaries = [x for x in lines if "loss" in x]
    assert [x["step"] for x in summaries] == [4, 8, 12]
    np.testing.assert_allclose(
        [x["loss"] for x in summaries], np.reshape(expected, (3, 4)).mean(axis=1), rtol=1e-6
    )
    assert all(x["rate"] > 0 for x in summaries)


def test_a_key_two_metrics_write_is_reported_not_silently_replaced():
    # MeanStd 'x' also writes 'x/std': a metric named 'x/std' replaced it, with nothing in
    # manager.errors. A dict and a PackedMetrics (its types read from its layout) are both
    # refused at the call, whatever the dict's order; nothing of either call is written.
    for order in (("x", "x/std"), ("x/std", "x")):
        recorder = RecordingWriter()
        metrics = {
            "x": MeanStd.from_model_output(jnp.array([1.0, 3.0])),
            "x/std": clu_metrics.Average.from_model_output(jnp.array([42.0])),
        }
        metrics = {k: metrics[k] for k in order}
        with make(recorder) as manager:
            for window in (metrics, merge_metrics(None, metrics, pack=True)):
                with pytest.raises(ValueError, match=r"keys \['x/std'\] would be written twice"):
                    manager.write_metrics_summary(window, 3, 1)
        assert written(recorder) == [("close",)]
        assert manager.errors == []


@pytest.mark.parametrize("nonfinite", ["warn", "stop"])
@pytest.mark.parametrize("times", [(5.0, 5.0), (5.0, 4.0)], ids=["still", "stepped_back"])
def test_a_window_of_0_s_gives_infinite_rates_not_a_made_up_nanosecond(caplog, times, nonfinite):
    # A coarse clock, or one stepped back: the window was taken as 1 ns, so 1e9 steps/s,
    # finite, and never warned about; and perf/mfu 1e6, past its range of 0 to 1. Its inf
    # rates are no non-finite values of the loop's: nonfinite="stop" stopped the run.
    recorder = RecordingWriter()
    metrics = {
        "steps_per_second": StepsPerTime(),
        "tokens_per_second": TimeRate(numerator=jnp.float32(4096.0)),
        "seconds": Time(),
    }
    settings = {"flops_per_step": 1e12, "peak_flops_per_device": 1e15, "num_devices": 1}
    now = [times[0]]
    with (
        caplog.at_level(logging.WARNING),
        make(recorder, clock=lambda: now[0], nonfinite=nonfinite, **settings) as m,
    ):
        m.start_duration_timer()
        now[0] = times[1]
        summary = m.write_metrics_summary(metrics, step=1, num_steps=1).result()
        m.start_duration_timer()
        now[0] += 1.0
        later = m.write_metrics_summary({"loss": Sum(jnp.float32(2.0)), **metrics}, 2, 1).result()
    values = {k: float(v.value) for k, v in summary.items()}
    assert values == {"steps_per_second": np.inf, "tokens_per_second": np.inf, "seconds": 0.0}
    assert written(recorder)[0] == ("write_scalars", 1, values)  # no perf/* of a 0 s window
    assert float(later["steps_per_second"].value) == 1.0
    assert float(later["loss"].value) == 2.0
    assert float(later["perf/mfu"].value) == 1e-3  # 1e12 FLOPs x 1 step / 1 s / 1e15
    assert m.errors == []
    messages = [r.getMessage() for r in caplog.records]
    assert any("the window took 0 s at step 1" in msg for msg in messages), messages
    assert any(
        "the window ending at step 1 took 0 s (the clock did not advance, or went back): "
        "['seconds', 'steps_per_second', 'tokens_per_second'] measure time" in msg
        for msg in messages
    ), messages
    assert not any("non-finite values at step" in msg for msg in messages), messages
