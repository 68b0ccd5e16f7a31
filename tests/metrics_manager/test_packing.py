"""PackedMetrics: equal to the unpacked path for every metric type, one buffer per dtype.

The train loop with a packed accumulator (one dispatch per step, no host transfer, a mesh of
8 devices) is tested next to the unpacked one in test_merging_train_loop.py.
"""

import doctest
import functools

import clu.metrics as clu_metrics
import clu.values as clu_values
import flax
import jax
import jax.numpy as jnp
import metrax
import numpy as np
import pytest

import metrics_manager
import writers
from metrics_manager import PackedMetrics, merge_metrics, packing
from metrics_manager import metrics as mm

Pair = clu_metrics.Collection.create(
    accuracy=clu_metrics.Accuracy, loss=clu_metrics.Average.from_output("loss")
)


@flax.struct.dataclass
class AnyTrue(clu_metrics.Metric):
    """A bool-valued metric, for a bool buffer."""

    value: jax.Array

    def merge(self, other):
        return type(self)(value=self.value | other.value)

    def compute(self):
        return self.value


def step_metrics(x):
    """Every metric type this library merges: its own, CLU's, metrax's, bool/int/float leaves,
    a Python-int field (`Step.steps=1`), a Python-float one and None fields (`duration`)."""
    labels = (x > 0).astype(jnp.int32)
    logits = jnp.stack([-x, x], axis=-1)
    probs = jax.nn.sigmoid(x)
    with jax.numpy_rank_promotion("allow"):  # metrax's AUCROC relies on rank promotion
        aucroc = metrax.AUCROC.from_model_output(probs, labels, num_thresholds=5)
    return {
        "sum": mm.Sum.from_model_output(x),
        "vector": mm.Sum(x[:3] * 2.0),
        "steps": mm.Step(),
        "loss": mm.AveragePerStep.from_model_output(x),
        "max": mm.Max.from_model_output(x),
        "min": mm.Min.from_model_output(x),
        "stats": mm.MeanStd.from_model_output(x),
        "seconds": mm.Time(),
        "rate": mm.TimeRate.from_model_output(x.shape[0]),
        "steps_per_second": mm.StepsPerTime(),
        "constant": mm.Sum(1.5),
        "average": clu_metrics.Average.from_model_output(x),
        "accuracy": clu_metrics.Accuracy.from_model_output(logits=logits, labels=labels),
        "last": clu_metrics.LastValue.from_model_output(x),
        "pair": Pair.single_from_model_output(logits=logits, labels=labels, loss=x),
        "precision": metrax.Precision.from_model_output(probs, labels),
        "aucroc": aucroc,
        "any_large": AnyTrue(value=x.max() > 2.0),
    }


@functools.partial(jax.jit, donate_argnums=0)
def step_dict(running, x):
    return merge_metrics(running, step_metrics(x), pack=False)


@functools.partial(jax.jit, donate_argnums=0)
def step_packed(running, x):
    return merge_metrics(running, step_metrics(x))  # packed by default inside jit


XS = [jnp.asarray(np.random.default_rng(i).standard_normal(8), jnp.float32) for i in range(3)]


def run(step):
    running = None
    for x in XS:
        running = step(running, x)
    return running


def leaf_types(tree):
    return [
        (jax.tree_util.keystr(p), jax.typeof(leaf))
        for p, leaf in jax.tree_util.tree_leaves_with_path(tree)
    ]


def assert_same_metrics(got, expected, *, same_weak_types=True):
    assert sorted(got) == sorted(expected)
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(expected), strict=True
    ):
        np.testing.assert_array_equal(
            np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path)
        )
        assert jax.typeof(a).dtype == jax.typeof(b).dtype, jax.tree_util.keystr(path)
        if same_weak_types:
            assert jax.typeof(a) == jax.typeof(b), jax.tree_util.keystr(path)


def test_docstring_examples_run():
    result = doctest.testmod(packing, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 8
    assert result.failed == 0


def test_packed_steps_equal_unpacked_steps_for_every_metric_type():
    expected = run(step_dict)
    packed = run(step_packed)
    assert isinstance(packed, PackedMetrics)
    assert packed.keys() == sorted(step_metrics(XS[0]))
    # Device side: same leaves, dtypes and weak types (Step.steps stays a weak int32).
    assert_same_metrics(packed.unpack(), expected)
    assert packed.unpack()["steps"].steps.weak_type
    assert packed.unpack()["seconds"].duration is None
    # Host side: numpy leaves, same values and dtypes.
    host = packed.unpack_host(jax.device_get(packed.buffers))
    assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves(host))
    assert_same_metrics(host, expected, same_weak_types=False)
    # And the values users read, worked out from the inputs.
    everything = np.concatenate([np.asarray(x) for x in XS])
    np.testing.assert_allclose(host["sum"].compute(), everything.sum(), rtol=1e-5)
    np.testing.assert_allclose(host["max"].compute(), everything.max())
    np.testing.assert_allclose(host["stats"].std(), everything.std(), rtol=1e-5)
    assert int(host["steps"].steps) == 3 and float(host["constant"].compute()) == 4.5
    assert bool(host["any_large"].compute()) == bool(everything.max() > 2.0)
    np.testing.assert_allclose(host["pair"].compute()["loss"], everything.mean(), rtol=1e-5)


def test_one_buffer_per_dtype_instead_of_one_per_leaf():
    expected = run(step_dict)
    packed = run(step_packed)
    assert len(jax.tree.leaves(expected)) > 30
    dtypes = sorted(b.dtype.name for b in packed.buffers)
    assert dtypes == ["bool", "float32", "int32"]
    assert jax.tree.leaves(packed) == list(packed.buffers)
    sizes = {dtype: 0 for dtype in dtypes}
    for leaf in jax.tree.leaves(expected):
        sizes[np.asarray(leaf).dtype.name] += np.size(leaf)
    assert {b.dtype.name: b.shape for b in packed.buffers} == {d: (n,) for d, n in sizes.items()}
    assert "PackedMetrics(keys=['accuracy', 'any_large'," in repr(packed)


def test_donation_reuses_the_packed_buffers_and_the_layout_is_stable():
    step = jax.jit(step_packed.__wrapped__, donate_argnums=0)  # a fresh cache
    running = first = step(None, XS[0])
    for x in XS[1:]:
        previous = running.buffers
        running = step(running, x)
        assert all(b.is_deleted() for b in previous)
    assert step._cache_size() == 2  # running=None and running=PackedMetrics: no retrace
    # The merge keeps the running metrics' layout object, the one in jit's cache key, so each
    # step's argument compares with it by identity instead of field by field.
    assert running._layout is first._layout
    assert merge_metrics(running, step_metrics(XS[0]), pack=True)._layout is first._layout


def test_pack_flag():
    x = XS[0]
    assert isinstance(merge_metrics(None, step_metrics(x)), dict)  # eager: stays a dict
    # Traced, a window's first merge packs; a dict `a` keeps the dict (a scan carry's type).
    assert isinstance(jax.jit(merge_metrics)(None, step_metrics(x)), PackedMetrics)
    assert isinstance(jax.jit(merge_metrics)(step_metrics(x), step_metrics(x)), dict)
    packed = merge_metrics(None, step_metrics(x), pack=True)
    assert isinstance(merge_metrics(packed, step_metrics(x)), PackedMetrics)  # follows `a`
    unpacked = merge_metrics(packed, step_metrics(x), pack=False)
    assert isinstance(unpacked, dict)
    assert_same_metrics(
        unpacked, merge_metrics(step_metrics(x), step_metrics(x)), same_weak_types=False
    )
    both = merge_metrics(packed, packed)  # two packed accumulators, e.g. two windows
    assert isinstance(both, PackedMetrics)
    assert_same_metrics(both.unpack(), unpacked, same_weak_types=False)
    with pytest.raises(TypeError, match="pack must be a bool or None, got str"):
        merge_metrics(None, step_metrics(x), pack="yes")


def test_packed_metrics_read_like_the_dict_they_pack():
    metrics = {"n": mm.Sum(jnp.float32(3.0)), "top": mm.Max(jnp.float32(7.0))}
    packed = PackedMetrics.pack(metrics)
    assert list(packed) == ["n", "top"] and len(packed) == 2 and "top" in packed
    assert "loss" not in packed
    assert float(packed["top"].compute()) == 7.0
    # `.get`, as on the dict, was an AttributeError.
    assert float(packed.get("top").compute()) == 7.0
    assert packed.get("loss") is None and packed.get("loss", 0.0) == 0.0
    assert {k: float(m.compute()) for k, m in packed.items()} == {"n": 3.0, "top": 7.0}
    assert [type(m) for m in packed.values()] == [mm.Sum, mm.Max]
    assert_same_metrics(dict(packed), metrics)
    host = jax.device_get(packed)  # numpy buffers read the same way
    assert float(host["n"].compute()) == 3.0
    with pytest.raises(KeyError, match=r"'loss': not a metric of this PackedMetrics \(keys"):
        packed["loss"]

    @jax.jit
    def total(running):  # inside jit, a read is static slices of the buffers
        return running["n"].compute() + running["top"].compute()

    assert float(total(packed)) == 10.0


def test_a_vmapped_window_is_refused_with_the_fix_not_misread():
    def first_step(x):  # e.g. an ensemble's step under jax.vmap: packed per member
        return merge_metrics(None, {"s": mm.Sum(x.sum()), "top": mm.Max.from_model_output(x)})

    packed = jax.jit(jax.vmap(first_step))(jnp.arange(6.0).reshape(3, 2))
    assert [b.shape for b in packed.buffers] == [(3, 2)]  # the member axis in front
    member = jax.tree.map(lambda b: b[1], packed)
    assert (float(member["s"].compute()), float(member["top"].compute())) == (5.0, 3.0)
    with pytest.raises(ValueError, match=r"buffer 0 \(float32\) has shape \(3, 2\), expected"):
        packed["s"]
    with pytest.raises(ValueError, match=r"merge_windows\(packed\), or take one with"):
        packed.unpack()
    merged = metrics_manager.merge_windows(packed)  # the fix the message names
    assert (float(merged["s"].compute()), float(merged["top"].compute())) == (15.0, 5.0)


def _error(a, b):
    with pytest.raises((TypeError, ValueError)) as info:
        merge_metrics(a, b)
    return info.type, str(info.value)


def test_a_step_that_differs_from_the_packed_running_metrics_gets_the_unpacked_error():
    running = {
        "n": mm.Sum(jnp.float32(1.0)),
        "top": mm.Max(jnp.float32(1.0)),
        "v": mm.Sum(jnp.ones(3)),
    }
    packed = PackedMetrics.pack(running)
    extra_key = {**running, "new": mm.Sum(jnp.float32(2.0))}
    other_type = {**running, "top": mm.Min(jnp.float32(1.0))}
    other_shape = {**running, "v": mm.Sum(jnp.ones(4))}
    for bad in (extra_key, other_type, other_shape):
        assert _error(packed, bad) == _error(running, bad)
    error_type, message = _error(packed, extra_key)
    assert error_type is ValueError and "adds ['new']" in message
    error_type, message = _error(packed, other_type)
    assert error_type is TypeError and "['top']: expected Max" in message
    error_type, message = _error(packed, other_shape)
    assert "['v'] (Sum) field total: shape mismatch, expected (3,)" in message
    with pytest.raises(ValueError, match="keys differ"):  # at trace time inside jit too
        jax.jit(merge_metrics)(packed, extra_key)


def test_pack_names_every_bad_value():
    with pytest.raises(
        TypeError,
        match=r"(?s)2 problems:.*metrics\['loss'\]: expected a clu.metrics.Metric .*got ArrayImpl"
        r".*metrics key 3: expected a str name, got int",
    ):
        PackedMetrics.pack({"loss": jnp.ones(()), 3: mm.Sum(1.0)})
    with pytest.raises(TypeError, match="metrics must be a dict of name -> clu Metric, got list"):
        PackedMetrics.pack([mm.Sum(1.0)])


def test_unpack_host_checks_the_buffers():
    packed = PackedMetrics.pack(
        {"n": mm.Sum(jnp.float32(1.0)), "steps": mm.Step(steps=jnp.int32(2))}
    )
    good = [np.asarray(b) for b in packed.buffers]
    assert [b.dtype.name for b in good] == ["float32", "int32"]
    with pytest.raises(
        TypeError,
        match=r"(?s)2 problems:.*buffer 0: expected dtype float32, got float64.*buffer 1: expected shape \(1,\), got \(2,\)",
    ):
        packed.unpack_host([good[0].astype(np.float64), np.zeros(2, np.int32)])
    with pytest.raises(
        ValueError, match=r"expected 2 buffers \(dtypes \['float32', 'int32'\]\), got 1"
    ):
        packed.unpack_host(good[:1])
    with pytest.raises(TypeError, match="expected a sequence of numpy arrays"):
        packed.unpack_host(good[0])
    host = packed.unpack_host(good)
    assert float(host["n"].compute()) == 1.0 and int(host["steps"].steps) == 2


def test_pytree_round_trip_and_device_get():
    packed = run(step_packed)
    leaves, treedef = jax.tree.flatten(packed)
    again = jax.tree.unflatten(treedef, leaves)
    assert again.keys() == packed.keys() and again.buffers == packed.buffers
    fetched = jax.device_get(packed)  # numpy buffers, same layout
    assert isinstance(fetched, PackedMetrics) and isinstance(fetched.buffers[0], np.ndarray)
    assert_same_metrics(
        fetched.unpack_host(fetched.buffers), packed.unpack_host(jax.device_get(packed.buffers))
    )


def test_packing_leaves_sharded_over_an_explicit_mesh():
    mesh = jax.make_mesh(
        (8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:8]
    )
    values = jnp.arange(16.0)
    with jax.set_mesh(mesh):
        sharded = jax.device_put(
            values, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
        )
        packed = jax.jit(lambda v: PackedMetrics.pack({"v": mm.Sum(v), "n": mm.Sum(v.sum())}))(
            sharded
        )
        unpacked = packed.unpack()
    np.testing.assert_array_equal(unpacked["v"].total, values)
    assert float(unpacked["n"].total) == float(values.sum())


def test_exported_from_the_package():
    assert metrics_manager.PackedMetrics is PackedMetrics
    assert "PackedMetrics" in metrics_manager.__all__


def test_metrics_of_different_classes_with_the_same_fields_keep_their_classes():
    # JAX's treedefs of two flax dataclasses with the same fields compare equal, and unpack()
    # is one jit: a Recall packed after a Precision was unpacked was read back as that
    # Precision (1/3, not 1/2), and windows of Min packed after a Max merged as a max.
    scores, labels = jnp.array([0.9, 0.8, 0.7, 0.2]), jnp.array([1, 0, 0, 1])  # tp 1 fp 2 fn 1
    precision = {"score": metrics_manager.Precision.from_model_output(scores, labels)}
    recall = {"score": metrics_manager.Recall.from_model_output(scores, labels)}
    assert float(PackedMetrics.pack(precision).unpack()["score"].compute()) == pytest.approx(1 / 3)
    unpacked = PackedMetrics.pack(recall).unpack()["score"]
    assert type(unpacked) is metrics_manager.Recall
    assert float(unpacked.compute()) == pytest.approx(1 / 2)

    @jax.jit
    def step_max(v):
        return metrics_manager.merge_metrics(None, {"x": metrics_manager.Max.from_model_output(v)})

    @jax.jit
    def step_min(v):
        return metrics_manager.merge_metrics(None, {"x": metrics_manager.Min.from_model_output(v)})

    assert float(step_max(jnp.ones(3))["x"].compute()) == 1.0
    windows = jax.vmap(step_min)(jnp.array([[3.0, 5.0], [-2.0, 4.0]]))
    merged = metrics_manager.merge_windows(windows)
    assert float(metrics_manager.compute_metric_values(merged)["x"].value) == -2.0  # min of all
    assert PackedMetrics.pack(precision)._layout != PackedMetrics.pack(recall)._layout


def _plan_metrics(total, count, int_count):
    """One metric of each class `HostPlan` computes, over the given field values."""
    f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
    return {
        "avg": clu_metrics.Average(total=f32(total), count=f32(count)),
        "avg/int_count": clu_metrics.Average(
            total=f32(total), count=jnp.asarray(int_count, jnp.int32)
        ),
        "avg/bf16": clu_metrics.Average(
            total=jnp.asarray(total, jnp.bfloat16), count=jnp.asarray(count, jnp.bfloat16)
        ),
        "acc": clu_metrics.Accuracy(total=f32(total), count=f32(count)),
        "last": clu_metrics.LastValue(total=f32(total), count=jnp.asarray(int_count, jnp.int32)),
        "sum": mm.Sum(f32(total)),
        "sum/int": mm.Sum(jnp.asarray(int_count, jnp.int32)),
        "max": mm.Max(f32(total)),
        "min": mm.Min(f32(count)),
        "per_step": mm.AveragePerStep(total=f32(total), steps=jnp.asarray(7, jnp.int32)),
        "per_step/int": mm.AveragePerStep(total=jnp.asarray(int_count, jnp.int32)),
        "rate": mm.TimeRate(numerator=f32(total)),
        "steps_per_s": mm.StepsPerTime(steps=jnp.asarray(3, jnp.int32)),
        "seconds": mm.Time(),
    }


@pytest.mark.parametrize(
    "total, count, int_count",
    [
        (3.7, 3.0, 3),
        (1.0, 3.0, 7),  # 1/3: float32 and float64 divisions differ in the last bits
        (0.0, 0.0, 0),  # 0/0: NaN
        (-2.5, 0.0, 0),  # -inf
        (-0.0, 4.0, 4),  # -0.0 keeps its sign
        (np.inf, 2.0, 2),
        (np.nan, 1.0, 1),
        (3e38, 1e-30, 1),  # float32 overflow: inf
    ],
)
@pytest.mark.parametrize("duration, num_steps", [(0.37, 3), (2.0, 1), (1e-9, 100)])
def test_host_plan_computes_what_host_values_computes_value_and_type(
    total, count, int_count, duration, num_steps
):
    packed = PackedMetrics.pack(_plan_metrics(total, count, int_count))
    buffers = [np.asarray(b) for b in packed.buffers]
    plan = packed.host_plan()
    assert plan is not None and packed.host_plan() is plan  # made once per layout

    fast = plan.values(buffers, duration, num_steps)
    slow = mm.host_values(packed.unpack_host(buffers), duration, num_steps, pytest.fail)

    assert list(fast) == list(slow)  # the same keys, in the same order
    for key, value in slow.items():
        got, want = fast[key].value, value.value
        assert type(fast[key]) is type(value) is clu_values.Scalar, key
        assert type(got) is type(want), key
        assert np.asarray(got).dtype == np.asarray(want).dtype, key
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), (key, got, want)
    assert float(fast["per_step"].value) == pytest.approx(
        np.float32(total) / num_steps, nan_ok=True
    )
    assert fast["steps_per_s"].value == num_steps / duration
    assert fast["seconds"].value == duration


def test_host_plan_only_for_its_classes_with_scalar_fields():
    @flax.struct.dataclass
    class MyAverage(clu_metrics.Average):  # may compute otherwise
        def compute(self):
            return self.total

    base = _plan_metrics(1.0, 2.0, 2)
    assert PackedMetrics.pack(base).host_plan() is not None
    for extra in (
        {"mean": mm.MeanStd.from_model_output(jnp.arange(3.0))},
        {"mine": MyAverage(total=jnp.float32(1.0), count=jnp.float32(2.0))},
        {"vector": mm.Sum(jnp.ones(3))},  # a field that is no scalar
    ):
        assert PackedMetrics.pack({**base, **extra}).host_plan() is None, extra


def _loop_jsonl(tmp_path, pack, int_count=2):
    """A summary of `_plan_metrics` through a manager with a scripted clock; the JSONL rows."""
    clock = iter(np.arange(100.0) * 0.25).__next__
    path = tmp_path / f"{'packed' if pack else 'dict'}.jsonl"
    with metrics_manager.MetricsManager(
        "train",
        writer_factory=lambda _: writers.JsonlWriter(path),
        clock=clock,
        uptime=False,
    ) as manager:
        for step in (1, 2):
            manager.start_duration_timer()
            metrics = _plan_metrics(1.0 * step, 3.0, int_count)
            metrics = merge_metrics(None, metrics, pack=pack)
            manager.write_metrics_summary(metrics, step, 3).result()
        assert manager.errors == []
    return writers.read_jsonl(path)


def test_a_packed_summary_writes_what_the_same_dict_writes(tmp_path, monkeypatch):
    used = []
    values = metrics_manager.metrics.HostPlan.values
    monkeypatch.setattr(
        metrics_manager.metrics.HostPlan,
        "values",
        lambda self, *a: used.append(1) or values(self, *a),
    )
    packed, plain = _loop_jsonl(tmp_path, pack=True), _loop_jsonl(tmp_path, pack=False)
    assert len(used) == 2  # the packed summaries took the plan
    assert [row["step"] for row in packed] == [1, 2]
    timed = ("time", "seconds", "rate", "steps_per_s")  # a window also counts real call time
    for step, (got, want) in enumerate(zip(packed, plain, strict=True), 1):
        assert {k: got[k] for k in got if k not in timed} == pytest.approx(
            {k: want[k] for k in want if k not in timed}, nan_ok=True
        )
        assert got.keys() == want.keys()
        assert got["rate"] == pytest.approx(np.float32(step) / got["seconds"], rel=1e-6)
        assert got["steps_per_s"] == pytest.approx(3 / got["seconds"])
    assert packed[1]["per_step"] == pytest.approx(2.0 / 3)  # total 2 over num_steps 3
    assert packed[1]["avg"] == pytest.approx(2.0 / 3.0)
    assert packed[1]["avg/int_count"] == pytest.approx(1.0)


def test_a_wrapped_int32_count_in_a_packed_summary_is_still_caught(tmp_path):
    path = tmp_path / "m.jsonl"
    with metrics_manager.MetricsManager(
        "train", writer_factory=lambda _: writers.JsonlWriter(path)
    ) as manager:
        manager.start_duration_timer()
        metrics = merge_metrics(None, _plan_metrics(1.0, 3.0, -5), pack=True)
        manager.write_metrics_summary(metrics, 1, 1).result()
        errors = manager.errors
    (row,) = writers.read_jsonl(path)
    assert "avg/int_count" not in row and row["avg"] == pytest.approx(1 / 3)
    assert any("'avg/int_count'" in str(e) and "wrapped" in str(e) for e in errors), errors


def test_a_packed_summary_whose_buffers_were_cast_fails_as_unpack_host_does(tmp_path):
    # Buffers cast after packing (float32 and int32 to float64): unpack_host refuses them
    # with a TypeError naming each buffer; the plan computed them anyway, `avg` a float64.
    metrics = merge_metrics(None, _plan_metrics(1.0, 3.0, 2), pack=True)
    cast = jax.tree.map(lambda b: np.asarray(b, np.float64), metrics)
    path = tmp_path / "m.jsonl"
    with metrics_manager.MetricsManager(
        "train", writer_factory=lambda _: writers.JsonlWriter(path)
    ) as manager:
        manager.start_duration_timer()
        future = manager.write_metrics_summary(cast, 1, 1)
        with pytest.raises(TypeError, match="buffer 0: expected dtype float32, got float64"):
            future.result()
        errors = [(f.source, f.step, type(f.error).__name__) for f in manager.errors]
    assert errors == [("summary", 1, "TypeError")]
    assert writers.read_jsonl(path) == []
    plan = cast.host_plan()
    assert plan is not None and plan.fits([np.asarray(b) for b in metrics.buffers])
    assert not plan.fits(list(cast.buffers))
