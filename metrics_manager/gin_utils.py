"""Gin on the host side (never import it from jitted code): bindings and the operative config.

With `from __gin__ import dynamic_registration` bindings apply only to calls made through gin;
`configured(fn)` is that call path for objects built in plain Python. `write_gin_config` saves
the operative config as T5X does, to `<model_dir>/config.gin` and as the text summary `config`:

  gin.add_config_file_search_path(config_dir())  # default.gin includes writers/*.gin
  gin.parse_config_files_and_bindings(["default.gin"], [])
  with configured(MetricsManager)("train", model_dir) as train:
    write_gin_config(model_dir, train, step=0)
"""

import functools
import inspect
import logging
import os
import site
import sys
import sysconfig
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

import gin
import jax

import writers
from writers import _storage
from writers._checks import Problems, url_problem

F = TypeVar("F", bound=Callable[..., Any])

CONFIG_FILENAME = "config.gin"
CONFIG_SUMMARY_KEY = "config"
_LOG = logging.getLogger(__name__)
# create_default_writer's flags, each turning on one writer.
_WRITER_FLAGS = ("console", "tensorboard", "jsonl", "log")


def _bindings(config_str: str) -> int:
    """How many `name = value` lines a gin config text holds (imports and comments aside)."""
    return sum(" = " in line and not line.startswith("#") for line in config_str.splitlines())


def config_dir() -> str:
    """The directory of this project's gin files (`default.gin`, `writers/*.gin`): the source
    tree's `configs/`, or where pip installed them (`<prefix>/share/jax-metrics-manager/configs/`).

    Raises:
      FileNotFoundError: neither holds them (naming where it looked).
    """
    installed = os.path.join("share", "jax-metrics-manager", "configs")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # or site-packages
    # The install's prefix is not always the interpreter's: `pip install --prefix` or
    # `--target` on PYTHONPATH, a venv with --system-site-packages over the install.
    places = [
        os.path.join(root, "configs"),
        os.path.join(root, installed),  # pip install --target
        os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(root))), installed),
        os.path.join(sysconfig.get_path("data"), installed),
        os.path.join(site.getuserbase(), installed),  # pip install --user
    ]
    for place in places:
        if os.path.isfile(os.path.join(place, "writers", "default.gin")):
            return place
    raise FileNotFoundError(
        f"config_dir: no writers/default.gin in {places}; reinstall jax-metrics-manager, or "
        "pass the configs/ directory of a checkout to gin.add_config_file_search_path."
    )


class TextWriting(Protocol):
    """Anything with `write_texts(step, texts)`: a `MetricsManager` or a writer."""

    def write_texts(self, step: int, texts: dict[str, str]) -> None: ...


def configured(fn: F) -> F:
    """Returns gin's wrapper of `fn` if a parsed config mentions it, else a stand-in for `fn`
    that looks it up in gin at each call.

    Made before parsing (`make = configured(MetricsManager)` at import, then
    `gin.parse_config_files_and_bindings`), the stand-in applies the bindings parsed by the
    time it is called: returning `fn` itself there dropped them without a word (console.gin's
    manager wrote TensorBoard and JSONL files). While gin knows nothing of `fn`, a call is
    `fn`'s own.

    For an `fn` taking `writer_factory` (a `MetricsManager`), it is always the stand-in, which
    refuses a call that leaves `writer_factory` to gin where gin binds none but binds
    `writers.create_default_writer`: a writer set parsed alone (`writers/console.gin`) configures
    a factory the manager never calls, and its default writers wrote TensorBoard and JSONL
    files the set turns off.

    Raises (at the call):
      TypeError: gin binds a writer factory as a call (`@writers.MlflowWriter()`), refused
        before gin makes that writer.
      ValueError: the writer set's bindings would be ignored (naming them and the fix), as
        would a tracker set's that a later writer set replaced (naming both sets), or gin
        binds the writer factory's `logdir`, which the manager always passes itself, or turns
        off every writer of `writers.create_default_writer` (naming the bindings).

    Example:
      >>> import writers
      >>> make_writer = configured(writers.create_default_writer)
      >>> make_writer(None, console=False).close()
    """
    try:
        signature: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without one
        signature = None
    takes_factory = signature is not None and "writer_factory" in signature.parameters
    if not takes_factory:
        try:
            return gin.get_configurable(fn)
        except ValueError:  # no parsed config names `fn` yet
            pass

    @functools.wraps(fn)
    def through_gin(*args: Any, **kwargs: Any) -> Any:
        try:
            target = gin.get_configurable(fn)
        except ValueError:  # still none: the plain call
            target = fn
        if (
            takes_factory
            and signature is not None
            and _factory_left_to_gin(signature, args, kwargs)
        ):
            _refuse_a_writer_made_in_gin(fn)
            _refuse_an_unread_writer_set(fn)
            _refuse_a_replaced_writer_set(fn)
            _refuse_a_bound_logdir(fn)
            _refuse_a_set_writing_nothing(fn)
        return target(*args, **kwargs)

    return cast(F, through_gin)


def _factory_left_to_gin(signature: inspect.Signature, args: Any, kwargs: Any) -> bool:
    """Whether a call leaves `writer_factory` to gin (or to `fn`'s default): not the caller's."""
    try:
        return "writer_factory" not in signature.bind_partial(*args, **kwargs).arguments
    except TypeError:  # `fn` itself says what is wrong with the call
        return False


def _name(fn: Callable[..., Any]) -> str:
    """`fn` as a gin file names it: `metrics_manager.MetricsManager` where the package exports
    it, else its module's path."""
    package = fn.__module__.split(".")[0]
    public = getattr(sys.modules.get(package), fn.__name__, None) is fn
    return f"{package}.{fn.__name__}" if public else f"{fn.__module__}.{fn.__qualname__}"


def _gin_bindings(fn: Callable[..., Any]) -> dict[str, Any]:
    """What gin binds of `fn` in the current scope, references unresolved (none: {})."""
    try:
        return gin.get_bindings(fn, resolve_references=False)
    except ValueError:  # gin knows nothing of `fn`
        return {}


def _referenced(value: Any) -> str | None:
    """The selector a gin reference names (`@writers.create_default_writer`: its own), or
    None for any other value."""
    return value.selector if isinstance(value, gin.config.ConfigurableReference) else None


def _refuse_a_writer_made_in_gin(fn: Callable[..., Any]) -> None:
    """Raises where gin binds a writer factory as a call (`@writers.MlflowWriter()`), before gin
    makes it: refused only once made, the writer was left open (MLflow's run and flush thread,
    TensorBoard's files), as nothing returned it to close."""
    factories = [(_name(fn), "writer_factory", _gin_bindings(fn).get("writer_factory"))]
    tracker = _gin_bindings(writers.create_tracker_writer)
    factories += [
        ("writers.create_tracker_writer", k, tracker.get(k)) for k in ("tracker", "default_writer")
    ]
    for selector, param, value in factories:
        if isinstance(value, gin.config.ConfigurableReference) and value.evaluate:
            raise TypeError(
                f"configured({fn.__name__}): gin binds {selector}.{param} = "
                f"@{value.scoped_selector}(), a call gin makes when it reads the binding: that "
                "is one writer, not a factory making one in each manager's directory. Drop the "
                f"(): @{value.scoped_selector}."
            )


# The factories the writer sets of configs/writers/ bind as the manager's writer_factory.
_WRITER_SETS = ("writers.create_default_writer", "writers.create_tracker_writer")
# The tracker sets of configs/writers/, by the tracker each binds.
_TRACKER_SETS = {
    "writers.WandbWriter": "writers/wandb.gin",
    "writers.MlflowWriter": "writers/mlflow.gin",
}


def _refuse_a_replaced_writer_set(fn: Callable[..., Any]) -> None:
    """Raises where gin binds a `writers.*` configurable that no writer `fn` (a manager) makes
    reads: of two writer sets given, the last one's bindings win, so `writers/wandb.gin` then
    `writers/mlflow.gin` logged to MLflow alone, and `writers/mlflow.gin` then `console.gin`
    (whose writer_factory is the default set's) to no tracker, without a word."""
    own = _gin_bindings(fn).get("writer_factory")
    if own is not None and _referenced(own) not in _WRITER_SETS:
        return  # a factory of the user's: writer bindings beside it may be for other writers
    config = gin.config._CONFIG  # gin has no public view of the parsed config
    factories = [
        params["writer_factory"] for params in config.values() if "writer_factory" in params
    ]
    reached = {r for f in factories if (r := _referenced(f))}
    if own is None:  # `fn`'s default set
        reached.add("writers.create_default_writer")
    todo = list(reached)
    while todo:  # what the factories' bindings refer to, in any scope
        selector = todo.pop()
        for (_, bound), params in config.items():
            if bound == selector:
                for ref in gin.config.iterate_references(params):
                    if ref.selector not in reached:
                        reached.add(ref.selector)
                        todo.append(ref.selector)
    # A tracker set's configurables only: another writer's bindings may be for one made
    # outside the manager (`configured(writers.JsonlWriter)(path)`).
    tracking = {"writers.create_tracker_writer", *_TRACKER_SETS}
    unread = sorted({s for _, s in config if s in tracking} - reached)
    if not unread:
        return
    found = "; ".join(
        f"{s} ({', '.join(f'{k} = {v!r}' for k, v in sorted(_gin_bindings(s).items()))})"
        for s in unread
    )
    made = f"{_name(fn)}.writer_factory = {own!r}" if own is not None else "its default writers"
    tracker = None
    if _referenced(own) == "writers.create_tracker_writer":
        tracker = _referenced(_gin_bindings(writers.create_tracker_writer).get("tracker"))
        made += f", whose tracker = @{tracker}" if tracker else ""
    first = [_TRACKER_SETS[s] for s in unread if s in _TRACKER_SETS] or ["a tracker set"]
    last = _TRACKER_SETS.get(tracker or "") or (
        f"a config binding tracker = @{tracker}"
        if tracker
        else "a config binding writer_factory again (console.gin, default.gin, tensorboard.gin)"
    )
    raise ValueError(
        f"configured({fn.__name__}): gin binds {found}, which no writer the manager makes "
        f"reads: it makes {made}. Two writer sets were given, {first[0]} and then {last}, and "
        "the last one's bindings replaced the first's. A tracker set (writers/wandb.gin, "
        "writers/mlflow.gin) adds its tracker to the writers configured before it: parse it "
        "last (console.gin then writers/mlflow.gin writes the console and MLflow). It adds one "
        "tracker: for both, make one the other's default_writer, as the README shows under "
        "'Choose writers with gin'."
    )


def _refuse_a_bound_logdir(fn: Callable[..., Any]) -> None:
    """Raises where gin binds the writer factories' `logdir`, which `fn` (a manager) always
    passes itself: `writers.create_default_writer.logdir = '/x'` was ignored without a word,
    and the files went to the manager's own directory."""
    factory = _gin_bindings(fn).get("writer_factory")  # None: `fn`'s default, the default set
    factories = (writers.create_default_writer, writers.create_tracker_writer)
    if factory is not None and _referenced(factory) not in [
        f"writers.{f.__name__}" for f in factories
    ]:
        return  # another factory: the binding may be for a writer made outside the manager
    bound = [(f, b["logdir"]) for f in factories if "logdir" in (b := _gin_bindings(f))]
    if not bound:
        return
    name = _name(fn)
    found = ", ".join(f"writers.{f.__name__}.logdir = {value!r}" for f, value in bound)
    raise ValueError(
        f"configured({fn.__name__}): gin binds {found}, which no writer reads: the manager "
        "passes its own directory, <summary_dir>/<name>, as the factory's logdir. The "
        f"manager's summary_dir decides where the writers write: drop the binding and pass the "
        f"directory as summary_dir where the manager is built ({fn.__name__}(name, summary_dir)"
        f"), or, where the loop passes none, bind {name}.summary_dir instead."
    )


def _refuse_a_set_writing_nothing(fn: Callable[..., Any]) -> None:
    """Raises where `fn`'s factory is `writers.create_default_writer` and gin turns off each of
    its writers: `writers/console.gin` with `console = False` built a manager that wrote every
    summary nowhere, without a word."""
    if _referenced(_gin_bindings(fn).get("writer_factory")) != "writers.create_default_writer":
        return  # `fn`'s default set (all on), or a factory of the caller's or with a tracker
    bound = _gin_bindings(writers.create_default_writer)
    defaults = inspect.signature(writers.create_default_writer).parameters
    flags = {n: bound.get(n, defaults[n].default) for n in _WRITER_FLAGS + ("just_logging",)}
    if any(value is not False for value in flags.values()):
        return  # one writer at least, or a flag the factory itself refuses ('False')
    found = ", ".join(
        f"{n} = {flags[n]}" + ("" if n in bound else " (default)") for n in _WRITER_FLAGS
    )
    raise ValueError(
        f"configured({fn.__name__}): gin binds writers.create_default_writer with {found}, so "
        "it makes no writer and every summary would be written nowhere. Turn one on, e.g. "
        "writers.create_default_writer.console = True, or parse a writer set that writes "
        "(console.gin, default.gin, tensorboard.gin)."
    )


def _refuse_an_unread_writer_set(fn: Callable[..., Any]) -> None:
    """Raises where `fn` would get no `writer_factory` (not passed, not bound in gin) while gin
    binds `writers.create_default_writer`: `fn` would make its default writers, not the set's."""
    try:
        if "writer_factory" in gin.get_bindings(fn, resolve_references=False):
            return
    except ValueError:  # gin knows nothing of `fn`
        pass
    try:
        chosen = gin.get_bindings(writers.create_default_writer, resolve_references=False)
    except ValueError:  # nor of the writer factory: no writer set to lose
        return
    if not chosen:
        return
    package = fn.__module__.split(".")[0]
    name = _name(fn)
    found = ", ".join(f"{key} = {value!r}" for key, value in sorted(chosen.items()))
    raise ValueError(
        f"configured({fn.__name__}): gin binds writers.create_default_writer ({found}) but "
        f"not {name}.writer_factory, so these bindings would be ignored and the default "
        "writers (console, TensorBoard, JSONL) made instead. A writer set parsed alone does "
        "not reach the manager: parse a top-level config such as console.gin, default.gin or "
        f"tensorboard.gin, or bind {name}.writer_factory = @writers.create_default_writer in a "
        f"gin file that imports {package} and writers (from __gin__ import "
        f"dynamic_registration, import {package}, import writers)."
    )


def config_markdown(config_str: str) -> str:
    """A gin config as one markdown code block: indented, so no fences to clash with the text.

    Example:
      >>> print(config_markdown("a.b = 1"), end="")
          a.b = 1
    """
    return "".join(f"    {line}".rstrip() + "\n" for line in config_str.strip("\n").split("\n"))


def write_gin_config(
    model_dir: str | os.PathLike[str],
    manager: TextWriting | None = None,
    step: int = 0,
    *,
    config_str: str | None = None,
) -> str:
    """Writes the operative gin config to `<model_dir>/config.gin` and as text `config`.

    Call it once everything gin configures is built: the operative config lists what was called
    (a call before that, or before any parsing, logs a warning: config.gin holds no binding).

    Args:
      model_dir: The experiment's directory (created if missing) or an fsspec URL (process 0).
      manager: Where the text summary goes, usually the train `MetricsManager`; None: no summary.
      step: The text summary's step (T5X: the start step).
      config_str: The text to write; default `gin.operative_config_str()`.

    Returns:
      The config text.

    Raises:
      TypeError: `model_dir` is not a path or `config_str` is not a str.
      ValueError: `model_dir` is a URL whose '//' was made '/' (as pathlib does).
      OSError: `config.gin` could not be written; a note names it and the fix (free space, ...).

    Example:
      >>> import tempfile
      >>> text = write_gin_config(tempfile.mkdtemp(), config_str="a.b = 1")
    """
    problems = Problems("write_gin_config")
    if not isinstance(model_dir, str | os.PathLike):
        problems.type_problem(f"model_dir must be a path, got {type(model_dir).__name__}")
    elif problem := url_problem(model_dir, "model_dir"):
        problems.value_problem(problem)
    if config_str is not None and not isinstance(config_str, str):
        problems.type_problem(f"config_str must be a str or None, got {type(config_str).__name__}")
    problems.raise_if_any()
    text = gin.operative_config_str() if config_str is None else config_str
    if config_str is None and not _bindings(text):
        # An early call saved a config.gin without a binding, and nothing said so.
        parsed = _bindings(gin.config_str())
        why = (
            f"none of the {parsed} parsed bindings is operative, as nothing gin configures "
            "has been called yet: call it after building the managers through configured(), "
            "or pass config_str=gin.config_str()"
            if parsed
            else "no gin config was parsed: call gin.parse_config_files_and_bindings first"
        )
        _LOG.warning("write_gin_config: %s holds no binding; %s", CONFIG_FILENAME, why)
    if jax.process_index() == 0:
        # Atomic (a reader never sees half a config), mode 0o666 & ~umask, local or URL.
        path = _storage.join(os.fspath(model_dir), CONFIG_FILENAME)
        try:
            _storage.replace_file(path, [text.encode("utf-8")])
        except OSError as err:  # a full disk said only "[Errno 28] No space left on device"
            err.add_note(f"write_gin_config: writing {path} failed; {_storage.os_error_fix(err)}")
            raise
    if manager is not None:
        manager.write_texts(step, {CONFIG_SUMMARY_KEY: config_markdown(text)})
    return text


def summarize_gin_config(
    model_dir: str | os.PathLike[str],
    summary_writer: TextWriting | None = None,
    step: int = 0,
    *,
    config_str: str | None = None,
) -> str:
    """T5X's name and arguments, as its train.py and infer.py pass them (by keyword), for
    `write_gin_config`. Pass the manager rather than its `summary_writer`, which bypasses its
    worker."""
    return write_gin_config(model_dir, summary_writer, step, config_str=config_str)
