"""Tracker writers: scalars per second of `WandbWriter` and `MlflowWriter` at 50 scalars per call, against each library's per-value call (`run.log` per key, `MlflowClient.log_metric` per key) measured side by side in the same run.

W&B runs offline (`WANDB_MODE=offline`: its service writes the local run file) and
MLflow logs to a SQLite tracking store in a temporary directory, so no network is
involved. Each measurement opens a fresh run (not timed), then times `calls` calls
of the same 50 numpy float32 scalars plus the end of the run (`close()`, or the
baseline's `run.finish()` / `set_terminated`), so queued work is counted. WandbWriter
makes one `run.log` per write with all keys; MlflowWriter buffers and sends batches of
up to 1,000 metrics (at `close()` here: the run is shorter than its 5 s timer); the
baselines make one call per value. Variants are interleaved in a random order each
round and the median of the rounds is reported; ratios are to the baseline's median.

Run: `python -m benchmarks.trackers [--quick]`.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import writers
from benchmarks import common

SIZE = 50
# factory(tmp) -> (write(step, scalars), end of the run)
Factory = Callable[[str], tuple[Callable[[int, dict], None], Callable[[], None]]]


def _quiet() -> None:
    # W&B runs are made with mode="offline" below; this keeps both libraries quiet.
    for name, value in (("WANDB_SILENT", "true"), ("MLFLOW_DISABLE_TELEMETRY", "true")):
        os.environ.setdefault(name, value)


def _wandb_settings() -> Any:
    import wandb

    return wandb.Settings(console="off")


def _wandb_writer(tmp: str):
    w = writers.WandbWriter(
        "bench", logdir=tmp, mode="offline", settings=_wandb_settings(), process_index=0
    )
    return w.write_scalars, w.close


def _wandb_per_key(tmp: str):
    import wandb

    run = wandb.init(
        project="bench", dir=tmp, mode="offline", settings=_wandb_settings(), reinit="create_new"
    )

    def write(step: int, scalars: dict) -> None:
        for key, value in scalars.items():
            run.log({key: float(value)}, step=step)

    return write, run.finish


_TEMPLATE: list[str] = []  # an empty SQLite store made once (MLflow's migrations take ~2 s)


def _store(tmp: str) -> str:
    """A fresh SQLite tracking store in `tmp`, copied from the template (not timed)."""
    from mlflow import MlflowClient

    if not _TEMPLATE:
        _TEMPLATE.append(os.path.join(tempfile.mkdtemp(), "template.db"))
        MlflowClient(f"sqlite:///{_TEMPLATE[0]}").search_experiments()  # creates the tables
    path = os.path.join(tmp, "mlflow.db")
    shutil.copyfile(_TEMPLATE[0], path)
    return f"sqlite:///{path}"


def _mlflow_writer(tmp: str):
    w = writers.MlflowWriter("bench", tracking_uri=_store(tmp), process_index=0)
    return w.write_scalars, w.close


def _mlflow_per_key(tmp: str):
    from mlflow import MlflowClient

    client = MlflowClient(_store(tmp))
    run_id = client.create_run("0").info.run_id

    def write(step: int, scalars: dict) -> None:
        for key, value in scalars.items():
            client.log_metric(run_id, key, float(value), step=step)

    return write, lambda: client.set_terminated(run_id)


PAIRS: dict[str, tuple[str, Factory, str, Factory]] = {
    "WandbWriter vs wandb.log per key (50 scalars/call)": (
        "WandbWriter",
        _wandb_writer,
        "wandb.log per key",
        _wandb_per_key,
    ),
    "MlflowWriter vs log_metric per key (50 scalars/call)": (
        "MlflowWriter",
        _mlflow_writer,
        "log_metric per key",
        _mlflow_per_key,
    ),
}


def _measure(factory: Factory, calls: int) -> float:
    """Scalars per second for `calls` calls of 50 scalars, the end of the run included."""
    scalars = {f"train/metric_{i:03d}": np.float32(0.001 * i + 0.5) for i in range(SIZE)}
    with tempfile.TemporaryDirectory() as tmp:
        write, close = factory(tmp)
        start = time.perf_counter()
        for step in range(calls):
            write(step, scalars)
        close()
        seconds = time.perf_counter() - start
    return calls * SIZE / seconds


def run(quick: bool, *, calls: int | None = None, repeats: int | None = None) -> common.Table:
    """Measures each tracker writer against its per-value baseline.

    Args:
      quick: fewer calls and rounds (same table).
      calls: write calls per measurement (overrides `quick`'s choice; tests use a few).
      repeats: rounds per variant (overrides `quick`'s choice).

    Returns:
      A table with one row per tracker: both rates and their ratio.
    """
    _quiet()
    calls = calls or (10 if quick else 20)
    repeats = repeats or (1 if quick else 3)
    variants = {}
    for _, (ours, make_ours, base, make_base) in PAIRS.items():
        variants[ours] = functools.partial(_measure, make_ours, calls)
        variants[base] = functools.partial(_measure, make_base, calls)
    samples = common.interleaved(variants, repeats, seed=SIZE)
    table = common.Table(
        key="trackers",
        title="13. Tracker writers",
        description=" ".join((__doc__ or "").split("\n\n")[0].split()),
        columns=[
            common.Column("comparison", "comparison"),
            common.Column("ratio", "writer / per key", ".1f", "x"),
            common.Column("ours", "writer scalars/s", "auto"),
            common.Column("base", "per-key scalars/s", "auto"),
        ],
    )
    for title, (ours, _, base, _) in PAIRS.items():
        rate, base_rate = common.median(samples[ours]), common.median(samples[base])
        row: dict[str, Any] = {
            "comparison": title,
            "ours": rate,
            "base": base_rate,
            "ratio": common.ratio(rate, base_rate),
        }
        table.rows.append(row)
        table.headlines.append(
            f"{title}: {row['ratio']:.1f}x, {rate:,.0f} vs {base_rate:,.0f} scalars/s"
        )
    return table


if __name__ == "__main__":
    common.main_for(run)
