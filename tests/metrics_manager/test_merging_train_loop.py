"""The documented train step: merging inside the compiled step, with donation.

Shows that a loop of N steps does N dispatches and no device-to-host transfer, that a window
starts from `running=None` with one extra compiled variant, and that the same step over a
Mesh of 8 fake CPU devices (batch sharded on a data axis) reports what one device reports;
each with the running metrics packed (the default inside jit) and as a dict (`pack=False`).
"""

import functools

import clu.metrics as clu_metrics
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import array as jax_array
from jax._src import pjit
from jax._src.interpreters import pxla
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from metrics_manager import merging
from metrics_manager import metrics as mm
from metrics_manager.merging import accumulate_grads_microbatched, merge_metrics
from metrics_manager.packing import PackedMetrics

ROWS, FEATURES, NUM_MICROBATCHES = 32, 4, 2


def loss_fn(params, batch):
    per_example = jnp.square(batch["x"] @ params["w"] + params["b"] - batch["y"])
    mask = batch["mask"]
    return jnp.where(mask, per_example, 0.0).sum(), {
        "loss": mm.AveragePerStep.from_model_output(per_example, mask=mask),
        "loss_sum": mm.Sum.from_model_output(per_example, mask=mask),
        "neg_loss_max": mm.Max.from_model_output(-per_example - 1.0, mask=mask),
        "loss_min": mm.Min.from_model_output(per_example, mask=mask),
        "loss_stats": mm.MeanStd.from_model_output(per_example, mask=mask),
        "loss_avg": clu_metrics.Average.from_model_output(per_example, mask=mask),
        "lr": clu_metrics.LastValue(value=jnp.float32(0.1)),
        "timing/seqs_per_second": mm.TimeRate.from_model_output(mask.sum()),
        "timing/steps_per_second": mm.StepsPerTime.from_model_output(),
        "timing/seconds": mm.Time.from_model_output(),
    }


@functools.partial(jax.jit, donate_argnums=(0, 1))
def train_step(params, running, batch):
    grads, metrics = accumulate_grads_microbatched(loss_fn, params, batch, NUM_MICROBATCHES)
    params = jax.tree.map(lambda p, g: p - 0.001 * g, params, grads)
    return params, merge_metrics(running, metrics, pack=False)


@functools.partial(jax.jit, donate_argnums=(0, 1))
def train_step_packed(params, running, batch):
    grads, metrics = accumulate_grads_microbatched(loss_fn, params, batch, NUM_MICROBATCHES)
    params = jax.tree.map(lambda p, g: p - 0.001 * g, params, grads)
    return params, merge_metrics(running, metrics)  # packed by default inside jit


STEPS = pytest.mark.parametrize(
    "train_step", [train_step, train_step_packed], ids=["dict", "packed"]
)


def make_params():
    return {"w": jnp.zeros(FEATURES), "b": jnp.zeros(())}


def make_batches(count):
    rng = np.random.default_rng(0)
    w_true = rng.standard_normal(FEATURES).astype(np.float32)
    batches = []
    for _ in range(count):
        x = rng.standard_normal((ROWS, FEATURES)).astype(np.float32)
        y = x @ w_true + 0.1 * rng.standard_normal(ROWS).astype(np.float32)
        batches.append({"x": x, "y": y, "mask": np.arange(ROWS) % 7 != 6})
    return batches


def summary(running, num_steps, seconds=2.0):
    """What the summary path computes on the host."""
    if isinstance(running, PackedMetrics):
        host = running.unpack_host(jax.device_get(running.buffers))
    else:
        host = jax.device_get(running)
    host = mm.set_step_metrics_num_steps(mm.set_time_metrics_duration(host, seconds), num_steps)
    return {k: float(v.value) for k, v in mm.compute_metric_values(host).items()}


@pytest.fixture
def dispatch_counter(monkeypatch):
    """Counts executions of compiled XLA programs (every jit call and eager op).

    JAX's C++ fast path runs cached executables without returning to Python; with no fast
    path data every call goes through `pxla.ExecuteReplicated.__call__`, which is counted.
    """
    calls = []
    original = pxla.ExecuteReplicated.__call__

    def counting_call(self, *args):
        calls.append(self.name)
        return original(self, *args)

    monkeypatch.setattr(pjit, "_get_fastpath_data", lambda *args, **kwargs: None)
    monkeypatch.setattr(pxla.ExecuteReplicated, "__call__", counting_call)
    jax.clear_caches()
    yield calls
    monkeypatch.undo()
    jax.clear_caches()  # drop entries cached without fast path data


@pytest.fixture
def host_copies(monkeypatch):
    """Records every device-to-host copy of a `jax.Array` made through Python.

    `jax.transfer_guard("disallow")` catches host-to-device transfers everywhere but
    device-to-host ones only on accelerators (CPU arrays are host memory already), so the
    test also watches the two doors a host copy goes through: `Array._value` (np.asarray,
    float(), printing, device_get) and `copy_to_host_async`.
    """
    copies = []
    value = jax_array.ArrayImpl._value
    copy_async = jax_array.ArrayImpl.copy_to_host_async

    def counting_value(self):
        copies.append(("_value", self.shape))
        return value.fget(self)

    def counting_copy_async(self):
        copies.append(("copy_to_host_async", self.shape))
        return copy_async(self)

    monkeypatch.setattr(jax_array.ArrayImpl, "_value", property(counting_value))
    monkeypatch.setattr(jax_array.ArrayImpl, "copy_to_host_async", counting_copy_async)
    return copies


@STEPS
def test_loop_does_one_dispatch_per_step_and_no_device_to_host_transfer(
    train_step, dispatch_counter, host_copies
):
    steps = 5
    batches = [jax.device_put(b) for b in make_batches(2 * steps)]
    params = jax.device_put(make_params())
    running = None
    for batch in batches[:steps]:  # warm-up window: compiles both variants
        params, running = train_step(params, running, batch)
    expected = summary(running, steps)

    dispatch_counter.clear()
    host_copies.clear()
    running = None
    with jax.transfer_guard("disallow"):
        for batch in batches[steps:]:
            params, running = train_step(params, running, batch)
    assert dispatch_counter == [f"jit({train_step.__name__})"] * steps
    assert host_copies == []
    leaf = running.buffers[0] if isinstance(running, PackedMetrics) else running["loss_sum"].total
    jax.device_get(leaf)  # the watch does see a host copy when there is one
    assert host_copies and {shape for _, shape in host_copies} == {leaf.shape}
    assert train_step._cache_size() == 2  # running=None and running=dict (or packed)

    got = summary(running, steps)
    assert set(got) == set(expected)
    assert got["timing/steps_per_second"] == steps / 2.0
    assert got["lr"] == pytest.approx(0.1)
    assert got["neg_loss_max"] < -1.0
    np.testing.assert_allclose(got["loss"], got["loss_sum"] / steps, rtol=1e-6)
    np.testing.assert_allclose(got["loss_avg"], got["loss_stats"], rtol=1e-5)


def test_the_dispatch_counter_sees_host_side_merging(dispatch_counter):
    # The T5X way: the step returns its metrics, the host merges them. Same values, more
    # dispatches: this is what the test above rules out.
    step_metrics = jax.jit(lambda p, b: accumulate_grads_microbatched(loss_fn, p, b, 2)[1])
    batches = [jax.device_put(b) for b in make_batches(3)]
    params = jax.device_put(make_params())
    running = None
    for batch in batches:
        running = merge_metrics(running, step_metrics(params, batch))
    dispatch_counter.clear()
    running = None
    for batch in batches:
        running = merge_metrics(running, step_metrics(params, batch))
    assert dispatch_counter.count("jit(<lambda>)") == 3
    assert len(dispatch_counter) > 3 * 5  # each eager merge is at least one more dispatch


def test_validation_runs_at_trace_time_only(monkeypatch):
    checks = []
    original = merging._check_alike
    monkeypatch.setattr(merging, "_check_alike", lambda *a: checks.append(1) or original(*a))

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, running, batch):  # a fresh function, so the first calls trace
        grads, metrics = accumulate_grads_microbatched(loss_fn, params, batch, NUM_MICROBATCHES)
        return params, merge_metrics(running, metrics)

    batches = make_batches(6)
    params, running = make_params(), None
    for batch in batches[:2]:
        params, running = step(params, running, batch)
    traced = len(checks)
    assert traced >= 1  # the dict variant's trace checked a against b
    for batch in batches[2:]:
        params, running = step(params, running, batch)
    assert len(checks) == traced


def test_each_window_starts_from_none_and_restarts_counts():
    batches = make_batches(4)
    params, running = make_params(), None
    windows = []
    for i, batch in enumerate(batches):
        params, running = train_step(params, running, batch)
        if i % 2 == 1:
            windows.append(jax.device_get(running))
            running = None
    assert [int(w["loss"].steps) for w in windows] == [2, 2]
    assert [int(w["loss_stats"].count) for w in windows] == [2 * 28, 2 * 28]


@STEPS
def test_mesh_of_8_devices_matches_one_device(train_step):
    devices = jax.devices()
    assert len(devices) >= 8
    mesh = Mesh(np.array(devices[:8]), ("data",))
    data, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    batches = make_batches(3)

    def run(place_batch, place_params):
        params, running = place_params(make_params()), None
        for batch in batches:
            params, running = train_step(params, running, place_batch(batch))
        return summary(running, len(batches)), jax.device_get(params)

    single, single_params = run(
        lambda b: jax.device_put(b, devices[0]), lambda p: jax.device_put(p, devices[0])
    )
    sharded_batch = jax.device_put(batches[0], data)
    assert len(sharded_batch["x"].sharding.device_set) == 8
    assert sharded_batch["x"].addressable_shards[0].data.shape == (ROWS // 8, FEATURES)
    sharded, sharded_params = run(
        lambda b: jax.device_put(b, data), lambda p: jax.device_put(p, replicated)
    )
    assert set(sharded) == set(single)
    for key in single:
        np.testing.assert_allclose(sharded[key], single[key], rtol=1e-6, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(sharded_params["w"], single_params["w"], rtol=1e-6, atol=1e-7)


# 16 rows per microbatch split 8 ways; 4 cannot be.
@pytest.mark.parametrize("num_microbatches", [2, 8])
def test_explicitly_sharded_batch_splits_into_microbatches(num_microbatches):
    mesh = jax.make_mesh(
        (8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:8]
    )
    batch = make_batches(1)[0]
    step = jax.jit(lambda p, b: accumulate_grads_microbatched(loss_fn, p, b, num_microbatches))
    single_grads, single = step(make_params(), batch)
    sharded_batch = jax.device_put(batch, NamedSharding(mesh, P("data")))
    with jax.set_mesh(mesh):
        grads, metrics = step(
            jax.device_put(make_params(), NamedSharding(mesh, P())), sharded_batch
        )
    for key, value in summary(single, 1).items():
        np.testing.assert_allclose(
            summary(metrics, 1)[key], value, rtol=1e-6, atol=1e-6, err_msg=key
        )
    for name in ("w", "b"):
        np.testing.assert_allclose(grads[name], single_grads[name], rtol=1e-5, atol=1e-5)


def test_packed_train_step_over_an_explicit_mesh_matches_one_device():
    mesh = jax.make_mesh(
        (8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:8]
    )
    batches = make_batches(2)
    params, running = make_params(), None
    for batch in batches:
        params, running = train_step(params, running, batch)
    with jax.set_mesh(mesh):
        sharded_params, packed = jax.device_put(make_params(), NamedSharding(mesh, P())), None
        for batch in batches:
            sharded_batch = jax.device_put(batch, NamedSharding(mesh, P("data")))
            sharded_params, packed = train_step_packed(sharded_params, packed, sharded_batch)
    assert isinstance(packed, PackedMetrics)
    expected = summary(running, 2)
    for key, value in summary(packed, 2).items():
        np.testing.assert_allclose(value, expected[key], rtol=1e-6, atol=1e-6, err_msg=key)
