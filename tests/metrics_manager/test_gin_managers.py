"""Gin: the top-level configs build train and eval managers that write separate runs.

The top-level configs are parsed as a user would (configs/ on gin's search
path; `tests/test_gin_configs.py` parses every gin file); managers are built
through gin and in plain Python; what they write is read back with
TensorBoard's `EventAccumulator` and `json`.
"""

from __future__ import annotations

import doctest
import errno
import functools
import json
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import gin
import jax
import jax.numpy as jnp
import pytest
from tensorboard.backend.event_processing import event_accumulator

import metrics_manager
import writers
from metrics_manager import gin_utils
from metrics_manager.manager import MetricsManager
from metrics_manager.metrics import AveragePerStep, StepsPerTime, Sum
from tests.writers.tracker_stores import wandb_history, wandb_run_files

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TOP_LEVEL = {
    # config -> (writers inside the MultiWriter, files each run directory holds)
    "default.gin": ({"console", "tensorboard", "jsonl"}, {"events", "metrics.jsonl"}),
    "console.gin": ({"console"}, set()),
    "tensorboard.gin": ({"tensorboard"}, {"events"}),
}


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    gin.add_config_file_search_path(str(CONFIGS))
    yield
    gin.clear_config()


def markdown_to_html(markdown: str) -> str:
    """TensorBoard's own markdown renderer, as its text plugin uses it."""
    with warnings.catch_warnings():
        # Importing it warns that html5lib's sanitizer (vendored in bleach) is deprecated.
        warnings.simplefilter("ignore", DeprecationWarning)
        from tensorboard import plugin_util
    return plugin_util.markdown_to_safe_html(markdown)


def parse(config: str, *bindings: str) -> None:
    gin.parse_config_files_and_bindings([config], list(bindings))


def run_files(run_dir: Path) -> set[str]:
    if not run_dir.exists():
        return set()
    return {"events" if p.name.startswith("events") else p.name for p in run_dir.iterdir()}


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def write_window(manager: MetricsManager, step: int, loss: float) -> None:
    manager.start_duration_timer(block_on=jnp.ones(2))
    metrics = {
        "loss": AveragePerStep(total=jnp.float32(loss * 2)),
        "timing/steps_per_second": StepsPerTime(),
    }
    manager.write_metrics_summary(metrics, step, num_steps=2).result()


def test_docstring_examples_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # write_gin_config's uses tempfile.mkdtemp()
    monkeypatch.setattr("tempfile.tempdir", None)
    result = doctest.testmod(gin_utils)
    assert result.attempted >= 6
    assert result.failed == 0
    assert (next(tmp_path.iterdir()) / "config.gin").read_text() == "a.b = 1"


@pytest.mark.parametrize("config", sorted(TOP_LEVEL))
def test_one_config_gives_train_and_eval_runs(config, tmp_path, capsys):
    expected_writers, expected_files = TOP_LEVEL[config]
    parse(config)
    make = gin_utils.configured(MetricsManager)
    with make("train", tmp_path) as train, make("eval/glue", tmp_path) as evaluation:
        assert sorted(train.writer.writers) == sorted(expected_writers)
        write_window(train, 2, loss=3.0)
        write_window(evaluation, 2, loss=5.0)
    train_dir, eval_dir = tmp_path / "train", tmp_path / "eval" / "glue"
    assert train.summary_dir == str(train_dir) and evaluation.summary_dir == str(eval_dir)
    assert run_files(train_dir) == expected_files
    assert run_files(eval_dir) == expected_files
    if "events" in expected_files:
        assert scalars(train_dir)["loss"] == [(2, 3.0)]
        assert scalars(eval_dir)["loss"] == [(2, 5.0)]
    if "metrics.jsonl" in expected_files:
        (line,) = [json.loads(s) for s in (eval_dir / "metrics.jsonl").read_text().splitlines()]
        assert line["collection"] == "eval/glue" and line["step"] == 2 and line["loss"] == 5.0
    out = capsys.readouterr().out
    assert (("loss" in out) and ("eval/glue" in out)) == ("console" in expected_writers)


def test_writer_bindings_take_effect_through_gin_and_not_behind_its_back(tmp_path):
    parse(
        "default.gin",
        "writers.create_default_writer.jsonl = False",
        "writers.create_default_writer.console = False",
    )
    through_gin = gin_utils.configured(MetricsManager)("train", tmp_path)
    assert sorted(through_gin.writers) == ["tensorboard"]
    through_gin.close()
    assert run_files(tmp_path / "train") == {"events"}
    # A manager built in plain Python does not read gin's registry: its defaults hold.
    plain = MetricsManager("eval/glue", tmp_path, writer_factory=lambda d: writers.NoopWriter())
    plain.close()
    assert not (tmp_path / "eval" / "glue" / "metrics.jsonl").exists()


def test_with_a_top_level_config_a_reserved_key_is_refused_at_the_call(tmp_path):
    """JSONL reserves `time`: the call raises at once, naming the key and the fix."""
    parse("default.gin", "writers.create_default_writer.console = False")
    manager = gin_utils.configured(MetricsManager)("train", tmp_path)
    with pytest.raises(ValueError, match=r"\['time'\] are reserved.*'train/time'"):
        manager.write_metrics_summary({"time": Sum(jnp.float32(1.5))}, 3, 1)
    manager.write_scalar("lr", 0.1, 3)
    manager.close()
    assert scalars(tmp_path / "train")["lr"] == [(3, pytest.approx(0.1))]


def test_manager_binding_replaces_the_factory(tmp_path):
    made = []

    def recording_factory(logdir):
        made.append(logdir)
        return writers.NoopWriter()

    gin.external_configurable(recording_factory, module="test_gin")
    parse(
        "default.gin", "metrics_manager.MetricsManager.writer_factory = @test_gin.recording_factory"
    )
    gin_utils.configured(MetricsManager)("train", tmp_path).close()
    assert made == [str(tmp_path / "train")]


class TaggedWriter(writers.NoopWriter):
    """A user's writer class, referenced from a gin file with dynamic registration."""

    made: list[TaggedWriter] = []

    def __init__(self, logdir, collection=None, resume_step=None, tag="none"):
        self.logdir, self.collection, self.resume_step, self.tag = (
            logdir,
            collection,
            resume_step,
            tag,
        )
        TaggedWriter.made.append(self)


def test_a_writer_class_registered_dynamically_gets_the_collection_and_resume_step(tmp_path):
    # gin's wrapper of such a class reports (*args, **kwargs): the manager passed it no
    # collection, and refused resume_step ("needs a writer_factory taking resume_step").
    gin.parse_config(
        f"""
        from __gin__ import dynamic_registration
        import metrics_manager
        import {__name__}

        metrics_manager.MetricsManager.writer_factory = @{__name__}.TaggedWriter
        metrics_manager.MetricsManager.resume_step = 5
        {__name__}.TaggedWriter.tag = "from gin"
        """
    )
    gin_utils.configured(metrics_manager.MetricsManager)("train", tmp_path).close()
    (made,) = TaggedWriter.made
    assert (made.logdir, made.collection, made.resume_step, made.tag) == (
        str(tmp_path / "train"),
        "train",
        5,
        "from gin",
    )


def test_operative_config_goes_to_config_gin_and_tensorboard_text(tmp_path):
    parse("default.gin", "writers.create_default_writer.console = False")
    make = gin_utils.configured(MetricsManager)
    with make("train", tmp_path) as train, make("eval/glue", tmp_path):
        text = gin_utils.write_gin_config(tmp_path, train, step=0)
        write_window(train, 2, loss=1.0)
    assert "metrics_manager.MetricsManager.writer_factory = @writers.create_default_writer" in text
    assert "writers.create_default_writer.console = False" in text
    assert (tmp_path / "config.gin").read_text() == text
    acc = event_accumulator.EventAccumulator(str(tmp_path / "train"), size_guidance={"tensors": 0})
    acc.Reload()
    (event,) = acc.Tensors("config")
    assert event.step == 0
    markdown = event.tensor_proto.string_val[0].decode()
    assert markdown == gin_utils.config_markdown(text)
    # TensorBoard's own markdown renderer shows it as one code block holding the config.
    html = markdown_to_html(markdown)
    assert html.startswith("<pre><code>") and html.count("<pre>") == 1
    assert "metrics_manager.MetricsManager.writer_factory = @writers.create_default_writer" in html
    lines = [json.loads(s) for s in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["step"] == 0 and lines[0]["config"] == markdown
    assert not (tmp_path / "eval" / "glue" / "config.gin").exists()


def test_write_gin_config_called_too_early_says_the_file_holds_no_binding(tmp_path, caplog):
    # Before parsing, or before anything gin configures was built, config.gin was written
    # with no binding (only the imports) and nothing said so.
    assert gin_utils.write_gin_config(tmp_path / "a") == ""
    parse("default.gin", "writers.create_default_writer.console = False")
    early = gin_utils.write_gin_config(tmp_path / "b")
    assert (tmp_path / "b" / "config.gin").read_text() == early and " = " not in early
    messages = [r.getMessage() for r in caplog.records if r.name == gin_utils.__name__]
    assert messages == [
        "write_gin_config: config.gin holds no binding; no gin config was parsed: call "
        "gin.parse_config_files_and_bindings first",
        "write_gin_config: config.gin holds no binding; none of the 9 parsed bindings is "
        "operative, as nothing gin configures has been called yet: call it after building the "
        "managers through configured(), or pass config_str=gin.config_str()",
    ]
    caplog.clear()
    gin_utils.configured(MetricsManager)("train", tmp_path).close()
    text = gin_utils.write_gin_config(tmp_path / "c")
    assert "writers.create_default_writer.console = False" in text
    assert not [r for r in caplog.records if r.name == gin_utils.__name__]


def test_t5x_summarize_gin_config_writes_the_file_and_the_text(tmp_path):
    # T5X's `gin_utils.summarize_gin_config(model_dir, summary_writer, step)` raised
    # AttributeError here; it calls write_gin_config, with the same arguments.
    factory = functools.partial(writers.create_default_writer, console=False, tensorboard=False)
    with MetricsManager("train", tmp_path, writer_factory=factory) as train:
        text = gin_utils.summarize_gin_config(tmp_path, train, 3, config_str="a.b = 1")
    assert text == "a.b = 1" and (tmp_path / "config.gin").read_text() == "a.b = 1"
    ((line,),) = [writers.read_jsonl(tmp_path / "train")]
    assert (line["step"], line["config"]) == (3, "    a.b = 1\n")


def test_t5x_summarize_gin_config_takes_its_arguments_by_their_t5x_names(tmp_path):
    # T5X's train.py and infer.py pass them by keyword: `summary_writer=` raised TypeError
    # "write_gin_config() got an unexpected keyword argument 'summary_writer'".
    factory = functools.partial(writers.create_default_writer, console=False, tensorboard=False)
    with MetricsManager("train", tmp_path, writer_factory=factory) as train:
        gin_utils.summarize_gin_config(
            model_dir=tmp_path, summary_writer=train, step=4, config_str="a.b = 2"
        )
    gin_utils.summarize_gin_config(model_dir=tmp_path / "infer", summary_writer=None, step=0)
    assert (tmp_path / "config.gin").read_text() == "a.b = 2"
    assert (tmp_path / "infer" / "config.gin").exists()
    ((line,),) = [writers.read_jsonl(tmp_path / "train")]
    assert (line["step"], line["config"]) == (4, "    a.b = 2\n")


def test_other_processes_write_no_config_file(monkeypatch, tmp_path):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    with MetricsManager("train", tmp_path) as manager:
        text = gin_utils.write_gin_config(tmp_path / "model", manager, config_str="a.b = 1")
    assert text == "a.b = 1"
    assert list(tmp_path.iterdir()) == []


def test_markdown_is_one_code_block_even_with_markdown_in_the_config():
    config = "# Parameters for `x`:\n# ===\n\nx.y = '**not bold**'\n```\nz = 1"
    html = markdown_to_html(gin_utils.config_markdown(config))
    assert html.count("<pre><code>") == 1 and "<strong>" not in html
    assert html.endswith("z = 1\n</code></pre>")


def test_write_gin_config_checks_its_inputs():
    with pytest.raises(
        TypeError,
        match=r"(?s)write_gin_config: 2 problems:.*model_dir must be a path.*config_str must be a str",
    ):
        gin_utils.write_gin_config(3, config_str=4)  # type: ignore[arg-type]


_FULL_DISK = """
import resource, signal, sys
from metrics_manager import gin_utils
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: EFBIG, not death
resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
gin_utils.write_gin_config(sys.argv[1], config_str="a.b = 1\\n")
"""


def test_a_config_gin_that_cannot_be_written_names_the_file_and_the_fix(tmp_path):
    # A full disk raised the bare "[Errno 27] File too large", naming neither the file nor
    # what to do; a file where model_dir should be, "[Errno 17] File exists".
    run = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert run.returncode == 1
    assert f"OSError: [Errno {errno.EFBIG}] File too large" in run.stderr
    assert f"write_gin_config: writing {tmp_path / 'config.gin'} failed; free space there" in (
        run.stderr
    )
    assert list(tmp_path.iterdir()) == []  # no half config, no temporary file
    model_dir = tmp_path / "model"
    model_dir.write_text("not a directory\n")
    with pytest.raises(FileExistsError) as raised:
        gin_utils.write_gin_config(model_dir, config_str="a.b = 1\n")
    assert raised.value.__notes__ == [
        f"write_gin_config: writing {model_dir / 'config.gin'} failed; a file stands where a "
        "directory of that path should be: move it"
    ]


def test_configured_calls_the_plain_function_when_gin_never_saw_it():
    def untouched(x: int = 1) -> int:
        return x

    made = gin_utils.configured(untouched)
    assert (made(), made(x=3), made.__name__, made.__wrapped__) == (1, 3, "untouched", untouched)


def test_configured_before_parsing_applies_the_bindings_parsed_before_the_call(tmp_path):
    # Made before parsing, it was MetricsManager itself: console.gin's manager got the
    # default writers and wrote TensorBoard and JSONL files.
    make = gin_utils.configured(MetricsManager)
    parse("console.gin")
    with make("train", tmp_path) as train:
        assert sorted(train.writer.writers) == ["console"]
        write_window(train, 2, loss=3.0)
    assert run_files(tmp_path / "train") == set()


@pytest.mark.parametrize("resume_by", ["argument", "gin"])
def test_a_tracker_config_resumes_every_writer_from_the_managers_resume_step(tmp_path, resume_by):
    # writers/wandb.gin's factory took no resume_step: MetricsManager(resume_step=50) raised,
    # and binding WandbWriter.resume_step alone left metrics.jsonl with steps 60-100 twice.
    bindings = [
        "writers.WandbWriter.mode = 'offline'",
        "writers.WandbWriter.process_index = 0",
        "writers.WandbWriter.run_id = 'exp'",
        "writers.create_default_writer.console = False",
        "metrics_manager.MetricsManager.system_metrics = False",
    ]
    for start, resume in ((10, None), (60, 50)):
        gin.clear_config()
        resuming = [f"metrics_manager.MetricsManager.resume_step = {resume}"] * (
            resume is not None and resume_by == "gin"
        )
        gin.parse_config_files_and_bindings(
            ["default.gin", "writers/wandb.gin"], bindings + resuming
        )
        kwargs = {"resume_step": resume} if resume is not None and resume_by == "argument" else {}
        with gin_utils.configured(MetricsManager)("train", tmp_path, **kwargs) as manager:
            assert sorted(manager.writers) == ["jsonl", "tensorboard", "wandb"]
            for step in range(start, 101 if resume is None else 81, 10):
                manager.write_scalars(step, {"loss": float(step if resume is None else -step)})
    lines = writers.read_jsonl(tmp_path / "train")
    assert [(x["step"], x["loss"]) for x in lines] == [(s, float(s)) for s in range(10, 51, 10)] + [
        (s, -float(s)) for s in (60, 70, 80)
    ]
    old, new = wandb_run_files(str(tmp_path / "train"))
    assert sorted(wandb_history(old)) == list(range(10, 101, 10))
    assert wandb_history(new) == {s: {"loss": -float(s)} for s in (60, 70, 80)}


def test_a_config_binding_the_manager_but_not_its_factory_is_refused(tmp_path):
    """A user's config that includes a writer set and binds `MetricsManager.uptime` but not
    `writer_factory`: gin's own wrapper was returned, which made the default writers (events
    and metrics.jsonl under console.gin's set)."""
    config = tmp_path / "mine.gin"
    config.write_text(
        "from __gin__ import dynamic_registration\nimport metrics_manager\nimport writers\n"
        "include 'writers/console.gin'\nmetrics_manager.MetricsManager.uptime = True\n"
    )
    parse(str(config))
    make = gin_utils.configured(MetricsManager)
    with pytest.raises(ValueError, match=r"but not metrics_manager\.MetricsManager\.writer_f"):
        make("train", tmp_path)
    assert run_files(tmp_path / "train") == set()
    # Passed by the caller, the factory is the caller's choice.
    with make("train", tmp_path, writer_factory=writers.JsonlWriter) as train:
        train.write_scalars(1, {"loss": 0.5})
    assert [line["loss"] for line in writers.read_jsonl(tmp_path / "train")] == [0.5]


def _with_writer_class_as_factory(kind: str, through: str) -> Callable[..., MetricsManager]:
    """A maker of MetricsManagers given `writers.<kind>` itself as the writer factory, bound
    in gin or passed in Python."""
    if through == "gin":
        gin.parse_config(
            "from __gin__ import dynamic_registration\nimport metrics_manager\nimport writers\n"
            f"metrics_manager.MetricsManager.writer_factory = @writers.{kind}\n"
        )
        return gin_utils.configured(MetricsManager)
    return functools.partial(MetricsManager, writer_factory=getattr(writers, kind))


@pytest.mark.parametrize("through", ["python", "gin"])
@pytest.mark.parametrize("kind", ["ConsoleWriter", "LoggingWriter"])
def test_a_writer_class_taking_no_directory_as_the_factory_names_the_fix(
    kind, through, tmp_path, capsys
):
    """`writer_factory = @writers.ConsoleWriter` passed the summary dir as the stream: "stream
    must be a text stream such as sys.stderr ..., got '<dir>/train' (str)" named no fix
    (LoggingWriter: "got multiple values for argument 'collection'")."""
    make = _with_writer_class_as_factory(kind, through)
    with pytest.raises(TypeError) as raised:
        make("train", tmp_path)
    first = {"ConsoleWriter": "stream", "LoggingWriter": "collection"}[kind]
    gin_set = {
        "ConsoleWriter": "include 'writers/console.gin'",
        "LoggingWriter": "writers.create_default_writer.log = True (writers/cluster.gin has it)",
    }[kind]
    assert str(raised.value).split("\n")[0] == (  # gin adds "In call to configurable ..."
        f"MetricsManager('train'): writer_factory is {kind}, which would take the summary dir "
        f"as its {first} (it writes no files); pass writer_factory=lambda logdir, "
        f"collection=None: writers.{kind}(collection=collection), or in gin a writer set: "
        f"{gin_set}, with metrics_manager.MetricsManager.writer_factory = "
        "@writers.create_default_writer (as configs/console.gin has)"
    )
    assert not (tmp_path / "train").exists()
    # The fix it names: the writer, with the manager's name as its collection.
    factory = lambda logdir, collection=None: getattr(writers, kind)(collection=collection)  # noqa: E731
    with MetricsManager("train", tmp_path, writer_factory=factory) as manager:
        assert list(manager.writers) == [kind]
        manager.write_scalars(1, {"loss": 0.5})
    if kind == "ConsoleWriter":
        assert capsys.readouterr().out.splitlines()[:2] == ["step 1 | train", "  loss  0.5"]


@pytest.mark.parametrize("through", ["python", "gin"])
@pytest.mark.parametrize(
    ("kind", "first"), [("WandbWriter", "project"), ("MlflowWriter", "experiment_name")]
)
def test_a_tracker_class_as_the_factory_names_its_first_parameter(kind, first, through, tmp_path):
    """`writer_factory = @writers.WandbWriter` in gin said "would take the summary dir as its
    args": gin's wrapper of the class reports `(*args, **kwargs)`."""
    make = _with_writer_class_as_factory(kind, through)
    with pytest.raises(TypeError) as raised:
        make("train", tmp_path)
    config = kind.removesuffix("Writer").lower()
    assert str(raised.value).split("\n")[0] == (  # gin adds "In call to configurable ..."
        f"MetricsManager('train'): writer_factory is {kind}, which would take the summary dir "
        f"as its {first}; pass writer_factory=functools.partial(writers.create_tracker_writer, "
        f"tracker=functools.partial(writers.{kind}, ...)), the default writers and it (gin: "
        f"configs/writers/{config}.gin)"
    )
    assert (CONFIGS / "writers" / f"{config}.gin").is_file()
    assert not (tmp_path / "train").exists()


def test_a_console_writer_subclass_taking_the_directory_is_a_factory(tmp_path):
    class DirConsole(writers.ConsoleWriter):
        def __init__(self, logdir, collection=None):
            super().__init__(collection=collection)
            self.logdir = logdir

    with MetricsManager("train", tmp_path, writer_factory=DirConsole) as manager:
        (made,) = manager.writers.values()
    assert made.logdir == str(tmp_path / "train")
