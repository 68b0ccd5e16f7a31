"""Summaries on cloud storage, against real local servers: GCS's emulator and moto's S3.

The default writer set (TensorBoard + JSONL) and `config.gin` write to `gs://bucket/...`
and `s3://bucket/...`; every value is read back with TensorBoard's own reader on the URL
itself (gs:// through fsspec, s3:// through its boto3 reader) and with
`writers.read_jsonl`. What reached the server is counted: with a flush after each of
1,000 summaries, the request bodies uploaded stay within 2x the bytes stored (a
whole-file re-upload per flush, as tensorboardX's GCS writer does, would be ~500x).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid

import fsspec
import fsspec.config
import pytest
from tensorboard.backend.event_processing import event_accumulator as ea

import writers
from metrics_manager import MetricsManager
from metrics_manager.gin_utils import write_gin_config
from tests import storage_servers
from tests.metrics_manager.test_manager_files import stale_log_warning

# T5X's base metrics: the keys of a realistic train summary.
KEYS = [
    "accuracy",
    "cross_ent_loss",
    "cross_ent_loss_per_all_target_tokens",
    "effective_batch_size/decoder",
    "learning_rate",
    "learning_rate/current",
    "loss",
    "loss_per_all_target_tokens",
    "loss_per_nonpadding_target_token",
    "non_padding_fraction/decoder",
    "non_padding_fraction/loss_weights",
    "non_padding_fraction/overall",
    "timing/seconds",
    "timing/seqs",
    "timing/seqs_per_second",
    "timing/seqs_per_second_per_core",
    "timing/steps_per_second",
    "timing/target_tokens_per_second",
    "timing/target_tokens_per_second_per_core",
    "z_loss",
    "z_loss_per_all_target_tokens",
]
SUMMARIES = {"gs": 1000, "s3": 50}  # TensorBoard's S3 reader builds a boto3 client per read: slow
CONFIG = "train.steps = 1000\nwriters.create_default_writer.jsonl = True\n"


@pytest.fixture(scope="module", params=["gs", "s3"])
def server(request):
    server = storage_servers.GcsServer() if request.param == "gs" else storage_servers.S3Server()
    with storage_servers.serving(server, request.param), pytest.MonkeyPatch.context() as patch:
        if request.param == "s3":  # TensorBoard's S3 reader read S3_ENDPOINT at import
            from tensorboard.compat.tensorflow_stub.io import gfile

            patch.setattr(gfile.get_filesystem("s3://b"), "_s3_endpoint", server.url)
        server.scheme = request.param
        yield server
    server.stop()


def _value(step: int, index: int) -> float:
    return step + index / 100


def test_default_writers_and_config_gin_on_cloud_storage(server, tmp_path):
    if server.scheme == "gs":
        import gcsfs

        assert gcsfs.GCSFileSystem.__name__ == "GCSFileSystem"  # no control-plane calls
    run = f"{server.scheme}://{storage_servers.BUCKET}/run-{uuid.uuid4().hex[:8]}"
    count = SUMMARIES[server.scheme]
    server.counter.reset()

    write_gin_config(run, config_str=CONFIG)
    w = writers.create_default_writer(f"{run}/train", collection="train", console=False)
    for step in range(1, count + 1):
        w.write_scalars(step, {k: _value(step, i) for i, k in enumerate(KEYS)})
        w.flush()  # the worst case for object storage: an upload per summary
    w.close()
    uploaded, requests = server.counter.uploaded_bytes, server.counter.requests

    fs, root = fsspec.core.url_to_fs(run)
    fs.invalidate_cache()
    assert fs.cat_file(f"{root}/config.gin").decode() == CONFIG
    stored = sum(fs.du(root, total=False).values())
    names = fs.ls(f"{root}/train", detail=False)
    event_parts = [n for n in names if "tfevents" in n]
    assert len(event_parts) == count  # one object per flush

    lines = writers.read_jsonl(f"{run}/train/metrics.jsonl")
    assert [line["step"] for line in lines] == list(range(1, count + 1))
    assert all(line[k] == _value(line["step"], i) for line in lines for i, k in enumerate(KEYS))
    acc = ea.EventAccumulator(f"{run}/train", size_guidance={ea.SCALARS: 0})
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == sorted(KEYS)
    for i, key in enumerate(KEYS):
        events = acc.Scalars(key)
        assert [e.step for e in events] == list(range(1, count + 1)), key
        assert [e.value for e in events] == pytest.approx(
            [_value(s, i) for s in range(1, count + 1)], rel=1e-6
        )

    ratio = uploaded / stored
    print(
        f"\n{server.scheme}: {count} summaries, {stored:,} bytes stored, {uploaded:,} bytes "
        f"uploaded in {requests:,} requests: {ratio:.3f}x"
    )
    assert ratio <= 2.0, f"uploaded {uploaded:,} bytes for {stored:,} bytes of data"


def test_resume_on_cloud_storage_keeps_each_step_once(server, tmp_path):
    run = f"{server.scheme}://{storage_servers.BUCKET}/resume-{uuid.uuid4().hex[:8]}"
    for steps, offset, resume_step in ((range(1, 11), 0.0, None), (range(6, 11), 100.0, 5)):
        w = writers.create_default_writer(run, console=False, resume_step=resume_step)
        for step in steps:
            w.write_scalars(step, {"loss": offset + step})
        w.close()
    expected = [(s, float(s)) for s in range(1, 6)] + [(s, 100.0 + s) for s in range(6, 11)]
    lines = writers.read_jsonl(f"{run}/metrics.jsonl")
    assert [(line["step"], line["loss"]) for line in lines] == expected
    acc = ea.EventAccumulator(run)
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == expected


def test_remote_logs_warn_as_local_ones_do(server, caplog):
    """On a URL, a log whose last part held only an hparams line read as having no step, so
    steps going backwards gave no warning; a resumed set without JSONL left the earlier log
    with its later steps, also without the warning a local directory gives."""
    caplog.set_level(logging.WARNING)
    run = f"{server.scheme}://{storage_servers.BUCKET}/warn-{uuid.uuid4().hex[:8]}"
    w = writers.JsonlWriter(f"{run}/train")
    for step in range(1, 21):
        w.write_scalars(step, {"loss": float(step)})
    w.flush()
    w.write_hparams({"lr": 0.1})  # the last part: this line alone
    w.close()
    with writers.JsonlWriter(f"{run}/train") as w:  # restarted at step 5, no resume_step
        w.write_scalars(5, {"loss": 5.0})
    backwards = [r.getMessage() for r in caplog.records if "comes after step" in r.getMessage()]
    assert len(backwards) == 1 and "step 5 comes after step 20" in backwards[0]

    def tensorboard_only(d, collection=None, resume_step=None):
        return writers.create_default_writer(
            d, console=False, jsonl=False, collection=collection, resume_step=resume_step
        )

    with MetricsManager("train", run, writer_factory=tensorboard_only, resume_step=10) as m:
        m.write_scalars(11, {"loss": 11.0})
    stale = [r.getMessage() for r in caplog.records if "no writer of this set" in r.getMessage()]
    assert stale == [stale_log_warning(f"{run}/train", 10)]
    assert [x["step"] for x in writers.read_jsonl(f"{run}/train")][-3:] == [20, None, 5]


def test_a_remote_jsonl_log_never_closed_is_uploaded_at_exit():
    # Lines wait in memory for the next timed upload: a program that ends without close()
    # (no `with`, no manager) must still upload them.
    server = storage_servers.GcsServer()
    url = f"gs://{storage_servers.BUCKET}/unclosed/metrics.jsonl"
    code = (
        "import writers\n"
        f"w = writers.JsonlWriter({url!r}, flush_secs=3600)\n"
        "for step in (1, 2, 4):\n"
        "    w.write_scalars(step, {'loss': 1.0 / step})\n"
    )
    env = dict(os.environ, **server.environment())
    try:
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
        with storage_servers.serving(server, "gs"):
            lines = writers.read_jsonl(url)
        assert [(line["step"], line["loss"]) for line in lines] == [(1, 1.0), (2, 0.5), (4, 0.25)]
    finally:
        server.stop()


def test_a_file_url_makes_its_directories_like_a_local_path(tmp_path):
    # fsspec's file:// made no directories: config.gin and every flush of the default
    # writers raised FileNotFoundError, so nothing was ever written.
    run = f"file://{tmp_path}/run"
    write_gin_config(run, config_str=CONFIG)
    w = writers.create_default_writer(f"{run}/train", collection="train", console=False)
    for step in (1, 2, 3):
        w.write_scalars(step, {"loss": float(step)})
        w.flush()
    w.close()
    assert (tmp_path / "run" / "config.gin").read_text() == CONFIG
    lines = writers.read_jsonl(f"{run}/train/metrics.jsonl")
    assert [(line["step"], line["loss"]) for line in lines] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    acc = ea.EventAccumulator(str(tmp_path / "run" / "train"), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 1.0), (2, 2.0), (3, 3.0)]


def test_a_long_outage_before_the_first_upload_keeps_the_purge(tmp_path):
    # A resumed run (purge_step=5) whose storage is down from the start: a 1 KiB buffer
    # dropped its oldest writes, the file version and both START records first, so the
    # uploaded file purged nothing and the earlier run's steps 5 to 10 showed again.
    server, gate, config = storage_servers.s3_behind_a_gate(1)  # a failed upload: at once
    run = f"s3://{storage_servers.BUCKET}/purge-{uuid.uuid4().hex[:8]}"
    try:
        with storage_servers.serving(server, "s3", config):
            with writers.TensorBoardWriter(run) as first:
                for step in range(1, 11):
                    first.write_scalars(step, {"loss": float(step)})
            resumed = writers.TensorBoardWriter(
                run, purge_step=5, flush_secs=3600, max_buffer_mb=0.001
            )
            gate.cut()
            for step in range(5, 45):
                resumed.write_scalars(step, {"loss": 100.0 + step})
            with pytest.raises(Exception) as failed:  # noqa: PT011  (botocore's, varying)
                resumed.flush()
            assert "oldest writes dropped" in "".join(failed.value.__notes__)
            gate.restore()
            resumed.close()
            storage_servers.copy_event_files(run, str(tmp_path))
    finally:
        server.stop()
    dropped = resumed._file._file.dropped.count
    assert 10 < dropped < 40
    acc = ea.EventAccumulator(str(tmp_path), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    kept = range(5 + dropped, 45)
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [
        *((s, float(s)) for s in range(1, 5)),
        *((s, 100.0 + s) for s in kept),
    ]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_close_that_failed_to_upload_uploads_when_called_again(tmp_path, asynchronous):
    # The default writers' close() in an outage raised, and a second close() returned at once
    # as if it had gone through: steps 6 to 10, never uploaded, were lost without a word.
    server, gate, config = storage_servers.s3_behind_a_gate(1)  # a failed upload: at once
    run = f"s3://{storage_servers.BUCKET}/close-again-{uuid.uuid4().hex[:8]}"
    try:
        with storage_servers.serving(server, "s3", config):
            w = writers.create_default_writer(
                run, console=False, flush_secs=3600, asynchronous=asynchronous
            )
            for step in range(1, 6):
                w.write_scalars(step, {"loss": float(step)})
            w.flush()
            gate.cut()
            for step in range(6, 11):
                w.write_scalars(step, {"loss": float(step)})
            with pytest.raises(writers.WriterError) as failed:
                w.close()
            assert sorted(name for name, _ in failed.value.failures) == ["jsonl", "tensorboard"]
            gate.restore()
            w.close()
            w.close()  # once it went through: nothing more to do
            lines = writers.read_jsonl(f"{run}/metrics.jsonl")
            storage_servers.copy_event_files(run, str(tmp_path))
    finally:
        server.stop()
    assert [(line["step"], line["loss"]) for line in lines] == [(s, float(s)) for s in range(1, 11)]
    acc = ea.EventAccumulator(str(tmp_path), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(s, float(s)) for s in range(1, 11)]


def test_a_manager_close_that_failed_to_upload_uploads_when_called_again(tmp_path):
    # MetricsManager.close() in an outage failed its writers' close, and a second close()
    # returned at once: steps 6 to 10, kept in the writers' buffers, were never uploaded.
    server, gate, config = storage_servers.s3_behind_a_gate(1)  # a failed upload: at once
    run = f"s3://{storage_servers.BUCKET}/manager-close-again-{uuid.uuid4().hex[:8]}"

    def buffered(d, collection=None, resume_step=None):
        return writers.create_default_writer(
            d, console=False, flush_secs=3600, collection=collection, resume_step=resume_step
        )

    try:
        with storage_servers.serving(server, "s3", config):
            m = MetricsManager("train", run, writer_factory=buffered)
            for step in range(1, 6):
                m.write_scalars(step, {"loss": float(step)})
            m.flush()
            gate.cut()
            for step in range(6, 11):
                m.write_scalars(step, {"loss": float(step)})
            m.close()
            assert sorted(f.source for f in m.errors) == ["writer:jsonl", "writer:tensorboard"]
            gate.restore()
            m.close()
            assert len(m.errors) == 2  # the writers' close went through this time
            m.close()  # once it went through: nothing more to do
            lines = writers.read_jsonl(f"{run}/train/metrics.jsonl")
            storage_servers.copy_event_files(f"{run}/train", str(tmp_path))
    finally:
        server.stop()
    assert [(line["step"], line["loss"]) for line in lines] == [(s, float(s)) for s in range(1, 11)]
    acc = ea.EventAccumulator(str(tmp_path), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(s, float(s)) for s in range(1, 11)]


def test_a_missing_bucket_is_refused_when_the_writers_are_made(server):
    # A misspelt bucket was taken: the writers' listing found no objects, and every upload
    # failed until close() with the client's bare "b/nobucket/o" (GCS) or "Not Found".
    run = f"{server.scheme}://no-such-bucket/run"
    makers = {
        "metrics.jsonl.d": lambda: writers.JsonlWriter(run),
        "": lambda: writers.TensorBoardWriter(run),
        "train/metrics.jsonl.d": lambda: MetricsManager("train", run),
        "config.gin": lambda: write_gin_config(run, config_str=CONFIG),
    }
    for name, make in makers.items():
        with pytest.raises(FileNotFoundError) as info:
            make()
        url = f"{run}/{name}".rstrip("/")
        assert str(info.value) == (
            f"bucket 'no-such-bucket' does not exist (or this account cannot see it), so "
            f"{url!r} can be neither written nor read: create the bucket, or fix the URL's "
            "bucket name"
        )
    new = f"{server.scheme}://{storage_servers.BUCKET}/new-{uuid.uuid4().hex[:8]}"
    with writers.JsonlWriter(new) as w:  # a new run in a bucket that exists: no objects yet
        w.write_scalars(1, {"loss": 1.0})
    assert [line["loss"] for line in writers.read_jsonl(new)] == [1.0]


@pytest.mark.parametrize("kind", ["tensorboard", "jsonl"])
def test_a_close_during_a_failing_timed_upload_fails_with_it_and_does_not_try_again(tmp_path, kind):
    # close() waited for the timer's retrying upload to end, then uploaded again: two client
    # retry budgets in one call (67 s on gcsfs, past writer_deadline_s, so a manager's close
    # took the writer for hung). It now fails with the timed upload, keeping the data.
    server, gate, config = storage_servers.s3_behind_a_gate(2)  # a failed upload: ~1.5 s
    run = f"s3://{storage_servers.BUCKET}/close-timed-{uuid.uuid4().hex[:8]}"
    try:
        with storage_servers.serving(server, "s3", config):
            if kind == "tensorboard":
                w = writers.TensorBoardWriter(run, flush_secs=0.2)
                parts = w._file._file  # the event file's parts (`_storage.PartStream`)
            else:
                w = writers.JsonlWriter(run, flush_secs=0.2)
                parts = w._log._stream
            w.write_scalars(1, {"loss": 1.0})
            w.flush()
            gate.cut()
            w.write_scalars(2, {"loss": 2.0})
            for _ in range(1000):  # until the timer's upload is under way
                if parts._upload.locked():
                    break
                time.sleep(0.005)
            with pytest.raises(OSError) as failed:
                w.close()
            where = run if kind == "tensorboard" else f"{run}/metrics.jsonl.d"
            assert str(failed.value).startswith(
                f"{where}: the upload under way when this flush began failed ("
            )
            gate.restore()
            w.close()
            lines = writers.read_jsonl(run) if kind == "jsonl" else None
            storage_servers.copy_event_files(run, str(tmp_path))
    finally:
        server.stop()
    if kind == "jsonl":
        assert [(line["step"], line["loss"]) for line in lines] == [(1, 1.0), (2, 2.0)]
    else:
        acc = ea.EventAccumulator(str(tmp_path), size_guidance={ea.SCALARS: 0})
        acc.Reload()
        assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 1.0), (2, 2.0)]


def test_storage_unreachable_when_the_writers_are_made_names_the_url():
    # The writers list the directory first (an earlier run's files): with storage down, the
    # error named only a host ("Could not connect to the endpoint URL: http://127.0.0.1:...").
    server, gate, config = storage_servers.s3_behind_a_gate(1)  # a failed request: at once
    run = f"s3://{storage_servers.BUCKET}/down-{uuid.uuid4().hex[:8]}"
    try:
        with storage_servers.serving(server, "s3", config):
            gate.cut()
            for make, listed in (
                (writers.TensorBoardWriter, run),
                (writers.JsonlWriter, f"{run}/metrics.jsonl.d"),
            ):
                with pytest.raises(Exception) as failed:  # noqa: PT011  (botocore's, varying)
                    make(run)
                assert failed.value.__notes__ == [
                    f"listing {listed!r} failed: check the storage's endpoint, the network "
                    "and the credentials"
                ]
            gate.restore()
            with writers.JsonlWriter(run) as w:
                w.write_scalars(1, {"loss": 1.0})
            assert [line["loss"] for line in writers.read_jsonl(run)] == [1.0]
    finally:
        server.stop()
