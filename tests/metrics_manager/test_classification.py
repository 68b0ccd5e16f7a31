"""Classification metrics against scikit-learn, merged over microbatches and 8 devices;
merge properties; errors; and what google-metrax's versions do (why some are ours)."""

import doctest
import functools
import math
import warnings

import jax
import jax.numpy as jnp
import metrax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from sklearn import metrics as skm

from metrics_manager import classification
from metrics_manager.classification import (
    AUROC,
    FBeta,
    Perplexity,
    Precision,
    Recall,
    TopKAccuracy,
)
from metrics_manager.merging import accumulate_grads_microbatched, merge_metrics
from metrics_manager.metrics import MeanStd, Welford

ROWS, CLASSES, LENGTH, VOCAB, BINS = 64, 5, 4, 7, 1000


def make_batch(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "logits": rng.standard_normal((ROWS, CLASSES)).astype(np.float32),
        "labels": rng.integers(0, CLASSES, ROWS).astype(np.int32),
        "mask": rng.random(ROWS) < 0.8,
        "scores": rng.random(ROWS).astype(np.float32),
        "binary": rng.integers(0, 2, ROWS).astype(np.int32),
        # Scores in the middle of their bins: binning them loses nothing.
        "binned_scores": ((rng.integers(0, 20, ROWS) + 0.5) / 20).astype(np.float32),
        "token_logits": rng.standard_normal((ROWS, LENGTH, VOCAB)).astype(np.float32),
        "tokens": rng.integers(0, VOCAB, (ROWS, LENGTH)).astype(np.int32),
        # Sequences of different lengths: per-batch averaging would weight them wrongly.
        "token_mask": np.arange(LENGTH)[None, :] < rng.integers(1, LENGTH + 1, ROWS)[:, None],
    }


def loss_fn(scale, batch):
    logits, labels, mask = batch["logits"] * scale, batch["labels"], batch["mask"]
    scores, binary = batch["scores"], batch["binary"]
    return (logits * mask[:, None]).sum(), {
        "precision/binary": Precision.from_model_output(scores, binary, mask),
        "recall/binary": Recall.from_model_output(scores, binary, mask, threshold=0.3),
        "f2/binary": FBeta.from_model_output(scores, binary, mask, beta=2.0),
        "precision/micro": Precision.from_model_output(logits, labels, mask, average="micro"),
        "precision/macro": Precision.from_model_output(logits, labels, mask, average="macro"),
        "recall/micro": Recall.from_model_output(logits, labels, mask, average="micro"),
        "recall/macro": Recall.from_model_output(logits, labels, mask, average="macro"),
        "f1/micro": FBeta.from_model_output(logits, labels, mask, average="micro"),
        "f1/macro": FBeta.from_model_output(logits, labels, mask, average="macro"),
        "f05/macro": FBeta.from_model_output(logits, labels, mask, beta=0.5, average="macro"),
        "top1": TopKAccuracy.from_model_output(logits, labels, mask, k=1),
        "top3": TopKAccuracy.from_model_output(logits, labels, mask, k=3),
        "auroc": AUROC.from_model_output(scores, binary, mask, num_bins=BINS),
        "auroc/binned": AUROC.from_model_output(batch["binned_scores"], binary, mask, num_bins=20),
        "perplexity": Perplexity.from_model_output(
            batch["token_logits"], batch["tokens"], batch["token_mask"]
        ),
    }


def sklearn_values(batch):
    m = batch["mask"]
    y, pred = batch["labels"][m], batch["logits"][m].argmax(-1)
    yb, s = batch["binary"][m], batch["scores"][m]
    tm = batch["token_mask"].reshape(-1)
    probs = np.asarray(jax.nn.softmax(batch["token_logits"].astype(np.float64), axis=-1))
    log_loss = skm.log_loss(
        batch["tokens"].reshape(-1)[tm], probs.reshape(-1, VOCAB)[tm], labels=range(VOCAB)
    )
    # zero_division=0 is the value of sklearn's default ("warn"), without the warning.
    zd = {"zero_division": 0}
    return {
        "precision/binary": skm.precision_score(yb, s >= 0.5, **zd),
        "recall/binary": skm.recall_score(yb, s >= 0.3, **zd),
        "f2/binary": skm.fbeta_score(yb, s >= 0.5, beta=2.0, **zd),
        "precision/micro": skm.precision_score(y, pred, average="micro", **zd),
        "precision/macro": skm.precision_score(y, pred, average="macro", **zd),
        "recall/micro": skm.recall_score(y, pred, average="micro", **zd),
        "recall/macro": skm.recall_score(y, pred, average="macro", **zd),
        "f1/micro": skm.f1_score(y, pred, average="micro", **zd),
        "f1/macro": skm.f1_score(y, pred, average="macro", **zd),
        "f05/macro": skm.fbeta_score(y, pred, beta=0.5, average="macro", **zd),
        "top1": skm.top_k_accuracy_score(y, batch["logits"][m], k=1, labels=range(CLASSES)),
        "top3": skm.top_k_accuracy_score(y, batch["logits"][m], k=3, labels=range(CLASSES)),
        "auroc": skm.roc_auc_score(yb, s),
        "auroc/binned": skm.roc_auc_score(yb, batch["binned_scores"][m]),
        "perplexity": np.exp(log_loss),
    }


# Binned AUROC vs sklearn on raw scores: a (positive, negative) pair is misjudged only when
# both fall into one bin, where it counts 1/2 instead of 0 or 1; with ~ROWS/2 of each class
# spread uniformly over 1000 bins that is about 1/1000 of the pairs, so |error| < 1e-3.
TOLERANCE = {"auroc": 1e-3}


def test_docstring_examples_run():
    result = doctest.testmod(classification)
    assert result.attempted >= 8
    assert result.failed == 0


@functools.cache
def step_metrics(num_microbatches):
    return jax.jit(
        lambda batch: accumulate_grads_microbatched(loss_fn, 1.0, batch, num_microbatches)[1]
    )


def computed(metrics):
    return {key: float(metric.compute()) for key, metric in jax.device_get(metrics).items()}


@pytest.fixture(scope="module")
def one_batch():
    return make_batch(0), computed(step_metrics(1)(make_batch(0)))


@pytest.mark.parametrize("num_microbatches", [1, 4, 8])
def test_values_equal_sklearn_for_any_number_of_microbatches(one_batch, num_microbatches):
    batch, whole = one_batch
    got = computed(step_metrics(num_microbatches)(batch))
    expected = sklearn_values(batch)
    assert set(got) == set(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(
            got[key], value, rtol=1e-5, atol=TOLERANCE.get(key, 1e-6), err_msg=key
        )
        # Counts are integers: the split cannot change them, only float sums may round.
        np.testing.assert_allclose(got[key], whole[key], rtol=1e-6, err_msg=key)


@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
def test_values_on_8_devices_equal_one_device(one_batch, axis_type):
    """Explicit axes are `jax.make_mesh`'s default: there the bin counts' scatter-add raised
    a ShardingTypeError (Precision, Recall, FBeta and AUROC; the others computed)."""
    batch, whole = one_batch
    kind = getattr(jax.sharding.AxisType, axis_type)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(kind,), devices=jax.devices()[:8])
    sharded = jax.device_put(batch, NamedSharding(mesh, P("data")))
    assert len(sharded["logits"].sharding.device_set) == 8
    with jax.set_mesh(mesh):
        got = computed(step_metrics(4)(sharded))
    for key, value in whole.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-6, err_msg=key)


@pytest.mark.parametrize(
    "replicated", [("labels", "binary"), ("logits", "scores", "binned_scores")]
)
def test_labels_or_scores_replicated_beside_a_sharded_batch_equal_one_device(one_batch, replicated):
    """On an Explicit axis, bin indices (labels, predictions, AUROC's bins) replicated beside
    a sharded mask or prediction made the scatter-add of Precision, Recall, FBeta and AUROC
    raise "Incompatible types for broadcasting: input type=int32[64@data] and requested
    type=int32[64]"."""
    batch, whole = one_batch
    mesh = jax.make_mesh((8,), ("data",), devices=jax.devices()[:8])  # Explicit axes
    with jax.set_mesh(mesh):
        placed = {
            k: jax.device_put(v, P() if k in replicated else P("data")) for k, v in batch.items()
        }
        got = computed(step_metrics(1)(placed))
    assert set(got) == set(whole)
    for key, value in whole.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-6, err_msg=key)


@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
def test_scores_sharded_over_their_classes_equal_one_device(axis_type):
    """Vocabulary-parallel logits: on an Explicit axis the gathers of Perplexity and of the
    class scores' NaN check raised a ShardingTypeError, and top_k refused the sharded axis."""
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((16, 3, 8)).astype(np.float32)
    labels = rng.integers(0, 8, (16, 3)).astype(np.int32)
    mask = rng.random((16, 3)) < 0.8

    def metrics(logits, labels, mask):
        return {
            "precision/macro": Precision.from_model_output(logits, labels, mask, average="macro"),
            "recall/micro": Recall.from_model_output(logits, labels, mask, average="micro"),
            "f1/macro": FBeta.from_model_output(logits, labels, mask, average="macro"),
            "top1": TopKAccuracy.from_model_output(logits, labels, mask, k=1),
            "top3": TopKAccuracy.from_model_output(logits, labels, mask, k=3),
            "perplexity": Perplexity.from_model_output(logits, labels, mask),
        }

    whole = computed(jax.jit(metrics)(logits, labels, mask))
    kind = getattr(jax.sharding.AxisType, axis_type)
    mesh = jax.make_mesh(
        (2, 4), ("data", "vocab"), axis_types=(kind, kind), devices=jax.devices()[:8]
    )
    sharded = jax.device_put(logits, NamedSharding(mesh, P("data", None, "vocab")))
    with jax.set_mesh(mesh):
        got = computed(jax.jit(metrics)(sharded, *jax.device_put((labels, mask), P("data"))))
    assert set(got) == set(whole)
    for key, value in whole.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-6, err_msg=key)


def test_steps_merge_like_one_batch_of_their_union():
    first, second = make_batch(1), make_batch(2)
    merged = {k: m.merge(step_metrics(1)(second)[k]) for k, m in step_metrics(1)(first).items()}
    union = {k: np.concatenate([first[k], second[k]]) for k in first}
    expected = sklearn_values(union)
    for key, value in computed(merged).items():
        np.testing.assert_allclose(
            value, expected[key], rtol=1e-5, atol=TOLERANCE.get(key, 1e-6), err_msg=key
        )


def test_macro_averages_over_the_classes_seen_like_sklearn():
    # Class 3 of 5 never appears; class 2 is predicted but never true (precision 0).
    logits = np.eye(5, dtype=np.float32)[[0, 1, 2, 2, 4, 0]]
    labels = np.array([0, 1, 1, 4, 4, 0])
    pred = logits.argmax(-1)
    for cls, score in [(Precision, skm.precision_score), (Recall, skm.recall_score)]:
        got = float(cls.from_model_output(logits, labels, average="macro").compute())
        np.testing.assert_allclose(
            got, score(labels, pred, average="macro", zero_division=0), rtol=1e-6
        )
    got = float(FBeta.from_model_output(logits, labels, average="macro").compute())
    np.testing.assert_allclose(
        got, skm.f1_score(labels, pred, average="macro", zero_division=0), rtol=1e-6
    )
    assert got == pytest.approx((1 + 2 / 3 + 0 + 2 / 3) / 4)  # classes 0, 1, 2, 4 by hand


def test_nothing_seen_reads_like_sklearn_zero_division_or_nan():
    assert float(Precision.empty().compute()) == 0.0
    assert float(FBeta.empty().compute()) == 0.0
    for cls in (TopKAccuracy, AUROC, Perplexity):
        assert np.isnan(cls.empty().compute())
    # No positive prediction at all: sklearn's zero_division value, 0.
    metric = Precision.from_model_output(np.zeros(4, np.float32), np.array([1, 0, 1, 0]))
    assert float(metric.compute()) == 0.0
    # One class only: AUROC is undefined (sklearn raises), NaN here.
    assert np.isnan(AUROC.from_model_output(np.ones(3, np.float32), np.ones(3, np.int32)).compute())


def test_auroc_of_scores_outside_0_1_is_refused_eagerly_and_nan_under_jit():
    """Logits passed as probabilities would all land in the end bins: a plausible wrong area
    (0.5 for logits that rank perfectly), so they are refused, or the window is NaN."""
    logits, labels = np.array([2.0, 3.0, 1.5, 4.0], np.float32), np.array([0, 1, 0, 1])
    with pytest.raises(
        ValueError,
        match=r"^AUROC.from_model_output: predictions must be probabilities in \[0, 1\]; 4 of 4 "
        r"unmasked are not \(from 1.5 to 4.0, or NaN\): pass jax.nn.sigmoid\(logits\), not the logits$",
    ):
        AUROC.from_model_output(logits, labels)
    with pytest.raises(ValueError, match="1 of 2 unmasked are not"):
        AUROC.from_model_output(np.array([0.5, np.nan], np.float32), np.array([0, 1]))
    jitted = jax.jit(AUROC.from_model_output)
    bad, good = jitted(logits, labels), jitted(jax.nn.sigmoid(logits), labels)
    assert float(good.compute()) == 1.0 and int(bad.outside) == 4
    assert np.isnan(bad.compute()) and np.isnan(good.merge(bad).compute())
    # A masked-out score (padding) is not counted, eagerly or under jit.
    mask = np.array([True, True, True, False])
    padded = np.array([0.2, 0.6, 0.1, -7.0], np.float32)
    assert float(AUROC.from_model_output(padded, labels, mask).compute()) == 1.0
    assert float(jax.jit(AUROC.from_model_output)(padded, labels, mask).compute()) == 1.0


@pytest.mark.parametrize("cls", [Precision, Recall, FBeta])
def test_binary_logits_at_the_default_threshold_are_refused_eagerly_and_nan_under_jit(cls):
    """Logits thresholded at 0.5 count a logit of 0.3 (a probability of 0.57) as negative: a
    plausible wrong value. With threshold=0.0 they are thresholded as logits, as intended."""
    logits = np.array([2.0, 0.3, -1.5, 0.4, -0.2], np.float32)
    labels, mask = np.array([1, 1, 0, 0, 1]), np.array([True, True, True, True, False])
    with pytest.raises(
        ValueError,
        match=rf"^{cls.__name__}.from_model_output: predictions must be probabilities in "
        r"\[0, 1\]; 2 of 4 unmasked are not \(from -1.5 to 2.0, or NaN\): pass "
        r"jax.nn.sigmoid\(logits\), or threshold=0.0 to threshold the logits$",
    ):
        cls.from_model_output(logits, labels, mask)
    score = getattr(skm, {"FBeta": "f1_score"}.get(cls.__name__, cls.__name__.lower() + "_score"))
    expected = score(labels[mask], (logits > 0)[mask])
    for metric in (
        cls.from_model_output(jax.nn.sigmoid(logits), labels, mask),
        cls.from_model_output(logits, labels, mask, threshold=0.0),
        jax.jit(functools.partial(cls.from_model_output, threshold=0.0))(logits, labels, mask),
    ):
        assert float(metric.compute()) == pytest.approx(expected, rel=1e-6)
    bad = jax.jit(cls.from_model_output)(logits, labels, mask)
    assert int(bad.outside) == 2 and np.isnan(bad.compute())
    good = cls.from_model_output(jax.nn.sigmoid(logits), labels, mask)
    assert np.isnan(good.merge(bad).compute()) and np.isnan(cls.empty().merge(bad).compute())
    # A masked-out score (padding) is not counted; multi-class scores are argmaxed as before.
    assert int(cls.from_model_output(np.where(mask, 0.5, -7.0), labels, mask).outside) == 0
    assert int(cls.from_model_output(np.eye(5) * 3 - 1, labels, average="micro").outside) == 0


NAN_ROW = np.array([[np.nan, np.nan, np.nan], [0.0, 1.0, 2.0], [3.0, np.nan, 0.0]], np.float32)


@pytest.mark.parametrize(
    "call",
    [
        functools.partial(TopKAccuracy.from_model_output, NAN_ROW, k=1),
        functools.partial(Recall.from_model_output, NAN_ROW, average="macro"),
        functools.partial(Precision.from_model_output, NAN_ROW, average="micro"),
        functools.partial(
            lambda labels, **kw: FBeta.from_model_output(NAN_ROW[:, 1], labels // 2, **kw),
            threshold=0.5,
        ),
    ],
    ids=["top-1", "macro recall", "micro precision", "binary at a threshold"],
)
def test_nan_scores_are_refused_eagerly_and_nan_under_jit(call):
    """argmax, top_k and `>=` count a NaN score as a prediction: an all-NaN row read as a
    right prediction of label 0 (top-1 accuracy 1.0 from a diverged model)."""
    labels = np.array([0, 2, 0])
    with pytest.raises(
        ValueError,
        match=r"from_model_output: predictions are NaN for 2 of the 3 labels where the mask "
        r"is true \(3 in all\), which would count as predictions \(argmax and top_k rank NaN "
        r"first, a threshold reads it as negative\); check the model for a divergence",
    ):
        call(labels=labels)
    # The labels masked out are not counted among those where the mask is true (it read
    # "2 of 3 labels where the mask is true" for a mask true at 2).
    with pytest.raises(
        ValueError, match=r"NaN for 2 of the 2 labels where the mask is true \(3 in"
    ):
        call(labels=labels, mask=np.array([True, False, True]))
    under_jit = jax.jit(lambda labels, mask: call(labels=labels, mask=mask))
    bad = under_jit(labels, np.array([True, True, True]))
    assert int(bad.outside) == 2 and np.isnan(bad.compute())
    good = call(labels=labels, mask=np.array([False, True, False]))  # NaN rows masked out
    assert int(good.outside) == 0 and float(good.compute()) == 1.0
    assert np.isnan(good.merge(bad).compute())  # the window's value, not a plausible one


@pytest.mark.parametrize("dtype,classes", [(np.int8, 128), (np.uint8, 256)])
def test_narrow_integer_labels_count_as_int32_ones(dtype, classes):
    """The class count wrapped in the labels' dtype (256 is 0 in uint8): under jit every label
    read as out of range (NaN), and eagerly int8 raised JAX's 'Python integer 128 out of
    bounds for int8'."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((16, classes)).astype(np.float32)
    labels = rng.integers(0, np.iinfo(dtype).max, 16)
    calls = {
        "recall": functools.partial(Recall.from_model_output, average="macro"),
        "top3": functools.partial(TopKAccuracy.from_model_output, k=3),
        "perplexity": Perplexity.from_model_output,
    }
    for name, call in calls.items():
        wide = float(call(logits, labels.astype(np.int32)).compute())
        assert np.isfinite(wide), name
        for narrow in (
            call(logits, labels.astype(dtype)),
            jax.jit(call)(logits, labels.astype(dtype)),
        ):
            assert float(narrow.compute()) == pytest.approx(wide, rel=1e-6), name


def test_losses_passed_as_log_likelihoods_are_refused_eagerly_and_nan_under_jit():
    """Perplexity of losses read exp(-mean loss) < 1, a plausible wrong value."""
    losses = np.array([2.3, 1.7, 9.0], np.float32)
    mask = np.array([True, True, False])
    with pytest.raises(
        ValueError,
        match=r"^Perplexity.from_log_likelihood: log-likelihoods must be <= 0; 2 of 2 are "
        r"positive \(up to 2.3\): pass -loss \(e.g. -compute_token_losses\(logits, targets\).loss\), not the loss$",
    ):
        Perplexity.from_log_likelihood(losses, mask)
    assert np.isnan(jax.jit(Perplexity.from_log_likelihood)(losses, mask).compute())
    assert float(Perplexity.from_log_likelihood(-losses, mask).compute()) == pytest.approx(
        np.exp(2.0), rel=1e-6
    )
    # Rounding just above 0 (a log-softmax of a certain prediction) is no loss.
    assert float(Perplexity.from_log_likelihood(np.array([1e-6, 0.0], np.float32)).compute()) == (
        pytest.approx(1.0, abs=1e-5)
    )


def raw_auroc(scores, labels):
    """The area on raw scores in float64: each positive's share of negatives below it, plus
    half of those equal to it (the Mann-Whitney statistic, sklearn's roc_auc_score)."""
    scores = np.asarray(scores, np.float64)
    positives, negatives = scores[labels == 1], np.sort(scores[labels == 0])
    below = np.searchsorted(negatives, positives, "left")
    equal = np.searchsorted(negatives, positives, "right") - below
    return float((below + 0.5 * equal).sum() / (positives.size * negatives.size))


def test_auroc_of_scores_bunched_near_0_collapses_and_a_spreading_transform_restores_it():
    # As documented: probabilities below 1 / num_bins (a rare-event model's) share bin 0,
    # where every pair counts 1/2, so the area is off by up to half the pairs sharing a bin;
    # a monotone transform that spreads the scores, or more bins, restores the raw area.
    rare, labels = np.array([1e-4, 2e-4, 3e-4, 4e-4], np.float32), np.array([0, 0, 1, 1])
    spread = jax.nn.sigmoid(jax.scipy.special.logit(rare) + 8.5)
    assert raw_auroc(rare, labels) == raw_auroc(spread, labels) == 1.0
    assert float(AUROC.from_model_output(rare, labels).compute()) == 0.5
    assert float(AUROC.from_model_output(spread, labels).compute()) == 1.0
    assert float(AUROC.from_model_output(rare, labels, num_bins=10_000).compute()) == 1.0

    rng, n = np.random.default_rng(0), 100_000
    logits = np.concatenate([rng.normal(-9, 1, n), rng.normal(-12, 1, n)]).astype(np.float32)
    labels = np.repeat(np.array([1, 0]), n)
    scores = jax.nn.sigmoid(logits)
    raw = raw_auroc(scores, labels)
    assert raw == pytest.approx(0.983, abs=1e-3) and raw == raw_auroc(logits, labels)
    bins = np.minimum(np.floor(np.asarray(scores) * np.float32(1000)), 999).astype(int)
    shared = np.bincount(bins[:n], minlength=1000) @ np.bincount(bins[n:], minlength=1000)
    collapsed = float(AUROC.from_model_output(scores, labels).compute())
    assert collapsed == pytest.approx(0.509, abs=1e-3)
    assert abs(collapsed - raw) <= 0.5 * shared / n**2  # the documented bound
    restored = AUROC.from_model_output(jax.nn.sigmoid(logits + 10.5), labels)
    assert float(restored.compute()) == pytest.approx(raw, abs=1 / 1000)


def test_auroc_by_hand_and_perplexity_of_uniform_logits():
    # 2 positives, 2 negatives: pairs (p > n) 3 of 4.
    auroc = AUROC.from_model_output(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1]))
    assert float(auroc.compute()) == 0.75
    assert auroc.positives.shape == (1000,) and int(auroc.positives.sum()) == 2
    ppl = Perplexity.from_model_output(
        np.zeros((3, 2, 8), np.float32),
        np.zeros((3, 2), np.int32),
        mask=np.array([True, False, True]),
    )
    assert int(ppl.count) == 4
    np.testing.assert_allclose(ppl.compute(), 8.0, rtol=1e-6)


# --- merge properties -------------------------------------------------------------------

PIECE = 8


def _piece(cls, seed):
    """One metric of `cls` from 8 random rows, with fixed shapes (eager ops compile once)."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((PIECE, 4)).astype(np.float32)
    labels = rng.integers(0, 4, PIECE)
    mask = rng.random(PIECE) < 0.7
    scores, binary = rng.random(PIECE).astype(np.float32), rng.integers(0, 2, PIECE)
    if cls is TopKAccuracy:
        return cls.from_model_output(logits, labels, mask, k=2)
    if cls is AUROC:
        return cls.from_model_output(scores, binary, mask, num_bins=16)
    if cls is Perplexity:
        return cls.from_model_output(logits, labels, mask)
    if cls is FBeta:
        return cls.from_model_output(logits, labels, mask, beta=0.5, average="macro")
    if cls is Recall:
        return cls.from_model_output(scores, binary, mask)
    return cls.from_model_output(logits, labels, mask, average="micro")


ALL_TYPES = [Precision, Recall, FBeta, TopKAccuracy, AUROC, Perplexity]
property_settings = settings(max_examples=8, deadline=None, derandomize=True)
seeds = st.tuples(*[st.integers(0, 2**16)] * 3)


def _assert_same(a, b, exact=True):
    assert type(a) is type(b)
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b  # static settings included
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if exact:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        else:
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
@property_settings
@given(seeds=seeds)
def test_merge_is_associative(cls, seeds):
    a, b, c = (_piece(cls, s) for s in seeds)
    # Counts are integers (exact); Perplexity's float sum may round in the last bit.
    _assert_same(a.merge(b).merge(c), a.merge(b.merge(c)), exact=cls is not Perplexity)


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
@property_settings
@given(seeds=seeds)
def test_empty_is_a_two_sided_identity(cls, seeds):
    metric = _piece(cls, seeds[0]).merge(_piece(cls, seeds[1]))
    _assert_same(cls.empty().merge(metric), metric)
    _assert_same(metric.merge(cls.empty()), metric)
    _assert_same(cls.empty().merge(cls.empty()), cls.empty())
    np.testing.assert_array_equal(cls.empty().merge(metric).compute(), metric.compute())


# --- errors -------------------------------------------------------------------------------


def test_errors_name_what_was_expected_and_what_came():
    logits, labels = np.zeros((4, 3), np.float32), np.array([0, 1, 2, 3])
    with pytest.raises(
        ValueError, match=r"labels must lie in \[0, 3\) for 3 classes, got values from 0 to 3"
    ):
        Precision.from_model_output(logits, labels, average="macro")
    with pytest.raises(ValueError, match=r"k=4 must lie in \[1, 3\]"):
        TopKAccuracy.from_model_output(logits, labels % 3, k=4)
    with pytest.raises(
        ValueError, match=r"predictions of shape \(4, 3\) do not fit labels of shape \(3,\)"
    ):
        Recall.from_model_output(logits, labels[:3], average="micro")
    with pytest.raises(  # it said "average=None does not fit", of an argument not passed
        ValueError,
        match="FBeta.from_model_output: average is required for 3-class scores: pass "
        "average='micro' or average='macro'",
    ):
        FBeta.from_model_output(logits, labels % 3)
    with pytest.raises(TypeError, match="labels must be integer class indices, got"):
        Perplexity.from_model_output(logits, labels.astype(np.float32))
    with pytest.raises(
        ValueError, match=r"mask of shape \(2,\) does not match the labels of shape \(4,\)"
    ):
        AUROC.from_model_output(np.zeros(4), np.zeros(4, np.int32), mask=np.ones(2, bool))
    # One error lists every problem of the call.
    with pytest.raises(ValueError, match="2 problems") as info:
        TopKAccuracy.from_model_output(logits, labels, k=5)
    assert "k=5" in str(info.value) and "labels must lie in" in str(info.value)


@pytest.mark.parametrize("cls", [Precision, Recall, FBeta])
def test_class_ids_as_predictions_are_refused_naming_the_one_hot_fix(cls):
    # sklearn's y_pred of class ids has the labels' shape, so it reads as binary scores:
    # the error said "for 2 classes ... check the label vocabulary" for 4-class labels.
    predicted, labels = np.array([0, 2, 1, 3]), np.array([0, 2, 2, 3])
    with pytest.raises(ValueError, match=r"\[0, 2\) for 2 classes, got values from 0 to 3") as info:
        cls.from_model_output(predicted, labels, average="macro")
    assert "binary scores: for more classes pass [..., C] scores" in str(info.value)
    assert "jax.nn.one_hot(ids, C)" in str(info.value)
    # The fix: per class precision 1, 0, 1, 1 and recall 1, 0, 1/2, 1; F1 1, 0, 2/3, 1.
    metric = cls.from_model_output(jax.nn.one_hot(predicted, 4), labels, average="macro")
    expected = {Precision: 3 / 4, Recall: 2.5 / 4, FBeta: (2 + 2 / 3) / 4}[cls]
    assert float(metric.compute()) == pytest.approx(expected, rel=1e-6)


ONE_HOT_CALLS = {
    "top-k": lambda logits, labels: TopKAccuracy.from_model_output(logits, labels, k=2),
    "perplexity": lambda logits, labels: Perplexity.from_model_output(logits, labels),
    "precision": lambda logits, labels: Precision.from_model_output(logits, labels),
    "f1 macro": lambda logits, labels: FBeta.from_model_output(logits, labels, average="macro"),
}


@pytest.mark.parametrize("call", sorted(ONE_HOT_CALLS))
def test_one_hot_labels_beside_class_logits_are_refused_naming_the_argmax(call):
    # Top-k and perplexity asked for logits of shape (4, 3, 'C'); precision for probabilities
    # (sigmoid, or threshold=0.0: a multi-label value, not the multi-class one meant).
    logits = np.array([[2.0, 0.0, -1.0], [0.0, 1.5, 0.0], [0.5, 0.0, 2.0], [1.0, 3.0, 0.0]])
    labels = np.array([0, 1, 1, 1])
    with pytest.raises(ValueError) as info:
        ONE_HOT_CALLS[call](logits, np.eye(3, dtype=np.int32)[labels])
    fix = "the labels look one-hot (one 1 per row of their last axis): pass labels.argmax(-1), "
    assert fix + "integer class indices of shape (4,)" in str(info.value)
    if call == "precision":  # binary scores, as the labels' shape said: no class scores
        return
    # The fix: argmaxes 0, 1, 2, 1 (the third wrong, its label last of the 3); per class F1
    # 1, 2 * (2/3) / (1 + 2/3) = 0.8 and 0.
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = {
        "top-k": 3 / 4,
        "perplexity": np.exp(-log_softmax[np.arange(4), labels].mean()),
        "f1 macro": (1 + 0.8 + 0) / 3,
    }[call]
    assert float(ONE_HOT_CALLS[call](logits, labels).compute()) == pytest.approx(expected, 1e-6)


SCORES, LABELS = np.array([0.2, 0.8]), np.array([0, 1])
BAD_SETTINGS = {
    "threshold a str": (
        lambda: Precision.from_model_output(SCORES, LABELS, threshold="0.5"),
        TypeError,
        "Precision.from_model_output: threshold must be a Python number (it is static under "
        "jit), got str '0.5'; pass float(threshold)",
    ),
    "threshold for class scores": (  # argmax wins: it was ignored at any value
        lambda: Precision.from_model_output(np.eye(2), LABELS, average="macro", threshold=0.9),
        ValueError,
        "Precision.from_model_output: threshold=0.9 applies to binary scores only, got 2-class "
        "scores of shape (2, 2) (argmax wins); drop threshold, or pass one class's scores of "
        "the labels' shape",
    ),
    "beta a str": (
        lambda: FBeta.from_model_output(SCORES, LABELS, beta="2"),
        TypeError,
        "FBeta.from_model_output: beta must be a finite Python number > 0, got str '2'; use beta=1.0 "
        "for F1, 0.5 to favour precision, 2.0 recall",
    ),
    "beta 0": (
        lambda: FBeta.from_model_output(SCORES, LABELS, beta=0),
        ValueError,
        "FBeta.from_model_output: beta must be a finite Python number > 0, got int 0; use beta=1.0 "
        "for F1, 0.5 to favour precision, 2.0 recall",
    ),
    "beta inf": (  # NaN, not recall
        lambda: FBeta.from_model_output(SCORES, LABELS, beta=float("inf")),
        ValueError,
        "FBeta.from_model_output: beta must be a finite Python number > 0, got float inf; use "
        "beta=1.0 for F1, 0.5 to favour precision, 2.0 recall",
    ),
    "threshold NaN": (  # every prediction negative: precision 0
        lambda: Precision.from_model_output(SCORES, LABELS, threshold=float("nan")),
        ValueError,
        "Precision.from_model_output: threshold must be a number, got NaN",
    ),
    "k a str": (
        lambda: TopKAccuracy.from_model_output(np.eye(2), LABELS, k="1"),
        TypeError,
        "TopKAccuracy.from_model_output: k must be an int, got str '1'",
    ),
    "k 0": (
        lambda: TopKAccuracy.from_model_output(SCORES[:, None] * np.ones(3), LABELS, k=0),
        ValueError,
        "TopKAccuracy.from_model_output: k=0 must be at least 1; k=1 is the argmax's accuracy",
    ),
    "num_bins a str": (
        lambda: AUROC.from_model_output(SCORES, LABELS, num_bins="3"),
        TypeError,
        "AUROC.from_model_output: num_bins must be an int, got str '3'",
    ),
    "num_bins 0": (
        lambda: AUROC.from_model_output(SCORES, LABELS, num_bins=0),
        ValueError,
        "AUROC.from_model_output: num_bins must be >= 1, got 0",
    ),
    # A shape that does not fit leaves the class count unknown: no echo about label ranges.
    "perplexity of a 0-d score": (
        lambda: Perplexity.from_model_output(np.float32(1.0), LABELS),
        ValueError,
        "Perplexity.from_model_output: predictions of shape () do not fit labels of shape "
        "(2,): expected logits of shape (2, 'V')",
    ),
    "top-k of binary scores": (
        lambda: TopKAccuracy.from_model_output(SCORES, LABELS + 4, k=1),
        ValueError,
        "TopKAccuracy.from_model_output: predictions of shape (2,) do not fit labels of shape "
        "(2,): expected (2, 'C'), one score per class",
    ),
    "precision of mis-shaped scores": (
        lambda: Precision.from_model_output(np.zeros((2, 3, 1)), LABELS + 4),
        ValueError,
        "Precision.from_model_output: predictions of shape (2, 3, 1) do not fit labels of "
        "shape (2,): expected (2,) (binary scores) or (2, 'C') with C >= 2 (one score per "
        "class)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SETTINGS))
def test_each_bad_setting_gives_one_exact_message(case):
    call, error, message = BAD_SETTINGS[case]
    with pytest.raises(error) as info:
        call()
    assert str(info.value) == message


def test_settings_are_checked_at_trace_time_and_labels_out_of_range_ignored_in_jit():
    traces = []

    @jax.jit
    def merged(logits, labels):
        traces.append(1)
        a = TopKAccuracy.from_model_output(logits, labels, k=1)
        return a.merge(TopKAccuracy.from_model_output(logits, labels, k=2))

    with pytest.raises(ValueError, match="cannot merge metrics with k=1 and k=2"):
        merged(np.zeros((2, 3), np.float32), np.array([0, 1]))
    assert traces == [1]
    step = jax.jit(lambda p, y: Precision.from_model_output(p, y, average="micro"))
    metric = step(np.eye(3, dtype=np.float32), np.array([0, 1, 7]))  # 7: out of range
    assert int(metric.true_positives.sum() + metric.false_negatives.sum()) == 2


def test_padded_labels_under_the_mask_and_labels_captured_by_jit_give_the_jit_value():
    """Outside jit only unmasked labels are range-checked (padding is often -100), and
    labels that are a constant of a jitted function (jnp.arange(B) of a contrastive loss)
    are read with numpy: jnp ops on them trace (ConcretizationTypeError before)."""
    logits = jnp.array([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0], [2.0, 0.0, 0.0]])
    labels, mask = jnp.array([0, 1, 1, -100]), jnp.array([True, True, True, False])
    calls = {
        "topk": lambda x, y, m: TopKAccuracy.from_model_output(x, y, m, k=1),
        "precision": lambda x, y, m: Precision.from_model_output(x, y, m, average="macro"),
        "recall": lambda x, y, m: Recall.from_model_output(x, y, m, average="micro"),
        "auroc": lambda x, y, m: AUROC.from_model_output(jax.nn.sigmoid(x[:, 1]), y % 2, m),
        "perplexity": lambda x, y, m: Perplexity.from_model_output(x, y, m),
    }
    expected = {
        "topk": 2 / 3,  # [0, 1, 2] predicted for [0, 1, 1]
        "precision": skm.precision_score([0, 1, 1], [0, 1, 2], average="macro", zero_division=0),
        "recall": 2 / 3,
        "auroc": skm.roc_auc_score([0, 1, 1], jax.nn.sigmoid(logits[:3, 1])),
        "perplexity": float(np.exp(-np.mean(jax.nn.log_softmax(logits[:3])[[0, 1, 2], [0, 1, 1]]))),
    }
    for name, call in calls.items():
        eager = float(call(logits, labels, mask).compute())
        jitted = float(jax.jit(lambda x, c=call: c(x, labels, mask).compute())(logits))
        assert eager == pytest.approx(expected[name], rel=1e-5) and jitted == pytest.approx(
            eager
        ), name
    with pytest.raises(ValueError, match=r"from 0 to 7 where the mask is true"):
        TopKAccuracy.from_model_output(logits, jnp.array([0, 1, 7, -100]), mask, k=1)
    ll = jnp.log(jnp.array([0.5, 0.5, 2.0]))  # positive log-likelihood under the mask: refused
    with pytest.raises(ValueError, match="1 of 3 are positive"):
        Perplexity.from_log_likelihood(ll)
    masked = jax.jit(lambda m: Perplexity.from_log_likelihood(ll, mask=m).compute())
    assert float(masked(jnp.array([True, True, False]))) == pytest.approx(2.0)


# --- google-metrax: what it does right, and why some metrics here are ours -------------


def test_metrax_binary_precision_and_recall_equal_sklearn_and_merge_over_microbatches():
    batch = {k: make_batch(3)[k] for k in ("scores", "binary")}

    def metrax_loss(_, b):
        return jnp.zeros(()), {
            "precision": metrax.Precision.from_model_output(b["scores"], b["binary"]),
            "recall": metrax.Recall.from_model_output(b["scores"], b["binary"]),
        }

    got = computed(
        jax.jit(lambda b: accumulate_grads_microbatched(metrax_loss, 0.0, b, 4)[1])(batch)
    )
    y, pred = batch["binary"], batch["scores"] >= 0.5
    np.testing.assert_allclose(got["precision"], skm.precision_score(y, pred), rtol=1e-6)
    np.testing.assert_allclose(got["recall"], skm.recall_score(y, pred), rtol=1e-6)
    ours = Precision.from_model_output(batch["scores"], batch["binary"])
    np.testing.assert_allclose(got["precision"], ours.compute(), rtol=1e-6)


def test_metrax_aucroc_merges_and_is_near_sklearn_but_takes_no_mask():
    batch = make_batch(4)

    def metrax_loss(_, b):
        return jnp.zeros(()), {"auroc": metrax.AUCROC.from_model_output(b["scores"], b["binary"])}

    step = jax.jit(lambda b: accumulate_grads_microbatched(metrax_loss, 0.0, b, 4)[1])
    # It compares [B] scores with [T, 1] thresholds by implicit rank promotion, which the
    # strict setting (conftest.py, recommended for training code) refuses.
    with pytest.raises(ValueError, match="rank_promotion"):
        step(batch)
    with jax.numpy_rank_promotion("allow"):
        got = computed(step(batch))
    expected = skm.roc_auc_score(batch["binary"], batch["scores"])
    assert abs(got["auroc"] - expected) < 1 / 200  # its 200 thresholds
    with pytest.raises(TypeError):
        metrax.AUCROC.from_model_output(batch["scores"], batch["binary"], mask=batch["mask"])


def test_metrax_fbeta_cannot_merge_and_perplexity_depends_on_the_split():
    scores, binary = make_batch(5)["scores"], make_batch(5)["binary"]
    f1 = metrax.FBetaScore.from_model_output(scores, binary)
    with pytest.raises(NotImplementedError):
        f1.merge(f1)
    with pytest.raises(TypeError, match=r"\['f1'\] \(FBetaScore\) cannot merge.*metrics_manager"):
        merge_metrics({"f1": f1}, {"f1": f1})  # the key and the fix, not a bare "override"
    batch = make_batch(5)
    halves = [slice(0, ROWS // 2), slice(ROWS // 2, ROWS)]
    args = [
        (batch["token_logits"][h], batch["tokens"][h], batch["token_mask"][h].astype(np.float32))
        for h in halves
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        theirs = [metrax.Perplexity.from_model_output(*a, from_logits=True) for a in args]
    ours = [Perplexity.from_model_output(*a) for a in args]
    whole = float(
        Perplexity.from_model_output(
            batch["token_logits"], batch["tokens"], batch["token_mask"]
        ).compute()
    )
    np.testing.assert_allclose(ours[0].merge(ours[1]).compute(), whole, rtol=1e-6)
    # metrax averages per batch and weights batches by their number of sequences, not tokens.
    assert abs(float(theirs[0].merge(theirs[1]).compute()) - whole) > 1e-4


def test_a_merge_of_different_bins_or_classes_names_the_setting_or_the_shapes():
    # Counts were added before settings were compared: AUROC of 10 and 20 bins raised JAX's
    # "add got incompatible shapes", naming neither the metric nor num_bins.
    scores, labels = np.array([0.1, 0.9], np.float32), np.array([0, 1])
    ten = AUROC.from_model_output(scores, labels, num_bins=10)
    with pytest.raises(ValueError, match="AUROC.merge: .* num_bins=10 and num_bins=20"):
        ten.merge(AUROC.from_model_output(scores, labels, num_bins=20))
    four = Precision.from_model_output(np.eye(4, dtype=np.float32), np.arange(4), average="macro")
    five = Precision.from_model_output(np.eye(5, dtype=np.float32), np.arange(5), average="macro")
    with pytest.raises(ValueError, match=r"Precision.merge: .*true_positives of shape \(4,\) "):
        jax.jit(lambda a, b: a.merge(b))(four, five)
    assert float(Precision.empty().merge(four).merge(four).compute()) == 1.0


def test_counts_of_one_batch_past_2_24_are_exact():
    """One batch of 64x512x512 pixels: a float32 scatter-add stopped growing at 2**24, so true
    positives and predicted positives both saturated and precision read 1.0, not 0.875."""
    n = 2**24 + 2**22  # 20,971,520; its counts below are even, so float32 holds them exactly
    labels = (jnp.arange(n) % 8 != 0).astype(jnp.int32)  # 7/8 positives
    scores = jnp.full(n, 0.9, jnp.float32)  # every pixel predicted positive
    precision = jax.jit(Precision.from_model_output)(scores, labels)
    positives = n - n // 8
    assert float(precision.true_positives[1]) == positives
    assert float(precision.false_positives[1]) == n // 8
    assert float(precision.compute()) == 0.875
    macro = jax.jit(functools.partial(Recall.from_model_output, average="macro"))(scores, labels)
    assert float(macro.false_negatives[0]) == n // 8 and float(macro.compute()) == 0.5
    auroc = jax.jit(functools.partial(AUROC.from_model_output, num_bins=10))(scores, labels)
    assert float(auroc.positives[9]) == positives and float(auroc.negatives[9]) == n // 8
    top = jax.jit(functools.partial(TopKAccuracy.from_model_output, k=1))(
        jnp.stack([1 - scores, scores], -1), labels
    )
    assert (float(top.correct), float(top.count)) == (positives, n)


@pytest.mark.parametrize(
    ("cls", "typo", "meant"),
    [
        (FBeta, "Beta", "beta"),
        (FBeta, "avg", "average"),
        (Precision, "threshhold", "threshold"),
        (Recall, "averge", "average"),
        (TopKAccuracy, "K", "k"),
        (AUROC, "num_bin", "num_bins"),
        (AUROC, "num_thresholds", "num_bins"),  # metrax's AUCROC: 200 read as 1,000 bins
    ],
)
def test_a_misspelled_setting_is_refused_not_ignored(cls, typo, meant):
    """`FBeta(..., Beta=2.0)` was F1: every keyword went to `**_`. Other keywords, the model
    outputs a CLU Collection passes to every metric, are still ignored."""
    scores, labels = jnp.array([[0.9, 0.1], [0.2, 0.8]]), jnp.array([0, 1])
    binary = cls not in (TopKAccuracy,)
    args = (scores[:, 1], labels) if binary else (scores, labels)
    extra = {"k": 1} if cls is TopKAccuracy else {}
    with pytest.raises(TypeError, match=rf"unknown keyword '{typo}'; did you mean '{meant}'"):
        cls.from_model_output(*args, **extra, **{typo: 1})
    with pytest.raises(TypeError, match=rf"unknown keyword '{typo}'"):  # a NumPy scalar too
        cls.from_model_output(*args, **extra, **{typo: np.float64(1.0)})
    # Arrays are model outputs a Collection passes to every metric, whatever their names.
    outputs = {"embeddings": scores, "weights": labels, "loss": 1.0, "betas": jnp.ones(3)}
    outputs["thresholds"] = [0.3, 0.5]  # a list: another metric's, not a misspelled setting
    metric = cls.from_model_output(*args, **extra, **outputs, **{typo: jnp.ones(2)})
    assert float(metric.compute()) == float(cls.from_model_output(*args, **extra).compute())


def test_messages_for_numpy_thresholds_log_likelihood_masks_and_binary_2_class_scores():
    scores, labels = jnp.array([0.2, 0.7]), jnp.array([0, 1])
    # A NumPy scalar threshold is a number: 0.2 is then a positive prediction.
    assert float(Recall.from_model_output(scores, labels, threshold=np.float32(0.1)).compute()) == 1
    with pytest.raises(TypeError, match=r"threshold must be a Python number.*float\(threshold\)"):
        Precision.from_model_output(scores, labels, threshold=jnp.float32(0.1))
    with pytest.raises(ValueError, match=r"does not match the log-likelihoods of shape \(4,\)"):
        Perplexity.from_log_likelihood(-jnp.ones(4), mask=jnp.ones(3, bool))
    with pytest.raises(ValueError, match=r"2-class scores.*jax.nn.softmax\(logits\)\[\.\.\., 1\]"):
        Precision.from_model_output(jnp.zeros((2, 2)), labels, average="binary")


def test_a_per_example_mask_of_shape_b_1_broadcasts_as_in_clu():
    """A (B, 1) mask beside (B, L) labels, which CLU's `Accuracy` takes, was refused."""
    labels = jnp.array([[0, 1, 2], [1, 1, 0]])
    logits = jnp.eye(3)[jnp.array([[0, 1, 1], [1, 0, 0]])]  # row 0: 2 of 3 right, row 1: 1
    mask = jnp.array([[True], [False]])
    assert float(TopKAccuracy.from_model_output(logits, labels, mask, k=1).compute()) == (
        pytest.approx(2 / 3)
    )
    assert float(Precision.from_model_output(logits, labels, mask, average="micro").compute()) == (
        pytest.approx(2 / 3)
    )
    # NLL log(e + 2) - 1, log(e + 2) - 1 and log(e + 2): exp(mean) = (e + 2) / e**(2/3)
    assert float(Perplexity.from_model_output(logits, labels, mask).compute()) == pytest.approx(
        (math.e + 2) / math.e ** (2 / 3)
    )
    with pytest.raises(ValueError, match=r"\(2,\) or \(2, 1\) \(per example\) or \(2, 3\)"):
        TopKAccuracy.from_model_output(logits, labels, mask[:1], k=1)


@pytest.mark.parametrize(
    ("dtype", "threshold", "below"),
    [(jnp.bfloat16, 0.7, 0.69921875), (jnp.float16, 0.1, 0.0999755859375)],
    ids=["bfloat16", "float16"],
)
@pytest.mark.parametrize("cls", [Precision, Recall, FBeta])
def test_a_threshold_is_not_rounded_to_half_precision_scores(cls, dtype, threshold, below):
    """A bf16 score of 0.69921875 (< 0.7) was compared with 0.7 rounded to bf16, 0.69921875:
    counted positive, unlike the same score in float32."""
    scores = jnp.array([below, 0.9, 0.05, below], dtype)  # a negative's and a positive's
    labels = np.array([0, 1, 0, 1])
    score = getattr(skm, {"FBeta": "f1_score"}.get(cls.__name__, cls.__name__.lower() + "_score"))
    expected = score(labels, np.asarray(scores, np.float64) >= threshold)
    for metric in (
        cls.from_model_output(scores, labels, threshold=threshold),
        jax.jit(functools.partial(cls.from_model_output, threshold=threshold))(scores, labels),
    ):
        assert float(metric.compute()) == pytest.approx(expected)


def test_missing_model_outputs_and_numpy_betas():
    """None (a missing model output) got JAX's own message, naming no metric or argument; a
    NumPy float32 beta, which `nnx.Metric(FBeta, beta=...)` accepts, failed at the update."""
    scores, labels = np.array([0.2, 0.9]), np.array([0, 1])
    for make, args, owner, name in [
        (Precision.from_model_output, (scores, None), "Precision", "labels"),
        (Recall.from_model_output, (None, labels), "Recall", "predictions"),
        (
            functools.partial(TopKAccuracy.from_model_output, k=1),
            (np.eye(2), None),
            "TopKAccuracy",
            "labels",
        ),
        (AUROC.from_model_output, (np.array(["a", "b"]), labels), "AUROC", "predictions"),
    ]:
        with pytest.raises(
            TypeError,
            match=rf"^{owner}.from_model_output: {name} must be an array of numbers, got .*; "
            r"check the model output passed in.$",
        ):
            make(*args)
    with pytest.raises(TypeError, match=r"^Perplexity.from_log_likelihood: log_likelihood must"):
        Perplexity.from_log_likelihood(None, labels)
    for beta in (np.float32(2.0), np.int64(2)):
        fbeta = FBeta.from_model_output(scores, labels, beta=beta)
        assert float(fbeta.compute()) == pytest.approx(
            skm.fbeta_score(labels, scores > 0.5, beta=2)
        )


def test_a_clu_collection_passes_logits_by_keyword_beside_clu_accuracy():
    """A CLU `Collection` passes model outputs by keyword, and CLU's `Accuracy` takes
    `logits=`: with `predictions` required, a Collection of both failed with Python's
    "missing 1 required positional argument: 'predictions'"."""
    import clu.metrics as clu_metrics

    rng = np.random.default_rng(3)
    logits = rng.standard_normal((12, 4)).astype(np.float32)
    labels = rng.integers(0, 4, 12).astype(np.int32)
    mask = rng.random(12) < 0.75
    collection = clu_metrics.Collection.create(
        acc=clu_metrics.Accuracy,
        top2=TopKAccuracy,
        precision=Precision,
        recall=Recall,
        f2=FBeta,
        perplexity=Perplexity,
    )
    values = collection.single_from_model_output(
        logits=jnp.asarray(logits),
        labels=jnp.asarray(labels),
        mask=mask,
        k=2,
        beta=2.0,
        average="micro",
    ).compute()
    kept, predicted = labels[mask], logits.argmax(-1)[mask]
    accuracy = np.mean(predicted == kept)  # micro precision, recall and F2 of argmax too
    top2 = np.mean([y in np.argsort(-row)[:2] for row, y in zip(logits[mask], kept, strict=True)])
    shifted = logits[mask] - logits[mask].max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    perplexity = np.exp(-np.mean(log_probs[np.arange(kept.size), kept]))
    assert 0 < accuracy < top2 < 1
    expected = {"acc": accuracy, "top2": top2, "precision": accuracy, "recall": accuracy}
    expected |= {"f2": accuracy, "perplexity": perplexity}
    assert {k: float(v) for k, v in values.items()} == pytest.approx(expected, rel=1e-6)
    # AUROC's scores are probabilities: beside logits= it takes predictions=, never logits.
    with pytest.raises(
        TypeError, match=r"^AUROC.from_model_output: got logits= but no predictions="
    ):
        clu_metrics.Collection.create(auroc=AUROC).single_from_model_output(
            logits=jnp.zeros(4), labels=jnp.array([0, 1, 0, 1])
        )
    auroc = AUROC.from_model_output(
        predictions=jnp.array([0.1, 0.4, 0.35, 0.8]),
        logits=jnp.zeros(4),
        labels=jnp.array([0, 0, 1, 1]),
    )
    assert float(auroc.compute()) == 0.75
    with pytest.raises(TypeError, match=r"^Perplexity.from_model_output: missing predictions; "):
        Perplexity.from_model_output(labels=jnp.array([0, 1]))


def test_a_clu_collection_with_auroc_and_clu_accuracy_scores_predictions_not_logits():
    """A Collection of CLU's Accuracy (logits=) and AUROC (predictions=, probabilities)
    passes both to every metric: Precision refused the pair ("pass one of them"), which a
    Collection cannot. predictions= are the scores, as `metrics_manager.nnx` takes them."""
    import clu.metrics as clu_metrics

    logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 3.0], [0.0, 0.5]])
    labels = jnp.array([0, 1, 1, 1, 0])
    probabilities = jax.nn.softmax(logits)[:, 1]  # 0.12, 0.73, 0.27, 0.95, 0.62
    collection = clu_metrics.Collection.create(
        acc=clu_metrics.Accuracy, auroc=AUROC, precision=Precision, recall=Recall, f1=FBeta
    )
    values = collection.single_from_model_output(
        logits=logits, predictions=probabilities, labels=labels
    ).compute()
    # Predicted 1 at 0.5: rows 1, 3 and 4; labels 1: rows 1, 2 and 3. Tp 2, fp 1, fn 1.
    expected = {"acc": 3 / 5, "auroc": 5 / 6, "precision": 2 / 3, "recall": 2 / 3, "f1": 2 / 3}
    assert {k: float(v) for k, v in values.items()} == pytest.approx(expected, rel=1e-6)
    # Macro over the argmax of 2-class predictions= equals that of the logits beside them.
    both = Recall.from_model_output(
        predictions=jax.nn.softmax(logits), logits=-logits, labels=labels, average="macro"
    )
    assert float(both.compute()) == pytest.approx((1 / 2 + 2 / 3) / 2)
    # Predictions that do not fit, beside logits that do not fit either, say the logits
    # were not read, and the fix.
    with pytest.raises(
        ValueError,
        match=r"predictions of shape \(5,\) do not fit .*; the logits= passed beside them are "
        r"not read \(another metric's, as CLU's Accuracy takes\): to score those, give this "
        r"metric a Collection of its own",
    ):
        TopKAccuracy.from_model_output(
            logits=logits[:4], predictions=probabilities, labels=labels, k=1
        )


def test_a_clu_collection_with_auroc_gives_topk_and_perplexity_the_logits():
    """In a Collection beside AUROC, `predictions=` are its probabilities of the labels'
    shape: TopKAccuracy and Perplexity refused them ("predictions of shape (4,) do not fit")
    and could not be in one Collection with AUROC. Of the labels' shape, beside `logits=`
    of shape [..., C], they read the logits, by shape alone (so under jit too)."""
    import clu.metrics as clu_metrics

    logits = jnp.array([[2.0, 0.0, -1.0], [0.0, 1.0, 0.5], [1.0, 0.0, 3.0], [0.0, 3.0, 1.0]])
    labels = jnp.array([0, 1, 1, 0])
    probabilities = jnp.array([0.2, 0.7, 0.4, 0.6])  # AUROC's, of the positive class
    log_probs = np.asarray(logits) - np.log(np.exp(np.asarray(logits)).sum(-1, keepdims=True))
    perplexity = float(np.exp(-np.mean(log_probs[np.arange(4), np.asarray(labels)])))
    # Argmax 0, 1, 2, 1 against labels 0, 1, 1, 0: 2 of 4 right. AUROC: 3 of 4 pairs.
    # Precision reads binary scores of the labels' shape as before: 1, 3 predicted 1, 1 right.
    expected = {"auroc": 3 / 4, "top1": 2 / 4, "perplexity": perplexity, "precision": 1 / 2}
    collection = clu_metrics.Collection.create(
        auroc=AUROC, top1=TopKAccuracy, perplexity=Perplexity, precision=Precision
    )
    outputs = {"predictions": probabilities, "logits": logits, "labels": labels}
    values = collection.single_from_model_output(**outputs, k=1).compute()
    assert {k: float(v) for k, v in values.items()} == pytest.approx(expected, rel=1e-6)
    jitted = jax.jit(lambda o: collection.single_from_model_output(**o, k=1).compute())(outputs)
    assert {k: float(v) for k, v in jitted.items()} == pytest.approx(expected, rel=1e-6)
    # Class scores as predictions= are still read before the logits beside them.
    both = Perplexity.from_model_output(predictions=logits, logits=-logits, labels=labels)
    assert float(both.compute()) == pytest.approx(perplexity, rel=1e-6)


@pytest.mark.parametrize("name", ["predictions", "logits"])
def test_messages_name_the_scores_as_they_were_passed(name):
    """Scores passed as `logits=` were called "predictions" in every message."""
    labels = jnp.array([0, 1, 1])
    with pytest.raises(ValueError, match=rf"^Perplexity.*: {name} of shape \(4, 5\) do not fit"):
        Perplexity.from_model_output(**{name: jnp.zeros((4, 5))}, labels=labels)
    with pytest.raises(ValueError, match=rf": {name} look like probabilities \(each unmasked"):
        Perplexity.from_model_output(**{name: jnp.full((3, 2), 0.5)}, labels=labels)
    with pytest.raises(ValueError, match=rf"classes \(the last axis of {name}\); choose a"):
        TopKAccuracy.from_model_output(**{name: jnp.zeros((3, 2))}, labels=labels, k=3)
    with pytest.raises(
        ValueError, match=rf"^Precision.*: {name} must be probabilities in \[0, 1\]"
    ):
        Precision.from_model_output(**{name: jnp.array([0.3, 2.0, 0.5])}, labels=labels)
    with pytest.raises(ValueError, match=rf"^FBeta.*: {name} are NaN for 1 of the 3 labels"):
        FBeta.from_model_output(
            **{name: jnp.array([jnp.nan, 1.0, 0.5])}, labels=labels, threshold=0.0
        )
    with pytest.raises(ValueError, match=rf"; {name} of the labels' shape are binary scores"):
        Recall.from_model_output(**{name: jnp.array([0.1, 0.9, 0.5])}, labels=labels + 1)
    with pytest.raises(TypeError, match=rf"^Recall.*: {name} must be an array of numbers, got str"):
        Recall.from_model_output(**{name: "scores"}, labels=labels)


def test_the_range_of_scores_outside_0_1_leaves_masked_ones_out():
    """A masked-out padding score of -1e9 was shown as the range's low end, and counted."""
    with pytest.raises(ValueError, match=r"; 1 of 3 unmasked are not \(from 0.3 to 2.0, or NaN\)"):
        AUROC.from_model_output(
            np.array([0.5, 2.0, -1e9, 0.3]), np.array([1, 0, 0, 1]), np.array([1, 1, 0, 1], bool)
        )
    with pytest.raises(ValueError, match=r"; 2 of 2 unmasked are not \(all NaN\)"):
        AUROC.from_model_output(np.array([np.nan, np.nan]), np.array([1, 0]))


def test_probabilities_passed_to_perplexity_as_logits_are_refused_eagerly():
    """metrax's Perplexity takes probabilities by default; read as logits, these confident
    ones gave 2.13, a plausible value, where their perplexity is 1.02."""
    logits = np.array([[5.0, 0.0, 0.0, 0.0], [0.0, 5.0, 0.0, 0.0], [9.0, 0.0, 0.0, 0.0]])
    probs, labels = jax.nn.softmax(logits), np.array([0, 1, 0])
    mask = np.array([True, True, False])
    expected = (np.exp(5.0) + 3) / np.exp(5.0)  # 1 / p of each label: 1.0202
    with pytest.raises(
        ValueError,
        match=r"^Perplexity.from_model_output: predictions look like probabilities \(each "
        r"unmasked row in \[0, 1\], summing to 1\), not logits; pass the logits, or "
        r"jnp.log\(probabilities\)$",
    ):
        Perplexity.from_model_output(probs, labels, mask)
    for logits_like in (logits, jnp.log(probs)):
        ppl = Perplexity.from_model_output(logits_like, labels, mask)
        assert float(ppl.compute()) == pytest.approx(expected, rel=1e-5)
    # One-hot logits (test data) and a row outside [0, 1] are no probabilities.
    one_hot = np.eye(4, dtype=np.float32)[labels]
    ppl = Perplexity.from_model_output(one_hot, labels)
    assert float(ppl.compute()) == pytest.approx((np.e + 3) / np.e, rel=1e-5)
    mixed = np.concatenate([np.asarray(probs[:2]), logits[2:]])
    assert int(Perplexity.from_model_output(mixed, labels).count) == 3


def test_perplexity_given_predictions_and_logits_reads_the_predictions_as_the_readme_says():
    """Pins the README's limit: a Collection passes every metric `predictions=` and `logits=`;
    probabilities of the logits' shape and dtype cannot be told from logits under jit."""
    logits = jnp.array([[2.0, 0.0, -1.0], [0.5, 1.5, 0.0]])
    probs, labels = jax.nn.softmax(logits), jnp.array([0, 1])
    # exp of the mean NLL of each label under softmax(x): 1.373 from the logits ...
    log_p = np.asarray(jax.nn.log_softmax(logits))
    right = math.exp(-(log_p[0, 0] + log_p[1, 1]) / 2)
    both = {"predictions": probs, "logits": logits, "labels": labels}
    assert float(Perplexity.from_model_output(logits=logits, labels=labels).compute()) == (
        pytest.approx(right, rel=1e-6)
    )
    # ... the probabilities read as logits under jit instead: 2.10 (softmax of softmax).
    log_q = np.asarray(jax.nn.log_softmax(probs))
    misread = math.exp(-(log_q[0, 0] + log_q[1, 1]) / 2)
    jitted = jax.jit(lambda kw: Perplexity.from_model_output(**kw).compute())(both)
    assert float(jitted) == pytest.approx(misread, rel=1e-6)
    assert (round(right, 2), round(misread, 2)) == (1.37, 2.1)
    with pytest.raises(ValueError, match=r"predictions look like probabilities"):
        Perplexity.from_model_output(**both)  # outside jit: refused


@pytest.mark.parametrize("cls", [Precision, TopKAccuracy, Perplexity])
def test_int64_labels_beyond_int32_are_not_wrapped_into_class_indices(cls):
    # Without x64, JAX wraps int64 to int32: a sentinel of -2**63 read as class 0, 2**32 + 1
    # as class 1, each a plausible prediction (0.75 where the three real labels give 1.0).
    logits = np.eye(3, dtype=np.float32)[[0, 1, 2, 1]]
    settings = {Precision: {"average": "micro"}, TopKAccuracy: {"k": 1}}.get(cls, {})
    # The message names no value absent from the data (-2**31 or 2**31 - 1, as clipped).
    spans = ("from -2147483648 or below to 2 where", "from 0 to 2147483647 or above where")
    for far, span in zip(
        (np.array(np.iinfo(np.int64).min), np.array(2**32 + 1, np.uint64)), spans, strict=True
    ):
        labels = np.array([0, 1, 2, far]).astype(far.dtype)
        with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)") as info:
            cls.from_model_output(logits, labels, **settings)
        assert span in str(info.value)
        metric = cls.from_model_output(logits, labels, np.array([1, 1, 1, 0], bool), **settings)
        if cls is Perplexity:
            assert float(metric.compute()) == pytest.approx((np.e + 2) / np.e, rel=1e-6)
        else:
            assert float(metric.compute()) == 1.0


def test_a_0d_mask_beside_a_batch_is_refused_as_by_the_value_metrics():
    """A 0-d mask applied to the whole batch here (micro precision 1.0 of 2 labels, or 0/0 = 0
    for False) while `Sum` refused one; the README's masks are per example ([B] or [B, 1])."""
    logits, labels = jnp.array([[2.0, 1.0], [0.0, 3.0]]), jnp.array([0, 1])
    calls = {
        "Precision": lambda m: Precision.from_model_output(logits, labels, m, average="micro"),
        "Recall": lambda m: Recall.from_model_output(logits, labels, m, average="macro"),
        "FBeta": lambda m: FBeta.from_model_output(logits, labels, m, average="micro"),
        "TopKAccuracy": lambda m: TopKAccuracy.from_model_output(logits, labels, m, k=1),
        "AUROC": lambda m: AUROC.from_model_output(jnp.array([0.2, 0.9]), labels, m),
        "Perplexity": lambda m: Perplexity.from_model_output(logits, labels, m),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError) as error:
            call(jnp.array(True))
        assert str(error.value) == (
            f"{name}.from_model_output: mask of shape () does not match the labels of shape "
            "(2,); expected a mask of shape (2,), one per value; a 0-d mask is not spread over "
            "the batch (CLU's metrics refuse it too): to keep or drop the whole batch, pass "
            "mask=jnp.full((2,), mask)"
        )
        # The fix named gives the whole batch's value, as the formulas do.
        kept = call(jnp.full((2,), True)).compute()
        assert float(kept) == pytest.approx(float(call(None).compute()))
    with pytest.raises(ValueError, match=r"pass mask=jnp.full\(\(2,\), mask\)"):
        Perplexity.from_log_likelihood(jnp.array([-1.0, -2.0]), jnp.array(True))
    # Precision of [0, 1] predicted for labels [0, 1]: 2 / 2; log-likelihoods -1, -2: e**1.5.
    assert float(calls["Precision"](jnp.full((2,), True)).compute()) == 1.0
    ll = Perplexity.from_log_likelihood(jnp.array([-1.0, -2.0]), jnp.full((2,), True))
    assert float(ll.compute()) == pytest.approx(math.exp(1.5))
    # A single 0-d label keeps its 0-d mask, as Sum keeps a step's loss: 1 of 1 right.
    one = Precision.from_model_output(jnp.array(0.9), jnp.array(1), jnp.array(True))
    assert float(one.compute()) == 1.0


# --- host copies compute in NumPy -----------------------------------------------------------

INF, NAN = np.inf, np.nan
# Per class, fields as the manager's worker copies them to the host (float32 arrays): ordinary
# values, then nothing counted, inf and NaN.
HOST_COPIES = [
    *(
        (cls, {"average": average, "outside": outside, **counts}, {})
        for cls in (Precision, Recall, FBeta)
        for average in ("binary", "micro", "macro")
        for outside in (0, 1)
        for counts in (
            {"true_positives": [3, 1], "false_positives": [1, 2], "false_negatives": [2, 0]},
            {"true_positives": [0, 0], "false_positives": [0, 0], "false_negatives": [0, 0]},
            {"true_positives": [INF, 1], "false_positives": [1, 2], "false_negatives": [2, 0]},
            {"true_positives": [3, 1], "false_positives": [NAN, 2], "false_negatives": [2, 0]},
        )
    ),
    *(
        (AUROC, {"positives": pos, "negatives": neg, "outside": outside}, {})
        for outside in (0, 1)
        for pos, neg in (
            ([0, 1, 2, 0, 3], [2, 1, 0, 1, 0]),
            ([0, 0, 0, 0, 0], [0, 0, 0, 0, 0]),
            ([0, 1, 2, 0, 3], [0, 0, 0, 0, 0]),
            ([0, INF, 2, 0, 3], [2, 1, 0, 1, 0]),
            ([0, 1, NAN, 0, 3], [2, 1, 0, 1, 0]),
        )
    ),
    # exp in float64, rounded once: np.exp in float32 is up to 3 ulp from jnp.exp on the CPU,
    # float64's 1 ulp (XLA's exp is no correctly rounded one, and differs between devices).
    *(
        (Perplexity, {"total": total, "count": count}, {"maxulp": 1})
        for total, count in (
            (1, 2),
            (7.25, 3),
            (0, 5),
            (3.5, 0),
            (0, 0),
            (-1, 2),
            (200, 2),
            (INF, 2),
            (NAN, 2),
            (1, INF),
            (INF, INF),
        )
    ),
    *(
        (cls, {"count": count, "mean": mean, "std_dev": std_dev}, {})
        for cls in (MeanStd, Welford)
        for count, mean, std_dev in (
            (3, 2.5, 1.25),
            (7, -1e30, 3e-20),
            (0, 0, 0),
            (2, INF, INF),
            (2, NAN, NAN),
            (INF, 1, 2),
            (INF, INF, INF),
        )
    ),
]


def _host_and_device(cls, fields):
    arrays = {k: np.asarray(v, np.float32) for k, v in fields.items() if k != "average"}
    host = cls(**arrays, **{k: v for k, v in fields.items() if k == "average"})
    return host, jax.device_put(host)


def _computed(metric):
    """Every value a summary writes for `metric`: compute(), and a MeanStd's std (sem)."""
    if isinstance(metric, MeanStd):
        return [metric.compute(), metric.std()] + (
            [metric.sem()] if type(metric) is Welford else []
        )
    return [metric.compute()]


@pytest.mark.parametrize(("cls", "fields", "tolerance"), HOST_COPIES)
def test_host_copies_compute_in_numpy_as_jnp_does(cls, fields, tolerance):
    """The worker computed host copies with jnp: each summary sent them to the device and back
    (refused under a transfer guard) and its value was a JAX Array. With no jax.Array field,
    compute() gives the same float32 numbers in NumPy, NaN where jnp's is NaN."""
    host, device = _host_and_device(cls, fields)
    with jax.transfer_guard("disallow"):
        got = _computed(host)
    expected = _computed(device)
    assert all(isinstance(x, jax.Array) for x in expected)  # the jnp path, as under jit
    assert [type(x) for x in got] == [np.float32] * len(expected)
    for value, reference in zip(got, expected, strict=True):
        reference = np.asarray(reference)
        if tolerance:  # ordinary values; inf and NaN as jnp gives them
            np.testing.assert_array_max_ulp(value, reference, **tolerance)
            assert np.isnan(value) == np.isnan(reference) and np.isinf(value) == np.isinf(reference)
        else:
            np.testing.assert_array_equal(value, reference, strict=True)
    jitted = jax.jit(_computed)(host)  # traced: jnp, as before
    assert all(isinstance(x, jax.Array) for x in jitted)
