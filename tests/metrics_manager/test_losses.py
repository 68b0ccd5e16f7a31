"""Losses: cross-entropy, label smoothing, z-loss and its VJP, loss normalizing factors.

Expected numbers are worked out from the formulas with numpy/math, independently of the
implementation (which never materializes one-hot targets and has a hand-written VJP).
"""

import doctest
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrics_manager import losses, merge_metrics
from metrics_manager.losses import SpecialLossNormalizingFactor as LNF


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _logsumexp(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits, np.float64)
    top = logits.max(-1)
    return top + np.log(np.exp(logits - top[..., None]).sum(-1))


def _soft_targets(targets: np.ndarray, vocab: int, label_smoothing: float) -> np.ndarray:
    low = label_smoothing / (vocab - 1)
    onehot = np.eye(vocab)[np.asarray(targets)]
    return np.where(onehot == 1, 1.0 - label_smoothing, low)


def _reference_token_loss(logits, targets, label_smoothing=0.0, z_loss=0.0):
    """KL(soft targets || softmax) + z_loss * logsumexp^2, per token, in float64."""
    q = _soft_targets(targets, np.shape(logits)[-1], label_smoothing)
    entropy = -np.sum(np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0), -1)
    cross_ent = -np.sum(q * _log_softmax(logits), -1)
    return cross_ent - entropy + z_loss * _logsumexp(logits) ** 2


def _plain_jax_loss(logits, targets, label_smoothing, z_loss):
    """The same loss written plainly in JAX, so autodiff gives the reference gradient."""
    vocab = logits.shape[-1]
    low = label_smoothing / (vocab - 1)
    q = jnp.where(jax.nn.one_hot(targets, vocab) == 1, 1.0 - label_smoothing, low)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    return jnp.sum(-jnp.sum(q * jax.nn.log_softmax(logits), -1) + z_loss * log_z**2)


LOGITS = jnp.array([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], [[2.0, -1.0, 0.5], [0.3, 0.2, 0.1]]])
TARGETS = jnp.array([[2, 0], [1, 0]])

# Jitted once per shape: eager dispatch of the packed-segment scan is slower than a compile.
_resolve = jax.jit(losses.get_loss_normalizing_factor_and_weights, static_argnums=0)


def test_docstring_examples_run():
    result = doctest.testmod(losses, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 15
    assert result.failed == 0


# ----------------------------------------------------------------------------- cross-entropy


def test_cross_entropy_hand_worked_values():
    token = losses.compute_token_losses(LOGITS[:1], TARGETS[:1])
    # Token 0: logsumexp(1, 2, 3) - 3; token 1: uniform over 3 -> ln 3.
    expected = [math.log(math.e + math.e**2 + math.e**3) - 3.0, math.log(3.0)]
    np.testing.assert_allclose(token.loss[0], expected, rtol=1e-6)
    np.testing.assert_allclose(token.z_loss, 0.0)


def test_weighted_cross_entropy_sums_weights_and_divides_by_factor():
    weights = jnp.array([[1.0, 0.0], [0.5, 2.0]])
    per_token = _reference_token_loss(LOGITS, TARGETS)
    loss, z, weight_sum = losses.compute_weighted_cross_entropy(
        LOGITS, TARGETS, weights, loss_normalizing_factor=4.0
    )
    np.testing.assert_allclose(loss, np.sum(per_token * np.asarray(weights)) / 4.0, rtol=1e-6)
    assert float(z) == 0.0
    assert float(weight_sum) == 3.5
    # No weights, no factor: the plain sum over all tokens; weight_sum is B * L.
    loss, _, weight_sum = losses.compute_weighted_cross_entropy(LOGITS, TARGETS)
    np.testing.assert_allclose(loss, per_token.sum(), rtol=1e-6)
    assert float(weight_sum) == 4.0


def test_per_row_factor_divides_each_row():
    per_token = _reference_token_loss(LOGITS, TARGETS)
    loss, _, _ = losses.compute_weighted_cross_entropy(
        LOGITS, TARGETS, loss_normalizing_factor=jnp.array([2.0, 5.0])
    )
    np.testing.assert_allclose(loss, per_token[0].sum() / 2 + per_token[1].sum() / 5, rtol=1e-6)


@pytest.mark.parametrize("label_smoothing", [0.1, 0.3])
def test_label_smoothing_perfect_prediction_scores_zero(label_smoothing):
    vocab = 5
    targets = jnp.array([[0, 3, 4]])
    q = _soft_targets(targets, vocab, label_smoothing)
    perfect = jnp.asarray(np.log(q), jnp.float32)
    loss, _, _ = losses.compute_weighted_cross_entropy(
        perfect, targets, label_smoothing=label_smoothing
    )
    assert abs(float(loss)) < 1e-5
    # Any other prediction scores KL(q || p) > 0.
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(1, 3, vocab)), jnp.float32)
    token = losses.compute_token_losses(logits, targets, label_smoothing=label_smoothing)
    expected = _reference_token_loss(logits, targets, label_smoothing)
    np.testing.assert_allclose(token.loss, expected, rtol=1e-5)
    assert np.all(np.asarray(token.loss) > 0)


def test_z_loss_value_is_coefficient_times_logsumexp_squared():
    z_loss = 1e-2
    weights = jnp.array([[1.0, 1.0], [0.0, 1.0]])
    token = losses.compute_token_losses(LOGITS, TARGETS, z_loss=z_loss)
    np.testing.assert_allclose(token.z_loss, z_loss * _logsumexp(LOGITS) ** 2, rtol=1e-6)
    np.testing.assert_allclose(
        token.loss, _reference_token_loss(LOGITS, TARGETS, z_loss=z_loss), rtol=1e-6
    )
    loss, z, _ = losses.compute_weighted_cross_entropy(
        LOGITS, TARGETS, weights, z_loss=z_loss, loss_normalizing_factor=3.0
    )
    w = np.asarray(weights)
    np.testing.assert_allclose(z, np.sum(w * z_loss * _logsumexp(LOGITS) ** 2) / 3, rtol=1e-6)
    np.testing.assert_allclose(
        loss, np.sum(w * _reference_token_loss(LOGITS, TARGETS, z_loss=z_loss)) / 3, rtol=1e-6
    )


@pytest.mark.parametrize("label_smoothing,z_loss", [(0.0, 0.0), (0.0, 0.05), (0.2, 0.05)])
def test_gradient_matches_autodiff_of_the_plain_formula(label_smoothing, z_loss):
    def ours(logits):
        loss, _, _ = losses.compute_weighted_cross_entropy(
            logits, TARGETS, label_smoothing=label_smoothing, z_loss=z_loss
        )
        return loss

    expected = jax.grad(_plain_jax_loss)(LOGITS, TARGETS, label_smoothing, z_loss)
    np.testing.assert_allclose(jax.jit(jax.grad(ours))(LOGITS), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("label_smoothing,z_loss", [(0.0, 0.0), (0.2, 0.05)])
def test_targets_outside_the_vocabulary_get_t5xs_all_zero_one_hot(label_smoothing, z_loss):
    """An ignore index (-100, -1) or an id >= V: no target term, as T5X's one-hot gives,
    in the value and the gradient; with weight 0 such tokens cost nothing (was NaN)."""
    targets = jnp.array([[2, -100], [-1, 3]])  # V = 3: -100, -1 and 3 are outside
    vocab = LOGITS.shape[-1]
    low = label_smoothing / (vocab - 1)
    q = np.where(np.asarray(jax.nn.one_hot(targets, vocab)) == 1, 1.0 - label_smoothing, low)
    t5x_constant = -((1.0 - label_smoothing) * np.log(1.0 - label_smoothing))
    t5x_constant -= (vocab - 1) * low * np.log(low + 1e-20)
    expected = -np.sum(q * _log_softmax(LOGITS), -1) - t5x_constant
    expected += z_loss * _logsumexp(LOGITS) ** 2
    per_token = jax.jit(losses.compute_token_losses, static_argnames="label_smoothing")(
        LOGITS, targets, label_smoothing=label_smoothing, z_loss=z_loss
    )
    np.testing.assert_allclose(per_token.loss, expected, rtol=1e-5, atol=1e-6)

    def ours(logits):
        return losses.compute_weighted_cross_entropy(
            logits, targets, None, label_smoothing, z_loss
        )[0]

    autodiff = jax.grad(_plain_jax_loss)(LOGITS, targets, label_smoothing, z_loss)
    np.testing.assert_allclose(jax.jit(jax.grad(ours))(LOGITS), autodiff, rtol=1e-5, atol=1e-6)
    weights = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # the out-of-range ones masked
    loss, _, count = losses.compute_weighted_cross_entropy(
        LOGITS, targets, weights, label_smoothing, z_loss
    )
    assert float(count) == 2.0
    np.testing.assert_allclose(loss, expected[0, 0] + expected[1, 1], rtol=1e-5)


@pytest.mark.parametrize(
    "dtype,vocab", [(np.uint8, 256), (np.uint8, 300), (np.int8, 128), (np.int16, 32768)]
)
def test_narrow_integer_targets_give_the_int32_loss_and_gradient(dtype, vocab):
    """Byte-level ids as uint8, a 32k vocabulary as int16: the vocabulary size wrapped in the
    targets' own dtype (256 is 0 in uint8), so under jit every target read as out of range
    and the loss as 0 (or, for V = 300, a loss over some of the targets)."""
    logits = jax.random.normal(jax.random.key(0), (2, 3, vocab))
    ids = np.random.default_rng(0).integers(1, np.iinfo(dtype).max, (2, 3))
    step = jax.jit(
        jax.value_and_grad(lambda x, t: losses.compute_weighted_cross_entropy(x, t, z_loss=1e-4)[0])
    )
    narrow, wide = step(logits, ids.astype(dtype)), step(logits, ids.astype(np.int32))
    assert float(wide[0]) > 1.0
    np.testing.assert_allclose(narrow[0], wide[0], rtol=1e-6)
    np.testing.assert_allclose(narrow[1], wide[1], rtol=1e-6, atol=1e-9)
    batch = {"decoder_target_tokens": ids.astype(dtype)}
    loss, metrics = jax.jit(functools.partial(losses.compute_loss_and_metrics, z_loss=1e-4))(
        logits, batch
    )
    np.testing.assert_allclose(loss, wide[0], rtol=1e-6)
    assert float(metrics["loss"].compute()) == pytest.approx(float(wide[0]), rel=1e-6)


def test_logged_z_loss_carries_no_gradient_but_the_loss_trains_on_it():
    def logged_z(logits):
        return losses.compute_weighted_cross_entropy(logits, TARGETS, z_loss=0.1)[1]

    def loss_with_z(logits, z_loss):
        return losses.compute_weighted_cross_entropy(logits, TARGETS, z_loss=z_loss)[0]

    assert float(logged_z(LOGITS)) > 0
    np.testing.assert_array_equal(jax.grad(logged_z)(LOGITS), 0.0)
    # The z-loss's contribution to the loss's gradient is d(z * logZ^2) = 2 z logZ softmax.
    contribution = jax.grad(loss_with_z)(LOGITS, 0.1) - jax.grad(loss_with_z)(LOGITS, 0.0)
    softmax = np.exp(_log_softmax(LOGITS))
    expected = 2 * 0.1 * _logsumexp(LOGITS)[..., None] * softmax
    np.testing.assert_allclose(contribution, expected, rtol=1e-5, atol=1e-7)


def test_t5x_cross_entropy_with_logits_values_gradients_and_errors():
    # T5X's soft-target function (its name raised AttributeError here).
    q = jnp.asarray(_soft_targets(TARGETS, 3, 0.2), jnp.float32)
    loss, z = losses.cross_entropy_with_logits(LOGITS, q, 0.05)
    z_expected = 0.05 * _logsumexp(LOGITS) ** 2
    np.testing.assert_allclose(z, z_expected, rtol=1e-6)
    cross_ent = -np.sum(np.asarray(q) * _log_softmax(LOGITS), -1)
    np.testing.assert_allclose(loss, cross_ent + z_expected, rtol=1e-6)
    # compute_weighted_cross_entropy is its sum less the smoothing entropy, as in T5X.
    entropy = -(0.8 * math.log(0.8) + 2 * 0.1 * math.log(0.1))
    total, _, _ = losses.compute_weighted_cross_entropy(LOGITS, TARGETS, None, 0.2, 0.05)
    np.testing.assert_allclose(float(total), float(loss.sum()) - 4 * entropy, rtol=1e-6)
    # T5X's VJP: g * ((1 + 2 z logZ) softmax - targets); the logged z-loss has none.
    grad = jax.grad(lambda x: losses.cross_entropy_with_logits(x, q, 0.05)[0].sum())(LOGITS)
    scale = 1 + 2 * 0.05 * _logsumexp(LOGITS)[..., None]
    expected = scale * np.exp(_log_softmax(LOGITS)) - np.asarray(q)
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6)
    z_grad = jax.grad(lambda x: losses.cross_entropy_with_logits(x, q, 0.05)[1].sum())(LOGITS)
    np.testing.assert_array_equal(z_grad, 0.0)
    with pytest.raises(TypeError, match=r"`targets` must be a floating-point array; got dtype"):
        losses.cross_entropy_with_logits(LOGITS, TARGETS, 0.0)  # token ids
    with pytest.raises(ValueError, match=r"logits' shape \(2, 2, 3\); got shape \(2, 3\)"):
        losses.cross_entropy_with_logits(LOGITS, q[0], 0.0)


def test_cross_entropy_with_logits_masked_to_minus_inf_beside_zero_targets_is_finite():
    # A vocabulary entry masked with -inf beside a target of 0: T5X's 0 * -inf read NaN;
    # log(1 + e**-1) = 0.3133, as compute_weighted_cross_entropy already read it.
    logits = jnp.array([[0.0, 1.0, -jnp.inf], [2.0, -jnp.inf, 0.5], [1.0, 2.0, 3.0]])
    q = jnp.array([[0.0, 1.0, 0.0], [0.7, 0.0, 0.3], [0.1, 0.1, 0.8]])

    def reference(x, targets, z_loss):  # float64; a zero target's term is 0
        log_p = jax.nn.log_softmax(x)
        terms = jnp.where(targets != 0, targets * jnp.where(targets != 0, log_p, 0), 0)
        return -terms.sum(-1) + z_loss * jax.nn.logsumexp(x, axis=-1) ** 2

    with jax.enable_x64(True):
        x64, q64 = (jnp.asarray(np.asarray(a), jnp.float64) for a in (logits, q))
        expected = np.asarray(reference(x64, q64, 0.05))
        expected_grad = np.asarray(jax.grad(lambda x: reference(x, q64, 0.05).sum())(x64))
    assert expected[0] == pytest.approx(math.log1p(math.exp(-1)) + 0.05 * math.log1p(math.e) ** 2)
    loss, _ = losses.cross_entropy_with_logits(logits, q, 0.05)
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    grad = jax.grad(lambda x: losses.cross_entropy_with_logits(x, q, 0.05)[0].sum())(logits)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-7)
    assert grad[0, 2] == grad[1, 1] == 0.0
    total, _, _ = losses.compute_weighted_cross_entropy(logits[:1], jnp.array([1]))
    assert float(loss[0] - 0.05 * math.log1p(math.e) ** 2) == pytest.approx(float(total))

    # Finite logits: T5X's formula, outputs and gradients bit for bit.
    def t5x(x, targets, z_loss):
        log_z = jax.nn.logsumexp(x, axis=-1)
        total_z_loss = z_loss * jnp.square(log_z)
        return -jnp.sum(targets * (x - log_z[..., None]), axis=-1) + total_z_loss

    soft = jnp.asarray(_soft_targets(TARGETS, 3, 0.2), jnp.float32)
    for targets in (soft, jax.nn.one_hot(TARGETS, 3)):
        ours = functools.partial(losses.cross_entropy_with_logits, targets=targets, z_loss=0.05)
        np.testing.assert_array_equal(ours(LOGITS)[0], t5x(LOGITS, targets, 0.05))
        np.testing.assert_array_equal(
            jax.grad(lambda x, ours=ours: ours(x)[0].sum())(LOGITS),
            jax.grad(lambda x, t=targets: t5x(x, t, 0.05).sum())(LOGITS),
        )


def test_z_loss_coefficient_may_be_traced_and_bf16_logits_get_bf16_gradients():
    @jax.jit
    def f(logits, z_loss):
        return losses.compute_weighted_cross_entropy(logits, TARGETS, z_loss=z_loss)[0]

    grad = jax.grad(f)(LOGITS.astype(jnp.bfloat16), jnp.float32(0.1))
    assert grad.dtype == jnp.bfloat16
    expected = jax.grad(_plain_jax_loss)(LOGITS, TARGETS, 0.0, 0.1)
    np.testing.assert_allclose(grad.astype(jnp.float32), expected, atol=2e-2)


def test_float_labels_are_a_type_error_naming_expected_and_received():
    with pytest.raises(TypeError) as info:
        losses.compute_weighted_cross_entropy(LOGITS, TARGETS.astype(jnp.float32))
    message = str(info.value)
    assert "`targets`" in message and "integer" in message and "float32" in message
    assert "astype(jnp.int32)" in message


def test_every_input_problem_is_listed_in_one_error():
    with pytest.raises(TypeError) as info:
        losses.compute_weighted_cross_entropy(
            LOGITS.astype(jnp.int32),  # wrong dtype
            TARGETS.astype(jnp.float32),  # wrong dtype
            label_smoothing=1.5,  # out of range
        )
    message = str(info.value)
    assert "3 problems:" in message
    assert "`logits`" in message and "`targets`" in message and "label_smoothing" in message


def test_shape_mismatches_are_value_errors():
    with pytest.raises(ValueError, match=r"targets.shape \+ \(vocab_size,\)"):
        losses.compute_weighted_cross_entropy(LOGITS[:, :1], TARGETS)
    with pytest.raises(ValueError, match=r"`weights` must have the shape of `targets` \(2, 2\)"):
        losses.compute_weighted_cross_entropy(LOGITS, TARGETS, jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"scalar or a \[batch\] vector of shape \(2,\)"):
        losses.compute_weighted_cross_entropy(LOGITS, TARGETS, loss_normalizing_factor=jnp.ones(3))
    with pytest.raises(TypeError, match="Resolve special factors first"):
        losses.compute_weighted_cross_entropy(
            LOGITS, TARGETS, loss_normalizing_factor="NUM_REAL_TARGET_TOKENS"
        )


def _base(**kwargs):
    mask = jnp.ones(TARGETS.shape)
    return losses.compute_base_metrics(LOGITS, TARGETS, mask, jnp.float32(1.0), **kwargs)


BAD_OPTIONS = {
    "logits not an array": (
        lambda: losses.compute_weighted_cross_entropy([[0.0, 1.0]], TARGETS),
        TypeError,
        "`logits` must be a floating-point array; got list [[0.0, 1.0]]. Pass the model's "
        "unnormalized scores.",
    ),
    "0-d targets": (
        lambda: losses.compute_weighted_cross_entropy(jnp.zeros(3), jnp.int32(1)),
        ValueError,
        "`targets` must have a batch axis; got a 0-d array.",
    ),
    "factor of another type": (
        lambda: losses.compute_weighted_cross_entropy(LOGITS, TARGETS, loss_normalizing_factor=[2]),
        TypeError,
        "`loss_normalizing_factor` must be None, a positive number or an array; got list [2].",
    ),
    "label_smoothing a str": (
        lambda: losses.compute_weighted_cross_entropy(LOGITS, TARGETS, label_smoothing="0.1"),
        TypeError,
        "`label_smoothing` must be a float in [0, 1), fixed at trace time; got str '0.1'.",
    ),
    "label smoothing of one class": (
        lambda: losses.compute_weighted_cross_entropy(
            LOGITS[..., :1], TARGETS, label_smoothing=0.1
        ),
        ValueError,
        "label smoothing needs at least 2 classes; logits have 1.",
    ),
    "negative z_loss": (
        lambda: losses.compute_weighted_cross_entropy(LOGITS, TARGETS, z_loss=-1.0),
        ValueError,
        "`z_loss` must be non-negative and finite; got -1.0.",
    ),
    "NaN z_loss": (  # every loss NaN
        lambda: losses.compute_weighted_cross_entropy(LOGITS, TARGETS, z_loss=float("nan")),
        ValueError,
        "`z_loss` must be non-negative and finite; got nan.",
    ),
    "infinite loss_normalizing_factor": (  # every loss 0
        lambda: losses.compute_weighted_cross_entropy(
            LOGITS, TARGETS, loss_normalizing_factor=float("inf")
        ),
        ValueError,
        "`loss_normalizing_factor` must be positive and finite; got inf. Use None for no "
        "normalization.",
    ),
    "a vocabulary of 0": (  # every loss NaN; the metrics' argmax raised
        lambda: losses.compute_weighted_cross_entropy(LOGITS[..., :0], TARGETS),
        ValueError,
        "`logits` must score a vocabulary of at least 1 (last axis); got shape (2, 2, 0). Check "
        "the model's output projection.",
    ),
    "a host array factor holding 0": (  # every loss infinite
        lambda: losses.compute_weighted_cross_entropy(
            LOGITS, TARGETS, loss_normalizing_factor=np.array([1.0, 0.0])
        ),
        ValueError,
        "`loss_normalizing_factor` must be positive and finite; got an array holding 0.0. Use "
        "None for no normalization.",
    ),
    "z_loss a vector": (
        lambda: losses.compute_weighted_cross_entropy(LOGITS, TARGETS, z_loss=jnp.ones(2)),
        ValueError,
        "`z_loss` must be a scalar; got shape (2,).",
    ),
    "z_loss a str": (
        lambda: losses.compute_weighted_cross_entropy(LOGITS, TARGETS, z_loss="0.1"),
        TypeError,
        "`z_loss` must be a non-negative float or a scalar array; got str '0.1'.",
    ),
    "segment_ids not a mapping": (
        lambda: _base(segment_ids=[1]),
        TypeError,
        "`segment_ids` must map feature names to [B, L] arrays; got list.",
    ),
    "float segment_ids": (
        lambda: _base(segment_ids={"decoder": jnp.ones(TARGETS.shape)}),
        TypeError,
        "`segment_ids['decoder']` must be an integer (e.g. int32) or bool array; got dtype "
        "float32 (shape (2, 2)). 0 marks padding.",
    ),
    "no devices": (
        lambda: _base(num_devices=0),
        ValueError,
        "`num_devices` must be a positive int; got 0.",
    ),
    "devices a str": (  # a ValueError before, and NumPy's ints were refused
        lambda: _base(num_devices="2"),
        TypeError,
        "`num_devices` must be a Python int (static under jit); got str '2'. Pass "
        "int(jax.device_count()) or a constant.",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_each_bad_option_is_refused_with_what_was_expected_and_got(case):
    call, error, message = BAD_OPTIONS[case]
    with pytest.raises(error) as info:
        call()
    assert str(info.value).split(": ", 1)[1] == message


# ----------------------------------------------------------------------------- normalizing factor

BATCH = {"decoder_target_tokens": jnp.array([[5, 6, 7, 0], [8, 0, 0, 0], [0, 0, 0, 0]])}


@pytest.mark.parametrize(
    "name,member",
    [
        ("NUM_REAL_TARGET_TOKENS", LNF.NUM_REAL_TARGET_TOKENS),
        ("num_total_target_tokens", LNF.NUM_TOTAL_TARGET_TOKENS),
        ("Average_Per_Sequence", LNF.AVERAGE_PER_SEQUENCE),
        (LNF.AVERAGE_PER_SEQUENCE, LNF.AVERAGE_PER_SEQUENCE),
    ],
)
def test_string_names_convert_case_insensitively(name, member):
    assert losses.convert_special_loss_normalizing_factor_to_enum(name) is member


def test_unknown_names_and_types_are_rejected():
    with pytest.raises(ValueError, match="NUM_REAL_TARGET_TOKENS, NUM_TOTAL_TARGET_TOKENS"):
        losses.convert_special_loss_normalizing_factor_to_enum("num_tokens")
    with pytest.raises(TypeError, match="got int 3"):
        losses.convert_special_loss_normalizing_factor_to_enum(3)
    with pytest.raises(ValueError, match="must be positive and finite; got -2.0"):
        losses.get_loss_normalizing_factor_and_weights(-2.0, BATCH)
    with pytest.raises(ValueError, match=r"needs batch\['decoder_target_tokens'\].*\['inputs'\]"):
        losses.get_loss_normalizing_factor_and_weights("num_real_target_tokens", {"inputs": 1})
    with pytest.raises(TypeError, match="integer.*float32"):
        losses.get_loss_normalizing_factor_and_weights(
            LNF.NUM_REAL_TARGET_TOKENS, {"decoder_target_tokens": jnp.ones((2, 3))}
        )


def test_numbers_and_none_pass_through_with_the_batch_weights():
    assert losses.get_loss_normalizing_factor_and_weights(None, BATCH) == (None, None)
    weights = jnp.ones((3, 4))
    factor, out = losses.get_loss_normalizing_factor_and_weights(
        2.5, {**BATCH, "decoder_loss_weights": weights}
    )
    assert factor == 2.5 and out is weights


def test_num_real_and_num_total_target_tokens():
    factor, weights = losses.get_loss_normalizing_factor_and_weights(
        "num_real_target_tokens", BATCH
    )
    assert float(factor) == 4.0
    np.testing.assert_array_equal(weights, np.asarray(BATCH["decoder_target_tokens"]) > 0)
    assert weights.dtype == jnp.float32
    factor, _ = losses.get_loss_normalizing_factor_and_weights(LNF.NUM_TOTAL_TARGET_TOKENS, BATCH)
    assert factor == 12.0
    # Given weights are summed, not counted.
    given = {**BATCH, "decoder_loss_weights": jnp.full((3, 4), 0.25)}
    factor, _ = losses.get_loss_normalizing_factor_and_weights("NUM_REAL_TARGET_TOKENS", given)
    assert float(factor) == 3.0
    # A batch without any weight normalizes by 1 (loss 0), not by 0 (loss NaN).
    empty = {"decoder_target_tokens": jnp.zeros((2, 3), jnp.int32)}
    factor, _ = losses.get_loss_normalizing_factor_and_weights("num_real_target_tokens", empty)
    assert float(factor) == 1.0


def test_average_per_sequence_unpacked():
    factor, weights = losses.get_loss_normalizing_factor_and_weights("AVERAGE_PER_SEQUENCE", BATCH)
    # Two non-empty rows; the all-padding third row is no sequence.
    assert float(factor) == 2.0
    third = 1 / 3
    np.testing.assert_allclose(
        weights, [[third, third, third, 0], [1, 0, 0, 0], [0, 0, 0, 0]], rtol=1e-6
    )


def test_average_per_sequence_packed_uses_segment_ids():
    batch = {
        "decoder_target_tokens": jnp.array([[3, 4, 5, 6, 7, 9], [8, 9, 1, 2, 0, 0]]),
        "decoder_segment_ids": jnp.array([[1, 1, 2, 2, 2, 0], [1, 2, 2, 3, 0, 0]]),
        # Sequence 3 of row 1 has no weight: it is not counted.
        "decoder_loss_weights": jnp.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]),
    }
    factor, weights = _resolve("average_per_sequence", batch)
    assert float(factor) == 4.0
    third = 1 / 3
    # Row 0's last position is padding (segment 0): weight 0 even though its weight was 1.
    np.testing.assert_allclose(
        weights,
        [[0.5, 0.5, third, third, third, 0], [1, 0.5, 0.5, 0, 0, 0]],
        rtol=1e-6,
    )
    # Each sequence's weights sum to 1, so the weights sum to the factor.
    np.testing.assert_allclose(np.sum(weights), 4.0, rtol=1e-6)


def test_with_loss_normalization_stores_the_global_factor_per_row():
    out = losses.with_loss_normalization(BATCH, "num_real_target_tokens")
    np.testing.assert_array_equal(out["loss_normalizing_factor"], [4.0, 4.0, 4.0])
    np.testing.assert_array_equal(
        out["decoder_loss_weights"], np.asarray(BATCH["decoder_target_tokens"]) > 0
    )
    assert out["decoder_target_tokens"] is BATCH["decoder_target_tokens"]
    # None means "no normalization": a factor of one; no weights are invented.
    out = losses.with_loss_normalization(BATCH, None)
    np.testing.assert_array_equal(out["loss_normalizing_factor"], [1.0, 1.0, 1.0])
    assert "decoder_loss_weights" not in out
    np.testing.assert_array_equal(
        losses.with_loss_normalization(BATCH, 2.5)["loss_normalizing_factor"], [2.5, 2.5, 2.5]
    )


@pytest.mark.parametrize(
    "factor",
    [None, 2.5, "NUM_REAL_TARGET_TOKENS", "NUM_TOTAL_TARGET_TOKENS", "AVERAGE_PER_SEQUENCE"],
)
def test_microbatch_losses_add_up_to_the_global_loss(factor):
    rng = np.random.default_rng(1)
    targets = jnp.array([[1, 2, 3, 0], [4, 0, 0, 0], [2, 2, 0, 0], [1, 1, 1, 1]])
    logits = jnp.asarray(rng.normal(size=(4, 4, 5)), jnp.float32)
    batch = losses.with_loss_normalization({"decoder_target_tokens": targets}, factor)

    def loss_of(rows):
        part = {k: v[rows] for k, v in batch.items()}
        return losses.compute_weighted_cross_entropy(
            logits[rows],
            part["decoder_target_tokens"],
            part.get("decoder_loss_weights"),
            loss_normalizing_factor=part["loss_normalizing_factor"],
        )[0]

    whole = loss_of(slice(0, 4))
    halves = loss_of(slice(0, 2)) + loss_of(slice(2, 4))
    np.testing.assert_allclose(halves, whole, rtol=1e-6)
    resolved, weights = losses.get_loss_normalizing_factor_and_weights(factor, batch)
    reference = _reference_token_loss(logits, targets)
    weights = np.ones((4, 4)) if weights is None else np.asarray(weights)
    np.testing.assert_allclose(
        whole,
        np.sum(weights * reference) / (1.0 if resolved is None else float(resolved)),
        rtol=1e-5,
    )


@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
def test_logits_sharded_over_the_vocabulary_give_one_devices_loss_and_gradients(axis_type):
    """On an Explicit axis (`jax.make_mesh`'s default) the target logit's gather raised a
    ShardingTypeError: the loss, its gradient and `compute_loss_and_metrics` all failed."""
    rng = np.random.default_rng(3)
    logits = (3 * rng.normal(size=(4, 3, 8))).astype(np.float32)
    targets = rng.integers(0, 8, (4, 3)).astype(np.int32)
    targets[0, 0], targets[1, 2] = -100, 0  # an ignore index; padding for the metrics
    weights = (targets > 0).astype(np.float32)

    def step(logits, targets, weights):
        def loss(logits, z):
            return losses.compute_weighted_cross_entropy(
                logits, targets, weights, label_smoothing=0.1, z_loss=z
            )[0]

        token = losses.compute_token_losses(logits, targets, label_smoothing=0.2, z_loss=1e-2)
        _, metrics = losses.compute_loss_and_metrics(
            logits, {"decoder_target_tokens": targets}, z_loss=1e-3, num_devices=1
        )
        values = {k: m.compute() for k, m in metrics.items() if not k.startswith("timing")}
        return loss(logits, 1e-3), token, jax.grad(loss, (0, 1))(logits, 1e-3), values

    whole = jax.jit(step)(logits, targets, weights)
    kind = getattr(jax.sharding.AxisType, axis_type)
    mesh = jax.make_mesh(
        (2, 4), ("data", "vocab"), axis_types=(kind, kind), devices=jax.devices()[:8]
    )
    data = jax.sharding.NamedSharding(mesh, jax.P("data"))
    sharded = jax.device_put(logits, jax.sharding.NamedSharding(mesh, jax.P("data", None, "vocab")))
    with jax.set_mesh(mesh):
        got = jax.jit(step)(sharded, *jax.device_put((targets, weights), data))
    assert len(got[2][0].sharding.device_set) == 8
    assert jax.tree.structure(got) == jax.tree.structure(whole)
    for value, expected in zip(jax.tree.leaves(got), jax.tree.leaves(whole), strict=True):
        np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "logits_spec", [jax.P(None, None, "vocab"), jax.P()], ids=["vocab", "none"]
)
def test_gradient_of_logits_sharded_unlike_the_targets_has_the_logits_sharding(logits_spec):
    """On Explicit axes the backward pass gave the gradient the targets' batch sharding:
    for logits sharded over the vocabulary alone, or replicated, beside targets sharded over
    the batch, JAX refused it ("Custom VJP bwd rule must produce an output with the same
    type as the args tuple of the primal function")."""
    rng = np.random.default_rng(5)
    logits = (2 * rng.normal(size=(4, 3, 8))).astype(np.float32)
    targets = rng.integers(0, 8, (4, 3)).astype(np.int32)
    weights = (targets > 0).astype(np.float32)

    def loss(logits, targets, weights):
        return losses.compute_weighted_cross_entropy(
            logits, targets, weights, label_smoothing=0.1, z_loss=1e-3
        )[0]

    # From the formula: d/dlogits = w * (softmax * (1 + 2 z logZ) - q), q the smoothed targets.
    log_z = np.log(np.exp(logits.astype(np.float64)).sum(-1))
    probs = np.exp(logits - log_z[..., None])
    q = _soft_targets(targets, 8, 0.1)
    expected = weights[..., None] * (probs * (1 + 2e-3 * log_z)[..., None] - q)
    mesh = jax.make_mesh((2, 4), ("data", "vocab"), devices=jax.devices()[:8])  # Explicit
    with jax.set_mesh(mesh):
        placed = jax.device_put(logits, logits_spec)
        grad = jax.jit(jax.grad(loss))(placed, *jax.device_put((targets, weights), jax.P("data")))
    assert grad.sharding.is_equivalent_to(placed.sharding, 3)
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "targets_spec,ids_spec",
    [(jax.P("data", "seq"), jax.P("data", "seq")), (jax.P("data"), jax.P())],
    ids=["sequence_sharded", "ids_replicated"],
)
def test_packed_batches_sharded_over_the_sequence_or_unlike_their_ids(targets_spec, ids_spec):
    """On Explicit axes, segment ids sharded over the sequence (context parallelism) made
    count_packed_examples and AVERAGE_PER_SEQUENCE raise "slicing on sharded dims ... is not
    implemented", and ids replicated beside sharded targets "select `which` must be scalar
    or have the same sharding as cases"."""
    targets = np.array([[3, 4, 5, 6, 7, 2, 0, 0], [1, 2, 3, 4, 5, 6, 7, 1]] * 2, np.int32)
    segment_ids = np.array([[1, 1, 1, 2, 2, 2, 0, 0], [1, 1, 2, 2, 3, 3, 3, 3]] * 2, np.int32)
    batch = {"decoder_target_tokens": targets, "decoder_segment_ids": segment_ids}
    logits = np.random.default_rng(6).normal(size=(4, 8, 9)).astype(np.float32)

    def step(logits, batch):
        batch = losses.with_loss_normalization(batch, "AVERAGE_PER_SEQUENCE")
        loss, metrics = losses.compute_loss_and_metrics(logits, batch, num_devices=1)
        return batch, loss, {k: m.compute() for k, m in metrics.items() if "timing" not in k}

    mesh = jax.make_mesh((2, 4), ("data", "seq"), devices=jax.devices()[:8])  # Explicit
    with jax.set_mesh(mesh):
        placed = {
            "decoder_target_tokens": jax.device_put(targets, targets_spec),
            "decoder_segment_ids": jax.device_put(segment_ids, ids_spec),
        }
        got = jax.device_get(jax.jit(step)(jax.device_put(logits, targets_spec), placed))
    # Rows of 2 and 3 sequences: 10 in all, each one's weights summing to 1.
    assert float(got[0]["loss_normalizing_factor"][0]) == 10.0
    np.testing.assert_allclose(got[0]["decoder_loss_weights"][0], [1 / 3] * 6 + [0, 0])
    np.testing.assert_allclose(got[0]["decoder_loss_weights"][1], [0.5] * 4 + [0.25] * 4)
    assert float(got[2]["effective_batch_size/decoder"]) == 10.0
    whole = jax.jit(step)(logits, batch)
    for value, expected in zip(jax.tree.leaves(got), jax.tree.leaves(whole), strict=True):
        np.testing.assert_allclose(value, expected, rtol=1e-6)


def test_an_empty_microbatch_adds_nothing_to_the_metrics():
    # Its per-row reshape divided by zero (ZeroDivisionError) before.
    rng = np.random.default_rng(2)
    targets = jnp.array([[1, 2, 3, 0], [4, 0, 0, 0]])
    logits = jnp.asarray(rng.normal(size=(2, 4, 5)), jnp.float32)
    loss, metrics = losses.compute_loss_and_metrics(
        logits, {"decoder_target_tokens": targets}, num_devices=1
    )
    empty_loss, empty = losses.compute_loss_and_metrics(
        logits[:0], {"decoder_target_tokens": targets[:0]}, num_devices=1
    )
    assert float(empty_loss) == 0.0
    merged = merge_metrics(metrics, empty, pack=False)
    for key in ("accuracy", "loss_per_nonpadding_target_token", "loss_per_all_target_tokens"):
        assert float(merged[key].compute()) == float(metrics[key].compute()), key
    # 4 real tokens of 8.
    assert float(merged["non_padding_fraction/loss_weights"].compute()) == 0.5
    assert float(merged["loss"].compute()) == float(loss) / 2  # AveragePerStep: two steps


def test_count_packed_examples():
    segment_ids = jnp.array([[1, 1, 2, 0], [1, 2, 3, 3], [0, 0, 0, 0], [4, 4, 4, 4]])
    # Row 0: 2 changes + 1 - 1 (ends in padding) = 2; row 1: 3; row 2: 0; row 3: 1.
    assert int(losses.count_packed_examples(segment_ids)) == 6
    assert int(jax.jit(losses.count_packed_examples)(segment_ids)) == 6
    # Rows of no positions hold no example (indexing their last id raised an IndexError).
    assert int(losses.count_packed_examples(segment_ids[:, :0])) == 0
    with pytest.raises(TypeError, match="segment_ids.*integer.*float32"):
        losses.count_packed_examples(segment_ids.astype(jnp.float32))
    with pytest.raises(ValueError, match=r"\[batch, length\]; got shape \(16,\)"):
        losses.count_packed_examples(segment_ids.reshape(-1))


# ----------------------------------------------------------------------------- packed layouts

_ROWS, _LENGTH = 3, 8


@st.composite
def _packed_rows(draw):
    """Rows of consecutive segments (ids 1, 2, ...) followed by padding, with random weights."""
    segment_ids = np.zeros((_ROWS, _LENGTH), np.int32)
    for row in range(_ROWS):
        position, segment = 0, 1
        while position < _LENGTH and draw(st.booleans()):
            length = draw(st.integers(1, _LENGTH - position))
            segment_ids[row, position : position + length] = segment
            position, segment = position + length, segment + 1
    weights = np.array(
        draw(
            st.lists(
                st.sampled_from([0.0, 0.5, 1.0, 2.0]),
                min_size=_ROWS * _LENGTH,
                max_size=_ROWS * _LENGTH,
            )
        ),
        np.float32,
    ).reshape(_ROWS, _LENGTH)
    return segment_ids, weights


def _reference_average_per_sequence(segment_ids, weights):
    out = np.zeros_like(weights)
    sequences = 0
    for row in range(_ROWS):
        for segment in set(segment_ids[row]) - {0}:
            where = segment_ids[row] == segment
            total = weights[row][where].sum()
            if total > 0:
                out[row][where] = weights[row][where] / total
                sequences += 1
    return max(sequences, 1), out


@settings(max_examples=40, deadline=None)
@given(_packed_rows())
def test_average_per_sequence_matches_a_loop_over_segments(rows):
    segment_ids, weights = rows
    batch = {
        "decoder_target_tokens": jnp.asarray(np.where(segment_ids > 0, 3, 0), jnp.int32),
        "decoder_segment_ids": jnp.asarray(segment_ids),
        "decoder_loss_weights": jnp.asarray(weights),
    }
    factor, out = _resolve("AVERAGE_PER_SEQUENCE", batch)
    expected_factor, expected = _reference_average_per_sequence(segment_ids, weights)
    assert float(factor) == expected_factor
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)
    packed_examples = sum(len({*row} - {0}) for row in segment_ids)
    assert (
        int(jax.jit(losses.count_packed_examples)(batch["decoder_segment_ids"])) == packed_examples
    )


def test_batch_shape_problems_are_listed_together():
    batch = {
        "decoder_target_tokens": jnp.ones((2, 4), jnp.int32),
        "decoder_loss_weights": jnp.ones((2, 3)),
        "decoder_segment_ids": jnp.ones((2, 5), jnp.int32),
    }
    with pytest.raises(ValueError) as info:
        losses.get_loss_normalizing_factor_and_weights("average_per_sequence", batch)
    message = str(info.value)
    assert "2 problems:" in message
    assert "batch['decoder_loss_weights']` must have the shape of `targets` (2, 4)" in message
    assert "batch['decoder_segment_ids']` must have the shape of `targets` (2, 4)" in message


def test_segment_ids_of_the_batch_are_named_by_their_batch_key():
    """compute_loss_and_metrics named them `segment_ids['decoder']`, a name the user never
    wrote, where the weights were named by their batch key."""
    batch = {
        "decoder_target_tokens": jnp.ones((4, 5), jnp.int32),
        "decoder_segment_ids": jnp.ones((4, 6), jnp.int32),
    }
    with pytest.raises(ValueError) as info:
        losses.compute_loss_and_metrics(jnp.zeros((4, 5, 6)), batch)
    assert str(info.value) == (
        "compute_loss_and_metrics: `batch['decoder_segment_ids']` must have the shape of "
        "`targets`, (4, 5); got (4, 6). Pass the decoder's segment ids of this batch."
    )


def test_unpacked_inputs_of_another_batch_are_refused_naming_the_inputs():
    """An unpacked batch's encoder_input_tokens of 2 rows beside 4 target rows was refused
    with "Pass the segment ids of the same (micro)batch": the batch has no segment ids."""
    batch = {
        "decoder_target_tokens": jnp.ones((4, 5), jnp.int32),
        "encoder_input_tokens": jnp.ones((2, 7), jnp.int32),
    }
    with pytest.raises(ValueError) as info:
        losses.compute_loss_and_metrics(jnp.zeros((4, 5, 6)), batch)
    assert str(info.value) == (
        "compute_loss_and_metrics: `batch['encoder_input_tokens']` must have one row per "
        "sequence of `targets`, [4, L]; got shape (2, 7). Pass the encoder_input_tokens of "
        "the same (micro)batch (without *_segment_ids, its padding mask, tokens != 0, is "
        "counted)."
    )
    packed = {**batch, "encoder_segment_ids": batch.pop("encoder_input_tokens")}
    with pytest.raises(ValueError, match=r"\(2, 7\)\. Pass the segment ids of the same"):
        losses.compute_loss_and_metrics(jnp.zeros((4, 5, 6)), packed)


@pytest.mark.parametrize("smoothing", [np.float32(0.1), np.float64(0.1)])
def test_a_numpy_label_smoothing_is_taken_as_its_float(smoothing):
    """np.float32 was refused ("must be a Python float"), unlike every other option."""
    logits = jax.random.normal(jax.random.key(0), (2, 3, 5))
    targets = jnp.array([[1, 2, 3], [0, 4, 2]])
    expected = losses.compute_weighted_cross_entropy(
        logits, targets, label_smoothing=float(smoothing)
    )
    got = losses.compute_weighted_cross_entropy(logits, targets, label_smoothing=smoothing)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(expected[0]))


def test_a_scheduled_z_loss_coefficient_gets_its_gradient():
    logits = jax.random.normal(jax.random.key(0), (2, 3, 5))
    targets = jnp.array([[1, 2, 3], [0, 4, -100]])
    weights = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.5, 0.0]])

    def loss(z):
        return losses.compute_weighted_cross_entropy(logits, targets, weights, z_loss=z)[0]

    expected = float(np.sum(np.asarray(weights) * _logsumexp(logits) ** 2))  # d/dz of z*logZ^2
    assert float(jax.grad(loss)(jnp.float32(0.1))) == pytest.approx(expected, rel=1e-6)
    assert float(jax.jit(jax.grad(loss))(0.1)) == pytest.approx(expected, rel=1e-6)
    grad_bf16 = jax.grad(loss)(jnp.bfloat16(0.1))
    assert grad_bf16.dtype == jnp.bfloat16
    assert float(grad_bf16) == pytest.approx(expected, rel=1e-2)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_padding_with_non_finite_logits_costs_neither_the_loss_nor_the_gradient(label_smoothing):
    logits = jax.random.normal(jax.random.key(1), (2, 3, 4))
    targets = jnp.array([[1, 2, 3], [0, 1, 0]])
    weights = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    bad = logits.at[0, 2].set(jnp.inf).at[1, 2, 1].set(-jnp.inf)  # only at padding

    def loss(x):
        return losses.compute_weighted_cross_entropy(
            x, targets, weights, label_smoothing=label_smoothing, z_loss=1e-4
        )[0]

    assert float(loss(bad)) == pytest.approx(float(loss(logits)), rel=1e-6)
    grad, clean = jax.grad(loss)(bad), jax.grad(loss)(logits)
    assert bool(jnp.isfinite(grad).all())
    np.testing.assert_allclose(grad, clean, rtol=1e-6, atol=1e-7)
    assert not bool(grad[:, 2].any())  # no gradient at padding


def test_the_gradient_of_the_loss_in_the_weights_is_the_token_loss_at_a_weight_of_0_too():
    # `where(w != 0, x * w, 0)` cut it to 0 there: a learned weight that reached 0 stayed.
    logits = jax.random.normal(jax.random.key(5), (1, 3, 4))
    targets = jnp.array([[1, 2, 3]])
    token = losses.compute_token_losses(logits, targets).loss
    grad = jax.grad(lambda w: losses.compute_weighted_cross_entropy(logits, targets, w)[0])
    np.testing.assert_allclose(grad(jnp.array([[1.0, 0.0, 1.0]])), token, rtol=1e-6)
    # A non-finite loss at a weight of 0 (padding) still gives 0, not NaN, in both gradients.
    bad = logits.at[0, 1].set(jnp.inf)
    in_weights = jax.grad(lambda w: losses.compute_weighted_cross_entropy(bad, targets, w)[0])(
        jnp.array([[1.0, 0.0, 1.0]])
    )
    assert in_weights[0, 1] == 0.0 and bool(jnp.isfinite(in_weights).all())


def test_one_hot_targets_and_segment_ids_of_another_batch_are_named():
    logits = jnp.zeros((2, 3, 5))
    with pytest.raises(ValueError, match=r"`targets` .*one-hot\? Pass `targets.argmax\(-1\)`"):
        losses.compute_weighted_cross_entropy(logits, jnp.zeros((2, 3, 5), jnp.int32))
    batch = {
        "decoder_target_tokens": jnp.ones((2, 3), jnp.int32),
        "decoder_segment_ids": jnp.ones((4, 7), jnp.int32),
    }
    with pytest.raises(
        ValueError,
        match=r"batch\['decoder_segment_ids'\]` must have one row .*\[2, L\]; got shape \(4, 7\)",
    ):
        losses.compute_loss_and_metrics(logits, batch, num_devices=1)
    # The decoder's ids of another length: its non-padding fraction counted 8 positions, not 6.
    batch["decoder_segment_ids"] = jnp.ones((2, 4), jnp.int32)
    with pytest.raises(
        ValueError,
        match=r"^compute_loss_and_metrics: `batch\['decoder_segment_ids'\]` must have the shape of "
        r"`targets`, \(2, 3\); got \(2, 4\)",
    ):
        losses.compute_loss_and_metrics(logits, batch, num_devices=1)
    other = {"encoder": jnp.ones((2, 7), jnp.int32)}  # another feature: its own length
    values = losses.compute_base_metrics(
        logits,
        batch["decoder_target_tokens"],
        None,
        jnp.float32(0.0),
        segment_ids=other,
        num_devices=1,
    )
    assert float(values["non_padding_fraction/encoder"].compute()) == 1.0
