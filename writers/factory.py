"""The default writer set of a run, with or without an experiment tracker, in one call.

`create_default_writer`: console + TensorBoard + JSONL; `create_tracker_writer`: those plus W&B or
MLflow. Each builds one flat `MultiWriter`, so a failing backend (or tracker) stops no other.
Gin: `configs/writers/*.gin`.
"""

import functools
import inspect
import os
import sys
from collections.abc import Callable
from typing import IO, Any

import numpy as np

from writers import _checks, _storage
from writers._jsonl_log import LogLockedError
from writers.async_writer import AsyncWriter
from writers.console import ConsoleWriter
from writers.interface import MetricWriter, close_failed
from writers.jsonl import JsonlWriter
from writers.logging_writer import LoggingWriter
from writers.multi import MultiWriter
from writers.tensorboard import TensorBoardWriter


def create_default_writer(
    logdir: str | os.PathLike[str] | None = None,
    *,
    collection: str | None = None,
    just_logging: bool = False,
    asynchronous: bool = False,
    console: bool = True,
    tensorboard: bool = True,
    jsonl: bool = True,
    log: bool = False,
    total_steps: int | None = None,
    purge_step: int | None = None,
    resume_step: int | None = None,
    flush_secs: float = 10.0,
    max_buffer_mb: float | None = 256.0,
    max_queue: int = 128,
    console_stream: IO[str] | None = None,
) -> MultiWriter:
    """Builds console + TensorBoard + JSONL (+ absl log) writers behind one `MultiWriter`.

    Args:
      logdir: Directory or URL for TensorBoard events and `metrics.jsonl`; None writes no
        files (`tensorboard` and `jsonl` are then ignored).
      collection: Shown by the console and log writers, stored in every JSONL line. Unlike
        CLU's, it adds no subdirectory: pass `f"{workdir}/{collection}"` as `logdir` for that.
      just_logging: CLU's flag: the absl log writer alone, no console and no files (e.g.
        `just_logging=jax.process_index() > 0`, so other hosts only log).
      asynchronous: Put each writer behind its own `AsyncWriter` (queue of `max_queue`
        calls). Off by default: a `MetricsManager` calls its writers from its own worker.
      console: Include a `ConsoleWriter`.
      tensorboard: Include a `TensorBoardWriter` (needs `logdir`).
      jsonl: Include a `JsonlWriter` writing `<logdir>/metrics.jsonl`.
      log: Include a `LoggingWriter` (absl INFO log, CLU's line format).
      total_steps: Last step of the run, for the console's progress line and ETA.
      purge_step: Hide TensorBoard events at or after this step from earlier runs; prefer
        `resume_step`, which also cleans the JSONL log.
      resume_step: The step a resumed run restarts from: TensorBoard gets
        `purge_step=resume_step + 1` and the JSONL log loses its lines after it.
      flush_secs: TensorBoard (and remote JSONL) flush period in seconds.
      max_buffer_mb: On cloud storage, what TensorBoard and JSONL each keep in memory while
        uploads fail; past it the oldest writes are dropped (logged). None: no bound.
      max_queue: Queue size of each `AsyncWriter`.
      console_stream: Stream for the console writer (default `sys.stdout`).

    Returns:
      A `MultiWriter` over the selected writers (possibly none).

    Raises:
      TypeError: a flag (`console`, `jsonl`, ...) is not a bool, `max_queue` is not an int,
        or `console_stream` has no `write()`.
      TypeError, ValueError: `flush_secs`, `max_buffer_mb`, `total_steps` or `purge_step` is
        not what it takes, also where no writer of the set reads it.
      ValueError: `max_queue` is below 1, `purge_step` and `resume_step` disagree,
        `logdir` is a URL whose '//' was made '/' (`Path("gs://b")`, `"gs:/b"`), or another
        writer holds `<logdir>/metrics.jsonl` (a second `collection` on one `logdir`: the
        message names the subdirectory to pass).

    Example:
      >>> import writers
      >>> sorted(writers.create_default_writer(None, log=True).writers)
      ['console', 'log']
    """
    flags = dict(just_logging=just_logging, asynchronous=asynchronous, console=console)
    flags |= dict(tensorboard=tensorboard, jsonl=jsonl, log=log)
    if bad := {k: v for k, v in flags.items() if not isinstance(v, bool | np.bool_)}:
        strings = [str(v) for v in bad.values() if isinstance(v, str)]
        # The value the user wrote, unquoted: log='True' was told "write False, not 'False'".
        meant = next((v.strip() for v in strings if v.strip().lower() in ("true", "false")), "")
        hint = (
            f"; in gin write {meant.capitalize()}, not {meant!r}."
            if meant
            else "; in gin write True or False, without quotes."
        )
        raise TypeError(
            f"create_default_writer: {', '.join(bad)} must be True or False, got "
            f"{', '.join(f'{v!r}' for v in bad.values())}"
            + (" (a str such as 'False' is true)" + hint if strings else ".")
        )
    if isinstance(max_queue, bool) or not isinstance(max_queue, int | np.integer):
        raise TypeError(
            f"create_default_writer: max_queue must be an int >= 1, got {max_queue!r} "
            f"({type(max_queue).__name__})"
            + ("; in gin write 512, not '512'." if isinstance(max_queue, str) else ".")
        )
    if max_queue < 1:  # also when synchronous: a config that fails only when made async
        raise ValueError(f"create_default_writer: max_queue must be >= 1, got {max_queue}.")
    # Likewise whatever the set: console.gin took flush_secs = '30' (no writer of its reads
    # it), and the config failed only once TensorBoard or JSONL was switched on.
    _checks.check_seconds(flush_secs, "create_default_writer")
    _checks.buffer_bytes(max_buffer_mb, "create_default_writer")
    _checks.check_options("create_default_writer", total_steps=total_steps)
    if purge_step is not None:
        purge_step = _checks.check_step(purge_step, "create_default_writer(purge_step=...)")
    if console_stream is not None and not callable(getattr(console_stream, "write", None)):
        raise TypeError(
            f"create_default_writer: console_stream must be a text stream such as sys.stderr "
            f"(with write()), got {console_stream!r}; None prints to sys.stdout."
        )
    if resume_step is not None:
        resume_step = _checks.check_step(resume_step, "create_default_writer(resume_step=...)")
        if purge_step is not None and purge_step != resume_step + 1:
            raise ValueError(
                f"create_default_writer: purge_step={purge_step} disagrees with "
                f"resume_step={resume_step} (a resumed run purges from resume_step + 1 = "
                f"{resume_step + 1}). Pass resume_step alone."
            )
        purge_step = resume_step + 1
    if logdir is not None:
        logdir = _checks.check_path(logdir, "create_default_writer", "logdir")
    if just_logging:
        console = tensorboard = jsonl = False
        log = True
    chosen: dict[str, Any] = {}
    try:
        # JSONL first: its lock refuses a second process on this directory before the
        # TensorBoard writer puts a file there (a purge marker would hide the running
        # run's later steps in TensorBoard for good).
        if logdir is not None and jsonl:
            if tensorboard and resume_step is not None:
                # Loaded before the log is cut back to resume_step: a process killed in the
                # 0.3 s of tensorboardX's import after it left the log cut and TensorBoard
                # showing the old run's later steps (1 restart in 29 under random kills).
                from writers import _records, _tb_summary  # noqa: F401, PLC0415
            path = _storage.join(os.fspath(logdir), "metrics.jsonl")
            try:
                chosen["jsonl"] = JsonlWriter(
                    path,
                    collection=collection,
                    resume_step=resume_step,
                    flush_secs=flush_secs,
                    max_buffer_mb=max_buffer_mb,
                )
            except LogLockedError as err:
                # CLU's `create_default_writer(workdir, collection="eval")` beside a "train"
                # one writes `<workdir>/eval`; here both name one log, and the message told
                # only of a summary_dir or name, neither of which this function takes. (A
                # logdir ending in the collection, a manager's `<summary_dir>/<name>`: as it is.)
                if collection is None or os.fspath(logdir).rstrip("/").endswith(collection):
                    raise
                apart = _storage.join(os.fspath(logdir), collection)
                raise LogLockedError(
                    f"create_default_writer: {err} Unlike CLU's, collection={collection!r} adds "
                    f"no subdirectory: pass logdir={apart!r} to write this collection apart."
                ) from None
        if console:
            chosen["console"] = ConsoleWriter(
                console_stream, collection=collection, total_steps=total_steps
            )
        if logdir is not None and tensorboard:
            chosen["tensorboard"] = TensorBoardWriter(
                logdir, purge_step=purge_step, flush_secs=flush_secs, max_buffer_mb=max_buffer_mb
            )
        if log:
            chosen["log"] = LoggingWriter(collection=collection)
    except Exception:
        for made in chosen.values():  # no half-built set with open files and threads
            made.close()
        raise
    order = ("console", "tensorboard", "jsonl", "log")  # the console first: people watch it
    chosen = {n: chosen[n] for n in order if n in chosen}
    if asynchronous:
        chosen = {n: AsyncWriter(w, name=n, max_queue=max_queue) for n, w in chosen.items()}
    return MultiWriter(chosen)


def create_tracker_writer(
    logdir: str | os.PathLike[str] | None,
    *,
    collection: str | None = None,
    tracker: Callable[..., MetricWriter],
    name: str = "tracker",
    default_writer: Callable[..., MultiWriter] = create_default_writer,
    resume_step: int | None = None,
) -> MultiWriter:
    """Builds `default_writer`'s writers plus `tracker`'s, in one `MultiWriter`.

    The tracker is made first, so one that refuses its settings or cannot reach its server
    leaves the local logs as they were (a resumed default set rewrites them when made); if
    the default writers then fail (a second run on `logdir`), the tracker is closed, a run it
    started ending failed.

    Args:
      logdir: Directory of the file writers (and of the tracker's local files).
      collection: Passed to both factories (e.g. `train`); None keeps a factory's own.
      tracker: Makes the tracker (e.g. `writers.WandbWriter`); given `logdir` if it takes one
        and sets none of its own (a `functools.partial` keyword or a gin binding: kept).
      name: Name of the tracker inside the `MultiWriter` (errors name it).
      default_writer: Makes the other writers.
      resume_step: The step a resumed run restarts from, passed to both factories (as
        `MetricsManager(resume_step=...)` passes it here): the files drop what came after it,
        W&B rewinds its run (with `run_id`), MLflow skips the steps its run already has.

    Raises:
      TypeError: `resume_step` for a `tracker` that takes none; `tracker` or `default_writer`
        is no function or class (a str, a writer), or `name` is no str.
      ValueError: `name` is already the name of one of the default writers.

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
    problems = _checks.Problems("create_tracker_writer")
    for role, factory in (("tracker", tracker), ("default_writer", default_writer)):
        if callable(factory):
            continue
        example = "writers.MlflowWriter" if role == "tracker" else "writers.create_default_writer"
        # A str from gin ('mlflow'), or a writer gin made once at parsing (`@...()`): the call
        # said only "'str' object is not callable".
        fix = f"in gin write a reference, @{example}, not a str"
        if not isinstance(factory, str):
            fix = f"in gin drop the (): @{example}; in Python pass the class or function itself"
        problems.type_problem(
            f"{role} must be a function or class making a writer, such as {example}, got "
            f"{factory!r}; {fix}"
        )
    if not isinstance(name, str):  # MultiWriter said "every key must be a str"
        problems.type_problem(f"name must be a str such as 'mlflow', got {name!r}")
    problems.raise_if_any()
    resuming = {} if resume_step is None else {"resume_step": resume_step}
    takes = {
        role: _checks.parameters(f)
        for role, f in (("tracker", tracker), ("default_writer", default_writer))
    }
    # Without a signature to read (a builtin), or with **kwargs: taken, as by the manager.
    lacking = [role for role, p in takes.items() if not _checks.takes_keyword(p, "resume_step")]
    if resume_step is not None and lacking:
        raise TypeError(
            f"create_tracker_writer: resume_step={resume_step} needs a {' and a '.join(lacking)} "
            "taking resume_step (writers.WandbWriter, writers.MlflowWriter, "
            "writers.create_default_writer): without it, what was logged after the step stays"
        )

    def named(factory: Callable[..., Any]) -> dict[str, Any]:
        # None replaced the collection the factory sets itself (a partial's, or gin's).
        keep = collection is None and _sets(factory, "collection")
        return {} if keep else {"collection": collection}

    kwargs: dict[str, Any] = {**named(tracker), **resuming}
    # By name only (MlflowWriter takes none), and not over the tracker's own: it was replaced.
    if "logdir" in (takes["tracker"] or {}) and not _sets(tracker, "logdir"):
        kwargs["logdir"] = logdir
    # The tracker first: a resumed default set rewrites the local log and purges TensorBoard
    # at once, which a tracker refusing its settings afterwards could not undo.
    made = tracker(**kwargs)
    try:
        base = default_writer(logdir, **named(default_writer), **resuming)
    except Exception as err:
        close_failed(made, err)  # no half-built set with open runs and threads
        raise
    chosen = dict(base.writers)
    if name in chosen:
        base.close()
        clash = ValueError(
            f"create_tracker_writer: name={name!r} is taken by a default writer "
            f"{sorted(chosen)}; pick another name, e.g. 'wandb' or 'mlflow'."
        )
        close_failed(made, clash)
        raise clash
    return MultiWriter({**chosen, name: made})


def _sets(factory: Any, name: str) -> bool:
    """Whether `factory` sets its own `name`: a `functools.partial` keyword, or a gin binding
    of the configured class or function it is (gin's wrapper, or a class `@gin.configurable`
    decorates); a caller's argument would win over either."""
    if isinstance(factory, functools.partial):
        return name in factory.keywords or _sets(factory.func, name)
    gin = sys.modules.get("gin")  # not imported: nothing is bound
    if gin is None:
        return False
    # A scoped reference (`@train/writers.MlflowWriter`) is gin's wrapper called in its scope,
    # whose bindings (`train/writers.MlflowWriter.logdir`) were not looked up: replaced.
    call = type(factory).__call__ if inspect.isclass(factory) else factory
    code = getattr(call, "__code__", None)
    if code is not None and code.co_name == "scoping_wrapper" and call.__closure__:
        cells = dict(zip(code.co_freevars, call.__closure__, strict=True))
        if "scope_components" in cells:
            inner = factory.__mro__[1] if inspect.isclass(factory) else factory.__wrapped__
            with gin.config_scope(list(cells["scope_components"].cell_contents)):
                return _sets(inner, name)
    if inspect.isclass(factory) and hasattr(type(factory).__call__, "__wrapped__"):
        factory = factory.__mro__[1]  # gin's subclass of the registered class
    elif inspect.isclass(factory):  # @gin.configurable wraps the class's own __init__ (or __new__)
        if not any(hasattr(vars(factory).get(m), "__wrapped__") for m in ("__init__", "__new__")):
            return False
    elif not hasattr(factory, "__wrapped__"):  # gin binds only through its wrapper
        return False
    try:
        return name in gin.get_bindings(factory, resolve_references=False)
    except ValueError:  # not registered with gin
        return False
