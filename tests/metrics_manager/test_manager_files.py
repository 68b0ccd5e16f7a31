"""MetricsManager through the real default writers, judged by what lands on disk.

TensorBoard files are read with TensorBoard's own `EventAccumulator`, the JSONL
log with `json`. The clock is faked so rates are exact.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import threading
from pathlib import Path
from typing import Any

import clu.metrics as clu_metrics
import clu.values
import flax
import jax
import jax.numpy as jnp
import pytest
from tensorboard.backend.event_processing import event_accumulator

import writers
from metrics_manager.manager import MetricsManager, MetricsManagerError
from metrics_manager.metrics import AveragePerStep, StepsPerTime, Sum


@flax.struct.dataclass
class TextMetric(clu_metrics.Metric):
    def compute_value(self) -> clu.values.Text:
        return clu.values.Text("test metric")


def read_tensorboard(logdir: str) -> event_accumulator.EventAccumulator:
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    return acc


def stale_log_warning(logdir: str, resume_step: int) -> str:
    """The manager's warning when a resumed writer set leaves `logdir`'s metrics.jsonl as it was."""
    return (
        f"MetricsManager 'train': resume_step={resume_step}, but no writer of this set rewrote "
        f"{logdir}/metrics.jsonl, which keeps the earlier run's steps after {resume_step} (and "
        "writers.plot reads it before the event files). Remove it, or keep the JSONL writer in "
        "the set."
    )


def read_jsonl(logdir: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(logdir, "metrics.jsonl").read_text().splitlines()]


def test_t5x_case_lands_in_summary_tensorboard_jsonl_and_console(tmp_path):
    console = io.StringIO()
    factory = functools.partial(
        writers.create_default_writer, collection="train", console_stream=console
    )
    ticks = iter([0.0, 40.0])
    with MetricsManager(
        "train", tmp_path, writer_factory=factory, clock=lambda: next(ticks)
    ) as manager:
        manager.start_duration_timer(block_on={"params": jnp.ones(3)})
        metrics = {
            "loss": Sum(jnp.float32(40.0)),
            "accuracy": AveragePerStep(total=jnp.float32(20.0)),
            "steps_per_second": StepsPerTime(),
            "text": TextMetric(),
        }
        summary = manager.write_metrics_summary(metrics, step=4, num_steps=2).result()
    expected = {"loss": 40.0, "accuracy": 10.0, "steps_per_second": 0.05}

    assert {k: float(summary[k].value) for k in expected} == pytest.approx(expected)
    assert summary["text"].value == "test metric"

    acc = read_tensorboard(manager.summary_dir)
    assert set(expected) <= set(acc.Tags()["scalars"])
    for key, value in expected.items():
        (event,) = acc.Scalars(key)
        assert event.step == 4 and event.value == pytest.approx(value)
    (text_event,) = acc.Tensors("text")
    assert text_event.step == 4
    assert text_event.tensor_proto.string_val == [b"test metric"]

    lines = read_jsonl(manager.summary_dir)
    scalar_line = next(line for line in lines if "loss" in line)
    text_line = next(line for line in lines if "text" in line)
    assert scalar_line["step"] == 4 and scalar_line["collection"] == "train"
    assert {k: scalar_line[k] for k in expected} == pytest.approx(expected)
    assert text_line == {**text_line, "step": 4, "text": "test metric"}

    assert console.getvalue() == (
        "step 4 | train\n  accuracy          10\n  loss              40\n"
        "  steps_per_second  0.05\nstep 4 | train\n  text  test metric\n"
    )


def test_other_processes_create_no_directory(monkeypatch, tmp_path):
    import jax

    monkeypatch.setattr(jax, "process_index", lambda: 1)
    root = tmp_path / "runs"
    with MetricsManager("train", root, clock=iter([0.0, 1.0]).__next__) as manager:
        manager.start_duration_timer()
        summary = manager.write_metrics_summary({"loss": Sum(jnp.float32(2.0))}, 1, 1).result()
        manager.write_scalar("lr", 0.1, 1)
        manager.write_texts(1, {"config": "x"})
        manager.write_hparams({"lr": 0.1})
    assert manager.summary_dir == str(root / "train")
    assert float(summary["loss"].value) == 2.0
    assert not root.exists()


def test_failing_backend_is_named_and_others_still_write(tmp_path):
    """The JSONL file's directory disappears: JSONL fails, named; TensorBoard still gets it."""
    factory = functools.partial(writers.create_default_writer, console=False)
    manager = MetricsManager("train", tmp_path, writer_factory=factory, on_error="raise")
    manager.writers["jsonl"]._log._file.close()  # a write now raises, as on a lost mount
    manager.write_scalars(3, {"lr": 1.5})
    with pytest.raises(MetricsManagerError, match="writer:jsonl at step 3"):
        manager.flush()
    with pytest.raises(MetricsManagerError, match="writer:jsonl"):  # its close fails too
        manager.close()
    (event,) = read_tensorboard(manager.summary_dir).Scalars("lr")
    assert event.step == 3 and event.value == 1.5


def test_no_thread_outlives_close_with_default_writers(tmp_path):
    before = set(threading.enumerate())
    factory = functools.partial(writers.create_default_writer, console_stream=io.StringIO())
    manager = MetricsManager("train", tmp_path, writer_factory=factory)
    manager.start_duration_timer()
    manager.write_metrics_summary({"loss": Sum(jnp.float32(1.0))}, 1, 1).result()
    new = {t.name for t in set(threading.enumerate()) - before}
    assert "MetricsManager[train]" in new  # the one worker (and TensorBoard's fsync timer)
    manager.close()
    assert set(threading.enumerate()) <= before
    assert read_jsonl(manager.summary_dir)[0]["loss"] == 1.0


def test_images_and_histograms_reach_every_writer_and_bad_ones_are_refused_at_the_call(
    tmp_path, caplog
):
    """Generated samples and weight histograms between summaries, in call order, read on the
    worker (a device array still being computed does not hold the loop)."""
    acc_sizes = {"tensors": 0, "scalars": 0, "histograms": 0}
    weights = jax.jit(lambda x: jnp.tanh(x @ x.T))(jnp.ones((64, 64)) / 64)  # maybe unready
    image = jnp.linspace(0.0, 1.0, 2 * 3 * 3).reshape(1, 2, 3, 3)  # floats in [0, 1]
    factory = functools.partial(writers.create_default_writer, console=False)
    with MetricsManager("train", tmp_path, writer_factory=factory) as manager:
        manager.write_scalars(10, {"loss": 0.5})
        manager.write_images(10, {"samples": image})
        manager.write_histograms(10, {"w": weights, "b": [0.0, 1.0, 1.0, 2.0]}, {"b": 2})
        bad_calls = (
            (manager.write_images, (11, {"flat": jnp.ones((4, 4))}), "image 'flat' must have"),
            (manager.write_histograms, (11, {"e": jnp.zeros((0,))}), "histogram 'e' is empty"),
            (manager.write_histograms, (11, {"w": weights}, 8), "num_buckets must map keys"),
            (manager.write_images, (11, {"step": image}), "reserved"),
        )
        for method, args, message in bad_calls:
            with pytest.raises((TypeError, ValueError), match=message):
                method(*args)
        # NaN is seen only once the values are read: that key is lost, the others are written.
        nan = jnp.log(jnp.array([-1.0, 1.0]))
        with caplog.at_level("ERROR", logger="metrics_manager.manager"):
            manager.write_histograms(12, {"nan": nan, "ok": jnp.arange(4.0)})
            manager.flush()
    assert [(f.source, f.step) for f in manager.errors] == [("metric:nan", 12)]
    assert "histogram 'nan' has 1 NaN/Inf entries" in caplog.text
    lines = read_jsonl(str(tmp_path / "train"))
    assert [
        (line["step"], sorted(set(line) - {"step", "time", "collection"})) for line in lines
    ] == [
        (10, ["loss"]),
        (10, ["samples"]),
        (10, ["b", "w"]),
        (12, ["ok"]),
    ]
    assert lines[1]["samples"] == {"type": "image", "shape": [1, 2, 3, 3]}
    assert lines[2]["b"]["counts"] == [1, 3] and lines[2]["w"]["count"] == 64 * 64
    acc = event_accumulator.EventAccumulator(str(tmp_path / "train"), size_guidance=acc_sizes)
    acc.Reload()
    assert acc.Tensors("samples")[0].tensor_proto.string_val[:2] == [b"3", b"2"]  # width, height
    assert [h.histogram_value.num for h in acc.Histograms("w")] == [64 * 64]
    assert [(h.step, h.histogram_value.num) for h in acc.Histograms("ok")] == [(12, 4)]


def test_writing_the_resume_step_again_warns_once_and_its_fix_gives_every_step_once(
    tmp_path, caplog
):
    # A resumed run that evaluates at its restored step put that step in the logs twice
    # (the writers keep steps <= resume_step), with no word.
    def run(start: int, resume_step: int | None) -> None:
        with MetricsManager("eval", tmp_path, resume_step=resume_step) as manager:
            for step in range(start, 101, 25):  # an eval every 25 steps, the start's too
                manager.write_scalars(step, {"accuracy": (resume_step or 0) + step / 1000})

    def steps() -> tuple[list[int], list[int]]:
        jsonl = [line["step"] for line in writers.read_jsonl(tmp_path / "eval")]
        return jsonl, [e.step for e in read_tensorboard(str(tmp_path / "eval")).Scalars("accuracy")]

    run(0, None)
    with caplog.at_level(logging.WARNING, logger="metrics_manager.manager"):
        run(50, 50)
    warned = [r.getMessage() for r in caplog.records if "resume_step" in r.getMessage()]
    assert warned == [
        "MetricsManager 'eval': step 50 is resume_step, where the run before wrote "
        "['accuracy'], kept by the writers: readers see them at step 50 twice. Leave them out "
        "of this write (the run before has them), or pass resume_step=49 if this run writes "
        "all of step 50 again (the run before's ['accuracy'] there are then dropped first)."
    ]
    assert steps() == ([0, 25, 50, 50, 75, 100], [0, 25, 50, 50, 75, 100])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="metrics_manager.manager"):
        run(50, 49)  # as the message says
    assert [r for r in caplog.records if "resume_step" in r.getMessage()] == []
    assert steps() == ([0, 25, 50, 75, 100], [0, 25, 50, 75, 100])
    accuracy = [line["accuracy"] for line in writers.read_jsonl(tmp_path / "eval")]
    assert accuracy == [0.0, 0.025, 49.05, 49.075, 49.1]  # the new run's from step 50 on


def test_a_resumed_run_writing_other_keys_at_resume_step_is_not_told_to_drop_it(tmp_path, caplog):
    # A run resumed at 60 that writes its config at its start step, as T5X's trainer does
    # (the run before wrote it at 0), was warned that step 60 would be seen twice and told to
    # pass resume_step=59, which dropped the run before's train summary at 60: no later
    # write brings it back. Only keys the run before wrote at 60 count as written twice.
    def run(start: int, resume_step: int | None) -> None:
        with MetricsManager("train", tmp_path, resume_step=resume_step) as manager:
            manager.write_texts(start, {"config": f"run from {start}"})
            for step in range(start + 20, 101, 20):
                manager.write_scalars(step, {"loss": step / 100})
            if resume_step is not None:
                manager.write_scalars(resume_step, {"eval/accuracy": 0.5})  # new at 60

    def resume_warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "is resume_step" in r.getMessage()]

    run(0, None)
    with caplog.at_level(logging.WARNING, logger="metrics_manager.manager"):
        run(60, 60)
    assert resume_warnings() == []
    lines = writers.read_jsonl(tmp_path / "train")
    assert [(x["step"], sorted(set(x) - {"step", "time", "collection"})) for x in lines] == [
        (0, ["config"]),
        (20, ["loss"]),
        (40, ["loss"]),
        (60, ["loss"]),  # the run before's summary at the checkpoint's step, kept
        (60, ["config"]),
        (80, ["loss"]),
        (100, ["loss"]),
        (60, ["eval/accuracy"]),
    ]
    # A key the run before wrote at 60 is warned about, naming it and what S - 1 drops.
    with (
        caplog.at_level(logging.WARNING, logger="metrics_manager.manager"),
        MetricsManager("train", tmp_path, resume_step=60) as manager,
    ):
        manager.write_scalars(60, {"eval/accuracy": 0.75, "eval/loss": 0.25})
    assert resume_warnings() == [
        "MetricsManager 'train': step 60 is resume_step, where the run before wrote "
        "['eval/accuracy'], kept by the writers: readers see them at step 60 twice. Leave them "
        "out of this write (the run before has them), or pass resume_step=59 if this run "
        "writes all of step 60 again (the run before's ['config', 'eval/accuracy', 'loss'] "
        "there are then dropped first)."
    ]


def test_a_fresh_run_passing_resume_step_is_not_warned_of_a_run_before(tmp_path, caplog):
    # A new run that passes its initial state's step (resume_step=0, as a loop that always
    # passes the restored step does) and writes its config at step 0, as T5X's trainer does,
    # was told that "readers may see step 0 twice" and to remove old summaries it never had.
    with (
        caplog.at_level(logging.WARNING, logger="metrics_manager.manager"),
        MetricsManager("train", tmp_path, resume_step=0) as manager,
    ):
        manager.write_texts(0, {"config": "lr = 0.1"})
        manager.write_scalars(10, {"loss": 0.5})
    with (
        caplog.at_level(logging.WARNING, logger="metrics_manager.manager"),
        MetricsManager("eval", tmp_path / "new", resume_step=50) as manager,  # a new dir
    ):
        manager.write_scalars(50, {"accuracy": 0.5})
    assert [r.getMessage() for r in caplog.records if "resume_step" in r.getMessage()] == []
    lines = writers.read_jsonl(tmp_path / "train")
    assert [(x["step"], sorted(set(x) - {"step", "time", "collection"})) for x in lines] == [
        (0, ["config"]),
        (10, ["loss"]),
    ]
    # The next run resumed at 0 in that directory is warned: its step 0 is there.
    with (
        caplog.at_level(logging.WARNING, logger="metrics_manager.manager"),
        MetricsManager("train", tmp_path, resume_step=0) as manager,
    ):
        manager.write_texts(0, {"config": "lr = 0.2"})
    assert len([r for r in caplog.records if "step 0 is resume_step" in r.getMessage()]) == 1


def test_the_resume_warning_is_for_the_resume_step_alone_and_outlives_a_refused_call(
    tmp_path, caplog
):
    # A config written at step 0 of a run resumed at 50, even in a new directory, was warned
    # about with advice for step 50; a refused call at step 50 used the one warning up.
    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if "is resume_step" in r.getMessage()]

    with MetricsManager("eval", tmp_path) as manager:  # the run before, to step 75
        for step in (0, 25, 50, 75):
            manager.write_scalars(step, {"accuracy": step / 100})
    with (
        caplog.at_level(logging.WARNING),
        MetricsManager("eval", tmp_path, resume_step=50) as manager,
    ):
        manager.write_texts(0, {"config": "lr = 0.1"})
        manager.write_scalars(0, {"accuracy": 0.5})
        assert warned() == []
        with pytest.raises(TypeError, match="accuracy"):
            manager.write_scalars(50, {"accuracy": "high"})
        assert warned() == []
        manager.write_scalars(50, {"accuracy": 0.75})
        manager.write_scalars(50, {"loss": 0.25})
        assert len(warned()) == 1
        assert "pass resume_step=49" in warned()[0]
    # Nor does the JSONL writer take step 0 after the kept step 50 for a missing resume_step.
    assert not [r for r in caplog.records if "go backwards" in r.getMessage()]
    with MetricsManager("zero", tmp_path) as manager:  # the run before resume_step=0
        manager.write_scalars(0, {"accuracy": 0.25})
    caplog.clear()
    with (
        caplog.at_level(logging.WARNING, logger="metrics_manager.manager"),
        MetricsManager("zero", tmp_path, resume_step=0) as manager,
    ):
        manager.write_scalars(0, {"accuracy": 0.5})
    assert warned() == [
        "MetricsManager 'zero': step 0 is resume_step, where the run before wrote "
        "['accuracy'], kept by the writers: readers see them at step 0 twice. Leave them out "
        "of this write (the run before has them), or if this run writes all of step 0 again "
        "(['accuracy']), remove the run's old summaries first (resume_step=0 keeps only step "
        "0's)."
    ]
    lines = writers.read_jsonl(tmp_path / "eval")
    assert [(x["step"], x["accuracy"]) for x in lines if "accuracy" in x] == [
        (0, 0.0),
        (25, 0.25),
        (50, 0.5),
        (0, 0.5),
        (50, 0.75),
    ]
