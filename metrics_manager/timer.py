"""Waiting for device values without matching error strings: `block_until_ready_or_deleted`.

`MetricsManager` times each summary window on its worker with this: the window starts when
the train state is ready and ends when the metrics are.

JAX dispatches asynchronously, so "ready" is only known by blocking; the manager does that
blocking on its worker thread, so the training loop never waits for it.

Buffers that were donated to a later computation (`x.is_deleted()`) count as
ready: the step that consumed them has been dispatched after they were
computed. This is checked per leaf, never by matching error strings.

This module runs on the host only; never import it from code traced by jit.
"""

from collections.abc import Callable
from typing import Any

import jax

Clock = Callable[[], float]
"""A function returning the current time in seconds (e.g. `time.perf_counter`)."""


def block_until_ready_or_deleted(tree: Any) -> None:
    """Blocks until every `jax.Array` leaf of `tree` is ready or deleted.

    Deleted (donated) buffers count as ready. Leaves that are not `jax.Array`
    (NumPy arrays, Python numbers, None) are ready by definition.

    Args:
      tree: any pytree.

    Raises:
      Exception: whatever `block_until_ready` raises for a leaf that is still
        alive afterwards (e.g. the computation producing it failed).

    Example:
      >>> import jax.numpy as jnp
      >>> block_until_ready_or_deleted({"x": jnp.ones(3), "y": 1.0})
    """
    arrays = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array) and not x.is_deleted()]
    try:
        jax.block_until_ready(arrays)  # one batched wait, not one call per leaf
        return
    except Exception:
        pass  # a buffer may have been donated during the wait: sort it out leaf by leaf
    for leaf in arrays:
        try:
            leaf.block_until_ready()
        except Exception:
            if not leaf.is_deleted():
                raise
