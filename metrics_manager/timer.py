"""`block_until_ready_or_deleted`: waits for device values; donated buffers count as ready.

A buffer donated to a later computation (`x.is_deleted()`) was computed before the step that
consumed it was dispatched. Host-side: `MetricsManager`'s worker times each window with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

Clock = Callable[[], float]
"""A function returning the current time in seconds (e.g. `time.perf_counter`)."""


def block_until_ready_or_deleted(tree: Any) -> None:
    """Blocks until every `jax.Array` leaf of `tree` is ready or deleted (donated).

    Raises:
      Exception: what `block_until_ready` raises for a leaf not deleted (its computation failed).

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
