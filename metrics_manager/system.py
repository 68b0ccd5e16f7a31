"""System metrics (CPU, memory, temperatures, accelerators) sampled off the training thread.

A `SystemMonitor` samples every sensor the host has, in a daemon thread, every
`interval_s` seconds; the summary worker asks for the window's mean and max:

  monitor = SystemMonitor(interval_s=1.0)
  ...                                    # train steps; the monitor samples meanwhile
  values = monitor.window_values()       # {"system/process_cpu_percent": 87.5,
                                         #  "system/process_cpu_percent/max": 101.0, ...}
  writers.write_values(writer, step, values)
  monitor.close()

Keys and units (each also as `<key>/max`, the window's maximum):

  system/process_cpu_percent        this process, 100 = one core busy (0..100*cores)
  system/host_cpu_percent           whole host, 0..100 (all cores busy = 100)
  system/process_rss_mib            this process's resident memory, MiB
  system/host_memory_used_mib       host memory in use, MiB
  system/host_memory_available_mib  host memory available to new work, MiB
  system/host_memory_percent        host memory in use, 0..100
  system/cpu_temperature_c          hottest CPU sensor, degrees Celsius
  system/device{id}/memory_in_use_mib       per JAX device (`memory_stats()`), MiB
  system/device{id}/peak_memory_in_use_mib  the allocator's peak since start, MiB
  system/gpu{i}/utilization_percent  NVML: time the GPU was busy, 0..100
  system/gpu{i}/temperature_c        NVML: GPU temperature, degrees Celsius
  system/gpu{i}/power_w              NVML: power draw, watts

A sensor the host lacks (no temperature sensors, a CPU device whose
`memory_stats()` is None, no NVIDIA GPU or no `nvidia-ml-py`) gives no key and no
error. A sensor that worked and then raises is logged once at debug level and
dropped. `{i}` for GPUs is NVML's index (restricted to `CUDA_VISIBLE_DEVICES` when
that lists indices); `{id}` is `jax.Device.id`.

Host-side module: never import it from code traced by jit.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import psutil

_LOG = logging.getLogger(__name__)
_MIB = float(1 << 20)
# CPU percentages come from tick counters (10 ms in /proc): over a shorter span they
# would read 0 or several hundred percent, so a reading waits until this much has passed.
_MIN_RATE_SPAN_S = 0.1
# Sensor groups that report the CPU package (Intel, AMD, ARM boards), best first.
_CPU_SENSOR_GROUPS = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal", "acpitz")

SampleFn = Callable[[], Mapping[str, float]]
"""Takes one sample: quantity name (e.g. `system/process_rss_mib`) -> value."""


@dataclasses.dataclass
class _Sensor:
    name: str
    read: SampleFn


class _CpuPercent:
    """Busy percentage of this process and of the host since the previous reading."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._process = psutil.Process()
        self._clock = clock
        self._last = self._times()

    def _times(self) -> tuple[float, float, float, float]:
        process = self._process.cpu_times()
        host = psutil.cpu_times()
        # Like psutil.cpu_percent, but with our own baseline: psutil's module-level one is
        # shared with every other caller in the process. Linux counts guest time inside
        # user time too, so it is taken out once (as psutil does).
        host_total = sum(host) - getattr(host, "guest", 0.0) - getattr(host, "guest_nice", 0.0)
        host_idle = host.idle + getattr(host, "iowait", 0.0)
        return self._clock(), process.user + process.system, host_total, host_idle

    def __call__(self) -> dict[str, float]:
        now = self._times()
        span = now[0] - self._last[0]
        if span < _MIN_RATE_SPAN_S:
            return {}  # keep the old baseline: the next reading covers a longer span
        last, self._last = self._last, now
        values = {"system/process_cpu_percent": 100.0 * (now[1] - last[1]) / span}
        host_total = now[2] - last[2]
        if host_total > 0:
            busy = host_total - (now[3] - last[3])
            values["system/host_cpu_percent"] = min(max(100.0 * busy / host_total, 0.0), 100.0)
        return values


def _memory() -> Callable[[], dict[str, float]]:
    process = psutil.Process()

    def read() -> dict[str, float]:
        host = psutil.virtual_memory()
        return {
            "system/process_rss_mib": process.memory_info().rss / _MIB,
            "system/host_memory_used_mib": host.used / _MIB,
            "system/host_memory_available_mib": host.available / _MIB,
            "system/host_memory_percent": float(host.percent),
        }

    return read


def _cpu_temperature() -> dict[str, float]:
    groups = psutil.sensors_temperatures()
    for name in (*_CPU_SENSOR_GROUPS, *sorted(groups)):
        readings = [t.current for t in groups.get(name, ()) if t.current is not None]
        if readings:
            return {"system/cpu_temperature_c": float(max(readings))}
    return {}


def _device_memory(device: Any) -> dict[str, float]:
    stats = device.memory_stats()
    if not stats:  # None on CPU
        return {}
    values = {}
    for stat, key in (
        ("bytes_in_use", "memory_in_use_mib"),
        ("peak_bytes_in_use", "peak_memory_in_use_mib"),
    ):
        if stat in stats:
            values[f"system/device{device.id}/{key}"] = stats[stat] / _MIB
    return values


def _nvml_sensors() -> tuple[list[_Sensor], Any]:
    """Per-GPU sensors from NVML, and the `pynvml` module to shut down (None: no NVML)."""
    try:
        import pynvml  # noqa: PLC0415  (optional extra `[gpu]`: nvidia-ml-py)
    except ImportError:
        return [], None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001  (no driver, no GPU: NVML is absent, not an error)
        return [], None
    try:
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # noqa: BLE001
        pynvml.nvmlShutdown()
        return [], None
    indices: Iterable[int] = range(count)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    if all(item.strip().isdigit() for item in visible):
        indices = [int(item) for item in visible if int(item) < count]
    sensors = []
    for index in indices:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # noqa: BLE001  (a GPU NVML cannot open is absent)
            continue
        prefix = f"system/gpu{index}"

        def utilization(h: Any = handle, p: str = prefix) -> dict[str, float]:
            return {f"{p}/utilization_percent": float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)}

        def temperature(h: Any = handle, p: str = prefix) -> dict[str, float]:
            celsius = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            return {f"{p}/temperature_c": float(celsius)}

        def power(h: Any = handle, p: str = prefix) -> dict[str, float]:
            return {f"{p}/power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0}  # milliwatts

        for read in (utilization, temperature, power):
            sensors.append(_Sensor(f"nvml {read.__name__} of GPU {index}", read))
    return sensors, pynvml


def _default_sensors(devices: Iterable[Any] | None) -> tuple[list[_Sensor], Any]:
    """The host's sensors: CPU and memory always, the others where a first reading works."""
    optional: list[_Sensor] = []
    if hasattr(psutil, "sensors_temperatures"):  # Linux and FreeBSD only
        optional.append(_Sensor("cpu temperature", _cpu_temperature))
    if devices is None:
        import jax  # noqa: PLC0415  (only when device sensors are asked for)

        devices = jax.local_devices()
    for device in devices:
        read = functools.partial(_device_memory, device)
        optional.append(_Sensor(f"memory_stats of {device}", read))
    nvml_sensors, nvml = _nvml_sensors()
    present = [sensor for sensor in optional + nvml_sensors if _present(sensor)]
    return [_Sensor("cpu percent", _CpuPercent()), _Sensor("memory", _memory()), *present], nvml


def _present(sensor: _Sensor) -> bool:
    """Whether a first reading works and gives anything; absent sensors are dropped silently."""
    try:
        return bool(sensor.read())
    except Exception:  # noqa: BLE001  (an absent sensor is not an error)
        return False


class SystemMonitor:
    """Samples system metrics in a background thread; reports each window's mean and max.

    Each sample reads every present sensor (see the module docstring for keys and
    units); on CPU one sample costs about 0.1-0.2 ms of host time
    (`benchmarks/system_overhead.py`). `window_values` and `sample` may be called
    from any thread.

    Args:
      interval_s: seconds between background samples; None starts no thread
        (samples are then taken only by `sample()` and `window_values()`).
      devices: JAX devices whose `memory_stats()` to report; default
        `jax.local_devices()`; `()` for none.
      sample_fn: replaces every built-in sensor with this function (for tests
        and custom sensors); it returns name -> value for one sample.

    Raises:
      ValueError: `interval_s` is not positive.
      TypeError: `sample_fn` is not callable.

    Example:
      >>> samples = iter([{"system/x": 1.0}, {"system/x": 3.0}])
      >>> with SystemMonitor(None, sample_fn=lambda: next(samples)) as monitor:
      ...     monitor.sample()
      ...     monitor.window_values()
      {'system/x': 2.0, 'system/x/max': 3.0}
    """

    def __init__(
        self,
        interval_s: float | None = 1.0,
        *,
        devices: Iterable[Any] | None = None,
        sample_fn: SampleFn | None = None,
    ) -> None:
        if interval_s is not None and not interval_s > 0:
            raise ValueError(
                f"SystemMonitor: interval_s must be > 0 seconds (or None for no background "
                f"thread), got {interval_s!r}."
            )
        if sample_fn is not None and not callable(sample_fn):
            raise TypeError(
                "SystemMonitor: sample_fn must be a callable returning {name: value}, got "
                f"{type(sample_fn).__name__}: {sample_fn!r}."
            )
        self._nvml: Any = None
        if sample_fn is not None:
            sensors = [_Sensor("sample_fn", sample_fn)]
        else:
            sensors, self._nvml = _default_sensors(devices)
        self._sensors = sensors
        self._lock = threading.Lock()  # one sample at a time; guards the window too
        self._window: dict[str, list[float]] = {}  # key -> [count, sum, max]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if interval_s is not None:
            self._thread = threading.Thread(
                target=self._run, args=(interval_s,), name="SystemMonitor", daemon=True
            )
            self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.sample()

    def sample(self) -> None:
        """Takes one sample now and adds it to the current window."""
        with self._lock:
            self._sample_locked()

    def _sample_locked(self) -> None:
        for sensor in list(self._sensors):
            try:
                values = sensor.read()
            except Exception:  # noqa: BLE001  (a failing sensor must not stop the others)
                _LOG.debug(
                    "SystemMonitor: dropping sensor %r after an error", sensor.name, exc_info=True
                )
                self._sensors.remove(sensor)
                continue
            for key, value in values.items():
                value = float(value)
                stats = self._window.get(key)
                if stats is None:
                    self._window[key] = [1.0, value, value]
                else:
                    stats[0] += 1.0
                    stats[1] += value
                    stats[2] = max(stats[2], value)

    def window_values(self) -> dict[str, float]:
        """The mean and max of every quantity since the previous call; starts a new window.

        Takes one fresh sample first (unless closed), so a window shorter than
        `interval_s` still has data.

        Returns:
          `<key>` -> mean and `<key>/max` -> maximum, for every key sampled in the
          window, sorted by key.
        """
        with self._lock:
            if not self._stop.is_set():
                self._sample_locked()
            window, self._window = self._window, {}
        values = {}
        for key in sorted(window):
            count, total, maximum = window[key]
            values[key] = total / count
            values[f"{key}/max"] = maximum
        return values

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops the background thread (waiting at most `timeout_s`) and NVML. Idempotent.

        A sample still running after `timeout_s` (a hung driver) is left to its
        daemon thread, and NVML is then not shut down under it.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                _LOG.warning(
                    "SystemMonitor: a sample still runs after %.1f s; not waiting", timeout_s
                )
                return
        with self._lock:
            nvml, self._nvml = self._nvml, None
            if nvml is None:
                return
            self._sensors = [s for s in self._sensors if not s.name.startswith("nvml")]
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001  (shutting down a failed driver is harmless)
            _LOG.debug("SystemMonitor: nvmlShutdown failed", exc_info=True)

    def __enter__(self) -> SystemMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
