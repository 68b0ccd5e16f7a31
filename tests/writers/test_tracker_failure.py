"""A tracker store that fails mid-run costs no values: not in the other writers, and not in
the tracker once the store is back.

The MLflow store is made read-only mid-run (SQLite's `PRAGMA query_only` on every
connection of the store's engine: file permissions would not stop root, which CI
runs as), then writable again. `MlflowWriter` only buffers in its write calls, so
writing never fails; a send while the store is read-only fails and keeps the buffer,
and the next send after the store is back delivers every value.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import sqlalchemy
from mlflow import MlflowClient

import writers
from tests.writers.tracker_stores import sqlite_store


def _read_only(engine: sqlalchemy.engine.Engine) -> Callable[[], None]:
    """Makes the store refuse writes; returns the call that undoes it."""

    def query_only(conn, _):
        conn.execute("PRAGMA query_only = ON")

    sqlalchemy.event.listen(engine, "connect", query_only)
    engine.dispose()  # pooled connections are replaced by read-only ones

    def undo() -> None:
        sqlalchemy.event.remove(engine, "connect", query_only)
        engine.dispose()

    return undo


def _steps(uri: str, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))


def test_a_read_only_mlflow_store_mid_run_loses_nothing_once_it_is_back(tmp_path):
    uri = sqlite_store(str(tmp_path / "store"))
    mlflow_writer = writers.MlflowWriter("exp", tracking_uri=uri, process_index=0, flush_secs=3600)
    jsonl = writers.JsonlWriter(tmp_path / "metrics.jsonl")
    w = writers.MultiWriter({"jsonl": jsonl, "mlflow": mlflow_writer})
    engine = mlflow_writer._client._tracking_client.store.engine
    for step in range(200):
        if step == 100:
            w.flush()
            writable = _read_only(engine)
        w.write_scalars(step, {f"m{i:02d}": step + i / 32 for i in range(20)})  # never raises
    mlflow_writer.write_texts(150, {"note": "sent once the store is back"})  # an artifact
    with pytest.raises(writers.WriterError) as raised:
        w.flush()
    ((name, error),) = raised.value.failures
    assert name == "mlflow" and "attempt to write a readonly database" in str(error)
    assert _steps(uri, mlflow_writer.run_id, "m07") == list(range(100))  # 100-199 buffered

    writable()
    w.close()
    with open(tmp_path / "metrics.jsonl") as f:
        lines = [json.loads(line) for line in f]
    assert [line["step"] for line in lines] == list(range(200))
    for line in lines:
        assert all(line[f"m{i:02d}"] == line["step"] + i / 32 for i in range(20))
    client = MlflowClient(uri)
    for i in range(20):
        history = client.get_metric_history(mlflow_writer.run_id, f"m{i:02d}")
        assert sorted((m.step, m.value) for m in history) == [(s, s + i / 32) for s in range(200)]
    assert client.get_run(mlflow_writer.run_id).info.status == "FINISHED"
    note = client.download_artifacts(mlflow_writer.run_id, "texts/note", str(tmp_path / "down"))
    with open(f"{note}/step_00000150.txt") as f:
        assert f.read() == "sent once the store is back"


def test_a_close_that_failed_sends_everything_when_called_again(tmp_path):
    # The store refused the close's send: a second close() returned at once, what was
    # buffered was never sent and the run stayed RUNNING.
    uri = sqlite_store(str(tmp_path / "store"))
    w = writers.MlflowWriter("exp", tracking_uri=uri, process_index=0, flush_secs=3600)
    engine = w._client._tracking_client.store.engine
    for step in range(10):
        w.write_scalars(step, {"loss": step / 4})
    writable = _read_only(engine)
    with pytest.raises(Exception, match="attempt to write a readonly database"):
        w.close()
    with pytest.raises(Exception, match="attempt to write a readonly database"):
        w.close()  # still refused: kept again
    with pytest.raises(writers.WriterClosedError):
        w.write_scalars(10, {"loss": 1.0})
    writable()
    w.close()
    w.close()  # done: idempotent
    client = MlflowClient(uri)
    history = client.get_metric_history(w.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(s, s / 4) for s in range(10)]
    assert client.get_run(w.run_id).info.status == "FINISHED"


def test_a_read_only_mlflow_store_under_a_manager_is_isolated(tmp_path):
    """The same fault inside a MetricsManager: the flush during the fault is logged and
    counted, JSONL gets 100%, and MLflow too once the store is back."""
    from metrics_manager import MetricsManager

    uri = sqlite_store(str(tmp_path / "store"))
    made = {}

    def factory(logdir):
        made["mlflow"] = writers.MlflowWriter(
            "exp", tracking_uri=uri, process_index=0, flush_secs=3600
        )
        return writers.MultiWriter(
            {"jsonl": writers.JsonlWriter(f"{logdir}/metrics.jsonl"), "mlflow": made["mlflow"]}
        )

    with MetricsManager("train", tmp_path, writer_factory=factory) as manager:
        for step in range(200):
            if step == 100:
                manager.flush()
                writable = _read_only(made["mlflow"]._client._tracking_client.store.engine)
            manager.write_scalars(step, {f"m{i:02d}": step + i / 32 for i in range(20)})
        manager.flush()
        (failed,) = manager.errors
        assert failed.source == "writer:mlflow" and "readonly" in str(failed)
        assert _steps(uri, made["mlflow"].run_id, "m00") == list(range(100))
        writable()
    lines = [json.loads(x) for x in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(200))
    assert all(x[f"m{i:02d}"] == x["step"] + i / 32 for x in lines for i in range(20))
    assert len(manager.errors) == 1
    assert _steps(uri, made["mlflow"].run_id, "m00") == list(range(200))
