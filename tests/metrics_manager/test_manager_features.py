"""The manager's resume, NNX interop, system metrics and FLOPs keys, through real writers."""

from __future__ import annotations

import math
import os
import time

import clu.values
import fsspec
import jax
import jax.numpy as jnp
import numpy as np
import psutil
import pytest
from clu import metrics as clu_metrics
from flax import nnx

import writers
from metrics_manager import MetricsManager, StepsPerTime, Sum, merge_metrics, step_flops
from metrics_manager import system as system_lib
from tests.metrics_manager.test_manager_files import read_jsonl, read_tensorboard, stale_log_warning


def files_only(d, collection=None, resume_step=None):
    return writers.create_default_writer(
        d, collection=collection, console=False, resume_step=resume_step
    )


@pytest.mark.parametrize("restored", [int, jnp.int32], ids=["int", "state.step"])
def test_resume_step_keeps_each_step_once_in_tensorboard_and_jsonl(tmp_path, restored):
    """`resume_step=state.step`, a restored checkpoint's scalar, was refused with advice
    for the hot path ("int(jax.Array) blocks the loop")."""
    for first, last, resume_step, offset in ((1, 100, None, 0.0), (51, 100, 50, 1000.0)):
        if resume_step is not None:
            resume_step = restored(resume_step)
        with MetricsManager(
            "train", tmp_path, writer_factory=files_only, resume_step=resume_step
        ) as manager:
            for step in range(first, last + 1):
                manager.write_metrics_summary({"loss": Sum(np.float32(step + offset))}, step, 1)
    logdir = str(tmp_path / "train")
    lines = read_jsonl(logdir)
    assert [x["step"] for x in lines] == list(range(1, 101))
    assert [x["loss"] for x in lines] == [float(s) for s in range(1, 51)] + [
        s + 1000.0 for s in range(51, 101)
    ]
    events = read_tensorboard(logdir).Scalars("loss")
    assert [e.step for e in events] == list(range(1, 101))
    assert events[-1].value == 1100.0


def test_resuming_with_a_set_without_jsonl_warns_of_the_log_it_leaves_stale(tmp_path, caplog):
    """The earlier run's metrics.jsonl kept its steps after resume_step, with no word, and
    writers.plot, which reads it first, plotted them."""

    def tensorboard_only(d, collection=None, resume_step=None):
        return writers.create_default_writer(
            d, console=False, jsonl=False, collection=collection, resume_step=resume_step
        )

    runs = [(files_only, None, range(10, 51, 10)), (files_only, 30, range(40, 61, 10))]
    runs.append((tensorboard_only, 40, range(50, 61, 10)))
    for factory, resume_step, steps in runs:
        with MetricsManager(
            "train", tmp_path, writer_factory=factory, resume_step=resume_step
        ) as manager:
            for step in steps:
                manager.write_scalars(step, {"loss": float(step)})
    # The second run replaced steps 40 and 50; the third wrote 50 and 60 to TensorBoard only.
    assert [x["step"] for x in read_jsonl(str(tmp_path / "train"))] == [10, 20, 30, 40, 50, 60]
    warned = [r.getMessage() for r in caplog.records if "no writer of this set" in r.getMessage()]
    assert warned == [stale_log_warning(str(tmp_path / "train"), 40)]


def test_resuming_a_url_log_copied_down_rewrites_its_parts_with_no_stale_log_warning(
    tmp_path, caplog
):
    """A run copied down from a URL (metrics.jsonl beside its .d/ parts) and resumed: the
    local writer appended after the object, read before the parts (steps 10, 30, 20, 30),
    and the manager, seeing the object unchanged, warned that no writer rewrote the log."""
    logdir = tmp_path / "train"
    logdir.mkdir()
    (logdir / "metrics.jsonl").write_text('{"step": 10, "loss": 10.0}\n')  # copied up, then down
    with writers.JsonlWriter(f"file://{logdir}") as w:  # the URL's parts
        for step in (20, 30):
            w.write_scalars(step, {"loss": float(step)})
    with MetricsManager("train", tmp_path, writer_factory=files_only, resume_step=20) as manager:
        manager.write_scalars(30, {"loss": 300.0})
    lines = writers.read_jsonl(logdir)
    assert [(x["step"], x["loss"]) for x in lines] == [(10, 10.0), (20, 20.0), (30, 300.0)]
    assert not [r for r in caplog.records if "no writer of this set" in r.getMessage()]


@pytest.mark.parametrize("jsonl", [True, False], ids=["jsonl", "no jsonl"])
def test_resuming_a_url_log_copied_up_warns_only_when_no_writer_rewrote_it(caplog, jsonl):
    """A URL log that is an object alone (a local log copied up, no .d/ parts): the manager
    listed the parts only, found none, and never warned that the earlier run's steps after
    resume_step stayed in the log."""
    fs, root = fsspec.filesystem("memory"), f"memory://copied-up-{jsonl}"
    fs.pipe(
        f"/copied-up-{jsonl}/train/metrics.jsonl",
        b"".join(b'{"step": %d, "loss": 1.0}\n' % step for step in (10, 20, 30, 40)),
    )

    def factory(d, resume_step=None):
        return files_only(d, resume_step=resume_step) if jsonl else writers.NoopWriter()

    with caplog.at_level("WARNING"):
        with MetricsManager("train", root, writer_factory=factory, resume_step=20):
            pass
    steps = [x["step"] for x in writers.read_jsonl(f"{root}/train/metrics.jsonl")]
    assert steps == ([10, 20] if jsonl else [10, 20, 30, 40])
    warned = [r.getMessage() for r in caplog.records if "no writer of this set" in r.getMessage()]
    assert warned == ([] if jsonl else [stale_log_warning(f"{root}/train", 20)])
    fs.rm(f"/copied-up-{jsonl}", recursive=True)


@pytest.mark.parametrize(
    "restored", [jnp.float32(50), jnp.array([50, 50])], ids=["float", "per device"]
)
def test_a_restored_step_the_manager_cannot_read_is_refused_with_the_fix(restored):
    """A float or per-device (pmap) state.step was refused with the loop's advice, "keep a
    host-side counter (step += 1): int(jax.Array) blocks the loop", where the step is read
    once and int() of it is the fix."""
    with pytest.raises(TypeError) as raised:
        MetricsManager("t", writer_factory=files_only, resume_step=restored)
    message = str(raised.value)
    assert "int(state.step[0])" in message and "host-side counter" not in message
    assert repr(restored) in message


def test_resume_step_needs_a_factory_that_takes_it(tmp_path):
    # A lambda factory was told "needs a writer_factory taking resume_step, such as
    # writers.create_default_writer": declaring resume_step=None in it went unsaid.
    with pytest.raises(TypeError) as raised:
        MetricsManager("t", writer_factory=lambda d: writers.NoopWriter(), resume_step=5)
    head, _, fix = str(raised.value).partition("; declare it in yours and pass it on: ")
    assert head == (
        "MetricsManager('t'): resume_step=5 needs a writer_factory taking resume_step, to drop "
        "the logged steps after it, such as writers.create_default_writer"
    )
    # The fix as written: the first run's steps 6 and 8 leave metrics.jsonl.
    for steps, resume in (((4, 6, 8), None), ((6,), 5)):
        factory = eval(fix, {"writers": writers})
        with MetricsManager("t", tmp_path, writer_factory=factory, resume_step=resume) as manager:
            for step in steps:
                manager.write_scalars(step, {"x": float(step if resume is None else -step)})
    lines = writers.read_jsonl(tmp_path / "t")
    assert [(line["step"], line["x"]) for line in lines] == [(4, 4.0), (6, -6.0)]


def test_a_factory_taking_keyword_arguments_gets_the_resume_step(tmp_path):
    # lambda logdir, **kw: ... was refused as taking no resume_step, and the earlier run's
    # steps after 2 stayed in metrics.jsonl.
    made = []

    def factory(logdir, **kwargs):
        made.append(kwargs)
        return writers.create_default_writer(logdir, console=False, tensorboard=False, **kwargs)

    for resume_step, steps in ((None, (1, 2, 3, 4)), (2, (3,))):
        with MetricsManager(
            "t", tmp_path, writer_factory=factory, resume_step=resume_step
        ) as manager:
            for step in steps:
                manager.write_scalars(step, {"x": float(10 * step + len(made))})
    assert made == [{}, {"resume_step": 2}]
    rows = writers.read_jsonl(tmp_path / "t")
    assert [(r["step"], r["x"]) for r in rows] == [(1, 11.0), (2, 21.0), (3, 32.0)]


def test_an_nnx_multimetric_is_written(tmp_path):
    multi = nnx.MultiMetric(loss=nnx.metrics.Average("loss"), accuracy=nnx.metrics.Accuracy())
    multi.update(
        loss=jnp.asarray([1.0, 2.0, 3.0, 4.0]),
        logits=jnp.asarray([[0.1, 0.9], [0.8, 0.2]]),
        labels=jnp.asarray([1, 1]),
    )
    with MetricsManager("eval", tmp_path, writer_factory=files_only) as manager:
        summary = manager.write_metrics_summary(multi, 7, 1).result()
        manager.write_metrics_summary(multi.compute(), 8, 1)
    assert float(summary["loss"].value) == 2.5 and float(summary["accuracy"].value) == 0.5
    lines = read_jsonl(str(tmp_path / "eval"))
    assert [(x["step"], x["loss"], x["accuracy"]) for x in lines] == [(7, 2.5, 0.5), (8, 2.5, 0.5)]


def test_system_metrics_land_in_jsonl_and_tensorboard(tmp_path):
    with MetricsManager(
        "train", tmp_path, writer_factory=files_only, system_metrics=True
    ) as manager:
        x = jnp.ones((256, 256))
        for _ in range(20):
            x = (x @ x) / 256.0
        rss = psutil.Process().memory_info().rss / 2**20
        manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, 1, 1).result()
    (line,) = read_jsonl(str(tmp_path / "train"))
    assert 0.0 <= line["system/host_memory_percent"] <= 100.0
    assert line["system/process_rss_mib"] == pytest.approx(rss, rel=0.1)
    if "system/process_cpu_percent" in line:  # needs 0.1 s since the monitor started
        assert 0.0 <= line["system/process_cpu_percent"] <= 100.0 * os.cpu_count()
    system = {key: value for key, value in line.items() if key.startswith("system/")}
    assert "system/process_rss_mib" in system and "system/host_memory_percent/max" in system
    events = read_tensorboard(str(tmp_path / "train"))  # float32 there: equal to 1e-6
    tags = {tag for tag in events.Tags()["scalars"] if tag.startswith("system/")}
    assert {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in tags} == {
        key: [(1, pytest.approx(value, rel=1e-6))] for key, value in system.items()
    }


def test_cpu_percent_missing_from_an_early_summary_comes_with_the_next(tmp_path, monkeypatch):
    """CPU % needs a span of CPU times: a summary right after the manager was made (a step-0
    eval) had none, and the CPU keys came only `system_interval_s` (10 s) later."""
    monkeypatch.setattr(system_lib, "_MIN_RATE_SPAN_S", 0.5)  # 0.1 s: too short to be sure
    with MetricsManager(
        "train", tmp_path, writer_factory=files_only, system_metrics=True
    ) as manager:
        manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, 0, 1).result()
        time.sleep(0.6)
        manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, 1, 1).result()
        manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, 2, 1).result()
    first, second, third = read_jsonl(str(tmp_path / "train"))
    assert "system/process_cpu_percent" not in first and "system/process_rss_mib" in first
    assert 0.0 <= second["system/process_cpu_percent"] <= 100.0 * os.cpu_count()
    assert 0.0 <= second["system/host_cpu_percent"] <= 100.0
    assert not any(k.startswith("system/") for k in third)  # then every system_interval_s


def test_perf_keys_from_the_compiled_steps_flops():
    m, k, n = 128, 64, 32
    a, b = jnp.ones((m, k)), jnp.ones((k, n))
    flops = step_flops(jax.jit(lambda a, b: a @ b), a, b)
    assert flops == pytest.approx(2 * m * n * k, rel=0.01)
    ticks = iter([0.0, 2.0])
    with MetricsManager(
        "t",
        writer_factory=lambda d: writers.NoopWriter(),
        clock=lambda: next(ticks),
        flops_per_step=flops,
        peak_flops_per_device=1e9,
    ) as manager:
        manager.start_duration_timer()
        summary = manager.write_metrics_summary({"sps": StepsPerTime(steps=10)}, 10, 10).result()
    tflops = flops * 10 / 2.0 / 1e12
    assert summary["perf/tflops_per_second"].value == pytest.approx(tflops)
    assert summary["perf/mfu"].value == pytest.approx(flops * 10 / 2.0 / (1e9 * jax.device_count()))


def test_perf_keys_of_a_step_without_arithmetic_are_zero():
    flops = step_flops(lambda x: x, jnp.ones((4,)))  # a copy: XLA counts no FLOPs
    assert flops == 0.0
    ticks = iter([0.0, 2.0])
    with MetricsManager(
        "t",
        writer_factory=lambda d: writers.NoopWriter(),
        clock=lambda: next(ticks),
        flops_per_step=flops,
        peak_flops_per_device=1e9,
        num_devices=1,
    ) as manager:
        manager.start_duration_timer()
        summary = manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, 10, 10).result()
    assert summary["perf/flops_per_step"].value == 0.0
    assert summary["perf/tflops_per_second"].value == 0.0
    assert summary["perf/mfu"].value == 0.0
    with pytest.raises(ValueError, match="flops_per_step must be >= 0 and finite, got -1.0"):
        MetricsManager("t", writer_factory=lambda d: writers.NoopWriter(), flops_per_step=-1.0)


def test_perf_per_device_divides_by_the_steps_devices_and_needs_a_window(caplog):
    now = [0.0]
    with caplog.at_level("WARNING", logger="metrics_manager.manager"):
        with MetricsManager(
            "t",
            writer_factory=lambda d: writers.NoopWriter(),
            clock=lambda: now[0],
            flops_per_step=1e12,
            peak_flops_per_device=1e12,
            num_devices=2,  # of the 8 test devices
        ) as manager:
            untimed = manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, 1, 1)
            manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, 2, 1)
            manager.start_duration_timer()
            now[0] = 4.0
            timed = manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, 10, 8)
    assert not any(k.startswith("perf/") for k in untimed.result())
    (warning,) = [r.getMessage() for r in caplog.records if "perf/*" in r.getMessage()]
    assert "no window was open at step 1" in warning and "start_duration_timer" in warning
    values = timed.result()
    assert isinstance(values["perf/tflops_per_second"], clu.values.Scalar)
    assert values["perf/tflops_per_second"].value == 2.0  # 1e12 FLOPs * 8 steps / 4 s
    assert values["perf/tflops_per_second_per_device"].value == 1.0
    assert values["perf/mfu"].value == 1.0
    with pytest.raises(ValueError, match="num_devices must be >= 1, got 0"):
        MetricsManager("t", writer_factory=lambda d: writers.NoopWriter(), num_devices=0)


def test_mfu_above_1_is_warned_about_once_with_the_settings_to_check(caplog):
    # 1e9 FLOPs x 10 steps / 2 s over 2 devices of peak 1e9: 2.5 of the peak, with no word,
    # while the README gives perf/mfu's range as 0 to 1.
    now = [0.0]
    with caplog.at_level("WARNING", logger="metrics_manager.manager"):
        with MetricsManager(
            "t",
            writer_factory=lambda d: writers.NoopWriter(),
            clock=lambda: now[0],
            flops_per_step=1e9,
            peak_flops_per_device=1e9,
            num_devices=2,
        ) as manager:
            futures = []
            for step in (10, 20):
                manager.start_duration_timer()
                now[0] += 2.0
                futures.append(manager.write_metrics_summary({"loss": Sum(1.0)}, step, 10))
    assert [f.result()["perf/mfu"].value for f in futures] == [2.5, 2.5]
    (warning,) = [r.getMessage() for r in caplog.records if "perf/mfu" in r.getMessage()]
    assert warning.startswith(
        "MetricsManager 't': perf/mfu is 2.5, above 1 (the devices' peak): "
        "peak_flops_per_device (1e+09 FLOP/s per device) or flops_per_step (1e+09, all "
        "devices) is likely wrong"
    )


def test_system_max_is_the_peak_between_summaries(tmp_path):
    # Sampled every 0.1 s between summaries: a 300 MiB peak freed before the summary shows in
    # `/max` and raises the mean above the summary's own sample.
    with MetricsManager(
        "train",
        tmp_path,
        writer_factory=files_only,
        system_metrics=True,
        system_interval_s=0.1,
    ) as manager:
        manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, 1, 1).result()
        peak = np.ones(300 * 2**20 // 8)  # touched: resident
        time.sleep(0.6)
        del peak
        after = psutil.Process().memory_info().rss / 2**20
        summary = manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, 2, 1).result()
    assert isinstance(summary["system/process_rss_mib"], clu.values.Scalar)
    line = read_jsonl(str(tmp_path / "train"))[1]
    assert line["system/process_rss_mib/max"] >= after + 250
    assert line["system/process_rss_mib/max"] > line["system/process_rss_mib"] > after + 50


def test_a_nan_system_value_is_warned_about_under_stop_not_stopped_on(
    tmp_path, monkeypatch, caplog
):
    """system/* is sampled on process 0 alone: a sensor's NaN under nonfinite="stop" stopped
    process 0 while the others waited in their next collective."""
    from metrics_manager import manager as manager_lib

    def scripted(interval_s):
        return system_lib.SystemMonitor(None, sample_fn=lambda: {"system/gpu0/temp_c": np.nan})

    monkeypatch.setattr(manager_lib, "SystemMonitor", scripted)
    with MetricsManager(
        "train", tmp_path, writer_factory=files_only, system_metrics=True, nonfinite="stop"
    ) as manager:
        manager.write_metrics_summary({"loss": Sum(np.float32(1.0))}, 1, 1).result()
        manager.write_metrics_summary({"loss": Sum(np.float32(2.0))}, 2, 1).result()
        assert manager.errors == []
    first, second = read_jsonl(str(tmp_path / "train"))
    assert (first["loss"], second["loss"]) == (1.0, 2.0)
    assert (first["system/gpu0/temp_c"], first["system/gpu0/temp_c/max"]) == ("NaN", "NaN")
    warned = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert warned == [
        "MetricsManager 'train': non-finite values at step 1 for "
        "['system/gpu0/temp_c', 'system/gpu0/temp_c/max']"
    ]
    # A loop's own NaN still stops the run.
    with MetricsManager("eval", tmp_path, writer_factory=files_only, nonfinite="stop") as m:
        m.write_metrics_summary({"loss": Sum(np.float32(np.nan))}, 1, 1).result()
        with pytest.raises(manager_lib.MetricsManagerError, match=r"for keys \['loss'\]"):
            m.write_metrics_summary({"loss": Sum(np.float32(1.0))}, 2, 1)


def test_uptime_is_seconds_from_the_managers_creation_to_each_summary_call(tmp_path):
    ticks = iter([100.0, 103.0, 104.5, 110.0, 111.0, 112.0])
    packed = jax.jit(lambda: merge_metrics(None, {"n": Sum.from_model_output(jnp.float32(1))}))()
    with MetricsManager(
        "train", tmp_path, writer_factory=files_only, clock=lambda: next(ticks), uptime=True
    ) as manager:  # made at 100
        first = manager.write_metrics_summary({"n": Sum(jnp.float32(1))}, 1, 1)  # called at 103
        manager.start_duration_timer()  # 104.5
        second = manager.write_metrics_summary(packed, 2, 1)  # 110
        # The loop's own `timing/uptime` wins.
        own = manager.write_metrics_summary({"timing/uptime": 7.0}, 3, 1)  # 111
        # Written beside the manager's at a summary's step (two at step 3): refused, as its
        # perf/* and system/* keys are.
        with pytest.raises(ValueError, match=r"write_scalars: key 'timing/uptime' is written by"):
            manager.write_scalars(3, {"timing/uptime": 5.0})
    assert first.result()["timing/uptime"].value == 3.0
    assert second.result()["timing/uptime"].value == 10.0
    assert own.result()["timing/uptime"].value == 7.0
    lines = read_jsonl(str(tmp_path / "train"))
    assert [(line["step"], line["timing/uptime"]) for line in lines] == [
        (1, 3.0),
        (2, 10.0),
        (3, 7.0),
    ]
    assert read_tensorboard(str(tmp_path / "train")).Scalars("timing/uptime")[1].value == 10.0
    with pytest.raises(TypeError, match="uptime must be True or False, got 'yes'"):
        MetricsManager("t", writer_factory=lambda d: writers.NoopWriter(), uptime="yes")


def test_a_collections_uptime_field_replaces_the_managers_uptime():
    """A Collection 'timing' with a field 'uptime' writes `timing/uptime`, as the README
    says a summary metric may: the summary was refused as writing that key twice."""
    ticks = iter([100.0, 103.0, 110.0, 111.0])
    timing = clu_metrics.Collection.create(uptime=clu_metrics.Average, steps=clu_metrics.Average)
    collection = timing.single_from_model_output(values=jnp.float32(7.0))
    loss = {"loss": clu_metrics.Average.from_model_output(jnp.float32(1.0))}
    with MetricsManager(
        "t", writer_factory=lambda d: writers.NoopWriter(), clock=lambda: next(ticks), uptime=True
    ) as manager:  # made at 100
        first = manager.write_metrics_summary({"timing": collection, **loss}, 1, 1)  # 103
        second = manager.write_metrics_summary(loss, 2, 1)  # 110: the manager's again
        third = manager.write_metrics_summary({"timing": collection, **loss}, 3, 1)  # 111
    assert {k: float(v.value) for k, v in first.result().items()} == {
        "timing/uptime": 7.0,
        "timing/steps": 7.0,
        "loss": 1.0,
    }
    assert {k: float(v.value) for k, v in second.result().items()} == {
        "loss": 1.0,
        "timing/uptime": 10.0,
    }
    assert third.result()["timing/uptime"].value == 7.0


def test_int32_accumulators_near_wrapping_are_warned_once_per_key(caplog):
    big = Sum(jnp.int32(2**30 + 5))
    wrapped = jax.jit(lambda a, b: a.merge(b))(Sum(jnp.int32(2**30)), Sum(jnp.int32(2**30)))
    assert int(wrapped.total) == -(2**31)  # what silently happens inside a jitted merge
    metrics = {
        "tokens": big,
        "wrapped": wrapped,
        "small": Sum(jnp.int32(7)),
        "loss": Sum(jnp.float32(3e9)),
    }
    with caplog.at_level("WARNING", logger="metrics_manager.manager"):
        with MetricsManager("train", writer_factory=lambda d: writers.NoopWriter()) as m:
            first = m.write_metrics_summary(metrics, 1, 1).result()
            m.write_metrics_summary(metrics, 2, 1).result()
            m.write_metrics_summary({**metrics, "new": big}, 3, 1).result()
    assert int(first["tokens"].value) == 2**30 + 5
    warnings = [r.getMessage() for r in caplog.records if "int32" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "['tokens', 'wrapped']" in warnings[0] and "at step 1" in warnings[0]
    assert "of ['new'] are past" in warnings[1]  # the others were warned of at step 1
    assert "float32" in warnings[0] and "jax_enable_x64" in warnings[0]


def test_a_clu_average_whose_int32_count_wrapped_is_not_written(tmp_path):
    # 600 steps of 4M tokens: the count passed 2**31 and read negative, so an accuracy of
    # 0.75 was written as -1.06, with only the "near wrapping" warning.
    tokens = 4 * 2**20
    step = clu_metrics.Accuracy(total=jnp.float32(0.75 * tokens), count=jnp.int32(tokens))
    accuracy = jax.jit(lambda s: jax.lax.fori_loop(1, 600, lambda _, w: w.merge(s), s))(step)
    expected_count = (600 * tokens + 2**31) % 2**32 - 2**31  # int32's wrap of 2,516,582,400
    assert int(accuracy.count) == expected_count < 0
    metrics = {
        "accuracy": accuracy,
        "eval": clu_metrics.Collection.create_collection(accuracy=accuracy),
        "short": step,  # one step's: right
        "loss": Sum(jnp.float32(2.0)),
    }
    with MetricsManager("train", tmp_path) as m:
        summary = m.write_metrics_summary(metrics, 600, 600).result()
    assert {k: float(v.value) for k, v in summary.items()} == {
        "short": 0.75,
        "loss": 2.0,
    }
    (line,) = read_jsonl(str(tmp_path / "train"))
    assert sorted(set(line) - {"step", "time", "collection"}) == ["loss", "short"]
    assert sorted(f.source for f in m.errors) == ["metric:accuracy", "metric:eval"]
    assert str(m.errors[0].error) == (
        f"metric 'accuracy': its int32 count wrapped past 2**31 (it reads {expected_count}) "
        "over the window ending at step 600; write summaries more often, or enable "
        "jax_enable_x64"
    )


def test_host_numbers_past_32_bits_in_a_summary_keep_their_values(tmp_path):
    # An eval summed on the host: without x64, packing sent the fields through the device,
    # which read an int64 count of 3e9 as -1294967296, a uint64 2**40 as 0, a float64 1e40
    # as inf (and a CLU Average's count of 3e9 as "wrapped", leaving its key out), while a
    # Python int of 3e9 failed the whole summary with JAX's OverflowError, 'loss' too.
    # Such metrics are computed on the host now.
    metrics = {
        "tokens": Sum(np.int64(3_000_000_000)),
        "python_tokens": Sum(3_000_000_000),
        "bytes": Sum(np.uint64(2**40)),
        "negative": Sum(np.array(-3_000_000_000)),
        "huge": Sum(np.float64(1e40)),
        "accuracy": clu_metrics.Average(total=np.float64(2.25e9), count=np.int64(3_000_000_000)),
        "loss": Sum(jnp.float32(2.0)),
    }
    expected = {
        "tokens": 3_000_000_000,
        "python_tokens": 3_000_000_000,
        "bytes": 2**40,
        "negative": -3_000_000_000,
        "huge": 1e40,
        "accuracy": 0.75,
        "loss": 2.0,
    }
    with MetricsManager("train", tmp_path, writer_factory=files_only, uptime=False) as m:
        summary = m.write_metrics_summary(metrics, 1, 1).result()
        m.write_metrics_summary({"loss": Sum(jnp.float32(3.0))}, 2, 1)
    assert {
        k: v.value.item() if hasattr(v.value, "item") else v.value for k, v in summary.items()
    } == expected
    first, second = read_jsonl(str(tmp_path / "train"))
    assert {k: first[k] for k in expected} == expected
    assert (second["step"], second["loss"]) == (2, 3.0)
    events = read_tensorboard(str(tmp_path / "train"))
    in_float32 = {**expected, "huge": math.inf}  # TensorBoard's scalars are float32
    assert {k: events.Scalars(k)[0].value for k in expected} == pytest.approx(in_float32)
    assert [e.step for e in events.Scalars("loss")] == [1, 2]
    assert m.errors == []


def test_host_floats_float32_cannot_hold_in_a_summary_keep_their_values(tmp_path):
    # Packing sent host float64 fields through the device as float32: Sum(np.float64(0.1))
    # and Sum(0.1) were written as 0.10000000149011612, a host Average of 0.3 / 1 as
    # 0.30000001192092896. Such metrics are computed on the host now; float32 fields and
    # float64 ones float32 holds exactly (0.5, 1e6) still go through the device.
    metrics = {
        "numpy": Sum(np.float64(0.1)),
        "python": Sum(0.1),
        "average": clu_metrics.Average(total=np.array([0.1, 0.2]).sum(), count=np.int32(1)),
        "vector": clu_metrics.Average(total=np.array(0.7), count=np.array(1)),
        "exact": Sum(np.float64(0.5)),
        "float32": Sum(np.float32(0.1)),
        "loss": Sum(jnp.float32(2.0)),
    }
    expected = {
        "numpy": 0.1,
        "python": 0.1,
        "average": 0.1 + 0.2,  # 0.30000000000000004, float64's own sum
        "vector": 0.7,
        "exact": 0.5,
        "float32": float(np.float32(0.1)),
        "loss": 2.0,
    }
    with MetricsManager("train", tmp_path, writer_factory=files_only, uptime=False) as m:
        m.write_metrics_summary(metrics, 1, 1)
    [line] = read_jsonl(str(tmp_path / "train"))
    assert {k: line[k] for k in expected} == expected
    assert m.errors == []


def test_a_summary_of_int4_metrics_is_written_as_write_scalars_writes_them(tmp_path):
    # write_scalars took an int4 (ml_dtypes) scalar, but a summary's int4 value was left out
    # as "unsupported value types for 'n': Scalar of ndarray of dtype int4", a failure each.
    metrics = {
        "n": Sum(jnp.asarray(-3, jnp.int4)),
        "u": Sum(jnp.asarray(7, jnp.uint4)),
        "loss": Sum(jnp.float32(2.0)),
    }
    with MetricsManager("train", tmp_path, writer_factory=files_only, uptime=False) as m:
        m.write_metrics_summary(metrics, 1, 1)
        m.write_metrics_summary({"loss": Sum(jnp.float32(3.0))}, 2, 1)
    first, second = read_jsonl(str(tmp_path / "train"))
    assert {k: first[k] for k in metrics} == {"n": -3, "u": 7, "loss": 2.0}
    assert (second["step"], second["loss"]) == (2, 3.0)
    events = read_tensorboard(str(tmp_path / "train"))
    assert {k: events.Scalars(k)[0].value for k in metrics} == {"n": -3.0, "u": 7.0, "loss": 2.0}
    assert m.errors == []


def test_an_ml_collections_config_is_written_as_hparams(tmp_path):
    # What Flax and CLU examples pass: an ml_collections ConfigDict (no Mapping), nested.
    import ml_collections
    from tensorboard.plugins.hparams import plugin_data_pb2

    config = ml_collections.ConfigDict(
        {"lr": 0.1, "opt": {"name": "adam", "b1": 0.9}, "schedule": {}}
    )
    with MetricsManager("train", tmp_path, writer_factory=files_only) as manager:
        manager.write_hparams(config)
    (line,) = read_jsonl(str(tmp_path / "train"))
    # An empty config keeps its name (it had vanished from every writer).
    assert line["hparams"] == {"lr": 0.1, "opt.name": "adam", "opt.b1": 0.9, "schedule": "{}"}
    content = read_tensorboard(str(tmp_path / "train")).PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = data.session_start_info.hparams
    assert (hparams["lr"].number_value, hparams["opt.b1"].number_value) == (0.1, 0.9)
    assert hparams["opt.name"].string_value == "adam"
    w = writers.JsonlWriter(tmp_path / "direct.jsonl")  # a writer without a manager takes it too
    w.write_hparams(config)
    w.close()
    assert writers.read_jsonl(str(tmp_path / "direct.jsonl"))[0]["hparams"]["opt.b1"] == 0.9


def test_a_dataclass_config_is_written_as_hparams(tmp_path):
    # What a Flax loop often keeps its settings in: nested dataclasses, flattened like a dict.
    import dataclasses

    from tensorboard.plugins.hparams import plugin_data_pb2

    @dataclasses.dataclass
    class Optimizer:
        name: str = "adam"
        betas: tuple = (0.9, 0.99)

    @dataclasses.dataclass
    class TrainConfig:
        lr: float = 0.1
        opt: Optimizer = dataclasses.field(default_factory=Optimizer)

    with MetricsManager("train", tmp_path, writer_factory=files_only) as manager:
        manager.write_hparams(TrainConfig())
        manager.write_hparams({"run": TrainConfig(lr=0.5)})
    first, nested = read_jsonl(str(tmp_path / "train"))
    assert first["hparams"] == {"lr": 0.1, "opt.name": "adam", "opt.betas": "(0.9, 0.99)"}
    assert nested["hparams"] == {
        "run.lr": 0.5,
        "run.opt.name": "adam",
        "run.opt.betas": "(0.9, 0.99)",
    }
    content = read_tensorboard(str(tmp_path / "train")).PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = data.session_start_info.hparams
    assert hparams["lr"].number_value == 0.1 and hparams["opt.name"].string_value == "adam"
    w = writers.JsonlWriter(tmp_path / "direct.jsonl")  # a writer without a manager takes it too
    w.write_hparams(TrainConfig())
    w.close()
    assert writers.read_jsonl(str(tmp_path / "direct.jsonl"))[0]["hparams"]["opt.name"] == "adam"


def test_a_histogram_left_out_costs_the_call_no_other_key(tmp_path):
    """A NaN histogram left out of `write_histograms` stayed in its `num_buckets`: each writer
    refused the whole call ("num_buckets names ['bad']"), losing 'good' and counting failures."""
    with MetricsManager("train", tmp_path, writer_factory=files_only) as manager:
        for step, xp in ((1, np), (2, jnp)):
            arrays = {"good": xp.arange(10.0), "bad": xp.array([np.nan, 1.0])}
            manager.write_histograms(step, arrays, num_buckets={"good": 5, "bad": 5})
    assert [(e.source, e.step) for e in manager.errors] == [("metric:bad", 1), ("metric:bad", 2)]
    lines = read_jsonl(str(tmp_path / "train"))
    assert [(x["step"], sum(x["good"]["counts"]), len(x["good"]["counts"])) for x in lines] == [
        (1, 10, 5),
        (2, 10, 5),
    ]
    assert all("bad" not in x for x in lines)


@pytest.mark.parametrize(
    "plain", [3.0, jnp.float32(3.0), clu.values.Scalar(3.0)], ids=["float", "jax", "Scalar"]
)
def test_a_collection_beside_a_plain_value_writes_its_fields(tmp_path, plain):
    """A plain value sent the dict through as_summary_metrics, which refused the Collection
    ("'timing': expected a number, ..., got _InlineCollection") that beside a metric was
    written as `timing/<field>`."""
    timing = clu_metrics.Collection.create(steps=clu_metrics.Average)
    collection = timing.single_from_model_output(values=jnp.array([2.0, 4.0]))
    with MetricsManager("t", tmp_path, writer_factory=writers.JsonlWriter) as manager:
        summary = manager.write_metrics_summary({"timing": collection, "x": plain}, 5, 1)
    assert {k: float(v.value) for k, v in summary.result().items()} == {
        "timing/steps": 3.0,
        "x": 3.0,
    }
    (line,) = read_jsonl(str(tmp_path / "t"))
    assert {k: v for k, v in line.items() if k not in ("time", "collection")} == {
        "step": 5,
        "timing/steps": 3.0,
        "x": 3.0,
    }
