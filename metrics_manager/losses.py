"""Cross-entropy losses and T5X's base metrics, computed inside jit.

Device-side only: pure functions of arrays, no host transfers; input checks look at shapes
and dtypes, so they run once, at trace time. A loss function uses, in order:

* `with_loss_normalization(batch, loss_normalizing_factor)` on the GLOBAL batch, before it
  is split into microbatches: resolves the factor and the loss weights.
* `compute_loss_and_metrics(logits, batch)` per (micro)batch: the loss to differentiate and
  T5X's base metrics. Its parts are public for loops that need something else:
  `compute_token_losses`, `compute_weighted_cross_entropy` (`cross_entropy_with_logits` for
  target distributions), `get_loss_normalizing_factor_and_weights`, `compute_base_metrics`, `count_packed_examples`.

Microbatching: T5X computes the factor inside the loss, per microbatch, so a step's loss is a
sum of microbatch means (`num_microbatches` times too large, microbatches weighted unequally).
Here the global factor travels with the batch as a `[B]` vector under
`"loss_normalizing_factor"`, so any split along axis 0 hands every microbatch the global
factor: microbatch losses add up to the global loss and every metric merges to its value on
the global batch, whatever `num_microbatches` (see `compute_loss_and_metrics`'s example).
"""

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
from writers._checks import Problems, describe

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
    "cross_entropy_with_logits",
    "get_loss_normalizing_factor_and_weights",
    "with_loss_normalization",
]

#: Batch key under which `with_loss_normalization` stores the global factor, shape `[B]`.
LOSS_NORMALIZING_FACTOR_KEY = "loss_normalizing_factor"

_TARGETS_KEY = "decoder_target_tokens"
_WEIGHTS_KEY = "decoder_loss_weights"
_SEGMENT_IDS_KEY = "decoder_segment_ids"
_SEGMENT_IDS_SUFFIX = "_segment_ids"
# Without `*_segment_ids`, T5X's models count these features' padding masks (`tokens != 0`).
_UNPACKED_FEATURES = ("encoder_input_tokens", "decoder_target_tokens")
# Segment ids: T5X's models pass an unpacked batch's padding masks (`tokens != 0`, bool) as ones.
_SEGMENT_KIND = (jnp.integer, jnp.bool_)
_KINDS = {
    jnp.integer: "an integer (e.g. int32) array",
    jnp.floating: "a floating-point array",
    _SEGMENT_KIND: "an integer (e.g. int32) or bool array",
}
_NDIMS = {0: "a scalar", 2: "[batch, length]"}
_TARGETS_FIX = (
    "Pass token ids, e.g. `batch['decoder_target_tokens']`, not one-hot or float labels "
    "(cast with `.astype(jnp.int32)` if they are whole numbers stored as floats)."
)


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _is_number(x: Any, types: tuple[type, ...] = (int, float)) -> bool:
    return isinstance(x, types) and not isinstance(x, bool)


def _number_as_array(x: Any) -> Any:
    """A Python number (T5X takes `z_loss=0.0`) as a float32 scalar, as a step returns one."""
    return jnp.float32(x) if _is_number(x) else x


def _kinds(kind: Any) -> tuple[Any, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


class _Checks(Problems):
    def array(
        self, name: str, x: Any, kind: Any, *, shape: Any = None, ndim: Any = None, fix: str = ""
    ) -> bool:
        """Whether `x` is an array of dtype `kind` (None: optional), `shape` and `ndim`."""
        if x is None and kind is None:
            return True
        expected, fix = _KINDS.get(kind, "an array or None"), f" {fix}" if fix else ""
        if not _is_array(x):
            self.type_problem(f"`{name}` must be {expected}; got {describe(x)}.{fix}")
        elif kind is not None and not any(jnp.issubdtype(x.dtype, k) for k in _kinds(kind)):
            got = f"dtype {x.dtype} (shape {tuple(x.shape)})"
            self.type_problem(f"`{name}` must be {expected}; got {got}.{fix}")
        elif shape is not None and tuple(x.shape) != shape:
            self.value_problem(
                f"`{name}` must have the shape of `targets` {shape}; got shape {tuple(x.shape)}."
            )
        elif ndim is not None and x.ndim != ndim:
            self.value_problem(f"`{name}` must be {_NDIMS[ndim]}; got shape {tuple(x.shape)}.")
        else:
            return True
        return False

    def inputs(
        self, logits: Any, targets: Any, weights: Any, factor: Any, name: str = "weights"
    ) -> bool:
        fix = "Pass the model's unnormalized scores."
        logits_ok = self.array("logits", logits, jnp.floating, fix=fix)
        targets_ok = self.array("targets", targets, jnp.integer, fix=_TARGETS_FIX)
        if not (logits_ok and _is_array(targets)):
            return False
        if tuple(logits.shape) == tuple(targets.shape) and targets.ndim >= 2:
            self.value_problem(
                f"`targets` must be token ids of shape logits.shape[:-1] = "
                f"{tuple(logits.shape[:-1])}; got targets of the logits' shape "
                f"{tuple(targets.shape)}, one-hot? Pass `targets.argmax(-1)`."
            )
        elif logits.ndim != targets.ndim + 1 or logits.shape[:-1] != targets.shape:
            self.value_problem(
                f"`logits` must have shape targets.shape + (vocab_size,) = {tuple(targets.shape)}"
                f" + (V,); got logits of shape {tuple(logits.shape)}. Check that logits and "
                "targets come from the same (micro)batch."
            )
        elif targets.ndim < 1:
            self.value_problem("`targets` must have a batch axis; got a 0-d array.")
        elif logits.shape[-1] == 0:  # every loss NaN, accuracy's argmax an error
            self.value_problem(
                f"`logits` must score a vocabulary of at least 1 (last axis); got shape "
                f"{tuple(logits.shape)}. Check the model's output projection."
            )
        elif targets_ok:
            self.array(name, weights, None, shape=tuple(targets.shape))
            self.factor(factor, targets.shape[0])
            return True
        return False

    def factor(self, factor: Any, batch_size: int | None) -> None:
        name = "`loss_normalizing_factor`"
        if isinstance(factor, (str, SpecialLossNormalizingFactor)):
            self.type_problem(
                f"{name} here must be a number or an array; got {factor!r}. Resolve special "
                "factors first with `with_loss_normalization` on the global batch."
            )
        elif _is_number(factor, (int, float, np.number)):
            if not 0 < factor < math.inf:  # inf: every loss 0; NaN: every loss NaN
                self.value_problem(
                    f"{name} must be positive and finite; got {factor!r}. Use None for no "
                    "normalization."
                )
        elif factor is not None and not _is_array(factor):
            self.type_problem(
                f"{name} must be None, a positive number or an array; got {describe(factor)}."
            )
        elif factor is not None and factor.ndim != 0:
            if factor.ndim != 1 or (batch_size is not None and factor.shape[0] != batch_size):
                self.value_problem(
                    f"{name} must be a scalar or a [batch] vector of shape ({batch_size},) (as "
                    f"`with_loss_normalization` stores it); got shape {tuple(factor.shape)}."
                )
        # A host array's values are known now (a device array's would cost a sync).
        if isinstance(factor, np.ndarray) and factor.dtype.kind in "iuf":
            if (bad := factor[~((factor > 0) & (factor < math.inf))]).size:
                self.value_problem(
                    f"{name} must be positive and finite; got an array holding "
                    f"{bad.ravel()[0].item()!r}. Use None for no normalization."
                )

    def loss_options(self, label_smoothing: Any, z_loss: Any, logits: Any) -> Any:
        """Checks the options; returns `label_smoothing` as a Python float where it is a NumPy
        scalar (it is fixed at trace time, so it must be hashable and not an array)."""
        if isinstance(label_smoothing, np.floating | np.integer):
            label_smoothing = float(label_smoothing)  # a value read from a NumPy config
        if not _is_number(label_smoothing):
            got = describe(label_smoothing)
            self.type_problem(
                f"`label_smoothing` must be a float in [0, 1), fixed at trace time; got {got}."
            )
        elif not 0.0 <= label_smoothing < 1.0:
            self.value_problem(f"`label_smoothing` must be in [0, 1); got {label_smoothing!r}.")
        if _is_array(logits) and logits.ndim >= 1 and logits.shape[-1] < 2 and label_smoothing:
            got = logits.shape[-1]
            self.value_problem(f"label smoothing needs at least 2 classes; logits have {got}.")
        if _is_number(z_loss):
            if not 0 <= z_loss < math.inf:  # NaN or inf: a NaN or inf loss
                self.value_problem(f"`z_loss` must be non-negative and finite; got {z_loss!r}.")
        elif _is_array(z_loss):
            self.array("z_loss", z_loss, None, ndim=0)
        else:
            self.type_problem(
                f"`z_loss` must be a non-negative float or a scalar array; got {describe(z_loss)}."
            )
        return label_smoothing

    def metric_options(
        self, segment_ids: Any, num_devices: Any, targets: Any, *, batch_suffix: str | None = None
    ) -> None:
        """`batch_suffix`: the ids came as `batch[feature + batch_suffix]`, and are named so."""
        batch_size = int(targets.shape[0]) if _is_array(targets) and targets.ndim >= 1 else None
        if isinstance(segment_ids, Mapping):
            for feature, ids in segment_ids.items():
                name = f"segment_ids[{feature!r}]"
                if batch_suffix is not None:
                    name = f"batch[{feature + batch_suffix!r}]"
                if ids is None or not self.array(
                    name, ids, _SEGMENT_KIND, ndim=2, fix="0 marks padding."
                ):
                    continue
                if batch_size is not None and ids.shape[0] != batch_size:
                    fix = "Pass the segment ids of the same (micro)batch."
                    if batch_suffix == "":  # unpacked: the tokens' padding mask
                        fix = (
                            f"Pass the {feature} of the same (micro)batch (without "
                            "*_segment_ids, its padding mask, tokens != 0, is counted)."
                        )
                    self.value_problem(
                        f"`{name}` must have one row per sequence of `targets`, "
                        f"[{batch_size}, L]; got shape {tuple(ids.shape)}. {fix}"
                    )
                elif feature == "decoder" and batch_size is not None and ids.shape != targets.shape:
                    self.value_problem(  # its non-padding fraction counted the wrong positions
                        f"`{name}` must have the shape of `targets`, {tuple(targets.shape)}; "
                        f"got {tuple(ids.shape)}. Pass the decoder's segment ids of this batch."
                    )
        elif segment_ids is not None:
            self.type_problem(
                f"`segment_ids` must map feature names to [B, L] arrays; got "
                f"{type(segment_ids).__name__}."
            )
        if num_devices is None:
            return
        if not _is_number(num_devices, (int, np.integer)):
            self.type_problem(
                f"`num_devices` must be a Python int (static under jit); got "
                f"{describe(num_devices)}. Pass int(jax.device_count()) or a constant."
            )
        elif num_devices < 1:
            self.value_problem(f"`num_devices` must be a positive int; got {num_devices!r}.")


def _batch_targets(batch: Any, call: str, why: str = "", fix: str = "") -> Any:
    if not isinstance(batch, Mapping) or _TARGETS_KEY not in batch:
        keys = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
        raise ValueError(f"{call} needs batch[{_TARGETS_KEY!r}]{why}; got {keys}.{fix}")
    return batch[_TARGETS_KEY]


class TokenLosses(NamedTuple):
    """Per-token losses of the targets' shape, unweighted and unnormalized.

    Attributes:
        loss: Cross-entropy minus the smoothing entropy, plus the z-loss term.
        z_loss: The z-loss term alone, `z_loss * logsumexp(logits)**2`, without gradient.
    """

    loss: jax.Array
    z_loss: jax.Array


def _smoothing(label_smoothing: float, vocab_size: int) -> tuple[float, float, float]:
    """(confidence, low_confidence, entropy of the smoothed targets)."""
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab_size - 1) if vocab_size > 1 else 0.0
    entropy = -(confidence * math.log(confidence))  # confidence > 0: label_smoothing < 1
    if low > 0.0:
        entropy -= (vocab_size - 1) * (low * math.log(low))
    return confidence, low, entropy


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _token_losses(
    logits: jax.Array, targets: jax.Array, label_smoothing: float, z_loss: float | jax.Array
) -> TokenLosses:
    return _token_losses_fwd(logits, targets, label_smoothing, z_loss)[0]


def _token_losses_fwd(
    logits: jax.Array, targets: jax.Array, label_smoothing: float, z_loss: float | jax.Array
) -> tuple[TokenLosses, tuple[Any, ...]]:
    # Ids narrower than int32 (uint8 bytes, int16) would wrap the vocabulary size in the
    # range checks below: 256 is 0 in uint8, so every target read as invalid and the loss as 0.
    if jnp.iinfo(targets.dtype).bits < 32:
        targets = targets.astype(jnp.int32)
    confidence, low, constant = _smoothing(label_smoothing, logits.shape[-1])
    z_coefficient, z_loss = z_loss, jnp.asarray(z_loss, jnp.float32)
    x = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(x, axis=-1)
    # A target outside [0, V) (an ignore index such as -100) has an all-zero one-hot in T5X:
    # no target term, and none in the gradient below. A gather would read NaN or wrap.
    valid = (targets >= 0) & (targets < x.shape[-1])
    picked = metrics_lib.take_last(x, jnp.where(valid, targets, 0))
    target_log_prob = jnp.where(valid, picked - log_z, 0.0)
    # -sum_v q_v log p_v with q = low + (confidence - low) * onehot(targets), without
    # materializing the [.., V] soft targets.
    cross_ent = -(confidence - low) * target_log_prob
    if low > 0.0:
        cross_ent = cross_ent - low * jnp.sum(x - log_z[..., None], axis=-1)
    token_z_loss = z_loss * jnp.square(log_z)
    token_loss = cross_ent - constant + token_z_loss
    return TokenLosses(token_loss, token_z_loss), (logits, targets, z_coefficient, log_z)


def _token_losses_bwd(
    label_smoothing: float, residuals: tuple[Any, ...], cotangents: tuple[jax.Array, ...]
) -> tuple[jax.Array, None, jax.Array]:
    logits, targets, z_coefficient, log_z = residuals
    z_loss = jnp.asarray(z_coefficient, jnp.float32)
    # The logged z-loss (second output) copies a term of the loss: dropping its cotangent
    # keeps it from training twice.
    g_loss, _ = cotangents
    vocab_size = logits.shape[-1]
    confidence, low, _ = _smoothing(label_smoothing, vocab_size)
    probs = jnp.exp(logits.astype(jnp.float32) - log_z[..., None])
    vocab_ids = jax.lax.broadcasted_iota(targets.dtype, probs.shape, probs.ndim - 1)
    soft_targets = jnp.where(vocab_ids == targets[..., None], confidence, low)
    # d/dlogits of  -sum q log softmax + z * logsumexp^2  =  p * (sum q + 2 z logZ) - q
    valid = (targets >= 0) & (targets < vocab_size)  # else q is `low` everywhere
    sum_q = jnp.where(valid, confidence + (vocab_size - 1) * low, vocab_size * low)
    scale = sum_q + 2.0 * z_loss * log_z
    # A position with no cotangent (weight 0: padding) gets none, even where its logits are
    # not finite and `probs` is NaN there.
    g_logits = jnp.where(
        g_loss[..., None] != 0, g_loss[..., None] * (probs * scale[..., None] - soft_targets), 0
    )
    # For a scheduled (array) coefficient: d loss / d z = sum of g * logZ**2.
    g_z = jnp.sum(jnp.where(g_loss != 0, g_loss * jnp.square(log_z), 0))
    g_z = jnp.reshape(g_z, jnp.shape(z_coefficient)).astype(jnp.result_type(z_coefficient))
    g_logits = g_logits.astype(logits.dtype)
    if metrics_lib.explicit_mesh(g_logits) is not None:
        # The gradient takes the logits' own type: sharded like the targets beside logits
        # sharded otherwise (over the vocabulary alone, or not at all), JAX refused it.
        g_logits = jax.sharding.reshard(g_logits, jax.typeof(logits).sharding)
    return g_logits, None, g_z


_token_losses.defvjp(_token_losses_fwd, _token_losses_bwd)


def _weighted_sums(
    token_losses: TokenLosses, weights: jax.Array | None, factor: float | jax.Array | None
) -> tuple[jax.Array, jax.Array]:
    loss, z_loss = token_losses
    if weights is not None:
        # `where`, not a product alone: a padding position's non-finite loss would be 0 * inf.
        # Only there: elsewhere d(loss)/d(weight) is the token's loss, at a weight of 0 too.
        w = weights.astype(jnp.float32)
        loss, z_loss = (w * jnp.where((w != 0) | jnp.isfinite(x), x, 0.0) for x in (loss, z_loss))
    if factor is not None:
        if jnp.ndim(factor) == 1:  # [B]: rank promotion is explicit
            factor = jnp.reshape(factor, (-1,) + (1,) * (loss.ndim - 1))
        loss, z_loss = loss / jnp.float32(factor), z_loss / jnp.float32(factor)
    return jnp.sum(loss), jnp.sum(z_loss)


def compute_token_losses(
    logits: jax.Array,
    targets: jax.Array,
    *,
    label_smoothing: float = 0.0,
    z_loss: float | jax.Array = 0.0,
) -> TokenLosses:
    """Per-token cross-entropy with label smoothing and z-loss, in float32.

    Soft targets put `1 - label_smoothing` on the target and spread the rest evenly; their
    entropy is subtracted, so predicting them scores 0.

    Args:
        logits: `[..., V]` floating-point scores.
        targets: Token ids in `[0, V)` of shape `logits.shape[:-1]`. Others (an ignore
            index such as -100) get no target term, as in T5X: give them weight 0.
        label_smoothing: In [0, 1); fixed at trace time.
        z_loss: Coefficient of `logsumexp(logits)**2`; a scalar array for a schedule.

    Returns:
        `TokenLosses(loss, z_loss)`.

    Raises:
        TypeError: non-integer targets or non-floating logits.
        ValueError: shapes that do not line up, or an option out of range.

    Example:
        >>> import jax.numpy as jnp
        >>> logits = jnp.log(jnp.array([[0.9, 0.05, 0.05]]))
        >>> per_token = compute_token_losses(logits, jnp.array([0]), label_smoothing=0.1)
        >>> print(f"{float(per_token.loss[0]):.6f}")
        0.000000
    """
    problems = _Checks("compute_token_losses")
    problems.inputs(logits, targets, None, None)
    label_smoothing = problems.loss_options(label_smoothing, z_loss, logits)
    problems.raise_if_any()
    return _token_losses(logits, targets, label_smoothing, z_loss)


def compute_weighted_cross_entropy(
    logits: jax.Array,
    targets: jax.Array,
    weights: jax.Array | None = None,
    label_smoothing: float = 0.0,
    z_loss: float | jax.Array = 0.0,
    loss_normalizing_factor: float | jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """T5X's weighted cross-entropy: `sum(weights * token_loss) / loss_normalizing_factor`.

    Args:
        logits, targets, label_smoothing, z_loss: As for `compute_token_losses`.
        weights: Loss weights of the targets' shape; None weighs every token 1.
        loss_normalizing_factor: None, a positive number, or a scalar or `[B]` array (per row).

    Returns:
        `(loss, z_loss, weight_sum)`, float32 scalars; the z-loss part has no gradient.

    Raises:
        TypeError: wrong dtypes, or an unresolved special factor.
        ValueError: shapes that do not line up, or options out of range.

    Example:
        >>> import jax.numpy as jnp
        >>> logits = jnp.zeros((1, 2, 4))  # uniform over 4 tokens: ln 4 per token
        >>> loss, z, n = compute_weighted_cross_entropy(
        ...     logits, jnp.array([[1, 0]]), jnp.array([[1.0, 0.0]]))
        >>> print(f"{float(loss):.4f} {float(z):.1f} {float(n):.1f}")
        1.3863 0.0 1.0
    """
    problems = _Checks("compute_weighted_cross_entropy")
    problems.inputs(logits, targets, weights, loss_normalizing_factor)
    label_smoothing = problems.loss_options(label_smoothing, z_loss, logits)
    problems.raise_if_any()
    token_losses = _token_losses(logits, targets, label_smoothing, z_loss)
    loss, total_z_loss = _weighted_sums(token_losses, weights, loss_normalizing_factor)
    count = jnp.float32(targets.size) if weights is None else jnp.sum(weights.astype(jnp.float32))
    return loss, total_z_loss, count


def cross_entropy_with_logits(
    logits: jax.Array, targets: jax.Array, z_loss: float | jax.Array = 0.0
) -> tuple[jax.Array, jax.Array]:
    """T5X's cross-entropy against target distributions, per position, in float32.

    `loss = -sum(targets * log_softmax(logits)) + z_loss * logsumexp(logits)**2` over the
    last axis; the second output is the z-loss term alone and carries no gradient (it is
    logged; the first output trains on it), as in T5X. The gradient in the logits is T5X's,
    `(1 + 2 z logZ) softmax - targets`, for targets that sum to 1 (exact for any others).
    A zero target contributes exactly 0, also beside a logit of -inf (a vocabulary entry
    masked out), where T5X's `0 * -inf` made the loss NaN; its gradient in that target is 0.
    For token ids, `compute_weighted_cross_entropy` does not build `[..., V]` targets.

    Args:
        logits: `[..., V]` floating-point scores.
        targets: `[..., V]` floating-point target distributions (one-hot or smoothed).
        z_loss: Coefficient of `logsumexp(logits)**2`; a scalar array for a schedule.

    Returns:
        `(loss, z_loss)`, each of shape `logits.shape[:-1]`.

    Raises:
        TypeError: non-floating logits or targets; ValueError: shapes that differ.

    Example:
        >>> import jax.numpy as jnp
        >>> loss, z = cross_entropy_with_logits(jnp.zeros((1, 4)), jnp.eye(4)[1:2], 0.1)
        >>> print(f"{float(loss[0]):.4f} {float(z[0]):.4f}")  # ln 4 + 0.1 * (ln 4)**2
        1.5785 0.1922
    """
    problems = _Checks("cross_entropy_with_logits")
    fix = "Pass token ids to compute_weighted_cross_entropy, or jax.nn.one_hot(ids, V)."
    if problems.array("logits", logits, jnp.floating, fix="Pass the model's unnormalized scores."):
        if problems.array("targets", targets, jnp.floating, fix=fix) and (
            tuple(targets.shape) != tuple(logits.shape)
        ):
            problems.value_problem(
                f"`targets` must be distributions of the logits' shape {tuple(logits.shape)}; "
                f"got shape {tuple(targets.shape)}. {fix}"
            )
    problems.loss_options(0.0, z_loss, logits)
    problems.raise_if_any()
    x = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(x, axis=-1)
    token_z_loss = jnp.asarray(z_loss, jnp.float32) * jnp.square(log_z)
    targets = targets.astype(jnp.float32)
    log_probs = x - log_z[..., None]
    # A logit of -inf (a masked vocabulary entry) beside a zero target: T5X's 0 * -inf made
    # the loss NaN. The term is 0 there, as compute_weighted_cross_entropy reads it; every
    # other term, and the gradient in the logits, are T5X's bit for bit.
    log_probs = jnp.where((targets == 0) & (log_probs == -jnp.inf), 0.0, log_probs)
    cross_ent = -jnp.sum(targets * log_probs, axis=-1)
    return cross_ent + token_z_loss, jax.lax.stop_gradient(token_z_loss)


class SpecialLossNormalizingFactor(enum.Enum):
    """Loss normalizing factors computed from the batch (T5X's names and values).

    Attributes:
        NUM_REAL_TARGET_TOKENS: The sum of the loss weights.
        NUM_TOTAL_TARGET_TOKENS: The number of target positions, padding included.
        AVERAGE_PER_SEQUENCE: The number of sequences with weight; each one's weights then sum to 1.
    """

    NUM_REAL_TARGET_TOKENS = 1
    NUM_TOTAL_TARGET_TOKENS = 2
    AVERAGE_PER_SEQUENCE = 3


def convert_special_loss_normalizing_factor_to_enum(
    x: str | SpecialLossNormalizingFactor,
) -> SpecialLossNormalizingFactor:
    """Converts a member's name (any case) to the member.

    Args:
        x: A name such as `"num_real_target_tokens"`, or a member (returned as is).

    Raises:
        TypeError: `x` is neither a string nor a member.
        ValueError: `x` names no member.

    Example:
        >>> convert_special_loss_normalizing_factor_to_enum("Average_Per_Sequence")
        <SpecialLossNormalizingFactor.AVERAGE_PER_SEQUENCE: 3>
    """
    if isinstance(x, SpecialLossNormalizingFactor):
        return x
    if not isinstance(x, str):
        raise TypeError(
            f"A special loss normalizing factor must be a string or a "
            f"SpecialLossNormalizingFactor; got {describe(x)}."
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
    """Cumulative sum along axis 1 restarting at `starts`; row-local: no gather when sharded."""

    def combine(a: tuple, b: tuple) -> tuple:
        a_start, a_sum = a
        b_start, b_sum = b
        return a_start | b_start, jnp.where(b_start, b_sum, a_sum + b_sum)

    return jax.lax.associative_scan(combine, (starts, values), reverse=reverse, axis=1)[1]


def _on_auto_axes(fun: Any, out_specs: tuple[Any, ...], *args: jax.Array) -> Any:
    """`fun(*args)`, compiled as on an Auto mesh where an argument is sharded on an Explicit
    axis, its outputs sharded as `out_specs` say: there the shifted slices and selects of
    segment ids refused a sharded sequence axis, and ids sharded unlike the weights."""
    meshes = [mesh for x in args if (mesh := metrics_lib.explicit_mesh(x)) is not None]
    if not meshes:
        return fun(*args)
    out = tuple(jax.sharding.NamedSharding(meshes[0], spec) for spec in out_specs)
    return jax.sharding.auto_axes(fun, out_sharding=out if len(out) > 1 else out[0])(*args)


def _segment_sums(weights: jax.Array, segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each position's weight sum over its run of equal segment ids, and the number of runs
    with weight."""
    changes = segment_ids[:, 1:] != segment_ids[:, :-1]
    edge = jnp.ones_like(segment_ids[:, :1], dtype=bool)
    starts = jnp.concatenate([edge, changes], axis=1)
    ends = jnp.concatenate([changes, edge], axis=1)
    up_to_here = _segmented_cumsum(weights, starts, reverse=False)
    from_here = _segmented_cumsum(weights, ends, reverse=True)
    per_token_sum = up_to_here + from_here - weights
    return per_token_sum, jnp.sum(starts & (per_token_sum > 0))


def _average_per_sequence(
    weights: jax.Array, segment_ids: jax.Array | None
) -> tuple[jax.Array, jax.Array]:
    """Divides each sequence's weights by their sum; returns (weights, num_sequences)."""
    if segment_ids is None:
        per_token_sum = jnp.sum(weights, axis=-1, keepdims=True)
        num_sequences = jnp.sum(per_token_sum > 0)
    else:
        weights = jnp.where(segment_ids != 0, weights, 0.0)  # id 0 is padding
        specs = (jax.typeof(weights).sharding.spec, jax.P())
        per_token_sum, num_sequences = _on_auto_axes(_segment_sums, specs, weights, segment_ids)
    has_weight = per_token_sum > 0
    weights = jnp.where(has_weight, weights / jnp.where(has_weight, per_token_sum, 1.0), 0.0)
    return weights, num_sequences.astype(jnp.float32)


def get_loss_normalizing_factor_and_weights(
    loss_normalizing_factor: float | jax.Array | str | SpecialLossNormalizingFactor | None,
    batch: Mapping[str, jax.Array],
) -> tuple[float | jax.Array | None, jax.Array | None]:
    """Resolves a loss normalizing factor against the GLOBAL batch (T5X's function).

    Special factors read `decoder_target_tokens`, `decoder_loss_weights` (default `targets > 0`)
    and for AVERAGE_PER_SEQUENCE `decoder_segment_ids` (id 0 gets weight 0). A batch without
    any weight gives factor 1 (loss 0, not NaN).

    Args:
        loss_normalizing_factor: A number, array or None (as is), or a special factor or its name.
        batch: The global batch.

    Returns:
        `(factor, weights)`: the batch's weights (or None) for a numeric factor; float32 weights
        and a float32 factor (a Python float for NUM_TOTAL_TARGET_TOKENS) for special ones.

    Raises:
        TypeError: wrong types (for example float target tokens).
        ValueError: an unknown name, a missing key, or shapes that do not match.

    Example:
        >>> import jax.numpy as jnp
        >>> batch = {"decoder_target_tokens": jnp.array([[5, 6, 0], [7, 0, 0]])}
        >>> factor, weights = get_loss_normalizing_factor_and_weights("average_per_sequence", batch)
        >>> print(float(factor), weights.tolist())
        2.0 [[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]
    """
    problems = _Checks("get_loss_normalizing_factor_and_weights")
    weights = batch.get(_WEIGHTS_KEY) if isinstance(batch, Mapping) else None
    if not isinstance(loss_normalizing_factor, (str, SpecialLossNormalizingFactor)):
        problems.factor(loss_normalizing_factor, None)
        problems.raise_if_any()
        return loss_normalizing_factor, weights
    special = convert_special_loss_normalizing_factor_to_enum(loss_normalizing_factor)
    if not isinstance(batch, Mapping):
        problems.type_problem(f"`batch` must be a mapping of arrays; got {type(batch).__name__}.")
    elif _TARGETS_KEY not in batch:
        problems.value_problem(
            f"{special.name} needs batch[{_TARGETS_KEY!r}]; got keys {sorted(batch)}. Add the "
            "target tokens, or pass a numeric factor."
        )
    problems.raise_if_any()
    targets, segment_ids = batch[_TARGETS_KEY], batch.get(_SEGMENT_IDS_KEY)
    name = f"batch[{_TARGETS_KEY!r}]"
    if problems.array(name, targets, jnp.integer, fix="Pass token ids (0 = padding)."):
        shape = tuple(targets.shape)
        if targets.ndim < 1:
            problems.value_problem(f"`{name}` must have a batch axis; got a 0-d array.")
        problems.array(f"batch[{_WEIGHTS_KEY!r}]", weights, None, shape=shape)
        if special is SpecialLossNormalizingFactor.AVERAGE_PER_SEQUENCE and segment_ids is not None:
            name, fix = f"batch[{_SEGMENT_IDS_KEY!r}]", "0 marks padding."
            problems.array(name, segment_ids, jnp.integer, shape=shape, ndim=2, fix=fix)
    problems.raise_if_any()
    weights = (targets > 0 if weights is None else weights).astype(jnp.float32)
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
    """Resolves the factor on the GLOBAL batch, before it is split, and stores it in the batch.

    Args:
        batch: The global batch, with `decoder_target_tokens` of shape `[B, ...]` (under
            `pmap`, before it is split across devices: one device's rows give its factor).
        loss_normalizing_factor: As for `get_loss_normalizing_factor_and_weights`.

    Returns:
        A new dict with the factor as a float32 `[B]` vector under `"loss_normalizing_factor"`
        (ones for None) and the weights, if any, under `"decoder_loss_weights"`.

    Raises:
        TypeError, ValueError: as `get_loss_normalizing_factor_and_weights`.

    Example:
        >>> import jax.numpy as jnp
        >>> batch = {"decoder_target_tokens": jnp.array([[5, 6, 0], [7, 0, 0]])}
        >>> with_loss_normalization(batch, "NUM_REAL_TARGET_TOKENS")["loss_normalizing_factor"]
        Array([3., 3.], dtype=float32)
    """
    targets = _batch_targets(batch, "with_loss_normalization", " (to size the per-row factor)")
    factor, weights = get_loss_normalizing_factor_and_weights(loss_normalizing_factor, batch)
    batch_size = targets.shape[0]
    problems = _Checks("with_loss_normalization")
    problems.factor(factor, batch_size)
    problems.raise_if_any()
    factor = jnp.broadcast_to(jnp.float32(1.0 if factor is None else factor), (batch_size,))
    out = {**batch, LOSS_NORMALIZING_FACTOR_KEY: factor}
    if weights is not None:
        out[_WEIGHTS_KEY] = weights
    return out


def count_packed_examples(segment_ids: jax.Array) -> jax.Array:
    """Examples packed into `[B, L]` rows (int32): segment changes + rows - rows ending in padding.

    Args:
        segment_ids: `[B, L]` integer segment ids; 0 is padding, only at the end of a row. A
            bool padding mask (`tokens != 0`, as T5X's models pass unpacked) counts its rows.

    Raises:
        TypeError, ValueError: `segment_ids` is not an integer or bool array, or not 2-D.

    Example:
        >>> import jax.numpy as jnp
        >>> int(count_packed_examples(jnp.array([[1, 1, 2, 0], [1, 2, 3, 3], [0, 0, 0, 0]])))
        5
    """
    problems = _Checks("count_packed_examples")
    problems.array("segment_ids", segment_ids, _SEGMENT_KIND, ndim=2, fix="0 marks padding.")
    problems.raise_if_any()
    if segment_ids.shape[1] == 0:  # rows without positions hold no example (no last id)
        return jnp.zeros((), jnp.int32)

    def count(segment_ids: jax.Array) -> jax.Array:
        changes = jnp.sum(segment_ids[:, 1:] != segment_ids[:, :-1], dtype=jnp.int32)
        rows_ending_in_padding = jnp.sum(segment_ids[:, -1] == 0, dtype=jnp.int32)
        return changes + segment_ids.shape[0] - rows_ending_in_padding

    return _on_auto_axes(count, (jax.P(),), segment_ids)


def compute_base_metrics(
    logits: jax.Array,
    targets: jax.Array,
    mask: jax.Array | None,
    loss: jax.Array | float,
    z_loss: jax.Array | float | None = None,
    segment_ids: Mapping[str, jax.Array | None] | None = None,
    *,
    token_losses: TokenLosses | None = None,
    loss_normalizing_factor: float | jax.Array | None = None,
    num_devices: int | None = None,
) -> dict[str, clu_metrics.Metric]:
    """T5X's base metrics for one (micro)batch, right under every loss normalizing factor.

    T5X's keys (listed in the README); all merge by addition, so microbatches merge to the
    global batch's values. Unlike T5X, tokens and sequences count only `mask != 0` (new
    `timing/all_target_tokens_per_second` counts all), and per-token losses do not depend on
    the factor.

    Args:
        logits, targets: As for `compute_token_losses`, with a leading batch axis.
        mask: Loss weights or padding mask (nonzero: a real token); None: all real.
        loss: The scalar loss, z-loss included (as from `compute_weighted_cross_entropy`);
            a Python number is taken as float32, as T5X takes it.
        z_loss: Its scalar z-loss part, or None to leave out the z-loss keys.
        segment_ids: `{feature: [B, L] segment ids}` of packed features (0 = padding), or
            of unpacked ones their bool padding masks (`tokens != 0`), as T5X's models pass.
        token_losses: The per-token losses behind `loss`. With them, `loss_per_*` keys
            average the unweighted token losses where `mask != 0`, whatever the weights and
            factor; without them (T5X's way), the per-token sums are
            `loss * loss_normalizing_factor`, the weighted sum. The two agree for 0/1 weights.
        loss_normalizing_factor: The scalar factor `loss` was divided by.
        num_devices: For `*_per_core`; default: the current mesh's size, else the devices
            holding `logits`, else `jax.device_count()`.

    Returns:
        A dict of metrics.

    Raises:
        TypeError: wrong dtypes (for example float targets).
        ValueError: shapes that do not line up; a `[B]` factor without `token_losses`.

    Example:
        >>> import jax.numpy as jnp
        >>> logits = jnp.zeros((1, 4, 2))  # ln 2 per token
        >>> targets, mask = jnp.array([[1, 1, 1, 0]]), jnp.array([[1.0, 1.0, 1.0, 0.0]])
        >>> loss, _, _ = compute_weighted_cross_entropy(logits, targets, mask)
        >>> m = compute_base_metrics(logits, targets, mask, loss, num_devices=1)
        >>> print(f"{m['loss_per_nonpadding_target_token'].compute():.4f}")
        0.6931
    """
    problems = _Checks("compute_base_metrics")
    factor = loss_normalizing_factor
    if problems.inputs(logits, targets, mask, factor, name="mask"):
        if token_losses is None and getattr(factor, "ndim", 0) == 1:
            problems.value_problem(
                "a [batch] `loss_normalizing_factor` cannot be undone from the scalar `loss`; "
                "pass `token_losses` (compute_token_losses) or use compute_loss_and_metrics."
            )
        elif token_losses is not None and not isinstance(token_losses, TokenLosses):
            problems.type_problem(
                f"`token_losses` must be a TokenLosses (from compute_token_losses); got "
                f"{type(token_losses).__name__}."
            )
        elif token_losses is not None:
            for field, value in token_losses._asdict().items():
                problems.array(f"token_losses.{field}", value, None, shape=tuple(targets.shape))
    loss_value, z_value = _number_as_array(loss), _number_as_array(z_loss)
    problems.array("loss", loss_value, jnp.floating, ndim=0)
    if z_loss is not None:
        problems.array("z_loss", z_value, jnp.floating, ndim=0)
    problems.metric_options(segment_ids, num_devices, targets)
    problems.raise_if_any()
    return _base_metrics(
        logits, targets, mask, loss_value, z_value, segment_ids, token_losses, factor, num_devices
    )


def _base_metrics(
    logits: jax.Array,
    targets: jax.Array,
    mask: jax.Array | None,
    loss: jax.Array,
    z_loss: jax.Array | None,
    segment_ids: Mapping[str, jax.Array | None] | None,
    token_losses: TokenLosses | None,
    factor: float | jax.Array | None,
    num_devices: int | None,
) -> dict[str, clu_metrics.Metric]:
    """`compute_base_metrics` on inputs its callers have already checked."""
    if num_devices is None:
        mesh = jax.sharding.get_abstract_mesh()
        if not mesh.empty:
            num_devices = int(mesh.size)
        elif isinstance(logits, jax.Array) and not isinstance(logits, jax.core.Tracer):
            num_devices = len(logits.sharding.device_set)
        else:
            num_devices = jax.device_count()
    num_tokens = jnp.float32(targets.size)
    real = jnp.ones(targets.shape, bool) if mask is None else mask != 0
    num_real = jnp.sum(real, dtype=jnp.float32)
    num_seqs = jnp.sum(
        jnp.any(real.reshape(targets.shape[0], math.prod(targets.shape[1:])), axis=-1),
        dtype=jnp.float32,
    )
    num_correct = jnp.sum((jnp.argmax(logits, axis=-1) == targets) & real, dtype=jnp.float32)
    loss = loss.astype(jnp.float32)
    if token_losses is not None:
        loss_sum, z_loss_sum = (jnp.sum(jnp.where(real, x, 0.0)) for x in token_losses)
    else:
        scale = 1.0 if factor is None else jnp.float32(factor)
        loss_sum = loss * scale
        z_loss_sum = jnp.zeros(()) if z_loss is None else z_loss.astype(jnp.float32) * scale
    avg, per_step = clu_metrics.Average, metrics_lib.AveragePerStep.from_model_output
    rate = metrics_lib.TimeRate.from_model_output
    metrics: dict[str, clu_metrics.Metric] = {
        "accuracy": clu_metrics.Accuracy(total=num_correct, count=num_real),
        "loss": per_step(loss),
        "loss_per_nonpadding_target_token": avg(total=loss_sum, count=num_real),
        "loss_per_all_target_tokens": avg(total=loss_sum, count=num_tokens),
        # Sequences are rows with a real token: all-padding rows (e.g. filling a short last
        # batch) are not throughput.
        "timing/seqs_per_second": rate(numerator=num_seqs),
        "timing/steps_per_second": metrics_lib.StepsPerTime.from_model_output(),
        "timing/seconds": metrics_lib.Time(),
        "timing/seqs": metrics_lib.Sum.from_model_output(num_seqs),
        "timing/seqs_per_second_per_core": rate(numerator=num_seqs / num_devices),
        "timing/target_tokens_per_second": rate(numerator=num_real),
        "timing/target_tokens_per_second_per_core": rate(numerator=num_real / num_devices),
        "timing/all_target_tokens_per_second": rate(numerator=num_tokens),
        "non_padding_fraction/loss_weights": avg(total=num_real, count=num_tokens),
    }
    if z_loss is not None:
        z_loss = z_loss.astype(jnp.float32)
        metrics["z_loss"] = per_step(z_loss)
        metrics["z_loss_per_all_target_tokens"] = avg(total=z_loss_sum, count=num_tokens)
        metrics["cross_ent_loss"] = per_step(loss - z_loss)
        metrics["cross_ent_loss_per_all_target_tokens"] = avg(
            total=loss_sum - z_loss_sum, count=num_tokens
        )
    if segment_ids:
        all_positions = all_real_positions = jnp.zeros((), jnp.float32)
        for feature, ids in sorted(segment_ids.items()):
            if ids is None or ids.shape[1] == 0:
                continue
            examples = count_packed_examples(ids).astype(jnp.float32)
            metrics[f"effective_batch_size/{feature}"] = per_step(examples)
            positions, real_positions = jnp.float32(ids.size), jnp.sum(ids != 0, dtype=jnp.float32)
            metrics[f"non_padding_fraction/{feature}"] = avg(total=real_positions, count=positions)
            all_positions = all_positions + ids.size
            all_real_positions = all_real_positions + real_positions
        metrics["non_padding_fraction/overall"] = avg(total=all_real_positions, count=all_positions)
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

    Reads `decoder_target_tokens`, `decoder_loss_weights` (default `targets > 0`),
    `loss_normalizing_factor` (absent: none) and every `<feature>_segment_ids`. A batch with
    none (unpacked) passes the padding masks (`tokens != 0`) of its 2-D `decoder_target_tokens`
    and `encoder_input_tokens` instead, as T5X's models do: the features are those keys, as in
    `non_padding_fraction/decoder_target_tokens`. The z-loss and `cross_ent_loss*` keys are
    always there (0 and the loss without a z-loss), as T5X's models pass their z-loss, 0.0 by
    default, every step. The `loss_per_*` keys average the unweighted token losses over tokens
    of nonzero weight (see `compute_base_metrics`).

    Args:
        logits: `[B, ..., V]` scores for the batch's targets.
        batch: A (micro)batch, after `with_loss_normalization` on the global batch.
        label_smoothing, z_loss: As for `compute_token_losses`.
        num_devices: As for `compute_base_metrics`.

    Returns:
        `(loss, metrics)`, as a `loss_fn` for `accumulate_grads_microbatched` returns them.

    Raises:
        TypeError, ValueError: as `compute_weighted_cross_entropy` and `compute_base_metrics`.

    Example:
        >>> import jax.numpy as jnp
        >>> from metrics_manager.merging import accumulate_grads_microbatched
        >>> batch = {"decoder_target_tokens": jnp.array([[1, 2, 0], [3, 0, 0]])}
        >>> batch = with_loss_normalization(batch, "NUM_REAL_TARGET_TOKENS")  # on the global batch
        >>> def loss_fn(bias, microbatch):  # uniform predictions: ln 5 = 1.6094 per real token
        ...     logits = jnp.broadcast_to(bias, microbatch["decoder_target_tokens"].shape + (5,))
        ...     return compute_loss_and_metrics(logits, microbatch, num_devices=1)
        >>> for count in (1, 2):  # the same values for any number of microbatches
        ...     grads, metrics = accumulate_grads_microbatched(loss_fn, jnp.zeros(5), batch, count)
        ...     print(f"{float(metrics['loss'].compute()):.4f} {float(grads[0]):.4f}")
        1.6094 0.2000
        1.6094 0.2000
    """
    targets = _batch_targets(
        batch, "compute_loss_and_metrics", fix=" Pass the batch the logits were computed from."
    )
    weights, factor = batch.get(_WEIGHTS_KEY), batch.get(LOSS_NORMALIZING_FACTOR_KEY)
    suffix = len(_SEGMENT_IDS_SUFFIX)
    segment_ids = {k[:-suffix]: v for k, v in batch.items() if k.endswith(_SEGMENT_IDS_SUFFIX)}
    batch_suffix = _SEGMENT_IDS_SUFFIX
    if not segment_ids:  # unpacked, as in T5X's models: the features' padding masks
        segment_ids = {
            k: batch[k] != 0
            for k in _UNPACKED_FEATURES
            if _is_array(batch.get(k)) and batch[k].ndim == 2
        }
        batch_suffix = ""
    problems = _Checks("compute_loss_and_metrics")
    problems.inputs(logits, targets, weights, factor, name=f"batch[{_WEIGHTS_KEY!r}]")
    label_smoothing = problems.loss_options(label_smoothing, z_loss, logits)
    problems.metric_options(segment_ids, num_devices, targets, batch_suffix=batch_suffix)
    problems.raise_if_any()
    weights = (targets > 0 if weights is None else weights).astype(jnp.float32)
    token_losses = _token_losses(logits, targets, label_smoothing, z_loss)
    loss, z_sum = _weighted_sums(token_losses, weights, factor)
    return loss, _base_metrics(  # checked above: no second pass
        logits, targets, weights, loss, z_sum, segment_ids or None, token_losses, None, num_devices
    )
