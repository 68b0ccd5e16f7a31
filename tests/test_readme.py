"""The README's "Use it in your own loop" example runs as written and writes what it says.

The example is the fenced ```python block right after the `<!-- test: readme-example -->`
comment in README.md. It runs in a fresh namespace with `tmp_path` as the working
directory, so its relative `runs/example` lands there.
"""

from __future__ import annotations

import json
import logging
import os
import re

import gin
import jax
import pytest
from tensorboard.backend.event_processing import event_accumulator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "<!-- test: readme-example -->"
GIN_MARKER = "<!-- test: readme-gin -->"
WANDB_MARKER = "<!-- test: readme-wandb -->"
MLFLOW_MARKER = "<!-- test: readme-mlflow -->"


def readme_example(marker: str = MARKER) -> str:
    """Returns the source of the ```python block right after `marker` in README.md."""
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    match = re.search(re.escape(marker) + r"\s*```python\n(.*?)```", readme, re.DOTALL)
    if match is None:
        raise ValueError(f"README.md has no ```python block right after {marker!r}.")
    return match.group(1)


def test_readme_mentions_the_setup_commands_ci_runs():
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    with open(os.path.join(REPO, ".ci", "run")) as f:
        ci = f.read()
    assert "make demo" in readme and "make test" in readme
    assert re.search(r"^make test$", ci, re.MULTILINE), ci


def test_readme_example_runs_and_writes_its_summaries(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme_example"}
    with caplog.at_level(logging.WARNING, logger="metrics_manager.manager"):
        exec(compile(readme_example(), "README.md:readme-example", "exec"), namespace)
    # Its windows are opened after each summary and merge every step: no warning about them
    # (a window opened just before its summary, or each holding one step).
    assert [r.getMessage() for r in caplog.records if r.name.startswith("metrics_manager")] == []

    run_dir = tmp_path / "runs" / "example" / "train"
    with open(run_dir / "metrics.jsonl") as f:
        lines = [json.loads(line) for line in f]
    assert [line["step"] for line in lines] == [20, 40, 60, 80, 100]
    assert lines[-1]["loss"] < lines[0]["loss"]
    for line in lines:
        assert line["collection"] == "train"
        assert line["timing/steps_per_second"] > 0
        # The window's largest |error| bounds every step's root-mean-square error, so its
        # square bounds the window's mean squared error (`loss`).
        assert line["max_abs_error"] ** 2 >= line["loss"]

    acc = event_accumulator.EventAccumulator(str(run_dir))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [20, 40, 60, 80, 100]
    assert [e.value for e in acc.Scalars("loss")] == pytest.approx(
        [line["loss"] for line in lines], rel=1e-6
    )


@pytest.mark.parametrize("precompiled", [False, True])
def test_readme_precompile_block_keeps_compilation_out_of_the_windows(
    tmp_path, monkeypatch, caplog, precompiled
):
    """The example's first window read 41 steps/s against thousands after it, as it timed
    compiling the step's two variants; the README's block, run before the `with` block,
    compiles both there, and the loop compiles nothing."""
    monkeypatch.chdir(tmp_path)
    example, loop = readme_example(), "with MetricsManager("
    assert example.count(loop) == 1
    before = readme_example("<!-- test: readme-precompile -->") if precompiled else ""
    log_compiles = "jax.config.update('jax_log_compiles', True)\n"
    source = example.replace(loop, before + log_compiles + loop)
    caplog.set_level(logging.WARNING)
    try:
        exec(compile(source, "README.md:readme-precompile", "exec"), {"__name__": "readme"})
    finally:
        jax.config.update("jax_log_compiles", False)
    compiled = [r for r in caplog.records if "Compiling jit(train_step)" in r.getMessage()]
    assert len(compiled) == (0 if precompiled else 2)
    with open(tmp_path / "runs" / "example" / "train" / "metrics.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [20, 40, 60, 80, 100]


def test_readme_gin_entry_point_builds_train_and_eval_managers(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the block adds the relative search path "configs"
    model_dir = str(tmp_path / "model")
    namespace: dict = {"__name__": "readme_gin", "model_dir": model_dir}
    try:
        exec(compile(readme_example(GIN_MARKER), "README.md:readme-gin", "exec"), namespace)
        namespace["train"].close()
        namespace["evals"].close()
    finally:
        gin.clear_config()

    with open(os.path.join(model_dir, "config.gin")) as f:
        config = f.read()
    # The binding given on the command line reached the writer factory the managers called.
    assert "writers.create_default_writer.log = True" in config
    lines = {}
    for run in ("train", "eval/my_task"):
        with open(os.path.join(model_dir, run, "metrics.jsonl")) as f:
            lines[run] = [json.loads(line) for line in f]
        assert all(line["collection"] == run for line in lines[run])
    # The text summary `config`, written once at step 0 through the train manager.
    assert [line["step"] for line in lines["train"] if "config" in line] == [0]


def test_readme_resume_block_keeps_each_step_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(readme_example("<!-- test: readme-resume -->"), "README.md:resume", "exec"), {})
    acc = event_accumulator.EventAccumulator(str(tmp_path / "runs" / "resumed"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == list(range(1, 101))


def test_readme_cloud_block_writes_to_a_gcs_emulator(capsys):
    import fsspec

    from tests import storage_servers

    server = storage_servers.GcsServer()
    try:
        with storage_servers.serving(server, "gs"):
            block = readme_example("<!-- test: readme-cloud -->")
            exec(compile(block, "README.md:cloud", "exec"), {})
            assert capsys.readouterr().out.strip() == str([1.0, 0.5, 1.0 / 3])
            acc = event_accumulator.EventAccumulator("gs://bucket/run/train")
            acc.Reload()
            assert [e.step for e in acc.Scalars("loss")] == [1, 2, 3]
            config = fsspec.filesystem("gs").cat_file("bucket/run/config.gin")
            assert config == b"train.steps = 100\n"
    finally:
        server.stop()


def _run_block(marker: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme_" + marker}
    exec(compile(readme_example(marker), f"README.md:{marker}", "exec"), namespace)


def test_readme_wandb_block_logs_what_it_says(tmp_path, monkeypatch):
    from tests.writers.tracker_stores import (
        wandb_config,
        wandb_history,
        wandb_run_files,
        wandb_run_record,
    )

    _run_block(WANDB_MARKER, tmp_path, monkeypatch)
    first, resumed = wandb_run_files(str(tmp_path / "runs" / "exp1"))
    history = wandb_history(first)
    assert sorted(history) == list(range(1, 101))
    assert history[50] == {"train/loss": 1.0 / 50, "train/accuracy": 1.0 - 1.0 / 50}
    assert history[100]["notes"] == "every key of a call goes in one wandb.log"
    assert wandb_config(first) == {"learning_rate": 3e-3, "optimizer": "adamw"}
    assert wandb_run_record(resumed).branch_point.value == 60
    assert wandb_history(resumed) == {61: {"train/loss": 0.5}}


def test_readme_mlflow_block_logs_what_it_says(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    _run_block(MLFLOW_MARKER, tmp_path, monkeypatch)
    client = MlflowClient("sqlite:///mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("my-experiment").experiment_id])
    assert run.info.run_name == "exp1" and run.info.status == "FINISHED"
    assert run.data.params == {"learning_rate": "0.003", "optimizer": "adamw"}
    loss = sorted(
        (m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")
    )
    assert loss == [(s, 1.0 / s) for s in range(1, 101)] + [(s, 0.5 / s) for s in range(101, 121)]
    (text,) = client.list_artifacts(run.info.run_id, "texts/notes")
    assert text.path == "texts/notes/step_00000100.txt"
