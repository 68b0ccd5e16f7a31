"""WandbWriter in offline mode (tests/conftest.py sets WANDB_MODE=offline): every value read
back from the offline run file (`run-<id>.wandb`) with W&B's own record proto."""

from __future__ import annotations

import enum
import functools
import glob
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import wandb
from PIL import Image

import writers
from metrics_manager import MetricsManager
from tests.writers.tracker_stores import (
    wandb_config,
    wandb_history,
    wandb_records,
    wandb_run_files,
    wandb_run_record,
)
from writers import _checks, _encode


def _writer(tmp_path, **kwargs) -> writers.WandbWriter:
    kwargs.setdefault("process_index", 0)
    return writers.WandbWriter("tests", logdir=tmp_path, **kwargs)


def _value(step: int, i: int) -> float:
    return step * 0.5 + i / 16


def test_200_summaries_x_20_keys_one_log_each_all_read_back(tmp_path, monkeypatch):
    w = _writer(tmp_path, run_id="full", collection="train")
    calls = []
    log = w.run.log
    monkeypatch.setattr(w.run, "log", lambda *a, **k: calls.append(1) or log(*a, **k))
    for step in range(200):
        w.write_scalars(step, {f"train/m{i:02d}": np.float32(_value(step, i)) for i in range(20)})
    w.close()
    assert len(calls) == 200
    (path,) = wandb_run_files(str(tmp_path))
    assert wandb_run_record(path).run_id == "full-train"
    history = wandb_history(path)
    assert history == {
        step: {f"train/m{i:02d}": _value(step, i) for i in range(20)} for step in range(200)
    }
    assert sum(len(row) for row in history.values()) == 200 * 20


def _exit_code(path: str) -> int:
    return next(
        r.exit.exit_code for r in wandb_records(path) if r.WhichOneof("record_type") == "exit"
    )


def test_a_with_block_that_raises_ends_the_run_with_exit_code_1(tmp_path):
    with pytest.raises(RuntimeError, match="diverged"), _writer(tmp_path, run_id="bad") as w:
        w.write_scalars(3, {"loss": 0.5})
        raise RuntimeError("diverged")
    with _writer(tmp_path, run_id="good") as ok:
        ok.write_scalars(1, {"loss": 1.0})
    bad, good = wandb_run_files(str(tmp_path))
    assert (wandb_run_record(bad).run_id, wandb_run_record(good).run_id) == ("bad", "good")
    assert _exit_code(bad) == 1 and _exit_code(good) == 0  # as `with wandb.init()`: failed
    assert wandb_history(bad) == {3: {"loss": 0.5}}


def test_a_managers_with_block_that_raises_ends_its_tracker_run_failed(tmp_path):
    factory = functools.partial(
        writers.create_tracker_writer,
        tracker=functools.partial(writers.WandbWriter, "tests", process_index=0),
        default_writer=functools.partial(writers.create_default_writer, console=False),
    )
    with pytest.raises(RuntimeError, match="diverged"):
        with MetricsManager("train", tmp_path, writer_factory=factory) as manager:
            manager.write_scalars(3, {"loss": 0.5})
            raise RuntimeError("diverged")
    (path,) = wandb_run_files(str(tmp_path / "train"))
    assert _exit_code(path) == 1  # was 0: the crashed loop's run looked complete
    assert wandb_history(path) == {3: {"loss": 0.5}}


def test_a_path_object_of_a_url_is_refused_before_it_makes_a_local_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"logdir Posix.*'//' collapsed.*logdir='gs://b/run'"):
        writers.WandbWriter("tests", logdir=pathlib.Path("gs://b/run"), process_index=0)
    assert os.listdir(tmp_path) == []


def test_nan_inf_texts_and_calls_at_one_step_fill_one_row(tmp_path):
    w = _writer(tmp_path)
    w.write_scalars(1, {"nan": float("nan"), "inf": np.inf, "n": np.int64(7)})
    w.write_texts(1, {"note": "héllo"})
    w.write_scalars(2, {"n": 8})
    w.write_scalars(3, {"zero": -0.0, "big": 2**63 - 1, "past_int64": 2**63})
    w.close()
    rows = wandb_history(wandb_run_files(str(tmp_path))[0])
    assert np.isnan(rows[1]["nan"]) and rows[1]["inf"] == np.inf
    assert (rows[1]["n"], rows[1]["note"], rows[2]) == (7, "héllo", {"n": 8})
    assert rows[3] == {"zero": 0, "big": 2**63 - 1, "past_int64": 2.0**63}  # W&B's JSON
    assert type(rows[3]["zero"]) is int


def test_images_videos_audio_histograms(tmp_path):
    w = _writer(tmp_path)
    image = np.arange(2 * 4 * 5 * 3, dtype=np.uint8).reshape(2, 4, 5, 3)
    # wandb.Image squeezes an array: a [1, W, 1] image raised ("Un-supported shape"), and a
    # [1, W, 3] one became a [W, 3] grayscale image.
    thin = {
        "row": np.arange(5, dtype=np.uint8).reshape(1, 5, 1),
        "dot": np.full((1, 1, 1), 9),
        "rgb": np.arange(6, dtype=np.uint8).reshape(2, 1, 3),
    }
    half = np.array([[0.5, 0.25]], np.float32)[..., None]  # as CLU's tf.summary.image: 127, 63
    w.write_images(3, {"img": image, "one": np.ones((4, 5, 1)), "half": half, **thin})
    frames = np.arange(3 * 4 * 5 * 3, dtype=np.uint8).reshape(1, 3, 4, 5, 3)  # each differs
    w.write_videos(3, {"vid": frames})
    clips = np.linspace(-1, 1, 2 * 8).reshape(2, 8, 1)
    w.write_audios(3, {"aud": clips, "solo": clips[:1]}, sample_rate=8000)
    w.write_histograms(3, {"h": np.array([0.0, 1.0, 1.0, 3.0])}, num_buckets={"h": 3})
    w.close()
    (path,) = wandb_run_files(str(tmp_path))
    row = wandb_history(path)[3]
    run_dir = os.path.join(os.path.dirname(path), "files")

    def pixels(name: str) -> np.ndarray:
        return np.asarray(Image.open(os.path.join(run_dir, name)))

    assert row["img"]["_type"] == "images/separated" and row["img"]["count"] == 2
    for i, name in enumerate(row["img"]["filenames"]):  # N images per key, in order
        np.testing.assert_array_equal(pixels(name), image[i])
    np.testing.assert_array_equal(pixels(row["one"]["filenames"][0]), np.full((4, 5), 255))
    np.testing.assert_array_equal(pixels(row["half"]["filenames"][0]), [[127, 63]])
    np.testing.assert_array_equal(pixels(row["row"]["filenames"][0]), [[0, 1, 2, 3, 4]])
    np.testing.assert_array_equal(pixels(row["dot"]["filenames"][0]), [[9]])
    np.testing.assert_array_equal(pixels(row["rgb"]["filenames"][0]), thin["rgb"])
    (strip,) = row["vid"]["filenames"]  # one filmstrip [H, T*W, C] per video
    np.testing.assert_array_equal(pixels(strip), np.concatenate(list(frames[0]), axis=1))
    for key, i in (("aud/0", 0), ("aud/1", 1), ("solo", 0)):  # one clip per key (N > 1: `/<i>`)
        clip = row[key]
        assert clip["_type"] == "audio-file"
        with open(os.path.join(run_dir, clip["path"]), "rb") as f:
            assert f.read() == _encode.wav(clips[i], 8000)  # the WAV header holds the rate
    assert "solo/0" not in row
    assert row["h"] == {"_type": "histogram", "values": [1, 2, 1], "bins": [0, 1, 2, 3]}


def test_hparams_are_the_run_config(tmp_path):
    w = _writer(tmp_path, config={"seed": 1})
    w.write_hparams({"lr": np.float32(0.5), "name": "adam", "shape": (2, 3), "opt": {"b1": 0.9}})
    w.write_hparams({"lr": 0.25})  # W&B config values may change
    # '_wandb' is W&B's own config entry: it was replaced, alone or beside a MultiWriter's JSONL.
    with pytest.raises(ValueError, match=r"^WandbWriter.write_hparams: the hyperparameter name "):
        w.write_hparams({"_wandb": 1, "lr": 0.125})
    jsonl = writers.JsonlWriter(tmp_path / "log")
    with pytest.raises(ValueError, match=r"^MultiWriter.write_hparams: w: the hyperparameter"):
        writers.MultiWriter({"j": jsonl, "w": w}).write_hparams({"_wandb": 1})
    jsonl.close()
    w.close()
    config = wandb_config(wandb_run_files(str(tmp_path))[0])
    assert config == {"seed": 1, "lr": 0.25, "name": "adam", "shape": "(2, 3)", "opt.b1": 0.9}
    assert writers.read_jsonl(tmp_path / "log" / "metrics.jsonl") == []


def test_an_initial_config_is_flattened_as_write_hparams_flattens(tmp_path):
    # Given to W&B as it was, {"opt": {"lr": 0.1}} stayed nested beside write_hparams's
    # "opt.lr": the run's config held opt.lr twice, 0.1 and 0.2.
    w = _writer(tmp_path, config={"opt": {"lr": 0.1}, "layers": [64, 64], "seed": np.int64(1)})
    w.write_hparams({"opt": {"lr": 0.2}})
    w.close()
    config = wandb_config(wandb_run_files(str(tmp_path))[0])
    assert config == {"opt.lr": 0.2, "layers": "[64, 64]", "seed": 1}
    with pytest.raises(ValueError, match=r"^WandbWriter\(config=...\): the hyperparameter name"):
        _writer(tmp_path, config={"_wandb": 1})


def test_enum_hparams_are_their_values_as_in_every_other_writer(tmp_path):
    # W&B serializes a str subclass that is an Enum by its member name ('ADAM').
    class Opt(enum.StrEnum):
        ADAM = "adam"

    class Mix(str, enum.Enum):  # noqa: UP042  (the older spelling, which W&B also named)
        SGD = "sgd"

    w = _writer(tmp_path)
    w.write_hparams({"opt": Opt.ADAM, "mix": Mix.SGD, "budget": np.timedelta64(90, "s")})
    w.close()
    config = wandb_config(wandb_run_files(str(tmp_path))[0])
    assert config == {"opt": "adam", "mix": "sgd", "budget": "90 seconds"}


def test_a_decreasing_step_raises_instead_of_being_dropped(tmp_path):
    w = _writer(tmp_path)
    w.write_scalars(5, {"a": 1.0})
    w.write_scalars(5, {"b": 2.0})  # the same step: one row
    with pytest.raises(ValueError, match=r"got step 4 for \['a'\] after step 5"):
        w.write_scalars(4, {"a": 3.0})
    w.close()
    assert wandb_history(wandb_run_files(str(tmp_path))[0]) == {5: {"a": 1.0, "b": 2.0}}


def test_writers_sharing_a_run_refuse_a_step_below_the_runs_last(tmp_path):
    # Train and eval managers logging to one run: eval's step 100 after train's 110 was
    # dropped by W&B with no error (each writer only knew its own last step).
    run = wandb.init(project="tests", dir=str(tmp_path), reinit="create_new")
    train = writers.WandbWriter(run=run, process_index=0)
    evals = writers.WandbWriter(run=run, process_index=0)
    train.write_scalars(100, {"loss": 1.0})
    train.write_scalars(110, {"loss": 0.5})
    with pytest.raises(ValueError, match=r"got step 100 for \['eval/loss'\] after step 110 of run"):
        evals.write_scalars(100, {"eval/loss": 2.0})
    evals.write_scalars(110, {"eval/loss": 2.0})  # the same row
    run.finish()
    assert wandb_history(wandb_run_files(str(tmp_path))[0]) == {
        100: {"loss": 1.0},
        110: {"loss": 0.5, "eval/loss": 2.0},
    }


def test_resume_rewinds_to_the_resume_step(tmp_path, caplog):
    first = _writer(tmp_path, run_id="run1")
    for step in range(10):
        first.write_scalars(step, {"loss": float(step)})
    first.close()  # logged steps 0-9; the checkpoint was at step 5

    again = _writer(tmp_path, run_id="run1", resume_step=5)
    # The restarted loop writes its config at step 0 and an eval at the restored step:
    # W&B keeps the run before's history there. They raised "steps never decrease ...
    # after step 6 ... or resume with resume_step", a writer failure on every restart.
    again.write_texts(0, {"config": "lr = 0.1"})
    again.write_scalars(5, {"loss": 0.0})
    warned = [r.getMessage() for r in caplog.records if "resume_step=5" in r.getMessage()]
    assert warned == [
        "WandbWriter.write_texts: step 0 (keys ['config']) is at or before resume_step=5, "
        "where run run1 keeps the history of the run before, which W&B does not let a resumed "
        "run write: left out of W&B (the other writers have it). Warned once; later writes up "
        "to step 5 are left out silently."
    ]
    for step in range(6, 13):
        again.write_scalars(step, {"loss": 100.0 + step})
    again.close()
    old, new = wandb_run_files(str(tmp_path))
    assert wandb_history(old) == {s: {"loss": float(s)} for s in range(10)}
    # Offline, the rewind is recorded for `wandb sync`: the new run file names the point.
    record = wandb_run_record(new)
    assert (record.run_id, record.branch_point.run, record.branch_point.value) == (
        "run1",
        "run1",
        5,
    )
    assert wandb_history(new) == {s: {"loss": 100.0 + s} for s in range(6, 13)}


def test_collections_that_differ_in_characters_ids_refuse_get_runs_of_their_own(tmp_path):
    # 'eval/a', 'eval:a', 'eval a' and 'eval-a' were all run 'r1-eval-a': four evals in one
    # run, each step's values replacing the others'.
    collections = ["eval/a", "eval:a", "eval a", "eval-a", "train"]
    for i, collection in enumerate(collections):
        w = _writer(tmp_path, run_id="r1", collection=collection)
        w.write_scalars(1, {"acc": i / 4})
        w.close()
    runs = {
        wandb_run_record(path).run_id: wandb_history(path)
        for path in wandb_run_files(str(tmp_path))
    }
    assert runs == {  # names W&B takes as they are keep their ids: resume finds them
        "r1-eval-a-66fbbe75": {1: {"acc": 0.0}},  # sha256("eval/a")[:8]
        "r1-eval-a-a92f90ba": {1: {"acc": 0.25}},
        "r1-eval-a-a59e9c25": {1: {"acc": 0.5}},
        "r1-eval-a": {1: {"acc": 0.75}},
        "r1-train": {1: {"acc": 1.0}},
    }


def test_resume_needs_a_run_id(tmp_path):
    with pytest.raises(ValueError, match="needs the run to resume; pass run_id="):
        _writer(tmp_path, resume_step=3)


def test_a_fresh_start_passing_resume_step_0_without_a_run_id_is_a_new_run(tmp_path):
    # A loop passing its restored step passes resume_step=0 when it starts fresh, as the
    # manager allows: without a run_id that raised, and no writer of the set was made.
    factory = functools.partial(
        writers.create_tracker_writer,
        tracker=functools.partial(writers.WandbWriter, "tests", process_index=0),
        default_writer=functools.partial(writers.create_default_writer, console=False),
    )
    with MetricsManager("train", tmp_path, writer_factory=factory, resume_step=0) as manager:
        manager.write_texts(0, {"config": "lr = 0.1"})  # kept: no run before holds step 0
        manager.write_scalars(10, {"loss": 0.5})
    assert manager.errors == []
    (path,) = wandb_run_files(str(tmp_path / "train"))
    assert wandb_history(path) == {0: {"config": "lr = 0.1"}, 10: {"loss": 0.5}}
    assert not wandb_run_record(path).HasField("branch_point")


def test_resume_step_0_with_a_run_id_is_a_new_run_until_a_run_of_that_id_is_there(tmp_path):
    # A fresh start passing its restored step 0 with a fixed run_id: the writer rewound the
    # run to step 0, leaving out the new run's own step 0 (its config, its first loss) and
    # naming a rewind point of a run that was never there.
    first = _writer(tmp_path, run_id="exp", collection="train", resume_step=0)
    first.write_texts(0, {"config": "lr = 0.1"})
    first.write_scalars(0, {"loss": 2.0})
    first.write_scalars(1, {"loss": 1.0})
    first.close()
    (path,) = wandb_run_files(str(tmp_path))
    assert wandb_history(path) == {0: {"config": "lr = 0.1", "loss": 2.0}, 1: {"loss": 1.0}}
    assert not wandb_run_record(path).HasField("branch_point")
    # Restarted before its first checkpoint: the run is there now, so it is rewound to 0.
    again = _writer(tmp_path, run_id="exp", collection="train", resume_step=0)
    again.write_scalars(0, {"loss": 3.0})  # the run before's step 0 is kept
    again.write_scalars(1, {"loss": 0.5})
    again.close()
    old, new = wandb_run_files(str(tmp_path))
    assert wandb_history(old) == wandb_history(path)
    record = wandb_run_record(new)
    assert (record.branch_point.run, record.branch_point.value) == ("exp-train", 0)
    assert wandb_history(new) == {1: {"loss": 0.5}}


def test_tags_given_as_one_str_are_refused_not_split_into_letters(tmp_path):
    with pytest.raises(TypeError, match=r"tags must be a list of str.*pass tags=\['baseline'\]"):
        _writer(tmp_path, tags="baseline", process_index=1)  # refused on every process
    w = _writer(tmp_path, tags=["baseline"])
    w.close()
    (path,) = wandb_run_files(str(tmp_path))
    assert list(wandb_run_record(path).tags) == ["baseline"]


def test_an_existing_run_is_used_and_left_open(tmp_path):
    run = wandb.init(project="tests", dir=str(tmp_path), reinit="create_new")
    w = writers.WandbWriter(run=run, process_index=0)
    w.write_scalars(0, {"a": 1.0})
    w.close()
    run.log({"b": 2.0}, step=1)  # still usable: the writer did not finish it
    run.finish()
    assert wandb_history(wandb_run_files(str(tmp_path))[0]) == {0: {"a": 1.0}, 1: {"b": 2.0}}


def test_only_process_0_talks_to_wandb(tmp_path, monkeypatch):
    import jax

    monkeypatch.setattr(jax, "process_index", lambda: 1)
    w = writers.WandbWriter("tests", logdir=tmp_path)  # process_index from JAX
    w.write_scalars(0, {"a": 1.0})
    w.write_hparams({"lr": 0.1})
    with pytest.raises(TypeError, match="must be a number"):
        w.write_scalars(1, {"a": "x"})  # inputs are still checked on every process
    from wandb.sdk.data_types._private import MEDIA_TMP

    media = set(os.listdir(MEDIA_TMP.name))
    w.write_images(2, {"i": np.zeros((10, 8, 8, 3), np.uint8)})
    w.write_videos(2, {"v": np.zeros((1, 2, 8, 8, 3), np.uint8)})
    assert set(os.listdir(MEDIA_TMP.name)) == media  # 11 PNGs of a run it does not log to
    with pytest.raises(ValueError, match="at most 512 buckets"):
        w.write_histograms(2, {"h": np.arange(4.0)}, {"h": 513})
    w.close()
    assert w.run is None and wandb_run_files(str(tmp_path)) == []


def test_other_processes_make_no_pixels_but_check_shapes_ranges_and_keys(
    tmp_path, monkeypatch, caplog
):
    # Processes other than 0 converted every image to uint8 and built every video's
    # filmstrip, then logged none of them.
    made = []
    for module, name in ((_checks, "images_as_uint8"), (_encode, "filmstrip")):
        real = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda a, _real=real, _n=name: made.append(_n) or _real(a)
        )
    w = _writer(tmp_path, process_index=1)
    w.write_images(1, {"i": np.full((16, 8, 8, 3), 2.0)})
    w.write_videos(1, {"v": np.zeros((1, 2, 8, 8, 3), np.float32)})
    with pytest.raises(ValueError, match=r"C in \(1, 3, 4\), got shape \(8, 8, 5\)"):
        w.write_images(2, {"i": np.zeros((8, 8, 5))})
    w.close()
    assert made == []
    warned = [r.getMessage() for r in caplog.records if "clipped" in r.getMessage()]
    assert [m.split(" holds")[0] for m in warned] == ["WandbWriter: float image 'i'"]


def test_a_resumed_run_leaves_out_raw_tensors_up_to_the_resume_step(tmp_path, caplog):
    first = _writer(tmp_path, run_id="run1")
    for step in range(1, 11):
        first.write_scalars(step, {"loss": float(step)})
    first.write_summaries(5, {"t": np.arange(3.0)})
    first.close()

    again = _writer(tmp_path, run_id="run1", resume_step=8)
    # Saved as the new run's `summaries/t/step_00000005.npy`, they replaced the run
    # before's files of those names at `wandb sync`, with no warning.
    again.write_summaries(5, {"t": np.zeros(3)})
    again.write_summaries(8, {"t": np.ones(3)})
    again.write_summaries(9, {"t": np.full(3, 9.0)})
    again.close()
    old, new = wandb_run_files(str(tmp_path))
    run_files = os.path.join(os.path.dirname(new), "files")
    found = glob.glob(os.path.join(run_files, "summaries", "**", "*.npy"), recursive=True)
    assert [os.path.relpath(f, run_files) for f in found] == ["summaries/t/step_00000009.npy"]
    assert np.load(found[0]).tolist() == [9.0, 9.0, 9.0]
    kept = os.path.join(os.path.dirname(old), "files", "summaries", "t", "step_00000005.npy")
    assert np.load(kept).tolist() == [0.0, 1.0, 2.0]
    warned = [r.getMessage() for r in caplog.records if "resume_step=8" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(
        "WandbWriter.write_summaries: step 5 (keys ['t']) is at or before resume_step=8"
    )


def test_raw_tensors_are_exact_npy_run_files(tmp_path):
    import jax.numpy as jnp

    w = _writer(tmp_path)
    files = w.run.dir
    tensor = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
    for step in (1, 2):
        w.write_summaries(step, {"eval/t": tensor * step, "bf": jnp.array([0.5], jnp.bfloat16)})
    with pytest.raises(TypeError, match=r"tensors 'o' \(object\) hold Python objects"):
        w.write_summaries(3, {"o": np.array([{}, 1], dtype=object)})
    w.write_scalars(3, {"after": 1.0})  # the writer goes on
    w.close()
    for step in (1, 2):
        got = np.load(os.path.join(files, "summaries", "eval", "t", f"step_{step:08d}.npy"))
        assert got.dtype == np.float64 and np.array_equal(got, tensor * step)
        bf = np.load(os.path.join(files, "summaries", "bf", f"step_{step:08d}.npy"))
        assert bf.dtype == np.float32 and bf.tolist() == [0.5]
    assert not os.path.exists(os.path.join(files, "summaries", "o"))
    assert wandb_history(wandb_run_files(str(tmp_path))[0])[3] == {"after": 1.0}


def test_what_wandb_cannot_store_raises(tmp_path):
    w = _writer(tmp_path)
    with pytest.raises(ValueError, match=r"\['\.\./t'\] become artifact paths summaries/"):
        w.write_summaries(0, {"../t": np.zeros(3)})
    with pytest.raises(ValueError, match=r"at most 512 buckets, got num_buckets \{'h': 600\}"):
        w.write_histograms(0, {"h": np.arange(5.0)}, num_buckets={"h": 600})
    w.close()
    with pytest.raises(writers.WriterClosedError):
        w.write_scalars(1, {"a": 1.0})


def test_media_keys_whose_file_names_are_too_long_are_refused_at_the_call(tmp_path):
    # W&B names each image and clip's file after its key: a 300-byte key raised W&B's bare
    # OSError "File name too long" (a NUL: "embedded null byte") and lost the call's keys.
    w = _writer(tmp_path)
    longest, image = "k" * 210, np.ones((1, 1, 1))
    for key, method, value in [
        ("k" * 240, "write_images", {"a": image}),
        ("d" * 256 + "/img", "write_videos", {"a": np.ones((1, 2, 1, 1, 1))}),
        ("a\0b", "write_audios", {"a": np.zeros((1, 3, 1))}),
    ]:
        kwargs = {"sample_rate": 8000} if method == "write_audios" else {}
        with pytest.raises(ValueError, match=rf"WandbWriter.{method}: keys \[.*\] name W&B media"):
            getattr(w, method)(1, {**value, key: list(value.values())[0]}, **kwargs)
    both = writers.MultiWriter([w, writers.JsonlWriter(tmp_path / "m.jsonl")])
    with pytest.raises(ValueError, match=r"WandbWriter: keys \['k{240}'\] name W&B media"):
        both.write_images(1, {"k" * 240: image})  # before any writer wrote it
    w.write_images(1, {longest: image, "d" * 255 + "/img": image * 0})
    both.close()
    assert list(writers.read_jsonl(tmp_path / "m.jsonl")) == []
    (path,) = wandb_run_files(str(tmp_path))
    row = wandb_history(path)[1]
    assert sorted(row) == ["d" * 255 + "/img", longest]  # none of the refused calls' keys
    for key, pixel in ((longest, 255), ("d" * 255 + "/img", 0)):
        (name,) = row[key]["filenames"]
        image = Image.open(os.path.join(os.path.dirname(path), "files", name))
        assert np.asarray(image).tolist() == [[pixel]]


def test_more_images_of_a_key_than_wandb_keeps_are_refused_not_cut(tmp_path):
    # W&B uploaded the first 108 images of a key and dropped the rest, with a root-logger
    # warning naming neither key nor step; TensorBoard and MLflow keep all of them.
    w = _writer(tmp_path)
    ramp = np.arange(109, dtype=np.uint8).reshape(109, 1, 1, 1)
    with pytest.raises(ValueError, match=r"at most 108 images of a key .* got \{'many': 109\}"):
        w.write_images(1, {"many": ramp, "ok": ramp[:1]})
    with pytest.raises(ValueError, match=r"at most 108 videos of a key .* got \{'v': 109\}"):
        w.write_videos(1, {"v": np.zeros((109, 2, 1, 1, 1))})
    w.write_images(1, {"many": ramp[:108]})
    w.close()
    (path,) = wandb_run_files(str(tmp_path))
    (row,) = wandb_history(path).values()
    assert list(row) == ["many"] and row["many"]["count"] == 108
    files = [os.path.join(os.path.dirname(path), "files", f) for f in row["many"]["filenames"]]
    assert [np.asarray(Image.open(f)).item() for f in files] == list(range(108))


def test_missing_wandb_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"pip install 'jax-metrics-manager\[wandb\]'"):
        writers.WandbWriter(process_index=0)


def test_a_relative_logdir_is_relative_to_the_callers_working_directory(tmp_path, monkeypatch):
    # W&B's service resolves relative paths against its own working directory, which
    # earlier runs in this process fixed elsewhere.
    for folder in ("first", "second"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        w = writers.WandbWriter("tests", logdir="runs/a", process_index=0)
        w.write_scalars(1, {"a": 1.0})
        w.close()
        (path,) = wandb_run_files(str(tmp_path / folder / "runs" / "a"))
        assert wandb_history(path) == {1: {"a": 1.0}}


def test_w_and_b_row_fields_and_a_key_of_two_kinds_at_one_step_are_refused(tmp_path, caplog):
    w = _writer(tmp_path, run_id="r1", collection="eval:squad/v1")  # W&B refuses ':' and '/'
    with pytest.raises(ValueError, match=r"\['_step', '_runtime'\] are reserved by .*W&B"):
        w.write_scalars(7, {"_step": 123, "_runtime": 4.5, "loss": 1.0})
    w.write_scalars(7, {"sample": 0.5})
    with pytest.raises(
        ValueError, match=r"\['sample'\] were written at step 7 by \['write_scalars'\]"
    ):
        w.write_texts(7, {"sample": "the generated text"})
    w.write_texts(7, {"sample/text": "the generated text"})
    # The same kind again: W&B's update of the row, warned once per key.
    w.write_scalars(7, {"sample": 0.625, "other": 1.0})
    w.write_scalars(7, {"sample": 0.75})
    assert [r.getMessage() for r in caplog.records if "written again" in r.getMessage()] == [
        "WandbWriter.write_scalars: ['sample'] written again at step 7: W&B keeps one value "
        "per key and step, the last (warned once per key; the other writers keep both)"
    ]
    w.write_scalars(10, {})  # nothing to log: W&B's step stays at 7
    w.write_texts(8, {"sample": "a text at the next step"})
    w.close()
    (path,) = wandb_run_files(str(tmp_path))
    assert wandb_run_record(path).run_id == "r1-eval-squad-v1-d97bf716"
    rows = wandb_history(path)
    assert rows == {
        7: {"sample": 0.75, "other": 1.0, "sample/text": "the generated text"},
        8: {"sample": "a text at the next step"},
    }


def test_a_url_logdir_leaves_the_local_files_in_wandbs_default_directory(tmp_path, monkeypatch):
    # A gs:// model dir went through os.path.abspath: W&B wrote './gs:/bucket/run/train/wandb'.
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    w = writers.WandbWriter("tests", logdir="gs://bucket/run/train", process_index=0)
    w.write_scalars(1, {"a": 1.0})
    w.close()
    assert os.listdir(tmp_path / "cwd") == []
    (path,) = wandb_run_files(str(tmp_path / "wandb_dir"))
    assert wandb_history(path) == {1: {"a": 1.0}}


_SERVICE_DIES = """
import os, signal, sys, time
import writers
w = writers.WandbWriter("dies", logdir=sys.argv[1], process_index=0)
w.write_scalars(0, {"x": 0.0})
for pid in filter(str.isdigit, os.listdir("/proc")):  # W&B's service: a child process
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        continue
    if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and "wandb" in stat:
        os.kill(int(pid), signal.SIGKILL)
time.sleep(1)
try:
    w.write_scalars(1, {"x": 1.0})
except Exception as err:
    print(type(err).__name__, "|", err, "|", *getattr(err, "__notes__", ()))
"""


def test_a_write_after_wandbs_service_died_says_so(tmp_path):
    # MailboxClosedError's message is empty: every failure after the kill said nothing.
    out = subprocess.run(
        [sys.executable, "-c", _SERVICE_DIES, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        # its own service, not this process's (which W&B names to child processes)
        env={k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"},
    ).stdout
    assert out.startswith("MailboxClosedError |  | WandbWriter: W&B's service process (wandb-core)")
    assert "gone (killed, or out of memory): no later value reaches W&B" in out


def test_a_setting_w_and_b_refuses_is_named_through_gin(tmp_path):
    """`writers.WandbWriter.mode = 'ofline'` said only "TypeError: ValidationError.__new__()
    missing 2 required positional arguments": gin could not copy pydantic's error."""
    import gin

    gin.clear_config()
    try:
        gin.parse_config(
            "from __gin__ import dynamic_registration\nimport writers\n"
            "writers.WandbWriter.mode = 'ofline'\n"
        )
        make = gin.get_configurable("writers.WandbWriter")
        with pytest.raises(ValueError) as raised:
            make("tests", logdir=tmp_path, process_index=0)
    finally:
        gin.clear_config()
    message = str(raised.value)
    assert message.startswith("WandbWriter: W&B refused a setting of wandb.init: ")
    assert "mode\n" in message and "input_value='ofline'" in message
    assert "In call to configurable 'WandbWriter'" in message
    assert wandb_run_files(str(tmp_path)) == []


def test_a_mode_w_and_b_refuses_is_refused_on_every_process(tmp_path):
    """`mode='ofline'` was checked by wandb.init, which only process 0 calls: process 1 made
    its writer and ran on, so a multi-host job failed on one host alone."""
    with pytest.raises(ValueError) as raised:
        writers.WandbWriter("tests", logdir=tmp_path, mode="ofline", process_index=1)
    message = str(raised.value)
    assert message.startswith("WandbWriter: W&B refused a setting of wandb.init: ")
    assert "mode\n" in message and "input_value='ofline'" in message
    writer = writers.WandbWriter("tests", logdir=tmp_path, mode="offline", process_index=1)
    assert writer.run is None
    writer.close()
    assert wandb_run_files(str(tmp_path)) == []
