"""MlflowWriter against real tracking stores (SQLite, and one `mlflow server`), read back
with `MlflowClient`: metric history per key, params, and artifacts."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest
from mlflow import MlflowClient
from PIL import Image

import writers
from tests.storage_servers import free_port
from tests.writers.tracker_stores import mlflow_server, sqlite_store
from writers import _checks, _encode


@pytest.fixture
def store(tmp_path):
    return {
        "tracking_uri": sqlite_store(str(tmp_path / "store")),
        "artifact_location": str(tmp_path / "artifacts"),
    }


def _writer(store, **kwargs) -> writers.MlflowWriter:
    kwargs.setdefault("process_index", 0)
    return writers.MlflowWriter("exp", **store, **kwargs)


def _history(client, run_id, key) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _value(step: int, i: int) -> float:
    return step * 0.5 + i / 16  # exact in binary floating point


def test_200_summaries_x_20_keys_go_in_full_batches_all_read_back(store, monkeypatch):
    w = _writer(store, run_name="train", flush_secs=3600)
    calls = []
    log_batch = w._client.log_batch
    monkeypatch.setattr(
        w._client, "log_batch", lambda *a, **k: calls.append(1) or log_batch(*a, **k)
    )
    for step in range(200):
        w.write_scalars(step, {f"train/m{i:02d}": np.float32(_value(step, i)) for i in range(20)})
    assert calls == []  # write calls only buffer
    w.close()
    assert len(calls) == 4  # 4,000 metrics in batches of MLflow's 1,000
    client = MlflowClient(store["tracking_uri"])
    run = client.get_run(w.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "train"
    found = 0
    for i in range(20):
        history = _history(client, w.run_id, f"train/m{i:02d}")
        assert history == [(step, _value(step, i)) for step in range(200)]
        found += len(history)
    assert found == 200 * 20


def test_a_call_over_mlflows_batch_limit_is_split_into_full_batches(store, monkeypatch):
    w = _writer(store)
    sizes = []
    log_batch = w._client.log_batch
    monkeypatch.setattr(
        w._client,
        "log_batch",
        lambda r, metrics: sizes.append(len(metrics)) or log_batch(r, metrics),
    )
    w.write_scalars(3, {f"k{i:04d}": float(i) for i in range(2500)})
    w.close()
    assert sizes == [1000, 1000, 500]
    client = MlflowClient(store["tracking_uri"])
    assert client.get_run(w.run_id).data.metrics == {f"k{i:04d}": float(i) for i in range(2500)}


def test_nan_is_kept_and_ints_become_floats(store):
    w = _writer(store)
    odd = {"zero": -0.0, "big": 2**53 + 1}  # what the SQLite store keeps: float64, no -0.0
    w.write_scalars(1, {"nan": float("nan"), "n": np.int64(7), "ok": True, **odd})
    w.close()
    metrics = MlflowClient(store["tracking_uri"]).get_run(w.run_id).data.metrics
    assert np.isnan(metrics["nan"]) and metrics["n"] == 7.0 and metrics["ok"] == 1.0
    assert (math.copysign(1, metrics["zero"]), metrics["big"]) == (1.0, 2.0**53)


def test_ints_beyond_float64_are_infinities_and_do_not_lose_the_calls_other_keys(store):
    w = _writer(store)
    w.write_scalars(1, {"ok": 1, "big": 10**400, "small": -(10**400)})  # raised OverflowError
    w.close()
    metrics = MlflowClient(store["tracking_uri"]).get_run(w.run_id).data.metrics
    assert metrics == {"ok": 1.0, "big": sys.float_info.max, "small": -sys.float_info.max}


def test_a_key_written_twice_at_one_step_keeps_both_files(store, tmp_path):
    # Both writes had the same artifact path: the second replaced the first.
    w = _writer(store)
    for text in ("first", "second", "third"):
        w.write_texts(5, {"note": text})
    w.write_images(5, {"img": np.zeros((2, 2, 1), np.uint8)})
    w.write_images(5, {"img": np.full((2, 2, 1), 7, np.uint8)})
    w.write_texts(6, {"note": "next step"})
    w.close()
    root = MlflowClient(store["tracking_uri"]).download_artifacts(w.run_id, "", str(tmp_path))
    texts = {}
    for name in sorted(os.listdir(os.path.join(root, "texts", "note"))):
        with open(os.path.join(root, "texts", "note", name)) as f:
            texts[name] = f.read()
    assert texts == {
        "step_00000005.txt": "first",
        "step_00000005-2.txt": "second",
        "step_00000005-3.txt": "third",
        "step_00000006.txt": "next step",
    }
    pixels = {
        name: int(np.asarray(Image.open(os.path.join(root, "images", "img", name))).max())
        for name in os.listdir(os.path.join(root, "images", "img"))
    }
    assert pixels == {"step_00000005_0.png": 0, "step_00000005-2_0.png": 7}


def test_hparams_become_params_in_batches_of_100(store):
    w = _writer(store)
    hparams = {f"p{i:03d}": i for i in range(150)}
    hparams.update(lr=np.float32(0.5), name="adam", flag=True, shape=(2, 3), opt={"b1": 0.9})
    w.write_hparams(hparams)
    w.close()
    params = MlflowClient(store["tracking_uri"]).get_run(w.run_id).data.params
    assert params == {
        **{f"p{i:03d}": str(i) for i in range(150)},
        "lr": "0.5",
        "name": "adam",
        "flag": "True",
        "shape": "(2, 3)",
        "opt.b1": "0.9",
    }


def test_a_float32_hparam_reads_back_as_the_value_set_in_jsonl_and_mlflow(store, tmp_path):
    # A float32 0.1 was float64's 0.10000000149011612: `params.f32 = '0.1'` found no run.
    hparams = {"f32": np.float32(0.1), "jf32": jnp.float32(0.1), "third": np.float32(1 / 3)}
    hparams |= {"bf16": jnp.array(0.1, jnp.bfloat16), "f16": np.float16(0.1)}
    hparams |= {"f64": np.float64(0.1), "py": 0.1, "py3": 1 / 3, "nan": np.float32("nan")}
    jsonl = writers.JsonlWriter(tmp_path / "metrics.jsonl")
    w = _writer(store)
    for writer in (jsonl, w):
        writer.write_hparams(hparams)
        writer.close()
    with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
        (line,) = [json.loads(text) for text in f]
    assert line["hparams"] == {"f32": 0.1, "jf32": 0.1, "third": 0.33333334, "bf16": 0.1} | {
        "f16": 0.1,
        "f64": 0.1,
        "py": 0.1,
        "py3": 1 / 3,
        "nan": "NaN",
    }
    client = MlflowClient(store["tracking_uri"])
    run = client.get_run(w.run_id)
    assert run.data.params == {
        "f32": "0.1",
        "jf32": "0.1",
        "third": "0.33333334",
        "bf16": "0.1",
        "f16": "0.1",
        "f64": "0.1",
        "py": "0.1",
        "py3": "0.3333333333333333",
        "nan": "nan",
    }
    found = client.search_runs(
        [run.info.experiment_id], "params.f32 = '0.1' and params.jf32 = '0.1'"
    )
    assert [run.info.run_id for run in found] == [w.run_id]


def test_a_run_resumed_from_a_float32_param_in_full_digits_takes_its_shortest_form(store):
    # A run logged before float32 hparams were written as their shortest digits holds
    # '0.10000000149011612'; resumed, writing np.float32(0.1) ('0.1') raised "MLflow params
    # never change". The logged form stays; a value that did change is still refused.
    w = _writer(store)
    w._client.log_param(w.run_id, "lr", "0.10000000149011612")
    w._client.log_param(w.run_id, "wd", "0.20000000298023224")
    w.close()
    resumed = _writer(store, run_id=w.run_id, resume_step=0)
    resumed.write_hparams({"lr": np.float32(0.1), "bf16": jnp.array(0.5, jnp.bfloat16)})
    with pytest.raises(ValueError, match=r"'wd': '0.20000000298023224' -> '0.1'"):
        resumed.write_hparams({"wd": np.float32(0.1)})
    resumed.close()
    params = MlflowClient(store["tracking_uri"]).get_run(w.run_id).data.params
    assert params == {"lr": "0.10000000149011612", "wd": "0.20000000298023224", "bf16": "0.5"}


def test_a_file_name_that_is_no_utf_8_is_escaped_instead_of_blocking_every_later_send(store):
    # os.fsdecode(b"/data/caf\xe9") keeps the byte as a lone surrogate, which the store
    # cannot encode: its error was retried at every send, and nothing more was stored.
    path = os.fsdecode(b"/data/caf\xe9")
    w = _writer(store)
    w.write_hparams({"data": path, "lr": 0.1})
    w.write_texts(1, {"notes": f"read {path}"})
    w.write_scalars(1, {"loss": 0.5})
    w.close()
    client = MlflowClient(store["tracking_uri"])
    run = client.get_run(w.run_id)
    assert run.data.params == {"data": "/data/caf\\udce9", "lr": "0.1"}
    assert run.data.metrics == {"loss": 0.5} and run.info.status == "FINISHED"
    with open(client.download_artifacts(w.run_id, "texts/notes/step_00000001.txt")) as f:
        assert f.read() == "read /data/caf\\udce9"


def test_texts_images_videos_audio_histograms_are_artifacts(store, tmp_path):
    w = _writer(store)
    image = np.arange(2 * 4 * 5 * 3, dtype=np.uint8).reshape(2, 4, 5, 3)
    video = np.linspace(0, 1, 1 * 3 * 4 * 5 * 1).reshape(1, 3, 4, 5, 1)
    clip = np.linspace(-1, 1, 2 * 8 * 1).reshape(2, 8, 1)
    for step in (5, 10):
        w.write_texts(step, {"notes/sample": f"héllo at {step}"})
        w.write_images(step, {"img": image})
        w.write_videos(step, {"vid": video})
        w.write_audios(step, {"aud": clip}, sample_rate=8000)
        w.write_histograms(step, {"h": np.array([0.0, 1.0, 1.0, 3.0])}, num_buckets={"h": 3})
    w.close()
    client = MlflowClient(store["tracking_uri"])
    root = client.download_artifacts(w.run_id, "", str(tmp_path / "down"))

    def read(path: str) -> bytes:
        with open(os.path.join(root, path), "rb") as f:
            return f.read()

    for step in (5, 10):
        assert read(f"texts/notes/sample/step_{step:08d}.txt").decode() == f"héllo at {step}"
        for i in range(2):
            png = read(f"images/img/step_{step:08d}_{i}.png")
            np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png))), image[i])
            assert read(f"audio/aud/step_{step:08d}_{i}.wav") == _encode.wav(clip[i], 8000)
        strip = np.asarray(Image.open(io.BytesIO(read(f"videos/vid/step_{step:08d}_0.png"))))
        assert strip.shape == (4, 15)  # [H, T*W], grayscale: the 3 frames side by side
        # floor(x * 255.5), as CLU's tf.summary.image (0.5 is 127)
        frames = np.floor(np.concatenate(list(video[0, ..., 0]), axis=1) * 255.5)
        np.testing.assert_array_equal(strip, frames)
        hist = json.loads(read(f"histograms/h/step_{step:08d}.json"))
        assert hist["counts"] == [1, 2, 1] and hist["edges"] == [0.0, 1.0, 2.0, 3.0]
        assert (hist["count"], hist["min"], hist["max"], hist["mean"]) == (4, 0.0, 3.0, 1.25)
    names = [f.path for f in client.list_artifacts(w.run_id, "images/img")]
    assert names == [f"images/img/step_{s:08d}_{i}.png" for s in (5, 10) for i in range(2)]


def test_one_log_artifacts_call_per_send(store, monkeypatch):
    w = _writer(store, flush_secs=3600)
    calls = []
    upload = w._client.log_artifacts
    monkeypatch.setattr(
        w._client, "log_artifacts", lambda *a, **k: calls.append(a) or upload(*a, **k)
    )
    w.write_texts(1, {f"t{i}": "x" for i in range(30)})
    w.write_images(1, {f"i{i}": np.zeros((2, 2, 2, 1), np.uint8) for i in range(30)})
    w.close()
    assert len(calls) == 1
    client = MlflowClient(store["tracking_uri"])
    assert len(client.list_artifacts(w.run_id, "texts")) == 30
    assert len(client.list_artifacts(w.run_id, "images")) == 30


def test_the_timer_sends_without_a_flush(store):
    w = _writer(store, flush_secs=0.05)
    w.write_scalars(3, {"loss": 0.5})
    client = MlflowClient(store["tracking_uri"])
    deadline = time.monotonic() + 10
    while not client.get_run(w.run_id).data.metrics and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _history(client, w.run_id, "loss") == [(3, 0.5)]
    assert client.get_run(w.run_id).info.status == "RUNNING"
    w.close()
    assert client.get_run(w.run_id).info.status == "FINISHED"


def test_a_with_block_that_raises_ends_the_run_failed_and_keeps_its_values(store):
    with pytest.raises(RuntimeError, match="diverged"), _writer(store) as w:
        w.write_scalars(3, {"loss": 0.5})
        raise RuntimeError("diverged")
    with _writer(store) as ok:
        ok.write_scalars(1, {"loss": 1.0})
    client = MlflowClient(store["tracking_uri"])
    assert client.get_run(w.run_id).info.status == "FAILED"  # as `with mlflow.start_run()`
    assert _history(client, w.run_id, "loss") == [(3, 0.5)]
    assert client.get_run(ok.run_id).info.status == "FINISHED"


def test_a_run_closed_by_a_signal_that_ends_the_process_ends_killed(store, monkeypatch):
    w = _writer(store)
    w.write_scalars(3, {"loss": 0.5})
    # What a manager's SIGTERM handler sets before closing the writers, where the default
    # action then kills the process.
    monkeypatch.setattr(writers._base.TrackerWriter, "ending_signal", 15)
    w.close()
    client = MlflowClient(store["tracking_uri"])
    assert client.get_run(w.run_id).info.status == "KILLED"  # was FINISHED
    assert _history(client, w.run_id, "loss") == [(3, 0.5)]


def test_close_starts_no_thread(store, monkeypatch):
    # Python 3.12 starts no thread while the interpreter shuts down, where close() runs for
    # a writer never closed: the timer's thread, running since the start, sends the rest.
    w = _writer(store, close_timeout_s=30.0)
    w.write_scalars(3, {"loss": 0.5})

    def no_thread(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    w.close()
    client = MlflowClient(store["tracking_uri"])
    assert _history(client, w.run_id, "loss") == [(3, 0.5)]
    assert client.get_run(w.run_id).info.status == "FINISHED"


def test_names_mlflow_refuses_are_refused_at_the_call(store):
    w = _writer(store, flush_secs=3600)
    with pytest.raises(ValueError, match=r"write_scalars: MLflow refuses the names 'acc@1': .*"):
        w.write_scalars(0, {"acc@1": 1.0, "ok": 2.0})
    with pytest.raises(ValueError, match=r"write_hparams: MLflow refuses the names 'a/\.\./b'"):
        w.write_hparams({"a/../b": 1, "lr": 0.1})
    with pytest.raises(ValueError, match=r"names 'k{251}'.*250"):
        w.write_scalars(1, {"k" * 251: 1.0})
    w.write_scalars(2, {"ok": 3.0})  # the writer goes on
    w.close()
    run = MlflowClient(store["tracking_uri"]).get_run(w.run_id)
    assert run.data.metrics == {"ok": 3.0} and run.data.params == {}


def test_a_changed_param_is_refused_at_the_call_and_nothing_of_the_call_is_written(store):
    w = _writer(store, flush_secs=3600)
    w.write_hparams({"lr": 0.1})
    w.flush()
    with pytest.raises(ValueError, match=r"params never change.*'lr': '0.1' -> '0.2'.*metric"):
        w.write_hparams({"lr": 0.2, "b1": 0.9})
    w.write_hparams({"lr": 0.1, "b2": 0.99})  # the same value again is accepted
    w.close()
    run = MlflowClient(store["tracking_uri"]).get_run(w.run_id)
    assert run.data.params == {"lr": "0.1", "b2": "0.99"}
    # A writer attached to the run knows its params: a change is refused there too.
    again = _writer(store, run_id=w.run_id)
    with pytest.raises(ValueError, match=r"'b2': '0.99' -> '0.5'"):
        again.write_hparams({"b2": 0.5})
    again.close()


def test_what_the_store_refuses_is_dropped_and_named_the_rest_is_sent(store):
    w = _writer(store, flush_secs=3600)
    w.write_hparams({"lr": 0.1, "b1": 0.9})
    w.write_scalars(1, {"loss": 0.5})
    w.write_texts(1, {"note": "kept"})
    client = MlflowClient(store["tracking_uri"])
    client.log_param(w.run_id, "lr", "0.3")  # another client, before this writer sends
    with pytest.raises(ValueError, match=r"refused 1 params \(lr\): .*dropped, the rest"):
        w.flush()
    w.flush()  # nothing left to refuse
    w.close()
    run = client.get_run(w.run_id)
    assert run.data.params == {"lr": "0.3", "b1": "0.9"} and run.data.metrics == {"loss": 0.5}
    assert [f.path for f in client.list_artifacts(w.run_id, "texts/note")] == [
        "texts/note/step_00000001.txt"
    ]
    assert run.info.status == "FINISHED"


def test_resume_keeps_one_point_per_step(store, caplog):
    first = _writer(store, run_name="train")
    for step in range(10):
        first.write_scalars(
            step,
            {"loss": float(step), "every5": float(step)}
            if step % 5 == 0
            else {"loss": float(step)},
        )
    first.close()  # steps 0-9 logged; the checkpoint was at step 5

    again = _writer(store, run_name="train", resume_step=5)
    assert again.run_id == first.run_id
    with caplog.at_level("WARNING"):
        for step in range(6, 13):
            again.write_scalars(step, {"loss": 100.0 + step, "every5": 100.0 + step})
    again.close()
    skipped = [r.getMessage() for r in caplog.records if "cannot be rewritten" in r.getMessage()]
    assert skipped == [  # at step 6, 'every5' (last at 5) is kept and 'loss' (last at 9) not
        f"MlflowWriter: resumed run {first.run_id} already has ['loss'] at step 6; metric "
        "history cannot be rewritten, so points up to each metric's last logged step are skipped."
    ]
    client = MlflowClient(store["tracking_uri"])
    # Each step once: the earlier points where the first run had logged that key, new ones after.
    assert _history(client, first.run_id, "loss") == [(s, float(s)) for s in range(10)] + [
        (s, 100.0 + s) for s in range(10, 13)
    ]
    assert _history(client, first.run_id, "every5") == [(0, 0.0), (5, 5.0)] + [
        (s, 100.0 + s) for s in range(6, 13)
    ]
    assert client.get_run(first.run_id).info.status == "FINISHED"


@pytest.mark.parametrize("served", [False, True], ids=["sqlite", "server"])
def test_resume_reads_each_metrics_last_step_not_its_history(store, tmp_path, served):
    # Resuming read every metric's whole history: 10 metrics of 20,000 points took 7 s on
    # SQLite (50 of 100,000, minutes). The run's latest point of each has its last step.
    with contextlib.ExitStack() as stack:
        if served:
            port = stack.enter_context(mlflow_server(str(tmp_path)))
            store = {"tracking_uri": f"http://127.0.0.1:{port}"}
        first = _writer(store, run_name="train")
        first.write_scalars(9, {"loss": 9.0, "acc": 0.5})
        first.write_scalars(3, {"loss": 3.0})  # logged later, at a lower step
        first.close()
        read = []
        real = MlflowClient.get_metric_history
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(
                MlflowClient,
                "get_metric_history",
                lambda *a, **k: read.append(a[1:]) or real(*a, **k),
            )
            again = _writer(store, run_name="train", resume_step=5)
        for step in range(8, 12):
            again.write_scalars(step, {"loss": 100.0 + step, "acc": float(step)})
        again.close()
        assert read == []
        client = MlflowClient(store["tracking_uri"])
        assert _history(client, first.run_id, "loss") == [
            (3, 3.0),
            (9, 9.0),
            (10, 110.0),
            (11, 111.0),
        ]
        assert _history(client, first.run_id, "acc") == [(9, 0.5), (10, 10.0), (11, 11.0)]


@pytest.mark.parametrize("name", ["bob's", 'say "hi"', "both ' and \"", "back\\slash"])
def test_resume_finds_a_run_whose_name_holds_quotes(store, name):
    # The name went into MLflow's filter string unquoted: "bob's" raised MlflowException.
    _writer(store, run_name="other").close()
    first = _writer(store, run_name=name)
    first.write_scalars(1, {"loss": 1.0})
    first.close()
    _writer(store, run_name=name + "x").close()  # a later run of another name
    again = _writer(store, run_name=name, resume_step=1)
    again.write_scalars(2, {"loss": 2.0})
    again.close()
    assert again.run_id == first.run_id
    client = MlflowClient(store["tracking_uri"])
    assert _history(client, first.run_id, "loss") == [(1, 1.0), (2, 2.0)]


def test_the_same_value_written_twice_at_one_step_is_two_points(store):
    # MLflow's store keeps one point per key, step, timestamp and value: three identical
    # writes within a millisecond were one point, though writers never deduplicate.
    w = _writer(store, clock=lambda: 1000.0)
    for _ in range(3):
        w.write_scalars(1, {"loss": 0.5})
    w.write_scalars(2, {"loss": 0.5, "acc": 1.0})
    w.close()
    client = MlflowClient(store["tracking_uri"])
    points = sorted(
        (m.step, m.timestamp, m.value) for m in client.get_metric_history(w.run_id, "loss")
    )
    assert points == [
        (1, 1_000_000, 0.5),
        (1, 1_000_001, 0.5),
        (1, 1_000_002, 0.5),
        (2, 1_000_003, 0.5),
    ]


def test_resume_by_run_id_and_by_a_name_no_run_has_yet(store, caplog):
    first = _writer(store)
    first.write_scalars(4, {"loss": 1.0})
    first.close()
    again = _writer(store, run_id=first.run_id, resume_step=2)
    again.write_scalars(4, {"loss": 2.0})
    again.write_scalars(5, {"loss": 3.0})
    again.close()
    client = MlflowClient(store["tracking_uri"])
    assert _history(client, first.run_id, "loss") == [(4, 1.0), (5, 3.0)]
    # An eval the preempted run never reached has no run to resume: the restart raised
    # ValueError building its manager, so the run could not go on.
    with caplog.at_level("WARNING"):
        new = _writer(store, run_name="eval/task", resume_step=3)
    assert "resume_step=3 found no run named 'eval/task' in experiment 'exp', so a new run " in (
        caplog.text
    )
    new.write_scalars(1, {"acc": 0.5})
    new.close()
    run = client.get_run(new.run_id)
    assert (run.info.run_name, run.info.status) == ("eval/task", "FINISHED")
    assert new.run_id != first.run_id and _history(client, new.run_id, "acc") == [(1, 0.5)]


def test_resume_with_no_run_to_look_for_is_refused(store):
    # It warned "found no run named None" and started a new run without looking for one.
    with pytest.raises(ValueError, match=r"resume_step=3 needs the run to resume; pass run_id="):
        _writer(store, resume_step=3)
    with pytest.raises(ValueError, match=r"resume_step=3 needs the run"):
        _writer(store, resume_step=3, process_index=1)  # alike on every process


def test_tags_that_are_no_mapping_of_str_are_refused_naming_them(store):
    """`writers.MlflowWriter.tags = 'team:vision'` in gin said only "'str' object has no
    attribute 'get'", from inside MLflow's create_run."""
    for tags in ("team:vision", [("team", "vision")]):
        with pytest.raises(TypeError) as raised:
            _writer(store, tags=tags)
        assert str(raised.value) == (
            "MlflowWriter: tags must be a mapping of tag names to values such as "
            f"{{'team': 'vision'}}, or None; got {tags!r} ({type(tags).__name__}); in gin "
            "write a dict"
        )
    # A tracking server's client said "bad argument type for built-in operation".
    with pytest.raises(TypeError) as raised:
        _writer(store, tags={"team": "vision", "seed": 3, 4: "x"})
    assert str(raised.value) == (
        "MlflowWriter: tags must map str names to str values, got {'seed': 3, 4: 'x'}; pass "
        "{'seed': '1'} (str(value)), or log numbers as hparams"
    )
    client = MlflowClient(store["tracking_uri"])
    assert client.search_runs(["0"]) == [] and client.get_experiment_by_name("exp") is None
    w = _writer(store, tags={"team": "vision", "seed": "3"})
    w.close()
    tags = client.get_run(w.run_id).data.tags
    assert (tags["team"], tags["seed"]) == ("vision", "3")


def test_a_store_setting_of_the_wrong_type_is_refused_naming_it(store, tmp_path):
    """`writers.MlflowWriter.tracking_uri = 5` in gin said only "'int' object has no
    attribute 'decode'", and `run_id = 7` "expected string or bytes-like object"."""
    bad = {"tracking_uri": 5, "run_id": 7, "artifact_location": 3.0}
    with pytest.raises(TypeError) as raised:
        writers.MlflowWriter(5, process_index=0, **bad)
    message = str(raised.value)
    assert message.startswith("MlflowWriter: 4 problems:")
    for problem in (
        "experiment_name must be a str such as 'my-experiment', or None; got 5 (int)",
        "tracking_uri must be a str such as 'sqlite:///mlflow.db' or 'http://host:5000', or "
        "None; got 5 (int)",
        "run_id must be a str such as '3f8a2b...' (a run's 32 hex digits), or None; got 7 (int)",
        "artifact_location must be a str such as '/data/artifacts' or 's3://b/artifacts', or "
        "None; got 3.0 (float)",
    ):
        assert f"  - {problem}; in gin write it in quotes" in message
    with pytest.raises(
        TypeError, match=r"artifact_location must be a str .*\(PosixPath\); pass str"
    ):
        _writer({**store, "artifact_location": tmp_path / "art"})
    assert not (tmp_path / "art").exists()


def test_attaching_by_run_id_leaves_the_run_running(store):
    client = MlflowClient(store["tracking_uri"])
    run_id = client.create_run("0").info.run_id
    w = _writer(store, run_id=run_id)
    w.write_scalars(0, {"a": 1.0})
    w.close()
    assert client.get_run(run_id).info.status == "RUNNING"
    assert client.get_run(run_id).data.metrics == {"a": 1.0}


def test_only_process_0_talks_to_mlflow(store, monkeypatch):
    import jax

    monkeypatch.setattr(jax, "process_index", lambda: 1)
    w = writers.MlflowWriter("exp", **store)  # process_index from JAX
    w.write_scalars(0, {"a": 1.0})
    w.write_texts(0, {"t": "x"})
    w.write_hparams({"lr": 0.1})
    w.close()
    assert w.run_id is None
    assert MlflowClient(store["tracking_uri"]).get_experiment_by_name("exp") is None
    with pytest.raises(TypeError, match="must be a number"):
        w2 = writers.MlflowWriter("exp", **store)
        w2.write_scalars(0, {"a": "x"})  # inputs are still checked on every process


def test_other_processes_encode_no_files_but_check_their_keys(store, monkeypatch):
    # Each PNG, WAV, histogram and .npy was encoded on every process, then thrown away
    # (16 images of 256 x 256 took 0.2 s a call there).
    import jax

    monkeypatch.setattr(jax, "process_index", lambda: 1)
    encoded = []
    for module, name in [(_encode, n) for n in ("png", "wav", "histogram", "npy", "filmstrip")] + [
        (_checks, "images_as_uint8")  # pixels and filmstrips were still made there
    ]:
        real = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _real=real, _name=name: encoded.append(_name) or _real(*a)
        )
    w = writers.MlflowWriter("exp", **store)
    w.write_images(1, {"i": np.zeros((16, 8, 8, 3), np.uint8)})
    w.write_videos(1, {"v": np.zeros((1, 2, 8, 8, 3), np.uint8)})
    w.write_audios(1, {"a": np.zeros((2, 100, 1), np.float32)}, sample_rate=8000)
    w.write_histograms(1, {"h": np.arange(10.0)})
    w.write_summaries(1, {"s": np.arange(3)})
    with pytest.raises(ValueError, match=r"'\.\./up'"):
        w.write_images(2, {"../up": np.zeros((1, 8, 8, 3), np.uint8)})  # checked on every process
    w.close()
    assert encoded == []
    assert MlflowClient(store["tracking_uri"]).get_experiment_by_name("exp") is None


def test_raw_tensors_are_exact_npy_artifacts(store, tmp_path):
    import jax.numpy as jnp

    w = _writer(store)
    tensor = np.arange(12, dtype=np.int64).reshape(3, 4)
    for step in (1, 2):
        w.write_summaries(
            step, {"eval/t": tensor * step, "bf": jnp.array([1.5, -2.0], jnp.bfloat16)}
        )
    with pytest.raises(TypeError, match=r"tensors 'o' \(object\) hold Python objects"):
        w.write_summaries(3, {"o": np.array([{}, 1], dtype=object)})
    w.write_scalars(3, {"after": 1.0})  # the writer goes on
    w.close()
    client = MlflowClient(store["tracking_uri"])
    root = client.download_artifacts(w.run_id, "summaries", str(tmp_path / "down"))
    for step in (1, 2):
        got = np.load(os.path.join(root, "eval", "t", f"step_{step:08d}.npy"))
        assert got.dtype == np.int64 and np.array_equal(got, tensor * step)
        bf = np.load(os.path.join(root, "bf", f"step_{step:08d}.npy"))
        assert bf.dtype == np.float32 and bf.tolist() == [1.5, -2.0]
    assert not os.path.exists(os.path.join(root, "o"))
    assert [m.step for m in client.get_metric_history(w.run_id, "after")] == [3]


def test_what_mlflow_cannot_store_raises(store):
    w = _writer(store)
    with pytest.raises(ValueError, match=r"\['\.\./t'\] become artifact paths summaries/"):
        w.write_summaries(0, {"../t": np.zeros(3)})
    with pytest.raises(ValueError, match=r"\['\.\./x'\] become artifact paths"):
        w.write_texts(0, {"../x": "escape"})
    w.close()
    with pytest.raises(writers.WriterClosedError):
        w.write_scalars(1, {"a": 1.0})


def test_a_file_that_cannot_be_written_is_dropped_not_retried_forever(store, tmp_path):
    """A key's file under another key's file (texts/a/step_00000001.txt as a directory) or a
    NUL in a key failed writing the send's files: each later send failed the same way, every
    other artifact with it, and close() raised."""
    w = _writer(store)
    with pytest.raises(ValueError, match=r"\['a\\x00b'\] become artifact paths .* or NUL"):
        w.write_texts(1, {"a\0b": "refused at the call"})
    w.write_texts(1, {"a": "kept"})
    w.write_texts(1, {"a/step_00000001.txt": "no path for it"})
    with pytest.raises(ValueError, match=r"refused 1 files \('texts/a/step_00000001.txt/step_"):
        w.flush()
    w.write_texts(2, {"b": "later"})
    w.close()
    client = MlflowClient(store["tracking_uri"])
    root = client.download_artifacts(w.run_id, "texts", str(tmp_path / "down"))
    with open(os.path.join(root, "a", "step_00000001.txt")) as f:
        assert f.read() == "kept"
    with open(os.path.join(root, "b", "step_00000002.txt")) as f:
        assert f.read() == "later"
    assert client.get_run(w.run_id).info.status == "FINISHED"


def test_missing_mlflow_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ImportError, match=r"pip install 'jax-metrics-manager\[mlflow\]'"):
        writers.MlflowWriter(process_index=0)


def test_against_a_real_mlflow_server(tmp_path):
    with mlflow_server(str(tmp_path)) as port:
        uri = f"http://127.0.0.1:{port}"
        w = writers.MlflowWriter("served", tracking_uri=uri, process_index=0)
        for step in range(20):
            w.write_scalars(step, {f"m{i}": _value(step, i) for i in range(20)})
        w.write_texts(19, {"note": "served"})
        # The client puts artifact paths in URLs unquoted: the server stored 'sample#1' and
        # 'sample#2' as one file 'texts/sample' holding 'two', and 'pct%41' at 'texts/pctA/'.
        # A key too long for a path failed every later send: nothing reached the run. The
        # server dropped a tab or CR ('loss\tcurve' overwrote 'losscurve'), answered 404 to a
        # newline (every later send of files failed, the run left RUNNING), and a part with
        # an edge space was stored where listing the run never showed it.
        for bad in (
            "sample#1",
            "q?x",
            "pct%41",
            "/".join(["x" * 250] * 20),
            "loss\tcurve",
            "eval\r",
            "sample\nline2",
            "bell\x7f",
            " lead",
            "x/ y",
            "trail /z",
        ):
            with pytest.raises(ValueError, match=r"become artifact paths texts/.*1,024, without "):
                w.write_texts(19, {bad: "refused", "note 2": "not written"})
        w.write_texts(19, {"sample 1": "one", "eval/sample-2": "two"})
        w.write_hparams({"lr": 0.1})
        w.close()
        client = MlflowClient(uri)
        for i in range(20):
            assert _history(client, w.run_id, f"m{i}") == [(s, _value(s, i)) for s in range(20)]
        assert client.get_run(w.run_id).data.params == {"lr": "0.1"}
        path = client.download_artifacts(w.run_id, "texts/note", str(tmp_path / "down"))
        with open(os.path.join(path, "step_00000019.txt")) as f:
            assert f.read() == "served"
        stored = {
            a.path for d in ("texts", "texts/eval") for a in client.list_artifacts(w.run_id, d)
        }
        assert stored == {"texts/note", "texts/sample 1", "texts/eval", "texts/eval/sample-2"}


_HTTP_SETTINGS = ("MAX_RETRIES", "BACKOFF_FACTOR", "BACKOFF_JITTER", "TIMEOUT")


@pytest.mark.parametrize("retries", [None, "0"], ids=["default", "user_set"])
def test_an_unreachable_tracking_server_fails_the_writer_in_seconds_naming_the_uri(
    monkeypatch, retries
):
    # Nobody listening at the URI (a server down, a mistyped port): MLflow's client retried
    # the writer's first request 7 times, and the writer failed after 249 s (a run stalled
    # 4 minutes at start). A retry count the user set is kept.
    for name in _HTTP_SETTINGS:
        monkeypatch.delenv(f"MLFLOW_HTTP_REQUEST_{name}", raising=False)
    if retries is not None:
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", retries)
    uri = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(ConnectionError) as raised:
        writers.MlflowWriter("exp", tracking_uri=uri, process_index=0)
    took = time.monotonic() - start
    message = str(raised.value)
    assert f"MlflowWriter: no MLflow tracking server answered at {uri} (tried for " in message
    assert "Connection refused" in message and "set MLFLOW_TRACKING_URI" in message
    if retries is None:  # 4 tries, 4 s and 8 s apart (plus up to 1 s each)
        assert 12.0 <= took < 30.0, took
    else:  # one try
        assert took < 3.0, took


def test_a_slow_tracking_server_is_waited_for_at_start(tmp_path, monkeypatch):
    # Connecting at start gives up after 5 s; an answer that takes longer still counts.
    from tests import storage_servers

    for name in _HTTP_SETTINGS:
        monkeypatch.delenv(f"MLFLOW_HTTP_REQUEST_{name}", raising=False)
    with mlflow_server(str(tmp_path)) as port:
        gate = storage_servers.Gate(port)
        gate._lock.acquire()  # connections are taken, but none reaches the server for 7 s
        threading.Timer(7.0, gate._lock.release).start()
        start = time.monotonic()
        w = writers.MlflowWriter("slow", tracking_uri=gate.url, process_index=0)
        assert time.monotonic() - start >= 7.0
        w.write_scalars(1, {"loss": 0.25})
        w.close()
        client = MlflowClient(f"http://127.0.0.1:{port}")
        assert _history(client, w.run_id, "loss") == [(1, 0.25)]


def test_a_file_the_artifact_server_refuses_is_dropped_at_once_not_sent_again(tmp_path):
    # A real 400: the server refuses a path whose folder in its store is a symlink leading
    # out of the run's artifacts. The refused file was kept and uploaded at every later send,
    # each failing the same way, close() too, with the files after it in the upload.
    with mlflow_server(str(tmp_path)) as port:
        uri = f"http://127.0.0.1:{port}"
        w = writers.MlflowWriter("refused", tracking_uri=uri, process_index=0, flush_secs=3600)
        w.write_texts(1, {"note": "stored"})
        w.flush()
        stored = tmp_path / "served" / "1" / w.run_id / "artifacts"
        (stored / "texts" / "note").rename(tmp_path / "elsewhere")
        (stored / "texts" / "note").symlink_to(tmp_path / "elsewhere")
        w.write_texts(2, {"note": "refused"})
        w.write_images(2, {"img": np.full((1, 2, 2, 1), 9, np.uint8)})
        w.write_histograms(2, {"h": np.arange(4.0)}, num_buckets={"h": 2})
        with pytest.raises(ValueError) as raised:
            w.flush()
        message = str(raised.value)
        assert f"run {w.run_id} refused 1 files (texts/note/step_00000002.txt): 400 " in message
        assert "resolved path is outside the artifact directory" in message
        assert w._pending_files == {}  # not sent again
        w.write_texts(3, {"later": "sent"})
        w.flush()  # raised the same 400 at every later send
        w.close()
        client = MlflowClient(uri)
        assert client.get_run(w.run_id).info.status == "FINISHED"
        (stored / "texts" / "note").unlink()  # the folder back where it was, to read it
        (tmp_path / "elsewhere").rename(stored / "texts" / "note")
        root = client.download_artifacts(w.run_id, "", str(tmp_path / "down"))
    files = sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names
    )
    assert files == [
        "histograms/h/step_00000002.json",
        "images/img/step_00000002_0.png",
        "texts/later/step_00000003.txt",
        "texts/note/step_00000001.txt",
    ]
    pixels = np.asarray(Image.open(os.path.join(root, "images/img/step_00000002_0.png")))
    assert pixels.tolist() == [[9, 9], [9, 9]]
