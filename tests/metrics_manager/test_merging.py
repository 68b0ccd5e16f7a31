"""merge_metrics, validate_metrics and accumulate_grads_microbatched: values and errors."""

import doctest
import json

import clu.metrics as clu_metrics
import flax
import jax
import jax.numpy as jnp
import metrax
import numpy as np
import pytest

from metrics_manager import MetricsManager, merging
from metrics_manager.classification import Precision
from metrics_manager.merging import accumulate_grads_microbatched, merge_metrics, validate_metrics
from metrics_manager.metrics import AveragePerStep, Max, MeanStd, Min, StepsPerTime, Sum, TimeRate
from metrics_manager.packing import PackedMetrics


def test_docstring_examples_run():
    result = doctest.testmod(merging, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 8
    assert result.failed == 0


# --- merge_metrics -----------------------------------------------------------------------


def test_merge_metrics_merges_each_key_and_keeps_order():
    a = {"n": Sum(2.0), "top": Max(-1.0), "low": Min(-1.0)}
    b = {"top": Max(-3.0), "low": Min(-3.0), "n": Sum(5.0)}
    merged = merge_metrics(a, b)
    assert list(merged) == ["n", "top", "low"]
    assert [float(m.compute()) for m in merged.values()] == [7.0, -1.0, -3.0]


def test_merge_metrics_with_none_returns_a_validated_copy():
    b = {"n": Sum(2.0)}
    out = merge_metrics(None, b)
    assert out == b and out is not b
    with pytest.raises(TypeError, match=r"b\['x'\]: expected a clu.metrics.Metric"):
        merge_metrics(None, {"x": 1.0})


@flax.struct.dataclass
class _RecordingSum(Sum):
    """A Sum whose merge records that it ran (Python side effect: eager use only)."""

    def merge(self, other):
        _MERGE_CALLS.append(self)
        return super().merge(other)


_MERGE_CALLS: list = []


def test_every_bad_value_is_named_in_one_error_before_anything_merges():
    _MERGE_CALLS.clear()
    a = {"ok": _RecordingSum(1.0), "arr": Sum(0.0), "num": Sum(0.0), "none": Sum(0.0)}
    b = {"ok": _RecordingSum(1.0), "arr": jnp.ones(3), "num": 1.5, "none": None}
    with pytest.raises(TypeError) as info:
        merge_metrics(a, b)
    message = str(info.value)
    assert "3 problems" in message
    assert (
        "b['arr']: expected a clu.metrics.Metric (or Collection), got ArrayImpl of shape (3,)"
        in message
    )
    assert "b['num']: expected a clu.metrics.Metric (or Collection), got float 1.5" in message
    assert "b['none']: expected a clu.metrics.Metric (or Collection), got NoneType None" in message
    assert "wrap the value in a metric" in message
    assert _MERGE_CALLS == []


def test_keys_that_differ_are_named():
    with pytest.raises(ValueError, match=r"b lacks \['acc'\] and adds \['accuracy'\]"):
        merge_metrics({"loss": Sum(1.0), "acc": Sum(1.0)}, {"loss": Sum(1.0), "accuracy": Sum(1.0)})


def test_different_metric_types_under_one_key_are_named():
    with pytest.raises(TypeError, match=r"\['loss'\]: expected Sum \(as in a\), got Max in b"):
        merge_metrics({"loss": Sum(1.0)}, {"loss": Max(1.0)})


def test_shape_mismatch_names_key_field_and_shapes():
    a = {"hist": Sum(jnp.zeros(3)), "ok": Sum(1.0)}
    b = {"hist": Sum(jnp.zeros(4)), "ok": Sum(1.0)}
    with pytest.raises(
        ValueError,
        match=r"\['hist'\] \(Sum\) field total: shape mismatch, expected \(3,\) \(as in a\), got \(4,\) in b",
    ):
        merge_metrics(a, b)


def test_type_and_value_problems_are_reported_together_as_type_error():
    with pytest.raises(TypeError, match=r"(?s)2 problems.*\['x'\]: expected Sum.*keys differ"):
        merge_metrics({"x": Sum(1.0), "y": Sum(1.0)}, {"x": Max(1.0)})


def test_non_mapping_is_refused():
    with pytest.raises(TypeError, match="b must be a dict of name -> clu Metric, got list"):
        merge_metrics(None, [Sum(1.0)])


def test_merging_a_timed_metric_with_an_untimed_one_names_the_cause():
    with pytest.raises(ValueError, match=r"\['rate'\] \(TimeRate\): pytree structure differs"):
        merge_metrics(
            {"rate": TimeRate(numerator=1.0, duration=2.0)}, {"rate": TimeRate(numerator=1.0)}
        )
    # Other metrics' structures differ by their settings; the hint names those.
    scores, labels = jnp.array([0.2, 0.7]), jnp.array([0, 1])
    with pytest.raises(
        ValueError,
        match=r"\['p'\] \(Precision\): settings differ: "
        r"average='binary' vs 'micro' \(a vs b\)",
    ):
        merge_metrics(
            {"p": Precision.from_model_output(scores, labels)},
            {"p": Precision.from_model_output(jnp.eye(2), labels, average="micro")},
        )


def test_an_empty_accumulator_is_refused_naming_none():
    """merge_metrics({}, metrics), a loop starting from an empty dict as T5X's may, said "b
    lacks [] and adds ['loss']; return the same keys from every step", which the step did."""
    with pytest.raises(ValueError) as info:
        merge_metrics({}, {"loss": Sum(jnp.float32(2.0))})
    assert str(info.value) == (
        "merge_metrics: a holds no metrics, b holds ['loss']; start each window from None, "
        "not {}: merge_metrics(None, b) returns b's metrics"
    )
    assert float(merge_metrics(None, {"loss": Sum(jnp.float32(2.0))})["loss"].compute()) == 2.0
    assert merge_metrics({}, {}) == {}


def test_a_key_a_step_lacks_is_kept_by_a_masked_metric_as_the_error_advises():
    a = {"loss": clu_metrics.Average.from_model_output(jnp.ones(3))}
    with pytest.raises(ValueError, match=r"the metric of a mask that is all False\)$"):
        merge_metrics(a, {})
    absent = clu_metrics.Average.from_model_output(jnp.zeros(3), mask=jnp.zeros(3, bool))
    assert float(merge_metrics(a, {"loss": absent})["loss"].compute()) == 1.0


def test_errors_are_raised_at_trace_time_inside_jit():
    @jax.jit
    def step(running, x):
        return merge_metrics(running, {"loss": Sum.from_model_output(x), "extra": Sum(x.sum())})

    with pytest.raises(ValueError, match=r"b lacks \[\] and adds \['extra'\]"):
        step({"loss": Sum(jnp.zeros(()))}, jnp.ones(2))


def test_keys_differing_between_microbatches_in_a_user_loop_are_caught():
    pieces = [{"loss": Sum(1.0)}, {"loss": Sum(1.0)}, {"loss": Sum(1.0), "aux": Sum(1.0)}]
    running = None
    with pytest.raises(ValueError, match=r"lacks \[\] and adds \['aux'\]"):
        for piece in pieces:
            running = merge_metrics(running, piece)


def test_validate_metrics_against_reference():
    ref = {"a": Sum(1.0)}
    assert validate_metrics({"a": Sum(2.0)}, ref) == {"a": Sum(2.0)}
    with pytest.raises(TypeError, match=r"metrics key 3: expected a str name, got int"):
        validate_metrics({3: Sum(1.0)})
    with pytest.raises(ValueError, match="the running metrics"):
        validate_metrics({"b": Sum(1.0)}, ref)


# --- CLU and metrax metrics flow through unchanged ----------------------------------------

LOGITS = jnp.array(
    [
        [2.0, 1.0],
        [0.1, 0.3],
        [3.0, -1.0],
        [0.0, 1.0],
        [1.0, 0.5],
        [0.2, 0.1],
        [0.0, 2.0],
        [1.0, 1.5],
    ]
)
LABELS = jnp.array([0, 1, 1, 1, 0, 0, 1, 0], jnp.int32)
PROBS = jax.nn.softmax(LOGITS)[:, 1]
LOSSES = -jnp.log(jnp.take_along_axis(jax.nn.softmax(LOGITS), LABELS[:, None], axis=1))[:, 0]

Pair = clu_metrics.Collection.create(
    accuracy=clu_metrics.Accuracy, loss=clu_metrics.Average.from_output("loss")
)


def _third_party_metrics(batch):
    logits, labels, probs, losses = batch
    return {
        "average": clu_metrics.Average.from_model_output(losses),
        "accuracy": clu_metrics.Accuracy.from_model_output(logits=logits, labels=labels),
        "last": clu_metrics.LastValue.from_model_output(losses),
        "collection": Pair.single_from_model_output(logits=logits, labels=labels, loss=losses),
        "precision": metrax.Precision.from_model_output(probs, labels),
        "aucroc": _aucroc(probs, labels),
    }


def _aucroc(probs, labels):
    # metrax compares [B] predictions with [T, 1] thresholds by implicit rank promotion,
    # which tests/conftest.py turns into an error; allow it for metrax's code only.
    with jax.numpy_rank_promotion("allow"):
        return metrax.AUCROC.from_model_output(probs, labels, num_thresholds=20)


def _computed(metrics):
    out = {}
    for key, metric in metrics.items():
        if isinstance(metric, clu_metrics.Collection):
            out.update({f"{key}/{k}": v for k, v in metric.compute().items()})
        else:
            out[key] = metric.compute()
    return {k: float(v) for k, v in out.items()}


def test_clu_and_metrax_metrics_merge_across_steps():
    halves = [
        tuple(x[:4] for x in (LOGITS, LABELS, PROBS, LOSSES)),
        tuple(x[4:] for x in (LOGITS, LABELS, PROBS, LOSSES)),
    ]
    metrics_of = jax.jit(_third_party_metrics)
    merged = merge_metrics(metrics_of(halves[0]), metrics_of(halves[1]))
    whole = _computed(metrics_of((LOGITS, LABELS, PROBS, LOSSES)))
    got = _computed(merged)
    for key in (
        "average",
        "accuracy",
        "collection/accuracy",
        "collection/loss",
        "precision",
        "aucroc",
    ):
        np.testing.assert_allclose(got[key], whole[key], rtol=1e-6, err_msg=key)
    # Across steps LastValue keeps the newer step's value.
    np.testing.assert_allclose(got["last"], float(LOSSES[4:].mean()), rtol=1e-6)


@pytest.mark.parametrize("num_microbatches", [1, 2, 4])
def test_clu_and_metrax_metrics_through_microbatches(num_microbatches):
    def loss_fn(scale, batch):
        return scale * batch[3].sum(), _third_party_metrics(batch)

    @jax.jit
    def step(scale, batch):
        return accumulate_grads_microbatched(loss_fn, scale, batch, num_microbatches)

    grads, metrics = step(jnp.float32(1.0), (LOGITS, LABELS, PROBS, LOSSES))
    np.testing.assert_allclose(grads, LOSSES.sum(), rtol=1e-6)
    whole = _computed(_third_party_metrics((LOGITS, LABELS, PROBS, LOSSES)))
    got = _computed(metrics)
    assert set(got) == set(whole)
    for key in whole:  # LastValue too: microbatches of one step average, like devices
        np.testing.assert_allclose(got[key], whole[key], rtol=1e-6, err_msg=key)


def test_a_collection_merges_as_the_dict_of_its_metrics_in_steps_and_microbatches():
    """Flax's CLU idiom (a `Collection` from the loss) in the README's loop: same values as
    the Collection's own merge and `compute()`, keyed by its field names."""
    halves = [(LOGITS[:4], LABELS[:4], LOSSES[:4]), (LOGITS[4:], LABELS[4:], LOSSES[4:])]

    def collection(logits, labels, losses):
        return Pair.single_from_model_output(logits=logits, labels=labels, loss=losses)

    whole = {k: float(v) for k, v in collection(LOGITS, LABELS, LOSSES).compute().items()}
    running = None
    for half in halves:
        running = jax.jit(merge_metrics)(running, collection(*half))
    assert isinstance(running, PackedMetrics) and list(running) == ["accuracy", "loss"]
    assert _computed(running) == pytest.approx(whole, rel=1e-6)
    clu_merged = collection(*halves[0]).merge(collection(*halves[1])).compute()
    assert _computed(running) == pytest.approx({k: float(v) for k, v in clu_merged.items()})

    def loss_fn(scale, batch):
        return scale * batch[2].sum(), collection(*batch)

    for n in (1, 2, 4):
        step = jax.jit(lambda s, b, n=n: accumulate_grads_microbatched(loss_fn, s, b, n))
        _, metrics = step(jnp.float32(1.0), (LOGITS, LABELS, LOSSES))
        assert _computed(metrics) == pytest.approx(whole, rel=1e-6), n
    with pytest.raises(ValueError, match=r"b lacks \['n'\] and adds \['accuracy', 'loss'\]"):
        merge_metrics({"n": Sum(1.0)}, collection(*halves[0]))


# --- accumulate_grads_microbatched --------------------------------------------------------

ROWS = 16
VALUES = -(jnp.linspace(1.0, 4.0, ROWS * 3).reshape(ROWS, 3) ** 2)  # all negative
MASK = jnp.arange(ROWS) % 5 != 3  # padding rows
W = jnp.array([0.5, -1.0, 2.0])


def _per_example_loss_fn(w, batch):
    values, mask = batch
    per_example = values @ w
    loss = jnp.where(mask, per_example, 0.0).sum()
    return loss, {
        "max": Max.from_model_output(per_example, mask=mask),
        "min": Min.from_model_output(per_example, mask=mask),
        "stats": MeanStd.from_model_output(per_example, mask=mask),
        "loss": AveragePerStep.from_model_output(per_example, mask=mask),
        "sum": Sum.from_model_output(values, mask=mask),
        "rate": TimeRate.from_model_output(mask.sum()),
        "steps_per_second": StepsPerTime.from_model_output(),
    }


@jax.jit
def _accumulate_all(w, batch):
    return {
        n: accumulate_grads_microbatched(_per_example_loss_fn, w, batch, n) for n in (1, 2, 4, 8)
    }


def test_microbatch_invariance_of_max_min_mean_std_and_grads():
    results = _accumulate_all(W, (VALUES, MASK))
    kept = np.asarray(VALUES @ W)[np.asarray(MASK)]
    assert kept.max() < 0  # the data for the next assertion
    expected_grad = np.asarray(VALUES)[np.asarray(MASK)].sum(axis=0)
    for n, (grads, metrics) in results.items():
        np.testing.assert_allclose(grads, expected_grad, rtol=1e-5, err_msg=f"n={n}")
        np.testing.assert_allclose(
            metrics["max"].compute(), kept.max(), rtol=1e-5, err_msg=f"n={n}"
        )
        assert float(metrics["max"].compute()) < 0
        np.testing.assert_allclose(
            metrics["min"].compute(), kept.min(), rtol=1e-5, err_msg=f"n={n}"
        )
        np.testing.assert_allclose(
            metrics["stats"].compute(), kept.mean(), rtol=1e-5, err_msg=f"n={n}"
        )
        np.testing.assert_allclose(metrics["stats"].std(), kept.std(), rtol=1e-5, err_msg=f"n={n}")
        assert int(metrics["stats"].count) == kept.size
        # One train step, however many microbatches: compute() is the step's sum.
        assert int(metrics["loss"].steps) == 1 and int(metrics["steps_per_second"].steps) == 1
        np.testing.assert_allclose(
            metrics["loss"].compute(), kept.sum(), rtol=1e-5, err_msg=f"n={n}"
        )
        np.testing.assert_allclose(metrics["rate"].numerator, kept.size, err_msg=f"n={n}")


def _equation_count(jaxpr):
    """Equations of a jaxpr, those of its sub-jaxprs (the scan body, ...) included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += 1
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    count += _equation_count(inner)
    return count


def test_microbatched_program_does_not_grow_with_the_count(monkeypatch):
    # Microbatches merge into the scan carry: one loss_fn trace and one merge per key at
    # any count. (Merging stacked scan outputs after the scan traced n - 1 merges.)
    merges = []
    original = merging._merge_pieces
    monkeypatch.setattr(merging, "_merge_pieces", lambda a, b: merges.append(1) or original(a, b))
    counts = {}
    for n in (2, 16):
        merges.clear()
        jaxpr = jax.make_jaxpr(
            lambda w, b, n=n: accumulate_grads_microbatched(_per_example_loss_fn, w, b, n)
        )(W, (VALUES, MASK))
        counts[n] = (_equation_count(jaxpr.jaxpr), len(merges))
    num_keys = len(_per_example_loss_fn(W, (VALUES, MASK))[1])
    assert counts[2] == counts[16]
    assert counts[16][1] == 2 * num_keys  # one to type the scan carry, one in its body


@flax.struct.dataclass
class _MeanOfPieces(clu_metrics.Metric):
    """A metric whose merge promotes: the mean of two int32 values is float32."""

    value: jax.Array

    def merge(self, other):
        return type(self)(value=(self.value + other.value) / 2)


def test_a_merge_that_promotes_gives_the_promoted_dtype_through_microbatches():
    # The scan carry cannot change type; it starts with the merged dtype, not the int32 of
    # microbatch 0 (no truncation to int).
    def loss_fn(w, batch):
        return w * batch.sum(), {"mean": _MeanOfPieces(value=batch.sum().astype(jnp.int32))}

    grads, metrics = jax.jit(lambda w, b: accumulate_grads_microbatched(loss_fn, w, b, 2))(
        jnp.float32(1.0), jnp.arange(4.0)
    )
    # Microbatches hold rows (0, 2) and (1, 3): sums 2 and 4, their mean 3.
    assert metrics["mean"].value.dtype == jnp.float32
    np.testing.assert_allclose(metrics["mean"].value, 3.0)
    np.testing.assert_allclose(grads, 6.0)


def test_rng_is_folded_with_the_microbatch_index():
    rng = jax.random.key(7)

    def loss_fn(w, batch, rng_i):
        noise = jax.random.uniform(rng_i, ())
        return w * batch.sum(), {"noise": Sum.from_model_output(noise)}

    _, metrics = jax.jit(lambda w, b: accumulate_grads_microbatched(loss_fn, w, b, 4, rng=rng))(
        jnp.float32(1.0), jnp.ones(8)
    )
    expected = sum(float(jax.random.uniform(jax.random.fold_in(rng, i), ())) for i in range(4))
    np.testing.assert_allclose(metrics["noise"].compute(), expected, rtol=1e-6)
    _, single = accumulate_grads_microbatched(loss_fn, jnp.float32(1.0), jnp.ones(8), None, rng=rng)
    np.testing.assert_allclose(
        single["noise"].compute(), jax.random.uniform(jax.random.fold_in(rng, 0), ())
    )


def test_microbatch_i_holds_strided_rows():
    def loss_fn(w, batch):
        return w * batch.sum(), {
            "first_row": clu_metrics.LastValue(value=batch[0].astype(jnp.float32))
        }

    def first_rows(w, batch):
        # Stack each microbatch's first row by running the loss function per microbatch.
        return accumulate_grads_microbatched(loss_fn, w, batch, 4)

    _, metrics = first_rows(jnp.float32(1.0), jnp.arange(8))
    # LastValue averages the pieces of a step: microbatch i starts with row i -> mean(0..3).
    np.testing.assert_allclose(metrics["first_row"].compute(), 1.5)


def test_bad_loss_fn_metrics_are_named():
    def loss_fn(w, batch):
        return (w * batch).sum(), {"loss": (w * batch).sum(), "ok": Sum.from_model_output(batch)}

    with pytest.raises(
        TypeError, match=r"the metrics returned by loss_fn\['loss'\]: expected a clu.metrics.Metric"
    ):
        accumulate_grads_microbatched(loss_fn, jnp.float32(1.0), jnp.ones(4), 2)


def test_loss_fn_must_return_a_pair():
    with pytest.raises(TypeError, match=r"loss_fn must return a pair \(loss, metrics\), got"):
        accumulate_grads_microbatched(lambda w, b: (w * b).sum(), jnp.float32(1.0), jnp.ones(4), 2)


def test_t5x_calls_are_refused_naming_this_signature():
    # T5X's (model, train_state, batch, dropout_rng) and its model.loss_fn's
    # (loss, (weight_sum, metrics)) got errors that named neither T5X nor the fix.
    class Model:
        def loss_fn(self, params, batch, rng):
            return jnp.sum(batch @ params), (jnp.float32(4.0), {"n": Sum(jnp.float32(1.0))})

    params, batch, rng = jnp.ones(2), jnp.ones((4, 2)), jax.random.key(0)
    with pytest.raises(TypeError, match=r"\(a T5X model: this takes accumulate_grads_microbatched"):
        accumulate_grads_microbatched(Model(), params, batch, rng)
    with pytest.raises(TypeError, match=r"got \(loss, \(weight_sum, metrics\)\) as T5X's"):
        accumulate_grads_microbatched(Model().loss_fn, params, batch, 2, rng=rng)

    def loss_fn(params, batch, rng):  # the wrapper the message gives
        loss, (_, metrics) = Model().loss_fn(params, batch, rng)
        return loss, metrics

    grads, metrics = accumulate_grads_microbatched(loss_fn, params, batch, 2, rng=rng)
    assert grads.tolist() == [4.0, 4.0] and float(metrics["n"].compute()) == 2.0


@pytest.mark.parametrize("num_microbatches", [1, 2])
def test_a_loss_that_is_no_float_scalar_is_named_with_the_fix(num_microbatches):
    metrics = {"n": Sum(jnp.float32(1.0))}
    per_example = lambda w, b: (w * b, metrics)  # noqa: E731
    as_int = lambda w, b: ((w * b).sum().astype(jnp.int32), metrics)  # noqa: E731
    for loss_fn, got in ((per_example, r"shape \(\d,\) and dtype float32"), (as_int, "int32")):
        with pytest.raises(TypeError, match=rf"loss must be a float scalar .*{got}.*loss.sum\(\)"):
            jax.jit(accumulate_grads_microbatched, static_argnums=(0, 3))(
                loss_fn, jnp.float32(1.0), jnp.ones(4), num_microbatches
            )


def test_indivisible_batch_names_every_leaf():
    batch = {"x": jnp.ones((6, 2)), "y": jnp.ones(6), "z": jnp.ones(())}
    with pytest.raises(
        ValueError,
        match=r"(?s)3 problems.*batch\['x'\] has shape \(6, 2\).*num_microbatches=4.*batch\['y'\].*batch\['z'\] has shape \(\)",
    ):
        accumulate_grads_microbatched(lambda w, b: (w, {}), jnp.float32(1.0), batch, 4)


def test_leaves_with_different_batch_dimensions_are_refused_before_the_loss_sees_them():
    # Both divide by 2, so each microbatch would pair 5 rows of x with 4 of y.
    batch = {"x": jnp.ones((10, 3)), "y": jnp.ones(8), "mask": jnp.ones((10, 7))}
    with pytest.raises(
        ValueError,
        match=r"^accumulate_grads_microbatched: the batch's leaves differ in their leading "
        r"\(batch\) dimension: batch\['mask'\] has 10, batch\['y'\] has 8 rows; every leaf",
    ):
        accumulate_grads_microbatched(lambda w, b: (w, {}), jnp.float32(1.0), batch, 2)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (2.0, TypeError), (True, TypeError)])
def test_num_microbatches_is_checked(bad, error):
    with pytest.raises(
        error,
        match=f"num_microbatches must be .*got {bad!r}"
        if error is ValueError
        else "num_microbatches must be an int or None",
    ):
        accumulate_grads_microbatched(lambda w, b: (w, {}), jnp.float32(1.0), jnp.ones(4), bad)


def test_a_loss_fn_that_does_not_take_the_rng_or_needs_one_is_named():
    # Python's "<lambda>() takes 2 positional arguments but 3 were given" named no fix.
    args = (jnp.ones(2), jnp.ones((4, 2)), 2)
    with pytest.raises(
        TypeError,
        match=r"loss_fn is called as loss_fn\(params, microbatch, rng\) since rng= was given, "
        r"but it takes \(w, b\)$",
    ):
        accumulate_grads_microbatched(
            lambda w, b: (jnp.sum(b @ w), {}), *args, rng=jax.random.key(0)
        )
    with pytest.raises(TypeError, match=r"loss_fn\(params, microbatch\) \(no rng= was given\)"):
        accumulate_grads_microbatched(lambda w, b, rng: (jnp.sum(b @ w), {}), *args)
    with pytest.raises(TypeError, match=r"loss_fn must be callable, got int 3"):
        accumulate_grads_microbatched(3, *args)
    grads, _ = accumulate_grads_microbatched(lambda w, b, rng=None: (jnp.sum(b @ w), {}), *args)
    assert grads.tolist() == [4.0, 4.0]


def test_package_reexports_are_sorted_and_resolve():
    import metrics_manager

    assert metrics_manager.__all__ == sorted(metrics_manager.__all__)
    for name in ("merge_metrics", "validate_metrics", "accumulate_grads_microbatched", "MeanStd"):
        assert name in metrics_manager.__all__
    assert all(hasattr(metrics_manager, name) for name in metrics_manager.__all__)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_values_accumulate_in_float32_over_a_window(dtype):
    """CLU's Average and Std keep their inputs' dtype: summed over a window in bfloat16, the
    total stopped growing (an Average of 2.03 read 1.02 after 1,000 steps)."""
    values = np.random.default_rng(0).normal(2.03, 0.02, (1000, 8)).astype(dtype)

    def metrics(x):
        return {
            "avg": clu_metrics.Average.from_model_output(x),
            "std": clu_metrics.Std.from_model_output(x),
            "sum": Sum.from_model_output(x),
        }

    @jax.jit
    def step(running, x):
        return merge_metrics(running, metrics(x))

    running = None
    for x in values:
        running = step(running, x)
    exact = values.astype(np.float64)  # CLU still sums one step's values in bfloat16: 1e-3
    assert float(running["avg"].compute()) == pytest.approx(exact.mean(), rel=1e-3)
    assert float(running["sum"].compute()) == pytest.approx(exact.sum(), rel=1e-5)
    assert float(running["std"].total) == pytest.approx(exact.sum(), rel=1e-3)
    assert {b.dtype.name for b in running.buffers} == {"float32", "int32"}  # no 16-bit one

    def loss_fn(w, x):
        return jnp.sum(x * w, dtype=jnp.float32), metrics(x)

    _, merged = jax.jit(accumulate_grads_microbatched, static_argnums=(0, 3))(
        loss_fn, jnp.float32(1.0), values.reshape(-1), 250
    )
    assert float(merged["avg"].compute()) == pytest.approx(exact.mean(), rel=1e-3)
    # Widened, the merge keeps `a`'s key order.
    assert list(merge_metrics(dict(reversed(metrics(values[0]).items())), metrics(values[1]))) == [
        "sum",
        "std",
        "avg",
    ]


_EXPLICIT, _AUTO = jax.sharding.AxisType.Explicit, jax.sharding.AxisType.Auto


@pytest.mark.parametrize("axis_types", [(_EXPLICIT, _EXPLICIT), (_AUTO, _AUTO), (_EXPLICIT, _AUTO)])
def test_merge_windows_of_a_shard_map_on_either_kind_of_mesh(axis_types):
    """`shard_map(..., out_specs=P("d"))` windows, as the manager's refusal says to merge
    them: over an explicit axis (jax.make_mesh's default), beside an Auto one too, slicing
    them one by one raised ShardingTypeError."""
    mesh = jax.make_mesh((8, 1), ("d", "model"), axis_types=axis_types)
    x = jax.device_put(jnp.arange(64.0), jax.sharding.NamedSharding(mesh, jax.P("d")))

    def per_device(x):
        window = {
            "loss": AveragePerStep.from_model_output(x.sum()),
            "top": Max.from_model_output(x),
        }
        return jax.tree.map(lambda a: jnp.expand_dims(a, 0), window)

    windows = jax.jit(
        jax.shard_map(per_device, mesh=mesh, in_specs=jax.P("d"), out_specs=jax.P("d"))
    )(x)
    for merged in (merging.merge_windows(windows), jax.jit(merging.merge_windows)(windows)):
        # One step's pieces on 8 devices: the step counts once (each window's merge made 8).
        assert int(merged["loss"].steps) == 1 and float(merged["loss"].total) == 2016.0
        assert float(merged["top"].compute()) == 63.0


@pytest.mark.parametrize("axis_type", [_EXPLICIT, _AUTO], ids=["explicit", "auto"])
def test_shard_map_windows_packed_by_merge_metrics_merge_and_the_refusal_says_so(
    tmp_path, axis_type
):
    """merge_metrics' default pack=True packed the shard_map's windows as one: the summary
    said "reduce them in the step" and merge_windows "write it as it is", each sending the
    user to the other; over an explicit axis, packing them raised outside `jax.set_mesh`."""
    mesh = jax.make_mesh((8,), ("d",), axis_types=(axis_type,))
    x = jax.device_put(jnp.arange(32.0), jax.sharding.NamedSharding(mesh, jax.P("d")))

    @jax.jit
    def step(running, x):
        def per_device(x):
            window = {"sum": Sum.from_model_output(x), "top": Max.from_model_output(x)}
            return jax.tree.map(lambda a: a[None], window)

        windows = jax.shard_map(per_device, mesh=mesh, in_specs=jax.P("d"), out_specs=jax.P("d"))
        return merge_metrics(running, windows(x))

    running = step(step(None, x), x)
    assert isinstance(running, PackedMetrics)
    with MetricsManager("train", tmp_path) as manager:
        with pytest.raises(ValueError, match=r"stacked by the step .* merge_windows\(metrics\)"):
            manager.write_metrics_summary(running, 2, 2)
        merged = merging.merge_windows(running)
        assert isinstance(merged, PackedMetrics)
        summary = manager.write_metrics_summary(merged, 2, 2).result()
    # 2 steps of sum(0..31) = 496; the top over every device and step: 31.
    assert {k: float(v.value) for k, v in summary.items()} == {"sum": 992.0, "top": 31.0}


def test_shard_map_windows_with_a_steps_per_time_are_refused_naming_merge_windows(tmp_path):
    """The README loop's StepsPerTime among shard_map windows packed as one: its compute()
    needs the window's duration, so it went unchecked, and the refusal said only "reduce
    them in the step", not to merge the windows."""
    mesh = jax.make_mesh((8,), ("d",))
    x = jax.device_put(jnp.arange(32.0), jax.sharding.NamedSharding(mesh, jax.P("d")))

    @jax.jit
    def step(running, x):
        def per_device(x):
            window = {"sum": Sum.from_model_output(x), "rate": StepsPerTime.from_model_output()}
            return jax.tree.map(lambda a: jnp.expand_dims(a, 0), window)

        windows = jax.shard_map(per_device, mesh=mesh, in_specs=jax.P("d"), out_specs=jax.P("d"))
        return merge_metrics(running, windows(x))

    running = step(step(None, x), x)
    with MetricsManager("train", tmp_path) as manager:
        manager.start_duration_timer()
        with pytest.raises(ValueError, match=r"stacked by the step .* merge_windows\(metrics\)"):
            manager.write_metrics_summary(running, 2, 2)
        summary = manager.write_metrics_summary(merging.merge_windows(running), 2, 2).result()
    assert float(summary["sum"].value) == 992.0 and "rate" in summary


@pytest.mark.parametrize("pack", [False, True], ids=["dict", "packed"])
def test_vmapped_windows_with_time_metrics_are_refused_naming_merge_windows(tmp_path, pack):
    """A vmapped dict of a MeanStd and a StepsPerTime was taken at the call: the time metrics'
    compute() needs the window's duration, so they went unchecked; the worker dropped 'ms'
    and wrote 'sps' as one rate. Packed, the buffers' mapped axis is refused."""

    def step(x):
        window = {
            "ms": MeanStd.from_model_output(x),
            "sps": StepsPerTime.from_model_output(),
            "tps": TimeRate.from_model_output(x + 1.0),
        }
        return merge_metrics(None, window, pack=pack)

    windows = jax.vmap(step)(jnp.arange(4.0))
    refused = (
        r"buffer 0 \(float32\) has shape \(4, 4\).*merge_windows\(packed\)"
        if pack
        else r"metrics \['sps', 'tps'\] compute arrays of shapes \[\(4,\), \(4,\)\], not "
        r"scalars.* stacked by the step .* merge_windows\(metrics\)"
    )
    with MetricsManager("train", tmp_path) as manager:
        manager.start_duration_timer()
        with pytest.raises(ValueError, match=refused):
            manager.write_metrics_summary(windows, 5, 5)
        manager.write_metrics_summary(merging.merge_windows(windows), 5, 5).result()
        assert manager.errors == []
    [row] = [json.loads(x) for x in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    # x = 0..3: mean 1.5; 1 + 2 + 3 + 4 = 10 per 5 steps of the same window.
    assert (row["step"], row["ms"], row["ms/std"]) == (5, 1.5, pytest.approx(np.std(range(4))))
    assert row["sps"] > 0 and row["tps"] / row["sps"] == pytest.approx(10 / 5)


@pytest.mark.parametrize("axis_type", [_EXPLICIT, _AUTO], ids=["explicit", "auto"])
def test_merge_windows_of_windows_packed_inside_a_shard_map(tmp_path, axis_type):
    """merge_metrics packs by default under the shard_map too: out_specs=P("d") then puts the
    devices' flat buffers end to end ([8 * size]), which the summary refused, saying to call
    merge_windows, and merge_windows refused ("got leading sizes [8, 24]")."""
    mesh = jax.make_mesh((8,), ("d",), axis_types=(axis_type,))
    x = jax.device_put(jnp.arange(32.0), jax.sharding.NamedSharding(mesh, jax.P("d")))

    def per_device(x):
        return merge_metrics(
            None,
            {
                "loss": AveragePerStep.from_model_output(x.sum()),
                "sum": Sum.from_model_output(x),
                "top": Max.from_model_output(x),
            },
        )

    windows = jax.jit(
        jax.shard_map(per_device, mesh=mesh, in_specs=jax.P("d"), out_specs=jax.P("d"))
    )(x)
    assert [b.shape for b in windows.buffers] == [(8,), (24,)]  # steps; totals and maxima
    with MetricsManager("train", tmp_path) as manager:
        with pytest.raises(ValueError, match=r"shard_map with out_specs=P\(axis\) the devices'"):
            manager.write_metrics_summary(windows, 1, 1)
        for merged in (merging.merge_windows(windows), jax.jit(merging.merge_windows)(windows)):
            assert isinstance(merged, PackedMetrics)
            summary = manager.write_metrics_summary(merged, 1, 1).result()
            # One step on 8 devices: sum(0..31) = 496, its top 31.
            assert {k: float(v.value) for k, v in summary.items()} == {
                "loss": 496.0,
                "sum": 496.0,
                "top": 31.0,
            }


@pytest.mark.parametrize("metrics", [None, {}, [1.0]])
def test_merge_windows_of_no_metrics_names_what_it_takes(metrics):
    # None and {} gave "leading sizes []", a list an error naming merge_metrics and a tracer.
    with pytest.raises(TypeError, match="merge_windows: metrics must be a non-empty dict of CLU"):
        merging.merge_windows(metrics)


def test_merge_windows_of_one_packed_window_says_to_write_it_as_it_is():
    # Buffers of equal sizes passed the leading-axis check; unpacking then said "merge them
    # with merge_windows(packed)", the call just made.
    one = PackedMetrics.pack({"a": Sum(jnp.float32(1)), "b": Sum(jnp.float32(2))})
    with pytest.raises(ValueError, match=r"^merge_windows: this PackedMetrics holds one window"):
        merging.merge_windows(one)
    two = jax.tree.map(lambda b: jnp.stack([b, b]), one)  # a window per device, as pmap gives
    merged = merging.merge_windows(two).unpack()
    assert {k: float(m.compute()) for k, m in merged.items()} == {"a": 2.0, "b": 4.0}


def test_merge_windows_counts_the_steps_once_and_averages_last_values_as_clus_reduce():
    # Each window's own merge counted a Step once per device (an AveragePerStep of one step
    # on 2 devices read half its value) and kept the last device's LastValue.
    def window(total, last):
        return {
            "per_step": AveragePerStep(total=jnp.float32(total), steps=jnp.int32(1)),
            "last": clu_metrics.LastValue.from_model_output(jnp.float32(last)),
            "n": Sum(jnp.float32(total)),
        }

    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), window(6.0, 2.0), window(10.0, 4.0))
    packed = jax.tree.map(
        lambda a, b: jnp.stack([a, b]),
        PackedMetrics.pack(window(6.0, 2.0)),
        PackedMetrics.pack(window(10.0, 4.0)),
    )
    for merged in (merging.merge_windows(stacked), merging.merge_windows(packed).unpack()):
        values = {k: float(m.compute()) for k, m in merged.items()}
        assert values == {"per_step": 16.0, "last": 3.0, "n": 16.0}
        assert int(merged["per_step"].steps) == 1
