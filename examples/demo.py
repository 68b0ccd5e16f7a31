"""`make demo`: train a small transformer language model and watch its metrics.

A complete training loop in the shape T5X uses, written to be copied:

* the loss function returns T5X's base metrics (`compute_loss_and_metrics`);
* the loss normalizing factor is computed on the global batch (`with_loss_normalization`)
  and gradients are accumulated over microbatches (`accumulate_grads_microbatched`), so no
  reported value depends on the number of microbatches;
* each step merges its metrics into a running accumulator inside the compiled step
  (`merge_metrics`, buffers donated): no host work per step;
* every `summary_period` steps one `MetricsManager.write_metrics_summary` call hands the
  window to a background thread that times it, copies it to the host once and writes it to
  the console, a JSONL log and TensorBoard; a second manager writes periodic eval summaries.

Usage:
    python -m examples.demo --gin_file=configs/demo.gin --gin.TOTAL_STEPS=600 \\
        --gin_bindings='demo_model.TrainConfig.num_microbatches = 4'

Flags (T5X's names):
    --gin_file          gin files to parse, in order (repeatable).
    --gin_bindings      bindings applied after the files (repeatable).
    --gin.NAME=VALUE    T5X's shorthand for --gin_bindings='NAME = VALUE', e.g.
                        --gin.TOTAL_STEPS=600 (macros of configs/demo.gin).
    --gin_search_paths  comma-separated directories in which relative gin files and
                        `include`s are looked up; defaults to this repository's `configs/`.

Output, under `TrainConfig.model_dir` (`runs/demo` by default):
    config.gin                        the operative gin config (also TensorBoard text `config`)
    train/metrics.jsonl, events.*     train summaries
    eval/<name>/metrics.jsonl, ...    eval summaries
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import difflib
import fcntl
import functools
import glob
import inspect
import logging as std_logging
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import clu.metrics
import clu.values
import gin
import gin.config_parser
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags, logging
from flax.training import train_state

import writers
from examples import demo_model
from metrics_manager import (
    MetricsManager,
    PackedMetrics,
    accumulate_grads_microbatched,
    compute_loss_and_metrics,
    merge_metrics,
    with_loss_normalization,
)
from metrics_manager.gin_utils import configured, write_gin_config

Batch = Mapping[str, Any]
Metrics = dict[str, clu.metrics.Metric]
Running = Metrics | PackedMetrics  # what merge_metrics returns (packed inside jit)
Summary = Mapping[str, clu.values.Value]

# The checkout's configs/ (demo.gin lives only there), from any working directory.
DEFAULT_CONFIGS_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs"
)

_GIN_FILE = flags.DEFINE_multi_string(
    "gin_file", ["demo.gin"], "Gin files to parse, in order (default: configs/demo.gin)."
)
_GIN_BINDINGS = flags.DEFINE_multi_string(
    "gin_bindings", [], "Gin bindings applied after the files."
)
_GIN_SEARCH_PATHS = flags.DEFINE_list(
    "gin_search_paths",
    [DEFAULT_CONFIGS_DIR],
    "Directories in which relative gin files and includes are looked up.",
)


# ------------------------------------------------------------------- device side (jitted)


def make_loss_fn(
    model: demo_model.TransformerLM, config: demo_model.TrainConfig
) -> Callable[[Any, Batch], tuple[Any, Metrics]]:
    """Returns `loss_fn(params, batch) -> (loss, metrics)` with T5X's base metrics."""

    def loss_fn(params: Any, batch: Batch) -> tuple[Any, Metrics]:
        logits = cast(jax.Array, model.apply(params, batch["decoder_input_tokens"]))
        # The step runs on one device (no mesh), so the *_per_core rates divide by 1.
        return compute_loss_and_metrics(
            logits,
            batch,
            label_smoothing=config.label_smoothing,
            z_loss=config.z_loss,
            num_devices=1,
        )

    return loss_fn


def make_train_step(
    loss_fn: Callable[[Any, Batch], tuple[Any, Metrics]],
    schedule: optax.Schedule,
    config: demo_model.TrainConfig,
) -> Callable[..., tuple[train_state.TrainState, Running]]:
    """Returns `train_step(state, running, batch) -> (state, running)`, jitted.

    `state` and `running` are donated: the new state and the merged metrics reuse their
    buffers. Pass `running=None` on the first step of a summary window (jit compiles a
    second variant for it once; see `metrics_manager.merging`).
    """

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(
        state: train_state.TrainState, running: Running | None, batch: Batch
    ) -> tuple[train_state.TrainState, Running]:
        # The normalizing factor comes from the GLOBAL batch, before the microbatch split.
        batch = with_loss_normalization(batch, config.loss_normalizing_factor)
        grads, metrics = accumulate_grads_microbatched(
            loss_fn, state.params, batch, config.num_microbatches
        )
        # Once per step, outside the microbatch loop: the rate this step's update used.
        learning_rate = jnp.asarray(schedule(state.step), jnp.float32)
        metrics["learning_rate"] = clu.metrics.Average.from_model_output(learning_rate)
        metrics["learning_rate/current"] = clu.metrics.LastValue.from_model_output(learning_rate)
        return state.apply_gradients(grads=grads), merge_metrics(running, metrics)

    return train_step


def make_eval_step(
    loss_fn: Callable[[Any, Batch], tuple[Any, Metrics]],
    config: demo_model.TrainConfig,
) -> Callable[[Any, Running | None, Batch], Running]:
    """Returns `eval_step(params, running, batch) -> running`, jitted, `running` donated."""

    @functools.partial(jax.jit, donate_argnums=(1,))
    def eval_step(params: Any, running: Running | None, batch: Batch) -> Running:
        batch = with_loss_normalization(batch, config.loss_normalizing_factor)
        _, metrics = loss_fn(params, batch)
        return merge_metrics(running, metrics)

    return eval_step


# ------------------------------------------------------------------------------ host side


def train(
    model_config: demo_model.ModelConfig,
    data_config: demo_model.DataConfig,
    config: demo_model.TrainConfig,
) -> dict[str, Summary]:
    """Trains the demo model, writing train and eval summaries under `config.model_dir`.

    Call it after parsing the gin config: the operative config it writes lists what gin
    built.

    Args:
        model_config: Size of the transformer.
        data_config: Shape and structure of the synthetic data.
        config: Loop settings (steps, periods, microbatches, learning rate, output dir).

    Returns:
        `{"train": summary, "eval": summary}`: the last summary of each manager,
        `{key: clu.values.Value}`.

    Raises:
        ValueError: The configs do not fit together (`demo_model.check_configs`).
    """
    demo_model.check_configs(model_config, data_config, config)
    model = demo_model.TransformerLM(model_config)
    train_batches = iter(demo_model.SyntheticSequences(data_config))
    eval_batches = _eval_batches(data_config, config.num_eval_batches)
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=config.peak_learning_rate,
        warmup_steps=config.warmup_steps,
        decay_steps=config.total_steps,
        end_value=0.1 * config.peak_learning_rate,
    )
    batch = next(train_batches)
    state = train_state.TrainState.create(
        apply_fn=model.apply,
        params=model.init(jax.random.key(config.seed), batch["decoder_input_tokens"]),
        tx=optax.adamw(schedule),
    )
    loss_fn = make_loss_fn(model, config)
    train_step = make_train_step(loss_fn, schedule, config)
    eval_step = make_eval_step(loss_fn, config)

    # Compile before the loop, so the first summary window times training, not XLA; and
    # before the earlier run's files are touched, so a config that fails here keeps them.
    start = time.perf_counter()
    train_step = compile_merging_step(train_step, state, batch, metrics_of=lambda out: out[1])
    eval_step = compile_merging_step(eval_step, state.params, eval_batches[0])
    compilation_seconds = time.perf_counter() - start

    futures: dict[str, concurrent.futures.Future[Summary]] = {}
    # Through gin, so the config's writer choice (MetricsManager.writer_factory) applies.
    make_manager = configured(MetricsManager)
    with (
        _one_demo_at_a_time(config.model_dir),
        _previous_run_set_aside(config) as writers_built,
        _train_manager(config.model_dir) as train_manager,
        make_manager(f"eval/{config.eval_name}", config.model_dir) as eval_manager,
    ):
        writers_built()  # the earlier run's files go only now
        # Everything gin configures has been built, so the operative config is complete.
        write_gin_config(config.model_dir, train_manager, step=0)
        train_manager.write_scalar("timing/compilation_seconds", compilation_seconds, 0)

        running: Running | None = None  # a summary window starts with no metrics
        train_manager.start_duration_timer(block_on=state)
        for step in range(1, config.total_steps + 1):
            state, running = train_step(state, running, batch)
            batch = next(train_batches)
            if step % config.summary_period == 0 or step == config.total_steps:
                num_steps = (step - 1) % config.summary_period + 1
                futures["train"] = train_manager.write_metrics_summary(running, step, num_steps)
                running = None  # the summary owns those buffers now
            if step % config.eval_period == 0 or step == config.total_steps:
                # Train steps still queued are not eval time: with the host ahead of the device
                # (a GPU's async dispatch), the eval's wait below would also wait them out.
                jax.block_until_ready(state.params)
                start = time.perf_counter()
                futures["eval"] = evaluate(
                    eval_step, state.params, eval_batches, eval_manager, step
                )
                futures["eval"].result()  # eval time is not train time: wait, then time it
                train_manager.write_scalar(
                    "timing/evaluate_seconds", time.perf_counter() - start, step
                )
            if running is None and step < config.total_steps:
                train_manager.start_duration_timer(block_on=state)
        return {name: future.result() for name, future in futures.items()}


def compile_merging_step(
    step_fn: Any,
    x: Any,
    batch: Batch,
    metrics_of: Callable[[Any], Running] = lambda out: out,
) -> Callable[[Any, Running | None, Batch], Any]:
    """Compiles `step_fn(x, running, batch)` ahead of time for both kinds of call.

    A merging step has two variants: `running=None` (the first step of a summary window)
    and `running=<the metrics it returned>`. Both are compiled here, before the loop, and
    the returned function calls the right executable, so nothing compiles inside a window.

    Args:
        step_fn: A `jax.jit`-wrapped step taking `(x, running, batch)`.
        x: The first argument (train state or params), for its shapes.
        batch: A batch, for its shapes.
        metrics_of: Picks the merged metrics out of the step's output.

    Returns:
        `call(x, running, batch)` with the step's outputs.
    """
    first = step_fn.lower(x, None, batch).compile()
    running_shapes = metrics_of(jax.eval_shape(step_fn, x, None, batch))
    rest = step_fn.lower(x, running_shapes, batch).compile()

    def call(x: Any, running: Running | None, batch: Batch) -> Any:
        return (first if running is None else rest)(x, running, batch)

    return call


def evaluate(
    eval_step: Callable[[Any, Running | None, Batch], Running],
    params: Any,
    batches: Sequence[Batch],
    manager: MetricsManager,
    step: int,
) -> concurrent.futures.Future[Summary]:
    """Runs `eval_step` over `batches` and writes one eval summary at `step`.

    Args:
        eval_step: From `make_eval_step`.
        params: The model parameters to evaluate.
        batches: The eval set.
        manager: The eval run's manager.
        step: The train step the summary is written at.

    Returns:
        The future of the eval summary (`num_steps` is the number of eval batches).
    """
    manager.start_duration_timer(block_on=params)
    running = eval_step(params, None, batches[0])
    for batch in batches[1:]:
        running = eval_step(params, running, batch)
    return manager.write_metrics_summary(running, step, len(batches))


def _eval_batches(config: demo_model.DataConfig, num_batches: int) -> list[dict[str, np.ndarray]]:
    """A fixed eval set, drawn with a different seed than the train stream."""
    stream = iter(demo_model.SyntheticSequences(dataclasses.replace(config, seed=config.seed + 1)))
    return [next(stream) for _ in range(num_batches)]


def _run_files(config: demo_model.TrainConfig) -> list[str]:
    """The files a demo run writes under a local `model_dir` that exist now."""
    paths = [os.path.join(config.model_dir, "config.gin")]
    for run_dir in (("train",), ("eval", config.eval_name)):
        path = os.path.join(config.model_dir, *run_dir)
        paths += [*glob.glob(os.path.join(path, "events.out.tfevents.*")), f"{path}/metrics.jsonl"]
    return [path for path in paths if os.path.isfile(path)]


@contextlib.contextmanager
def _one_demo_at_a_time(model_dir: str) -> Iterator[None]:
    """Holds a lock on `model_dir/.demo.lock`, so a second demo there is refused before it
    touches the files of the first (a TensorBoard-only run has no JSONL log to lock)."""
    if "://" in model_dir:
        yield
        return
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, ".demo.lock"), "w") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(
                f"Another demo is writing {model_dir}: this run would delete its files. Give "
                "this run another MODEL_DIR (--gin.MODEL_DIR=\"'/tmp/other'\"), or stop the "
                "other run first."
            ) from None
        except OSError as err:  # no flock here (NFS without lockd): the check, not the run
            logging.warning(
                "Cannot lock %s (%s): a second demo there is not refused.", model_dir, err
            )
        yield


@contextlib.contextmanager
def _previous_run_set_aside(config: demo_model.TrainConfig) -> Iterator[Callable[[], None]]:
    """Moves the files of an earlier run aside, so a new run's logs start clean; yields the
    call that deletes them once the new run's writers are built. If building them fails
    (a bad writer binding, a tracker that refuses), the earlier files come back and the new
    run's are removed. A URL `model_dir` is left as it is."""
    old = [] if "://" in config.model_dir else _run_files(config)
    for path in old:
        if path.endswith("metrics.jsonl"):
            _refuse_if_written(path)
    aside = tempfile.mkdtemp(prefix=".earlier-run-", dir=config.model_dir) if old else ""
    for i, path in enumerate(old):
        os.rename(path, os.path.join(aside, str(i)))
    built = False

    def writers_built() -> None:
        nonlocal built
        built = True
        if old:
            shutil.rmtree(aside)
            logging.info("Removed %d files of an earlier run under %s.", len(old), config.model_dir)

    try:
        yield writers_built
    finally:
        if not built and "://" not in config.model_dir:
            for path in _run_files(config):  # what the failed run made (a fresh dir too)
                os.remove(path)
            for i, path in enumerate(old):
                os.rename(os.path.join(aside, str(i)), path)
            if old:
                os.rmdir(aside)


def _refuse_if_written(log: str) -> None:
    """Raises if a running process writes `log`: the lock every JsonlWriter takes on its log
    refuses this one, and the files of a run still writing them are not deleted."""
    try:
        writers.JsonlWriter(log).close()  # takes the lock, and drops it
    except ValueError as err:
        raise RuntimeError(
            f"{log} is being written by a running process: this run would delete its "
            "files. Give this run another MODEL_DIR (--gin.MODEL_DIR=\"'/tmp/other'\"), or "
            "stop the other run first."
        ) from err


_SEARCH_PATHS: set[str] = set()


def run(
    gin_files: Sequence[str],
    gin_bindings: Sequence[str] = (),
    gin_search_paths: Sequence[str] = (DEFAULT_CONFIGS_DIR,),
) -> tuple[demo_model.TrainConfig, dict[str, Summary]]:
    """Parses the gin config and trains: what `python -m examples.demo` does.

    Args:
        gin_files: Gin files, parsed in order; relative paths are looked up in
            `gin_search_paths` (so `demo.gin` finds `configs/demo.gin`).
        gin_bindings: Bindings applied after the files, e.g. `"TOTAL_STEPS = 600"` (the
            macro sets the console's progress line too).
        gin_search_paths: Directories for relative gin files and `include` lines.

    Returns:
        The train config used and the last summaries, as returned by `train`.

    Example:
        >>> config, summaries = run(["demo.gin"], ["TOTAL_STEPS = 50"])  # doctest: +SKIP
    """
    # gin answers a missing file with a TypeError from its internals once search paths are set.
    if missing := [
        f
        for f in gin_files
        if not any(os.path.isfile(os.path.join(d, f)) for d in ("", *gin_search_paths))
    ]:
        searched = [os.path.abspath(d) for d in gin_search_paths]
        shipped = sorted(
            os.path.relpath(path, DEFAULT_CONFIGS_DIR)
            for path in glob.glob(os.path.join(DEFAULT_CONFIGS_DIR, "**", "*.gin"), recursive=True)
        )
        raise FileNotFoundError(
            f"gin file(s) {missing} not found in the working directory or in {searched}; "
            + (
                f"pass a path, or one of {shipped}."
                if os.path.abspath(DEFAULT_CONFIGS_DIR) in searched
                else f"pass a path, or add {DEFAULT_CONFIGS_DIR} to --gin_search_paths."
            )
        )
    gin.clear_config()  # a second run() in one process (a notebook) starts from its own config
    for path in gin_search_paths:
        if path not in _SEARCH_PATHS:  # gin keeps them for the process, in order
            _SEARCH_PATHS.add(path)
            gin.add_config_file_search_path(path)
    binds_writers = []  # per file: whether it binds a writer_factory, to check the order below
    try:
        for file in gin_files:  # one at a time, as gin does, to see what each one binds
            before = _writer_factories()
            gin.parse_config_files_and_bindings([file], [], finalize_config=False)
            binds_writers.append(_writer_factories() != before)
        gin.parse_config_files_and_bindings([], gin_bindings)
    except SyntaxError as err:
        # gin's, which give no fix: /tmp/x, and runs/x or x ("malformed node or string")
        if err.msg != "Unable to parse value." and "malformed node" not in err.msg:
            raise
        hint = (
            f"Unable to parse value. {(err.text or '').strip()!r}: a str value needs gin's quotes inside the "
            "shell's, e.g. --gin.MODEL_DIR=\"'/tmp/demo'\""
        )
        raise SyntaxError(hint, (err.filename, err.lineno, err.offset, err.text)) from err
    except ValueError as err:  # gin names a misspelled name, but not the ones there are
        if note := _misspelling_note(str(err)):
            err.add_note(note)
        raise
    if unread := _writer_bindings_without_factory():
        raise ValueError(
            f"The gin config binds {', '.join(unread)}, but no binding hands a writer factory "
            "to the managers (metrics_manager.MetricsManager.writer_factory): the run would "
            "ignore those bindings and write the default writers. A writer set goes after the "
            "demo's config, which binds it: "
            + " ".join(f"--gin_file={f}" for f in ["configs/demo.gin", *gin_files])
            + "."
        )
    sets = [os.path.basename(os.path.dirname(f)) == "writers" for f in gin_files]
    if misplaced := [  # writers/console.gin, then demo.gin whose default.gin rebinds writers
        (gin_files[i], gin_files[j])
        for i in range(len(gin_files))
        for j in range(i + 1, len(gin_files))
        if sets[i] and not sets[j] and binds_writers[j]
    ]:
        order = sorted(gin_files, key=lambda f: sets[gin_files.index(f)])  # writer sets last
        raise ValueError(
            f"--gin_file={misplaced[0][0]} comes before --gin_file={misplaced[0][1]}, which "
            "binds the writers again: the run would ignore the writer set. A writer set goes "
            "after the demo's config: " + " ".join(f"--gin_file={f}" for f in order) + "."
        )
    # After the check above: a writer set alone refers to no macro, so its --gin.MODEL_DIR
    # would be called unused ("The config's macros: none") with no word of demo.gin.
    if unused := sorted(_unused_macros() & _macros_set_by(gin_bindings)):
        raise ValueError(_unused_macros_message(unused))
    config = configured(demo_model.TrainConfig)()
    if isinstance(config.model_dir, str):  # a quoted '~/runs' reaches here unexpanded
        config = dataclasses.replace(config, model_dir=os.path.expanduser(config.model_dir))
    summaries = train(
        configured(demo_model.ModelConfig)(), configured(demo_model.DataConfig)(), config
    )
    return config, summaries


def _misspelling_note(error: str) -> str | None:
    """The names gin's error about a misspelled configurable or parameter could mean."""
    if found := re.match(r"No configurable matching '([\w.]+)'", error):
        depth = found[1].count(".") + 1  # `demo_model.TrainConfig` for examples.demo_model's
        known = {".".join(s.split(".")[-depth:]) for s, _ in gin.config._REGISTRY.items()}
        close = difflib.get_close_matches(found[1], sorted(known), n=1)
        return f"Did you mean {close[0]}?" if close else None
    if found := re.match(r"Configurable '(\S+)' doesn't have a parameter named '(\w+)'", error):
        made = gin.get_configurable(found[1])  # a class's: (*args, **kwargs)
        made = inspect.unwrap(made.__init__) if inspect.isclass(made) else made
        names = [n for n in inspect.signature(made).parameters if n != "self"]
        close = difflib.get_close_matches(found[2], names, n=1)
        mean = f"Did you mean {close[0]}? " if close else ""
        return f"{mean}{found[1]} takes: {', '.join(names)}."
    return None


def _unused_macros() -> set[str]:
    """The gin macros the parsed config sets and nothing in it refers to (`%NAME`)."""
    config = gin.config._CONFIG  # gin has no public view of the parsed, unbuilt config
    macros = {scope for scope, selector in config if selector == "gin.macro"}
    used = {
        ref.scoped_selector.rsplit("/", 1)[0]
        for ref in gin.config.iterate_references(config)
        if ref.selector == "gin.macro"
    }
    return macros - used


def _writer_factories() -> dict[tuple[str, str], str]:
    """The parsed `writer_factory` bindings (a whole writer set chosen), as key: value."""
    config = gin.config._CONFIG
    return {
        key: repr(params["writer_factory"])
        for key, params in config.items()
        if "writer_factory" in params
    }


def _writer_bindings_without_factory() -> list[str]:
    """The `writers.*` configurables bound while no manager's `writer_factory` is: a writer set
    parsed alone (`--gin_file=writers/jsonl.gin`), which no writer the demo builds reads."""
    if any(selector.endswith(".MetricsManager") for _, selector in _writer_factories()):
        return []
    return sorted(
        {selector for _, selector in gin.config._CONFIG if selector.startswith("writers.")}
    )


def _macros_set_by(bindings: Sequence[str]) -> set[str]:
    """The macros `bindings` set (`TOTAL_STEPS = 600`, not `a.b = 1`)."""
    delegate = gin.config.ParserDelegate(skip_unknown=True)
    statements = gin.config_parser.ConfigParser("\n".join(bindings), delegate)
    return {
        s.selector
        for s in statements
        if isinstance(s, gin.config_parser.BindingStatement) and not s.arg_name
    }


def _unused_macros_message(unused: Sequence[str]) -> str:
    """Why a binding like `--gin.TOTAL_STEP=10` is refused, and the names it could mean."""
    config = gin.config._CONFIG
    known = sorted({s for s, sel in config if sel == "gin.macro"} - set(unused))
    hints = [
        f"{close[0]} for {name}?"
        for name in unused
        if (close := difflib.get_close_matches(name, known, n=1))
    ]
    return (
        f"--gin_bindings set the macro(s) {', '.join(unused)}, which nothing in the config "
        f"refers to (as %{unused[0]}): the run would ignore them. "
        + (f"Did you mean {' '.join(hints)} " if hints else "")
        + f"The config's macros: {', '.join(known) or 'none'}."
        + (  # `--gin_file=configs/console.gin`: a writer config, not the demo's
            ""
            if known
            else " The demo's macros are set in configs/demo.gin: pass --gin_file=configs/demo.gin "
            "first (a writer set goes after it)."
        )
    )


def _train_manager(model_dir: str) -> MetricsManager:
    """The train manager, built in gin's `train` scope: demo.gin's
    `train/metrics_manager.MetricsManager.uptime = True` adds T5X's timing/uptime."""
    with gin.config_scope("train"):
        return configured(MetricsManager)("train", model_dir)


def _skip_gin_search_misses(record: std_logging.LogRecord) -> bool:
    """Drops gin's "Path not found" errors: it logs one per search path it tries."""
    return not (record.module == "resource_reader" and record.msg == "Path not found: %s")


def _warnings_and_log_writer_lines(record: std_logging.LogRecord) -> bool:
    """Without --verbosity, the console writer is the demo's output: INFO lines are dropped,
    except those of the absl log writer (`writers.create_default_writer.log = True`)."""
    return record.levelno >= std_logging.WARNING or record.module == "logging_writer"


def main(argv: Sequence[str]) -> None:
    """The absl entry point: T5X-style gin flags in, summaries out, then where to look."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    if not flags.FLAGS["verbosity"].present:
        logging.get_absl_handler().addFilter(_warnings_and_log_writer_lines)
    std_logging.getLogger().addFilter(_skip_gin_search_misses)
    config, _ = run(_GIN_FILE.value, _GIN_BINDINGS.value, _GIN_SEARCH_PATHS.value)
    hints = watch_hints(config.model_dir)
    try:
        if hints:
            print("\nDone. Follow the run with:", *hints, sep="\n")
            print(flush=True)
    except BrokenPipeError:  # `make demo | head`: the reader has gone, and so has this line
        devnull = os.open(os.devnull, os.O_WRONLY)  # so the exit's flush of stdout succeeds
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def watch_hints(model_dir: str) -> list[str]:
    """The commands to follow a run, for the files its writers wrote (a console-only
    config writes neither a JSONL log nor event files)."""
    train, hints = os.path.join(model_dir, "train"), []
    if os.path.exists(log := os.path.join(train, "metrics.jsonl")):
        query = '{step, loss, accuracy, lr: .["learning_rate/current"]}'
        hints.append(f"  tail -F {shlex.quote(log)} | jq -c '{query}'")
    if glob.glob(os.path.join(train, "events.out.tfevents.*")):
        hints.append(f"  tensorboard --logdir {shlex.quote(model_dir)}")  # 'my runs'
    return hints


def rewrite_gin_args(argv: Sequence[str]) -> list[str]:
    """Turns T5X's shorthand `--gin.NAME=VALUE` into `--gin_bindings=NAME = VALUE`.

    Args:
        argv: Command-line arguments; others pass through unchanged.

    Returns:
        The arguments with every `--gin.` shorthand rewritten.

    Raises:
        ValueError: A `--gin.` argument without `=`.

    Example:
        >>> rewrite_gin_args(["demo", "--gin.TOTAL_STEPS=600", "--gin_file=demo.gin"])
        ['demo', '--gin_bindings=TOTAL_STEPS = 600', '--gin_file=demo.gin']
    """
    bad = [arg for arg in argv if arg.startswith("--gin.") and "=" not in arg]
    if bad:
        raise ValueError(
            f"Expected --gin.NAME=VALUE (e.g. --gin.TOTAL_STEPS=600), got {', '.join(bad)}."
        )
    rewritten = []
    for arg in argv:
        if arg.startswith("--gin."):
            name, value = arg[len("--gin.") :].split("=", 1)
            arg = f"--gin_bindings={name} = {value}"
        rewritten.append(arg)
    return rewritten


if __name__ == "__main__":
    app.run(main, flags_parser=lambda argv: app.parse_flags_with_usage(rewrite_gin_args(argv)))
