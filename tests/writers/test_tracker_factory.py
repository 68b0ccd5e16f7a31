"""create_tracker_writer: the default writers and one tracker in one flat MultiWriter."""

from __future__ import annotations

import functools
import json

import clu.values
import gin
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

import writers
from tests.writers.recording import RecordingWriter
from tests.writers.tracker_stores import wandb_history, wandb_run_files
from writers._jsonl_log import LogLockedError


def _files_only(logdir, collection):
    return writers.create_default_writer(
        logdir, collection=collection, console=False, tensorboard=False, asynchronous=False
    )


def test_the_tracker_gets_the_collection_and_keeps_its_files_in_logdir(tmp_path):
    tracker = functools.partial(writers.WandbWriter, "tests", process_index=0)
    w = writers.create_tracker_writer(
        tmp_path, collection="train", tracker=tracker, name="wandb", default_writer=_files_only
    )
    assert sorted(w.writers) == ["jsonl", "wandb"]
    assert w.writers["wandb"].run.name == "train"
    w.write_scalars(1, {"loss": 0.5})
    w.close()
    assert wandb_history(wandb_run_files(str(tmp_path))[0]) == {1: {"loss": 0.5}}
    with open(tmp_path / "metrics.jsonl") as f:
        assert json.loads(f.readline())["loss"] == 0.5


def test_a_gin_configured_tracker_class_gets_logdir_too(tmp_path):
    gin.clear_config()
    try:
        gin.parse_config(
            "from __gin__ import dynamic_registration\nimport writers\n"
            "writers.WandbWriter.process_index = 0\n"
        )
        tracker = gin.get_configurable("writers.WandbWriter")
        w = writers.create_tracker_writer(tmp_path, tracker=tracker, default_writer=_files_only)
        w.close()
    finally:
        gin.clear_config()
    assert len(wandb_run_files(str(tmp_path))) == 1


@pytest.mark.parametrize("given_by", ["partial", "gin", "gin scoped reference"])
def test_a_trackers_own_logdir_is_kept(tmp_path, given_by):
    # The summary dir replaced it: W&B's files went to <logdir>/wandb, none to the one asked for
    # (with `tracker = @train/writers.WandbWriter`, gin's binding in that scope was not seen).
    own = tmp_path / "own"
    gin.clear_config()
    try:
        make, kwargs = writers.create_tracker_writer, {"default_writer": _files_only}
        if given_by == "partial":
            kwargs["tracker"] = functools.partial(
                writers.WandbWriter, "tests", logdir=own, process_index=0
            )
        else:
            scope = "train/" if given_by == "gin scoped reference" else ""
            gin.parse_config(
                "from __gin__ import dynamic_registration\nimport writers\n"
                f"writers.WandbWriter.process_index = 0\n{scope}writers.WandbWriter.logdir = '{own}'\n"
                f"writers.create_tracker_writer.tracker = @{scope}writers.WandbWriter\n"
            )
            make = gin.get_configurable(make)
        w = make(tmp_path / "summaries", **kwargs)
        w.write_scalars(1, {"loss": 0.5})
        w.close()
    finally:
        gin.clear_config()
    assert wandb_run_files(str(tmp_path / "summaries")) == []
    assert [wandb_history(p) for p in wandb_run_files(str(own))] == [{1: {"loss": 0.5}}]
    with open(tmp_path / "summaries" / "metrics.jsonl") as f:
        assert json.loads(f.readline())["loss"] == 0.5


def test_no_collection_keeps_the_factories_own(tmp_path):
    # collection=None replaced both: run id 'exp', not 'exp-train', and no JSONL collection.
    tracker = functools.partial(
        writers.WandbWriter, "tests", collection="train", run_id="exp", process_index=0
    )
    default_writer = functools.partial(_files_only, collection="train")
    w = writers.create_tracker_writer(tmp_path, tracker=tracker, default_writer=default_writer)
    assert (w.writers["tracker"].run.id, w.writers["tracker"].run.name) == ("exp-train", "train")
    w.write_scalars(1, {"loss": 0.5})
    w.close()
    with open(tmp_path / "metrics.jsonl") as f:
        assert json.loads(f.readline())["collection"] == "train"


@gin.configurable(module="test_tracker_factory")
class _DecoratedTracker(RecordingWriter):
    """A tracker class of a user's, gin-configured by decorator (gin wraps its __init__)."""

    def __init__(self, logdir=None, collection=None):
        super().__init__()
        self.logdir, self.collection = logdir, collection


@pytest.mark.parametrize("bound", ["logdir", "collection"])
def test_a_decorated_tracker_class_keeps_its_gin_bindings(tmp_path, bound):
    # @gin.configurable on a class wraps its __init__, not its metaclass: the binding was
    # taken for none, so logdir went to the summary dir and collection=None replaced 'train'.
    gin.clear_config()
    try:
        gin.parse_config(f"test_tracker_factory._DecoratedTracker.{bound} = 'own'")
        w = writers.create_tracker_writer(
            tmp_path, tracker=_DecoratedTracker, default_writer=_files_only
        )
        made = w.writers["tracker"]
        w.close()
    finally:
        gin.clear_config()
    expected = {"logdir": ("own", None), "collection": (str(tmp_path), "own")}[bound]
    assert (str(made.logdir), made.collection) == expected


def test_a_name_clash_or_a_failing_tracker_leaves_nothing_open(tmp_path):
    with pytest.raises(ValueError, match="name='jsonl' is taken"):
        writers.create_tracker_writer(
            tmp_path,
            tracker=lambda collection: writers.NoopWriter(),
            name="jsonl",
            default_writer=_files_only,
        )

    def broken(collection):
        raise OSError("tracker down")

    with pytest.raises(OSError, match="tracker down"):
        writers.create_tracker_writer(tmp_path, tracker=broken, default_writer=_files_only)


def test_a_set_that_fails_to_build_ends_the_run_its_tracker_started_as_failed(tmp_path):
    from mlflow import MlflowClient

    from tests.writers.tracker_stores import sqlite_store

    uri = sqlite_store(str(tmp_path / "store"))
    tracker = functools.partial(
        writers.MlflowWriter, "exp", tracking_uri=uri, process_index=0, flush_secs=3600
    )
    make = functools.partial(
        writers.create_tracker_writer, tracker=tracker, default_writer=_files_only
    )
    first = make(tmp_path / "run", name="mlflow")
    # A second launch on the same logdir: its JSONL log is locked by the first.
    with pytest.raises(LogLockedError, match="holds a lock"):
        make(tmp_path / "run", name="mlflow")
    with pytest.raises(ValueError, match="name='jsonl' is taken"):
        make(tmp_path / "other", name="jsonl")
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    live = first.writers["mlflow"].run_id
    assert sorted((r.info.run_id == live, r.info.status) for r in runs) == [
        (False, "FAILED"),  # each was FINISHED: an empty run that read as complete
        (False, "FAILED"),
        (True, "RUNNING"),
    ]
    first.close()
    assert client.get_run(live).info.status == "FINISHED"


def test_a_writer_set_the_manager_refuses_ends_its_trackers_run_as_failed(tmp_path):
    # The manager closed the writers of a set it refused with close(): the run ended
    # FINISHED, an empty run that read as complete.
    from mlflow import MlflowClient

    from metrics_manager import MetricsManager
    from tests.writers.tracker_stores import sqlite_store

    uri = sqlite_store(str(tmp_path / "store"))

    def factory(logdir):
        tracker = writers.MlflowWriter("exp", tracking_uri=uri, process_index=0)
        return [tracker, object()]

    with pytest.raises(TypeError, match="writer_factory's writers"):
        MetricsManager("train", tmp_path, writer_factory=factory)
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]


def test_a_tracker_refusing_its_settings_leaves_the_logs_of_the_run_it_resumes(tmp_path):
    # The default writers were made first: resumed, they cut the JSONL log at the step and
    # purged TensorBoard after it; then the tracker refused (resume_step without run_id).
    first = writers.create_default_writer(tmp_path, console=False)
    for step in range(1, 11):
        first.write_scalars(step, {"loss": float(step)})
    first.close()
    with pytest.raises(ValueError, match=r"resume_step=2 needs the run to resume; pass run_id"):
        writers.create_tracker_writer(
            tmp_path,
            tracker=functools.partial(writers.WandbWriter, "tests", process_index=0),
            name="wandb",
            default_writer=functools.partial(writers.create_default_writer, console=False),
            resume_step=2,
        )
    assert [line["loss"] for line in writers.read_jsonl(tmp_path)] == [*map(float, range(1, 11))]
    accumulator = event_accumulator.EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("loss")] == list(range(1, 11))
    # Default writers failing after the tracker was made (a second run on logdir) close it.
    made: list[RecordingWriter] = []

    def tracker(collection):
        made.append(RecordingWriter())
        return made[-1]

    with writers.JsonlWriter(tmp_path), pytest.raises(ValueError, match="metrics.jsonl"):
        writers.create_tracker_writer(tmp_path, tracker=tracker, default_writer=_files_only)
    assert [call[0] for call in made[0].calls] == ["close"]


def test_resume_step_needs_a_tracker_that_takes_one(tmp_path):
    with pytest.raises(
        TypeError, match=r"resume_step=5 needs a tracker and a default_writer taking resume_step"
    ):
        writers.create_tracker_writer(
            tmp_path,
            tracker=lambda collection: writers.NoopWriter(),
            default_writer=_files_only,
            resume_step=5,
        )
    assert not (tmp_path / "metrics.jsonl").exists() or writers.read_jsonl(tmp_path) == []


def test_a_tracker_taking_kwargs_gets_resume_step(tmp_path):
    # As MetricsManager passes resume_step on to a factory with **kwargs (it raised TypeError).
    made: list[dict] = []

    def tracker(**kwargs):
        made.append(kwargs)
        return writers.NoopWriter()

    def default_writer(logdir, **kwargs):
        made.append(kwargs)
        return _files_only(logdir, kwargs["collection"])

    w = writers.create_tracker_writer(
        tmp_path, collection="train", tracker=tracker, default_writer=default_writer, resume_step=5
    )
    w.close()
    assert made == [{"collection": "train", "resume_step": 5}] * 2


def test_names_a_tracker_refuses_are_refused_at_the_call_before_any_writer_writes(tmp_path):
    from mlflow import MlflowClient

    from metrics_manager import MetricsManager, Sum
    from tests.writers.tracker_stores import sqlite_store

    uri = sqlite_store(str(tmp_path / "store"))
    tracker = functools.partial(writers.MlflowWriter, "exp", tracking_uri=uri, process_index=0)
    factory = functools.partial(
        writers.create_tracker_writer, tracker=tracker, name="mlflow", default_writer=_files_only
    )
    long_key = "k" * 300  # a file name part over 255 bytes: every later artifact send failed
    with MetricsManager("train", str(tmp_path / "run"), writer_factory=factory) as manager:
        for call, arg in (
            (manager.write_scalars, {"top@1": 0.5, "loss": 2.0}),
            (manager.write_texts, {long_key: "x", "good": "y"}),
        ):
            with pytest.raises(
                ValueError,
                match=r"mlflow: .*(MLflow refuses the names 'top@1'|k{300}'\] become artifact paths texts/)",
            ):
                call(1, arg)
        with pytest.raises(ValueError, match=r"MLflow refuses the names 'acc@1'"):
            manager.write_metrics_summary({"acc@1": Sum.from_model_output(np.ones(2))}, 1, 1)
        with pytest.raises(ValueError, match=r"MLflow refuses the names 'lr\$'"):
            manager.write_hparams({"lr$": 0.1})
        manager.write_scalars(2, {"loss": 1.5})
        manager.write_texts(2, {"good": "kept"})
        # A Text's key is an artifact path, which MLflow takes with characters a metric name
        # may not have: a summary holding one is not refused.
        text = clu.values.Text("the greedy sample")
        manager.write_metrics_summary({"sample (greedy)": text}, 3, 1).result(timeout=30)
        run_id = manager.writers["mlflow"].run_id
    with open(tmp_path / "run" / "train" / "metrics.jsonl") as f:
        lines = [json.loads(line) for line in f]
    assert [(line["step"], line.get("loss"), line.get("good")) for line in lines][:2] == [
        (2, 1.5, None),
        (2, None, "kept"),
    ]  # nothing of the refused calls, in JSONL either
    assert lines[2]["step"] == 3 and lines[2]["sample (greedy)"] == "the greedy sample"
    client = MlflowClient(uri)
    assert client.get_run(run_id).data.metrics == {"loss": 1.5}
    assert [f.path for f in client.list_artifacts(run_id, "texts")] == [
        "texts/good",
        "texts/sample (greedy)",
    ]
    # A MultiWriter asks its writers the same before the first one writes.
    w = writers.create_tracker_writer(
        tmp_path / "multi", tracker=tracker, name="mlflow", default_writer=_files_only
    )
    with pytest.raises(ValueError, match=r"MultiWriter.write_scalars: mlflow: MLflow refuses"):
        w.write_scalars(1, {"top@1": 0.5})
    w.close()
    assert (tmp_path / "multi" / "metrics.jsonl").read_text() == ""


SHADOW_SCRIPT = """
import sys
import writers
for make in (lambda: writers.MlflowWriter("logs"), lambda: writers.WandbWriter("logs")):
    try:
        make()
    except ImportError as err:
        print(err)
"""


@pytest.mark.parametrize(
    "shadow, expected",
    [
        (
            "x = 1\n",  # a module of the same name: mlflow said "'mlflow' is not a package"
            [
                "MlflowWriter needs the 'mlflow' package, but 'mlflow' is {d}/mlflow.py, which "
                "shadows it: rename that file.",
                "WandbWriter needs the 'wandb' package, but 'wandb' is {d}/wandb.py, which "
                "shadows it: rename that file.",
            ],
        ),
        (
            "import no_such_module\n",  # it was said not to be installed
            [
                "MlflowWriter could not import 'mlflow' from {d}/mlflow.py: No module named "
                "'no_such_module'. Reinstall it (pip install 'jax-metrics-manager[mlflow]'), "
                "or rename a file of that name that shadows it.",
                "WandbWriter could not import 'wandb' from {d}/wandb.py: No module named "
                "'no_such_module'. Reinstall it (pip install 'jax-metrics-manager[wandb]'), "
                "or rename a file of that name that shadows it.",
            ],
        ),
    ],
    ids=["a-module", "failing-imports"],
)
def test_a_file_shadowing_a_tracker_package_is_named(tmp_path, shadow, expected):
    import os
    import pathlib
    import subprocess
    import sys

    for name in ("mlflow", "wandb"):
        (tmp_path / f"{name}.py").write_text(shadow)
    repo = pathlib.Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", SHADOW_SCRIPT],
        cwd=tmp_path,  # "" heads sys.path under -c: the working directory's files come first
        env=dict(os.environ, PYTHONPATH=str(repo)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [line.format(d=tmp_path) for line in expected]


def test_a_tracker_not_installed_is_named_with_its_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mlflow", None)  # how Python marks a module missing
    with pytest.raises(ImportError) as error:
        writers.MlflowWriter("logs")
    assert str(error.value).startswith("MlflowWriter needs the 'mlflow' package, which is not ")
    assert str(error.value).endswith("pip install 'jax-metrics-manager[mlflow]'.")


def test_a_tracker_or_default_writer_that_makes_nothing_is_refused_naming_the_fix(tmp_path):
    """`tracker = 'mlflow'` or `default_writer = @writers.create_default_writer()` in gin said
    only "'str' object is not callable" / "'MultiWriter' object is not callable"."""
    made = writers.NoopWriter()
    cases = [
        (
            {"tracker": "mlflow"},
            "tracker must be a function or class making a writer, such as writers.MlflowWriter, "
            "got 'mlflow'; in gin write a reference, @writers.MlflowWriter, not a str",
        ),
        (
            {"tracker": RecordingWriter, "default_writer": made},
            "default_writer must be a function or class making a writer, such as "
            f"writers.create_default_writer, got {made!r}; in gin drop the (): "
            "@writers.create_default_writer; in Python pass the class or function itself",
        ),
        (
            {"tracker": RecordingWriter, "default_writer": _files_only, "name": 5},
            "name must be a str such as 'mlflow', got 5",
        ),
    ]
    for kwargs, message in cases:
        with pytest.raises(TypeError) as raised:
            writers.create_tracker_writer(tmp_path, **kwargs)
        assert str(raised.value) == f"create_tracker_writer: {message}"
    assert list(tmp_path.iterdir()) == []
