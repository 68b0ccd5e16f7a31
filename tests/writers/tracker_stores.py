"""Reading what the trackers stored, with their own formats and clients.

W&B: an offline run keeps everything in `run-<id>.wandb`, a LevelDB-style log of
`wandb.proto.wandb_internal_pb2.Record` messages. wandb 0.31 no longer ships a
Python reader of that file (its `DataStore` was removed when the Go service took
over), so `wandb_records` reads the documented framing (a 7-byte `:W&B` header,
32 KiB blocks, 7-byte chunk headers, FULL/FIRST/MIDDLE/LAST chunks) and parses
each record with W&B's own proto.

MLflow: `sqlite_store` gives each test its own SQLite tracking store, copied from
one store made once per process (creating the tables runs MLflow's migrations,
about 2 s); `mlflow_server` runs a real `mlflow server` on a free port.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

_BLOCK = 32768
_FULL, _LAST = 1, 4


def wandb_records(path: str) -> Iterator[Any]:
    """Yields every `Record` of a `.wandb` run file, in the order written."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a W&B run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # the block's zero-padded trailer
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding up to the end of a block (or of the file)
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_run_files(logdir: str, timeout: float = 10.0) -> list[str]:
    """The `.wandb` files of the finished offline runs under `<logdir>/wandb`, oldest first.

    `run.finish()` can return a few milliseconds before W&B's service has appended
    the last records (measured with wandb 0.31: about 1 run in 15), so this waits
    until each file ends with its `exit` record.
    """
    paths = glob.glob(os.path.join(logdir, "wandb", "offline-run-*", "*.wandb"))
    deadline = time.monotonic() + timeout
    for path in paths:
        while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(path)):
            assert time.monotonic() < deadline, f"{path} has no exit record after {timeout} s"
            time.sleep(0.01)
    return sorted(paths, key=lambda p: wandb_run_record(p).start_time.ToNanoseconds())


def wandb_history(path: str) -> dict[int, dict[str, Any]]:
    """Step -> {key: value} of a run file's history rows (W&B's own `_`-keys left out).

    Media values (images, audio, histograms) are dicts, as W&B stores them.
    """
    rows: dict[int, dict[str, Any]] = {}
    for record in wandb_records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        row = rows.setdefault(record.history.step.num, {})
        for item in record.history.item:
            *parents, last = list(item.nested_key) or [item.key]
            if parents[:1] == [] and last.startswith("_"):
                continue
            target = row
            for parent in parents:
                target = target.setdefault(parent, {})
            target[last] = json.loads(item.value_json)
    return rows


def wandb_config(path: str) -> dict[str, Any]:
    """The run's config as the run file records it (initial config, then updates)."""
    config: dict[str, Any] = {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        updates = record.run.config.update if kind == "run" else record.config.update
        if kind in ("run", "config"):
            for item in updates:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    config.pop("_wandb", None)
    return config


def wandb_run_record(path: str) -> Any:
    """The run's `RunRecord` (id, branch point of a rewind, ...)."""
    return next(r.run for r in wandb_records(path) if r.WhichOneof("record_type") == "run")


_TEMPLATE: list[str] = []  # the store made once per process, copied for each test


def sqlite_store(folder: str) -> str:
    """A fresh SQLite tracking store in `folder`; returns its tracking URI."""
    from mlflow import MlflowClient

    if not _TEMPLATE:
        path = os.path.join(tempfile.mkdtemp(), "template.db")
        MlflowClient(f"sqlite:///{path}").search_experiments()  # creates the tables
        _TEMPLATE.append(path)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "mlflow.db")
    shutil.copyfile(_TEMPLATE[0], path)
    return f"sqlite:///{path}"


@contextlib.contextmanager
def mlflow_server(folder: str) -> Iterator[int]:
    """Runs `mlflow server` (SQLite store and artifacts in `folder`) on a free port; yields it."""
    from tests.storage_servers import free_port

    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            sqlite_store(os.path.join(folder, "server")),
            "--artifacts-destination",
            os.path.join(folder, "served"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # No background job workers (their own processes, slow to start); its own process
        # group, so the server and the uvicorn worker it starts are stopped together.
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield port
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
