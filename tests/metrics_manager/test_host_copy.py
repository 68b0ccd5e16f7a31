"""Tests for the batched device-to-host copy: exact values, one transfer, clear errors."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metrics_manager import host_copy
from metrics_manager.host_copy import device_get_batched
from metrics_manager.metrics import AveragePerStep, StepsPerTime, Sum


@pytest.fixture
def device_get_calls(monkeypatch):
    """Counts the arrays handed to jax.device_get (each is one transfer)."""
    calls: list[int] = []
    real = jax.device_get

    def spy(tree):
        calls.append(sum(isinstance(x, jax.Array) for x in jax.tree.leaves(tree)))
        return real(tree)

    monkeypatch.setattr(jax, "device_get", spy)
    return calls


def test_values_dtypes_and_shapes_round_trip_exactly(device_get_calls):
    tree = {
        "f32": jnp.float32(2.5),
        "vec": jnp.arange(5, dtype=jnp.int32),
        "mat": jnp.arange(6.0).reshape(2, 3),
        "bool": jnp.array([True, False, True]),
        "bf16": jnp.bfloat16(1.5),
        "i8": jnp.array([-3, 4], jnp.int8),
        "u8": jnp.array(250, jnp.uint8),
        "f16": jnp.float16(-0.5),
        "empty": jnp.zeros((0, 2)),
        "nan": jnp.array([jnp.nan, jnp.inf, -jnp.inf]),
        "numpy": np.float64(3.25),
        "python": 7,
        "none": None,
    }
    out = device_get_batched(tree)
    assert device_get_calls == [1]
    for key, value in tree.items():
        if value is None:
            assert out[key] is None
            continue
        expected = np.asarray(value)
        got = out[key]
        assert not isinstance(got, jax.Array), key
        assert np.asarray(got).dtype == expected.dtype, key
        assert np.asarray(got).shape == expected.shape, key
        np.testing.assert_array_equal(np.asarray(got), expected, err_msg=key)


def test_metric_dataclasses_keep_their_types():
    metrics = {
        "loss": Sum(jnp.float32(40.0)),
        "accuracy": AveragePerStep(total=jnp.float32(20.0), steps=jnp.int32(2)),
        "steps_per_second": StepsPerTime(steps=jnp.int32(8)),
    }
    out = device_get_batched(metrics)
    assert isinstance(out["loss"], Sum) and float(out["loss"].total) == 40.0
    assert isinstance(out["accuracy"], AveragePerStep)
    assert float(out["accuracy"].total) == 20.0 and int(out["accuracy"].steps) == 2
    assert out["steps_per_second"].duration is None and int(out["steps_per_second"].steps) == 8


@pytest.mark.parametrize("num_leaves", [1, 7, 600])
def test_many_leaves_are_one_transfer_with_exact_values(device_get_calls, monkeypatch, num_leaves):
    monkeypatch.setattr(host_copy, "CHUNK", 64)  # exercise chunked stacking with few leaves
    tree = {
        f"m{i:04d}": (jnp.float32(i * 0.5) if i % 3 else jnp.array([i, -i], jnp.int32))
        for i in range(num_leaves)
    }
    out = device_get_batched(tree)
    assert device_get_calls == [1]
    for key, value in tree.items():
        np.testing.assert_array_equal(np.asarray(out[key]), np.asarray(value), err_msg=key)


def test_replicated_arrays_on_a_mesh_copy_one_shard(device_get_calls):
    mesh = jax.make_mesh((8,), ("data",))
    replicated = jax.sharding.NamedSharding(mesh, jax.P())
    tree = {
        "loss": jax.device_put(jnp.float32(3.0), replicated),
        "hist": jax.device_put(jnp.arange(4.0), replicated),
        "local": jnp.float32(1.0),
    }
    out = device_get_batched(tree)
    assert device_get_calls == [1]
    assert float(out["loss"]) == 3.0 and float(out["local"]) == 1.0
    np.testing.assert_array_equal(out["hist"], np.arange(4.0))


def test_arrays_split_over_local_devices_are_fetched_whole(device_get_calls):
    mesh = jax.make_mesh((8,), ("data",))
    split = jax.sharding.NamedSharding(mesh, jax.P("data"))
    tree = {
        "per_device": jax.device_put(jnp.arange(16.0), split),
        "ids": jax.device_put(jnp.arange(8, dtype=jnp.int32), split),
        "loss": jnp.float32(2.0),
        "elsewhere": jax.device_put(jnp.ones(3), jax.devices()[5]),
    }
    out = device_get_batched(tree)
    assert device_get_calls == [4]  # one call: two packed buffers (devices 0, 5) + two split
    np.testing.assert_array_equal(out["per_device"], np.arange(16.0))
    np.testing.assert_array_equal(out["ids"], np.arange(8))
    assert float(out["loss"]) == 2.0
    np.testing.assert_array_equal(out["elsewhere"], np.ones(3))


def test_complex_arrays_are_fetched_too():
    out = device_get_batched({"z": jnp.array([1 + 2j], jnp.complex64), "x": jnp.float32(1.0)})
    np.testing.assert_array_equal(out["z"], np.array([1 + 2j], np.complex64))


def test_deleted_leaves_are_listed_by_path():
    a, b = jnp.ones(2), jnp.ones(3)
    a.delete()
    b.delete()
    with pytest.raises(ValueError) as info:
        device_get_batched({"ok": jnp.ones(1), "gone": Sum(a), "also": b})
    message = str(info.value)
    assert "['gone'].total" in message and "['also']" in message and "['ok']" not in message
    assert "do not donate" in message


def test_tree_without_arrays_is_returned_unchanged(device_get_calls):
    tree = {"a": 1.0, "b": np.ones(2)}
    assert device_get_batched(tree) is tree
    assert device_get_calls == []


_DTYPES = [np.float32, np.int32, np.bool_, np.uint8, np.int8, np.float16, jnp.bfloat16]


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
    leaves=st.lists(
        st.tuples(
            st.sampled_from(_DTYPES),
            st.lists(st.integers(0, 3), max_size=2).map(tuple),
            st.integers(0, 2**16),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_any_mix_of_dtypes_and_shapes_round_trips_exactly(leaves):
    tree = {}
    for i, (dtype, shape, seed) in enumerate(leaves):
        values = np.random.default_rng(seed).integers(-100, 100, size=shape)
        tree[f"leaf{i}"] = jnp.asarray(
            values.astype(dtype) if dtype is not np.bool_ else values > 0
        )
    out = device_get_batched(tree)
    for key, value in tree.items():
        expected = np.asarray(value)
        assert out[key].dtype == expected.dtype and np.shape(out[key]) == expected.shape, key
        np.testing.assert_array_equal(np.asarray(out[key]), expected, err_msg=key)


def test_the_plan_is_made_once_per_layout_and_reused_with_new_values(monkeypatch, device_get_calls):
    monkeypatch.setattr(host_copy, "_PLANS", {})  # no layout cached by earlier tests
    plans: list[int] = []
    real_plan = host_copy._plan
    monkeypatch.setattr(host_copy, "_plan", lambda tree: plans.append(1) or real_plan(tree))
    mesh = jax.make_mesh((8,), ("data",))
    replicated = jax.sharding.NamedSharding(mesh, jax.P())

    def tree(x: float, n: int = 2) -> dict[str, object]:
        return {
            "sum": Sum(jnp.float32(x)),
            "vec": jnp.arange(n, dtype=jnp.int32) * int(x),
            "rep": jax.device_put(jnp.float32(-x), replicated),
            "host": x,
        }

    for x in (1.0, 2.0, 3.0):
        out = device_get_batched(tree(x))
        assert float(out["sum"].total) == x and float(out["rep"]) == -x and out["host"] == x
        np.testing.assert_array_equal(out["vec"], np.arange(2) * int(x))
    assert len(plans) == 1 and device_get_calls == [1, 1, 1]
    out = device_get_batched(tree(4.0, n=3))  # a new shape is a new layout
    np.testing.assert_array_equal(out["vec"], np.arange(3) * 4)
    assert len(plans) == 2
    gone = tree(5.0)
    gone["sum"].total.delete()
    with pytest.raises(ValueError, match=r"\['sum'\]\.total: was deleted"):
        device_get_batched(gone)  # a cached layout still checks every leaf
