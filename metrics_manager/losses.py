"""Cross-entropy losses and T5X's base metrics, computed inside jit.

Everything here is device-side: pure functions of arrays that trace once per shape, with no
Python branching on traced values and no host transfers. Input checks look only at shapes
and dtypes, so they run once, at trace time.

The pieces, in the order a loss function uses them:

* `with_loss_normalization(batch, loss_normalizing_factor)`: computes the loss normalizing
  factor and the loss weights on the GLOBAL batch, before it is split into microbatches.
* `compute_loss_and_metrics(logits, batch, ...)`: the loss to differentiate and T5X's base
  metrics for one (micro)batch. Built from the lower-level functions below, which are public
  for loops that need something else:
  `compute_token_losses` (per-token cross-entropy with label smoothing and z-loss),
  `compute_weighted_cross_entropy` (T5X's function), `get_loss_normalizing_factor_and_weights`,
  `compute_base_metrics`, `count_packed_examples`.

Microbatching and the loss normalizing factor
---------------------------------------------
T5X computes the normalizing factor inside the loss function, so under microbatching each
microbatch divides by its own token count and the step's loss is a sum of microbatch means:
it reads `num_microbatches` times too large and weights microbatches unequally. Here the
factor is computed once on the global batch and travels with the batch as a `[B]` vector
(every entry the same global factor) under the key `"loss_normalizing_factor"`, so any code
that splits the batch along axis 0 hands each microbatch the global factor. The microbatch
losses then add up to exactly the global loss, and every metric below merges (by addition)
to the value it has on the global batch: no reported value depends on `num_microbatches`.

Example:
    >>> import functools, jax, jax.numpy as jnp
    >>> from metrics_manager import losses
    >>> from metrics_manager.merging import accumulate_grads_microbatched
    >>> batch = {
    ...     "inputs": jnp.ones((4, 3)),
    ...     "decoder_target_tokens": jnp.array([[1, 2, 0], [3, 0, 0], [1, 1, 1], [2, 0, 0]]),
    ... }
    >>> def loss_fn(params, microbatch):
    ...     logits = microbatch["inputs"][..., None] * params[None, None]  # [b, 3, 5]
    ...     return losses.compute_loss_and_metrics(logits, microbatch, num_devices=1)
    >>> @functools.partial(jax.jit, static_argnums=2)
    ... def train_step(params, batch, num_microbatches):
    ...     batch = losses.with_loss_normalization(batch, "NUM_REAL_TARGET_TOKENS")
    ...     return accumulate_grads_microbatched(loss_fn, params, batch, num_microbatches)
    >>> params = jnp.zeros(5)  # uniform predictions: ln 5 = 1.6094 per real token
    >>> grads, metrics = train_step(params, batch, 4)  # the same for 1 or 2 microbatches
    >>> print(f"{float(metrics['loss'].compute()):.4f} {float(grads[0]):.4f}")
    1.6094 0.2000
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import clu.metrics as clu_metrics
import jax
import jax.numpy as jnp
import numpy as np

from metrics_manager import metrics as metrics_lib
from writers._problems import Problems as _Problems

__all__ = [
    "LOSS_NORMALIZING_FACTOR_KEY",
    "SpecialLossNormalizingFactor",
    "TokenLosses",
    "compute_base_metrics",
    "compute_loss_and_metrics",
    "compute_token_losses",
    "compute_weighted_cross_entropy",
    "convert_special_loss_normalizing_factor_to_enum",
    "count_packed_examples",
    "get_loss_normalizing_factor_and_weights",
    "with_loss_normalization",
]

#: Batch key under which `with_loss_normalization` stores the global factor, shape `[B]`.
LOSS_NORMALIZING_FACTOR_KEY = "loss_normalizing_factor"

_TARGETS_KEY = "decoder_target_tokens"
_WEIGHTS_KEY = "decoder_loss_weights"
_SEGMENT_IDS_KEY = "decoder_segment_ids"
_SEGMENT_IDS_SUFFIX = "_segment_ids"


# ----------------------------------------------------------------------------- input checks


def _describe(x: Any) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"an array of shape {tuple(x.shape)} and dtype {x.dtype}"
    return f"{type(x).__name__} {x!r}"


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _check_dtype(
    problems: _Problems, name: str, x: Any, kind: type, what: str, *, fix: str = ""
) -> bool:
    """Records a problem unless `x` is an array of dtype `kind`; returns whether it is one."""
    if not _is_array(x):
        problems.type_problem(f"`{name}` must be {what} array; got {_describe(x)}. {fix}")
        return False
    if not jnp.issubdtype(x.dtype, kind):
        problems.type_problem(
            f"`{name}` must be {what} array; got dtype {x.dtype} (shape {tuple(x.shape)}). {fix}"
        )
        return False
    return True


def _check_integer_array(problems: _Problems, name: str, x: Any, *, fix: str) -> bool:
    return _check_dtype(problems, name, x, jnp.integer, "an integer (e.g. int32)", fix=fix)


def _check_float_array(problems: _Problems, name: str, x: Any, *, fix: str = "") -> bool:
    return _check_dtype(problems, name, x, jnp.floating, "a floating-point", fix=fix)


def _check_logits_and_targets(problems: _Problems, logits: Any, targets: Any) -> bool:
    """Checks dtypes and that `logits.shape == targets.shape + (vocab,)`; returns ok."""
    logits_ok = _check_float_array(
        problems, "logits", logits, fix="Pass the model's unnormalized scores."
    )
    targets_ok = _check_integer_array(
        problems,
        "targets",
        targets,
        fix="Pass token ids, e.g. `batch['decoder_target_tokens']`, not one-hot or float labels "
        "(cast with `.astype(jnp.int32)` if they are whole numbers stored as floats).",
    )
    if not (logits_ok and _is_array(targets)):
        return False
    if logits.ndim != targets.ndim + 1 or tuple(logits.shape[:-1]) != tuple(targets.shape):
        problems.value_problem(
            f"`logits` must have shape targets.shape + (vocab_size,) = "
            f"{tuple(targets.shape)} + (V,); got logits of shape {tuple(logits.shape)}. "
            "Check that logits and targets come from the same (micro)batch."
        )
        return False
    if targets.ndim < 1:
        problems.value_problem("`targets` must have a batch axis; got a 0-d array.")
        return False
    return logits_ok and targets_ok


def _check_same_shape(problems: _Problems, name: str, x: Any, targets_shape: tuple) -> bool:
    if x is None:
        return True
    if not _is_array(x):
        problems.type_problem(f"`{name}` must be an array or None; got {_describe(x)}.")
        return False
    if tuple(x.shape) != targets_shape:
        problems.value_problem(
            f"`{name}` must have the shape of `targets` {targets_shape}; got shape "
            f"{tuple(x.shape)}."
        )
        return False
    return True


def _check_factor(problems: _Problems, factor: Any, batch_size: int | None) -> None:
    """A resolved (numeric) loss normalizing factor: None, a positive number, a scalar or [B]."""
    if factor is None:
        return
    if isinstance(factor, (str, SpecialLossNormalizingFactor)):
        problems.type_problem(
            f"`loss_normalizing_factor` here must be a number or an array; got {factor!r}. "
            "Resolve special factors first with `get_loss_normalizing_factor_and_weights` or "
            "`with_loss_normalization` (on the global batch)."
        )
        return
    if isinstance(factor, bool) or not (
        isinstance(factor, (int, float, np.number)) or _is_array(factor)
    ):
        problems.type_problem(
            f"`loss_normalizing_factor` must be None, a positive number or an array; got "
            f"{_describe(factor)}."
        )
        return
    if isinstance(factor, (int, float, np.number)):
        if not factor > 0:
            problems.value_problem(
                f"`loss_normalizing_factor` must be positive; got {factor!r}. Use None for no "
                "normalization."
            )
        return
    if factor.ndim == 0:
        return
    if factor.ndim != 1 or (batch_size is not None and factor.shape[0] != batch_size):
        problems.value_problem(
            f"`loss_normalizing_factor` must be a scalar or a [batch] vector of shape "
            f"({batch_size},); got shape {tuple(factor.shape)}. The [batch] form is what "
            "`with_loss_normalization` stores in the batch."
        )


def _per_row(x: jax.Array, ndim: int) -> jax.Array:
    """Reshapes a [B] vector to broadcast against a rank-`ndim` array (rank promotion is explicit)."""
    return x.reshape(x.shape + (1,) * (ndim - 1))


# ----------------------------------------------------------------------------- cross-entropy


class TokenLosses(NamedTuple):
    """Per-token losses, unweighted and unnormalized, each of the shape of the targets.

    Attributes:
        loss: Cross-entropy against the (smoothed) targets minus the smoothing entropy
            constant, plus the z-loss term. Differentiable.
        z_loss: The z-loss term alone, `z_loss * logsumexp(logits)**2`. Carries no gradient:
            it is for logging only.
    """

    loss: jax.Array
    z_loss: jax.Array


def _smoothing(label_smoothing: float, vocab_size: int) -> tuple[float, float, float]:
    """Returns (confidence, low_confidence, normalizing_constant) for label smoothing."""
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab_size - 1) if vocab_size > 1 else 0.0

    def xlogx(x: float) -> float:
        return x * math.log(x) if x > 0 else 0.0

    # The entropy of the smoothed target distribution: subtracting it makes a prediction
    # that equals the smoothed targets score exactly 0.
    constant = -(xlogx(confidence) + (vocab_size - 1) * xlogx(low))
    return confidence, low, constant


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _token_cross_entropy(
    logits: jax.Array, targets: jax.Array, z_loss: jax.Array, label_smoothing: float
) -> tuple[jax.Array, jax.Array]:
    outputs, _ = _token_cross_entropy_fwd(logits, targets, z_loss, label_smoothing)
    return outputs


def _token_cross_entropy_fwd(
    logits: jax.Array, targets: jax.Array, z_loss: jax.Array, label_smoothing: float
) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, ...]]:
    vocab_size = logits.shape[-1]
    confidence, low, constant = _smoothing(label_smoothing, vocab_size)
    x = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(x, axis=-1)
    target_log_prob = jnp.take_along_axis(x, targets[..., None], axis=-1)[..., 0] - log_z
    # -sum_v q_v log p_v with q = low + (confidence - low) * onehot(targets), without
    # materializing the [.., V] soft targets.
    cross_ent = -(confidence - low) * target_log_prob
    if low > 0.0:
        cross_ent = cross_ent - low * jnp.sum(x - log_z[..., None], axis=-1)
    token_z_loss = z_loss * jnp.square(log_z)
    token_loss = cross_ent - constant + token_z_loss
    return (token_loss, token_z_loss), (logits, targets, z_loss, log_z)


def _token_cross_entropy_bwd(
    label_smoothing: float, residuals: tuple[jax.Array, ...], cotangents: tuple[jax.Array, ...]
) -> tuple[jax.Array, None, None]:
    logits, targets, z_loss, log_z = residuals
    # The second output (the logged z-loss) is deliberately ignored: it is a copy of a term
    # already inside the first output, there for logging, and must not train twice.
    g_loss, _ = cotangents
    vocab_size = logits.shape[-1]
    confidence, low, _ = _smoothing(label_smoothing, vocab_size)
    probs = jnp.exp(logits.astype(jnp.float32) - log_z[..., None])
    vocab_ids = jax.lax.broadcasted_iota(targets.dtype, probs.shape, probs.ndim - 1)
    onehot = vocab_ids == targets[..., None]
    soft_targets = jnp.where(onehot, confidence, low)
    total_target_mass = confidence + (vocab_size - 1) * low
    # d/dlogits of  -sum q log softmax + z * logsumexp^2  =  p * (sum q + 2 z logZ) - q
    scale = total_target_mass + 2.0 * z_loss * log_z
    g_logits = g_loss[..., None] * (probs * scale[..., None] - soft_targets)
    return g_logits.astype(logits.dtype), None, None


_token_cross_entropy.defvjp(_token_cross_entropy_fwd, _token_cross_entropy_bwd)


def _check_loss_options(problems: _Problems, label_smoothing: Any, z_loss: Any) -> None:
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
        problems.type_problem(
            f"`label_smoothing` must be a Python float in [0, 1) (it is configuration, fixed "
            f"at trace time); got {_describe(label_smoothing)}."
        )
    elif not 0.0 <= label_smoothing < 1.0:
        problems.value_problem(f"`label_smoothing` must be in [0, 1); got {label_smoothing!r}.")
    if isinstance(z_loss, bool) or not (isinstance(z_loss, (int, float)) or _is_array(z_loss)):
        problems.type_problem(
            f"`z_loss` must be a non-negative float or a scalar array; got {_describe(z_loss)}."
        )
    elif _is_array(z_loss) and z_loss.ndim != 0:
        problems.value_problem(f"`z_loss` must be a scalar; got shape {tuple(z_loss.shape)}.")
    elif isinstance(z_loss, (int, float)) and z_loss < 0:
        problems.value_problem(f"`z_loss` must be non-negative; got {z_loss!r}.")


def compute_token_losses(
    logits: jax.Array,
    targets: jax.Array,
    *,
    label_smoothing: float = 0.0,
    z_loss: float | jax.Array = 0.0,
) -> TokenLosses:
    """Per-token cross-entropy with label smoothing and z-loss, unweighted.

    Soft targets put `1 - label_smoothing` on the target token and
    `label_smoothing / (V - 1)` on every other token; the entropy of that distribution is
    subtracted, so a prediction equal to the soft targets scores 0. The z-loss term
    `z_loss * logsumexp(logits)**2` is added to the loss and also returned alone; a custom
    VJP drops the gradient of the returned copy, so logging it never trains twice. The
    loss is computed in float32 whatever the logits' dtype; the gradient comes back in the
    logits' dtype. Targets must lie in `[0, V)`.

    Args:
        logits: `[..., V]` floating-point scores.
        targets: Integer token ids of shape `logits.shape[:-1]`.
        label_smoothing: In [0, 1); fixed at trace time.
        z_loss: Coefficient of the z-loss term (a float, or a scalar array for a schedule).

    Returns:
        `TokenLosses(loss, z_loss)`, each of shape `targets.shape`, float32.

    Raises:
        TypeError: `targets` is not an integer array or `logits` not floating point.
        ValueError: shapes do not line up, or an option is out of range.

    Example:
        >>> import jax.numpy as jnp
        >>> logits = jnp.log(jnp.array([[0.9, 0.05, 0.05]]))
        >>> per_token = compute_token_losses(logits, jnp.array([0]), label_smoothing=0.1)
        >>> print(f"{float(per_token.loss[0]):.6f}")
        0.000000
    """
    problems = _Problems("compute_token_losses")
    _check_logits_and_targets(problems, logits, targets)
    _check_loss_options(problems, label_smoothing, z_loss)
    if _is_array(logits) and logits.ndim >= 1 and logits.shape[-1] < 2 and label_smoothing:
        problems.value_problem(
            f"label smoothing needs a vocabulary of at least 2; got logits.shape[-1] = "
            f"{logits.shape[-1]}."
        )
    problems.raise_if_any()
    z = jnp.asarray(z_loss, jnp.float32)
    token_loss, token_z_loss = _token_cross_entropy(logits, targets, z, float(label_smoothing))
    return TokenLosses(loss=token_loss, z_loss=token_z_loss)


def compute_weighted_cross_entropy(
    logits: jax.Array,
    targets: jax.Array,
    weights: jax.Array | None = None,
    label_smoothing: float = 0.0,
    z_loss: float | jax.Array = 0.0,
    loss_normalizing_factor: float | jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """T5X's weighted cross-entropy: summed over tokens, then divided by the factor.

    `loss = sum(weights * token_loss) / loss_normalizing_factor` with the per-token loss of
    `compute_token_losses`. The factor may be a scalar or a `[B]` vector (each row divided by
    its own entry): the vector form is what `with_loss_normalization` stores in the batch, so
    a microbatch divides by the factor of the global batch and microbatch losses add up to
    the global loss.

    Args:
        logits: `[B, ..., V]` floating-point scores.
        targets: Integer token ids of shape `logits.shape[:-1]`.
        weights: Per-token loss weights of the targets' shape; None weighs every token 1.
        label_smoothing: In [0, 1); fixed at trace time.
        z_loss: Coefficient of the z-loss term.
        loss_normalizing_factor: None (no division), a positive number, a scalar array or a
            `[B]` vector. Resolve special factors (`SpecialLossNormalizingFactor`, strings)
            with `get_loss_normalizing_factor_and_weights` first.

    Returns:
        `(loss, z_loss, weight_sum)`: the weighted, normalized loss (differentiable, z-loss
        included); the weighted, normalized z-loss part alone (no gradient); and the sum of
        the weights (`targets.size` when `weights` is None), all float32 scalars.

    Raises:
        TypeError: wrong dtypes (for example float targets), or an unresolved special factor.
        ValueError: shapes that do not line up, or options out of range.

    Example:
        >>> import jax.numpy as jnp
        >>> logits = jnp.zeros((1, 2, 4))  # uniform over 4 tokens: ln 4 per token
        >>> loss, z, n = compute_weighted_cross_entropy(
        ...     logits, jnp.array([[1, 0]]), jnp.array([[1.0, 0.0]]))
        >>> print(f"{float(loss):.4f} {float(z):.1f} {float(n):.1f}")
        1.3863 0.0 1.0
    """
    problems = _Problems("compute_weighted_cross_entropy")
    shapes_ok = _check_logits_and_targets(problems, logits, targets)
    _check_loss_options(problems, label_smoothing, z_loss)
    if shapes_ok:
        _check_same_shape(problems, "weights", weights, tuple(targets.shape))
        _check_factor(problems, loss_normalizing_factor, targets.shape[0])
    problems.raise_if_any()

    token_losses = compute_token_losses(
        logits, targets, label_smoothing=label_smoothing, z_loss=z_loss
    )
    loss, total_z_loss = _weighted_sums(token_losses, weights, loss_normalizing_factor)
    if weights is None:
        weight_sum = jnp.asarray(targets.size, jnp.float32)
    else:
        weight_sum = jnp.sum(weights.astype(jnp.float32))
    return loss, total_z_loss, weight_sum


def _weighted_sums(
    token_losses: TokenLosses,
    weights: jax.Array | None,
    loss_normalizing_factor: float | jax.Array | None,
) -> tuple[jax.Array, jax.Array]:
    """sum(weights * per-token loss / factor) for the loss and its z-loss part."""
    token_loss, token_z_loss = token_losses
    if weights is not None:
        weights = weights.astype(jnp.float32)
        token_loss = token_loss * weights
        token_z_loss = token_z_loss * weights
    if loss_normalizing_factor is not None:
        factor = jnp.asarray(loss_normalizing_factor, jnp.float32)
        if factor.ndim == 1:
            factor = _per_row(factor, token_loss.ndim)
        token_loss = token_loss / factor
        token_z_loss = token_z_loss / factor
    return jnp.sum(token_loss), jnp.sum(token_z_loss)


# ----------------------------------------------------------------------------- normalizing factor


class SpecialLossNormalizingFactor(enum.Enum):
    """Loss normalizing factors computed from the batch (T5X's names and values).

    Attributes:
        NUM_REAL_TARGET_TOKENS: The sum of the loss weights (the number of non-padding target
            tokens when weights are binary).
        NUM_TOTAL_TARGET_TOKENS: The number of target positions, padding included (B * L).
        AVERAGE_PER_SEQUENCE: Each sequence's weights are divided by that sequence's weight
            sum, and the factor is the number of sequences with any weight: every sequence
            counts equally, whatever its length. Packed rows are split by segment ids.
    """

    NUM_REAL_TARGET_TOKENS = 1
    NUM_TOTAL_TARGET_TOKENS = 2
    AVERAGE_PER_SEQUENCE = 3


def convert_special_loss_normalizing_factor_to_enum(
    x: str | SpecialLossNormalizingFactor,
) -> SpecialLossNormalizingFactor:
    """Converts a name (any case) to a `SpecialLossNormalizingFactor`.

    Args:
        x: A member's name such as `"num_real_target_tokens"`, or a member (returned as is).

    Returns:
        The member.

    Raises:
        TypeError: `x` is neither a string nor a member.
        ValueError: `x` names no member; the message lists the valid names.

    Example:
        >>> convert_special_loss_normalizing_factor_to_enum("Average_Per_Sequence")
        <SpecialLossNormalizingFactor.AVERAGE_PER_SEQUENCE: 3>
    """
    if isinstance(x, SpecialLossNormalizingFactor):
        return x
    if not isinstance(x, str):
        raise TypeError(
            f"A special loss normalizing factor must be a string or a "
            f"SpecialLossNormalizingFactor; got {_describe(x)}."
        )
    try:
        return SpecialLossNormalizingFactor[x.strip().upper()]
    except KeyError:
        names = ", ".join(m.name for m in SpecialLossNormalizingFactor)
        raise ValueError(
            f"Unknown special loss normalizing factor {x!r}; expected one of (any case): "
            f"{names}. For a fixed factor pass a number instead of a string."
        ) from None


def _segmented_cumsum(values: jax.Array, starts: jax.Array, *, reverse: bool) -> jax.Array:
    """Cumulative sum along axis 1 that restarts wherever `starts` is true.

    An associative scan of elementwise ops along the length axis: it stays local to each row,
    so a batch sharded on axis 0 (explicit sharding included) needs no gather or scatter.
    """

    def combine(
        a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]
    ) -> tuple[jax.Array, jax.Array]:
        a_start, a_sum = a
        b_start, b_sum = b
        return a_start | b_start, jnp.where(b_start, b_sum, a_sum + b_sum)

    return jax.lax.associative_scan(combine, (starts, values), reverse=reverse, axis=1)[1]


def _sum_per_segment(weights: jax.Array, segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each position's sum of weights over its run of equal segment ids, and the run starts."""
    changes = segment_ids[:, 1:] != segment_ids[:, :-1]
    edge = jnp.ones_like(segment_ids[:, :1], dtype=bool)
    starts = jnp.concatenate([edge, changes], axis=1)
    ends = jnp.concatenate([changes, edge], axis=1)
    up_to_here = _segmented_cumsum(weights, starts, reverse=False)
    from_here = _segmented_cumsum(weights, ends, reverse=True)
    return up_to_here + from_here - weights, starts


def _average_per_sequence(
    weights: jax.Array, segment_ids: jax.Array | None
) -> tuple[jax.Array, jax.Array]:
    """Divides each sequence's weights by its weight sum; returns (weights, num_sequences)."""
    if segment_ids is None:
        per_token_sum = jnp.sum(weights, axis=-1, keepdims=True)
        num_sequences = jnp.sum(per_token_sum > 0)
    else:
        # Positions with segment id 0 are padding: they belong to no sequence.
        weights = jnp.where(segment_ids != 0, weights, 0.0)
        per_token_sum, starts = _sum_per_segment(weights, segment_ids)
        num_sequences = jnp.sum(starts & (per_token_sum > 0))
    has_weight = per_token_sum > 0
    weights = jnp.where(has_weight, weights / jnp.where(has_weight, per_token_sum, 1.0), 0.0)
    return weights, num_sequences.astype(jnp.float32)


def get_loss_normalizing_factor_and_weights(
    loss_normalizing_factor: float | jax.Array | str | SpecialLossNormalizingFactor | None,
    batch: Mapping[str, jax.Array],
) -> tuple[float | jax.Array | None, jax.Array | None]:
    """Resolves a loss normalizing factor against a batch (T5X's function, made safe).

    Call it on the GLOBAL batch, not on a microbatch (see the module docstring, or use
    `with_loss_normalization`, which does that and stores the result in the batch).

    Batch keys: `decoder_target_tokens` (integer, needed for special factors and when
    `decoder_loss_weights` is absent, in which case the weights are `targets > 0`),
    optional `decoder_loss_weights`, and for AVERAGE_PER_SEQUENCE optional
    `decoder_segment_ids` (packed rows; id 0 is padding and gets weight 0).

    A number, an array or None is returned unchanged with the batch's weights (None if it has
    none). Special factors: NUM_REAL_TARGET_TOKENS is `sum(weights)`, NUM_TOTAL_TARGET_TOKENS
    is `targets.size`, AVERAGE_PER_SEQUENCE rewrites the weights to `w / sum(w of its
    sequence)` and is the number of sequences with any weight. A batch with no weight at all
    gives factor 1 (so the loss is 0, not NaN).

    Args:
        loss_normalizing_factor: None, a positive number or array, a
            `SpecialLossNormalizingFactor`, or a member's name in any case.
        batch: The global batch.

    Returns:
        `(factor, weights)`; for special factors the factor is a float32 scalar array (a
        Python float for NUM_TOTAL_TARGET_TOKENS) and the weights are float32.

    Raises:
        TypeError: wrong types (for example float target tokens).
        ValueError: an unknown name, a missing key, or shapes that do not match.

    Example:
        >>> import jax.numpy as jnp
        >>> batch = {"decoder_target_tokens": jnp.array([[5, 6, 0], [7, 0, 0]])}
        >>> factor, weights = get_loss_normalizing_factor_and_weights(
        ...     "average_per_sequence", batch)
        >>> print(float(factor), weights.tolist())
        2.0 [[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]
    """
    weights = batch.get(_WEIGHTS_KEY) if isinstance(batch, Mapping) else None
    if loss_normalizing_factor is None or not isinstance(
        loss_normalizing_factor, (str, SpecialLossNormalizingFactor)
    ):
        problems = _Problems("get_loss_normalizing_factor_and_weights")
        _check_factor(problems, loss_normalizing_factor, None)
        problems.raise_if_any()
        return loss_normalizing_factor, weights

    special = convert_special_loss_normalizing_factor_to_enum(loss_normalizing_factor)
    problems = _Problems("get_loss_normalizing_factor_and_weights")
    if not isinstance(batch, Mapping):
        problems.type_problem(f"`batch` must be a mapping of arrays; got {type(batch).__name__}.")
        problems.raise_if_any()
    if _TARGETS_KEY not in batch:
        problems.value_problem(
            f"{special.name} needs batch[{_TARGETS_KEY!r}]; the batch has keys "
            f"{sorted(batch)}. Add the target tokens, or pass a numeric factor."
        )
        problems.raise_if_any()
    targets = batch[_TARGETS_KEY]
    targets_ok = _check_integer_array(
        problems, f"batch[{_TARGETS_KEY!r}]", targets, fix="Pass token ids (0 = padding)."
    )
    segment_ids = batch.get(_SEGMENT_IDS_KEY)
    if targets_ok:
        shape = tuple(targets.shape)
        if targets.ndim < 1:
            problems.value_problem(f"batch[{_TARGETS_KEY!r}] must have a batch axis; got 0-d.")
        _check_same_shape(problems, f"batch[{_WEIGHTS_KEY!r}]", weights, shape)
        if special is SpecialLossNormalizingFactor.AVERAGE_PER_SEQUENCE and segment_ids is not None:
            if _check_integer_array(
                problems, f"batch[{_SEGMENT_IDS_KEY!r}]", segment_ids, fix="0 marks padding."
            ) and _check_same_shape(problems, f"batch[{_SEGMENT_IDS_KEY!r}]", segment_ids, shape):
                if segment_ids.ndim != 2:
                    problems.value_problem(
                        f"batch[{_SEGMENT_IDS_KEY!r}] must be [batch, length]; got shape {shape}."
                    )
    problems.raise_if_any()

    if weights is None:
        weights = (targets > 0).astype(jnp.float32)
    else:
        weights = weights.astype(jnp.float32)
    if special is SpecialLossNormalizingFactor.NUM_REAL_TARGET_TOKENS:
        total = jnp.sum(weights)
        return jnp.where(total > 0, total, 1.0), weights
    if special is SpecialLossNormalizingFactor.NUM_TOTAL_TARGET_TOKENS:
        return float(max(targets.size, 1)), weights
    weights, num_sequences = _average_per_sequence(weights, segment_ids)
    return jnp.maximum(num_sequences, 1.0), weights


def with_loss_normalization(
    batch: Mapping[str, jax.Array],
    loss_normalizing_factor: float | jax.Array | str | SpecialLossNormalizingFactor | None,
) -> dict[str, jax.Array]:
    """Resolves the loss normalizing factor on the global batch and stores it in the batch.

    Call this on the global batch inside the train step, before splitting it into
    microbatches. It returns a new dict with

    * `"decoder_loss_weights"`: the loss weights (rewritten for AVERAGE_PER_SEQUENCE; left
      out if the batch has none and the factor needs none), and
    * `"loss_normalizing_factor"`: the global factor repeated into a float32 `[B]` vector
      (ones for None), so it splits along axis 0 with the rest of the batch and every
      microbatch divides by the global factor.

    Args:
        batch: The global batch, with `decoder_target_tokens` of shape `[B, ...]`.
        loss_normalizing_factor: As for `get_loss_normalizing_factor_and_weights`.

    Returns:
        The batch with the two keys added or replaced.

    Raises:
        TypeError, ValueError: as `get_loss_normalizing_factor_and_weights`, and a ValueError
            when the batch has no `decoder_target_tokens` to take the batch size from.

    Example:
        >>> import jax.numpy as jnp
        >>> batch = {"decoder_target_tokens": jnp.array([[5, 6, 0], [7, 0, 0]])}
        >>> with_loss_normalization(batch, "NUM_REAL_TARGET_TOKENS")["loss_normalizing_factor"]
        Array([3., 3.], dtype=float32)
    """
    if not isinstance(batch, Mapping) or _TARGETS_KEY not in batch:
        keys = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
        raise ValueError(
            f"with_loss_normalization needs batch[{_TARGETS_KEY!r}] (to size the per-row "
            f"factor); got {keys}."
        )
    factor, weights = get_loss_normalizing_factor_and_weights(loss_normalizing_factor, batch)
    batch_size = batch[_TARGETS_KEY].shape[0]
    problems = _Problems("with_loss_normalization")
    _check_factor(problems, factor, batch_size)
    problems.raise_if_any()
    if factor is None:
        factor = 1.0
    factor = jnp.asarray(factor, jnp.float32)
    if factor.ndim == 0:
        factor = jnp.broadcast_to(factor, (batch_size,))
    out = dict(batch)
    out[LOSS_NORMALIZING_FACTOR_KEY] = factor
    if weights is not None:
        out[_WEIGHTS_KEY] = weights
    return out


# ----------------------------------------------------------------------------- base metrics


def count_packed_examples(segment_ids: jax.Array) -> jax.Array:
    """Number of examples packed into `[B, L]` rows: segment changes + rows - rows ending in 0.

    Segment id 0 is padding and is assumed to appear only at the end of a row. An all-padding
    row counts 0.

    Args:
        segment_ids: `[B, L]` integer segment ids.

    Returns:
        An int32 scalar.

    Raises:
        TypeError: `segment_ids` is not an integer array.
        ValueError: it is not 2-D.

    Example:
        >>> import jax.numpy as jnp
        >>> int(count_packed_examples(jnp.array([[1, 1, 2, 0], [1, 2, 3, 3], [0, 0, 0, 0]])))
        5
    """
    problems = _Problems("count_packed_examples")
    if _check_integer_array(problems, "segment_ids", segment_ids, fix="0 marks padding."):
        if segment_ids.ndim != 2:
            problems.value_problem(
                f"`segment_ids` must be [batch, length]; got shape {tuple(segment_ids.shape)}."
            )
    problems.raise_if_any()
    changes = jnp.sum(segment_ids[:, 1:] != segment_ids[:, :-1], dtype=jnp.int32)
    rows_ending_in_padding = jnp.sum(segment_ids[:, -1] == 0, dtype=jnp.int32)
    return changes + segment_ids.shape[0] - rows_ending_in_padding


def _default_num_devices(logits: Any) -> int:
    """The devices the step runs on: the current mesh, else the array's, else all devices."""
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        return int(mesh.size)
    if isinstance(logits, jax.Array) and not isinstance(logits, jax.core.Tracer):
        return len(logits.sharding.device_set)
    return jax.device_count()


def _float32_scalar(x: Any) -> jax.Array:
    return jnp.asarray(x, jnp.float32)


def compute_base_metrics(
    logits: jax.Array,
    targets: jax.Array,
    mask: jax.Array | None,
    loss: jax.Array,
    z_loss: jax.Array | None = None,
    segment_ids: Mapping[str, jax.Array | None] | None = None,
    *,
    token_losses: TokenLosses | None = None,
    loss_normalizing_factor: float | jax.Array | None = None,
    num_devices: int | None = None,
) -> dict[str, clu_metrics.Metric]:
    """T5X's base metrics for one (micro)batch, right under every loss normalizing factor.

    Every metric merges by addition, so a step's microbatch metrics merge to the values of
    the global batch (given the loss was normalized by the global factor). Keys:

    * `accuracy`: argmax accuracy over tokens with `mask != 0`.
    * `loss`, `z_loss`, `cross_ent_loss` (`loss - z_loss`): AveragePerStep of the loss as
      passed in (normalized as trained), so the value is the per-step training objective.
    * `loss_per_nonpadding_target_token`: sum of the per-token loss over tokens with
      `mask != 0`, divided by their number. Independent of the normalizing factor.
    * `loss_per_all_target_tokens`, `z_loss_per_all_target_tokens`,
      `cross_ent_loss_per_all_target_tokens`: the same sums divided by all target positions.
    * `non_padding_fraction/loss_weights`: fraction of positions with `mask != 0` (counted,
      not summed, so rewritten non-binary weights do not skew it).
    * `timing/seqs`, `timing/seqs_per_second`, `timing/seqs_per_second_per_core`: rows of
      the batch holding at least one token with `mask != 0` (all-padding rows are padding
      and are not counted; a packed row counts once, see `effective_batch_size/*`).
    * `timing/target_tokens_per_second`, `..._per_core`: tokens with `mask != 0` per second
      (padding NOT counted). `timing/all_target_tokens_per_second`: all target positions,
      padding included (the hardware's view).
    * `timing/steps_per_second`, `timing/seconds`.
    * For each `feature` in `segment_ids`: `effective_batch_size/<feature>` (packed examples
      per step, `count_packed_examples`), `non_padding_fraction/<feature>` (segment id != 0),
      and `non_padding_fraction/overall` over all features.

    The per-token losses come from `token_losses` when given (exact for any weights). Without
    it they are recovered as `loss * loss_normalizing_factor`, which is exact only when
    `mask` holds the binary weights the loss used (None, a number, NUM_REAL_TARGET_TOKENS,
    NUM_TOTAL_TARGET_TOKENS), not for AVERAGE_PER_SEQUENCE's rewritten weights: pass
    `token_losses` there (`compute_loss_and_metrics` does).

    `*_per_core` divide by `num_devices`, by default the size of the current mesh
    (`jax.set_mesh`), else the devices holding `logits` (outside jit), else
    `jax.device_count()` (a step partitioned over every device, as in T5X).

    Args:
        logits: `[B, ..., V]` floating-point scores.
        targets: Integer token ids of shape `logits.shape[:-1]`.
        mask: Loss weights or a padding mask of the targets' shape; nonzero means a real
            target token. None means every position is real.
        loss: The scalar loss (z-loss included) as returned by
            `compute_weighted_cross_entropy`.
        z_loss: Its scalar z-loss part, or None to leave out the z-loss keys.
        segment_ids: `{feature: [B, L] integer segment ids}` for packed features (0 =
            padding); None values and empty features are skipped.
        token_losses: The per-token losses the loss was built from (recommended).
        loss_normalizing_factor: The numeric factor `loss` was divided by (scalar or `[B]`);
            needed only without `token_losses`.
        num_devices: Devices the step runs on, for `*_per_core`.

    Returns:
        A dict of metrics, keyed as above.

    Raises:
        TypeError: wrong dtypes (for example float targets or labels).
        ValueError: shapes that do not line up; a `[B]` factor without `token_losses`.

    Example:
        >>> import jax.numpy as jnp
        >>> logits = jnp.zeros((1, 4, 2))  # ln 2 per token
        >>> targets, mask = jnp.array([[1, 1, 1, 0]]), jnp.array([[1.0, 1.0, 1.0, 0.0]])
        >>> loss, _, _ = compute_weighted_cross_entropy(logits, targets, mask)
        >>> m = compute_base_metrics(logits, targets, mask, loss, num_devices=1)
        >>> print(f"{m['loss_per_nonpadding_target_token'].compute():.4f}")
        0.6931
        >>> print(f"{m['non_padding_fraction/loss_weights'].compute():.2f}")
        0.75
    """
    problems = _Problems("compute_base_metrics")
    shapes_ok = _check_logits_and_targets(problems, logits, targets)
    targets_shape = tuple(targets.shape) if _is_array(targets) else ()
    scalars: tuple[tuple[str, Any, bool], ...] = (("loss", loss, False), ("z_loss", z_loss, True))
    for name, value, optional in scalars:
        if value is None and optional:
            continue
        if _check_float_array(problems, name, value) and value.ndim != 0:
            problems.value_problem(f"`{name}` must be a scalar; got shape {tuple(value.shape)}.")
    if shapes_ok:
        _check_same_shape(problems, "mask", mask, targets_shape)
        _check_factor(problems, loss_normalizing_factor, targets_shape[0])
        if token_losses is not None:
            if not isinstance(token_losses, TokenLosses):
                problems.type_problem(
                    f"`token_losses` must be a TokenLosses (from compute_token_losses); got "
                    f"{type(token_losses).__name__}."
                )
            else:
                _check_same_shape(problems, "token_losses.loss", token_losses.loss, targets_shape)
                _check_same_shape(
                    problems, "token_losses.z_loss", token_losses.z_loss, targets_shape
                )
        elif getattr(loss_normalizing_factor, "ndim", 0) == 1:
            problems.value_problem(
                "a [batch] `loss_normalizing_factor` cannot be undone from the scalar `loss`; "
                "pass `token_losses` (from compute_token_losses), or use "
                "compute_loss_and_metrics."
            )
    if segment_ids is not None:
        if not isinstance(segment_ids, Mapping):
            problems.type_problem(
                f"`segment_ids` must map feature names to [B, L] arrays; got "
                f"{type(segment_ids).__name__}."
            )
        else:
            for feature, ids in segment_ids.items():
                if ids is None:
                    continue
                name = f"segment_ids[{feature!r}]"
                if _check_integer_array(problems, name, ids, fix="0 marks padding.") and (
                    ids.ndim != 2
                ):
                    problems.value_problem(
                        f"`{name}` must be [batch, length]; got shape {tuple(ids.shape)}."
                    )
    if num_devices is not None and (
        isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1
    ):
        problems.value_problem(f"`num_devices` must be a positive int; got {num_devices!r}.")
    problems.raise_if_any()

    if num_devices is None:
        num_devices = _default_num_devices(logits)
    batch_size = targets.shape[0]
    num_tokens = _float32_scalar(targets.size)
    real = jnp.ones(targets.shape, bool) if mask is None else mask != 0
    num_real_tokens = jnp.sum(real, dtype=jnp.float32)
    num_seqs = jnp.sum(jnp.any(real.reshape(batch_size, -1), axis=-1), dtype=jnp.float32)

    loss = loss.astype(jnp.float32)
    if token_losses is not None:
        loss_sum = jnp.sum(jnp.where(real, token_losses.loss, 0.0))
        z_loss_sum = jnp.sum(jnp.where(real, token_losses.z_loss, 0.0))
    else:
        scale = 1.0 if loss_normalizing_factor is None else _float32_scalar(loss_normalizing_factor)
        loss_sum = loss * scale
        z_loss_sum = jnp.zeros(()) if z_loss is None else z_loss.astype(jnp.float32) * scale

    correct = (jnp.argmax(logits, axis=-1) == targets) & real
    metrics: dict[str, clu_metrics.Metric] = {
        "accuracy": clu_metrics.Accuracy(
            total=jnp.sum(correct, dtype=jnp.float32), count=num_real_tokens
        ),
        "loss": metrics_lib.AveragePerStep.from_model_output(loss),
        "loss_per_nonpadding_target_token": clu_metrics.Average(
            total=loss_sum, count=num_real_tokens
        ),
        "loss_per_all_target_tokens": clu_metrics.Average(total=loss_sum, count=num_tokens),
        # Sequences = rows with a real target token: rows that are all padding (e.g. filler
        # rows of a short last batch) are not throughput. Packed rows count once per row.
        "timing/seqs_per_second": metrics_lib.TimeRate.from_model_output(numerator=num_seqs),
        "timing/steps_per_second": metrics_lib.StepsPerTime.from_model_output(),
        "timing/seconds": metrics_lib.Time(),
        "timing/seqs": metrics_lib.Sum.from_model_output(num_seqs),
        "timing/seqs_per_second_per_core": metrics_lib.TimeRate.from_model_output(
            numerator=num_seqs / num_devices
        ),
        # Target tokens = positions with mask != 0; padding is not counted (T5X counted it).
        "timing/target_tokens_per_second": metrics_lib.TimeRate.from_model_output(
            numerator=num_real_tokens
        ),
        "timing/target_tokens_per_second_per_core": metrics_lib.TimeRate.from_model_output(
            numerator=num_real_tokens / num_devices
        ),
        # Every target position, padding included: what the hardware processed.
        "timing/all_target_tokens_per_second": metrics_lib.TimeRate.from_model_output(
            numerator=num_tokens
        ),
        "non_padding_fraction/loss_weights": clu_metrics.Average(
            total=num_real_tokens, count=num_tokens
        ),
    }
    if z_loss is not None:
        z_loss = z_loss.astype(jnp.float32)
        metrics["z_loss"] = metrics_lib.AveragePerStep.from_model_output(z_loss)
        metrics["z_loss_per_all_target_tokens"] = clu_metrics.Average(
            total=z_loss_sum, count=num_tokens
        )
        metrics["cross_ent_loss"] = metrics_lib.AveragePerStep.from_model_output(loss - z_loss)
        metrics["cross_ent_loss_per_all_target_tokens"] = clu_metrics.Average(
            total=loss_sum - z_loss_sum, count=num_tokens
        )

    if segment_ids:
        total_positions = jnp.zeros((), jnp.float32)
        total_real_positions = jnp.zeros((), jnp.float32)
        for feature, ids in sorted(segment_ids.items()):
            if ids is None or ids.shape[1] == 0:
                continue
            metrics[f"effective_batch_size/{feature}"] = (
                metrics_lib.AveragePerStep.from_model_output(
                    count_packed_examples(ids).astype(jnp.float32)
                )
            )
            real_positions = jnp.sum(ids != 0, dtype=jnp.float32)
            metrics[f"non_padding_fraction/{feature}"] = clu_metrics.Average(
                total=real_positions, count=_float32_scalar(ids.size)
            )
            total_positions = total_positions + ids.size
            total_real_positions = total_real_positions + real_positions
        metrics["non_padding_fraction/overall"] = clu_metrics.Average(
            total=total_real_positions, count=total_positions
        )
    return metrics


def compute_loss_and_metrics(
    logits: jax.Array,
    batch: Mapping[str, jax.Array],
    *,
    label_smoothing: float = 0.0,
    z_loss: float | jax.Array = 0.0,
    num_devices: int | None = None,
) -> tuple[jax.Array, dict[str, clu_metrics.Metric]]:
    """The loss to differentiate and T5X's base metrics for one (micro)batch.

    Reads `decoder_target_tokens`, `decoder_loss_weights` (default: `targets > 0`),
    `loss_normalizing_factor` (as stored by `with_loss_normalization`; absent means no
    normalization) and every `<feature>_segment_ids` (for `effective_batch_size/<feature>`
    and `non_padding_fraction/<feature>`). The per-token losses are computed once and shared
    by the loss and the metrics. The z-loss keys are present only when `z_loss` is nonzero
    or an array.

    Args:
        logits: `[B, ..., V]` scores for the batch's targets.
        batch: A (micro)batch, after `with_loss_normalization` on the global batch.
        label_smoothing: In [0, 1); fixed at trace time.
        z_loss: Coefficient of the z-loss term.
        num_devices: Devices the step runs on, for `*_per_core` (see `compute_base_metrics`).

    Returns:
        `(loss, metrics)`, the pair a `loss_fn` for `accumulate_grads_microbatched` returns.

    Raises:
        TypeError, ValueError: as `compute_weighted_cross_entropy` and `compute_base_metrics`.

    Example:
        >>> import jax.numpy as jnp
        >>> batch = with_loss_normalization(
        ...     {"decoder_target_tokens": jnp.array([[1, 1, 0]])}, "NUM_REAL_TARGET_TOKENS")
        >>> loss, metrics = compute_loss_and_metrics(jnp.zeros((1, 3, 2)), batch, num_devices=1)
        >>> print(f"{float(loss):.4f} {metrics['accuracy'].compute():.1f}")
        0.6931 0.0
    """
    if not isinstance(batch, Mapping) or _TARGETS_KEY not in batch:
        keys = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
        raise ValueError(
            f"compute_loss_and_metrics needs batch[{_TARGETS_KEY!r}]; got {keys}. "
            "Pass the batch the logits were computed from."
        )
    targets = batch[_TARGETS_KEY]
    weights = batch.get(_WEIGHTS_KEY)
    factor = batch.get(LOSS_NORMALIZING_FACTOR_KEY)
    problems = _Problems("compute_loss_and_metrics")
    if _check_logits_and_targets(problems, logits, targets):
        _check_same_shape(problems, f"batch[{_WEIGHTS_KEY!r}]", weights, tuple(targets.shape))
        _check_factor(problems, factor, targets.shape[0])
    _check_loss_options(problems, label_smoothing, z_loss)
    problems.raise_if_any()

    if weights is None:
        weights = (targets > 0).astype(jnp.float32)
    weights = weights.astype(jnp.float32)
    token_losses = compute_token_losses(
        logits, targets, label_smoothing=label_smoothing, z_loss=z_loss
    )
    loss, total_z_loss = _weighted_sums(token_losses, weights, factor)
    report_z_loss = _is_array(z_loss) or z_loss != 0.0
    segment_ids = {
        key[: -len(_SEGMENT_IDS_SUFFIX)]: value
        for key, value in batch.items()
        if key.endswith(_SEGMENT_IDS_SUFFIX)
    }
    metrics = compute_base_metrics(
        logits,
        targets,
        weights,
        loss,
        z_loss=total_z_loss if report_z_loss else None,
        segment_ids=segment_ids or None,
        token_losses=token_losses,
        num_devices=num_devices,
    )
    return loss, metrics
