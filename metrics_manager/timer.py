"""Waiting for device values without matching error strings: `block_until_ready_or_deleted`.

`MetricsManager`'s worker times each summary window with it (from the train state being ready
to the metrics being ready), so the training loop never blocks. Donated buffers
(`x.is_deleted()`) count as ready: the step that consumed them was dispatched after them.

Host-side module: never import it from code traced by jit.
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
    except Exception:  # a buffer may have been donated during the wait: leaf by leaf
        for leaf in arrays:
            try:
                leaf.block_until_ready()
            except Exception:
                if not leaf.is_deleted():
                    raise


def settled(x: Any) -> bool:
    """Whether `x` is no array still being computed: ready, donated, or no device array. A
    donation between the checks makes `is_ready()` raise: settled too."""
    if not isinstance(x, jax.Array):
        return True
    try:
        return x.is_deleted() or x.is_ready()  # type: ignore[attr-defined, no-any-return]
    except Exception:  # noqa: BLE001
        return True
