"""The small model the benchmarks train: a 3-layer MLP classifier and its 20 metrics.

Its jitted SGD step takes about 0.6 ms on a 2-core CPU at the default sizes: small
enough that per-step metric overhead shows, large enough to be a plausible training step.

`step_metrics` returns the 20-metric dict a T5X-style model would return per step
(losses, accuracy, timing, learning rate, logit and gradient statistics), built from the
library's metric types and CLU's.

Synopsis:

    params = init_params(jax.random.PRNGKey(0))
    batch = make_batch(jax.random.PRNGKey(1))
    (loss, logits), grads = jax.value_and_grad(loss_and_logits, has_aux=True)(params, batch)
    metrics = step_metrics(params, grads, batch, loss, logits)  # 20 metrics
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

LEARNING_RATE = 0.01
NUM_METRICS = 20


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """Sizes of the MLP and its batch."""

    batch: int = 64
    features: int = 128
    hidden: int = 256
    classes: int = 10


DEFAULT = ModelSize()
SMALL = ModelSize(batch=8, features=16, hidden=32, classes=4)


def init_params(key: jax.Array, size: ModelSize = DEFAULT) -> Params:
    """Random MLP parameters."""
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "w1": jax.random.normal(k1, (size.features, size.hidden)) * 0.05,
        "b1": jnp.zeros((size.hidden,)),
        "w2": jax.random.normal(k2, (size.hidden, size.hidden)) * 0.05,
        "b2": jnp.zeros((size.hidden,)),
        "w3": jax.random.normal(k3, (size.hidden, size.classes)) * 0.05,
        "b3": jnp.zeros((size.classes,)),
    }


def make_batch(key: jax.Array, size: ModelSize = DEFAULT) -> Batch:
    """A random batch whose labels follow a learnable linear rule, with some padding rows."""
    kx, kw = jax.random.split(key)
    inputs = jax.random.normal(kx, (size.batch, size.features))
    rule = jax.random.normal(kw, (size.features, size.classes))
    labels = jnp.argmax(inputs @ rule, axis=-1).astype(jnp.int32)
    weights = (jnp.arange(size.batch) < size.batch - size.batch // 8).astype(jnp.float32)
    return {"inputs": inputs, "labels": labels, "weights": weights}


def forward(params: Params, inputs: jax.Array) -> jax.Array:
    """Logits of the MLP."""
    h = jax.nn.relu(inputs @ params["w1"] + params["b1"][None, :])
    h = jax.nn.relu(h @ params["w2"] + params["b2"][None, :])
    return h @ params["w3"] + params["b3"][None, :]


def loss_and_logits(params: Params, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """Summed weighted cross-entropy (T5X convention) and the logits."""
    logits = forward(params, batch["inputs"])
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, batch["labels"][:, None], axis=-1)[:, 0]
    return jnp.sum(nll * batch["weights"]), logits


def sgd(params: Params, grads: Params) -> Params:
    """Plain SGD update."""
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)


def _global_norm(tree: Params) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def step_metrics(
    params: Params, grads: Params, batch: Batch, loss: jax.Array, logits: jax.Array
) -> dict[str, Any]:
    """The 20 metrics of one step, as metric objects (library types where T5X has them)."""
    import metrics_manager as mm  # noqa: PLC0415  (keeps `import benchmarks.model` light)

    weights = batch["weights"]
    labels = batch["labels"]
    mask = weights > 0
    num_tokens = jnp.sum(weights)
    logp = jax.nn.log_softmax(logits)
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    top2 = jnp.argsort(logits, axis=-1)[:, -2:]
    top2_correct = jnp.any(top2 == labels[:, None], axis=-1).astype(jnp.float32)
    z = jax.nn.logsumexp(logits, axis=-1)
    batch_size = jnp.asarray(labels.shape[0], jnp.float32)
    metrics: dict[str, Any] = {
        "loss": mm.AveragePerStep.from_model_output(loss),
        "accuracy": clu_metrics.Accuracy.from_model_output(logits=logits, labels=labels, mask=mask),
        "top2_accuracy": clu_metrics.Average.from_model_output(top2_correct, mask=mask),
        "cross_ent_loss": mm.Sum.from_model_output(loss),
        "loss_per_nonpadding_target_token": clu_metrics.Average(
            total=loss, count=num_tokens.astype(jnp.int32)
        ),
        "z_loss": mm.AveragePerStep.from_model_output(jnp.sum(jnp.square(z) * weights) * 1e-4),
        "entropy": clu_metrics.Average.from_model_output(entropy, mask=mask),
        "logits/max": mm.Max.from_model_output(logits),
        "logits/min": mm.Min.from_model_output(logits),
        "logits/mean_std": mm.MeanStd.from_model_output(logits),
        "grad_norm": clu_metrics.Average.from_model_output(_global_norm(grads)),
        "param_norm": clu_metrics.LastValue.from_model_output(_global_norm(params)),
        "learning_rate": clu_metrics.Average.from_model_output(jnp.asarray(LEARNING_RATE)),
        "learning_rate/current": clu_metrics.LastValue.from_model_output(
            jnp.asarray(LEARNING_RATE)
        ),
        "non_padding_fraction/loss_weights": clu_metrics.Average.from_model_output(weights),
        "timing/seqs": mm.Sum.from_model_output(batch_size),
        "timing/steps_per_second": mm.StepsPerTime.from_model_output(),
        "timing/seqs_per_second": mm.TimeRate.from_model_output(batch_size),
        "timing/target_tokens_per_second": mm.TimeRate.from_model_output(num_tokens),
        "timing/seconds": mm.Time(),
    }
    return metrics


def metric_values(metrics: Mapping[str, Any]) -> dict[str, jax.Array]:
    """One scalar per metric, computed on the device (what the naive loop logs)."""
    out = {}
    for key, metric in metrics.items():
        if key.startswith("timing/"):
            # Durations are host-side; the naive loop logs the raw numerator.
            leaves = jax.tree.leaves(metric)
            out[key] = leaves[0] if leaves else jnp.zeros(())
        else:
            out[key] = jnp.asarray(metric.compute(), jnp.float32)
    return out
