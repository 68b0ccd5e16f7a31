"""Gin on the host side: configured callables and the operative config as a summary.

Configs in `configs/` use `from __gin__ import dynamic_registration`, so library
code carries no gin decorators. The price: bindings apply only when a function
is called through gin. `configured(fn)` returns the gin-aware version of `fn`
when a parsed config mentions it (and `fn` itself otherwise); `MetricsManager`
uses it for its default writer factory, so bindings such as
`writers.create_default_writer.tensorboard = False` take effect even for a
manager built in plain Python.

`write_gin_config` saves the operative config the way T5X does: to
`<model_dir>/config.gin` (local or a `gs://`/`s3://` URL) and, through a manager, as the TensorBoard text
summary `config` (markdown).

Usage:

  gin.parse_config_files_and_bindings(["configs/default.gin"], [])
  with MetricsManager("train", model_dir) as train:
    write_gin_config(model_dir, train, step=0)
    ...

Host-side module: never import it from code traced by jit.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import gin
import jax

from writers import _storage
from writers._problems import Problems

F = TypeVar("F", bound=Callable[..., Any])

CONFIG_FILENAME = "config.gin"
CONFIG_SUMMARY_KEY = "config"


class TextWriting(Protocol):
    """Anything with `write_texts(step, texts)`: a `MetricsManager` or a writer."""

    def write_texts(self, step: int, texts: dict[str, str]) -> None: ...


def configured(fn: F) -> F:
    """Returns `fn` with its gin bindings applied when a parsed config mentions it.

    With dynamic registration, gin knows `fn` only after a parsed config names
    it; calling `fn` directly ignores its bindings. This returns gin's wrapper
    in that case and `fn` unchanged otherwise.

    Args:
      fn: a function or class, e.g. `writers.create_default_writer`.

    Returns:
      A callable with `fn`'s signature.

    Example:
      >>> import writers
      >>> make_writer = configured(writers.create_default_writer)
      >>> w = make_writer(None, console=False)  # with its bindings, if any were parsed
      >>> w.close()
    """
    try:
        return gin.get_configurable(fn)
    except ValueError:  # gin has not seen `fn` in any parsed config
        return fn


def config_markdown(config_str: str) -> str:
    """Formats a gin config as markdown for TensorBoard's text plugin (one code block).

    Every line is indented by four spaces: markdown's code block, which keeps
    the config's layout in TensorBoard and reads as plain indented text on a
    console (no fences to show, none to clash with the config's own text).

    Args:
      config_str: gin config text, e.g. `gin.operative_config_str()`.

    Returns:
      The config as one markdown code block.

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

    Call it after everything configured by gin has been built (the operative
    config lists only what was called). Only process 0 writes the file; the
    manager writes the text summary on process 0 only, by itself.

    Args:
      model_dir: the experiment's root directory (created if missing), or a URL
        (`gs://bucket/run`, any fsspec protocol). The file's mode follows the
        process umask.
      manager: where the text summary `config` goes, usually the train
        `MetricsManager`; None writes only the file.
      step: the step of the text summary (T5X: the start step).
      config_str: the text to write; defaults to `gin.operative_config_str()`.

    Returns:
      The config text that was written.

    Raises:
      TypeError: `model_dir` is not a path or `config_str` is not a str.

    Example:
      >>> import tempfile
      >>> text = write_gin_config(tempfile.mkdtemp(), config_str="a.b = 1")
    """
    problems = Problems("write_gin_config")
    if not isinstance(model_dir, str | os.PathLike):
        problems.type_problem(f"model_dir must be a path, got {type(model_dir).__name__}")
    if config_str is not None and not isinstance(config_str, str):
        problems.type_problem(f"config_str must be a str or None, got {type(config_str).__name__}")
    problems.raise_if_any()
    text = gin.operative_config_str() if config_str is None else config_str
    if jax.process_index() == 0:
        model_dir = os.fspath(model_dir)
        # Atomic (a reader never sees half a config), mode 0o666 & ~umask, local or URL.
        _storage.replace_file(_storage.join(model_dir, CONFIG_FILENAME), [text.encode("utf-8")])
    if manager is not None:
        manager.write_texts(step, {CONFIG_SUMMARY_KEY: config_markdown(text)})
    return text
