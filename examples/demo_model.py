"""The demo's model, synthetic data and hyper-parameters (used by `examples.demo`).

Kept apart from `demo.py` so that the demo reads as a plain training loop that people
copy into their own code; nothing here is part of the library's API.

* `ModelConfig`, `DataConfig`, `TrainConfig`: frozen dataclasses, configured from gin
  (`configs/demo.gin` binds them with dynamic registration, so this module has no gin
  decorators).
* `TransformerLM`: a small decoder-only transformer (flax linen): token and position
  embeddings, pre-LayerNorm causal self-attention blocks, logits over the vocabulary.
* `SyntheticSequences`: an endless, seeded stream of variable-length sequences padded to a
  fixed length, in T5X's decoder-only feature names (`decoder_input_tokens`,
  `decoder_target_tokens`, `decoder_loss_weights`, `decoder_segment_ids`).

The data has structure a transformer learns within a few hundred CPU steps: the first token
of each sequence picks one of `num_rules` fixed permutations of the content tokens, and every
later token is that permutation applied to its predecessor (or, with probability `noise`, a
random content token). A bigram model can only guess among the `num_rules` successors; to
reach high accuracy the model must attend back to position 0. So the loss first falls to
about ln(num_rules) per token and then further, and accuracy climbs towards 1 - noise.

Example:
    >>> data = SyntheticSequences(DataConfig(batch_size=2, max_length=8, min_length=4))
    >>> batch = next(iter(data))
    >>> sorted(batch)
    ['decoder_input_tokens', 'decoder_loss_weights', 'decoder_segment_ids', 'decoder_target_tokens']
    >>> batch["decoder_target_tokens"].shape
    (2, 8)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from writers._checks import collapsed_url

PAD_ID = 0
BOS_ID = 1
_NUM_SPECIAL = 2  # PAD and BOS; rule tokens and content tokens follow.


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Size of the transformer.

    Attributes:
        vocab_size: Number of token ids, including PAD (0) and BOS (1).
        embed_dim: Width of the residual stream.
        num_heads: Attention heads per layer; must divide `embed_dim`.
        num_layers: Number of transformer blocks.
        mlp_dim: Hidden width of each block's MLP.
        max_length: Longest sequence the position embedding covers.
    """

    vocab_size: int = 32
    embed_dim: int = 64
    num_heads: int = 4
    num_layers: int = 2
    mlp_dim: int = 128
    max_length: int = 32


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Shape and structure of the synthetic sequences.

    Attributes:
        vocab_size: Number of token ids (must match `ModelConfig.vocab_size`).
        batch_size: Sequences per global batch (split into microbatches by the train step).
        max_length: Padded length of every sequence.
        min_length: Shortest real (unpadded) length; lengths are uniform in
            `[min_length, max_length]`.
        num_rules: Number of permutations; the first token of a sequence picks one.
        noise: Probability that a token is random instead of following the rule.
        seed: Seed of the stream; the same seed gives the same batches.
    """

    vocab_size: int = 32
    batch_size: int = 32
    max_length: int = 32
    min_length: int = 8
    num_rules: int = 4
    noise: float = 0.05
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Training loop settings.

    Attributes:
        model_dir: Where summaries and `config.gin` go (`<model_dir>/train`,
            `<model_dir>/eval/<eval_name>`).
        total_steps: Number of train steps.
        summary_period: Write a train summary every this many steps (T5X's `stats_period`).
        eval_period: Run eval every this many steps (and after the last step); a multiple
            of `summary_period`.
        num_eval_batches: Batches per eval.
        eval_name: Name of the eval run (`<model_dir>/eval/<eval_name>`).
        num_microbatches: Microbatches per train step (gradient accumulation); the global
            batch size must be divisible by it.
        peak_learning_rate: Learning rate at the end of warm-up.
        warmup_steps: Linear warm-up steps; cosine decay to 10% of the peak follows.
        z_loss: Coefficient of T5X's z-loss (`z_loss * logsumexp(logits)**2` per token).
        label_smoothing: Label smoothing of the cross entropy.
        loss_normalizing_factor: What the summed loss is divided by: a number, None (no
            division), or a `SpecialLossNormalizingFactor` name such as
            "NUM_REAL_TARGET_TOKENS". Computed on the global batch, so the reported values
            do not depend on `num_microbatches`.
        seed: Seed of the parameter initialisation.
    """

    model_dir: str = "runs/demo"
    total_steps: int = 300
    summary_period: int = 25
    eval_period: int = 100
    num_eval_batches: int = 4
    eval_name: str = "synthetic"
    num_microbatches: int = 2
    peak_learning_rate: float = 3e-3
    warmup_steps: int = 30
    z_loss: float = 1e-4
    label_smoothing: float = 0.0
    loss_normalizing_factor: float | str | None = "NUM_REAL_TARGET_TOKENS"
    seed: int = 0


# Each field's annotation (a string under `from __future__ import annotations`) -> the types
# it takes and how an error names them; a bool is never taken for a number.
_TYPES: dict[str, tuple[type | tuple[type, ...], str]] = {
    "int": (int, "an int"),
    "float": ((int, float), "a number"),
    "str": (str, "a str"),
    "float | str | None": ((int, float, str, type(None)), "a number, a str or None"),
}


def _file_on(path: str) -> str | None:
    """The first non-directory on `path` or above it (None where all are directories or absent)."""
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        if os.path.lexists(path):
            return path
        if (parent := os.path.dirname(path)) == path:
            break
        path = parent
    return None


def check_configs(model: ModelConfig, data: DataConfig, train: TrainConfig) -> None:
    """Checks that the three configs fit together, listing every problem in one error.

    Args:
        model: The model's sizes.
        data: The data's shape.
        train: The loop's settings.

    Raises:
        TypeError: Naming each field of the wrong type (a gin binding such as
            `--gin.TOTAL_STEPS=10.5`).
        ValueError: Naming each field that is out of range or inconsistent, and the fix.

    Example:
        >>> check_configs(ModelConfig(), DataConfig(), TrainConfig(total_steps=10))
        Traceback (most recent call last):
        ...
        ValueError: Invalid demo config: TrainConfig.warmup_steps=30 must be < TrainConfig.total_steps=10 (lower warmup_steps).
    """
    types = [
        f"{type(config).__name__}.{field.name}={value!r} must be {words}, "
        f"got {type(value).__name__}"
        for config in (model, data, train)
        for field in dataclasses.fields(config)
        for taken, words in [_TYPES[str(field.type)]]
        if isinstance(value := getattr(config, field.name), bool) or not isinstance(value, taken)
    ]
    if types:  # the range checks below need numbers
        quoted = any("got str" in problem for problem in types)
        hint = " In gin, numbers go without quotes (TOTAL_STEPS = 50, not '50')." if quoted else ""
        raise TypeError("Invalid demo config: " + "; ".join(types) + "." + hint)
    problems = []
    if not train.model_dir:  # `--gin.MODEL_DIR="'$MODEL_DIR'"` with the variable unset
        problems.append("TrainConfig.model_dir='' must name a directory (is $MODEL_DIR set?)")
    elif problem := collapsed_url(train.model_dir, "TrainConfig.model_dir"):  # ./gs:/b/run's lock
        problems.append(problem)
    elif "://" not in train.model_dir and (file := _file_on(train.model_dir)):
        problems.append(  # makedirs raised a bare FileExistsError once the model compiled
            f"TrainConfig.model_dir={train.model_dir!r} must name a directory, but {file!r} "
            "is a file: move it, or pick another MODEL_DIR (--gin.MODEL_DIR=\"'/tmp/demo'\")"
        )
    parts = train.eval_name.split("/")
    if not all(parts) or ".." in parts:  # '../train' mixed the eval's files with train's
        problems.append(
            f"TrainConfig.eval_name={train.eval_name!r} must name a directory under "
            "<model_dir>/eval, without '..' or empty parts"
        )
    for name in (
        "total_steps",
        "summary_period",
        "eval_period",
        "num_eval_batches",
        "num_microbatches",
    ):
        if getattr(train, name) < 1:
            problems.append(f"TrainConfig.{name}={getattr(train, name)} must be >= 1")
    if train.summary_period >= 1 and train.eval_period % train.summary_period:
        problems.append(
            f"TrainConfig.eval_period={train.eval_period} must be a multiple of "
            f"TrainConfig.summary_period={train.summary_period} (evals run between summary "
            "windows, so their time is not counted as training time)"
        )
    if not 0 <= train.warmup_steps < train.total_steps:
        problems.append(
            f"TrainConfig.warmup_steps={train.warmup_steps} must be < "
            f"TrainConfig.total_steps={train.total_steps} (lower warmup_steps)"
        )
    if train.num_microbatches >= 1 and data.batch_size % train.num_microbatches:
        problems.append(
            f"DataConfig.batch_size={data.batch_size} must be divisible by "
            f"TrainConfig.num_microbatches={train.num_microbatches}"
        )
    if data.vocab_size != model.vocab_size:
        problems.append(
            f"DataConfig.vocab_size={data.vocab_size} must equal "
            f"ModelConfig.vocab_size={model.vocab_size} (bind both, e.g. through a macro)"
        )
    if data.max_length > model.max_length:
        problems.append(
            f"DataConfig.max_length={data.max_length} must be <= "
            f"ModelConfig.max_length={model.max_length} (the position embedding's size)"
        )
    if model.embed_dim % model.num_heads:
        problems.append(
            f"ModelConfig.embed_dim={model.embed_dim} must be divisible by "
            f"ModelConfig.num_heads={model.num_heads}"
        )
    if problems:
        raise ValueError("Invalid demo config: " + "; ".join(problems) + ".")


class _Block(nn.Module):
    """One pre-LayerNorm transformer block: causal self-attention, then an MLP."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        cfg = self.config
        y = nn.LayerNorm()(x)
        y = nn.MultiHeadDotProductAttention(num_heads=cfg.num_heads, qkv_features=cfg.embed_dim)(
            y, y, mask=mask
        )
        x = x + y
        y = nn.LayerNorm()(x)
        y = nn.Dense(cfg.mlp_dim)(y)
        y = nn.gelu(y)
        y = nn.Dense(cfg.embed_dim)(y)
        return x + y


class TransformerLM(nn.Module):
    """A small decoder-only transformer language model.

    Attributes:
        config: The model's sizes.

    Example:
        >>> model = TransformerLM(ModelConfig(embed_dim=16, num_layers=1, mlp_dim=32))
        >>> tokens = jnp.ones((2, 8), jnp.int32)
        >>> params = model.init(jax.random.key(0), tokens)
        >>> model.apply(params, tokens).shape
        (2, 8, 32)
    """

    config: ModelConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Returns logits of shape `tokens.shape + (vocab_size,)`.

        Args:
            tokens: int32 `[batch, length]` decoder input tokens; PAD (0) positions are
                excluded as attention keys.
        """
        cfg = self.config
        length = tokens.shape[-1]
        x = nn.Embed(cfg.vocab_size, cfg.embed_dim)(tokens)
        positions = nn.Embed(cfg.max_length, cfg.embed_dim)(jnp.arange(length))
        x = x + positions[None]
        # BOS sits at position 0 of every sequence, so every query has a valid key.
        causal = nn.make_causal_mask(tokens)  # [batch, 1, length, length]
        not_padding = nn.make_attention_mask(jnp.ones_like(tokens), tokens != PAD_ID)
        mask = causal * not_padding
        for _ in range(cfg.num_layers):
            x = _Block(cfg)(x, mask)
        x = nn.LayerNorm()(x)
        return nn.Dense(cfg.vocab_size)(x)


class SyntheticSequences:
    """Seeded, endless stream of padded variable-length sequences (see the module docstring).

    Args:
        config: Sizes and structure of the data.

    Raises:
        ValueError: If the vocabulary is too small for `num_rules` rule tokens and at least
            two content tokens, or the lengths are inconsistent.

    Example:
        >>> data = SyntheticSequences(DataConfig(batch_size=4, max_length=16))
        >>> batch = next(iter(data))
        >>> int(batch["decoder_loss_weights"].sum(axis=1).min()) >= 8  # min_length
        True
    """

    def __init__(self, config: DataConfig) -> None:
        problems = []
        num_content = config.vocab_size - _NUM_SPECIAL - config.num_rules
        if config.num_rules < 1:
            problems.append(f"num_rules must be >= 1, got {config.num_rules}")
        elif num_content < 2:
            problems.append(
                f"vocab_size={config.vocab_size} must exceed 2 special tokens + "
                f"num_rules={config.num_rules} by at least 2 content tokens"
            )
        if not 2 <= config.min_length <= config.max_length:
            problems.append(
                f"need 2 <= min_length <= max_length, got min_length={config.min_length}, "
                f"max_length={config.max_length}"
            )
        if not 0.0 <= config.noise <= 1.0:
            problems.append(f"noise must be in [0, 1], got {config.noise}")
        if problems:
            raise ValueError("Invalid DataConfig: " + "; ".join(problems) + ".")
        self.config = config
        self._num_content = num_content
        rules_rng = np.random.default_rng(1234)  # the task is fixed; only `seed` varies samples
        self._rules = np.stack(
            [rules_rng.permutation(num_content) for _ in range(config.num_rules)]
        )

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        rng = np.random.default_rng(self.config.seed)
        while True:
            yield self.sample(rng)

    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Draws one batch.

        Args:
            rng: The numpy generator to draw from.

        Returns:
            int32 `decoder_input_tokens` (BOS then the sequence shifted right),
            `decoder_target_tokens` (the sequence, PAD after its end),
            `decoder_segment_ids` (1 on real tokens, 0 on padding: one example per row,
            in T5X's packed-feature format) and float32 `decoder_loss_weights` (1 on real
            tokens, 0 on padding), each `[batch_size, max_length]`.
        """
        cfg = self.config
        b, n = cfg.batch_size, cfg.max_length
        content_offset = _NUM_SPECIAL + cfg.num_rules
        rule = rng.integers(cfg.num_rules, size=b)
        seq = np.empty((b, n), np.int64)
        seq[:, 0] = _NUM_SPECIAL + rule
        state = rng.integers(self._num_content, size=b)
        seq[:, 1] = content_offset + state
        for t in range(2, n):
            state = np.where(
                rng.random(b) < cfg.noise,
                rng.integers(self._num_content, size=b),
                self._rules[rule, state],
            )
            seq[:, t] = content_offset + state
        lengths = rng.integers(cfg.min_length, n + 1, size=b)
        weights = (np.arange(n)[None, :] < lengths[:, None]).astype(np.float32)
        targets = np.where(weights > 0, seq, PAD_ID).astype(np.int32)
        inputs = np.concatenate([np.full((b, 1), BOS_ID, np.int32), targets[:, :-1]], axis=1)
        return {
            "decoder_input_tokens": inputs,
            "decoder_target_tokens": targets,
            "decoder_loss_weights": weights,
            "decoder_segment_ids": (weights > 0).astype(np.int32),
        }
