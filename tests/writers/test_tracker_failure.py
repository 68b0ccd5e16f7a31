"""A tracker that fails mid-run costs no values in the other writers.

The MLflow store is made read-only mid-run (SQLite's `PRAGMA query_only` on every
connection of the store's engine: file permissions would not stop root, which CI
runs as). MultiWriter isolates writers: the JSONL writer keeps every value, and the
MLflow writer's failure is reported, naming the writer and MLflow's error.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

import writers
from tests.writers.tracker_stores import sqlite_store


def _read_only(engine: sqlalchemy.engine.Engine) -> None:
    sqlalchemy.event.listen(
        engine, "connect", lambda conn, _: conn.execute("PRAGMA query_only = ON")
    )
    engine.dispose()  # pooled connections are replaced by read-only ones


def test_a_read_only_mlflow_store_mid_run_costs_the_jsonl_writer_nothing(tmp_path):
    uri = sqlite_store(str(tmp_path / "store"))
    mlflow_writer = writers.MlflowWriter("exp", tracking_uri=uri, process_index=0)
    jsonl = writers.JsonlWriter(tmp_path / "metrics.jsonl")
    w = writers.MultiWriter({"jsonl": jsonl, "mlflow": mlflow_writer})
    failures = []
    for step in range(200):
        if step == 100:
            _read_only(mlflow_writer._client._tracking_client.store.engine)
        scalars = {f"m{i:02d}": step + i / 32 for i in range(20)}
        try:
            w.write_scalars(step, scalars)
        except writers.WriterError as err:
            failures.append((step, err))
    jsonl.close()

    with open(tmp_path / "metrics.jsonl") as f:
        lines = [json.loads(line) for line in f]
    assert [line["step"] for line in lines] == list(range(200))
    for line in lines:
        assert all(line[f"m{i:02d}"] == line["step"] + i / 32 for i in range(20))

    assert [step for step, _ in failures] == list(range(100, 200))
    ((name, error),) = failures[0][1].failures
    assert name == "mlflow" and isinstance(error, MlflowException)
    assert "attempt to write a readonly database" in str(error)
    assert "mlflow: MlflowException" in str(failures[0][1])
    # What reached MLflow before the store turned read-only is all there.
    client = MlflowClient(uri)
    history = client.get_metric_history(mlflow_writer.run_id, "m07")
    assert sorted(m.step for m in history) == list(range(100))
    with pytest.raises(writers.WriterError, match="mlflow"):
        w.close()  # ending the MLflow run needs a write too; the JSONL file is closed anyway


def test_a_read_only_mlflow_store_under_a_manager_is_isolated(tmp_path):
    """The same fault inside a MetricsManager: logged and counted, JSONL gets 100%."""
    from metrics_manager import MetricsManager

    uri = sqlite_store(str(tmp_path / "store"))
    made = {}

    def factory(logdir):
        made["mlflow"] = writers.MlflowWriter("exp", tracking_uri=uri, process_index=0)
        return writers.MultiWriter(
            {"jsonl": writers.JsonlWriter(f"{logdir}/metrics.jsonl"), "mlflow": made["mlflow"]}
        )

    with MetricsManager("train", tmp_path, writer_factory=factory) as manager:
        for step in range(200):
            if step == 100:
                manager.flush()
                _read_only(made["mlflow"]._client._tracking_client.store.engine)
            manager.write_scalars(step, {f"m{i:02d}": step + i / 32 for i in range(20)})
    lines = [json.loads(x) for x in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(200))
    assert all(x[f"m{i:02d}"] == x["step"] + i / 32 for x in lines for i in range(20))
    failed = [f for f in manager.errors if f.source == "writer:mlflow"]
    assert failed and failed[0].step == 100 and "readonly" in str(failed[0])
    history = MlflowClient(uri).get_metric_history(made["mlflow"].run_id, "m00")
    assert [m.step for m in history] == list(range(100))
