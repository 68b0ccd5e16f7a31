"""One process of the multi-process test (tests/test_multiprocess.py); also the 1-process run.

Usage: python -m tests.multiprocess_worker PROCESS_ID NUM_PROCESSES PORT DEVICES OUT_DIR

Each process fakes DEVICES CPU devices; with NUM_PROCESSES > 1 they join one
`jax.distributed` cluster with gloo CPU collectives. The global batch (the same
in every run) is sharded over all devices of all processes on axis 0, each
process supplying its own rows (`jax.make_array_from_process_local_data`). The
train step is the README's language-model loop: `with_loss_normalization`,
`accumulate_grads_microbatched` with `compute_loss_and_metrics` (T5X's base
metrics) and `merge_metrics`. A `MetricsManager` in every process writes to
`OUT_DIR/p<PROCESS_ID>`; the summaries its futures return go to
`OUT_DIR/result<PROCESS_ID>.json`.

Host-local values: each process measures its own `input_seconds` (here
1 + PROCESS_ID, to tell them apart); the loop gathers them from all processes
(`multihost_utils.process_allgather`) and writes one key per process,
`input_seconds/process<i>`, because the manager writes from process 0 only.
`host_value`, written as it is with `write_scalar`, shows what happens without
that: process 0's value alone reaches the files. The last batch's target tokens, a global
array sharded over the processes, are refused by `write_histograms` and as a raw tensor
beside the metrics (in every process), and written once gathered.
"""

from __future__ import annotations

import functools
import json
import os
import sys

STEPS, SUMMARY_EVERY, NUM_MICROBATCHES = 4, 2, 2
ROWS, LENGTH, VOCAB, WIDTH = 16, 8, 11, 6
# `*_per_core` divide by the devices of the step; every run reports for 4 devices.
NUM_DEVICES = 4


def make_batch():
    """The global batch: padded target sequences, the same in every run."""
    import numpy as np

    rng = np.random.default_rng(0)
    targets = rng.integers(1, VOCAB, size=(STEPS, ROWS, LENGTH)).astype(np.int32)
    lengths = rng.integers(2, LENGTH + 1, size=(STEPS, ROWS))
    targets[np.arange(LENGTH)[None, None, :] >= lengths[..., None]] = 0  # padding
    inputs = np.concatenate([np.zeros_like(targets[..., :1]), targets[..., :-1]], axis=-1)
    return {"decoder_target_tokens": targets, "decoder_input_tokens": inputs}


def main(process_id: int, num_processes: int, port: int, devices: int, out_dir: str) -> None:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    if num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{port}",
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=60,
        )
    import clu.metrics
    import clu.values
    import flax
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from metrics_manager import (
        MetricsManager,
        accumulate_grads_microbatched,
        compute_loss_and_metrics,
        merge_metrics,
        with_loss_normalization,
    )

    @flax.struct.dataclass
    class RowMean(clu.metrics.Metric):  # per-row values kept, their mean computed
        rows: jax.Array

        def compute(self) -> jax.Array:
            return self.rows.mean()

    mesh = Mesh(np.array(jax.devices()), ("data",))
    data, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    rng = np.random.default_rng(1)
    params = jax.device_put(
        {
            "embed": rng.standard_normal((VOCAB, WIDTH)).astype(np.float32),
            "out": rng.standard_normal((WIDTH, VOCAB)).astype(np.float32),
        },
        replicated,
    )

    def loss_fn(params, microbatch):
        logits = params["embed"][microbatch["decoder_input_tokens"]] @ params["out"]
        return compute_loss_and_metrics(logits, microbatch, z_loss=1e-4, num_devices=NUM_DEVICES)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, running, batch):
        batch = with_loss_normalization(batch, "NUM_REAL_TARGET_TOKENS")
        grads, metrics = accumulate_grads_microbatched(loss_fn, params, batch, NUM_MICROBATCHES)
        params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
        return params, merge_metrics(running, metrics)

    batches = make_batch()
    rows_per_process = ROWS // num_processes
    mine = slice(process_id * rows_per_process, (process_id + 1) * rows_per_process)
    summaries = {}
    futures = []
    with MetricsManager("train", os.path.join(out_dir, f"p{process_id}")) as manager:
        # Refused when the manager is made, on every process alike (process 1 took them, then
        # waited in its next collective for process 0, which had stopped).
        constructions = {
            "same directory": lambda: MetricsManager("train", os.path.dirname(manager.summary_dir)),
            "resume_step": lambda: MetricsManager(
                "eval", None, resume_step=3, writer_factory=lambda logdir: None
            ),
        }
        refused_made = {}
        for what, make in constructions.items():
            try:
                make().close()
                refused_made[what] = ""
            except (TypeError, ValueError) as err:
                refused_made[what] = f"{type(err).__name__}: {err}".split(";")[0]
        running = None
        manager.start_duration_timer(block_on=params)
        for step in range(1, STEPS + 1):
            local = {k: v[step - 1, mine] for k, v in batches.items()}
            batch = jax.tree.map(lambda x: jax.make_array_from_process_local_data(data, x), local)
            params, running = train_step(params, running, batch)
            if step % SUMMARY_EVERY == 0:
                futures.append((step, manager.write_metrics_summary(running, step, SUMMARY_EVERY)))
                running = None
                manager.start_duration_timer(block_on=params)
        # Host-local values: gathered and written per process, or (host_value) process 0's only.
        input_seconds = 1.0 + process_id
        gathered = multihost_utils.process_allgather(np.float32(input_seconds))
        manager.write_scalars(
            STEPS, {f"input_seconds/process{i}": float(v) for i, v in enumerate(gathered)}
        )
        manager.write_scalar("host_value", input_seconds, STEPS)
        # A global array sharded over processes: refused on every process at the call (process
        # 0 cannot read the other's rows), written once gathered.
        tokens = batch["decoder_target_tokens"]
        try:
            manager.write_histograms(STEPS, {"tokens": tokens})
            refused = ""
        except ValueError as err:
            refused = str(err)
        # As a scalar: refused for its shape, on every process, as in one process (reading it
        # first raised JAX's "Fetching value ... non-addressable devices" instead).
        try:
            manager.write_scalars(STEPS, {"tokens": tokens})
            refused_scalar = ""
        except ValueError as err:
            refused_scalar = str(err)
        gathered_tokens = multihost_utils.process_allgather(tokens, tiled=True)
        manager.write_histograms(STEPS, {"gathered_tokens": gathered_tokens})
        # A metrics dict holding a leaf sharded over processes (a per-row vector): its copy
        # would gather on the manager's thread, out of the loop's order: refused at the call.
        # First the same metric replicated, which every process can read: the call's checks
        # were then kept for the sharded one (same type, shape and dtype), which was accepted.
        rows = functools.partial(jax.jit, lambda x: {"rows": RowMean(x[:, 0].astype(np.float32))})
        manager.write_metrics_summary(rows(out_shardings=replicated)(tokens), STEPS, 1)
        per_row = rows()(tokens)
        try:
            manager.write_metrics_summary(per_row, STEPS, 1)
            refused_rows = ""
        except ValueError as err:
            refused_rows = str(err)
        # The same array as a raw tensor beside the metrics: read with the summary's values,
        # it failed the whole summary on every process; refused at the call, as above.
        try:
            raw = {"token_tensor": clu.values.Summary(tokens, None)}
            manager.write_metrics_summary(raw, STEPS, 1)
            refused_raw = ""
        except ValueError as err:
            refused_raw = str(err)
        for step, future in futures:
            summaries[step] = {k: float(np.asarray(v.value)) for k, v in future.result().items()}
    with open(os.path.join(out_dir, f"result{process_id}.json"), "w") as f:
        json.dump(
            {
                "summaries": summaries,
                "writes": manager.writes,
                "refused": refused,
                "refused_scalar": refused_scalar,
                "refused_rows": refused_rows,
                "refused_raw": refused_raw,
                "refused_made": refused_made,
            },
            f,
        )
    if num_processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    pid, count, port_, devices_ = (int(a) for a in sys.argv[1:5])
    main(pid, count, port_, devices_, sys.argv[5])
