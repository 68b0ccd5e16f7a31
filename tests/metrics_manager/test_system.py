"""SystemMonitor: real host readings, window mean/max, absent sensors, NVML, files read back."""

from __future__ import annotations

import collections
import doctest
import json
import logging
import os
import sys
import threading
import time
import types

import jax
import numpy as np
import psutil
import pytest
from tensorboard.backend.event_processing import event_accumulator as ea

import metrics_manager as mm
import writers
from metrics_manager import system

MIB = 1 << 20
_Temp = collections.namedtuple("_Temp", "label current high critical")


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _scripted(samples):
    """A sample_fn returning `samples` in order, then nothing."""
    it = iter(samples)
    return lambda: next(it, {})


def test_docstring_examples_run():
    result = doctest.testmod(system)
    assert result.attempted >= 2
    assert result.failed == 0


def test_real_host_readings_are_in_range():
    with mm.SystemMonitor(None, devices=()) as monitor:
        _busy(0.2)  # CPU rates need >= 0.1 s between readings
        values = monitor.window_values()
        rss = psutil.Process().memory_info().rss / MIB
    cores = psutil.cpu_count()
    assert 0 < values["system/process_cpu_percent"] <= 100 * cores
    assert 0 <= values["system/host_cpu_percent"] <= 100
    assert values["system/process_rss_mib"] == pytest.approx(rss, rel=0.1)
    host = psutil.virtual_memory()  # read again: what other programs hold moves a little
    near = 0.02 * host.total / MIB  # 2% of the host's memory
    assert values["system/host_memory_percent"] == pytest.approx(host.percent, abs=2.0)
    assert values["system/host_memory_used_mib"] == pytest.approx(host.used / MIB, abs=near)
    assert values["system/host_memory_available_mib"] == pytest.approx(
        host.available / MIB, abs=near
    )
    for key in list(values):
        if not key.endswith("/max"):
            assert values[f"{key}/max"] >= values[key], key


def test_cpu_percent_waits_for_a_long_enough_span():
    now = [100.0]
    reader = system._CpuPercent(clock=lambda: now[0])
    now[0] += 0.05
    assert reader() == {}  # a 50 ms span: tick counters would give noise
    now[0] += 10.0
    _busy(0.03)  # let the host's tick counters advance
    values = reader()  # 10.05 s since the baseline: a few ms of CPU at most
    assert 0 <= values["system/process_cpu_percent"] < 100
    assert 0 <= values["system/host_cpu_percent"] <= 100


def test_window_mean_and_max_then_a_new_window():
    samples = [
        {"system/a": 1.0, "system/b": 10.0},
        {"system/a": 5.0},
        {"system/a": 3.0, "system/b": 20.0},  # taken by window_values itself
        {"system/a": 7.0},
    ]
    monitor = mm.SystemMonitor(None, sample_fn=_scripted(samples))
    monitor.sample()
    monitor.sample()
    assert monitor.window_values() == {
        "system/a": 3.0,
        "system/a/max": 5.0,
        "system/b": 15.0,
        "system/b/max": 20.0,
    }
    assert monitor.window_values() == {"system/a": 7.0, "system/a/max": 7.0}
    assert monitor.window_values() == {}
    monitor.close()


def test_rates_weigh_by_their_span_and_nan_is_the_max_in_any_order():
    # A short CPU reading at the window's end counted as much as a whole interval's: 1 s
    # idle then 0.15 s busy read 50%, not 13%.
    class Rate:
        weight = 1.0

        def __init__(self):
            self.readings = iter([(1.0, 0.0), (0.15, 100.0), (1.0, float("nan")), (1.0, 3.0)])

        def __call__(self):
            self.weight, value = next(self.readings)
            return {"system/cpu": value}

    monitor = mm.SystemMonitor(None, sample_fn=Rate())
    monitor.sample()
    values = monitor.window_values()
    assert values["system/cpu"] == pytest.approx(100.0 * 0.15 / 1.15)
    assert values["system/cpu/max"] == 100.0
    # Equal readings of unequal spans: the weighted mean rounded above the max (a 2-core host
    # busy at 50% read mean 49.999999999772633 over max 49.999999999772626).
    value, spans = 47.65969541523558, [1.2084258749645593, 1.8254144818711369, 1.0589050260530415]
    assert sum(value * w for w in spans) / sum(spans) > value
    monitor.close()
    rate = Rate()
    rate.readings = iter([(w, value) for w in spans])
    monitor = mm.SystemMonitor(None, sample_fn=rate)
    monitor.sample()
    monitor.sample()
    assert monitor.window_values() == {"system/cpu": value, "system/cpu/max": value}
    rate.readings = iter([(1.0, float("nan")), (1.0, 3.0)])
    monitor.sample()  # NaN, then 3.0: the max was 3.0, and NaN with the order reversed
    assert all(np.isnan(v) for v in monitor.window_values().values())
    monitor.close()
    now = [100.0]
    reader = system._CpuPercent(clock=lambda: now[0])
    now[0] += 2.5
    assert reader() and reader.weight == 2.5  # the built-in CPU sensor weighs by its span


def test_background_thread_samples_and_close_stops_it_quickly():
    calls = []
    three = threading.Event()

    def sample_fn():
        calls.append(time.monotonic())
        if len(calls) >= 3:
            three.set()
        return {"system/x": float(len(calls))}

    monitor = mm.SystemMonitor(0.01, sample_fn=sample_fn)
    assert three.wait(5.0), f"3 samples expected within 5 s, got {len(calls)}"
    start = time.perf_counter()
    monitor.close()
    assert time.perf_counter() - start < 1.0
    assert not monitor._thread.is_alive()
    after = len(calls)
    values = monitor.window_values()  # closed: no fresh sample
    assert len(calls) == after
    assert values["system/x/max"] == after
    assert values["system/x"] == pytest.approx((after + 1) / 2)  # mean of 1..after


def test_close_is_bounded_when_a_sample_hangs():
    release = threading.Event()
    entered = threading.Event()

    def stuck():
        entered.set()
        release.wait(10.0)
        return {}

    monitor = mm.SystemMonitor(0.01, sample_fn=stuck)
    assert entered.wait(5.0)
    start = time.perf_counter()
    monitor.close(timeout_s=0.2)
    assert time.perf_counter() - start < 1.0
    release.set()
    monitor._thread.join(5.0)


def test_close_refuses_a_timeout_that_is_no_number_and_keeps_running():
    # close("5") raised "'>' not supported between instances of 'int' and 'str'" from
    # Thread.join, after the thread had been told to stop.
    monitor = mm.SystemMonitor(0.01, sample_fn=lambda: {"system/x": 1.0})
    for timeout_s, error, match in [
        ("5", TypeError, r"SystemMonitor.close: timeout_s must be a number .* got str '5'"),
        (True, TypeError, r"timeout_s must be a number .* got bool True"),
        (float("nan"), ValueError, r"timeout_s must be >= 0, got nan"),
        (-1.0, ValueError, r"timeout_s must be >= 0, got -1\.0"),
    ]:
        with pytest.raises(error, match=match):
            monitor.close(timeout_s)
    assert monitor._thread.is_alive()
    monitor.close(5)
    assert not monitor._thread.is_alive()


def test_a_sensor_that_starts_failing_is_logged_once_and_dropped(caplog):
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) >= 2:
            raise OSError("sensor went away")
        return {"system/x": 4.0}

    caplog.set_level(logging.DEBUG, logger="metrics_manager.system")
    with mm.SystemMonitor(None, sample_fn=flaky) as monitor:
        monitor.sample()
        # The second sample fails: the sensor is dropped, the first sample stays.
        assert monitor.window_values() == {"system/x": 4.0, "system/x/max": 4.0}
        assert monitor.window_values() == {}
    assert len(calls) == 2
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["SystemMonitor: dropping sensor 'sample_fn' after an error"]


def test_a_sensor_giving_no_numbers_is_dropped_and_the_sampling_thread_lives_on():
    # float("x") raised outside the sensor's guard: it ended the sampling thread, and every
    # window_values() after it raised "could not convert string to float".
    samples = iter([{"system/x": 1.0}, {"system/x": "x"}])
    with mm.SystemMonitor(0.01, sample_fn=lambda: next(samples)) as monitor:
        time.sleep(0.1)
        assert monitor.window_values() == {"system/x": 1.0, "system/x/max": 1.0}
        assert monitor._thread.is_alive()


class _FakeDevice:
    def __init__(self, device_id, stats):
        self.id = device_id
        self._stats = stats

    def memory_stats(self):
        if isinstance(self._stats, Exception):
            raise self._stats
        return self._stats

    def __str__(self):
        return f"fake:{self.id}"


def test_device_memory_where_memory_stats_gives_a_dict(monkeypatch):
    monkeypatch.setattr(psutil, "sensors_temperatures", lambda: {}, raising=False)
    devices = [
        _FakeDevice(0, None),  # CPU: no statistics
        _FakeDevice(3, {"bytes_in_use": 3 * MIB, "peak_bytes_in_use": 8 * MIB}),
        _FakeDevice(5, RuntimeError("unimplemented")),
    ]
    with mm.SystemMonitor(None, devices=devices) as monitor:
        values = monitor.window_values()
    device_keys = sorted(k for k in values if k.startswith("system/device"))
    assert device_keys == [
        "system/device3/memory_in_use_mib",
        "system/device3/memory_in_use_mib/max",
        "system/device3/peak_memory_in_use_mib",
        "system/device3/peak_memory_in_use_mib/max",
    ]
    assert values["system/device3/memory_in_use_mib"] == 3.0
    assert values["system/device3/peak_memory_in_use_mib"] == 8.0


def test_jax_cpu_devices_have_no_memory_keys():
    with mm.SystemMonitor(None) as monitor:  # devices default to jax.local_devices()
        values = monitor.window_values()
    if jax.default_backend() == "cpu":
        assert not [k for k in values if k.startswith("system/device")]


def test_cpu_temperature_when_present_and_absent(monkeypatch):
    groups = {
        "acpitz": [_Temp("", 40.0, None, None)],
        "coretemp": [_Temp("Package", 55.0, 90, 100), _Temp("Core 0", 61.0, 90, 100)],
    }
    monkeypatch.setattr(psutil, "sensors_temperatures", lambda: groups, raising=False)
    with mm.SystemMonitor(None, devices=()) as monitor:
        values = monitor.window_values()
    assert values["system/cpu_temperature_c"] == 61.0  # coretemp preferred, hottest reading

    # No known CPU group: one named for a CPU (a Jetson's), never a drive's or a GPU's.
    for groups, expected in [
        (
            {"AO-therm": [_Temp("", 40.0, None, None)], "CPU-therm": [_Temp("", 50.0, 90, 100)]},
            50.0,
        ),
        ({"amdgpu": [_Temp("edge", 80.0, 90, 100)], "nvme": [_Temp("", 45.0, 80, 85)]}, None),
    ]:
        monkeypatch.setattr(psutil, "sensors_temperatures", lambda g=groups: g, raising=False)
        with mm.SystemMonitor(None, devices=()) as monitor:
            values = monitor.window_values()
        assert values.get("system/cpu_temperature_c") == expected, groups

    for absent in [lambda: {}, lambda: (_ for _ in ()).throw(OSError("no hwmon"))]:
        monkeypatch.setattr(psutil, "sensors_temperatures", absent, raising=False)
        with mm.SystemMonitor(None, devices=()) as monitor:
            values = monitor.window_values()
        assert "system/cpu_temperature_c" not in values
        assert "system/process_rss_mib" in values


def test_nvml_absent_or_failing_gives_no_gpu_keys(monkeypatch):
    # On a CPU machine nvidia-ml-py imports but nvmlInit fails (no driver library).
    with mm.SystemMonitor(None, devices=()) as monitor:
        values = monitor.window_values()
    if not _nvml_gpu_count():
        assert not [k for k in values if k.startswith("system/gpu")]
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    with mm.SystemMonitor(None, devices=()) as monitor:
        values = monitor.window_values()
    assert not [k for k in values if k.startswith("system/gpu")]


def _fake_nvml(calls):
    class NotSupported(Exception):
        pass

    def power(handle):
        if handle == 1:
            raise NotSupported("power readings not supported")
        return 312_500  # milliwatts

    return types.SimpleNamespace(
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=40 + h, memory=0),
        nvmlDeviceGetTemperature=lambda h, sensor: 60 + h,
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}aaaa-bbbb",
    )


def test_nvml_path_with_a_fake_library(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(calls))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with mm.SystemMonitor(None, devices=()) as monitor:
        values = monitor.window_values()
    gpu = {k: v for k, v in values.items() if k.startswith("system/gpu") and not k.endswith("/max")}
    assert gpu == {
        "system/gpu0/utilization_percent": 40.0,
        "system/gpu0/temperature_c": 60.0,
        "system/gpu0/power_w": 312.5,
        "system/gpu1/utilization_percent": 41.0,
        "system/gpu1/temperature_c": 61.0,  # gpu1 has no power reading: no key, no error
    }
    assert calls == ["init", "shutdown"]

    def gpus(visible):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        with mm.SystemMonitor(None, devices=()) as monitor:
            values = monitor.window_values()
        return sorted({k.split("/")[1] for k in values if k.startswith("system/gpu")})

    assert gpus("1") == ["gpu1"]
    # As CUDA reads it: "" and "-1" hide every GPU (all were reported), the list ends at the
    # first entry naming no GPU, and UUIDs or unique prefixes of them name GPUs.
    assert gpus("") == gpus("-1") == gpus("-1,0") == gpus("5") == []
    assert gpus("1,-1,0") == gpus("GPU-1aaaa-bbbb") == gpus("GPU-1,nope,0") == ["gpu1"]
    assert gpus(" 0 , GPU-1a") == ["gpu0", "gpu1"]


def _nvml_gpu_count() -> int:
    """NVIDIA GPUs on this machine, as NVML sees them whatever JAX_PLATFORMS says."""
    import pynvml  # noqa: PLC0415  (nvidia-ml-py is a declared test dependency)

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver library: no NVIDIA GPU
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def _jax_gpus() -> list[jax.Device]:
    try:
        return jax.devices("gpu")
    except RuntimeError:  # no GPU backend (the tests run JAX on the CPU unless told otherwise)
        return []


@pytest.mark.skipif(not _nvml_gpu_count(), reason="needs an NVIDIA GPU")
def test_real_gpu_keys():
    # NVML reads the GPU whichever backend JAX runs on, so `make test` checks this on any
    # machine with an NVIDIA GPU.
    with mm.SystemMonitor(None, devices=()) as monitor:
        values = monitor.window_values()
    # One set of keys per GPU that CUDA_VISIBLE_DEVICES leaves visible (all by default).
    gpus = {int(k.split("/")[1].removeprefix("gpu")) for k in values if k.startswith("system/gpu")}
    assert gpus and gpus <= set(range(_nvml_gpu_count()))
    for i in gpus:
        assert 0 <= values[f"system/gpu{i}/utilization_percent"] <= 100
        assert 0 < values[f"system/gpu{i}/temperature_c"] < 120
        assert values[f"system/gpu{i}/power_w"] > 0


@pytest.mark.skipif(not _jax_gpus(), reason="needs JAX on a GPU (JAX_PLATFORMS=cuda,cpu)")
def test_real_gpu_device_memory_keys():
    device = _jax_gpus()[0]
    held = jax.device_put(np.ones((256, 1024, 1024), np.float32), device)  # 1 GiB
    with mm.SystemMonitor(None, devices=[device]) as monitor:
        values = monitor.window_values()
    del held
    assert values[f"system/device{device.id}/memory_in_use_mib"] >= 1024
    assert values[f"system/device{device.id}/peak_memory_in_use_mib"] >= 1024


@pytest.mark.parametrize(
    "error",
    [
        psutil.AccessDenied(),
        # psutil.cpu_times() on Linux opens /proc/stat unwrapped: a sandbox's denial is this
        PermissionError(13, "Permission denied", "/proc/stat"),
    ],
)
def test_cpu_times_denied_leaves_the_other_sensors(monkeypatch, error):
    def denied(*args):
        raise error

    monkeypatch.setattr(psutil, "cpu_times", denied)  # as in a sandbox without /proc/stat
    with mm.SystemMonitor(None, devices=()) as monitor:
        values = monitor.window_values()
    assert "system/host_cpu_percent" not in values
    assert values["system/process_rss_mib"] > 0


def test_invalid_arguments():
    with pytest.raises(ValueError, match=r"interval_s must be positive and finite, got 0; None"):
        mm.SystemMonitor(0)
    with pytest.raises(ValueError, match=r"interval_s must be positive and finite, got inf"):
        mm.SystemMonitor(float("inf"))  # its thread died at its first wait
    with pytest.raises(TypeError, match=r"interval_s must be a number of seconds .* got '1'"):
        mm.SystemMonitor("1")  # a str from gin
    with pytest.raises(TypeError, match="sample_fn must be a callable .* got int: 3"):
        mm.SystemMonitor(None, sample_fn=3)
    # Past threading's wait limit the thread died at once; far below, it took most of a core.
    for interval in (1e10, 1e-6):
        with pytest.raises(
            ValueError, match=r"interval_s must lie in \[0.01, 86400\] seconds, got"
        ):
            mm.SystemMonitor(interval)
    # Bad devices were taken silently (each device's first reading failed and was dropped).
    for devices, got in (("cpu", "str 'cpu'"), (5, "int 5"), ([1, 2], "int 1, int 2")):
        with pytest.raises(TypeError, match=rf"devices must be .*, got {got}; e.g. devices=jax"):
            mm.SystemMonitor(None, devices=devices)


def test_values_read_back_from_jsonl_and_tensorboard(tmp_path):
    writer = writers.create_default_writer(tmp_path, console=False)
    written = {}
    with mm.SystemMonitor(0.05, devices=()) as monitor:
        for step in (1, 2):
            _busy(0.15)
            written[step] = monitor.window_values()
            writers.write_values(writer, step, written[step])
    writer.close()

    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        expected = written[line["step"]]
        assert {k: line[k] for k in expected} == pytest.approx(expected)
        assert 0 < line["system/process_cpu_percent"] <= 100 * psutil.cpu_count()

    acc = ea.EventAccumulator(str(tmp_path), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for key in (
        "system/process_cpu_percent",
        "system/process_rss_mib",
        "system/host_memory_percent",
    ):
        assert key in tags and f"{key}/max" in tags
        events = acc.Scalars(key)
        assert [e.step for e in events] == [1, 2]
        assert [e.value for e in events] == pytest.approx(
            [written[1][key], written[2][key]], rel=1e-6
        )
    assert os.path.exists(tmp_path / "metrics.jsonl")
