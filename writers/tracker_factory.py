"""`create_tracker_writer`: the default writer set plus one experiment tracker (W&B, MLflow).

The default writers and the tracker sit side by side in one flat `MultiWriter`, so a failing
tracker stops none of the files. Gin: `configs/writers/wandb.gin`, `mlflow.gin`.

Example:
  >>> import tempfile, writers
  >>> w = writers.create_tracker_writer(
  ...     tempfile.mkdtemp(), collection="train", tracker=lambda collection: writers.NoopWriter(),
  ...     default_writer=lambda logdir, collection: writers.create_default_writer(
  ...         logdir, collection=collection, console=False, tensorboard=False))
  >>> sorted(w.writers)
  ['jsonl', 'tracker']
  >>> w.close()
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from writers.factory import create_default_writer
from writers.interface import MetricWriter
from writers.multi import MultiWriter


def create_tracker_writer(
    logdir: str | os.PathLike[str] | None,
    *,
    collection: str | None = None,
    tracker: Callable[..., MetricWriter],
    name: str = "tracker",
    default_writer: Callable[..., MultiWriter] = create_default_writer,
) -> MultiWriter:
    """Builds `default_writer`'s writers plus `tracker`'s, in one `MultiWriter`.

    Args:
      logdir: Directory of the file writers (and of the tracker's local files).
      collection: Passed to both factories (e.g. `train`).
      tracker: Makes the tracker (e.g. `writers.WandbWriter`); given `logdir` if it takes one.
      name: Name of the tracker inside the `MultiWriter` (errors name it).
      default_writer: Makes the other writers.

    Raises:
      ValueError: `name` is already the name of one of the default writers.
    """
    base = default_writer(logdir, collection=collection)
    chosen = dict(base.writers)
    if name in chosen:
        base.close()
        raise ValueError(
            f"create_tracker_writer: name={name!r} is taken by a default writer "
            f"{sorted(chosen)}; pick another name, e.g. 'wandb' or 'mlflow'."
        )
    # gin's configurable classes report `(*args, **kwargs)`: look at the real __init__.
    target = inspect.unwrap(tracker.__init__) if inspect.isclass(tracker) else tracker
    try:
        takes_logdir = "logdir" in inspect.signature(target).parameters
    except (TypeError, ValueError):  # builtins without a signature
        takes_logdir = False
    kwargs: dict[str, Any] = {"collection": collection}
    if takes_logdir:
        kwargs["logdir"] = logdir
    try:
        chosen[name] = tracker(**kwargs)
    except Exception:
        base.close()  # no half-built set with open files and threads
        raise
    return MultiWriter(chosen)
