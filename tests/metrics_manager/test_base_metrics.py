"""T5X's base metrics: hand-worked values, packed batches, timing numerators, and invariance.

The invariance tests run a real train step (`accumulate_grads_microbatched` inside jit) on a
fixed global batch with padding and packed segment ids, under every loss normalizing factor,
and check that no reported value depends on the number of microbatches.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metrics_manager import losses
from metrics_manager.merging import accumulate_grads_microbatched
from metrics_manager.metrics import (
    AveragePerStep,
    StepsPerTime,
    Sum,
    Time,
    TimeRate,
    set_step_metrics_num_steps,
    set_time_metrics_duration,
)
from tests.metrics_manager.test_losses import _logsumexp, _reference_token_loss

FACTORS = [None, 2.5, "NUM_REAL_TARGET_TOKENS", "NUM_TOTAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE"]
DURATION = 2.0

# Jitted once per shape: eager dispatch of every op is slower than one compile.
_normalize = jax.jit(losses.with_loss_normalization, static_argnums=1)
_loss_and_metrics = jax.jit(
    losses.compute_loss_and_metrics, static_argnames=("label_smoothing", "z_loss", "num_devices")
)


@functools.partial(jax.jit, static_argnames=("num_devices",))
def _base_metrics(logits, targets, mask, segment_ids=None, *, num_devices):
    loss, _, _ = losses.compute_weighted_cross_entropy(logits, targets, mask)
    return losses.compute_base_metrics(
        logits, targets, mask, loss, segment_ids=segment_ids, num_devices=num_devices
    )


def _values(metrics, num_steps=1):
    """Every metric's compute() as a float, after the host-side setters (as a summary does)."""
    metrics = set_time_metrics_duration(set_step_metrics_num_steps(metrics, num_steps), DURATION)
    return {key: float(metric.compute()) for key, metric in metrics.items()}


def _token_loss(logit_rows, target, z_loss=0.0):
    """Per-token loss by hand: logsumexp - target logit + z_loss * logsumexp^2."""
    log_z = math.log(sum(math.exp(v) for v in logit_rows))
    return log_z - logit_rows[target] + z_loss * log_z**2, z_loss * log_z**2


# ----------------------------------------------------------------------------- hand-worked values

# Two rows of three positions over a vocabulary of 2; row 0 has two real tokens, row 1 one.
LOGITS = jnp.array([[[0.0, 2.0], [1.0, 0.0], [0.0, 0.0]], [[0.5, 0.0], [0.0, 0.0], [3.0, 1.0]]])
TARGETS = jnp.array([[1, 1, 0], [1, 0, 0]])
Z = 0.1


def test_every_key_has_its_hand_worked_value():
    batch = _normalize({"decoder_target_tokens": TARGETS}, "NUM_REAL_TARGET_TOKENS")
    loss, metrics = _loss_and_metrics(LOGITS, batch, z_loss=Z, num_devices=2)
    # Real tokens: (0,0) target 1 (correct), (0,1) target 1 (wrong), (1,0) target 1 (wrong).
    real = [
        _token_loss([0.0, 2.0], 1, Z),
        _token_loss([1.0, 0.0], 1, Z),
        _token_loss([0.5, 0.0], 1, Z),
    ]
    loss_sum = sum(total for total, _ in real)
    z_sum = sum(z for _, z in real)
    np.testing.assert_allclose(loss, loss_sum / 3, rtol=1e-6)
    expected = {
        "accuracy": 1 / 3,
        "loss": loss_sum / 3,
        "z_loss": z_sum / 3,
        "cross_ent_loss": (loss_sum - z_sum) / 3,
        "loss_per_nonpadding_target_token": loss_sum / 3,
        "loss_per_all_target_tokens": loss_sum / 6,
        "z_loss_per_all_target_tokens": z_sum / 6,
        "cross_ent_loss_per_all_target_tokens": (loss_sum - z_sum) / 6,
        "non_padding_fraction/loss_weights": 3 / 6,
        # Unpacked: T5X's models count `decoder_target_tokens != 0` as its segment ids.
        "effective_batch_size/decoder_target_tokens": 2,
        "non_padding_fraction/decoder_target_tokens": 3 / 6,
        "non_padding_fraction/overall": 3 / 6,
        "timing/seqs": 2,
        "timing/seqs_per_second": 2 / DURATION,
        "timing/seqs_per_second_per_core": 2 / 2 / DURATION,
        "timing/target_tokens_per_second": 3 / DURATION,
        "timing/target_tokens_per_second_per_core": 3 / 2 / DURATION,
        "timing/all_target_tokens_per_second": 6 / DURATION,
        "timing/steps_per_second": 1 / DURATION,
        "timing/seconds": DURATION,
    }
    values = _values(metrics)
    assert sorted(values) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(values[key], value, rtol=1e-6, err_msg=key)


def test_timing_metrics_have_the_right_types_and_numerators():
    mask = jnp.array([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # row 1 is all padding
    metrics = _base_metrics(LOGITS, TARGETS, mask, num_devices=4)
    assert isinstance(metrics["timing/seconds"], Time)
    assert isinstance(metrics["timing/steps_per_second"], StepsPerTime)
    assert isinstance(metrics["timing/seqs"], Sum)
    numerators = {
        # All-padding rows are not sequences; padding tokens are not target tokens.
        "timing/seqs_per_second": 1.0,
        "timing/seqs_per_second_per_core": 1.0 / 4,
        "timing/target_tokens_per_second": 2.0,
        "timing/target_tokens_per_second_per_core": 2.0 / 4,
        "timing/all_target_tokens_per_second": 6.0,
    }
    for key, numerator in numerators.items():
        assert isinstance(metrics[key], TimeRate), key
        np.testing.assert_allclose(metrics[key].numerator, numerator, err_msg=key)
    assert float(metrics["timing/seqs"].total) == 1.0
    assert int(metrics["timing/steps_per_second"].steps) == 1


def test_per_core_defaults_to_the_devices_the_step_runs_on():
    mask = (TARGETS > 0).astype(jnp.float32)
    loss, _, _ = losses.compute_weighted_cross_entropy(LOGITS, TARGETS, mask)

    def per_core(logits):
        metrics = losses.compute_base_metrics(logits, TARGETS, mask, loss)
        return metrics["timing/target_tokens_per_second_per_core"].numerator

    # Outside jit: the devices holding the logits (one here).
    assert float(per_core(LOGITS)) == 3.0
    # Under a mesh: the mesh's devices.
    mesh = jax.make_mesh((4,), ("data",), devices=jax.devices()[:4])
    with jax.set_mesh(mesh):
        assert float(jax.jit(per_core)(LOGITS)) == 3.0 / 4
    # Inside jit with no mesh: every device, as a step partitioned over all of them.
    assert float(jax.jit(per_core)(LOGITS)) == 3.0 / jax.device_count()


def test_effective_batch_size_and_non_padding_fractions_of_packed_features():
    segment_ids = {
        "decoder": jnp.array([[1, 1, 2], [1, 2, 3], [0, 0, 0]]),
        "encoder": jnp.array([[1, 1, 2], [1, 1, 1], [1, 0, 0]]),
        "missing": None,
    }
    targets = jnp.array([[3, 3, 4], [1, 2, 3], [0, 0, 0]])
    logits = jnp.zeros((3, 3, 5))
    metrics = _base_metrics(logits, targets, targets > 0, segment_ids, num_devices=1)
    assert isinstance(metrics["effective_batch_size/decoder"], AveragePerStep)
    values = _values(metrics)
    # decoder: 2 + 3 + 0 packed examples; encoder: 2 + 1 + 1.
    assert values["effective_batch_size/decoder"] == 5.0
    assert values["effective_batch_size/encoder"] == 4.0
    np.testing.assert_allclose(values["non_padding_fraction/decoder"], 6 / 9, rtol=1e-6)
    np.testing.assert_allclose(values["non_padding_fraction/encoder"], 7 / 9, rtol=1e-6)
    np.testing.assert_allclose(values["non_padding_fraction/overall"], 13 / 18, rtol=1e-6)
    assert "effective_batch_size/missing" not in values
    # Over a window of two steps the per-step average halves the summed count.
    assert _values(metrics, num_steps=2)["effective_batch_size/decoder"] == 2.5


def test_padding_masks_of_an_unpacked_batch_count_as_t5x_models_pass_them():
    # T5X's models pass `{feature: tokens != 0}` (bool) when a batch is not packed: it was
    # refused ("must be an integer (e.g. int32) array; got dtype bool").
    batch = {
        "encoder_input_tokens": jnp.array([[4, 4, 4, 0], [1, 0, 0, 0], [2, 2, 0, 0]]),
        "decoder_target_tokens": jnp.array([[1, 2, 0, 0], [3, 3, 3, 3], [0, 0, 0, 0]]),
    }
    targets = batch["decoder_target_tokens"]
    segment_ids = {k: v != 0 for k, v in batch.items()}
    values = _values(
        _base_metrics(jnp.zeros((3, 4, 5)), targets, targets > 0, segment_ids, num_devices=1)
    )
    # A row with a real token is one example: 3 encoder rows, 2 decoder rows (one all padding).
    assert values["effective_batch_size/encoder_input_tokens"] == 3.0
    assert values["effective_batch_size/decoder_target_tokens"] == 2.0
    assert values["non_padding_fraction/encoder_input_tokens"] == 6 / 12
    assert values["non_padding_fraction/decoder_target_tokens"] == 6 / 12
    assert values["non_padding_fraction/overall"] == 12 / 24
    assert int(losses.count_packed_examples(segment_ids["encoder_input_tokens"])) == 3
    with pytest.raises(TypeError, match=r"integer \(e.g. int32\) or bool array; got dtype float32"):
        losses.count_packed_examples(jnp.ones((2, 3)))


def test_batch_segment_ids_become_features():
    batch = {
        "decoder_target_tokens": jnp.array([[3, 3, 4, 0], [1, 2, 0, 0]]),
        "decoder_segment_ids": jnp.array([[1, 1, 2, 0], [1, 1, 0, 0]]),
    }
    _, metrics = _loss_and_metrics(jnp.zeros((2, 4, 5)), batch, num_devices=1)
    values = _values(metrics)
    assert values["effective_batch_size/decoder"] == 3.0
    # T5X's models pass their z-loss (0.0 by default) every step: its keys were left out.
    assert values["z_loss"] == values["z_loss_per_all_target_tokens"] == 0.0
    assert (
        values["cross_ent_loss"] == values["loss"] == pytest.approx(5 * np.log(5))
    )  # 5 real tokens
    assert values["cross_ent_loss_per_all_target_tokens"] == pytest.approx(5 * np.log(5) / 8)


def test_an_unpacked_batch_counts_its_padding_masks_as_t5x_models_do():
    # T5X's models pass `{k: v != 0}` of encoder_input_tokens and decoder_target_tokens when a
    # batch has no `*_segment_ids`: no effective_batch_size or non_padding_fraction/<feature>
    # key was written for an unpacked batch.
    batch = {
        "encoder_input_tokens": jnp.array([[4, 4, 4, 0, 0], [1, 0, 0, 0, 0], [2, 2, 0, 0, 0]]),
        "decoder_target_tokens": jnp.array([[1, 2, 0, 0], [3, 3, 3, 3], [0, 0, 0, 0]]),
    }
    _, metrics = _loss_and_metrics(jnp.zeros((3, 4, 5)), batch, num_devices=1)
    values = _values(metrics, num_steps=2)
    # Rows with a real token, per step: 3 encoder rows, 2 decoder rows (one all padding).
    assert values["effective_batch_size/encoder_input_tokens"] == 3 / 2
    assert values["effective_batch_size/decoder_target_tokens"] == 2 / 2
    assert values["non_padding_fraction/encoder_input_tokens"] == pytest.approx(6 / 15)
    assert values["non_padding_fraction/decoder_target_tokens"] == pytest.approx(6 / 12)
    assert values["non_padding_fraction/overall"] == pytest.approx(12 / 27)
    # Any `*_segment_ids` key: those features only, as in T5X.
    batch["decoder_segment_ids"] = (batch["decoder_target_tokens"] != 0).astype(jnp.int32)
    _, metrics = _loss_and_metrics(jnp.zeros((3, 4, 5)), batch, num_devices=1)
    assert {k for k in metrics if k.startswith(("effective_batch_size/", "non_padding_"))} == {
        "effective_batch_size/decoder",
        "non_padding_fraction/decoder",
        "non_padding_fraction/overall",
        "non_padding_fraction/loss_weights",
    }


# ----------------------------------------------------------------------------- T5X's errors, fixed


def _packed_batch():
    """A global batch of 8 rows with padding, one all-padding row, and packed segment ids."""
    segment_ids = np.array(
        [
            [1, 1, 1, 2, 2, 0],
            [1, 1, 1, 1, 1, 1],
            [1, 2, 3, 3, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 2, 2],
            [1, 0, 0, 0, 0, 0],
            [1, 1, 2, 2, 2, 0],
        ]
    )
    rng = np.random.default_rng(7)
    targets = np.where(segment_ids > 0, rng.integers(1, 7, segment_ids.shape), 0)
    inputs = np.where(segment_ids > 0, rng.integers(1, 7, segment_ids.shape), 0)
    return {
        "decoder_input_tokens": jnp.asarray(inputs, jnp.int32),
        "decoder_target_tokens": jnp.asarray(targets, jnp.int32),
        "decoder_segment_ids": jnp.asarray(segment_ids, jnp.int32),
    }


def _logits(params, tokens):
    # A one-hot matmul rather than a gather, so it also traces under explicit sharding.
    return jnp.tanh(jax.nn.one_hot(tokens, 7) @ params["embed"]) @ params["out"]


PARAMS = {
    "embed": jnp.asarray(np.random.default_rng(0).normal(size=(7, 4)), jnp.float32),
    "out": jnp.asarray(np.random.default_rng(1).normal(size=(4, 7)), jnp.float32),
}


@pytest.mark.parametrize("factor", FACTORS)
def test_per_token_values_do_not_depend_on_the_normalizing_factor(factor):
    @jax.jit
    def step(params, batch):
        batch = losses.with_loss_normalization(batch, factor)
        logits = _logits(params, batch["decoder_input_tokens"])
        _, metrics = losses.compute_loss_and_metrics(
            logits, batch, label_smoothing=0.1, z_loss=1e-3, num_devices=1
        )
        return logits, metrics

    batch = _packed_batch()
    logits, metrics = step(PARAMS, batch)
    values = _values(metrics)
    targets = np.asarray(batch["decoder_target_tokens"])
    real = targets > 0
    token_loss = _reference_token_loss(logits, targets, label_smoothing=0.1, z_loss=1e-3)
    token_z = 1e-3 * _logsumexp(logits) ** 2
    expected = {
        "loss_per_nonpadding_target_token": token_loss[real].mean(),
        "loss_per_all_target_tokens": token_loss[real].sum() / targets.size,
        "z_loss_per_all_target_tokens": token_z[real].sum() / targets.size,
        "cross_ent_loss_per_all_target_tokens": (token_loss - token_z)[real].sum() / targets.size,
        "non_padding_fraction/loss_weights": real.mean(),
        "accuracy": (np.asarray(logits).argmax(-1) == targets)[real].mean(),
    }
    for key, value in expected.items():
        np.testing.assert_allclose(values[key], value, rtol=1e-5, err_msg=key)


@pytest.mark.parametrize("factor", [None, 2.5, "NUM_REAL_TARGET_TOKENS", "NUM_TOTAL_TARGET_TOKENS"])
def test_per_token_values_from_the_scalar_loss_undo_the_factor(factor):
    """Without token_losses, per-token values come from loss * factor (exact for binary weights)."""

    @jax.jit
    def step(params, batch):
        logits = _logits(params, batch["decoder_input_tokens"])
        targets = batch["decoder_target_tokens"]
        resolved, weights = losses.get_loss_normalizing_factor_and_weights(factor, batch)
        weights = (targets > 0).astype(jnp.float32) if weights is None else weights
        loss, z, _ = losses.compute_weighted_cross_entropy(
            logits, targets, weights, z_loss=1e-3, loss_normalizing_factor=resolved
        )
        return logits, losses.compute_base_metrics(
            logits, targets, weights, loss, z, loss_normalizing_factor=resolved, num_devices=1
        )

    batch = _packed_batch()
    logits, metrics = step(PARAMS, batch)
    targets = np.asarray(batch["decoder_target_tokens"])
    token_loss = _reference_token_loss(logits, targets, z_loss=1e-3)
    np.testing.assert_allclose(
        _values(metrics)["loss_per_nonpadding_target_token"],
        token_loss[targets > 0].mean(),
        rtol=1e-5,
    )


def test_rewritten_weights_do_not_skew_the_non_padding_fraction():
    batch = _normalize(_packed_batch(), "AVERAGE_PER_SEQUENCE")
    weights = batch["decoder_loss_weights"]
    assert float(jnp.max(weights)) == 1.0 and float(jnp.min(jnp.where(weights > 0, weights, 1))) < 1
    logits = _logits(PARAMS, batch["decoder_input_tokens"])
    _, metrics = _loss_and_metrics(logits, batch, num_devices=1)
    real = np.asarray(batch["decoder_segment_ids"]) > 0
    np.testing.assert_allclose(
        _values(metrics)["non_padding_fraction/loss_weights"], real.mean(), rtol=1e-6
    )


# ----------------------------------------------------------------------------- microbatch invariance


@functools.partial(jax.jit, static_argnames=("factor", "num_microbatches", "per_microbatch_factor"))
def _train_step(params, batch, *, factor, num_microbatches, per_microbatch_factor=False):
    """The documented pattern: resolve the factor on the global batch, then microbatch."""
    if not per_microbatch_factor:
        batch = losses.with_loss_normalization(batch, factor)

    def loss_fn(params, microbatch):
        if per_microbatch_factor:  # T5X's way, for contrast: a factor per microbatch
            microbatch = losses.with_loss_normalization(microbatch, factor)
        logits = _logits(params, microbatch["decoder_input_tokens"])
        return losses.compute_loss_and_metrics(
            logits, microbatch, label_smoothing=0.1, z_loss=1e-3, num_devices=8
        )

    return accumulate_grads_microbatched(loss_fn, params, batch, num_microbatches)


@pytest.mark.parametrize("factor", FACTORS)
def test_no_value_depends_on_the_number_of_microbatches(factor):
    batch = _packed_batch()
    reference_grads, reference = _train_step(PARAMS, batch, factor=factor, num_microbatches=1)
    reference_values = _values(reference)
    assert "effective_batch_size/decoder" in reference_values
    for num_microbatches in (2, 4, 8):
        grads, metrics = _train_step(
            PARAMS, batch, factor=factor, num_microbatches=num_microbatches
        )
        values = _values(metrics)
        assert sorted(values) == sorted(reference_values)
        for key, value in reference_values.items():
            np.testing.assert_allclose(
                values[key], value, rtol=1e-5, atol=1e-6, err_msg=f"{key}, n={num_microbatches}"
            )
        for name in PARAMS:
            np.testing.assert_allclose(
                grads[name], reference_grads[name], rtol=1e-5, atol=1e-6, err_msg=name
            )


@pytest.mark.parametrize("factor", ["NUM_REAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE"])
def test_a_per_microbatch_factor_would_break_invariance(factor):
    """Shows the invariance test can fail: T5X's per-microbatch factor changes the loss."""
    batch = _packed_batch()
    _, whole = _train_step(PARAMS, batch, factor=factor, num_microbatches=1)
    _, split = _train_step(
        PARAMS, batch, factor=factor, num_microbatches=4, per_microbatch_factor=True
    )
    assert abs(_values(split)["loss"] - _values(whole)["loss"]) > 0.1 * _values(whole)["loss"]


# ----------------------------------------------------------------------------- bad input


def test_labels_of_the_wrong_dtype_name_what_was_expected_and_what_came():
    loss = jnp.float32(1.0)
    with pytest.raises(TypeError) as info:
        losses.compute_base_metrics(LOGITS, TARGETS.astype(jnp.float32), None, loss)
    message = str(info.value)
    assert "`targets`" in message and "integer" in message and "float32" in message
    batch = {"decoder_target_tokens": TARGETS.astype(jnp.bfloat16)}
    with pytest.raises(TypeError, match=r"`targets`.*integer.*bfloat16"):
        losses.compute_loss_and_metrics(LOGITS, batch)


def test_python_numbers_as_loss_and_z_loss_are_taken_as_in_t5x():
    """`loss=2.0` or `z_loss=0.0` (T5X takes them) were refused: not a floating-point array."""
    mask = (TARGETS > 0).astype(jnp.float32)
    metrics = losses.compute_base_metrics(LOGITS, TARGETS, mask, 2, z_loss=0.5, num_devices=1)
    values = _values(metrics)
    assert (values["loss"], values["z_loss"], values["cross_ent_loss"]) == (2.0, 0.5, 1.5)
    assert metrics["loss"].total.dtype == metrics["z_loss"].total.dtype == jnp.float32
    with pytest.raises(TypeError, match=r"`z_loss` must be a floating-point array; got str '0'"):
        losses.compute_base_metrics(LOGITS, TARGETS, mask, 2.0, z_loss="0", num_devices=1)
    with pytest.raises(TypeError, match=r"`loss` must be a floating-point array; got bool True"):
        losses.compute_base_metrics(LOGITS, TARGETS, mask, True, num_devices=1)


def test_bad_shapes_and_arguments_are_all_listed():
    with pytest.raises(ValueError) as info:
        losses.compute_base_metrics(
            LOGITS,
            TARGETS,
            jnp.ones((2, 4)),  # wrong mask shape
            jnp.ones(2),  # loss not a scalar
            segment_ids={"decoder": jnp.ones(3, jnp.int32)},  # not [B, L]
            num_devices=0,
        )
    message = str(info.value)
    assert "4 problems:" in message
    assert "`mask`" in message and "`loss` must be a scalar" in message
    assert "segment_ids['decoder']" in message and "num_devices" in message


def test_a_per_row_factor_needs_token_losses():
    with pytest.raises(ValueError, match="pass `token_losses`"):
        losses.compute_base_metrics(
            LOGITS, TARGETS, None, jnp.float32(1.0), loss_normalizing_factor=jnp.ones(2)
        )


@pytest.mark.parametrize(
    "axis_type,num_microbatches",
    [(jax.sharding.AxisType.Explicit, 1), (jax.sharding.AxisType.Auto, 2)],
)
@pytest.mark.parametrize("factor", ["NUM_REAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE"])
def test_batch_sharded_over_eight_devices_gives_the_single_device_values(
    factor, axis_type, num_microbatches
):
    batch = _packed_batch()
    _, single = _train_step(PARAMS, batch, factor=factor, num_microbatches=num_microbatches)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,), devices=jax.devices()[:8])
    sharded = jax.device_put(batch, jax.NamedSharding(mesh, jax.P("data")))
    replicated = jax.device_put(PARAMS, jax.NamedSharding(mesh, jax.P()))
    with jax.set_mesh(mesh):
        _, multi = _train_step(
            replicated, sharded, factor=factor, num_microbatches=num_microbatches
        )
    single_values, multi_values = _values(single), _values(multi)
    assert sorted(multi_values) == sorted(single_values)
    for key, value in single_values.items():
        np.testing.assert_allclose(multi_values[key], value, rtol=1e-6, atol=1e-7, err_msg=key)


def test_the_train_step_makes_no_host_transfer():
    batch = jax.device_put(_packed_batch())
    params = jax.device_put(PARAMS)
    _train_step(params, batch, factor="AVERAGE_PER_SEQUENCE", num_microbatches=2)  # compile
    with jax.transfer_guard("disallow"):
        grads, metrics = _train_step(
            params, batch, factor="AVERAGE_PER_SEQUENCE", num_microbatches=2
        )
    assert isinstance(metrics["loss"].total, jax.Array)


# ----------------------------------------------------------------------------- the pieces agree


@functools.partial(jax.jit, static_argnames=("factor",))
def _fused_and_composed(params, batch, factor):
    """compute_loss_and_metrics, and the same loss, grads and metrics from the public pieces."""
    batch = losses.with_loss_normalization(batch, factor)
    kwargs = {"label_smoothing": 0.1, "z_loss": 1e-3}

    def fused(p):
        logits = _logits(p, batch["decoder_input_tokens"])
        return losses.compute_loss_and_metrics(logits, batch, num_devices=1, **kwargs)

    def composed(p):
        logits = _logits(p, batch["decoder_input_tokens"])
        targets = batch["decoder_target_tokens"]
        weights = batch.get("decoder_loss_weights", (targets > 0).astype(jnp.float32))
        loss, z_loss, _ = losses.compute_weighted_cross_entropy(
            logits,
            targets,
            weights,
            loss_normalizing_factor=batch["loss_normalizing_factor"],
            **kwargs,
        )
        metrics = losses.compute_base_metrics(
            logits,
            targets,
            weights,
            loss,
            z_loss,
            segment_ids={"decoder": batch["decoder_segment_ids"]},
            token_losses=losses.compute_token_losses(logits, targets, **kwargs),
            num_devices=1,
        )
        return loss, metrics

    return (
        jax.value_and_grad(fused, has_aux=True)(params),
        jax.value_and_grad(composed, has_aux=True)(params),
    )


@pytest.mark.parametrize("factor", FACTORS)
def test_fused_loss_and_metrics_equal_the_public_pieces_composed(factor):
    """compute_loss_and_metrics (one pass over the batch) equals its public pieces composed."""
    ((loss, metrics), grads), ((ref_loss, ref_metrics), ref_grads) = _fused_and_composed(
        PARAMS, _packed_batch(), factor
    )
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), grads, ref_grads
    )
    assert sorted(metrics) == sorted(ref_metrics)
    values, ref_values = _values(metrics), _values(ref_metrics)
    for key in ref_values:
        np.testing.assert_allclose(values[key], ref_values[key], rtol=1e-6, err_msg=key)
