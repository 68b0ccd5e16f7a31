"""Every gin file under configs/ parses on its own and builds what it names.

The test is generic: it globs `configs/**/*.gin`, so new configs are checked
without editing this file. For each file, with a fresh gin config:

1. gin parses it, with `configs/` on gin's search path (how includes such as
   `include 'writers/default.gin'` resolve; see configs/writers/default.gin);
2. every selector the file binds (directly or through its includes) is built
   through gin: classes are instantiated, `writers.create_default_writer` is
   called with a temporary logdir and its writer set is compared with the
   flags the config binds. Selectors that need arguments no config can give
   (a manager's name) get them from BUILD_ARGS; a selector this test does not
   know how to build fails the test with instructions. Nothing is skipped.
   Tracker writers stay local: W&B runs offline (tests/conftest.py) and MLflow
   logs to a SQLite store in the test's temporary directory (TEST_BINDINGS).

Every binding a file's comment block suggests (`#   writers.create_default_writer.log = True`)
is parsed on top of that file, so a renamed or misspelled parameter in a comment fails here.
"""

from __future__ import annotations

import glob
import inspect
import os
import pathlib
import re
from typing import Any

import gin
import gin.config_parser
import pytest

import writers
from tests.writers.tracker_stores import sqlite_store

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
GIN_FILES = sorted(CONFIGS.rglob("*.gin"))

# Arguments a config cannot provide because the caller always passes them.
BUILD_ARGS = {
    "metrics_manager.MetricsManager": lambda tmp: {"name": "train", "summary_dir": str(tmp)},
    "writers.create_default_writer": lambda tmp: {"logdir": str(tmp / "logs")},
    "writers.create_tracker_writer": lambda tmp: {"logdir": str(tmp / "logs")},
    "writers.WandbWriter": lambda tmp: {"logdir": str(tmp / "wandb"), "process_index": 0},
}

# Bindings replaced for the test (only where a config binds them): no files outside tmp.
TEST_BINDINGS = {
    "writers.MlflowWriter.tracking_uri": lambda tmp: sqlite_store(str(tmp / "mlflow")),
    "writers.MlflowWriter.artifact_location": lambda tmp: str(tmp / "mlflow" / "artifacts"),
}

WRITER_FLAGS = ("console", "tensorboard", "jsonl", "log")


# `#   selector.param = value  # why` or `#   MACRO = value` in a file's comment block.
SUGGESTED = re.compile(r"^#\s+((?:[A-Za-z_]\w*\.)+\w+|[A-Z_]+) = (.+?)(?:\s+#.*)?$")
SUGGESTIONS = [
    (path, match.group(1), match.group(2))
    for path in GIN_FILES
    for match in map(SUGGESTED.match, path.read_text().splitlines())
    if match
]


@pytest.fixture(autouse=True)
def fresh_gin():
    gin.clear_config()
    gin.add_config_file_search_path(str(CONFIGS))
    yield
    gin.clear_config()


def bound_selectors(path: pathlib.Path) -> list[str]:
    """Selectors bound by a gin file and the files it includes, in order."""
    selectors: list[str] = []
    parser = gin.config_parser.ConfigParser(
        path.read_text(), gin.config.ParserDelegate(skip_unknown=True)
    )
    for statement in parser:
        if isinstance(statement, gin.config_parser.IncludeStatement):
            selectors += bound_selectors(CONFIGS / statement.filename)
        elif isinstance(statement, gin.config_parser.BindingStatement) and statement.arg_name:
            selectors.append(statement.selector)  # (macros have no arg_name: values, not built)
    return list(dict.fromkeys(selectors))


def test_configs_exist():
    names = {p.relative_to(CONFIGS).as_posix() for p in GIN_FILES}
    assert {"writers/default.gin", "writers/console.gin", "writers/tensorboard.gin"} <= names


@pytest.mark.parametrize("path", GIN_FILES, ids=lambda p: p.relative_to(CONFIGS).as_posix())
def test_gin_file_parses_and_builds_what_it_names(path, tmp_path):
    text = path.read_text()
    assert text.startswith("#"), (
        f"{path} must open with a comment block (what, must set, overrides)"
    )
    gin.parse_config_file(str(path))
    selectors = bound_selectors(path)
    assert selectors, f"{path} binds nothing"
    for binding, value in TEST_BINDINGS.items():
        if binding.rsplit(".", 1)[0] in selectors:
            gin.bind_parameter(binding, value(tmp_path))
    for selector in selectors:
        built = _build(selector, tmp_path)
        _close(built)


def _build(selector: str, tmp_path: pathlib.Path) -> Any:
    configurable = gin.get_configurable(selector)
    args = BUILD_ARGS[selector](tmp_path) if selector in BUILD_ARGS else {}
    if selector in ("writers.create_default_writer", "writers.create_tracker_writer"):
        return _build_writer(configurable, args, tmp_path)
    if not inspect.isclass(configurable) and selector not in BUILD_ARGS:
        pytest.fail(
            f"don't know how to build {selector!r} (a function): add the arguments it "
            "needs to BUILD_ARGS in tests/test_gin_configs.py"
        )
    built = configurable(**args)
    writer = getattr(built, "writer", None)
    if isinstance(writer, writers.MultiWriter):  # e.g. a MetricsManager's writer set
        assert set(writer.writers) == _expected_writers(), (selector, sorted(writer.writers))
    return built


def _expected_writers() -> set[str]:
    try:
        bindings = gin.get_bindings("writers.create_default_writer")
    except ValueError:  # no config mentions the factory: its defaults apply
        bindings = {}
    defaults = inspect.signature(writers.create_default_writer).parameters
    names = {name for name in WRITER_FLAGS if bindings.get(name, defaults[name].default)}
    try:  # a config with a tracker adds it to the set (named by the factory's `name`)
        tracker = gin.get_bindings("writers.create_tracker_writer").get("name")
    except ValueError:  # no config mentions the tracker factory
        tracker = None
    return names | ({tracker} if tracker else set())


def _build_writer(factory: Any, args: dict[str, Any], tmp_path: pathlib.Path) -> Any:
    writer = factory(**args)
    expected = _expected_writers()
    assert set(writer.writers) == expected, sorted(writer.writers)
    writer.write_scalars(1, {"gin/check": 1.0})
    writer.close()
    logdir = tmp_path / "logs"
    assert (logdir / "metrics.jsonl").exists() == ("jsonl" in expected)
    has_events = logdir.exists() and any(logdir.glob("events.out.tfevents.*"))
    assert has_events == ("tensorboard" in expected)
    return None


def _close(obj: Any) -> None:
    close = getattr(obj, "close", None)
    if callable(close):
        close()


def test_comment_blocks_suggest_bindings():
    suggested = {path.relative_to(CONFIGS).as_posix() for path, _, _ in SUGGESTIONS}
    assert {"default.gin", "demo.gin", "writers/default.gin", "writers/wandb.gin"} <= suggested
    assert len(SUGGESTIONS) >= 40


@pytest.mark.parametrize(
    "path, selector, value",
    SUGGESTIONS,
    ids=[f"{p.relative_to(CONFIGS).as_posix()}:{s}" for p, s, _ in SUGGESTIONS],
)
def test_a_binding_suggested_in_a_comment_parses_on_its_file(path, selector, value):
    gin.parse_config_file(str(path))
    # As in a config that includes the file: its imports, then the line (a configurable the
    # file only imports, MetricsManager in writers/default.gin, is registered by that import).
    imports = [
        line for line in path.read_text().splitlines() if line.startswith(("from", "import"))
    ]
    # ValueError for a parameter that is not there
    gin.parse_config("\n".join([*imports, f"{selector} = {value}"]))
    if "." in selector:
        configurable, param = selector.rsplit(".", 1)
        assert param in gin.get_bindings(configurable)


def test_an_installed_wheel_finds_its_configs_from_any_directory(tmp_path):
    """pip installs the gin files with the package: `config_dir()` finds them, and the
    README's gin block works outside the source tree."""
    import shutil
    import subprocess
    import sys
    import sysconfig

    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    for name in ("metrics_manager", "writers", "configs"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path, source], check=True
    )
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", env], check=True)
    [wheel] = tmp_path.glob("jax_metrics_manager-*.whl")
    # --ignore-installed: with --prefix alone, pip uninstalls the project from the test's
    # own environment first (the editable install `make` made), which then lacks it.
    installed = subprocess.run([*pip, "show", "jax-metrics-manager"], capture_output=True)
    subprocess.run(
        [*pip, "install", "--no-deps", "--ignore-installed", "--prefix", env, wheel], check=True
    )
    after = subprocess.run([*pip, "show", "jax-metrics-manager"], capture_output=True)
    assert (after.returncode, after.stdout) == (installed.returncode, installed.stdout)
    lib = next(env.glob("lib/python3*/site-packages"))
    # The dependencies come from this environment; the project from the wheel alone.
    (lib / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    script = (
        "import gin, json, metrics_manager\n"
        "from metrics_manager.gin_utils import config_dir, configured\n"
        f"assert metrics_manager.__file__.startswith({str(lib)!r}), metrics_manager.__file__\n"
        "gin.add_config_file_search_path(config_dir())\n"
        "gin.parse_config_files_and_bindings(['default.gin'], ['writers.create_default_writer.console = False'])\n"
        "with configured(metrics_manager.MetricsManager)('train', 'runs') as m:\n"
        "    m.write_scalar('loss', 0.5, 1)\n"
        "print(config_dir())\n"
        "print(json.loads(open('runs/train/metrics.jsonl').read())['loss'])\n"
    )
    work = tmp_path / "elsewhere"
    work.mkdir()
    result = subprocess.run(
        [env / "bin" / "python", "-c", script], cwd=work, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [str(env / "share" / "jax-metrics-manager" / "configs"), "0.5"]
    shipped = sorted(p.relative_to(env / "share").as_posix() for p in env.glob("share/**/*.gin"))
    assert "jax-metrics-manager/configs/writers/wandb.gin" in shipped and len(shipped) == 10
    # PEP 561 markers: without them a user's mypy skips both packages as untyped.
    assert (lib / "metrics_manager" / "py.typed").is_file() and (
        lib / "writers" / "py.typed"
    ).is_file()
    # Installed where the interpreter's prefix is not (--target, --prefix on PYTHONPATH, a
    # --system-site-packages venv): config_dir() looked under the interpreter's prefix only.
    target = tmp_path / "target"
    subprocess.run([*pip, "install", "--no-deps", "--target", target, wheel], check=True)
    script = script.replace(repr(str(lib)), repr(str(target)))
    (tmp_path / "other").mkdir()
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path / "other",
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(target)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    configs = target / "share" / "jax-metrics-manager" / "configs"
    assert result.stdout.split() == [str(configs), "0.5"]


TOP_LEVEL = sorted(p.name for p in CONFIGS.glob("*.gin") if p.name != "demo.gin")
WRITER_SETS = ["writers/console.gin", "writers/jsonl.gin", "writers/tensorboard.gin"]
WRITER_SETS += ["writers/cluster.gin", "writers/default.gin"]


@pytest.mark.parametrize("top", TOP_LEVEL)
@pytest.mark.parametrize("writer_set", WRITER_SETS)
def test_a_writer_set_given_after_a_top_level_config_keeps_its_synchronous_writers(
    top, writer_set, tmp_path
):
    """`--gin_file=default.gin --gin_file=writers/console.gin`, as the README picks writers:
    the set picks the writers, and the manager's writers stay plain backends (a set that
    bound asynchronous = True put an AsyncWriter under the manager's own workers, so a
    failure failed a later summary's future)."""
    import metrics_manager
    from metrics_manager.gin_utils import configured

    gin.parse_config_files_and_bindings([top, writer_set], [])
    manager = configured(metrics_manager.MetricsManager)("train", str(tmp_path))
    try:
        inner = manager.writer.writers
        assert set(inner) == _expected_writers() and inner
        assert not [n for n, w in inner.items() if isinstance(w, writers.AsyncWriter)], inner
    finally:
        manager.close()


@pytest.mark.parametrize(
    "binding, message",
    [
        ("max_pending = '4'", "max_pending must be an int, got '4' (str); in gin write a number"),
        ("resume_step = '5000'", "resume_step must be an int, got '5000' (str); in gin write a"),
        ("system_metrics = 'False'", "got 'False'; in gin write True or False, without quotes"),
        (
            "writer_factory = 'writers.JsonlWriter'",
            "got 'writers.JsonlWriter'; in gin write a reference, @writers.JsonlWriter",
        ),
    ],
)
def test_a_quoted_manager_binding_is_refused_naming_the_gin_fix(binding, message, tmp_path):
    """A manager binding quoted in gin (`MetricsManager.max_pending = '4'`) names the fix,
    as the writers' (`flush_secs = '30'`) do: it said only "must be an int, got '4'"."""
    import metrics_manager
    from metrics_manager.gin_utils import configured

    gin.parse_config_files_and_bindings(
        ["default.gin"], [f"metrics_manager.MetricsManager.{binding}"]
    )
    with pytest.raises(TypeError, match=re.escape(message)):
        configured(metrics_manager.MetricsManager)("train", str(tmp_path))
    assert not (tmp_path / "train").exists()


def test_a_scoped_binding_reaches_only_a_manager_built_in_its_scope(tmp_path):
    """The README: `train/...` bindings apply inside `gin.config_scope("train")` only; a
    manager named "train" built outside it gets the unscoped ones (default.gin's)."""
    import metrics_manager
    from metrics_manager.gin_utils import configured

    gin.parse_config_files_and_bindings(
        ["default.gin"], ["train/writers.create_default_writer.tensorboard = False"]
    )
    make = configured(metrics_manager.MetricsManager)
    for name, scope in (("train", []), ("scoped", ["train"])):
        with gin.config_scope(scope), make(name, str(tmp_path)) as manager:
            manager.write_scalars(1, {"loss": 2.0})
    assert sorted(p.name for p in (tmp_path / "scoped").iterdir()) == ["metrics.jsonl"]
    assert len(list((tmp_path / "train").glob("events.out.tfevents.*"))) == 1


def test_a_factory_reference_called_in_gin_is_refused_naming_the_fix(tmp_path):
    """`writer_factory = @writers.create_default_writer()` hands the manager the writer gin
    made at parsing: it said "must be callable, got <writers.multi.MultiWriter object at ...>",
    not that the () is the mistake."""
    import metrics_manager
    from metrics_manager.gin_utils import configured

    config = tmp_path / "mine.gin"
    config.write_text(
        "from __gin__ import dynamic_registration\nimport metrics_manager\nimport writers\n"
        "include 'console.gin'\n"
        "metrics_manager.MetricsManager.writer_factory = @writers.create_default_writer()\n"
    )
    gin.parse_config_files_and_bindings([str(config)], [])
    with pytest.raises(TypeError) as raised:
        configured(metrics_manager.MetricsManager)("train", str(tmp_path))
    assert str(raised.value) == (
        "configured(MetricsManager): gin binds metrics_manager.MetricsManager.writer_factory = "
        "@writers.create_default_writer(), a call gin makes when it reads the binding: that is "
        "one writer, not a factory making one in each manager's directory. Drop the (): "
        "@writers.create_default_writer."
    )
    assert not (tmp_path / "train").exists()


@pytest.mark.parametrize(
    "binding",
    [
        "metrics_manager.MetricsManager.writer_factory = @writers.create_default_writer()",
        "writers.create_tracker_writer.tracker = @writers.MlflowWriter()",
    ],
)
def test_a_writer_gin_would_make_for_a_factory_is_refused_before_it_is_made(binding, tmp_path):
    """`tracker = @writers.MlflowWriter()` had gin make the writer, which create_tracker_writer
    then refused as no factory: its MLflow run stayed open and its flush thread ran on (one
    more thread after each refusal), as nothing returned the writer to close."""
    import threading

    import metrics_manager
    from metrics_manager.gin_utils import configured

    store = sqlite_store(str(tmp_path / "mlflow"))
    gin.parse_config_files_and_bindings(
        ["default.gin", "writers/mlflow.gin"],
        [
            f"writers.MlflowWriter.tracking_uri = '{store}'",
            "writers.create_default_writer.asynchronous = True",  # threads of its own
            binding,
        ],
    )
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(TypeError) as raised:
        configured(metrics_manager.MetricsManager)("train", str(tmp_path / "run"))
    assert {t.name for t in threading.enumerate()} - before == set()
    selector, made = binding.split(" = @")
    assert str(raised.value) == (
        f"configured(MetricsManager): gin binds {selector} = @{made}, a call gin makes when it "
        "reads the binding: that is one writer, not a factory making one in each manager's "
        f"directory. Drop the (): @{made[:-2]}."
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("writer_set", WRITER_SETS)
def test_a_writer_set_parsed_alone_is_refused_naming_the_factory_binding(writer_set, tmp_path):
    """`gin.parse_config_files_and_bindings(["writers/console.gin"], [])` binds the writer
    factory but not the manager's `writer_factory`: the manager made its default writers and
    wrote TensorBoard and JSONL files the set turns off. The call now refuses, and the fix it
    names (the binding, in a file importing metrics_manager and writers) writes the set's."""
    import metrics_manager
    from metrics_manager.gin_utils import configured

    gin.parse_config_files_and_bindings([writer_set], [])
    expected = _expected_writers()
    make = configured(metrics_manager.MetricsManager)
    with pytest.raises(ValueError) as raised:
        make("train", str(tmp_path))
    message = str(raised.value)
    found = ", ".join(
        f"{key} = {value!r}"
        for key, value in sorted(gin.get_bindings(writers.create_default_writer).items())
    )
    assert message.startswith(
        f"configured(MetricsManager): gin binds writers.create_default_writer ({found}) but "
        "not metrics_manager.MetricsManager.writer_factory, so these bindings would be ignored"
    )
    assert (
        "bind metrics_manager.MetricsManager.writer_factory = @writers.create_default_writer"
    ) in message
    assert "in a gin file that imports metrics_manager and writers" in message
    assert "parse a top-level config such as console.gin" in message
    assert list(tmp_path.iterdir()) == []
    fix = tmp_path / "fix.gin"
    fix.write_text(
        "from __gin__ import dynamic_registration\nimport metrics_manager\nimport writers\n"
        "metrics_manager.MetricsManager.writer_factory = @writers.create_default_writer\n"
    )
    gin.clear_config()  # parsing finalized (locked) the config
    gin.parse_config_files_and_bindings([writer_set, str(fix)], [])
    with make("train", str(tmp_path / "run")) as manager:
        assert set(manager.writers) == expected
        manager.write_scalars(1, {"loss": 0.5})
    run = tmp_path / "run" / "train"
    made = run.iterdir() if run.exists() else []  # console alone makes no directory
    files = {"events" if p.name.startswith("events.") else p.name for p in made}
    wanted = {"tensorboard": "events", "jsonl": "metrics.jsonl"}
    assert files == {file for writer, file in wanted.items() if writer in expected}
    if "jsonl" in expected:
        assert [line["loss"] for line in writers.read_jsonl(run)] == [0.5]


def test_a_suggested_resume_step_is_the_managers_as_the_readme_says():
    """README's Resuming: bind `MetricsManager.resume_step`, which the manager passes to its
    writer factory (and its tracker). writers/default.gin and cluster.gin suggested
    `writers.create_default_writer.resume_step = 5000`, which a manager with its own
    resume_step overrides and which no tracker gets. tensorboard.gin and writers/tensorboard.gin
    suggested `writers.create_default_writer.purge_step = 5000`, which with the manager's
    resume_step 50 raised "purge_step=5000 disagrees with resume_step=50"."""
    suggested = {
        (path.relative_to(CONFIGS).as_posix(), selector)
        for path, selector, _ in SUGGESTIONS
        if selector.endswith((".resume_step", ".purge_step"))
    }
    assert {path for path, _ in suggested} >= {
        "writers/default.gin",
        "writers/cluster.gin",
        "tensorboard.gin",
        "writers/tensorboard.gin",
    }
    assert {selector for _, selector in suggested} == {"metrics_manager.MetricsManager.resume_step"}


@pytest.mark.parametrize("top", ["default.gin", "writers/mlflow.gin"])
def test_a_bound_factory_logdir_is_refused_naming_the_managers_summary_dir(top, tmp_path):
    """`writers.create_default_writer.logdir = '<dir>'` was ignored without a word: the manager
    passes its own directory as the factory's logdir, so the files went to
    <summary_dir>/train and <dir> stayed empty."""
    import metrics_manager
    from metrics_manager.gin_utils import configured

    elsewhere = tmp_path / "elsewhere"
    store = (
        []
        if top == "default.gin"
        else [f"writers.MlflowWriter.tracking_uri = '{sqlite_store(str(tmp_path / 'ml'))}'"]
    )
    logdir = f"writers.create_default_writer.logdir = '{elsewhere}'"
    gin.parse_config_files_and_bindings(["default.gin", top], [logdir, *store])
    make = configured(metrics_manager.MetricsManager)
    with pytest.raises(ValueError) as raised:
        make("train", str(tmp_path / "run"))
    assert str(raised.value) == (
        f"configured(MetricsManager): gin binds writers.create_default_writer.logdir = "
        f"'{elsewhere}', which no writer reads: the manager passes its own directory, "
        "<summary_dir>/<name>, as the factory's logdir. The manager's summary_dir decides where "
        "the writers write: drop the binding and pass the directory as summary_dir where the "
        "manager is built (MetricsManager(name, summary_dir)), or, where the loop passes none, "
        "bind metrics_manager.MetricsManager.summary_dir instead."
    )
    assert not elsewhere.exists() and not (tmp_path / "run").exists()
    gin.clear_config()  # parsing finalized (locked) the config
    gin.parse_config_files_and_bindings(["default.gin", top], store)
    with make("train", str(elsewhere)) as manager:
        manager.write_scalars(1, {"loss": 0.5})
    assert [line["loss"] for line in writers.read_jsonl(elsewhere / "train")] == [0.5]


@pytest.mark.parametrize(
    "top, off", [("console.gin", "console"), ("tensorboard.gin", "tensorboard")]
)
def test_a_writer_set_turning_off_every_writer_is_refused_naming_the_bindings(
    top, off, tmp_path, capsys
):
    """`console.gin` with `writers.create_default_writer.console = False` built a manager with
    no writer at all: every summary was written nowhere, and nothing said so."""
    import metrics_manager
    from metrics_manager.gin_utils import configured

    gin.parse_config_files_and_bindings([top], [f"writers.create_default_writer.{off} = False"])
    make = configured(metrics_manager.MetricsManager)
    with pytest.raises(ValueError) as raised:
        make("train", str(tmp_path))
    assert str(raised.value) == (
        "configured(MetricsManager): gin binds writers.create_default_writer with console = "
        "False, tensorboard = False, jsonl = False, log = False, so it makes no writer and "
        "every summary would be written nowhere. Turn one on, e.g. "
        "writers.create_default_writer.console = True, or parse a writer set that writes "
        "(console.gin, default.gin, tensorboard.gin)."
    )
    assert list(tmp_path.iterdir()) == []
    gin.clear_config()  # parsing finalized (locked) the config
    gin.parse_config_files_and_bindings(
        [top],
        [f"writers.create_default_writer.{off} = False"]
        + ["writers.create_default_writer.console = True"],
    )
    capsys.readouterr()
    with make("train", str(tmp_path)) as manager:
        assert set(manager.writer.writers) == {"console"}
        manager.write_scalars(1, {"loss": 0.25})
    assert "loss  0.25" in capsys.readouterr().out


TWO_TRACKERS = """from __gin__ import dynamic_registration
import writers

include 'writers/wandb.gin'
include 'writers/mlflow.gin'

# mlflow.gin's create_tracker_writer replaced wandb.gin's: W&B comes back as the
# default_writer of MLflow's, a create_tracker_writer of its own in the scope `wandb`.
writers.create_tracker_writer.default_writer = @wandb/writers.create_tracker_writer
wandb/writers.create_tracker_writer:
  tracker = @writers.WandbWriter
  name = 'wandb'
  default_writer = @writers.create_default_writer
"""


@pytest.mark.parametrize(
    "files, unread, given",
    [
        (
            ["default.gin", "writers/wandb.gin", "writers/mlflow.gin"],
            "writers.WandbWriter (project = 'jax-metrics-manager')",
            "it makes metrics_manager.MetricsManager.writer_factory = "
            "@writers.create_tracker_writer, whose tracker = @writers.MlflowWriter. Two writer "
            "sets were given, writers/wandb.gin and then writers/mlflow.gin",
        ),
        (
            ["default.gin", "writers/mlflow.gin", "console.gin"],
            "writers.MlflowWriter (experiment_name = 'jax-metrics-manager', tracking_uri = "
            "'{store}'); writers.create_tracker_writer (default_writer = "
            "@writers.create_default_writer, name = 'mlflow', tracker = @writers.MlflowWriter)",
            "it makes metrics_manager.MetricsManager.writer_factory = "
            "@writers.create_default_writer. Two writer sets were given, writers/mlflow.gin and "
            "then a config binding writer_factory again (console.gin, default.gin, "
            "tensorboard.gin)",
        ),
    ],
)
def test_a_tracker_set_replaced_by_a_later_set_is_refused_naming_both(
    files, unread, given, tmp_path
):
    """Of two writer sets the last one's bindings win: `writers/wandb.gin` then
    `writers/mlflow.gin` logged to MLflow alone (W&B's bindings unread), and
    `writers/mlflow.gin` then `console.gin` to the console alone, without a word. The call
    now refuses, and the ways it names combine them."""
    import metrics_manager
    from metrics_manager.gin_utils import configured

    store = sqlite_store(str(tmp_path / "mlflow"))
    gin.parse_config_files_and_bindings(files, [f"writers.MlflowWriter.tracking_uri = '{store}'"])
    make = configured(metrics_manager.MetricsManager)
    with pytest.raises(ValueError) as raised:
        make("train", str(tmp_path / "run"))
    assert str(raised.value) == (
        f"configured(MetricsManager): gin binds {unread.format(store=store)}, which no writer "
        f"the manager makes reads: {given}, and the last one's bindings replaced the first's. "
        "A tracker set (writers/wandb.gin, writers/mlflow.gin) adds its tracker to the writers "
        "configured before it: parse it last (console.gin then writers/mlflow.gin writes the "
        "console and MLflow). It adds one tracker: for both, make one the other's "
        "default_writer, as the README shows under 'Choose writers with gin'."
    )
    assert not (tmp_path / "run").exists()
    gin.clear_config()  # parsing finalized (locked) the config
    gin.parse_config_files_and_bindings(
        ["console.gin", "writers/mlflow.gin"], [f"writers.MlflowWriter.tracking_uri = '{store}'"]
    )
    with make("train", str(tmp_path / "one")) as manager:
        assert set(manager.writer.writers) == {"console", "mlflow"}
    gin.clear_config()
    both = tmp_path / "both.gin"
    both.write_text(TWO_TRACKERS)
    readme = (REPO / "README.md").read_text()
    assert TWO_TRACKERS.split("\n\n", 1)[1] in readme  # the README's combination, as tested
    gin.parse_config_files_and_bindings(
        ["default.gin", str(both)], [f"writers.MlflowWriter.tracking_uri = '{store}'"]
    )
    with make("train", str(tmp_path / "two")) as manager:
        assert set(manager.writer.writers) == {"console", "tensorboard", "jsonl", "wandb", "mlflow"}
        manager.write_scalars(1, {"loss": 0.5})
    assert [line["loss"] for line in writers.read_jsonl(tmp_path / "two" / "train")] == [0.5]
    assert len(glob.glob(str(tmp_path / "two" / "train" / "wandb" / "offline-run-*"))) == 1
