"""Merging dicts of metrics on the device: across train steps and across microbatches.

The train step merges the loss function's `{name: metric}` into the running accumulator inside
the compiled step, so there is no per-metric host work or device-to-host copy between summaries
(T5X merged on the host after every step).

Each summary window starts from `running=None`, not from `empty()`: jit compiles a second
variant in which `merge_metrics(None, metrics)` is `metrics` (packed: one buffer per dtype),
whereas `empty()` cannot know the shape of an array-valued metric (metrax's `AUCROC`, a `Sum`
of a vector), and the buffers handed to the summary are never donated again::

    for step in range(start, end):
        state, running = train_step(state, running, next(batches))  # see merge_metrics's example
        if (step + 1 - start) % period == 0:
            manager.write_metrics_summary(running, step + 1, num_steps=period)
            running = None  # the summary owns those buffers now

`accumulate_grads_microbatched` merges microbatches with CLU's `_reduce_merge` (the merge for
parts of one batch: `LastValue` averages, a `Step` counts one step), starting from the first
microbatch's metrics, so values do not depend on the number of microbatches, but for a
`LastValue` (the mean of its microbatches' values: a sum per microbatch reads 1/n of the step's)
and for sums CLU takes in a low-precision dtype within each microbatch (a bfloat16 `Average`).
"""

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import clu.metrics as clu_metrics
import jax
import jax.numpy as jnp
import numpy as np

from metrics_manager.metrics import (
    collection_fields,
    explicit_mesh,
    is_metric_obj,
    is_time_metric,
)
from metrics_manager.packing import PackedMetrics, _check_dict
from writers._checks import Problems, describe

__all__ = ["accumulate_grads_microbatched", "merge_metrics", "merge_windows", "validate_metrics"]

Metrics = Mapping[str, Any]


def _check_alike(
    expected: Metrics, got: Metrics, expected_what: str, got_what: str, problems: Problems
) -> None:
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    if missing or extra:
        problems.value_problem(
            f"keys differ: expected the keys of {expected_what} {sorted(map(str, expected))}, "
            f"{got_what} lacks {sorted(map(str, missing))} and adds {sorted(map(str, extra))}; "
            "return the same keys from every step and microbatch (for a value a step lacks, "
            "the metric of a mask that is all False)"
        )
    for key in (k for k in expected if k in got):
        a, b = expected[key], got[key]
        if not (is_metric_obj(a) and is_metric_obj(b)):
            continue
        if type(a) is not type(b):
            problems.type_problem(
                f"[{key!r}]: expected {type(a).__qualname__} (as in {expected_what}), got "
                f"{type(b).__qualname__} in {got_what}; keep one metric type per key"
            )
            continue
        leaves_a, tree_a = jax.tree_util.tree_flatten_with_path(a)
        leaves_b, tree_b = jax.tree_util.tree_flatten_with_path(b)
        if tree_a != tree_b:  # type: ignore[operator]
            if settings := _settings_differ(a, b):
                problems.value_problem(
                    f"[{key!r}] ({type(a).__qualname__}): settings differ: {settings} "
                    f"({expected_what} vs {got_what}); give every step and microbatch the same"
                )
                continue
            why = (
                "a Time metric's duration is set on the host only after merging"
                if is_time_metric(a)
                else "settings such as average, k, beta or num_bins must be the same"
            )
            problems.value_problem(
                f"[{key!r}] ({type(a).__qualname__}): pytree structure differs: {expected_what} "
                f"has {tree_a}, {got_what} has {tree_b} ({why})"
            )
            continue
        for (path, leaf_a), (_, leaf_b) in zip(leaves_a, leaves_b, strict=True):
            shape_a, shape_b = np.shape(leaf_a), np.shape(leaf_b)
            if shape_a != shape_b:
                problems.value_problem(
                    f"[{key!r}] ({type(a).__qualname__}) field "
                    f"{jax.tree_util.keystr(path, simple=True, separator='.')}: shape mismatch, "
                    f"expected {shape_a} (as in {expected_what}), got {shape_b} in {got_what}; "
                    "a metric must have the same shape in every step and microbatch"
                )


def _settings_differ(a: Any, b: Any) -> str:
    """`k=1 vs 3` for the static (non-pytree) dataclass fields of `a` and `b` that differ."""
    if not dataclasses.is_dataclass(a):
        return ""
    static = [f.name for f in dataclasses.fields(a) if not f.metadata.get("pytree_node", True)]
    return ", ".join(
        f"{name}={getattr(a, name)!r} vs {getattr(b, name)!r}"
        for name in static
        if getattr(a, name) != getattr(b, name)
    )


def validate_metrics(
    metrics: Any,
    reference: Metrics | None = None,
    *,
    what: str = "metrics",
    reference_what: str = "the running metrics",
) -> dict[str, Any]:
    """Checks a dict of metrics (and that it matches `reference`), reporting every problem.

    Looks only at Python types, keys and shapes, so inside `jax.jit` it runs at trace time.

    Args:
        metrics: a mapping of str -> clu `Metric` (or `Collection`).
        reference: if given, `metrics` must have its keys and, per key, its metric type,
            pytree structure and leaf shapes.
        what, reference_what: how `metrics` and `reference` are named in error messages.

    Returns:
        `metrics` as a new dict.

    Raises:
        TypeError: not a mapping, a non-str key, a non-metric value, or a metric type that
            differs from `reference` (the message lists every problem found).
        ValueError: keys, structures or shapes differ from `reference`.

    Example:
        >>> import jax.numpy as jnp
        >>> validate_metrics({"loss": jnp.ones(())})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: validate_metrics: metrics['loss']: expected a clu.metrics.Metric (or Collection), got ArrayImpl of shape () and dtype float32; wrap the value in a metric, ...
    """
    problems = Problems()
    if _check_dict(metrics, what, problems) and reference is not None:
        _check_alike(reference, metrics, reference_what, what, problems)
    problems.raise_if_any("validate_metrics")
    return dict(metrics)


def merge_metrics(
    a: Metrics | PackedMetrics | None,
    b: Metrics | PackedMetrics,
    *,
    pack: bool | None = None,
    _pieces: bool = False,
) -> dict[str, Any] | PackedMetrics:
    """Merges two dicts of metrics key by key (`a[k].merge(b[k])`), in or outside `jax.jit`.

    Both are checked completely (at trace time under jit) before anything is merged.

    Args:
        a: the running metrics: a dict, a `PackedMetrics`, or None to start a new window.
        b: the new metrics (dict or `PackedMetrics`): same keys, types and shapes as `a`.
            A CLU `Collection` counts as the dict of its metrics, as `write_metrics_summary`
            reads it.
        pack: True returns a `PackedMetrics`, False a dict. None (the default) packs when `a`
            is packed, or is None while `b` is traced (a window's first step inside `jax.jit`,
            where packing costs nothing and saves one output buffer per metric leaf): so a
            jitted loop carries its window packed and an eager merge stays a dict.

    Returns:
        The merged metrics in `a`'s key order (`b` when `a` is None): a dict, or a
        `PackedMetrics`, which reads like one (`running["loss"]`).

    Raises:
        TypeError, ValueError: as `validate_metrics` (`b` checked against `a`); TypeError for
            a `pack` that is not a bool or None.

    Example:
        >>> import functools, jax, jax.numpy as jnp
        >>> from metrics_manager.metrics import AveragePerStep, Max
        >>> @functools.partial(jax.jit, donate_argnums=0)
        ... def train_step(running, loss):  # a real step also updates the parameters
        ...     metrics = {"loss": AveragePerStep.from_model_output(loss),
        ...                "loss_max": Max.from_model_output(loss)}
        ...     return merge_metrics(running, metrics)
        >>> running = None  # a summary window starts from None
        >>> for loss in (1.0, 16.0, 4.0):
        ...     running = train_step(running, jnp.float32(loss))
        >>> [b.dtype.name for b in running.buffers]  # packed: 3 leaves in 2 buffers
        ['int32', 'float32']
        >>> {name: float(metric.compute()) for name, metric in running.items()}
        {'loss': 7.0, 'loss_max': 16.0}
    """
    if pack is None:
        pack = isinstance(a, PackedMetrics) or (
            a is None and any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(b))
        )
    elif not isinstance(pack, bool):
        raise TypeError(f"merge_metrics: pack must be a bool or None, got {describe(pack)}")
    layout, a, b = None, collection_fields(a), collection_fields(b)
    if isinstance(a, PackedMetrics):
        layout, a = a._layout, a.unpack()
    if isinstance(b, PackedMetrics):
        b = b.unpack()
    problems = Problems()
    a_is_dict = a is None or _check_dict(a, "a", problems)
    if _check_dict(b, "b", problems) and a is not None and a_is_dict:
        if not a and b:  # an empty accumulator, as a T5X loop may start from
            problems.value_problem(
                f"a holds no metrics, b holds {sorted(map(str, b))}; start each window from "
                "None, not {}: merge_metrics(None, b) returns b's metrics"
            )
        else:
            _check_alike(a, b, "a", "b", problems)
    problems.raise_if_any("merge_metrics")
    b = _wide_floats(b)
    if a is None:
        merged = b
    else:
        merged = {
            key: _merged(key, metric, b[key], _pieces) for key, metric in _wide_floats(a).items()
        }
    if not pack:
        return merged
    packed = PackedMetrics.pack(merged)
    if packed._layout == layout:
        # `a`'s own layout object: jit compares each call's argument layouts with the cached
        # ones, and the same object compares at once (5 us less per step of 20 metrics).
        packed = PackedMetrics(packed.buffers, layout)
    return packed


def merge_windows(metrics: Metrics | PackedMetrics) -> Metrics | PackedMetrics:
    """Merges windows stacked along the leading axis of every field into one: what a
    `jax.pmap` step (a window per device), a `shard_map` with `out_specs=P(axis)` or a
    `jax.vmap` (a window per member) returns.

    The windows are pieces of the same steps, merged as CLU's `reduce()` merges them (each
    metric's `_reduce_merge`: a `Step` counts the steps once, not once per device, and a
    `LastValue` averages the devices'), right for every metric (`Max`, `MeanStd` too), unlike
    a `lax.psum` of the fields; and, unlike `reduce()`, for metrics without array fields
    (`Time`) and a `PackedMetrics`.

    Args:
        metrics: a dict of metrics or a `PackedMetrics` whose every array has `n` windows in
            its leading axis.

    Returns:
        The merged window, of the same kind (a dict or a `PackedMetrics`).

    Raises:
        ValueError: the arrays do not share one leading axis.

    Example:
        >>> import jax.numpy as jnp
        >>> from metrics_manager.metrics import Max, Sum
        >>> per_device = {"n": Sum(jnp.array([1.0, 3.0])), "top": Max(jnp.array([1.0, 3.0]))}
        >>> {k: float(m.compute()) for k, m in merge_windows(per_device).items()}
        {'n': 4.0, 'top': 3.0}
    """
    metrics = collection_fields(metrics)
    if not isinstance(metrics, Mapping | PackedMetrics) or not metrics:
        raise TypeError(
            f"merge_windows: metrics must be a non-empty dict of CLU metrics (or a "
            f"PackedMetrics, a CLU Collection) stacked over windows, got {describe(metrics)}; "
            "pass what the pmap/vmap step returned"
        )
    if isinstance(metrics, PackedMetrics) and (n := _concatenated_windows(metrics)):
        # A shard_map with out_specs=P(axis) around merge_metrics' packing (its default
        # inside jit) concatenates each device's flat buffers: n windows of [size] each.
        return _merge_windows(metrics, n, True)
    if isinstance(metrics, PackedMetrics) and metrics.mapped_axis_problem() is None:
        # Packed from windows the step stacked itself (a shard_map with out_specs=P(axis),
        # merge_metrics' default pack=True): merged from its metrics, then packed again.
        unpacked = metrics.unpack()
        rows = {np.shape(x)[0] if np.ndim(x) else 0 for x in jax.tree.leaves(unpacked)}
        if len(rows) == 1 and 0 not in rows:
            return PackedMetrics.pack(_merge_windows(unpacked, rows.pop()))
        raise ValueError(  # unpacking it said "merge them with merge_windows(packed)"
            "merge_windows: this PackedMetrics holds one window (its buffers have the shapes "
            "it was packed with, no leading axis of windows); write it as it is"
        )
    leaves = jax.tree.leaves(metrics)
    rows = {np.shape(x)[0] if np.ndim(x) else 0 for x in leaves}
    if len(rows) != 1 or 0 in rows:
        raise ValueError(
            f"merge_windows: every array must hold the windows in its leading axis, got "
            f"leading sizes {sorted(rows)} (0: a scalar); pass what the pmap/vmap step returned"
        )
    return _merge_windows(metrics, rows.pop())


def _concatenated_windows(packed: PackedMetrics) -> int:
    """n > 1 if every buffer holds n packed windows end to end ([n * size]), else 0."""
    counts = {
        np.shape(buffer)[0] // size
        if np.ndim(buffer) == 1 and np.shape(buffer)[0] % size == 0
        else 0
        for buffer, (_, (size,)) in zip(packed.buffers, packed._layout.specs, strict=True)
        if size  # an empty buffer fits any n
    }
    return n if len(counts) == 1 and (n := counts.pop()) > 1 else 0


@functools.partial(jax.jit, static_argnums=(1, 2))
def _merge_windows(metrics: Any, n: int, concatenated: bool = False) -> Any:
    pack = isinstance(metrics, PackedMetrics)
    # Windows sharded over a mesh of explicit axes (jax.make_mesh's default) cannot be
    # sliced one by one: gather them first (n small windows; Auto axes need nothing).
    metrics = jax.tree.map(_replicated_if_explicit, metrics)
    if concatenated:
        metrics = jax.tree.map(lambda buffer: buffer.reshape(n, buffer.size // n), metrics)
    merged = None
    for i in range(n):
        window = jax.tree.map(lambda x, i=i: x[i], metrics)
        merged = merge_metrics(merged, window, pack=pack, _pieces=True)
    return merged


def _merged(key: str, a: Any, b: Any, pieces: bool = False) -> Any:
    try:
        return a._reduce_merge(b) if pieces else a.merge(b)
    except NotImplementedError as err:  # CLU's base Metric.merge: metrax's FBetaScore
        raise TypeError(
            f"merge_metrics: [{key!r}] ({type(a).__qualname__}) cannot merge ({err}), so it "
            "cannot be summed over steps or microbatches; use a metric that merges (for "
            "metrax's FBetaScore, metrics_manager.FBeta), or write its per-batch value with "
            "write_scalars"
        ) from err


def _replicated_if_explicit(x: Any) -> Any:
    if (mesh := explicit_mesh(x)) is None:
        return x
    return jax.sharding.reshard(x, jax.sharding.NamedSharding(mesh, jax.P()))


def _wide_floats(metrics: Metrics) -> dict[str, Any]:
    """`metrics` with sub-32-bit float leaves as float32 (exact): a window summed in bfloat16
    stops growing (a CLU `Average` of 1,000 bfloat16 steps of 2.03 read 1.02)."""
    leaves, tree = jax.tree.flatten(metrics)
    if not any(map(_low_float, leaves)):  # the common case: nothing to rebuild
        return dict(metrics)
    wide = jax.tree.unflatten(
        tree, [jnp.asarray(x, jnp.float32) if _low_float(x) else x for x in leaves]
    )
    return {key: wide[key] for key in metrics}  # unflatten sorts a dict's keys


def _low_float(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)  # itemsize first: most leaves are 4-byte (fast)
    return dtype is not None and dtype.itemsize < 4 and jnp.issubdtype(dtype, jnp.floating)


def _merge_pieces(a: Any, b: Any) -> Any:
    if isinstance(a, clu_metrics.Collection):
        return type(a)(**{name: _merge_pieces(m, getattr(b, name)) for name, m in vars(a).items()})
    return a._reduce_merge(b)


def _split_batch(batch: Any, num_microbatches: int) -> Any:
    """[B, ...] -> [n, B / n, ...], strided: a batch sharded on axis 0 splits in place."""
    problems = Problems()
    rows: dict[int, str] = {}  # leading dimension -> the first leaf with it
    for path, leaf in jax.tree_util.tree_flatten_with_path(batch)[0]:
        shape = np.shape(leaf)
        if not shape or shape[0] % num_microbatches:
            problems.value_problem(
                f"batch{jax.tree_util.keystr(path)} has shape {shape}: expected a leading batch "
                f"dimension divisible by num_microbatches={num_microbatches}; pad the batch or "
                "choose a num_microbatches that divides the batch size"
            )
        else:
            rows.setdefault(shape[0], f"batch{jax.tree_util.keystr(path)}")
    if len(rows) > 1:
        listed = ", ".join(f"{name} has {n}" for n, name in rows.items())
        problems.value_problem(
            f"the batch's leaves differ in their leading (batch) dimension: {listed} rows; "
            "every leaf must hold one row per example, else a microbatch pairs rows of "
            "different examples"
        )
    problems.raise_if_any("accumulate_grads_microbatched")

    def split(x: Any) -> jax.Array:
        x = jnp.asarray(x)
        rows = x.shape[0] // num_microbatches
        new_shape = (rows, num_microbatches) + x.shape[1:]
        sharding = jax.typeof(x).sharding
        # Explicitly sharded axes (jax.set_mesh with AxisType.Explicit) are part of the type,
        # and JAX asks where a reshaped sharded dimension goes. Auto axes are not listed.
        spec = tuple(sharding.spec) + (None,) * (x.ndim - len(sharding.spec))
        axes = (spec[0],) if isinstance(spec[0], str) else spec[0]
        if spec[0] is None:
            x = x.reshape(new_shape)
        elif rows % math.prod(sharding.mesh.shape[a] for a in axes) == 0:
            # Each shard's rows split into whole groups of n: no data moves.
            x = jax.lax.reshape(x, new_shape, out_sharding=jax.P(spec[0], None, *spec[1:]))
        else:
            # Too few rows per microbatch to keep the batch axis sharded: gather it.
            x = jax.sharding.reshard(x, jax.P(None, *spec[1:]))
            x = x.reshape(new_shape)
        return jnp.swapaxes(x, 0, 1)

    return jax.tree.map(split, batch)


_T5X_CALL = (
    " (a T5X model: this takes accumulate_grads_microbatched(loss_fn, train_state.params, "
    "batch, num_microbatches, rng=dropout_rng), loss_fn(params, microbatch, rng) returning "
    "(loss, metrics))"
)


def accumulate_grads_microbatched(
    loss_fn: Callable[..., tuple[Any, Metrics]],
    params: Any,
    batch: Any,
    num_microbatches: int | None,
    *,
    rng: jax.Array | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Gradients of the summed loss and merged metrics over `num_microbatches` microbatches.

    Call it inside the jitted train step. Microbatch i holds rows `i, i + n, i + 2n, ...`.

    Args:
        loss_fn: `loss_fn(params, microbatch) -> (loss, metrics)` (a dict, or a CLU
            `Collection`, which counts as the dict of its metrics), or with a third argument
            `jax.random.fold_in(rng, i)` when `rng` is given. Return sums (not means over the
            microbatch) for values that do not depend on `num_microbatches` (a `LastValue`
            averages its microbatches' values: return it as a mean).
        params: the pytree to differentiate with respect to.
        batch: a pytree of arrays split along axis 0 (divisible by `num_microbatches`).
        num_microbatches: None or 1 calls `loss_fn` once on the whole batch.
        rng: optional PRNG key, folded with the microbatch index.

    Returns:
        `(grads, metrics)`: the gradient of the summed loss and the merged metrics.

    Raises:
        TypeError: `num_microbatches` is not an int, or the metrics are not clu Metrics.
        ValueError: `num_microbatches` < 1, or a batch leaf is not divisible by it.

    Example:
        >>> import jax.numpy as jnp
        >>> from metrics_manager.metrics import Min
        >>> def loss_fn(w, batch):
        ...     err = batch * w
        ...     return err.sum(), {"min": Min.from_model_output(err)}
        >>> grads, metrics = accumulate_grads_microbatched(
        ...     loss_fn, jnp.float32(2.0), jnp.arange(1.0, 9.0), num_microbatches=4)
        >>> float(grads), float(metrics["min"].compute())
        (36.0, 2.0)
    """
    if num_microbatches is None:
        num_microbatches = 1
    problems = Problems("accumulate_grads_microbatched")
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int | np.integer):
        got = describe(num_microbatches)
        problems.type_problem(f"num_microbatches must be an int or None, got {got}")
    elif num_microbatches < 1:
        problems.value_problem(f"num_microbatches must be >= 1 (or None), got {num_microbatches}")
    arguments = ("params", "microbatch") + (() if rng is None else ("rng",))
    try:  # Python's own error named neither rng= nor the fix
        signature = inspect.signature(loss_fn)
        signature.bind(*arguments)
    except TypeError:
        problems.type_problem(
            f"loss_fn must be callable, got {describe(loss_fn)}"
            + (_T5X_CALL if callable(getattr(loss_fn, "loss_fn", None)) else "")
            if not callable(loss_fn)
            else f"loss_fn is called as loss_fn({', '.join(arguments)}) "
            + ("(no rng= was given)" if rng is None else "since rng= was given")
            + f", but it takes {signature}"
        )
    except ValueError:
        pass  # no signature to read (a builtin): the call will say
    problems.raise_if_any()
    num_microbatches = int(num_microbatches)

    def grads_and_metrics(microbatch: Any, index: Any, first: Any = None) -> tuple[Any, Any]:
        extra = () if rng is None else (jax.random.fold_in(rng, index),)

        def loss(p: Any) -> Any:
            out = loss_fn(p, microbatch, *extra)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError(
                    "accumulate_grads_microbatched: loss_fn must return a pair (loss, metrics), "
                    f"got {describe(out)}; return the scalar loss and a dict of metrics"
                )
            aux = out[1]
            metrics_types = (Mapping, clu_metrics.Collection)
            if isinstance(aux, tuple) and len(aux) == 2 and isinstance(aux[1], metrics_types):
                raise TypeError(
                    "accumulate_grads_microbatched: loss_fn must return (loss, metrics), got "
                    "(loss, (weight_sum, metrics)) as T5X's model.loss_fn returns it; wrap it: "
                    "def loss_fn(params, batch, rng): loss, (_, metrics) = "
                    "model.loss_fn(params, batch, rng); return loss, metrics"
                )
            shape, dtype = jnp.shape(out[0]), jnp.result_type(out[0])
            if shape != () or not jnp.issubdtype(dtype, jnp.floating):
                raise TypeError(
                    "accumulate_grads_microbatched: loss_fn's loss must be a float scalar to "
                    f"differentiate, got shape {shape} and dtype {dtype}; return the sum of "
                    "the per-example losses (loss.sum()) as a float"
                )
            return out

        (_, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params)
        what, first_what = "the metrics returned by loss_fn", "the first microbatch's metrics"
        metrics = collection_fields(metrics)
        metrics = validate_metrics(metrics, first, what=what, reference_what=first_what)
        return grads, _wide_floats(metrics)

    if num_microbatches == 1:
        return grads_and_metrics(batch, 0)

    microbatches = _split_batch(batch, num_microbatches)
    # Microbatch 0 starts the carry (no zeros, no `empty()`): one loss and one merge compiled.
    grads, metrics = grads_and_metrics(jax.tree.map(lambda x: x[0], microbatches), 0)
    merge = functools.partial(jax.tree.map, _merge_pieces, is_leaf=is_metric_obj)
    # A scan carry keeps its type. If a merge promotes a leaf (an int32 field averaged into
    # float32), start the carry with the merged dtype, as merging outside a scan would.
    merged_type = jax.eval_shape(merge, metrics, metrics)
    metrics = jax.tree.map(_astype_like, metrics, merged_type)

    def body(carry: tuple[Any, Any], index: jax.Array) -> tuple[tuple[Any, Any], None]:
        grad_sum, running = carry
        microbatch = jax.tree.map(lambda x: x[index], microbatches)
        grads, new = grads_and_metrics(microbatch, index, running)
        merged = jax.tree.map(_astype_like, merge(running, new), running)
        return (jax.tree.map(jnp.add, grad_sum, grads), merged), None

    indices = jnp.arange(1, num_microbatches, dtype=jnp.int32)
    return jax.lax.scan(body, (grads, metrics), indices)[0]


def _astype_like(value: Any, like: Any) -> Any:
    dtype = like.dtype if isinstance(like, jax.ShapeDtypeStruct) else jax.typeof(like).dtype
    return value if jax.typeof(value).dtype == dtype else jnp.asarray(value, dtype)
