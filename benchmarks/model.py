"""The small model the benchmarks train, and the 20 metrics its step returns.

A per-token MLP language model over padded sequences (embedding, two hidden layers,
vocabulary logits) trained with T5X's loss (`compute_weighted_cross_entropy` with
z-loss). Its jitted SGD step takes about 0.5 ms on a 2-core CPU at the default sizes:
small enough that per-step metric overhead shows, large enough to be a plausible step.

`step_metrics` returns the dict a T5X model returns per step: the library's
`compute_base_metrics` (17 keys: losses, accuracy, per-token losses, timing) plus
`learning_rate` (CLU `Average`), `learning_rate/current` (CLU `LastValue`) and
`grad_norm`: 20 metrics, 30 array leaves.

Synopsis:

    params = init_params(jax.random.PRNGKey(0))
    batch = make_batch(jax.random.PRNGKey(1))
    (loss, aux), grads = jax.value_and_grad(loss_and_aux, has_aux=True)(params, batch)
    metrics = step_metrics(params, grads, batch, loss, aux)  # 20 metrics
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from clu import metrics as clu_metrics

Params = dict[str, jax.Array]
Batch = dict[str, jax.Array]
Aux = tuple[jax.Array, jax.Array]  # (logits, z_loss)

LEARNING_RATE = 0.5
Z_LOSS = 1e-4
NUM_METRICS = 20


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """Sizes of the model and its batch (`batch` sequences of `length` tokens)."""

    batch: int = 8
    length: int = 32
    vocab: int = 32
    embed: int = 32
    hidden: int = 128


DEFAULT = ModelSize()
SMALL = ModelSize(batch=4, length=8, vocab=8, embed=8, hidden=16)


def init_params(key: jax.Array, size: ModelSize = DEFAULT) -> Params:
    """Random parameters."""
    k0, k1, k2, k3 = jax.random.split(key, 4)
    return {
        "embed": jax.random.normal(k0, (size.vocab, size.embed)) * 0.1,
        "w1": jax.random.normal(k1, (size.embed, size.hidden)) * size.embed**-0.5,
        "b1": jnp.zeros((size.hidden,)),
        "w2": jax.random.normal(k2, (size.hidden, size.hidden)) * size.hidden**-0.5,
        "b2": jnp.zeros((size.hidden,)),
        "w3": jax.random.normal(k3, (size.hidden, size.vocab)) * size.hidden**-0.5,
    }


def make_batch(key: jax.Array, size: ModelSize = DEFAULT) -> Batch:
    """Random tokens whose targets follow a learnable rule, padded to random lengths."""
    k_tokens, k_lengths = jax.random.split(key)
    inputs = jax.random.randint(k_tokens, (size.batch, size.length), 1, size.vocab)
    targets = (inputs * 3 + 1) % size.vocab
    lengths = jax.random.randint(k_lengths, (size.batch, 1), size.length // 2, size.length + 1)
    weights = (jnp.arange(size.length)[None, :] < lengths).astype(jnp.float32)
    return {"inputs": inputs, "targets": targets * weights.astype(jnp.int32), "weights": weights}


def forward(params: Params, inputs: jax.Array) -> jax.Array:
    """Logits `[batch, length, vocab]`."""
    h = params["embed"][inputs]
    h = jax.nn.relu(h @ params["w1"] + params["b1"][None, None, :])
    h = jax.nn.relu(h @ params["w2"] + params["b2"][None, None, :])
    return h @ params["w3"]


def loss_and_aux(params: Params, batch: Batch) -> tuple[jax.Array, Aux]:
    """T5X's weighted cross-entropy with z-loss, per target position; aux = (logits, z_loss)."""
    from metrics_manager import compute_weighted_cross_entropy  # noqa: PLC0415

    logits = forward(params, batch["inputs"])
    loss, z_loss, _ = compute_weighted_cross_entropy(
        logits,
        batch["targets"],
        batch["weights"],
        z_loss=Z_LOSS,
        loss_normalizing_factor=normalizing_factor(batch),
    )
    return loss, (logits, z_loss)


def normalizing_factor(batch: Batch) -> float:
    """T5X's NUM_TOTAL_TARGET_TOKENS: the loss is a mean over all target positions."""
    return float(batch["targets"].size)


def sgd(params: Params, grads: Params) -> Params:
    """Plain SGD update."""
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)


def step_metrics(
    params: Params, grads: Params, batch: Batch, loss: jax.Array, aux: Aux
) -> dict[str, Any]:
    """The 20 metrics of one step (T5X's base metrics, learning rate, gradient norm)."""
    import metrics_manager as mm  # noqa: PLC0415

    del params
    logits, z_loss = aux
    metrics = mm.compute_base_metrics(
        logits,
        batch["targets"],
        batch["weights"],
        loss,
        z_loss,
        loss_normalizing_factor=normalizing_factor(batch),
        num_devices=1,
    )
    learning_rate = jnp.asarray(LEARNING_RATE, jnp.float32)
    grad_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
    metrics["learning_rate"] = clu_metrics.Average.from_model_output(learning_rate)
    metrics["learning_rate/current"] = clu_metrics.LastValue.from_model_output(learning_rate)
    metrics["grad_norm"] = clu_metrics.Average.from_model_output(grad_norm)
    return metrics


def metric_values(metrics: Mapping[str, Any]) -> dict[str, jax.Array]:
    """One scalar per metric, computed on the device (what the naive loop logs)."""
    out = {}
    for key, metric in metrics.items():
        if key.startswith("timing/"):
            # Durations are host-side; the naive loop logs the raw count instead.
            leaves = jax.tree.leaves(metric)
            out[key] = jnp.asarray(leaves[0] if leaves else 0.0, jnp.float32)
        else:
            out[key] = jnp.asarray(metric.compute(), jnp.float32)
    return out
