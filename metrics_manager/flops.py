"""FLOPs per train step from XLA's cost analysis, and the throughput and MFU they give.

Host-side module; the step's FLOPs are read once, when the step is compiled:

  flops = step_flops(train_step, state, batch)          # global FLOPs of one call
  values = perf_values(flops, num_steps, duration_s, num_devices=jax.device_count())
  # {"perf/flops_per_step", "perf/tflops_per_second", "perf/tflops_per_second_per_device",
  #  "perf/mfu" (where a peak is known)}

`Compiled.cost_analysis()` reports the FLOPs of the per-device SPMD program (a matmul sharded 8
ways reports 1/8 of 2*M*N*K, plus any all-reduce additions), so `step_flops` multiplies by the
program's device count: hardware FLOPs, replicated work counted once per device. XLA counts a
loop (`lax.scan`, microbatching) as one trip of its body; pass hand-counted FLOPs for those.
On GPUs the compiled program hands matmuls and convolutions to cuBLAS and cuDNN, whose FLOPs
that analysis leaves out (it counted each such call as -1 on an H100): where the program has
such calls, the estimate is that of the program before optimization, the global step with
replicated work counted once; that program counts a `shard_map` or `pmap` body for one device,
so such a step on more than one device is refused: count it by hand.
"""

import math
import re
from collections.abc import Mapping
from numbers import Real
from typing import Any

import jax
import numpy as np

from writers._checks import Problems, describe

# Dense peak TFLOP/s per JAX device: (words in `device_kind`, bf16, fp16), None: no such
# unit; the first match wins ("TPU v5 lite" before "TPU v5"). From NVIDIA data sheets (sparse figures
# halved) and Google Cloud's TPU pages (v2 and v3: two JAX devices, so half a chip, each).
_PEAK_TFLOPS: tuple[tuple[str, float | None, float | None], ...] = (
    ("TPU v2", 22.5, None),
    ("TPU v3", 61.5, None),
    ("TPU v4 lite", 137.5, None),
    ("TPU v4", 275.0, None),
    ("TPU v5 lite", 197.0, None),
    ("TPU v5e", 197.0, None),
    ("TPU v5p", 459.0, None),
    ("TPU v5", 459.0, None),
    ("TPU v6 lite", 918.0, None),
    ("TPU v6e", 918.0, None),
    ("V100", None, 125.0),
    ("T4", None, 65.0),
    ("A10G", 70.0, 70.0),
    ("A100", 312.0, 312.0),
    ("A10", 125.0, 125.0),
    ("L40S", 362.0, 362.0),
    ("L40", 181.0, 181.0),
    ("L4", 121.0, 121.0),
    ("H100 PCIe", 756.0, 756.0),
    ("H100 NVL", 835.0, 835.0),
    ("H100", 989.0, 989.0),  # SXM5 (device kind e.g. "NVIDIA H100 80GB HBM3")
    ("GH200", 989.0, 989.0),
    ("H200 NVL", 835.0, 835.0),
    ("H200", 989.0, 989.0),
    ("GB200", 2500.0, 2500.0),  # Grace-Blackwell's B200 runs faster than HGX B200's
    ("B200", 2250.0, 2250.0),
)
_DTYPES = ("bf16", "fp16")
# Library calls whose FLOPs XLA's cost analysis of a compiled program leaves out.
_LIBRARY_CALL = re.compile(r'custom_call_target="((?:__cublas|__cudnn)[^"]*)"')
# A shard_map or pmap body in a program before optimization (Shardy's, then GSPMD's form).
_MANUAL = re.compile(r"sdy\.manual_computation|SPMDFullToShardShape")


def _jax_stage(stage: Any) -> Any:
    """JAX's Lowered or Compiled inside `nnx.jit`'s wrappers of them, else `stage` itself."""
    for attr in ("lowered", "compiled"):
        inner = getattr(stage, attr, None)
        if isinstance(inner, (jax.stages.Lowered, jax.stages.Compiled)):
            return inner
    return stage


def _flops(analysis: Any) -> float:
    if isinstance(analysis, (list, tuple)):  # one dict per program on some jax versions
        analysis = analysis[0] if len(analysis) == 1 else None
    flops = analysis.get("flops") if isinstance(analysis, Mapping) else None
    if flops is None and isinstance(analysis, Mapping) and "bytes accessed" in analysis:
        return 0.0  # analysed, and XLA leaves the entry out at 0 (a step that moves data)
    if flops is None:
        keys = sorted(analysis) if isinstance(analysis, Mapping) else analysis
        raise ValueError(
            f"step_flops: XLA's cost analysis on backend {jax.default_backend()!r} gave no "
            f"'flops' entry (got {keys!r}); this backend does not estimate FLOPs: count the "
            "step's FLOPs by hand and pass them to perf_values."
        )
    return float(flops)


def step_flops(fn_or_compiled: Any, *args: Any, **kwargs: Any) -> float:
    """FLOPs of one call of a jitted step, summed over the devices it runs on, as XLA estimates.

    Call it once, next to the first step: `jax.jit` caches the compilation.

    Args:
      fn_or_compiled: a function (jitted here), a jitted function (`jax.jit`, `nnx.jit`), a
        `jax.stages.Lowered` or a `jax.stages.Compiled`.
      *args: the step's arguments (arrays or `jax.ShapeDtypeStruct`s); none for a
        Lowered or Compiled.
      **kwargs: the step's keyword arguments.

    Raises:
      TypeError: `fn_or_compiled` is none of the above, or arguments came with a
        Lowered/Compiled object.
      ValueError: the backend's cost analysis has no "flops" entry; a Compiled alone that
        calls cuBLAS or cuDNN.

    Example:
      >>> import jax.numpy as jnp
      >>> step_flops(lambda a, b: a @ b, jnp.ones((8, 4)), jnp.ones((4, 2)))
      128.0
    """
    stage = _jax_stage(fn_or_compiled)
    if isinstance(stage, (jax.stages.Lowered, jax.stages.Compiled)):
        if args or kwargs:
            raise TypeError(
                f"step_flops: a {type(stage).__name__} is already specialized to its "
                f"arguments, but {len(args)} positional and {len(kwargs)} keyword arguments "
                "came too; pass the function and its arguments, or the Lowered/Compiled alone."
            )
    elif callable(stage):
        jitted = stage if hasattr(stage, "lower") else jax.jit(stage)
        stage = _jax_stage(jitted.lower(*args, **kwargs))
    else:
        raise TypeError(
            "step_flops expects a function, a jitted function, a jax.stages.Lowered or a "
            f"jax.stages.Compiled, got {type(stage).__name__}: {stage!r}."
        )
    lowered = stage if isinstance(stage, jax.stages.Lowered) else None
    compiled = stage if lowered is None else lowered.compile()
    flops = _flops(compiled.cost_analysis())
    shardings = jax.tree.leaves(  # the devices the SPMD program runs on
        [compiled.input_shardings, compiled.output_shardings],
        is_leaf=lambda x: isinstance(x, jax.sharding.Sharding),
    )
    devices = {d for s in shardings if isinstance(s, jax.sharding.Sharding) for d in s.device_set}
    if calls := sorted(set(_LIBRARY_CALL.findall(compiled.as_text() or ""))):
        if lowered is None:
            raise ValueError(
                f"step_flops: the compiled step calls {calls}, whose FLOPs XLA's estimate of "
                "a compiled program leaves out; pass the step function or its Lowered "
                "(jax.jit(step).lower(...)), estimated before optimization, or count by hand."
            )
        if len(devices) > 1 and _MANUAL.search(lowered.as_text()):
            raise ValueError(
                f"step_flops: the compiled step calls {calls}, whose FLOPs XLA's estimate of "
                "a compiled program leaves out, and has a shard_map or pmap body, which the "
                f"estimate before optimization counts for one of its {len(devices)} devices; "
                "count the step's FLOPs by hand and pass them to perf_values."
            )
        return _flops(lowered.cost_analysis())
    return flops * max(len(devices), 1)


def peak_flops_per_device(device: Any = None, *, dtype: str = "bf16") -> float | None:
    """Vendor peak FLOP/s of one JAX device for dense 16-bit matrix math, if known.

    Args:
      device: anything with a `device_kind` str; default `jax.devices()[0]`.
      dtype: "bf16" or "fp16".

    Returns:
      Peak FLOP/s, or None for CPUs, unknown chips and chips without a `dtype` unit.

    Raises:
      TypeError: `device` has no `device_kind` str (a name such as "H100" is no device).
      ValueError: `dtype` is not "bf16" or "fp16".

    Example:
      >>> import types
      >>> peak_flops_per_device(types.SimpleNamespace(device_kind="TPU v4"))
      275000000000000.0
    """
    if dtype not in _DTYPES:
        raise ValueError(f"peak_flops_per_device: dtype must be one of {_DTYPES}, got {dtype!r}.")
    device = jax.devices()[0] if device is None else device
    if not isinstance(kind := getattr(device, "device_kind", None), str):
        raise TypeError(
            f"peak_flops_per_device: device must be a JAX device (with a device_kind str), got "
            f"{describe(device)}; e.g. jax.devices()[0]"
        )
    kind = kind.lower()
    for name, bf16, fp16 in _PEAK_TFLOPS:
        # As a whole word: "RTX A1000" is no A100, "T400" no T4.
        if re.search(rf"(?<![a-z0-9]){re.escape(name.lower())}(?![a-z0-9])", kind):
            tflops = bf16 if dtype == "bf16" else fp16
            return None if tflops is None else tflops * 1e12
    return None


def perf_values(
    flops_per_step: float,
    num_steps: int,
    duration_s: float,
    *,
    num_devices: int,
    peak_flops_per_device: float | None = None,
) -> dict[str, float]:
    """Throughput of a summary window, and MFU where the devices' peak is known.

    Args:
      flops_per_step: FLOPs of one step summed over all devices (`step_flops`).
      num_steps: steps in the window.
      duration_s: the window's duration in seconds.
      num_devices: devices the step runs on (usually `jax.device_count()`).
      peak_flops_per_device: peak FLOP/s of one device; default `peak_flops_per_device()`.

    Returns:
      `perf/flops_per_step`, `perf/tflops_per_second` (all devices),
      `perf/tflops_per_second_per_device`, and `perf/mfu` (0..1) when a peak is known;
      above 1 where the peak, the FLOPs or `num_devices` is wrong (returned as computed).

    Raises:
      TypeError: a value is no number or not one (a str, a bool, an array); every problem,
        those out of range too, in one message.
      ValueError: every value out of range or not finite, in one message.

    Example:
      >>> values = perf_values(2e12, 10, 2.0, num_devices=4, peak_flops_per_device=5e12)
      >>> values["perf/tflops_per_second"], values["perf/mfu"]
      (10.0, 0.5)
    """
    peak = _lookup_peak() if peak_flops_per_device is None else peak_flops_per_device
    problems = Problems("perf_values")
    for arg, value, ok, expected in (  # each `ok` is also False for NaN
        ("flops_per_step", flops_per_step, lambda x: 0 <= x < math.inf, "finite, >= 0"),
        ("num_steps", num_steps, lambda x: x >= 0 and float(x).is_integer(), "a whole number >= 0"),
        ("duration_s", duration_s, lambda x: 0 < x < math.inf, "finite, > 0 seconds"),
        (
            "num_devices",
            num_devices,
            lambda x: x >= 1 and float(x).is_integer(),
            "a whole number >= 1",
        ),
        ("peak_flops_per_device", peak, lambda x: 0 < x < math.inf, "finite, > 0 FLOP/s or None"),
    ):
        if value is None and arg == "peak_flops_per_device":
            continue
        if isinstance(value, bool) or not isinstance(value, Real | np.ndarray | jax.Array):
            problems.type_problem(f"{arg} must be a number, got {describe(value)}")
        elif np.ndim(value) != 0:
            problems.type_problem(f"{arg} must be one number, got {describe(value)}")
        elif not ok(value):
            problems.value_problem(f"{arg} must be {expected}, got {value!r}")
    problems.raise_if_any()
    flops_per_second = float(flops_per_step) * float(num_steps) / float(duration_s)
    per_device = flops_per_second / float(num_devices)
    values = {
        "perf/flops_per_step": float(flops_per_step),
        "perf/tflops_per_second": flops_per_second / 1e12,
        "perf/tflops_per_second_per_device": per_device / 1e12,
    }
    if peak is not None:
        values["perf/mfu"] = per_device / float(peak)
    return values


_lookup_peak = peak_flops_per_device  # perf_values' argument of that name shadows it
