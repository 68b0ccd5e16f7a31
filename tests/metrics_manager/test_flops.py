"""FLOPs from XLA's cost analysis, the peak table, and throughput/MFU by hand."""

from __future__ import annotations

import doctest
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import metrics_manager as mm
from metrics_manager import flops

M, K, N = 256, 128, 64
MATMUL_FLOPS = 2 * M * N * K


def _matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    return a @ b


def _operands() -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    return jax.ShapeDtypeStruct((M, K), jnp.float32), jax.ShapeDtypeStruct((K, N), jnp.float32)


def test_docstring_examples_run():
    result = doctest.testmod(flops)
    assert result.attempted >= 6
    assert result.failed == 0


def test_matmul_flops_are_2mnk_for_every_kind_of_step():
    a, b = _operands()
    jitted = jax.jit(_matmul)
    lowered = jitted.lower(a, b)
    for step, args in [
        (_matmul, (a, b)),
        (jitted, (a, b)),
        (lowered, ()),
        (lowered.compile(), ()),
    ]:
        assert mm.step_flops(step, *args) == pytest.approx(MATMUL_FLOPS, rel=0.01), step


def test_an_nnx_jit_step_and_its_stages():
    from flax import nnx  # noqa: PLC0415

    model = nnx.Linear(K, N, use_bias=False, rngs=nnx.Rngs(0))
    step = nnx.jit(lambda model, x: model(x))
    x = jnp.ones((M, K))
    lowered = step.lower(model, x)  # nnx.jit's own Lowered and Compiled, wrapping JAX's
    for stage, args in [(step, (model, x)), (lowered, ()), (lowered.compile(), ())]:
        assert mm.step_flops(stage, *args) == pytest.approx(MATMUL_FLOPS, rel=0.01), stage


def _cublas_hlo(self: jax.stages.Compiled) -> str:
    return 'ENTRY %main { %gemm = custom-call(%a, %b), custom_call_target="__cublas$gemm" }'


def test_library_calls_are_counted_before_optimization(monkeypatch):
    # On a GPU XLA's compiled estimate leaves cuBLAS/cuDNN calls out (-1 each on an H100):
    # the step's unoptimized program still has its dots. The GPU test below runs the real one.
    lowered = jax.jit(_matmul).lower(*_operands())
    compiled = lowered.compile()
    monkeypatch.setattr(jax.stages.Compiled, "cost_analysis", lambda self: {"flops": 3.0})
    monkeypatch.setattr(jax.stages.Compiled, "as_text", _cublas_hlo)
    assert mm.step_flops(lowered) == pytest.approx(MATMUL_FLOPS, rel=0.01)
    with pytest.raises(ValueError, match=r"calls \['__cublas\$gemm'\].*pass the step function"):
        mm.step_flops(compiled)


def test_library_calls_in_a_shard_map_or_pmap_on_8_devices_are_refused(monkeypatch):
    # The program before optimization counts a shard_map or pmap body for one device: a
    # shard_map of (64, 32) x (32, 16) read 8189 FLOPs, not 65536, and a pmap of (8, 64, 32)
    # x (8, 32, 16) 65533, not 524288 (MFU 8 times too low).
    monkeypatch.setattr(jax.stages.Compiled, "as_text", _cublas_hlo)
    mesh = jax.make_mesh((8,), ("d",), devices=jax.devices()[:8])
    a = jax.device_put(jnp.ones((64, 32)), NamedSharding(mesh, P("d")))
    b = jax.device_put(jnp.ones((32, 16)), NamedSharding(mesh, P()))
    shard_mapped = jax.shard_map(_matmul, mesh=mesh, in_specs=(P("d"), P()), out_specs=P("d"))
    pmapped = jax.pmap(_matmul, devices=jax.devices()[:8])
    for step, args in [
        (shard_mapped, (a, b)),
        (pmapped, (jnp.ones((8, 64, 32)), jnp.ones((8, 32, 16)))),
    ]:
        with pytest.raises(ValueError, match=r"shard_map or pmap body.*one of its 8 devices"):
            mm.step_flops(step, *args)
    # Without a library call the compiled count is per device: 8 times it is the whole step.
    monkeypatch.undo()
    assert mm.step_flops(shard_mapped, a, b) == pytest.approx(2 * 64 * 32 * 16, rel=0.01)
    # On one device the body's count is the step's.
    monkeypatch.setattr(jax.stages.Compiled, "as_text", _cublas_hlo)
    one = jax.make_mesh((1,), ("d",), devices=jax.devices()[:1])
    step = jax.shard_map(_matmul, mesh=one, in_specs=(P("d"), P()), out_specs=P("d"))
    x = jax.device_put(jnp.ones((64, 32)), NamedSharding(one, P("d")))
    y = jax.device_put(jnp.ones((32, 16)), NamedSharding(one, P()))
    assert mm.step_flops(step, x, y) == pytest.approx(2 * 64 * 32 * 16, rel=0.01)


@pytest.mark.skipif(
    not any(d.platform == "gpu" for d in jax.devices()), reason="needs JAX on a GPU"
)
def test_a_matmul_on_a_real_gpu_counts_2mnk():
    a, b = (jnp.ones(s.shape, jnp.bfloat16) for s in _operands())
    assert mm.step_flops(_matmul, a, b) == pytest.approx(MATMUL_FLOPS, rel=0.01)


def test_keyword_arguments_reach_the_step():
    def step(a, *, b):
        return a @ b

    a, b = _operands()
    assert mm.step_flops(step, a, b=b) == pytest.approx(MATMUL_FLOPS, rel=0.01)


def test_sharded_matmul_reports_global_flops_over_8_devices():
    mesh = jax.make_mesh((8,), ("d",), devices=jax.devices()[:8])
    rows = NamedSharding(mesh, P("d", None))
    a = jax.device_put(jnp.ones((M, K)), rows)
    b = jax.device_put(jnp.ones((K, N)), NamedSharding(mesh, P()))
    compiled = jax.jit(_matmul).lower(a, b).compile()
    # XLA's own figure is for the per-device program: one eighth of the rows.
    assert compiled.cost_analysis()["flops"] == pytest.approx(MATMUL_FLOPS / 8, rel=0.01)
    # step_flops multiplies by the program's devices: the whole step.
    assert mm.step_flops(compiled) == pytest.approx(MATMUL_FLOPS, rel=0.01)


def test_contracting_dimension_sharding_adds_the_all_reduce():
    mesh = jax.make_mesh((8,), ("d",), devices=jax.devices()[:8])
    step = jax.jit(
        _matmul,
        in_shardings=(NamedSharding(mesh, P(None, "d")), NamedSharding(mesh, P("d", None))),
        out_shardings=NamedSharding(mesh, P()),
    )
    # Each device multiplies [M, K/8] x [K/8, N], then the all-reduce adds M*N partial sums.
    expected = 8 * (MATMUL_FLOPS / 8 + M * N)
    assert mm.step_flops(step, *_operands()) == pytest.approx(expected, rel=0.01)


def test_cost_analysis_as_a_list_of_one_dict(monkeypatch):
    compiled = jax.jit(_matmul).lower(*_operands()).compile()
    monkeypatch.setattr(jax.stages.Compiled, "cost_analysis", lambda self: [{"flops": 5.0}])
    assert mm.step_flops(compiled) == 5.0


def test_no_flops_entry_names_the_keys_and_the_fix(monkeypatch):
    compiled = jax.jit(_matmul).lower(*_operands()).compile()
    monkeypatch.setattr(jax.stages.Compiled, "cost_analysis", lambda self: {"optimal_seconds": 1.0})
    with pytest.raises(
        ValueError, match=r"no 'flops' entry \(got \['optimal_seconds'\]\).*perf_values"
    ):
        mm.step_flops(compiled)


def test_a_step_that_only_moves_data_has_0_flops():
    # XLA leaves the 'flops' entry out when the count is 0: "this backend does not
    # estimate FLOPs" was raised for a transpose.
    assert mm.step_flops(lambda x: x.T.reshape(-1), jnp.ones((4, 4))) == 0.0
    assert mm.step_flops(lambda x: x, jnp.ones((4, 4))) == 0.0
    assert mm.step_flops(lambda x: x + 1, jnp.ones((4, 4))) == 16.0


def test_wrong_arguments_are_type_errors():
    lowered = jax.jit(_matmul).lower(*_operands())
    with pytest.raises(TypeError, match="Lowered is already specialized.*2 positional"):
        mm.step_flops(lowered, *_operands())
    with pytest.raises(TypeError, match="expects a function.*got int"):
        mm.step_flops(3)


@pytest.mark.parametrize(
    ("kind", "bf16", "fp16"),
    [
        ("TPU v4", 275e12, None),
        ("TPU v5 lite", 197e12, None),
        ("TPU v5", 459e12, None),
        ("TPU v6 lite", 918e12, None),
        ("NVIDIA A100-SXM4-80GB", 312e12, 312e12),
        ("NVIDIA H100 80GB HBM3", 989e12, 989e12),
        ("NVIDIA H100 PCIe", 756e12, 756e12),
        ("NVIDIA H200", 989e12, 989e12),
        ("NVIDIA GH200 480GB", 989e12, 989e12),
        ("NVIDIA B200", 2250e12, 2250e12),
        ("NVIDIA GB200", 2500e12, 2500e12),
        ("NVIDIA L4", 121e12, 121e12),
        ("NVIDIA L40S", 362e12, 362e12),
        ("Tesla V100-SXM2-16GB", None, 125e12),
        ("cpu", None, None),
        ("Some Future Chip", None, None),
        # Whole words only: a substring gave the A100's peak and the T4's.
        ("NVIDIA RTX A1000 6GB Laptop GPU", None, None),
        ("NVIDIA T400", None, None),
        ("NVIDIA A10G", 70e12, 70e12),
        ("NVIDIA A10", 125e12, 125e12),
    ],
)
def test_peak_table(kind, bf16, fp16):
    device = types.SimpleNamespace(device_kind=kind)
    assert mm.peak_flops_per_device(device) == bf16
    assert mm.peak_flops_per_device(device, dtype="fp16") == fp16


def test_peak_of_the_cpu_test_device_is_unknown_and_dtype_is_checked():
    assert mm.peak_flops_per_device() is None
    with pytest.raises(ValueError, match=r"dtype must be one of \('bf16', 'fp16'\), got 'fp32'"):
        mm.peak_flops_per_device(dtype="fp32")
    # A kind's name is no device: it read as an unknown chip, and perf/mfu was left out.
    for device in ["NVIDIA H100 80GB HBM3", 3]:
        with pytest.raises(TypeError, match=r"device must be a JAX device .* e\.g\. jax\.devices"):
            mm.peak_flops_per_device(device)


def test_perf_values_by_hand():
    # 3e12 FLOPs per step, 50 steps in 4 s on 8 devices of 100 TFLOP/s peak.
    values = mm.perf_values(3e12, 50, 4.0, num_devices=8, peak_flops_per_device=100e12)
    assert values == pytest.approx(
        {
            "perf/flops_per_step": 3e12,
            "perf/tflops_per_second": 37.5,  # 3e12 * 50 / 4 / 1e12
            "perf/tflops_per_second_per_device": 37.5 / 8,
            "perf/mfu": 37.5 / 8 / 100,
        }
    )


def test_perf_values_on_cpu_leave_mfu_out():
    values = mm.perf_values(MATMUL_FLOPS, 10, 0.5, num_devices=1)
    assert values == pytest.approx(
        {
            "perf/flops_per_step": MATMUL_FLOPS,
            "perf/tflops_per_second": MATMUL_FLOPS * 20 / 1e12,
            "perf/tflops_per_second_per_device": MATMUL_FLOPS * 20 / 1e12,
        }
    )


def test_perf_values_lists_every_problem():
    with pytest.raises(ValueError) as info:
        mm.perf_values(float("nan"), -1, 0.0, num_devices=0, peak_flops_per_device=-5.0)
    message = str(info.value)
    for part in [
        "flops_per_step must be finite, >= 0, got nan",
        "num_steps must be a whole number >= 0, got -1",
        "duration_s must be finite, > 0 seconds, got 0.0",
        "num_devices must be a whole number >= 1, got 0",
        "peak_flops_per_device must be finite, > 0 FLOP/s or None, got -5.0",
    ]:
        assert part in message
    with pytest.raises(ValueError, match="flops_per_step must be finite, >= 0, got inf"):
        mm.perf_values(float("inf"), 1, 1.0, num_devices=1)
    with pytest.raises(ValueError, match="duration_s must be finite, > 0 seconds, got inf"):
        mm.perf_values(1e12, 10, float("inf"), num_devices=1)  # read 0 TFLOP/s
    with pytest.raises(ValueError) as info:  # counts: a fraction is a mistake, e.g. a mean
        mm.perf_values(1e12, 2.5, 1.0, num_devices=1.5)
    assert "2 problems" in str(info.value)
    assert "num_steps must be a whole number >= 0, got 2.5" in str(info.value)
    assert "num_devices must be a whole number >= 1, got 1.5" in str(info.value)
    assert mm.perf_values(1e12, 2.0, 1.0, num_devices=1)["perf/tflops_per_second"] == 2.0


def test_perf_values_refuses_what_is_no_number_and_takes_numpy_and_jax_scalars():
    with pytest.raises(TypeError) as info:  # strings from a config, None, a vector, a bool
        mm.perf_values("3e12", None, np.ones(2), num_devices=True, peak_flops_per_device="1e14")
    message = str(info.value)
    for part in [
        "5 problems",
        "flops_per_step must be a number, got str '3e12'",
        "num_steps must be a number, got NoneType None",
        "duration_s must be one number, got ndarray of shape (2,) and dtype float64",
        "num_devices must be a number, got bool True",
        "peak_flops_per_device must be a number, got str '1e14'",
    ]:
        assert part in message
    values = mm.perf_values(
        np.float64(3e12),
        np.int64(50),
        jnp.asarray(4.0),
        num_devices=np.int32(8),
        peak_flops_per_device=jnp.asarray(100e12),
    )
    assert all(type(v) is float for v in values.values())  # no device array in a summary
    assert values == pytest.approx(
        {
            "perf/flops_per_step": 3e12,
            "perf/tflops_per_second": 37.5,
            "perf/tflops_per_second_per_device": 37.5 / 8,
            "perf/mfu": 37.5 / 8 / 100,
        },
        rel=1e-6,
    )
