"""System metrics (CPU, memory, temperatures, accelerators) sampled off the training thread.

Host-side module. A `SystemMonitor` samples every sensor the host has in a daemon thread; the
summary worker asks for each window's mean and max:

  monitor = SystemMonitor(interval_s=1.0)
  values = monitor.window_values()  # {"system/process_cpu_percent": 87.5,
                                    #  "system/process_cpu_percent/max": 101.0, ...}
  monitor.close()

The keys and their units are listed in the README ("System metrics"), each also as
`<key>/max`. A sensor the host lacks gives no key and no error; one that fails later is
logged at debug level and dropped. `{i}` is NVML's index (as in `CUDA_VISIBLE_DEVICES`),
`{id}` `Device.id`.
"""

import functools
import logging
import math
import numbers
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import psutil

from writers._checks import check_positive, describe

_LOG = logging.getLogger(__name__)
_MIB = float(1 << 20)
# CPU percentages come from 10 ms tick counters: a shorter span would read 0 or several 100 %.
_MIN_RATE_SPAN_S = 0.1
# A sample costs ~0.1 ms: every 10 ms is 1% of a core. A day is far below the wait's limit.
_MIN_INTERVAL_S, _MAX_INTERVAL_S = 0.01, 86_400.0
# Sensor groups that report the CPU package (Intel, AMD, ARM boards), best first.
_CPU_SENSOR_GROUPS = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal", "acpitz")

SampleFn = Callable[[], Mapping[str, float]]  # one sample: key -> value


class _CpuPercent:
    """Busy percentage of this process and of the host since the previous reading."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._process = psutil.Process()
        self._clock = clock
        self._last = self._times()
        self.weight = 1.0  # the last reading's span: a window's mean weights readings by it

    def _times(self) -> tuple[float, float, float, float]:
        process = self._process.cpu_times()
        host = psutil.cpu_times()
        # psutil.cpu_percent with our own baseline (psutil's is shared process-wide); guest
        # time is inside user time on Linux, so it is taken out once, as psutil does.
        host_total = sum(host) - getattr(host, "guest", 0.0) - getattr(host, "guest_nice", 0.0)
        host_idle = host.idle + getattr(host, "iowait", 0.0)
        return self._clock(), process.user + process.system, host_total, host_idle

    def __call__(self) -> dict[str, float]:
        now = self._times()
        span = now[0] - self._last[0]
        if span < _MIN_RATE_SPAN_S:
            return {}  # keep the old baseline: the next reading covers a longer span
        last, self._last = self._last, now
        self.weight = span
        values = {"system/process_cpu_percent": 100.0 * (now[1] - last[1]) / span}
        host_total = now[2] - last[2]
        if host_total > 0:
            busy = host_total - (now[3] - last[3])
            values["system/host_cpu_percent"] = min(max(100.0 * busy / host_total, 0.0), 100.0)
        return values


def _memory(process: psutil.Process) -> dict[str, float]:
    host = psutil.virtual_memory()
    return {
        "system/process_rss_mib": process.memory_info().rss / _MIB,
        "system/host_memory_used_mib": host.used / _MIB,
        "system/host_memory_available_mib": host.available / _MIB,
        "system/host_memory_percent": float(host.percent),
    }


def _cpu_temperature() -> dict[str, float]:
    groups = psutil.sensors_temperatures()
    # Then any group named for a CPU (Jetson's "CPU-therm"), never another part's: a VM's
    # "nvme" drive or an "amdgpu" read as the CPU's temperature.
    for name in (*_CPU_SENSOR_GROUPS, *sorted(g for g in groups if "cpu" in g.lower())):
        readings = [t.current for t in groups.get(name, ()) if t.current is not None]
        if readings:
            return {"system/cpu_temperature_c": float(max(readings))}
    return {}


def _device_memory(device: Any) -> dict[str, float]:
    stats = device.memory_stats() or {}  # None on CPU
    keys = {"bytes_in_use": "memory_in_use_mib", "peak_bytes_in_use": "peak_memory_in_use_mib"}
    prefix = f"system/device{device.id}"
    return {f"{prefix}/{key}": stats[stat] / _MIB for stat, key in keys.items() if stat in stats}


def _nvml_sensors() -> tuple[dict[str, SampleFn], Any]:
    """Per-GPU sensors, and the `pynvml` module to shut down (None: no NVML)."""
    try:
        import pynvml  # noqa: PLC0415  (optional extra `[gpu]`: nvidia-ml-py)

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001  (not installed, no driver, no GPU: absent, not an error)
        return {}, None
    try:
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # noqa: BLE001
        pynvml.nvmlShutdown()
        return {}, None
    readers: dict[str, Callable[[Any], float]] = {
        "utilization_percent": lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
        "temperature_c": lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        "power_w": lambda h: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,  # NVML gives milliwatts
    }
    sensors: dict[str, SampleFn] = {}
    for index in _visible_indices(count, pynvml):
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # noqa: BLE001  (a GPU NVML cannot open is absent)
            continue
        for name, read in readers.items():

            def sample(key: str = f"system/gpu{index}/{name}", r: Any = read, h: Any = handle):
                return {key: float(r(h))}

            sensors[f"nvml {name} of GPU {index}"] = sample
    return sensors, pynvml


def _visible_indices(count: int, pynvml: Any) -> list[int]:
    """NVML indices of the GPUs `CUDA_VISIBLE_DEVICES` shows (all if unset), in its order. As
    CUDA does, the list ends at the first entry naming no GPU: "" and "-1" hide them all. GPU
    UUIDs (or unique prefixes) count; MIG instances have no NVML readings here."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return list(range(count))
    uuids: list[str] = []
    indices: list[int] = []
    for item in (item.strip() for item in value.split(",")):
        if item.isdigit() and int(item) < count:
            indices.append(int(item))
            continue
        if item.startswith("GPU-"):
            if not uuids:
                try:
                    uuids = [
                        _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
                        for i in range(count)
                    ]
                except Exception:  # noqa: BLE001  (no UUIDs: no GPU can be named by one)
                    break
            if len(found := [i for i, uuid in enumerate(uuids) if uuid.startswith(item)]) == 1:
                indices.append(found[0])
                continue
        break
    return indices


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value  # bytes in older pynvml


def _default_sensors(devices: Iterable[Any] | None) -> tuple[dict[str, SampleFn], Any]:
    """The host's sensors by name: memory always, the others where a first reading works."""
    devices = jax.local_devices() if devices is None else devices
    if isinstance(devices, str | jax.Device) or not isinstance(devices, Iterable):
        raise TypeError(
            f"SystemMonitor: devices must be a list of JAX devices or None, got "
            f"{describe(devices)}; e.g. devices=jax.local_devices()"
        )
    devices = list(devices)
    if wrong := [d for d in devices if not callable(getattr(d, "memory_stats", None))]:
        raise TypeError(
            f"SystemMonitor: devices must be JAX devices (with memory_stats()), got "
            f"{', '.join(map(describe, wrong))}; e.g. devices=jax.local_devices()"
        )
    optional: dict[str, SampleFn] = {
        f"memory_stats of {d}": functools.partial(_device_memory, d) for d in devices
    }
    if hasattr(psutil, "sensors_temperatures"):  # Linux and FreeBSD only
        optional["cpu temperature"] = _cpu_temperature
    nvml_sensors, nvml = _nvml_sensors()
    sensors: dict[str, SampleFn] = {"memory": functools.partial(_memory, psutil.Process())}
    try:  # a sandbox may deny /proc/stat (psutil raises PermissionError): the others report
        sensors["cpu percent"] = _CpuPercent()
    except (psutil.Error, OSError):
        _LOG.debug("SystemMonitor: no CPU times", exc_info=True)
    for name, read in (optional | nvml_sensors).items():
        try:
            if read():
                sensors[name] = read
        except Exception:  # noqa: BLE001  (an absent sensor is not an error)
            pass
    return sensors, nvml


class SystemMonitor:
    """Samples system metrics in a background thread; reports each window's mean and max.

    A sample costs about 0.1-0.2 ms of host time on CPU (`benchmarks/system_overhead.py`).
    `window_values` and `sample` may be called from any thread.

    Args:
      interval_s: seconds between background samples; None starts no thread.
      devices: JAX devices whose `memory_stats()` to report; default `jax.local_devices()`.
      sample_fn: replaces every built-in sensor (tests, custom sensors): () -> {key: value}.

    Raises:
      ValueError: `interval_s` is not in [0.01, 86400] seconds.
      TypeError: `sample_fn` is not callable, or `devices` are not JAX devices.

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
        if interval_s is not None:
            interval_s = check_positive(
                interval_s,
                "SystemMonitor",
                "interval_s",
                "seconds such as 1.0",
                "None starts no thread",
            )
            if not _MIN_INTERVAL_S <= interval_s <= _MAX_INTERVAL_S:
                # Below: the thread takes a large share of a core; above: its wait overflows.
                raise ValueError(
                    f"SystemMonitor: interval_s must lie in [{_MIN_INTERVAL_S}, "
                    f"{_MAX_INTERVAL_S:.0f}] seconds, got {interval_s}; None starts no thread"
                )
        if sample_fn is not None and not callable(sample_fn):
            raise TypeError(
                "SystemMonitor: sample_fn must be a callable returning {name: value}, got "
                f"{type(sample_fn).__name__}: {sample_fn!r}."
            )
        self._nvml: Any = None
        if sample_fn is not None:
            self._sensors = {"sample_fn": sample_fn}
        else:
            self._sensors, self._nvml = _default_sensors(devices)
        self._lock = threading.Lock()  # one sample at a time; guards the window too
        self._window: dict[str, tuple[float, float, float]] = {}  # key -> (count, sum, max)
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
            for name, read in list(self._sensors.items()):
                try:  # a sensor that fails or gives no numbers must not stop the others
                    values = {str(key): float(value) for key, value in read().items()}
                except Exception:  # noqa: BLE001
                    _LOG.debug(
                        "SystemMonitor: dropping sensor %r after an error", name, exc_info=True
                    )
                    del self._sensors[name]
                    continue
                # A rate over a span (CPU %) weighs as long as its span: a short reading at
                # the window's end counted as much as a whole interval's.
                weight = float(getattr(read, "weight", 1.0))
                for key, value in values.items():
                    count, total, top = self._window.get(key, (0.0, 0.0, value))
                    top = value if math.isnan(value) else max(top, value)  # NaN in any order
                    self._window[key] = (count + weight, total + value * weight, top)

    def window_values(self) -> dict[str, float]:
        """`<key>` -> mean and `<key>/max` -> max since the previous call (after a fresh sample
        unless closed, so a short window has data), sorted by key."""
        if not self._stop.is_set():
            self.sample()
        with self._lock:
            window, self._window = self._window, {}
        values = {}
        for key, (count, total, maximum) in sorted(window.items()):
            mean = total / count  # weighted: equal readings may round above their max
            values[key] = maximum if mean > maximum else mean
            values[f"{key}/max"] = maximum
        return values

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops the thread (waiting up to `timeout_s`), and NVML if no sample hangs. Idempotent."""
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real):
            raise TypeError(
                f"SystemMonitor.close: timeout_s must be a number of seconds such as 5.0, got "
                f"{describe(timeout_s)}."
            )
        if not timeout_s >= 0:
            raise ValueError(f"SystemMonitor.close: timeout_s must be >= 0, got {timeout_s!r}.")
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                _LOG.warning("SystemMonitor: a sample runs past %.1f s; not waiting", timeout_s)
                return
        with self._lock:
            nvml, self._nvml = self._nvml, None
            if nvml is None:
                return
            self._sensors = {n: r for n, r in self._sensors.items() if not n.startswith("nvml")}
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001  (shutting down a failed driver is harmless)
            _LOG.debug("SystemMonitor: nvmlShutdown failed", exc_info=True)

    def __enter__(self) -> "SystemMonitor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
