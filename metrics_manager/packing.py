"""`PackedMetrics`: a dict of metrics carried as one flat buffer per dtype.

Every leaf a compiled step returns is a buffer that XLA allocates and JAX wraps on every call:
~40 leaves for ~20 metrics, about 10% of a 0.65 ms CPU step. Packed, the step returns one buffer
per dtype (usually `float32` and `int32`); the layout is static pytree data, so unpacking is
static slices and packing one concatenate per dtype, traced into the caller's `jax.jit`.

`merge_metrics` returns one inside `jax.jit` (or anywhere with `pack=True`); `MetricsManager`
accepts it as it accepts a dict. It reads like that dict (`packed["loss"]`, `dict(packed)`,
each read one `packed.unpack()` on the device), or without device work as
`packed.unpack_host(jax.device_get(packed.buffers))` (numpy).
"""

import math
from collections.abc import ItemsView, Iterator, Mapping, Sequence, ValuesView
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.lax import lax as _lax_internal

from metrics_manager.metrics import HostPlan, is_metric_obj
from writers._checks import Problems, describe

__all__ = ["PackedMetrics"]


def _check_dict(metrics: Any, what: str, problems: Problems) -> bool:
    """Adds a problem per non-str key and non-metric value; False if `metrics` is no mapping."""
    if not isinstance(metrics, Mapping):
        problems.type_problem(
            f"{what} must be a dict of name -> clu Metric, got {describe(metrics)}"
        )
        return False
    for key, value in metrics.items():
        if not isinstance(key, str):
            problems.type_problem(
                f"{what} key {key!r}: expected a str name, got {type(key).__name__}"
            )
        if not is_metric_obj(value):
            problems.type_problem(
                f"{what}[{key!r}]: expected a clu.metrics.Metric (or Collection), got "
                f"{describe(value)}; wrap the value in a metric, e.g. "
                "clu.metrics.LastValue(value=x) or metrics_manager.Sum.from_model_output(x)"
            )
    return True


class _Layout(NamedTuple):
    """The static half of a PackedMetrics: hashable, so jit caches on it."""

    treedef: Any  # of the dict of metrics; None fields (Time.duration) are part of it
    # Per leaf: (buffer, start, stop, shape, weak_type).
    leaves: tuple[tuple[int, int, int, tuple[int, ...], bool], ...]
    specs: tuple[tuple[np.dtype, tuple[int]], ...]  # per buffer: (dtype, shape)
    keys: tuple[str, ...]
    # Each metric's class, by key: JAX's treedefs of two flax dataclasses with the same
    # fields compare equal (Max and Min, Precision and Recall), so jit's cache unpacked a
    # Min as the Max it saw first, which then merged as a max.
    classes: tuple[type, ...]


@jax.tree_util.register_pytree_node_class
class PackedMetrics:
    """A dict of metrics as a pytree whose only leaves are its `buffers`, one per dtype."""

    __slots__ = ("_buffers", "_layout")

    def __init__(self, buffers: Sequence[Any], layout: _Layout) -> None:
        """Internal: use `PackedMetrics.pack`."""
        self._buffers = tuple(buffers)
        self._layout = layout

    def tree_flatten(self) -> tuple[tuple[Any, ...], _Layout]:
        return self._buffers, self._layout

    @classmethod
    def tree_unflatten(cls, layout: _Layout, buffers: Sequence[Any]) -> "PackedMetrics":
        # No checks: JAX unflattens with placeholders (None, shape structs, tracers).
        return cls(buffers, layout)

    @classmethod
    def pack(cls, metrics: Mapping[str, Any]) -> "PackedMetrics":
        """Packs a dict of str -> clu Metric (or `Collection`), in or outside `jax.jit`.

        Args:
            metrics: metrics whose leaves are arrays or scalars (`None` fields stay None).

        Returns:
            A `PackedMetrics` with one buffer per leaf dtype, in order of first appearance.

        Raises:
            TypeError: not a mapping of str -> metric, or a leaf is not an array or scalar.

        Example:
            >>> from metrics_manager.metrics import AveragePerStep
            >>> packed = PackedMetrics.pack({"loss": AveragePerStep(total=6.0, steps=2)})
            >>> packed.keys(), [(b.dtype.name, b.shape) for b in packed.buffers]
            (['loss'], [('int32', (1,)), ('float32', (1,))])
        """
        problems = Problems("PackedMetrics.pack")
        _check_dict(metrics, "metrics", problems)
        problems.raise_if_any()
        paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(dict(metrics))
        parts: dict[np.dtype, list[jax.Array]] = {}  # flat leaves, in order of appearance
        sizes: dict[np.dtype, int] = {}
        leaves = []
        for path, leaf in paths_leaves:
            try:
                array = jnp.asarray(leaf)
            except TypeError as err:
                problems.type_problem(
                    f"{jax.tree_util.keystr(path)}: expected an array or scalar leaf, got "
                    f"{describe(leaf)} ({err})"
                )
                continue
            aval = jax.typeof(array)
            dtype, shape = np.dtype(aval.dtype), tuple(aval.shape)
            start = sizes.get(dtype, 0)
            sizes[dtype] = start + math.prod(shape)
            leaves.append((list(sizes).index(dtype), start, sizes[dtype], shape, aval.weak_type))
            if any(axis is not None for axis in getattr(aval.sharding, "spec", ())):
                # Explicitly sharded leaves are gathered, so they can be concatenated (on their
                # own mesh: a bare PartitionSpec needs a `jax.set_mesh` context around the step).
                replicated = jax.sharding.NamedSharding(aval.sharding.mesh, jax.P())
                array = jax.sharding.reshard(array, replicated)
            # Strongly typed in the buffer; weak types come back in unpack().
            flat = jax.lax.convert_element_type(array, aval.dtype).reshape(-1)
            parts.setdefault(dtype, []).append(flat)
        problems.raise_if_any()
        buffers = [p[0] if len(p) == 1 else jnp.concatenate(p) for p in parts.values()]
        specs = tuple((dtype, (size,)) for dtype, size in sizes.items())
        keys = tuple(sorted(metrics))
        classes = tuple(type(metrics[k]) for k in keys)
        return cls(buffers, _Layout(treedef, tuple(leaves), specs, keys, classes))

    @property
    def buffers(self) -> tuple[Any, ...]:
        """The flat buffers, one per dtype: what to copy to the host for `unpack_host`."""
        return self._buffers

    def keys(self) -> list[str]:
        """The metric names, sorted (the order of `unpack()`: JAX flattens dicts by key)."""
        return list(self._layout.keys)

    # Read like the dict it packs (`running["loss"]`, `dict(running)`), each read one unpack.
    def __getitem__(self, key: str) -> Any:
        if key not in self._layout.keys:
            raise KeyError(f"{key!r}: not a metric of this PackedMetrics (keys {self.keys()})")
        return self.unpack()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._layout.keys)

    def __len__(self) -> int:
        return len(self._layout.keys)

    def __contains__(self, key: object) -> bool:
        return key in self._layout.keys

    def get(self, key: str, default: Any = None) -> Any:
        """The metric under `key`, or `default` when there is none, as `dict.get`."""
        return self[key] if key in self._layout.keys else default

    def items(self) -> ItemsView[str, Any]:
        return self.unpack().items()

    def values(self) -> ValuesView[Any]:
        return self.unpack().values()

    def unpack(self) -> dict[str, Any]:
        """The dict of metrics, on the device (one dispatch outside jit), weak types kept.

        Example:
            >>> from metrics_manager.metrics import Step
            >>> PackedMetrics.pack({"steps": Step()}).unpack()["steps"].steps.weak_type
            True
        """
        return _unpack_jitted(self)

    def abstract(self) -> dict[str, Any]:
        """The dict of metrics with `jax.ShapeDtypeStruct` leaves, from the static layout
        alone (no device work): what the manager checks at the call."""
        specs = self._layout.specs
        leaves = [
            jax.ShapeDtypeStruct(shape, specs[buffer][0], weak_type=weak_type)
            for buffer, _, _, shape, weak_type in self._layout.leaves
        ]
        return jax.tree.unflatten(self._layout.treedef, leaves)

    def mapped_axis_problem(self) -> str | None:
        """Why the buffers are no single window (a leading axis from `jax.vmap` or `jax.pmap`),
        or None. Reads static shapes only: no device work."""
        wrong = [
            f"buffer {i} ({dtype}) has shape {np.shape(buffer)}, expected {spec}"
            for i, (buffer, (dtype, spec)) in enumerate(
                zip(self._buffers, self._layout.specs, strict=True)
            )
            if np.shape(buffer) != spec
        ]
        if not wrong:
            return None
        return (
            f"PackedMetrics: {'; '.join(wrong)}. A PackedMetrics returned by jax.vmap or "
            "jax.pmap has the mapped axis in front (a window per member or device), one of a "
            "shard_map with out_specs=P(axis) the devices' buffers end to end: merge them "
            "with metrics_manager.merge_windows(packed), or take one with "
            "jax.tree.map(lambda b: b[i], packed)."
        )

    def _unpack_traced(self) -> dict[str, Any]:
        if problem := self.mapped_axis_problem():  # static: checked once per trace
            raise ValueError(problem)
        leaves = []
        for buffer, start, stop, shape, weak_type in self._layout.leaves:
            value = self._buffers[buffer][start:stop].reshape(shape)
            if weak_type:
                # Rebuilds the weak type of a Python scalar field (Step.steps=1), which jax
                # has no public API for, so merges promote exactly as without packing.
                value = _lax_internal._convert_element_type(value, value.dtype, weak_type=True)
            leaves.append(value)
        return jax.tree.unflatten(self._layout.treedef, leaves)

    def unpack_host(self, host_buffers: Sequence[Any]) -> dict[str, Any]:
        """Rebuilds the dict of metrics from host copies of `buffers`, without device work.

        Args:
            host_buffers: numpy arrays in `buffers` order, e.g. `jax.device_get(packed.buffers)`.

        Returns:
            A dict of str -> metric whose leaves are views of `host_buffers`.

        Raises:
            TypeError: not a sequence, or a buffer's dtype differs from the packed one.
            ValueError: the number of buffers or a buffer's shape differs.

        Example:
            >>> import numpy as np
            >>> from metrics_manager.metrics import Sum
            >>> packed = PackedMetrics.pack({"n": Sum(np.float32(2.0))})
            >>> packed.unpack_host([np.array([5.0], np.float32)])["n"].compute()
            array(5., dtype=float32)
        """
        layout = self._layout
        if not isinstance(host_buffers, Sequence) or isinstance(host_buffers, str | bytes):
            raise TypeError(
                "PackedMetrics.unpack_host: expected a sequence of numpy arrays (one per "
                f"buffer, e.g. jax.device_get(packed.buffers)), got {describe(host_buffers)}"
            )
        arrays = [np.asarray(b) for b in host_buffers]
        if tuple((a.dtype, a.shape) for a in arrays) != layout.specs:  # messages only on a mismatch
            problems = Problems()
            if len(arrays) != len(layout.specs):
                names = [d.name for d, _ in layout.specs]
                problems.value_problem(
                    f"expected {len(names)} buffers (dtypes {names}), got "
                    f"{len(arrays)}; pass jax.device_get(packed.buffers) of this PackedMetrics"
                )
            for i, (a, (d, shape)) in enumerate(zip(arrays, layout.specs, strict=False)):
                if a.dtype.name != d.name:
                    problems.type_problem(f"buffer {i}: expected dtype {d}, got {a.dtype}")
                if a.shape != shape:
                    problems.value_problem(f"buffer {i}: expected shape {shape}, got {a.shape}")
            problems.raise_if_any("PackedMetrics.unpack_host")
        leaves = [arrays[b][i:j].reshape(shape) for b, i, j, shape, _ in layout.leaves]
        return jax.tree.unflatten(layout.treedef, leaves)

    def host_plan(self) -> HostPlan | None:
        """How the manager computes these metrics' values on the host as vectors, or None
        where it computes them one by one (`HostPlan`); made once per layout."""
        layout = self._layout
        cached = _HOST_PLANS.get(id(layout))
        if cached is None or cached[0] is not layout:
            if len(_HOST_PLANS) >= 64:  # layouts a process makes are few; a bound all the same
                _HOST_PLANS.clear()
            plan = HostPlan.build(layout.treedef, layout.leaves, layout.classes, layout.specs)
            cached = _HOST_PLANS[id(layout)] = (layout, plan)
        return cached[1]

    def __repr__(self) -> str:
        buffers = ", ".join(f"{dtype.name}[{size}]" for dtype, (size,) in self._layout.specs)
        return f"PackedMetrics(keys={self.keys()}, buffers=({buffers}))"


_unpack_jitted = jax.jit(PackedMetrics._unpack_traced)
# id(layout) -> (layout, its plan): a jitted step returns the same layout object every call.
_HOST_PLANS: dict[int, tuple[_Layout, HostPlan | None]] = {}
