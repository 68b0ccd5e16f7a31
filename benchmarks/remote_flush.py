"""Flush cost to cloud storage (the GCS emulator) after 10 and after 1,000 prior summaries.

A remote run directory gets one new object per flush holding only what was written since
the previous flush, so a flush costs the same however long the run has been going. (A
whole-file re-upload per flush, tensorboardX's GCS writer, costs time and bytes that grow
with the run.) The default writer set (TensorBoard + JSONL, synchronous) writes summaries
of T5X's 21 base-metric keys to `gs://bucket/...` on a local gcp-storage-emulator, with a
flush after each; then each of R more summaries is written and its `flush()` timed. Bytes
per flush are the request bodies the server received.

Run alone: `python -m benchmarks.remote_flush [--quick]`.
"""

from __future__ import annotations

import os
import time
import uuid

from benchmarks import common

PRIORS = (10, 1000)
KEYS = [f"metric/{i:02d}_{'x' * 20}" for i in range(21)]


def _measure(server, prior: int, repeats: int) -> dict[str, float]:
    import writers  # noqa: PLC0415

    run = f"gs://bucket/bench-{uuid.uuid4().hex[:8]}"
    w = writers.create_default_writer(run, console=False, asynchronous=False)
    step = 0
    for step in range(1, prior + 1):
        w.write_scalars(step, {k: float(step + i) for i, k in enumerate(KEYS)})
        w.flush()
    seconds, uploaded = [], []
    for step in range(prior + 1, prior + repeats + 1):
        w.write_scalars(step, {k: float(step + i) for i, k in enumerate(KEYS)})
        before = server.counter.uploaded_bytes
        start = time.perf_counter()
        w.flush()
        seconds.append(time.perf_counter() - start)
        uploaded.append(server.counter.uploaded_bytes - before)
    w.close()
    return {
        "prior": prior,
        "flushes": repeats,
        "median_ms": common.median(seconds) * 1e3,
        "p10_ms": common.percentile(seconds, 10) * 1e3,
        "p90_ms": common.percentile(seconds, 90) * 1e3,
        "bytes_per_flush": common.median(uploaded),
    }


def run(quick: bool = False, *, repeats: int | None = None) -> common.Table:
    """Median flush time and uploaded bytes per flush after 10 and 1,000 prior summaries.

    Args:
      quick: fewer timed flushes (same table).
      repeats: timed flushes per point (default 40; quick 15).

    Returns:
      One row per number of prior summaries, with its ratio to the 10-summary row.
    """
    import fsspec  # noqa: PLC0415
    import fsspec.config  # noqa: PLC0415

    from tests import storage_servers  # noqa: PLC0415

    repeats = repeats or (15 if quick else 40)
    server = storage_servers.GcsServer()
    saved_env = {k: os.environ.get(k) for k in server.environment()}
    saved_conf = fsspec.config.conf.get("gs")
    os.environ.update(server.environment())
    fsspec.config.conf["gs"] = server.fsspec_config()
    fsspec.get_filesystem_class("gs").clear_instance_cache()
    try:
        rows = [_measure(server, prior, repeats) for prior in PRIORS]
    finally:
        server.stop()
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if saved_conf is None:
            fsspec.config.conf.pop("gs", None)
        else:
            fsspec.config.conf["gs"] = saved_conf
        fsspec.get_filesystem_class("gs").clear_instance_cache()
    base = rows[0]
    for row in rows:
        row["ratio"] = common.ratio(row["median_ms"], base["median_ms"])
        row["bytes_ratio"] = common.ratio(row["bytes_per_flush"], base["bytes_per_flush"])
    table = common.Table(
        key="remote_flush",
        title="9. Flush cost to cloud storage (GCS emulator)",
        description=" ".join((__doc__ or "").split("\n\n")[1].split()),
        columns=[
            common.Column("prior", "prior summaries"),
            common.Column("flushes", "timed flushes"),
            common.Column("median_ms", "median (ms)", ".2f"),
            common.Column("p10_ms", "p10 (ms)", ".2f"),
            common.Column("p90_ms", "p90 (ms)", ".2f"),
            common.Column("ratio", "median / 10 prior", ".3f", "x"),
            common.Column("bytes_per_flush", "bytes uploaded per flush", ",.0f"),
            common.Column("bytes_ratio", "bytes / 10 prior", ".3f", "x"),
        ],
        rows=rows,
    )
    last = rows[-1]
    table.targets.append(
        common.Target("remote flush cost, 1,000 vs 10 prior summaries", last["ratio"], 1.5)
    )
    table.headlines.append(
        f"remote flush (GCS emulator), 1,000 vs 10 prior summaries: {last['ratio']:.3f}x time "
        f"(median {base['median_ms']:.2f} -> {last['median_ms']:.2f} ms), "
        f"{last['bytes_ratio']:.3f}x bytes ({last['bytes_per_flush']:,.0f} per flush)"
    )
    return table


if __name__ == "__main__":
    common.main_for(run)
