"""Batched device-to-host copy of a pytree: one transfer instead of one per leaf.

T5X copies a summary's metrics to the host one leaf at a time; on an
accelerator every copy pays a round trip. `device_get_batched` instead packs
all `jax.Array` leaves that live on the same device into ONE flat byte buffer
with a jitted function, copies that buffer, and slices it back into NumPy
arrays on the host (views, no further copies).

Compiling one concatenation of thousands of operands is slow (XLA's compile
time grows faster than linearly: about 7 s for 10,000 scalars here), so large
trees are first stacked in chunks of at most `CHUNK` same-shaped leaves. Every
chunk of the same shape and dtype reuses one compiled function, and the final
pack sees one operand per chunk. jit caches all of these per shape, dtype and
placement, so a summary of an unchanged tree compiles nothing. The plan
itself (which leaves go into which chunk, at which byte offset) is cached per
tree structure and leaf shapes, dtypes and shardings, so a summary of an
unchanged tree re-inspects no leaf beyond those attributes.

Usage:

  host_metrics = device_get_batched(metrics)   # same tree, NumPy leaves

Host-side module: call it outside jit (the `MetricsManager` calls it in its
background worker).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

T = TypeVar("T")

CHUNK = 256
"""Most leaves stacked by one compiled function (keeps compile time linear)."""

_PLAN_CACHE_SIZE = 64
"""Most tree layouts whose copy plan is kept (a training run has a handful)."""


@jax.jit
def _stack(leaves: tuple[jax.Array, ...]) -> jax.Array:
    return jnp.stack(leaves)


@jax.jit
def _pack(parts: tuple[tuple[jax.Array, ...], ...]) -> jax.Array:
    """Stacks each part and concatenates the raw bytes of all parts."""
    pieces = []
    for part in parts:
        block = jnp.stack(part)
        if block.dtype == jnp.bool_:
            block = block.astype(jnp.uint8)
        else:
            block = jax.lax.bitcast_convert_type(block, jnp.uint8)
        pieces.append(block.reshape(-1))
    return jnp.concatenate(pieces) if len(pieces) > 1 else pieces[0]


@dataclasses.dataclass(frozen=True)
class _Part:
    indices: tuple[int, ...]  # positions of the leaves in the flattened tree
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return len(self.indices) * int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How to copy one tree layout: what `_plan` found, with byte offsets worked out."""

    treedef: Any
    first_shards: tuple[int, ...]  # replicated leaves, read from their first local copy
    placements: tuple[tuple[_Part, ...], ...]  # packed parts, one tuple per device
    stacked: tuple[bool, ...]  # per placement: pre-stack each part (big trees)
    offsets: tuple[tuple[int, ...], ...]  # per placement, per part: byte offset
    others: tuple[int, ...]  # leaves fetched by jax.device_get as they are


_PLANS: dict[Hashable, _Plan] = {}


_PACKABLE: dict[np.dtype, bool] = {}


def _packable(dtype: np.dtype) -> bool:
    if dtype not in _PACKABLE:
        _PACKABLE[dtype] = bool(
            jnp.issubdtype(dtype, jnp.floating)
            or jnp.issubdtype(dtype, jnp.integer)
            or dtype == np.dtype(bool)
        )
    return _PACKABLE[dtype]


def _plan(tree: Any) -> tuple[list[Any], Any, dict[Hashable, list[_Part]], list[int]]:
    """Flattens `tree` and groups its jax.Array leaves for packing.

    Returns the leaves (replicated arrays replaced by their first local shard),
    the tree definition, the packed parts per placement (widest dtypes first, so
    every part's offset in the buffer stays aligned) and the indices of arrays
    that cannot be packed.
    """
    leaves, treedef = jax.tree.flatten(tree)
    groups: dict[tuple[Hashable, np.dtype, tuple[int, ...]], list[int]] = {}
    others: list[int] = []
    problems: list[tuple[int, str]] = []
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, jax.Array):
            continue
        if leaf.is_deleted():
            problems.append((i, "was deleted (donated to a later computation)"))
            continue
        sharding = leaf.sharding
        if not isinstance(sharding, jax.sharding.SingleDeviceSharding):
            if leaf.is_fully_replicated:
                leaf = leaves[i] = leaf.addressable_data(0)
                sharding = leaf.sharding
            elif not leaf.is_fully_addressable:
                problems.append((i, f"is sharded across processes ({sharding})"))
                continue
            else:  # split over local devices: its pieces are fetched and joined by JAX
                others.append(i)
                continue
        dtype = np.dtype(leaf.dtype)
        if _packable(dtype):
            groups.setdefault((sharding, dtype, leaf.shape), []).append(i)
        else:
            others.append(i)
    if problems:
        paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
        lines = "\n".join(f"  {paths[i]}: {why}" for i, why in problems)
        raise ValueError(
            "Cannot copy these metric leaves to the host:\n"
            f"{lines}\n"
            "Metrics must be alive and replicated when a summary is written: return them "
            "from the step with a replicated sharding (e.g. out_shardings=PartitionSpec()) "
            "and do not donate them."
        )
    plans: dict[Hashable, list[_Part]] = {}
    for (placement, dtype, shape), indices in sorted(
        groups.items(), key=lambda kv: (-kv[0][1].itemsize, kv[0][1].str, kv[0][2])
    ):
        plans.setdefault(placement, []).extend(
            _Part(tuple(indices[s : s + CHUNK]), dtype, shape)
            for s in range(0, len(indices), CHUNK)
        )
    return leaves, treedef, plans, others


def _layout_key(leaves: list[Any], treedef: Any) -> Hashable:
    return (
        CHUNK,
        treedef,
        tuple(
            (leaf.shape, leaf.dtype, leaf.sharding) if isinstance(leaf, jax.Array) else None
            for leaf in leaves
        ),
    )


def _cached_plan(tree: Any) -> tuple[list[Any], _Plan]:
    """The tree's leaves and its copy plan, built once per layout.

    Raises `_plan`'s ValueError when a leaf was deleted or cannot be read.
    """
    leaves, treedef = jax.tree.flatten(tree)
    if any(isinstance(leaf, jax.Array) and leaf.is_deleted() for leaf in leaves):
        _plan(tree)  # raises, listing every bad leaf
    key = _layout_key(leaves, treedef)
    plan = _PLANS.get(key)
    if plan is None:
        planned, treedef, plans, others = _plan(tree)
        placements = tuple(tuple(parts) for parts in plans.values())
        plan = _Plan(
            treedef=treedef,
            first_shards=tuple(
                i for i, (a, b) in enumerate(zip(leaves, planned, strict=True)) if a is not b
            ),
            placements=placements,
            stacked=tuple(
                len(parts) > 1 and sum(len(p.indices) for p in parts) > CHUNK
                for parts in placements
            ),
            offsets=tuple(
                tuple(int(o) for o in np.cumsum([0] + [p.nbytes for p in parts[:-1]]))
                for parts in placements
            ),
            others=tuple(others),
        )
        if len(_PLANS) >= _PLAN_CACHE_SIZE:
            del _PLANS[next(iter(_PLANS))]  # the oldest layout
        _PLANS[key] = plan
    for i in plan.first_shards:
        leaves[i] = leaves[i].addressable_data(0)
    return leaves, plan


def device_get_batched(tree: T) -> T:
    """Copies every `jax.Array` leaf of `tree` to the host in one transfer per device.

    Leaves that are not `jax.Array` pass through unchanged. Replicated arrays
    are read from their first local copy. Arrays split over several local
    devices, and arrays of dtypes that cannot be reinterpreted as bytes (e.g.
    complex), are fetched in the same `jax.device_get` call after starting all
    their copies at once.

    Args:
      tree: a pytree, e.g. a mapping of CLU metrics.

    Returns:
      The same tree structure with NumPy arrays in place of `jax.Array` leaves
      (read-only views of one host buffer).

    Raises:
      ValueError: if a leaf was deleted (donated) or is sharded across
        processes without being replicated; lists every such leaf.

    Example:
      >>> import jax.numpy as jnp
      >>> out = device_get_batched({"a": jnp.arange(3), "b": jnp.float32(2.5)})
      >>> out["a"].tolist(), float(out["b"])
      ([0, 1, 2], 2.5)
    """
    leaves, plan = _cached_plan(tree)
    if not plan.placements and not plan.others:
        return tree

    buffers = []
    for parts, stacked in zip(plan.placements, plan.stacked, strict=True):
        if stacked:
            operands = tuple((_stack(tuple(leaves[i] for i in p.indices)),) for p in parts)
        else:
            operands = tuple(tuple(leaves[i] for i in p.indices) for p in parts)
        buffers.append(_pack(operands))
    for i in plan.others:
        leaves[i].copy_to_host_async()
    host_buffers, host_others = jax.device_get((buffers, [leaves[i] for i in plan.others]))

    out = leaves
    for parts, offsets, buffer in zip(plan.placements, plan.offsets, host_buffers, strict=True):
        raw = np.asarray(buffer)
        for p, offset in zip(parts, offsets, strict=True):
            if p.nbytes:
                block = np.frombuffer(raw, p.dtype, p.nbytes // p.dtype.itemsize, offset)
                block = block.reshape((len(p.indices), *p.shape))
            else:
                block = np.zeros((len(p.indices), *p.shape), p.dtype)
            for i, row in zip(p.indices, block, strict=True):
                out[i] = row
    for i, value in zip(plan.others, host_others, strict=True):
        out[i] = value
    return jax.tree.unflatten(plan.treedef, out)
