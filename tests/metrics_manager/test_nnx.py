"""The NNX-style facade: Flax's documented numbers, parity with `flax.nnx.metrics`, state
carried through `jax.jit` and `nnx.jit`, and `as_summary_metrics` for the manager."""

import doctest
import json
import weakref

import clu.metrics as clu_metrics
import clu.values
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from metrax import nnx as metrax_nnx

import metrics_manager
import writers
from metrics_manager import nnx as mnnx
from metrics_manager.classification import AUROC, FBeta, Perplexity, Precision, TopKAccuracy
from metrics_manager.merging import accumulate_grads_microbatched, merge_metrics
from metrics_manager.metrics import compute_metric_values

BATCH_1, BATCH_2 = jnp.array([1, 2, 3, 4]), jnp.array([3, 2, 1, 0])


def test_docstring_examples_run():
    result = doctest.testmod(mnnx)
    assert result.attempted >= 15
    assert result.failed == 0


def test_average_reproduces_flax_documented_example():
    average = mnnx.Average()
    assert np.isnan(average.compute())
    average.update(values=BATCH_1)
    assert float(average.compute()) == 2.5
    average.update(values=BATCH_2)
    assert float(average.compute()) == 2.0
    average.reset()
    assert np.isnan(average.compute())
    assert isinstance(average.metric, clu_metrics.Average)


def test_average_with_another_argname_and_a_mask_equals_flax():
    ours, theirs = mnnx.Average("loss"), nnx.metrics.Average("loss")
    values = jnp.array([[1.0, 2.0], [3.0, 5.0]])
    mask = jnp.array([[True, False], [True, True]])
    for metric in (ours, theirs):
        metric.update(loss=values, mask=mask)
        metric.update(loss=jnp.array([7.0]))
    assert float(ours.compute()) == float(theirs.compute()) == 4.0
    with pytest.raises(TypeError, match="expected the keyword argument 'loss'.*got \\['values'\\]"):
        ours.update(values=values)


def test_an_argname_beside_a_default_argname_reads_its_own_argument_in_any_order():
    # Average("loss") renames loss= to values=, which Average() also reads: whichever keyword
    # came last won, so "loss" averaged the other metric's values (150.0 for 2.0).
    for order in ("loss first", "values first"):
        ours = mnnx.MultiMetric(loss=mnnx.Average("loss"), other=mnnx.Average())
        theirs = nnx.MultiMetric(loss=nnx.metrics.Average("loss"), other=nnx.metrics.Average())
        arguments = {"loss": jnp.array([1.0, 3.0]), "values": jnp.array([100.0, 200.0])}
        if order == "values first":
            arguments = dict(reversed(arguments.items()))
        for metrics in (ours, theirs):
            metrics.update(**arguments)
        expected = {"loss": 2.0, "other": 150.0}
        assert {k: float(v) for k, v in ours.compute().items()} == expected, order
        assert {k: float(v) for k, v in theirs.compute().items()} == expected


def test_a_scalar_loss_beside_a_per_example_mask_is_averaged_as_in_flax():
    # The mask is the accuracy's; with the scalar loss it raised CLU's "mask must have the same
    # leading dimension as values", naming no metric.
    logits, labels = jnp.eye(4), jnp.array([0, 1, 0, 0])
    mask = jnp.array([True, True, True, False])
    ours = mnnx.MultiMetric(loss=mnnx.Average("loss"), acc=mnnx.Accuracy())
    theirs = nnx.MultiMetric(loss=nnx.metrics.Average("loss"), acc=nnx.metrics.Accuracy())
    for loss in (0.7, 0.3):
        for metrics in (ours, theirs):
            metrics.update(loss=jnp.float32(loss), logits=logits, labels=labels, mask=mask)
    assert float(ours.loss.compute()) == pytest.approx(float(theirs.loss.compute())) == 0.5
    assert float(ours.acc.compute()) == pytest.approx(2 / 3)  # masked, unlike Flax's (2 / 4)


def test_accuracy_is_carried_through_scan_and_fori_loop_fresh_or_reset():
    # Its empty() had k=None and an update k=1: JAX refused the carry ("must have the same
    # pytree structure"), naming neither the metric nor a fix.
    batches = {"logits": jnp.eye(3)[jnp.array([0, 1, 2, 0])], "labels": jnp.array([0, 1, 1, 2])}

    def carried(accuracy: mnnx.Accuracy) -> list[float]:
        graph, state = nnx.split(accuracy)

        def step(state, batch):
            metric = nnx.merge(graph, state)
            metric.update(logits=batch["logits"][None], labels=batch["labels"][None])
            return nnx.split(metric)[1]

        scanned = jax.lax.scan(lambda s, b: (step(s, b), None), state, batches)[0]
        looped = jax.lax.fori_loop(
            0, 4, lambda i, s: step(s, jax.tree.map(lambda x: x[i], batches)), state
        )
        return [float(nnx.merge(graph, s).compute()) for s in (scanned, looped)]

    accuracy = mnnx.Accuracy()
    assert carried(accuracy) == [0.5, 0.5]
    accuracy.update(logits=jnp.eye(2), labels=jnp.array([0, 0]))
    accuracy.reset()
    assert carried(accuracy) == [0.5, 0.5]


def test_a_fresh_precision_carried_by_a_loop_is_refused_naming_the_fix():
    """A fresh Metric(Precision, average="macro") carried by nnx.fori_loop failed with JAX's
    "carry input and carry output must have equal types" (true_positives float32[] against
    float32[3]), which names neither the metric nor the fix the README gives."""
    logits, labels = jnp.eye(3)[jnp.array([0, 1, 1])], jnp.array([0, 1, 2])

    def body(i, metric):
        metric.update(logits=logits, labels=labels)
        return metric

    message = (
        r"^Metric\(Precision\).update: inside {} the state's true_positives changes shape from "
        r"\(\) to \(3,\) \(a fresh or reset metric takes its per-class or per-bin shape from "
        r"its first batch\), which the loop's carry cannot do; update the metric once before "
        r"the loop carries it"
    )
    with pytest.raises(TypeError, match=message.format("nnx.fori_loop")):
        nnx.fori_loop(0, 2, body, mnnx.Metric(Precision, average="macro"))
    scan = nnx.scan(lambda m, i: (body(i, m), None), length=2)
    with pytest.raises(TypeError, match=message.format("nnx.scan")):
        scan(mnnx.Metric(Precision, average="macro"), jnp.arange(2))
    # Updated once first, as the README says, it is carried: per class, precision 1/1, 1/2,
    # 0/0 = 0 (class 2 is a label, so it counts in the macro average): (1 + 0.5 + 0) / 3.
    metric = mnnx.Metric(Precision, average="macro")
    metric.update(logits=logits, labels=labels)
    metric = nnx.fori_loop(0, 2, body, metric)
    assert int(metric.metric.true_positives.sum()) == 6
    assert float(metric.compute()) == pytest.approx((1 + 0.5 + 0) / 3)
    # Under nnx.jit, not a loop, a fresh one still takes its shape from its first batch.
    fresh = mnnx.Metric(Precision, average="macro")
    nnx.jit(lambda m: m.update(logits=logits, labels=labels))(fresh)
    assert float(fresh.compute()) == pytest.approx((1 + 0.5 + 0) / 3)


@pytest.mark.parametrize("fresh", [mnnx.Average, lambda: mnnx.Accuracy(threshold=0.0)])
def test_a_fresh_average_is_carried_by_fori_loop_and_scan_under_x64(fresh):
    # CLU's empty() count is int32, a batch's int64 under x64: JAX refused the carry ("count
    # has type int32[] but the corresponding output carry component has type int64[]").
    values = jnp.arange(12.0).reshape(4, 3) - 4.0  # 0 is a positive at threshold 0.0: 8 of 12

    def run(metric):
        def body(i, metric):
            metric.update(values=values[i], logits=values[i], labels=jnp.ones(3, jnp.int32))
            return metric

        scanned = nnx.scan(lambda m, i: (body(i, m), None), length=4)(metric, jnp.arange(4))
        return nnx.fori_loop(0, 4, body, fresh()), scanned[0]

    with jax.enable_x64(True):
        results = [float(m.compute()) for m in nnx.jit(run)(fresh())]
    assert results == [1.5, 1.5] if isinstance(fresh(), mnnx.Average) else [8 / 12, 8 / 12]


@pytest.mark.parametrize("fresh", [mnnx.Average, lambda: mnnx.Metric(clu_metrics.Std)])
def test_a_window_of_more_than_2_31_values_does_not_wrap_the_count(fresh):
    # CLU's Average and Std count in int32: 600 steps of 4M tokens wrapped it, and an average
    # of ones read -1.0 (count -2**31 + 3). Each batch still counts in int32, as update() does.
    metric = fresh()
    metric.update(values=jnp.ones(4))
    batch = metric.metric_type.from_model_output(jnp.ones(4)).replace(
        total=jnp.float32(2**31 - 1), count=jnp.int32(2**31 - 1)
    )
    if metric.metric_type is clu_metrics.Std:
        batch = batch.replace(sum_of_squares=jnp.float32(2**31 - 1))
    metric.state.set_value(metric.metric.merge(batch))
    assert metric.metric.count.dtype == jnp.float32
    assert float(metric.metric.count) == 2.0**31  # 2**31 + 3, rounded to float32
    assert float(metric.compute()) == (1.0 if isinstance(metric, mnnx.Average) else 0.0)


@pytest.mark.parametrize("order", ["logits first", "logits last"])
@pytest.mark.parametrize("argnames", [None, {"probs": "predictions"}])
def test_predictions_given_beside_logits_are_the_ones_auroc_reads(order, argnames):
    # logits= stood for predictions= even where predictions= (or a name mapped to it) came
    # too: the later keyword won, and AUROC of the logits was NaN under jit (refused eagerly).
    logits = jnp.array([-2.0, -0.5, 1.5, 0.8])
    given = {"predictions" if argnames is None else "probs": jax.nn.sigmoid(logits)}
    arguments = (
        {"logits": logits, **given} if order == "logits first" else {**given, "logits": logits}
    )
    for run in (lambda m, a: m.update(**a), nnx.jit(lambda m, a: m.update(**a))):
        metrics = mnnx.MultiMetric(
            acc=mnnx.Accuracy(threshold=0.0), auroc=mnnx.Metric(AUROC, argnames=argnames)
        )
        run(metrics, {**arguments, "labels": jnp.array([0, 0, 1, 1])})
        assert {k: float(v) for k, v in metrics.compute().items()} == {"acc": 1.0, "auroc": 1.0}


def test_argmax_accuracy_reads_logits_beside_another_metrics_predictions():
    # Accuracy() took AUROC's probabilities (predictions=) for its logits, and raised on
    # their shape; Flax's Accuracy reads logits= always.
    metrics = mnnx.MultiMetric(acc=mnnx.Accuracy(), auroc=mnnx.Metric(AUROC))
    logits, labels = jnp.array([[2.0, 0.0], [0.0, 2.0], [0.0, 2.0]]), jnp.array([0, 1, 0])
    for run in (lambda m, a: m.update(**a), nnx.jit(lambda m, a: m.update(**a))):
        metrics.reset()
        run(
            metrics, {"logits": logits, "predictions": jnp.array([0.1, 0.9, 0.4]), "labels": labels}
        )
        assert {k: float(v) for k, v in metrics.compute().items()} == pytest.approx(
            {"acc": 2 / 3, "auroc": 1.0}
        )


def test_an_update_with_predictions_and_logits_gives_the_metric_its_predictions():
    # FBeta.from_model_output refuses both (a CLU Collection passes logits= as the scores);
    # update() passes it predictions= alone, as before, where predictions= come.
    metrics = mnnx.MultiMetric(f1=mnnx.Metric(FBeta), auroc=mnnx.Metric(AUROC))
    probs, labels = jnp.array([0.1, 0.9, 0.4, 0.6]), jnp.array([0, 1, 1, 1])
    metrics.update(predictions=probs, logits=jnp.zeros((4, 3)), labels=labels)
    # F1 at 0.5: tp 2, fp 0, fn 1, so 4 / 5; AUROC: 1 (0.1 below every positive).
    assert {k: float(v) for k, v in metrics.compute().items()} == pytest.approx(
        {"f1": 0.8, "auroc": 1.0}
    )


def test_bad_or_missing_settings_are_refused_when_the_metric_is_made():
    """They failed at the first update(), possibly inside a compiled step; `k` missing read
    "pass them to update()", and `k=0` "choose a smaller k"."""
    cases = [
        (
            lambda: mnnx.Metric(TopKAccuracy),
            TypeError,
            r"^Metric\(TopKAccuracy\): missing setting\(s\) \['k'\]; pass them here, e.g. "
            r"Metric\(TopKAccuracy, k=...\)$",
        ),
        (
            lambda: mnnx.Metric(TopKAccuracy, k=0),
            ValueError,
            "^TopKAccuracy: k must be at least 1, got 0$",
        ),
        (
            lambda: mnnx.Metric(TopKAccuracy, k=2.0),
            TypeError,
            "^TopKAccuracy: k must be an int, got float 2.0$",
        ),
        (
            lambda: mnnx.Metric(Precision, average="weighted"),
            ValueError,
            r"^Precision: average must be one of \('binary', 'micro', 'macro'\), got 'weighted'$",
        ),
        (
            lambda: mnnx.Metric(FBeta, beta=0),
            ValueError,
            "^FBeta: beta must be a finite number > 0, got 0$",
        ),
        (
            lambda: mnnx.Metric(FBeta, beta="2"),
            TypeError,
            "^FBeta: beta must be a Python number, got str '2'$",
        ),
        (
            lambda: mnnx.Metric(Precision, threshold=float("nan")),
            ValueError,
            "^Precision: threshold must be a number, got NaN$",
        ),
        (
            lambda: mnnx.Metric(AUROC, num_bins=0),
            ValueError,
            "^AUROC: num_bins must be at least 1, got 0$",
        ),
    ]
    for make, error, message in cases:
        with pytest.raises(error, match=message):
            make()
    # Good settings still work, and a fresh FBeta carries from_model_output's beta=1.0, so
    # its pytree structure (static fields) is that of an updated one: no carry mismatch.
    fresh = mnnx.Metric(FBeta, average="macro")
    before = jax.tree.structure(fresh.metric)
    fresh.update(logits=jnp.eye(3), labels=jnp.array([0, 1, 1]))
    assert jax.tree.structure(fresh.metric) == before and fresh.metric.beta == 1.0
    assert float(fresh.compute()) == pytest.approx((1 + 2 / 3 + 0) / 3)


def test_missing_arguments_are_named_as_the_caller_passes_them():
    # The message said "missing 'predictions'" to a caller who passes logits=.
    with pytest.raises(TypeError, match=r"member 'acc': .*missing 'logits' or 'predictions' "):
        mnnx.MultiMetric(loss=mnnx.Average(), acc=mnnx.Accuracy()).update(
            values=jnp.ones(2), labels=jnp.array([0, 1])
        )
    with pytest.raises(TypeError, match=r"missing 'labels', 'logits' or 'predictions' among"):
        mnnx.Metric(TopKAccuracy, k=1).update(values=jnp.ones(2))


def test_clu_std_computes_with_its_formula():
    # clu 0.0.12's Std.compute() calls jnp.clip(a_min=...), which current JAX refuses.
    std = mnnx.Metric(clu_metrics.Std)
    std.update(values=jnp.array([1.0, 2.0, 3.0, 4.0]))
    assert float(std.compute()) == pytest.approx(np.std([1.0, 2.0, 3.0, 4.0]), rel=1e-6)


def test_a_multimetric_member_refusing_its_arguments_is_named():
    metrics = mnnx.MultiMetric(
        f1_macro=mnnx.Metric(FBeta, average="macro"), f1=mnnx.Metric(FBeta), acc=mnnx.Accuracy()
    )
    with pytest.raises(ValueError, match="^MultiMetric member 'f1': FBeta.from_model_output: "):
        metrics.update(logits=jnp.zeros((4, 3)), labels=jnp.array([0, 1, 2, 1]))
    metrics = mnnx.MultiMetric(loss=mnnx.Average(), acc=mnnx.Accuracy())
    with pytest.raises(TypeError, match="^MultiMetric member 'acc': .*labels.astype"):
        metrics.update(values=jnp.ones(4), logits=jnp.zeros((4, 3)), labels=jnp.zeros(4))
    assert np.isnan(float(metrics.loss.compute()))  # the refused batch: in no member
    # Flax's per-member mask dict still reaches each member.
    metrics = mnnx.MultiMetric(a=mnnx.Average(), b=mnnx.Average())
    values = jnp.array([1.0, 3.0])
    metrics.update(values=values, mask={"a": jnp.array([True, False])})
    assert {k: float(v) for k, v in metrics.compute().items()} == {"a": 1.0, "b": 2.0}


def _statistics(stats):
    return [float(stats.mean), float(stats.standard_error_of_mean), float(stats.standard_deviation)]


def test_welford_reproduces_flax_documented_example():
    ours, theirs = mnnx.Welford(), nnx.metrics.Welford()
    mean, sem, std = _statistics(ours.compute())
    assert mean == 0.0 and np.isnan(sem) and np.isnan(std)
    expected = [[2.5, 0.559017, 1.118034], [2.0, 0.43301272, 1.2247449]]
    for batch, numbers in zip([BATCH_1, BATCH_2], expected, strict=True):
        ours.update(values=batch)
        theirs.update(values=batch)
        np.testing.assert_allclose(_statistics(ours.compute()), numbers, rtol=1e-6)
        np.testing.assert_allclose(
            _statistics(ours.compute()), _statistics(theirs.compute()), rtol=1e-6
        )
    assert isinstance(ours.compute(), nnx.metrics.Statistics)
    ours.reset()
    mean, sem, std = _statistics(ours.compute())
    assert mean == 0.0 and np.isnan(sem) and np.isnan(std)


def test_welford_over_microbatches_equals_flax_welford_over_the_batch():
    values = jnp.arange(16.0) ** 1.5

    def loss_fn(_, batch):
        return jnp.zeros(()), {"stats": metrics_manager.Welford.from_model_output(batch)}

    merged = accumulate_grads_microbatched(loss_fn, 0.0, values, 4)[1]["stats"]
    theirs = nnx.metrics.Welford()
    theirs.update(values=values)
    stats = _statistics(theirs.compute())
    np.testing.assert_allclose([merged.compute(), merged.sem(), merged.std()], stats, rtol=1e-6)


def test_accuracy_equals_flax_accuracy_on_random_logits():
    ours, theirs = mnnx.Accuracy(), nnx.metrics.Accuracy()
    key, correct = jax.random.key(0), 0
    for i in range(3):
        logits = jax.random.normal(jax.random.fold_in(key, i), (16, 5))
        labels = jax.random.randint(jax.random.fold_in(key, 10 + i), (16,), 0, 5)
        mask = jnp.arange(16) % 3 != i
        for metric in (ours, theirs):
            metric.update(logits=logits, labels=labels, mask=mask)
        assert float(ours.compute()) == pytest.approx(float(theirs.compute()), abs=1e-7)
        correct += int(jnp.sum((jnp.argmax(logits, -1) == labels) & mask))
    assert isinstance(ours.metric, TopKAccuracy)
    # Unmasked: 10 + 11 + 11 of the 3 x 16 (every third one left out, from 0, 1 and 2).
    assert (int(ours.metric.count), int(ours.metric.correct)) == (32, correct)
    # Flax's binary example: random logits against a threshold.
    binary, flax_binary = mnnx.Accuracy(threshold=0.5), nnx.metrics.Accuracy(threshold=0.5)
    logits3, labels3 = jax.random.normal(jax.random.key(2), (5,)), jnp.array([0, 1, 0, 1, 1])
    binary.update(logits=logits3, labels=labels3)
    flax_binary.update(logits=logits3, labels=labels3)
    assert float(binary.compute()) == float(flax_binary.compute())


def test_one_hot_labels_are_refused_naming_argmax():
    # Flax's examples pass one-hot labels to optax.softmax_cross_entropy: the message said
    # only "cast them with labels.astype(jnp.int32)", which reads them as binary labels.
    logits = jnp.array([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0]])
    one_hot = jnp.eye(3)[jnp.array([0, 2, 2])]
    for metric in (mnnx.Accuracy(), mnnx.Metric(FBeta, average="macro")):
        with pytest.raises(TypeError, match=r"one-hot labels' labels\.argmax\(-1\)"):
            metric.update(logits=logits, labels=one_hot)
        metric.update(logits=logits, labels=one_hot.argmax(-1))
    assert float(metric.compute()) == pytest.approx((1 + 0 + 2 / 3) / 3)  # F1 per class


def test_a_threshold_compares_bfloat16_scores_in_float32():
    # 0.7 compared with bfloat16 scores rounded to 0.69921875 first: that score, below 0.7,
    # counted as a positive (accuracy 0.5 where Precision's threshold reads it as negative).
    accuracy = mnnx.Accuracy(threshold=0.7)
    accuracy.update(logits=jnp.array([0.69921875, 0.75], jnp.bfloat16), labels=jnp.array([0, 1]))
    assert float(accuracy.compute()) == 1.0


def test_a_threshold_may_be_a_numpy_number_as_precision_takes_it():
    # np.float32(0.5) was refused ("threshold must be a float or None, got float32"), while
    # Precision took the same threshold; a NaN one was taken and read every score as negative.
    accuracy = mnnx.Accuracy(threshold=np.float32(0.6))
    assert type(accuracy.threshold) is float
    accuracy.update(logits=jnp.array([0.55, 0.65, 0.2]), labels=jnp.array([1, 1, 0]))
    assert float(accuracy.compute()) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match=r"^Accuracy: threshold must be a number, got NaN$"):
        mnnx.Accuracy(threshold=float("nan"))
    with pytest.raises(TypeError, match=r"threshold must be a float or None, got str"):
        mnnx.Accuracy(threshold="0.5")


def make_multi():
    return mnnx.MultiMetric(
        loss=mnnx.Average(),
        accuracy=mnnx.Accuracy(),
        f1=mnnx.Metric(FBeta, average="macro"),
        stats=mnnx.Welford(),
    )


def batches():
    rng = np.random.default_rng(1)
    for _ in range(3):
        yield {
            "values": rng.standard_normal(8).astype(np.float32),
            "logits": rng.standard_normal((8, 4)).astype(np.float32),
            "labels": rng.integers(0, 4, 8).astype(np.int32),
        }


def flat(values):
    """{'stats.mean': 0.1, ...}: every number of a compute() result, by its path."""
    leaves = jax.tree_util.tree_flatten_with_path(values)[0]
    return {jax.tree_util.keystr(p, simple=True, separator="."): float(x) for p, x in leaves}


def test_multimetric_state_is_carried_through_jax_jit_and_nnx_jit():
    eager = make_multi()
    for batch in batches():
        eager.update(**batch)
    expected = flat(eager.compute())
    assert set(expected) == {
        "loss",
        "accuracy",
        "f1",
        "stats.mean",
        "stats.standard_error_of_mean",
        "stats.standard_deviation",
    }

    @jax.jit
    def step(metrics, batch):  # functional: the facade is a pytree
        metrics.update(**batch)
        return metrics

    carried = make_multi()
    for batch in batches():
        carried = step(carried, batch)
    assert flat(carried.compute()) == pytest.approx(expected, rel=1e-6)

    @nnx.jit
    def nnx_step(metrics, batch):  # in place, as Flax's examples do
        metrics.update(**batch)

    in_place = make_multi()
    for batch in batches():
        nnx_step(in_place, batch)
    assert flat(in_place.compute()) == pytest.approx(expected, rel=1e-6)
    # And the f1 state is the library's mergeable metric, with per-class counts.
    assert isinstance(in_place.f1.metric, FBeta) and in_place.f1.metric.true_positives.shape == (4,)


def test_facade_metrics_work_inside_flax_own_multimetric():
    metrics = nnx.MultiMetric(top2=mnnx.Metric(TopKAccuracy, k=2), loss=nnx.metrics.Average())
    logits = jnp.array([[0.5, 0.3, 0.2], [0.1, 0.3, 0.6]])
    metrics.update(logits=logits, labels=jnp.array([1, 0]), values=jnp.array([1.0, 3.0]))
    assert {k: float(v) for k, v in metrics.compute().items()} == {"top2": 0.5, "loss": 2.0}


def test_facade_errors_name_the_problem():
    with pytest.raises(TypeError, match="metric_type must be a clu.metrics.Metric subclass"):
        mnnx.Metric(FBeta.empty())
    with pytest.raises(TypeError, match=r"missing 'labels' among the arguments \['logits'\]"):
        mnnx.Metric(FBeta, average="micro").update(logits=jnp.zeros((2, 3)))
    with pytest.raises(TypeError, match=r"'loss': expected a flax.nnx.metrics.Metric, got float"):
        mnnx.MultiMetric(loss=1.0)
    with pytest.raises(ValueError, match="'update' cannot name a metric"):
        mnnx.MultiMetric(update=mnnx.Average())


def test_as_summary_metrics_of_flax_multimetric():
    metrics = nnx.MultiMetric(
        loss=nnx.metrics.Average(), accuracy=nnx.metrics.Accuracy(), stats=nnx.metrics.Welford()
    )
    metrics.update(values=BATCH_1, logits=jnp.eye(4), labels=jnp.array([0, 1, 0, 0]))
    summary = metrics_manager.as_summary_metrics(metrics)
    assert {k: type(v) for k, v in summary.items()} == {
        "loss": clu_metrics.Average,
        "accuracy": clu_metrics.Average,
        "stats": metrics_manager.Welford,
    }
    values = {k: float(v.value) for k, v in compute_metric_values(summary).items()}
    assert values == pytest.approx(
        {"loss": 2.5, "accuracy": 0.5, "stats": 2.5, "stats/sem": 0.559017, "stats/std": 1.118034},
        rel=1e-6,
    )


def test_as_summary_metrics_of_our_multimetric_gives_mergeable_metrics():
    metrics, more = make_multi(), make_multi()
    for metric, batch in zip([metrics, more, more], batches(), strict=True):
        metric.update(**batch)
    a, b = mnnx.as_summary_metrics(metrics), mnnx.as_summary_metrics(more)
    assert isinstance(a["f1"], FBeta) and isinstance(a["stats"], metrics_manager.Welford)
    merged = merge_metrics(a, b)
    everything = make_multi()
    for batch in batches():
        everything.update(**batch)
    expected = compute_metric_values(mnnx.as_summary_metrics(everything))
    got = compute_metric_values(merged)
    assert set(got) == {"loss", "accuracy", "f1", "stats", "stats/sem", "stats/std"}
    for key, value in expected.items():
        np.testing.assert_allclose(got[key].value, value.value, rtol=1e-5, err_msg=key)


def test_as_summary_metrics_of_a_compute_dict_and_metrax_wrappers():
    metrics = nnx.MultiMetric(loss=nnx.metrics.Average(), stats=nnx.metrics.Welford())
    metrics.update(values=BATCH_2)
    summary = mnnx.as_summary_metrics({**metrics.compute(), "extra": {"lr": 0.1}})
    assert all(isinstance(v, clu.values.Scalar) for v in summary.values())
    assert {k: float(v.value) for k, v in summary.items()} == pytest.approx(
        {"loss": 1.5, "stats": 1.5, "stats/sem": 0.559017, "stats/std": 1.118034, "extra/lr": 0.1},
        rel=1e-6,
    )
    wrapped = nnx.MultiMetric(avg=metrax_nnx.Average())
    wrapped.update(values=jnp.array([1.0, 2.0]))
    assert float(mnnx.as_summary_metrics(wrapped)["avg"].compute()) == 1.5
    with pytest.raises(
        ValueError, match=r"'v': expected one number, got ArrayImpl of shape \(2,\)"
    ):
        mnnx.as_summary_metrics({"v": jnp.ones(2)})
    with pytest.raises(TypeError, match="expected an nnx.MultiMetric or the dict"):
        mnnx.as_summary_metrics(mnnx.Average())


def test_a_dict_of_nnx_metrics_is_read_as_a_multimetric():
    loss, stats = nnx.metrics.Average(), mnnx.Welford()
    loss.update(values=BATCH_1)
    stats.update(values=BATCH_2)
    summary = mnnx.as_summary_metrics({"loss": loss, "eval": {"stats": stats}})
    assert {k: type(v) for k, v in summary.items()} == {
        "loss": clu_metrics.Average,
        "eval/stats": metrics_manager.Welford,
    }
    values = {k: float(v.value) for k, v in compute_metric_values(summary).items()}
    assert values == pytest.approx(
        {"loss": 2.5, "eval/stats": 1.5, "eval/stats/sem": 0.559017, "eval/stats/std": 1.118034},
        rel=1e-6,
    )


def test_summary_values_are_written_to_jsonl_and_read_back(tmp_path):
    metrics = nnx.MultiMetric(loss=nnx.metrics.Average(), stats=mnnx.Welford())
    metrics.update(values=BATCH_1)
    summary = mnnx.as_summary_metrics(metrics)
    values = compute_metric_values(summary)
    path = tmp_path / "metrics.jsonl"
    writer = writers.JsonlWriter(path, clock=lambda: 1.0)
    writers.write_values(writer, 7, values)
    writer.close()
    (line,) = path.read_text().splitlines()
    record = json.loads(line)
    assert record["step"] == 7
    assert {k: record[k] for k in values} == pytest.approx(
        {"loss": 2.5, "stats": 2.5, "stats/sem": 0.559017, "stats/std": 1.118034}, rel=1e-6
    )


def test_flax_average_and_accuracy_are_written_as_clu_average_is(tmp_path):
    """Flax's state, a float32 total over an int32 count, is written as CLU's Average is: the
    host copies divided in float64 (compute() on the device divides in float32, 0.6666667 for
    2/3). A count wrapped past int32's range is refused, not written."""
    metrics = nnx.MultiMetric(loss=nnx.metrics.Average(), accuracy=nnx.metrics.Accuracy())
    metrics.update(
        values=jnp.array([0.1, 0.2, 0.4]), logits=jnp.eye(3), labels=jnp.array([0, 1, 0])
    )
    total = float(np.float32(0.1) + np.float32(0.2) + np.float32(0.4))  # Flax's float32 sum
    expected = {"m/loss": total / 3, "m/accuracy": 2 / 3}
    wrapped = nnx.metrics.Accuracy()
    wrapped.total.set_value(jnp.float32(0.75 * 4 * 2**20))
    wrapped.count.set_value(jnp.int32(600 * 4 * 2**20 - 2**32))  # -1,778,384,896
    clu = {"m/loss": clu_metrics.Average(total=np.float32(total), count=np.int32(3))}
    with metrics_manager.MetricsManager(
        "train", tmp_path, writer_factory=lambda d: writers.JsonlWriter(d)
    ) as manager:
        manager.write_metrics_summary({"m": metrics, "wrapped": wrapped}, 1, num_steps=1)
        manager.write_metrics_summary(clu, 2, num_steps=1)
    errors = [(f.source, type(f.error).__name__) for f in manager.errors]
    first, second = writers.read_jsonl(tmp_path / "train")
    assert {k: first[k] for k in expected} == expected
    assert second["m/loss"] == first["m/loss"]
    assert "wrapped" not in first
    assert errors == [("metric:wrapped", "OverflowError")]


def test_accuracy_and_top_k_accuracy_are_computed_on_the_host_as_compute_gives(tmp_path):
    """The worker computed their host copies with jnp: each summary sent them to the device
    and back, and its value was a JAX Array. NumPy gives the same float32 values now."""
    metrics = mnnx.MultiMetric(
        accuracy=mnnx.Accuracy(), top2=mnnx.Metric(TopKAccuracy, k=2), empty=mnnx.Accuracy()
    )
    logits = jnp.array([[0.5, 0.3, 0.2], [0.1, 0.3, 0.6], [0.2, 0.5, 0.3]])
    metrics.accuracy.update(logits=logits, labels=jnp.array([0, 1, 1]))
    metrics.top2.update(logits=logits, labels=jnp.array([1, 0, 2]))
    computed = {k: float(v) for k, v in metrics.compute().items()}
    assert computed == pytest.approx(
        {"accuracy": 2 / 3, "top2": 2 / 3, "empty": np.nan}, nan_ok=True
    )
    with metrics_manager.MetricsManager(
        "train", tmp_path, writer_factory=lambda d: writers.JsonlWriter(d)
    ) as manager:
        summary = manager.write_metrics_summary(metrics, 1, num_steps=1).result()
    assert {k: type(v.value) for k, v in summary.items()} == dict.fromkeys(computed, np.float32)
    assert {k: float(v.value) for k, v in summary.items()} == pytest.approx(
        computed, rel=0, abs=0, nan_ok=True
    )
    (line,) = writers.read_jsonl(tmp_path / "train")
    assert (line["accuracy"], line["top2"]) == (computed["accuracy"], computed["top2"])
    # No device work: host copies compute under a guard refusing any transfer.
    nan_score = TopKAccuracy(correct=2.0, count=3.0, outside=1.0, k=1)
    host = [jax.device_get(m) for m in (metrics.accuracy.metric, metrics.top2.metric, nan_score)]
    with jax.transfer_guard("disallow"):
        values = [m.compute() for m in host]
    assert [type(v) for v in values] == [np.float32] * 3
    assert values[:2] == [computed["accuracy"], computed["top2"]] and np.isnan(values[2])


def test_as_summary_metrics_refuses_a_key_written_twice():
    # A Statistics 'stats' writes 'stats/std'; a second 'stats/std' silently replaced it
    # (or was replaced), depending on the dict's order.
    stats = nnx.metrics.Statistics(mean=1.0, standard_error_of_mean=2.0, standard_deviation=3.0)
    for obj in ({"stats": stats, "stats/std": 99.0}, {"a": {"b": 1.0}, "a/b": 2.0}):
        with pytest.raises(ValueError, match=r"keys \['(stats/std|a/b)'\] are written twice"):
            metrics_manager.as_summary_metrics(obj)


def test_the_state_of_split_metrics_is_refused_and_merged_ones_are_written(tmp_path):
    """A loop carrying `nnx.split`'s state through `jax.jit`: that state, passed as it is,
    was written as Flax's raw fields ('loss/total' 6.0, 'loss/count' 4, 'w/m2' 5.0)."""
    metrics = nnx.MultiMetric(loss=nnx.metrics.Average(), w=nnx.metrics.Welford())
    graphdef, state = nnx.split(metrics)

    @jax.jit
    def step(state, values):
        metrics = nnx.merge(graphdef, state)
        metrics.update(values=values)
        return nnx.state(metrics)

    state = step(state, jnp.arange(4.0))
    with metrics_manager.MetricsManager(
        "train", tmp_path, writer_factory=lambda d: writers.JsonlWriter(d)
    ) as manager:
        for obj in (state, {"train": state}, {"total": state["loss"]["total"]}):
            with pytest.raises(TypeError, match=r"(?s)expected metrics, got .*nnx.merge\(graphdef"):
                manager.write_metrics_summary(obj, 1, num_steps=1)
        # Other variables are numbers as before: an optimizer's step count.
        count = nnx.Optimizer(nnx.Linear(1, 1, rngs=nnx.Rngs(0)), optax.sgd(0.1), wrt=nnx.Param)
        metrics = nnx.merge(graphdef, state)
        manager.write_metrics_summary({"m": metrics, "opt_step": count.step}, 2, num_steps=1)
    (line,) = writers.read_jsonl(tmp_path / "train")
    assert {k: v for k, v in line.items() if k not in ("time", "collection")} == pytest.approx(
        {
            "step": 2,
            "m/loss": 1.5,
            "m/w": 1.5,
            "m/w/sem": np.sqrt(1.25 / 4),
            "m/w/std": np.sqrt(1.25),
            "opt_step": 0,
        }
    )


@pytest.mark.parametrize(
    "metric", [nnx.metrics.Average(), nnx.metrics.Welford(), mnnx.Average(), mnnx.Accuracy()]
)
def test_one_nnx_metric_passed_alone_is_refused_naming_how_to_name_it(tmp_path, metric):
    # write_metrics_summary(average, ...) said "got Average" and no fix: one metric has no
    # key to write under, which a dict or a MultiMetric gives it.
    with metrics_manager.MetricsManager(
        "train", tmp_path, writer_factory=lambda d: writers.JsonlWriter(d)
    ) as manager:
        with pytest.raises(TypeError) as raised:
            manager.write_metrics_summary(metric, 1, num_steps=1)
        assert f"got {type(metric).__name__} (one NNX metric" in str(raised.value)
        assert "{'loss': metric} or nnx.MultiMetric(loss=metric)" in str(raised.value)
        metric.update(values=jnp.arange(4.0), logits=jnp.eye(4), labels=jnp.arange(4))
        manager.write_metrics_summary({"loss": metric}, 2, num_steps=1)
    (line,) = writers.read_jsonl(tmp_path / "train")
    assert line["step"] == 2
    assert line["loss"] == pytest.approx(1.0 if isinstance(metric, mnnx.Accuracy) else 1.5)


def test_metrics_donated_by_nnx_jit_name_reset_and_a_reset_loop_writes_each_window(tmp_path):
    @nnx.jit(donate_argnums=0)
    def step(metrics, values):
        metrics.update(values=values)

    metrics = nnx.MultiMetric(loss=mnnx.Average(), flax_loss=nnx.metrics.Average())
    step(metrics, jnp.arange(4.0))
    summary = mnnx.as_summary_metrics(metrics)
    step(metrics, jnp.arange(4.0))  # no reset(): the summary's arrays were donated
    with metrics_manager.MetricsManager(
        "train", tmp_path, writer_factory=lambda d: writers.JsonlWriter(d)
    ) as manager:
        error = manager.write_metrics_summary(summary, 1, num_steps=1).exception()
        # The fix named was `running = None`, which an NNX loop does not have.
        assert "(NNX metrics: `metrics.reset()`)" in str(error)
        metrics.reset()
        for window, start in ((2, 0.0), (3, 10.0)):
            step(metrics, jnp.arange(start, start + 4.0))
            manager.write_metrics_summary(metrics, window, num_steps=1)
            metrics.reset()  # the next step donates the fresh state, not the summary's
    assert [
        (line["step"], line["loss"], line["flax_loss"])
        for line in writers.read_jsonl(tmp_path / "train")
    ] == [(2, 1.5, 1.5), (3, 11.5, 11.5)]


def test_a_loop_that_forgets_reset_is_warned_once_and_one_that_resets_never(
    tmp_path, caplog, monkeypatch
):
    # Without reset() after a summary, a loop that does not donate wrote cumulative windows
    # (losses 1, 3, 5 read 1, 2, 3) and nothing said so.
    monkeypatch.setattr(mnnx, "_SUMMARIZED", weakref.WeakKeyDictionary(), raising=False)
    monkeypatch.setattr(mnnx, "_CHECK_RESET", [True], raising=False)

    @nnx.jit
    def step(metrics, values):
        metrics.update(values=values)

    for run, resets in (("resets", True), ("forgets", False)):
        metrics = nnx.MultiMetric(loss=mnnx.Average())
        with metrics_manager.MetricsManager(
            run, tmp_path, writer_factory=lambda d: writers.JsonlWriter(d)
        ) as manager:
            for window, loss in enumerate((1.0, 3.0, 5.0), 1):
                step(metrics, jnp.full(4, loss))
                manager.write_metrics_summary(metrics, window, num_steps=1)
                if resets:
                    metrics.reset()
    read = {
        run: [line["loss"] for line in writers.read_jsonl(tmp_path / run)]
        for run in ("resets", "forgets")
    }
    assert read == {"resets": [1.0, 3.0, 5.0], "forgets": [1.0, 2.0, 3.0]}
    warned = [r.getMessage() for r in caplog.records if "without a reset()" in r.getMessage()]
    assert warned == [
        "as_summary_metrics: 'loss' was updated since its last summary without a reset(), so "
        "this summary also holds the windows already written (averages are cumulative). "
        "Call metrics.reset() after each write_metrics_summary."
    ]


def test_a_summary_of_metrics_still_empty_is_no_window_a_reset_was_forgotten_after(
    caplog, monkeypatch
):
    # A summary at step 0, before any update (or right after a reset), writes no window, so
    # the loop's first window after it repeats none; it was warned about as a forgotten reset.
    monkeypatch.setattr(mnnx, "_SUMMARIZED", weakref.WeakKeyDictionary(), raising=False)
    monkeypatch.setattr(mnnx, "_CHECK_RESET", [True], raising=False)

    @nnx.jit
    def step(metrics, values):
        metrics.update(values=values)

    def summary(metrics):
        return float(mnnx.as_summary_metrics(metrics)["loss"].compute())

    fresh, reset = nnx.MultiMetric(loss=mnnx.Average()), nnx.MultiMetric(loss=mnnx.Average())
    step(reset, jnp.full(4, 9.0))
    reset.reset()
    read = {"fresh": [], "reset": []}
    for name, metrics in (("fresh", fresh), ("reset", reset)):
        summary(metrics)  # nothing seen yet: NaN
        for loss in (1.0, 3.0):
            step(metrics, jnp.full(4, loss))
            read[name].append(summary(metrics))
            metrics.reset()
    assert read == {"fresh": [1.0, 3.0], "reset": [1.0, 3.0]}
    assert "without a reset()" not in caplog.text
    step(fresh, jnp.full(4, 5.0))
    summary(fresh)
    step(fresh, jnp.full(4, 7.0))
    assert summary(fresh) == 6.0  # cumulative: this one is warned about
    assert caplog.text.count("without a reset()") == 1


@pytest.mark.parametrize("policy", ["warn", "stop"])
def test_a_reset_before_the_summary_call_is_named_with_the_keys_it_empties(
    tmp_path, caplog, policy
):
    """A loop calling metrics.reset() before write_metrics_summary wrote NaN for every window,
    told only "non-finite values at step 1 for ['m/flax_loss', 'm/loss']"."""

    @nnx.jit
    def step(metrics, values):
        metrics.update(values=values)

    metrics = nnx.MultiMetric(loss=mnnx.Average(), flax_loss=nnx.metrics.Average())
    cause = (
        "['m/flax_loss', 'm/loss'] hold no values (a count of 0: nothing was merged into them "
        "since they were made or reset), so they read NaN. An NNX loop that calls "
        "metrics.reset() before write_metrics_summary writes this for every window: call "
        "metrics.reset() after it (the summary reads the metrics at the call)"
    )
    manager = metrics_manager.MetricsManager(
        "train", tmp_path, nonfinite=policy, writer_factory=lambda d: writers.JsonlWriter(d)
    )
    step(metrics, jnp.arange(4.0))
    metrics.reset()
    nan = metrics_manager.Sum(np.float32(np.nan))  # a NaN of its own: no count to name
    manager.write_metrics_summary({"m": metrics, "nan": nan}, 1, num_steps=1).result()
    errors = [str(f.error) for f in manager.errors]
    if policy == "stop":
        with pytest.raises(metrics_manager.MetricsManagerError, match="hold no values"):
            manager.close()
    manager.close()
    (line,) = writers.read_jsonl(tmp_path / "train")
    assert (line["m/loss"], line["m/flax_loss"], line["nan"]) == ("NaN",) * 3
    warned = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    if policy == "warn":
        assert errors == []
        assert warned == [
            "MetricsManager 'train': non-finite values at step 1 for "
            f"['m/flax_loss', 'm/loss', 'nan']; {cause}"
        ]
    else:
        assert errors == [
            "non-finite values in the summary window ending at step 1 for keys "
            f"['m/flax_loss', 'm/loss', 'nan']; the run was stopped by nonfinite='stop'; {cause}"
        ]


class _FlaxPerplexity(nnx.metrics.Average):
    def compute(self):
        return jnp.exp(super().compute())


class _OurPerplexity(mnnx.Average):
    def compute(self):
        return jnp.exp(super().compute())


def test_a_subclass_computing_its_own_value_is_written_as_it_computes(tmp_path):
    """A perplexity as `exp` of an `Average`: the state's Average (2.0) was written, not
    what compute() gives (e**2)."""
    metrics = nnx.MultiMetric(ppl=_FlaxPerplexity("nll"), ppl2=_OurPerplexity("nll"))
    metrics.update(nll=jnp.array([1.0, 2.0, 3.0]))
    with metrics_manager.MetricsManager(
        "train", tmp_path, writer_factory=lambda d: writers.JsonlWriter(d)
    ) as manager:
        manager.write_metrics_summary(metrics, 1, num_steps=1)
    (line,) = writers.read_jsonl(tmp_path / "train")
    assert line["ppl"] == line["ppl2"] == pytest.approx(float(np.exp(2.0)), rel=1e-6)


def test_vmapped_metrics_are_refused_at_the_call_naming_the_key():
    @nnx.vmap(in_axes=0, out_axes=0)
    def make(_):
        return nnx.MultiMetric(
            loss=nnx.metrics.Average(),
            mine=mnnx.Welford(),
            theirs=nnx.metrics.Welford(),
            top=mnnx.Metric(TopKAccuracy, k=1),
            precision=mnnx.Metric(Precision, average="macro"),
            auroc=mnnx.Metric(AUROC),
        )

    ensemble = make(jnp.arange(4))

    @nnx.vmap(in_axes=(0, None, None))
    def update(metrics, logits, labels):
        metrics.precision.update(logits=logits, labels=labels)
        metrics.auroc.update(predictions=logits[:, 1], labels=labels)

    update(ensemble, jnp.eye(2)[jnp.array([0, 1, 1])], jnp.array([0, 1, 0]))
    with pytest.raises(ValueError) as info:
        metrics_manager.as_summary_metrics(ensemble)
    message = str(info.value)
    assert "'loss': Average holds scalars, but this one holds arrays of shape (4,)" in message
    assert "'mine': Welford holds scalars" in message and "nnx.vmap" in message
    assert "'theirs': Welford holds scalars" in message
    assert "'top': Metric(TopKAccuracy) holds scalars" in message
    # Per-class or per-bin counts: their one scalar (`outside`) shows the members.
    assert "'precision': Metric(Precision) holds one set of counts, but this one holds " in message
    assert "'auroc': Metric(AUROC) holds one set of counts, but this one holds arrays" in message


def test_settings_that_from_model_output_does_not_take_are_refused():
    with pytest.raises(TypeError, match=r"Metric\(FBeta\): unknown setting\(s\) \['Beta'\]"):
        mnnx.Metric(FBeta, Beta=2.0)
    # Model outputs are not settings: Perplexity's message listed them as its settings.
    with pytest.raises(TypeError) as info:
        mnnx.Metric(Perplexity, k=2)
    assert str(info.value) == (
        "Metric(Perplexity): unknown setting(s) ['k']; Perplexity.from_model_output takes no "
        "settings (['labels', 'mask', 'predictions'] are model outputs, for update())"
    )
    with pytest.raises(TypeError, match=r"takes the settings \['k'\] \(\['labels', 'mask', 'pr"):
        mnnx.Metric(TopKAccuracy, K=3)
    with pytest.raises(TypeError, match=r"Metric\(FBeta\): unknown setting\(s\) \['avg'\]"):
        mnnx.Metric(FBeta, avg="macro")  # FBeta takes other keywords: its settings still count
    # A from_fun metric takes any keyword: its settings are the function's.
    top2 = clu_metrics.Average.from_fun(
        lambda logits, labels, k, **_: (
            (jnp.argsort(-logits, -1)[..., :k] == labels[..., None]).any(-1).astype(jnp.float32)
        )
    )
    hit = mnnx.Metric(top2, k=2)
    hit.update(logits=jnp.array([[0.1, 0.5, 0.4]]), labels=jnp.array([2]))
    assert float(hit.compute()) == 1.0
    f2 = mnnx.Metric(FBeta, beta=2.0)  # the right name still works: F2 of 1 tp, 3 fn
    f2.update(logits=jnp.array([0.9, 0.1, 0.1, 0.1, 0.1]), labels=jnp.array([1, 1, 1, 1, 0]))
    assert float(f2.compute()) == pytest.approx(5 * 1 / (5 * 1 + 4 * 3 + 0))


@pytest.mark.parametrize(("values", "mask"), [((2,), (2, 5)), ((2, 5), (5,))])
def test_a_mask_that_does_not_cover_the_values_names_both_shapes(values, mask):
    with pytest.raises(ValueError, match=rf"mask of shape \({mask[0]}, ?") as info:
        mnnx.Average().update(values=jnp.ones(values), mask=jnp.ones(mask))
    assert f"'values' of shape {values}" in str(info.value)
    average = mnnx.Average()  # a (B, 1) mask broadcasts, as in CLU
    average.update(values=jnp.array([[1.0, 3.0], [5.0, 7.0]]), mask=jnp.array([[True], [False]]))
    assert float(average.compute()) == 2.0


def test_a_0d_mask_beside_a_batch_is_refused_by_every_nnx_metric():
    """Accuracy (with or without a threshold) and Metric(Precision) took a 0-d mask over the
    whole batch while Average refused it, saying "expected the values' leading dims ()"."""
    logits, labels, fix = jnp.array([[2.0, 1.0], [0.0, 3.0]]), jnp.array([0, 1]), "jnp.full"
    with pytest.raises(ValueError) as info:
        mnnx.Average().update(values=jnp.ones(2), mask=jnp.array(True))
    assert str(info.value) == (
        "Average.update: mask of shape () does not fit 'values' of shape (2,): expected the "
        "values' leading dims (2,); a 0-d mask is not spread over the batch (CLU's metrics "
        "refuse it too): to keep or drop the whole batch, pass mask=jnp.full((2,), mask)"
    )
    for metric, scores in (
        (mnnx.Accuracy(), logits),
        (mnnx.Accuracy(threshold=0.5), jnp.array([0.2, 0.9])),
        (mnnx.Metric(Precision, average="micro"), logits),
    ):
        with pytest.raises(ValueError, match=rf"mask of shape \(\).*{fix}\(\(2,\), mask\)"):
            metric.update(logits=scores, labels=labels, mask=jnp.array(True))
        metric.update(logits=scores, labels=labels, mask=jnp.full((2,), True))
        assert float(metric.compute()) == 1.0  # both right: 2 of 2
    # Beside a step's 0-d loss a mask is the other metrics' (Flax): the mean of 3.0 is 3.0.
    average = mnnx.Average()
    average.update(values=jnp.float32(3.0), mask=jnp.array(True))
    assert float(average.compute()) == 3.0


def test_a_threshold_leaves_out_an_ignore_index_as_the_argmax_does():
    # With a threshold, a label of -100 read as a negative: a padded score of 0.1 counted as
    # a right prediction, 3 of 3 (Flax's 1.0) where the two real labels give 1 of 2.
    logits, labels = jnp.array([0.2, 0.4, 0.1]), jnp.array([0, 1, -100])
    accuracy = mnnx.Accuracy(threshold=0.5)
    with pytest.raises(ValueError, match=r"1 of 3 labels where the mask is true are negative"):
        accuracy.update(logits=logits, labels=labels)
    accuracy.update(logits=logits, labels=labels, mask=labels >= 0)
    assert float(accuracy.compute()) == 0.5
    # Under jit, as without a threshold, the ignore index is left out: 1 of 2 again.
    jitted = nnx.jit(lambda metric, logits, labels: metric.update(logits=logits, labels=labels))
    accuracy.reset()
    jitted(accuracy, jnp.tile(logits, (2, 1)), jnp.tile(labels, (2, 1)))
    assert float(accuracy.compute()) == 0.5
    # A per-example mask covers the labels of each example.
    accuracy.reset()
    accuracy.update(
        logits=jnp.array([[0.9, 0.1], [0.9, 0.9]]),
        labels=jnp.array([[1, 0], [-1, 0]]),
        mask=jnp.array([1.0, 0.0]),
    )
    assert float(accuracy.compute()) == 1.0


def test_a_threshold_does_not_wrap_int64_labels_into_real_ones():
    # Without x64, jnp.asarray wrapped an int64 sentinel of -2**63 to 0, a negative label: its
    # score of 0.1 counted as a right prediction, 2 of 3 with nothing refused.
    logits = np.array([0.2, 0.4, 0.1], np.float32)
    labels = np.array([0, 1, np.iinfo(np.int64).min], np.int64)
    accuracy = mnnx.Accuracy(threshold=0.5)
    with pytest.raises(ValueError, match=r"1 of 3 labels where the mask is true are negative"):
        accuracy.update(logits=logits, labels=labels)
    accuracy.update(logits=logits, labels=labels, mask=np.array([True, True, False]))
    assert float(accuracy.compute()) == 0.5


def test_a_threshold_takes_one_example_at_a_time():
    # A 0-d score and label (Flax's reads 1.0) raised IndexError once the mask was checked:
    # CLU's Average reads the first dim of the mask it is given.
    accuracy = mnnx.Accuracy(threshold=0.5)
    accuracy.update(logits=jnp.float32(0.7), labels=jnp.int32(1))
    accuracy.update(logits=jnp.float32(0.2), labels=jnp.int32(1))
    accuracy.update(logits=jnp.float32(0.1), labels=jnp.int32(-100), mask=jnp.array(False))
    assert float(accuracy.compute()) == 0.5
    jitted = nnx.jit(lambda metric, logits, labels: metric.update(logits=logits, labels=labels))
    jitted(accuracy, jnp.float32(0.9), jnp.int32(1))
    assert float(accuracy.compute()) == pytest.approx(2 / 3)


def test_logits_reach_the_metrics_that_read_them_as_logits():
    # nnx renamed logits= to predictions=, so a bad shape read "predictions of shape (4, 5)"
    # to a caller who passed logits=.
    logits, labels = jnp.zeros((4, 5)), jnp.zeros(3, jnp.int32)
    for metric in (mnnx.Metric(Perplexity), mnnx.Metric(FBeta), mnnx.Accuracy()):
        with pytest.raises(ValueError, match=r"\.(from_model_output|update): logits of shape "):
            metric.update(logits=logits, labels=labels)
    # Accuracy() reads logits= beside AUROC's predictions=, and names them.
    with pytest.raises(ValueError, match=r"^Accuracy.update: logits of shape "):
        mnnx.Accuracy().update(logits=logits, predictions=jnp.zeros(3), labels=labels)
    with pytest.raises(ValueError, match=r"^AUROC.from_model_output: predictions of shape \(4,\)"):
        mnnx.Metric(AUROC).update(logits=jnp.zeros(4), labels=labels)  # its probabilities
    # The values are unchanged: NLLs log(1 + e**-2) and 2 + log(1 + e**-2), so a perplexity
    # of e * (1 + e**-2); the top-1 hits 1 of 2.
    perplexity, top1 = mnnx.Metric(Perplexity), mnnx.Metric(TopKAccuracy, k=1)
    for metric in (perplexity, top1):
        metric.update(logits=jnp.array([[2.0, 0.0], [0.0, 2.0]]), labels=jnp.array([0, 0]))
    assert float(perplexity.compute()) == pytest.approx(np.e * (1 + np.e**-2), rel=1e-6)
    assert float(top1.compute()) == 0.5


def test_argnames_onto_logits_supply_the_scores():
    # argnames={"scores": "logits"} was refused: "missing 'logits' or 'predictions' among the
    # arguments ['labels', 'scores']; ... map your names with argnames", as it had.
    perplexity = mnnx.Metric(Perplexity, argnames={"scores": "logits"})
    perplexity.update(scores=jnp.zeros((2, 3)), labels=jnp.array([0, 2]))
    assert float(perplexity.compute()) == pytest.approx(3.0)  # uniform over 3: e**log(3)
    with pytest.raises(ValueError, match=r"^Perplexity.from_model_output: logits of shape \(2, 3"):
        perplexity.update(scores=jnp.zeros((2, 3)), labels=jnp.zeros(3, jnp.int32))


def test_argnames_onto_logits_for_auroc_say_it_takes_predictions():
    # "missing 'logits' or 'predictions' ...; map your names with argnames": AUROC reads no
    # logits, so that was the mapping already given.
    auroc = mnnx.Metric(AUROC, argnames={"scores": "logits"})
    with pytest.raises(TypeError) as raised:
        auroc.update(scores=jnp.zeros(2), labels=jnp.zeros(2, int))
    assert str(raised.value) == (
        "Metric(AUROC).update: argnames maps 'scores' to 'logits', which AUROC does not read: "
        "it takes its scores as predictions=, probabilities in [0, 1]; pass "
        "argnames={'scores': 'predictions'}"
    )
    auroc = mnnx.Metric(AUROC, argnames={"scores": "predictions"})  # as it says
    auroc.update(scores=jnp.array([0.2, 0.9, 0.4]), labels=jnp.array([0, 1, 1]))
    assert float(auroc.compute()) == pytest.approx(1.0)  # 0.2 below both positives


def test_metric_gives_topk_and_perplexity_the_logits_beside_auroc_probabilities():
    """Beside AUROC's probabilities as `predictions=` (the labels' shape), `Metric` dropped
    `logits=` for TopKAccuracy and Perplexity, which then refused the probabilities
    ("predictions of shape (4,) do not fit"); they read the logits, as from_model_output does."""
    logits = jnp.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.5], [1.0, 0.0, 3.0], [0.0, 3.0, 1.0]])
    labels = jnp.array([0, 1, 1, 0])
    probabilities = jnp.array([0.2, 0.7, 0.4, 0.6])
    log_probs = np.asarray(logits) - np.log(np.exp(np.asarray(logits)).sum(-1, keepdims=True))
    perplexity = float(np.exp(-np.mean(log_probs[np.arange(4), np.asarray(labels)])))
    metrics = nnx.MultiMetric(
        auroc=mnnx.Metric(AUROC),
        top1=mnnx.Metric(TopKAccuracy, k=1),
        perplexity=mnnx.Metric(Perplexity),
        precision=mnnx.Metric(Precision),
        accuracy=mnnx.Accuracy(),
    )
    metrics.update(predictions=probabilities, logits=logits, labels=labels)
    # Argmax 0, 1, 2, 1 against labels 0, 1, 1, 0; precision of scores >= 0.5: 1 of 2.
    expected = {"auroc": 3 / 4, "top1": 2 / 4, "perplexity": perplexity}
    expected |= {"precision": 1 / 2, "accuracy": 2 / 4}
    values = {k: float(v) for k, v in metrics.compute().items()}
    assert values == pytest.approx(expected, rel=1e-6)


def test_accuracy_messages_name_accuracy_update():
    """Accuracy()'s messages named TopKAccuracy.from_model_output (or
    Accuracy(TopKAccuracy).update), which the caller of Accuracy().update never called."""
    accuracy = mnnx.Accuracy()
    with pytest.raises(ValueError) as err:
        accuracy.update(logits=jnp.eye(2), labels=jnp.array([0, 1]), mask=jnp.array(True))
    assert str(err.value).startswith(
        "Accuracy.update: mask of shape () does not match the labels of shape (2,); "
        "expected a mask of shape (2,)"
    )
    with pytest.raises(ValueError) as err:
        accuracy.update(logits=jnp.eye(2), labels=jnp.array([0, 5]))
    assert str(err.value).startswith(
        "Accuracy.update: labels must lie in [0, 2) for 2 classes, got values from 0 to 5"
    )
    with pytest.raises(TypeError) as err:
        accuracy.update(labels=jnp.array([0, 1]))
    # It suggested argnames={'yours': 'theirs'}, which Accuracy() does not take (TypeError).
    assert str(err.value) == (
        "Accuracy.update: missing 'logits' or 'predictions' among the arguments ['labels']; "
        "pass them to update()"
    )
    with pytest.raises(TypeError, match="unexpected keyword argument 'argnames'"):
        mnnx.Accuracy(argnames={"scores": "logits"})
    accuracy.update(predictions=jnp.eye(2), labels=jnp.array([1, 1]))  # the names it gives
    accuracy.update(logits=jnp.eye(2)[::-1], labels=jnp.array([1, 1]))
    assert float(accuracy.compute()) == 0.5
    accuracy.reset()
    with pytest.raises(TypeError) as err:  # a Metric takes argnames, and is told so
        mnnx.Metric(TopKAccuracy, k=1).update(labels=jnp.array([0, 1]))
    assert str(err.value).endswith(
        "pass them to update(), or map your names with argnames={'yours': 'theirs'}"
    )
    # Nothing was merged: argmax 0, 1 against labels 0, 0 is 1 of 2 right.
    accuracy.update(logits=jnp.eye(2), labels=jnp.array([0, 0]))
    assert float(accuracy.compute()) == 0.5
