"""write_values: one call per kind, HyperParam without a step, clear errors."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from clu import values

import writers
from tests.writers.recording import RecordingWriter


def test_groups_values_by_kind_in_a_fixed_order():
    rec = RecordingWriter()
    image = np.zeros((2, 2, 3), np.uint8)
    hist = np.arange(6)
    audio = np.zeros((1, 4, 1), np.float32)
    writers.write_values(
        rec,
        5,
        {
            "loss": values.Scalar(1.5),
            "lr": 0.1,
            "n": np.int32(3),
            "acc": jnp.array([0.25]),
            "img": values.Image(image),
            "note": values.Text("hello"),
            "dropout": values.HyperParam(0.1),
            "w": values.Histogram(hist, num_buckets=4),
            "a16": values.Audio(audio, sample_rate=16000),
            "a8": values.Audio(audio, sample_rate=8000),
            "raw": values.Summary(np.ones(2), metadata=None),
        },
    )
    methods = [c[0] for c in rec.calls]
    assert methods == [
        "write_summaries",
        "write_scalars",
        "write_images",
        "write_texts",
        "write_hparams",
        "write_histograms",
        "write_audios",
        "write_audios",
    ]
    by_method = {c[0]: c for c in rec.calls}
    step, scalars = by_method["write_scalars"][1]
    assert step == 5 and set(scalars) == {"loss", "lr", "n", "acc"}
    assert scalars["loss"] == 1.5 and float(np.asarray(scalars["acc"]).reshape(())) == 0.25
    assert by_method["write_hparams"][1] == ({"dropout": 0.1},)  # no step
    assert by_method["write_histograms"][2] == {"num_buckets": {"w": 4}}
    audio_calls = [c for c in rec.calls if c[0] == "write_audios"]
    assert sorted(c[2]["sample_rate"] for c in audio_calls) == [8000, 16000]
    assert by_method["write_texts"][1] == (5, {"note": "hello"})


def test_summaries_are_grouped_by_metadata_even_when_unhashable():
    rec = RecordingWriter()
    meta_a, meta_b = {"plugin": "a"}, {"plugin": "b"}
    writers.write_values(
        rec,
        1,
        {
            "x": values.Summary(np.ones(1), metadata=meta_a),
            "y": values.Summary(np.ones(1), metadata={"plugin": "a"}),
            "z": values.Summary(np.ones(1), metadata=meta_b),
        },
    )
    calls = [(sorted(c[1][1]), c[2]["metadata"]) for c in rec.calls]
    assert calls == [(["x", "y"], meta_a), (["z"], meta_b)]


def test_unsupported_values_raise_one_type_error_naming_every_key_and_writes_nothing():
    rec = RecordingWriter()
    with pytest.raises(TypeError) as info:
        writers.write_values(
            rec,
            0,
            {"ok": 1.0, "s": "text", "arr": np.zeros((2, 3)), "big": values.Scalar(np.ones(4))},
        )
    message = str(info.value)
    assert "'s': str" in message
    assert "'arr': ndarray of shape (2, 3)" in message
    assert "'big': Scalar of ndarray of shape (4,)" in message
    assert "'ok'" not in message
    assert rec.calls == []
    # numpy counts timedelta64 as an integer: it passed as a scalar, a summary beside it was
    # written, then write_scalars refused it.
    for td in (np.timedelta64(3, "s"), np.array([3], dtype="timedelta64[s]")):
        with pytest.raises(
            TypeError,
            match=r"^write_values: unsupported value types for 'td': \w+ of dtype timedelta64\[s\]",
        ) as info:
            writers.write_values(rec, 5, {"sum": values.Summary(np.zeros(3), None), "td": td})
        assert "'sum'" not in str(info.value) and rec.calls == []


def test_group_values_can_skip_unsupported_values_and_group_the_rest():
    skipped: dict[str, str] = {}
    calls = writers.group_values(
        {"ok": 1.0, "arr": np.zeros((2, 3)), "t": values.Text("hi")}, skipped
    )
    assert calls == [
        ("write_scalars", {"scalars": {"ok": 1.0}}),
        ("write_texts", {"texts": {"t": "hi"}}),
    ]
    assert skipped == {"arr": "ndarray of shape (2, 3)"}


def test_bad_step_and_keys_are_rejected_before_writing():
    rec = RecordingWriter()
    with pytest.raises(ValueError, match="non-negative"):
        writers.write_values(rec, -1, {"a": 1.0})
    with pytest.raises(TypeError, match="must be a str"):
        writers.write_values(rec, 0, {("a",): 1.0})
    with pytest.raises(TypeError, match="non-negative integer"):
        writers.write_values(rec, 1.5, {"a": 1.0})
    assert rec.calls == []


def test_empty_mapping_writes_nothing():
    rec = RecordingWriter()
    writers.write_values(rec, 0, {})
    assert rec.calls == []


def test_works_with_a_clu_style_writer_without_our_base_class():
    class CluStyle:  # keyword names exactly as CLU's, no base class from us
        def __init__(self):
            self.seen = []

        def write_scalars(self, step, scalars):
            self.seen.append(("scalars", step, dict(scalars)))

        def write_hparams(self, hparams):
            self.seen.append(("hparams", dict(hparams)))

    w = CluStyle()
    writers.write_values(w, 2, {"a": 1, "h": values.HyperParam("adam")})
    assert w.seen == [("scalars", 2, {"a": 1}), ("hparams", {"h": "adam"})]


def test_takes_clus_keyword_names():
    # CLU's write_values(writer, step, metrics); the third parameter was named `values`
    # here, so CLU's keyword call raised "unexpected keyword argument 'metrics'".
    rec = RecordingWriter()
    writers.write_values(writer=rec, step=4, metrics={"loss": values.Scalar(0.5), "lr": 1e-3})
    assert rec.calls == [("write_scalars", (4, {"loss": 0.5, "lr": 1e-3}), {})]
