"""The demo (`make demo`) end to end: files it writes, read back with their own readers.

One short run of the command line `make demo` uses (`python -m examples.demo
--gin_file=configs/demo.gin`, with `--gin_bindings` for fewer steps and a `tmp_path` model
dir) is shared by the tests below and the plot tests: the `demo_run` fixture of conftest.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import gin
import numpy as np
import optax
import pytest
from tensorboard.backend.event_processing import event_accumulator, event_multiplexer

import writers
from examples import demo_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOTAL_STEPS = 60
SUMMARY_PERIOD = 15
EVAL_PERIOD = 30
WARMUP_STEPS = 10
NUM_EVAL_BATCHES = 2
BATCH_SIZE = 32  # configs/demo.gin
PEAK_LEARNING_RATE = 3e-3  # configs/demo.gin

# Keys of T5X's compute_base_metrics for an unpacked batch (REFERENCE section 3).
BASE_METRIC_KEYS = (
    "accuracy",
    "loss",
    "loss_per_nonpadding_target_token",
    "loss_per_all_target_tokens",
    "z_loss",
    "z_loss_per_all_target_tokens",
    "cross_ent_loss",
    "cross_ent_loss_per_all_target_tokens",
    "timing/seqs_per_second",
    "timing/steps_per_second",
    "timing/seconds",
    "timing/seqs",
    "timing/seqs_per_second_per_core",
    "timing/target_tokens_per_second",
    "timing/target_tokens_per_second_per_core",
    "non_padding_fraction/loss_weights",
    # From the batch's `decoder_segment_ids` (T5X's packed-feature keys, feature "decoder").
    "effective_batch_size/decoder",
    "non_padding_fraction/decoder",
    "non_padding_fraction/overall",
    # Ours: every target position per second, padding included.
    "timing/all_target_tokens_per_second",
)
TRAIN_ONLY_KEYS = ("learning_rate", "learning_rate/current", "timing/uptime")


def _bindings(model_dir: str) -> list[str]:
    return [
        f"demo_model.TrainConfig.model_dir = '{model_dir}'",
        f"demo_model.TrainConfig.summary_period = {SUMMARY_PERIOD}",
        f"demo_model.TrainConfig.eval_period = {EVAL_PERIOD}",
        f"demo_model.TrainConfig.warmup_steps = {WARMUP_STEPS}",
        f"demo_model.TrainConfig.num_eval_batches = {NUM_EVAL_BATCHES}",
        f"demo_model.DataConfig.batch_size = {BATCH_SIZE}",
        f"demo_model.TrainConfig.peak_learning_rate = {PEAK_LEARNING_RATE}",
    ]


def run_demo(bindings: list[str], total_steps: int) -> str:
    """Runs `python -m examples.demo` as `make demo` does, with `bindings`; returns stdout."""
    flags = [f"--gin_bindings={binding}" for binding in bindings]
    flags.append(f"--gin.TOTAL_STEPS={total_steps}")  # T5X's shorthand for a macro binding
    # The test process raises on implicit rank promotion; hold the demo to the same rule.
    env = dict(os.environ, JAX_NUMPY_RANK_PROMOTION="raise", JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--gin_file=configs/demo.gin", *flags],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    return result.stdout


def _jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def _accumulator(run_dir: str) -> event_accumulator.EventAccumulator:
    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    return acc


def test_train_jsonl_has_one_line_per_summary_and_loss_falls(demo_run):
    model_dir, _ = demo_run
    lines = _jsonl(os.path.join(model_dir, "train", "metrics.jsonl"))
    # Every write is one line: the config text and compile time at step 0, then one line per
    # summary, and after each eval the host-timed `timing/evaluate_seconds`.
    expected = [(0, "config"), (0, "timing/compilation_seconds")]
    for step in range(SUMMARY_PERIOD, TOTAL_STEPS + 1, SUMMARY_PERIOD):
        expected.append((step, "loss"))
        if step % EVAL_PERIOD == 0:
            expected.append((step, "timing/evaluate_seconds"))
    kinds = [
        (
            line["step"],
            "loss" if "loss" in line else (set(line) - {"step", "time", "collection"}).pop(),
        )
        for line in lines
    ]
    assert kinds == expected
    assert {line["collection"] for line in lines} == {"train"}
    summaries = [line for line in lines if "loss" in line]
    assert summaries[-1]["loss"] < summaries[0]["loss"]
    assert summaries[-1]["accuracy"] > summaries[0]["accuracy"]
    for line in summaries:
        for key in BASE_METRIC_KEYS + TRAIN_ONLY_KEYS:
            assert isinstance(line[key], float) and math.isfinite(line[key]), (key, line[key])
        # learning_rate is the window's mean; the schedule only decays after warm-up.
        assert 0 < line["learning_rate/current"] <= 3e-3
    uptimes = [line["timing/uptime"] for line in summaries]
    assert 0 < uptimes[0] and all(b > a for a, b in zip(uptimes, uptimes[1:], strict=False))
    # Seconds from the manager's creation to the last summary call: at least the windows'
    # time up to that call (the last window ends when the device finishes, after the call when
    # the host runs ahead, as it does under load), at most the run's.
    windows = sum(line["timing/seconds"] for line in summaries)
    assert windows - summaries[-1]["timing/seconds"] <= uptimes[-1]
    assert uptimes[-1] <= summaries[-1]["time"] - lines[0]["time"] + 60


def test_learning_rate_is_the_window_mean_and_last_value_of_the_schedule(demo_run):
    model_dir, _ = demo_run
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=PEAK_LEARNING_RATE,
        warmup_steps=WARMUP_STEPS,
        decay_steps=TOTAL_STEPS,
        end_value=0.1 * PEAK_LEARNING_RATE,
    )
    lines = [
        line for line in _jsonl(os.path.join(model_dir, "train", "metrics.jsonl")) if "loss" in line
    ]
    for line in lines:
        # Summary at `step` covers train steps step - period + 1 .. step, whose updates use
        # the schedule at optimizer counts step - period .. step - 1.
        counts = np.arange(line["step"] - SUMMARY_PERIOD, line["step"])
        rates = np.array([float(schedule(c)) for c in counts])
        assert line["learning_rate"] == pytest.approx(rates.mean(), rel=1e-5)
        assert line["learning_rate/current"] == pytest.approx(rates[-1], rel=1e-5)


def test_counts_follow_the_window_and_the_batch(demo_run):
    model_dir, _ = demo_run
    train = [
        line for line in _jsonl(os.path.join(model_dir, "train", "metrics.jsonl")) if "loss" in line
    ]
    evals = _jsonl(os.path.join(model_dir, "eval", "synthetic", "metrics.jsonl"))
    for line in train:
        assert line["timing/seqs"] == SUMMARY_PERIOD * BATCH_SIZE  # Sum over the window
        assert line["effective_batch_size/decoder"] == BATCH_SIZE  # per step
        assert 0 < line["non_padding_fraction/loss_weights"] < 1
        assert line["timing/seqs_per_second"] == pytest.approx(
            line["timing/steps_per_second"] * BATCH_SIZE, rel=1e-5
        )
    for line in evals:
        assert line["timing/seqs"] == NUM_EVAL_BATCHES * BATCH_SIZE


def test_eval_jsonl_has_one_line_per_eval(demo_run):
    model_dir, _ = demo_run
    lines = _jsonl(os.path.join(model_dir, "eval", "synthetic", "metrics.jsonl"))
    assert [line["step"] for line in lines] == list(
        range(EVAL_PERIOD, TOTAL_STEPS + 1, EVAL_PERIOD)
    )
    assert lines[-1]["loss"] < lines[0]["loss"]


def test_tensorboard_sees_train_and_eval_runs_with_every_base_metric(demo_run):
    model_dir, _ = demo_run
    # What `tensorboard --logdir <model_dir>` finds: one run per summary directory.
    multiplexer = event_multiplexer.EventMultiplexer().AddRunsFromDirectory(model_dir)
    multiplexer.Reload()
    assert sorted(multiplexer.Runs()) == ["eval/synthetic", "train"]
    train = _accumulator(os.path.join(model_dir, "train"))
    evals = _accumulator(os.path.join(model_dir, "eval", "synthetic"))
    train_tags = set(train.Tags()["scalars"])
    eval_tags = set(evals.Tags()["scalars"])
    assert set(BASE_METRIC_KEYS + TRAIN_ONLY_KEYS) <= train_tags, sorted(train_tags)
    assert set(BASE_METRIC_KEYS) <= eval_tags, sorted(eval_tags)
    assert {"timing/compilation_seconds", "timing/evaluate_seconds"} <= train_tags
    steps = [event.step for event in train.Scalars("loss")]
    assert steps == list(range(SUMMARY_PERIOD, TOTAL_STEPS + 1, SUMMARY_PERIOD))


def test_config_gin_and_config_text_summary(demo_run):
    model_dir, _ = demo_run
    with open(os.path.join(model_dir, "config.gin")) as f:
        config = f.read()
    assert f"TOTAL_STEPS = {TOTAL_STEPS}" in config  # from --gin.TOTAL_STEPS
    # What the managers were built with: uptime for train alone (it said False, for both).
    assert "\ntrain/metrics_manager.MetricsManager.uptime = True\n" in config
    assert "\nmetrics_manager.MetricsManager.uptime = False\n" in config
    train = _accumulator(os.path.join(model_dir, "train"))
    assert train.SummaryMetadata("config").plugin_data.plugin_name == "text"
    (event,) = train.Tensors("config")
    assert event.step == 0
    text = event.tensor_proto.string_val[0].decode()
    assert f"TOTAL_STEPS = {TOTAL_STEPS}" in text


def test_it_ends_by_saying_how_to_watch_the_run(demo_run):
    model_dir, stdout = demo_run
    assert f"tail -F {model_dir}/train/metrics.jsonl | jq" in stdout
    assert f"tensorboard --logdir {model_dir}" in stdout


def test_it_names_only_the_files_the_configs_writers_wrote(tmp_path):
    from examples.demo import watch_hints

    assert watch_hints(str(tmp_path)) == []  # console.gin: neither a log nor event files
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "events.out.tfevents.1.host").write_bytes(b"")
    assert watch_hints(str(tmp_path)) == [f"  tensorboard --logdir {tmp_path}"]
    spaced = tmp_path / "my runs"  # was `tail -F /…/my runs/train/metrics.jsonl`: two files
    (spaced / "train").mkdir(parents=True)
    (spaced / "train" / "metrics.jsonl").write_text("")
    query = '{step, loss, accuracy, lr: .["learning_rate/current"]}'
    assert watch_hints(str(spaced)) == [
        f"  tail -F '{spaced}/train/metrics.jsonl' | jq -c '{query}'"
    ]


def test_console_shows_train_and_eval_summaries(demo_run):
    _, stdout = demo_run
    assert f"step {TOTAL_STEPS}" in stdout
    assert "eval/synthetic" in stdout
    assert "loss_per_nonpadding_target_token" in stdout


def test_bad_config_names_every_problem():
    with pytest.raises(ValueError) as error:
        demo_model.check_configs(
            demo_model.ModelConfig(vocab_size=32),
            demo_model.DataConfig(vocab_size=16, batch_size=6),
            demo_model.TrainConfig(
                num_microbatches=4,
                total_steps=10,
                warmup_steps=10,
                summary_period=4,
                eval_period=6,
                model_dir="",  # an unset shell variable: os.makedirs('') failed after compiling
                eval_name="../train",  # its files listed twice: the earlier run's were stranded
            ),
        )
    message = str(error.value)
    assert (
        "TrainConfig.eval_name='../train' must name a directory under <model_dir>/eval" in message
    )
    assert "TrainConfig.model_dir='' must name a directory (is $MODEL_DIR set?)" in message
    assert "DataConfig.vocab_size=16 must equal ModelConfig.vocab_size=32" in message
    assert "DataConfig.batch_size=6 must be divisible by TrainConfig.num_microbatches=4" in message
    assert "TrainConfig.warmup_steps=10 must be < TrainConfig.total_steps=10" in message
    assert "TrainConfig.eval_period=6 must be a multiple of TrainConfig.summary_period=4" in message


def test_a_url_model_dir_with_one_slash_is_refused_before_compiling():
    # The managers refused it only after the demo had compiled and locked ./gs:/b/run/.demo.lock.
    with pytest.raises(ValueError) as error:
        demo_model.check_configs(
            demo_model.ModelConfig(),
            demo_model.DataConfig(),
            demo_model.TrainConfig(model_dir="gs:/b/run"),
        )
    assert "pass the URL with its '//', TrainConfig.model_dir='gs://b/run'" in str(error.value)


def test_a_model_dir_that_is_a_file_is_refused_before_compiling(tmp_path):
    # makedirs raised a bare FileExistsError, after the model had compiled.
    (tmp_path / "run").write_text("")
    for model_dir, file in [("run", "run"), ("run/sub", "run")]:
        with pytest.raises(ValueError) as error:
            demo_model.check_configs(
                demo_model.ModelConfig(),
                demo_model.DataConfig(),
                demo_model.TrainConfig(model_dir=str(tmp_path / model_dir)),
            )
        assert str(error.value) == (
            f"Invalid demo config: TrainConfig.model_dir={str(tmp_path / model_dir)!r} must "
            f"name a directory, but {str(tmp_path / file)!r} is a file: move it, or pick "
            "another MODEL_DIR (--gin.MODEL_DIR=\"'/tmp/demo'\")."
        )
    demo_model.check_configs(  # a directory that does not exist yet is made
        demo_model.ModelConfig(),
        demo_model.DataConfig(),
        demo_model.TrainConfig(model_dir=str(tmp_path / "new" / "run")),
    )


def test_a_config_field_of_the_wrong_type_is_named_before_any_range_check():
    # --gin.TOTAL_STEPS=10.5 or ='abc' used to fail in a comparison ('<' between str and
    # int) or further on in a writer, naming no config field.
    with pytest.raises(TypeError) as error:
        demo_model.check_configs(
            demo_model.ModelConfig(embed_dim=True),
            demo_model.DataConfig(noise="0.1"),
            demo_model.TrainConfig(total_steps="abc", summary_period=2.5, z_loss=None),
        )
    assert str(error.value) == (
        "Invalid demo config: ModelConfig.embed_dim=True must be an int, got bool; "
        "DataConfig.noise='0.1' must be a number, got str; "
        "TrainConfig.total_steps='abc' must be an int, got str; "
        "TrainConfig.summary_period=2.5 must be an int, got float; "
        "TrainConfig.z_loss=None must be a number, got NoneType. In gin, numbers go without "
        "quotes (TOTAL_STEPS = 50, not '50')."
    )
    # Every field's annotation is one the check knows, and the defaults pass it.
    demo_model.check_configs(
        demo_model.ModelConfig(),
        demo_model.DataConfig(),
        demo_model.TrainConfig(loss_normalizing_factor=None, peak_learning_rate=1),
    )


def test_t5x_gin_shorthand_is_rewritten_and_a_missing_value_named():
    from examples.demo import rewrite_gin_args

    assert rewrite_gin_args(["demo", "--gin.MODEL_DIR='/tmp/x'", "--gin_file=demo.gin"]) == [
        "demo",
        "--gin_bindings=MODEL_DIR = '/tmp/x'",
        "--gin_file=demo.gin",
    ]
    with pytest.raises(ValueError, match="--gin.TOTAL_STEPS, --gin.SEED"):
        rewrite_gin_args(["demo", "--gin.TOTAL_STEPS", "--gin.SEED"])


def test_a_missing_gin_file_is_named_with_where_it_was_looked_for(tmp_path):
    from examples.demo import DEFAULT_CONFIGS_DIR, run

    with pytest.raises(FileNotFoundError) as error:
        run(["demo.gin", "nope.gin"], gin_search_paths=(DEFAULT_CONFIGS_DIR, str(tmp_path)))
    message = str(error.value)
    assert "['nope.gin'] not found" in message and str(tmp_path) in message
    assert "or one of ['console.gin', 'default.gin', 'demo.gin'," in message
    # configs/ not searched: naming its files would send the user to a name that fails too
    with pytest.raises(FileNotFoundError) as error:
        run(["demo.gin"], gin_search_paths=(str(tmp_path),))
    assert str(error.value).endswith(
        f"pass a path, or add {DEFAULT_CONFIGS_DIR} to --gin_search_paths."
    )


def test_piped_into_a_reader_that_stops_early_it_exits_0_and_writes_every_summary(tmp_path):
    model_dir = str(tmp_path / "run")
    # A 1-layer model on 8 sequences: compiling dominates this run, and no value is checked.
    small = ["demo_model.ModelConfig.num_layers = 1", "demo_model.DataConfig.batch_size = 8"]
    log = ["writers.create_default_writer.log = True"]  # as configs/demo.gin suggests
    flags = [f"--gin_bindings={binding}" for binding in _bindings(model_dir) + small + log]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "examples.demo",
            "--gin_file=configs/demo.gin",
            *flags,
            f"--gin.TOTAL_STEPS={TOTAL_STEPS}",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as demo:
        assert demo.stdout is not None and demo.stderr is not None
        assert demo.stdout.readline().startswith("step 0")  # `| head -1`, then the reader exits
        demo.stdout.close()
        stderr = demo.stderr.read()
        assert demo.wait(timeout=300) == 0, stderr[-5000:]
    # The console writer fails once, logged with its step; no retries, no exit-time traceback.
    errors = [line for line in stderr.splitlines() if line.startswith("E")]
    assert len(errors) == 1 and "writer:console" in errors[0], errors
    assert "BrokenPipeError" in errors[0] and "closed the pipe" in errors[0]
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert "quarantined" not in stderr
    # The absl log writer's lines are the only INFO lines (the demo hides other INFO logs).
    infos = [line for line in stderr.splitlines() if line.startswith("I")]
    assert all("logging_writer.py" in line for line in infos), infos[:3]
    train_steps = [int(line.split("] [")[1].split("]")[0]) for line in infos if " loss=" in line]
    expected = list(range(SUMMARY_PERIOD, TOTAL_STEPS + 1, SUMMARY_PERIOD))
    assert train_steps == sorted(expected + list(range(EVAL_PERIOD, TOTAL_STEPS + 1, EVAL_PERIOD)))
    # Every other writer has every summary: the train log's config, compile time, summaries
    # and eval times (as in test_train_jsonl_...), and TensorBoard the same summaries.
    lines = _jsonl(os.path.join(model_dir, "train", "metrics.jsonl"))
    summaries = [line["step"] for line in lines if "loss" in line]
    assert summaries == list(range(SUMMARY_PERIOD, TOTAL_STEPS + 1, SUMMARY_PERIOD))
    assert len(lines) == 2 + len(summaries) + TOTAL_STEPS // EVAL_PERIOD
    steps = [e.step for e in _accumulator(os.path.join(model_dir, "train")).Scalars("loss")]
    assert steps == summaries


def test_bad_data_config_names_every_problem():
    with pytest.raises(ValueError) as error:
        demo_model.SyntheticSequences(demo_model.DataConfig(num_rules=0, noise=1.5, min_length=40))
    assert str(error.value) == (
        "Invalid DataConfig: num_rules must be >= 1, got 0; need 2 <= min_length <= max_length, "
        "got min_length=40, max_length=32; noise must be in [0, 1], got 1.5."
    )
    with pytest.raises(
        ValueError, match="vocab_size=32 must exceed 2 special tokens \\+ num_rules=29"
    ):
        demo_model.SyntheticSequences(demo_model.DataConfig(num_rules=29))


def test_a_new_run_does_not_delete_the_files_of_a_run_still_writing_them(tmp_path):
    # Before, it unlinked them before its managers (whose JSONL lock refuses a second
    # writer) existed: the running run went on writing deleted files and lost its log.
    from examples import demo

    log = tmp_path / "train" / "metrics.jsonl"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, writers; w = writers.JsonlWriter(sys.argv[1]); "
            "w.write_scalars(1, {'loss': 1.0}); w.flush(); print('ready', flush=True); "
            "sys.stdin.read(); w.close()",
            str(log),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "ready\n"
        config = demo_model.TrainConfig(model_dir=str(tmp_path))
        with pytest.raises(RuntimeError, match=r"metrics.jsonl is being written by a running"):
            with demo._previous_run_set_aside(config):
                pass
        assert [json.loads(x)["loss"] for x in log.read_text().splitlines()] == [1.0]
    finally:
        holder.communicate("", timeout=30)
    assert holder.returncode == 0
    with demo._previous_run_set_aside(config) as writers_built:  # the other run has ended
        writers_built()  # its files go
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["train"]


def _files(root) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_writers_that_cannot_be_built_leave_the_earlier_run_as_it_was(tmp_path):
    """A bad writer binding (or a tracker that refuses) deleted the earlier run's files:
    they were removed before the managers were built."""
    from examples import demo
    from metrics_manager import MetricsManager

    config = demo_model.TrainConfig(model_dir=str(tmp_path), eval_name="synthetic")
    with MetricsManager("train", tmp_path) as earlier:  # an earlier run's files
        earlier.write_scalar("loss", 1.5, 10)
    (tmp_path / "config.gin").write_text("TOTAL_STEPS = 10\n")
    before = _files(tmp_path)
    assert "train/metrics.jsonl" in before and len(before) == 3  # and an event file

    def bad(logdir):
        return writers.create_default_writer(logdir, console="False")  # gin's 'False'

    with pytest.raises(TypeError, match="console must be True or False, got 'False'"):
        with (
            demo._previous_run_set_aside(config) as writers_built,
            MetricsManager("train", tmp_path) as train,  # its files are made, then removed
            MetricsManager("eval/synthetic", tmp_path, writer_factory=bad),
        ):
            writers_built()
    assert train.closed and _files(tmp_path) == before
    fresh = demo_model.TrainConfig(model_dir=str(tmp_path / "fresh"), eval_name="synthetic")
    with pytest.raises(TypeError, match="console must be True or False, got 'False'"):
        with (
            demo._previous_run_set_aside(fresh) as writers_built,
            MetricsManager("train", fresh.model_dir),  # no empty log left behind either
            MetricsManager("eval/synthetic", fresh.model_dir, writer_factory=bad),
        ):
            writers_built()
    assert _files(tmp_path / "fresh") == {}
    with demo._previous_run_set_aside(config) as writers_built:
        with MetricsManager("train", tmp_path) as train:
            writers_built()
            train.write_scalar("loss", 0.5, 1)
    assert [line["loss"] for line in writers.read_jsonl(tmp_path / "train")] == [0.5]
    assert not (tmp_path / "config.gin").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".earlier")] == []


def test_a_second_demo_on_one_model_dir_is_refused_whatever_its_writers(tmp_path):
    """A TensorBoard-only run writes no JSONL log to lock: a second demo deleted its files."""
    from examples import demo

    with demo._one_demo_at_a_time(str(tmp_path)):
        with pytest.raises(RuntimeError, match=r"Another demo is writing .*another MODEL_DIR"):
            with demo._one_demo_at_a_time(str(tmp_path)):
                pass
    with demo._one_demo_at_a_time(str(tmp_path)):  # the first has ended
        pass


def test_a_model_dir_under_home_is_expanded(tmp_path, monkeypatch):
    """A quoted '~/runs' made a directory named '~' in the working directory."""
    from examples import demo

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(demo, "train", lambda model, data, config: {})  # the config it gets
    try:
        config, _ = demo.run(["demo.gin"], ["MODEL_DIR = '~/runs/x'"])
    finally:
        gin.clear_config()
    assert config.model_dir == str(tmp_path / "runs" / "x")


def test_an_unquoted_str_binding_is_named_with_the_quotes_it_needs():
    from examples import demo

    expected = (
        "Unable to parse value. 'MODEL_DIR = /tmp/x': a str value needs gin's quotes inside "
        "the shell's, e.g. --gin.MODEL_DIR=\"'/tmp/demo'\""
    )
    try:
        with pytest.raises(SyntaxError) as error:
            demo.run(["demo.gin"], ["MODEL_DIR = /tmp/x"])  # from --gin.MODEL_DIR=/tmp/x
        with pytest.raises(SyntaxError) as other:  # not about a value: gin's own error
            demo.run(["demo.gin"], ["TOTAL_STEPS 50"])
    finally:
        gin.clear_config()
    assert error.value.msg == expected
    assert other.value.msg == "Couldn't parse statement, expected ':' or '='."
    for value in ("runs/x", "x"):  # gin said "malformed node or string ... <ast.Name ...>"
        try:
            with pytest.raises(SyntaxError) as relative:
                demo.run(["demo.gin"], [f"MODEL_DIR = {value}"])
        finally:
            gin.clear_config()
        assert relative.value.msg == expected.replace("/tmp/x", value)


def test_run_can_be_called_again_in_one_process():
    """A notebook's second `run()` met gin's locked config of the first."""
    from examples import demo

    try:
        for _ in range(2):
            with pytest.raises(ValueError, match=r"warmup_steps=30 must be < TrainConfig\.total"):
                demo.run(["demo.gin"], ["TOTAL_STEPS = 20"])
    finally:
        gin.clear_config()


def test_a_macro_binding_nothing_uses_is_refused_with_the_names_it_could_mean():
    """`--gin.TOTAL_STEP=10` (one letter short) set a macro no binding refers to: the run
    went on with 300 steps."""
    from examples import demo

    try:
        with pytest.raises(ValueError) as error:
            demo.run(["demo.gin"], ["TOTAL_STEP = 10", "MODEL_DIR = '/tmp/x'", "SEDE = 1"])
    finally:
        gin.clear_config()
    assert str(error.value) == (
        "--gin_bindings set the macro(s) SEDE, TOTAL_STEP, which nothing in the config refers "
        "to (as %SEDE): the run would ignore them. Did you mean TOTAL_STEPS for TOTAL_STEP? "
        "The config's macros: MAX_LENGTH, MODEL_DIR, TOTAL_STEPS, VOCAB_SIZE."
    )


def test_a_writer_set_alone_is_refused(tmp_path, monkeypatch):
    """`--gin_file=writers/jsonl.gin` alone bound create_default_writer, but no manager's
    writer_factory: the run ignored `tensorboard = False` and wrote event files too."""
    from examples import demo

    config = demo_model.TrainConfig(
        model_dir=str(tmp_path), total_steps=2, summary_period=1, eval_period=2, warmup_steps=1
    )
    monkeypatch.setattr(demo_model, "TrainConfig", lambda: config)
    try:
        with pytest.raises(ValueError) as error:
            demo.run(["writers/jsonl.gin"])
    finally:
        gin.clear_config()
    assert str(error.value) == (
        "The gin config binds writers.create_default_writer, but no binding hands a writer "
        "factory to the managers (metrics_manager.MetricsManager.writer_factory): the run would "
        "ignore those bindings and write the default writers. A writer set goes after the "
        "demo's config, which binds it: --gin_file=configs/demo.gin --gin_file=writers/jsonl.gin."
    )
    assert not os.listdir(tmp_path)


def test_a_writer_set_alone_with_a_macro_binding_is_refused_as_a_writer_set_alone():
    """`--gin_file=writers/console.gin --gin.TOTAL_STEPS=40` was refused as a macro nothing
    refers to ("The config's macros: none"), with no word of the missing configs/demo.gin."""
    from examples import demo

    try:
        with pytest.raises(ValueError) as error:
            demo.run(["writers/console.gin"], ["TOTAL_STEPS = 40", "MODEL_DIR = '/tmp/x'"])
    finally:
        gin.clear_config()
    assert str(error.value).endswith(
        "A writer set goes after the demo's config, which binds it: "
        "--gin_file=configs/demo.gin --gin_file=writers/console.gin."
    )


def test_a_macro_binding_on_a_writer_config_alone_names_demo_gin():
    """`--gin_file=configs/console.gin --gin.TOTAL_STEPS=40` (a top-level writer config in
    place of demo.gin) was refused with "The config's macros: none." and no way forward."""
    from examples import demo

    try:
        with pytest.raises(ValueError) as error:
            demo.run(["console.gin"], ["TOTAL_STEPS = 40"])
    finally:
        gin.clear_config()
    assert str(error.value).endswith(
        "The config's macros: none. The demo's macros are set in configs/demo.gin: pass "
        "--gin_file=configs/demo.gin first (a writer set goes after it)."
    )


def test_a_writer_set_before_demo_gin_is_refused(monkeypatch, tmp_path):
    """`--gin_file=writers/console.gin --gin_file=configs/demo.gin`: demo.gin's default.gin
    bound the writers again, and the run wrote TensorBoard and JSONL files, not the console
    alone it was asked for."""
    from examples import demo

    monkeypatch.setattr(demo, "train", lambda model, data, config: {})
    try:
        with pytest.raises(ValueError) as error:
            demo.run(["writers/console.gin", "demo.gin"])
        demo.run(["demo.gin", "writers/jsonl.gin", "writers/console.gin"])  # the last one wins
        assert gin.query_parameter("writers.create_default_writer.tensorboard") is False
        assert gin.query_parameter("writers.create_default_writer.jsonl") is False
        tweak = tmp_path / "log.gin"  # binds a writer parameter, but no writer set
        tweak.write_text(
            "from __gin__ import dynamic_registration\nimport writers\n"
            "writers.create_default_writer.log = True\n"
        )
        demo.run(["demo.gin", "writers/console.gin", str(tweak)])
        assert gin.query_parameter("writers.create_default_writer.log") is True
        assert gin.query_parameter("writers.create_default_writer.tensorboard") is False
    finally:
        gin.clear_config()
    assert str(error.value) == (
        "--gin_file=writers/console.gin comes before --gin_file=demo.gin, which binds the "
        "writers again: the run would ignore the writer set. A writer set goes after the "
        "demo's config: --gin_file=demo.gin --gin_file=writers/console.gin."
    )


def test_without_gin_file_it_runs_demo_gin(tmp_path):
    """`python -m examples.demo --gin.MODEL_DIR=...` parsed no file: the binding was ignored
    and the run trained into (after deleting) ./runs/demo."""
    model_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "examples.demo", f"--gin.MODEL_DIR='{model_dir}'"]
        + ["--gin.TOTAL_STEPS=20"],  # fewer than demo.gin's warm-up steps: refused at once
        cwd=REPO,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "warmup_steps=30 must be < TrainConfig.total_steps=20" in result.stderr
    assert not model_dir.exists()


def test_a_misspelled_parameter_binding_gets_the_name_it_could_mean():
    """`--gin_bindings='demo_model.TrainConfig.num_microbatch = 4'`: gin's error named the
    misspelling but not the parameters there are (a class's read as `args, kwargs`)."""
    from examples import demo

    try:
        with pytest.raises(ValueError) as error:
            demo.run(["demo.gin"], ["demo_model.TrainConfig.num_microbatch = 4"])
    finally:
        gin.clear_config()
    assert str(error.value).startswith(
        "Configurable 'demo_model.TrainConfig' doesn't have a parameter named 'num_microbatch'."
    )
    assert error.value.__notes__ == [
        "Did you mean num_microbatches? demo_model.TrainConfig takes: model_dir, total_steps, "
        "summary_period, eval_period, num_eval_batches, eval_name, num_microbatches, "
        "peak_learning_rate, warmup_steps, z_loss, label_smoothing, loss_normalizing_factor, "
        "seed."
    ]


def test_a_misspelled_configurable_binding_gets_the_name_it_could_mean():
    """`--gin_bindings='writers.create_default_writr.log = True'`: gin's "No configurable
    matching" named no configurable there is."""
    from examples import demo

    try:
        with pytest.raises(ValueError) as error:
            demo.run(["demo.gin"], ["demo_model.TrainConfg.seed = 1"])
    finally:
        gin.clear_config()
    assert str(error.value).startswith("No configurable matching 'demo_model.TrainConfg'.")
    assert error.value.__notes__ == ["Did you mean demo_model.TrainConfig?"]
