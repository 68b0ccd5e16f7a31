"""JsonlWriter: every line parsed back with json.loads (strict: no bare NaN)."""

from __future__ import annotations

import enum
import errno
import glob
import json
import math
import os
import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import writers


def _strict_lines(path) -> list[dict]:
    def reject(token):
        raise AssertionError(f"non-standard JSON constant {token}")

    with open(path, encoding="utf-8") as f:
        return [json.loads(line, parse_constant=reject) for line in f]


@pytest.fixture
def writer(tmp_path):
    w = writers.JsonlWriter(
        tmp_path / "sub" / "metrics.jsonl", collection="train", clock=lambda: 123.5
    )
    yield w
    w.close()


def test_one_object_per_call_with_step_time_collection(writer):
    writer.write_scalars(3, {"loss": 0.25, "n": np.int64(7), "acc": np.float32(0.5), "ok": True})
    writer.write_texts(3, {"note": "héllo\nworld"})
    writer.flush()
    assert _strict_lines(writer.path) == [
        {
            "step": 3,
            "time": 123.5,
            "collection": "train",
            "loss": 0.25,
            "n": 7,
            "acc": 0.5,
            "ok": 1,
        },
        {"step": 3, "time": 123.5, "collection": "train", "note": "héllo\nworld"},
    ]


def test_nan_and_inf_become_strings_and_the_file_stays_strict_json(writer):
    writer.write_scalars(1, {"nan": float("nan"), "inf": np.inf, "ninf": -np.inf, "x": 1.0})
    writer.write_summaries(1, {"t": np.array([1.0, np.nan, -np.inf])})
    writer.flush()
    scalars, tensor = _strict_lines(writer.path)
    assert (scalars["nan"], scalars["inf"], scalars["ninf"]) == ("NaN", "Infinity", "-Infinity")
    assert np.isnan(float(scalars["nan"])) and float(scalars["ninf"]) == -np.inf
    assert tensor["t"] == {
        "type": "tensor",
        "shape": [3],
        "dtype": "float64",
        "values": [1.0, "NaN", "-Infinity"],
    }


def test_non_scalar_values_are_summarized(writer, tmp_path):
    writer.write_images(2, {"img": np.zeros((2, 4, 5, 3), np.uint8)})
    writer.write_videos(2, {"vid": np.zeros((1, 3, 4, 5, 3))})
    writer.write_audios(2, {"aud": np.zeros((1, 10, 2))}, sample_rate=16000)
    writer.write_histograms(2, {"h": np.array([0.0, 1.0, 1.0, 3.0])}, num_buckets={"h": 3})
    writer.write_summaries(2, {"big": np.zeros(2000, np.int32)})
    writer.write_summaries(2, {"most": np.ones(1024, np.int8), "past": np.ones(1025, np.int8)})
    writer.flush()
    img, vid, aud, hist, big, edge = _strict_lines(writer.path)
    assert img["img"] == {"type": "image", "shape": [2, 4, 5, 3]}
    assert vid["vid"] == {"type": "video", "shape": [1, 3, 4, 5, 3]}
    assert aud["aud"] == {"type": "audio", "shape": [1, 10, 2], "sample_rate": 16000}
    assert hist["h"] == {
        "type": "histogram",
        "count": 4,
        "min": 0.0,
        "max": 3.0,
        "mean": 1.25,
        "edges": [0.0, 1.0, 2.0, 3.0],
        "counts": [1, 2, 1],
    }
    assert big["big"] == {"type": "tensor", "shape": [2000], "dtype": "int32"}
    # max_array_size=1024 (the default) is the largest written element by element.
    assert edge["most"]["values"] == [1] * 1024 and "values" not in edge["past"]
    unbounded = writers.JsonlWriter(tmp_path / "all.jsonl", max_array_size=math.inf)
    unbounded.write_summaries(2, {"big": np.arange(2000, dtype=np.int32)})
    unbounded.close()
    assert _strict_lines(tmp_path / "all.jsonl")[0]["big"]["values"] == list(range(2000))


def test_a_constant_histogram_gets_a_bucket_of_some_width_at_any_magnitude(writer):
    # Edges are the value +-0.5; past 2**53 that rounded back to the value: a constant 1e18
    # had edges [1e18, 1e18], a bucket of no width. Now the neighbouring floats there.
    values = {
        "one": 1.0,
        "big": 1e18,
        "neg": -1e18,
        "f32": np.float32(1e18),
        "top": np.finfo(float).max,
    }
    writer.write_histograms(1, {k: np.full(2, v) for k, v in values.items()})
    writer.flush()
    (line,) = _strict_lines(writer.path)
    edges = {k: line[k]["edges"] for k in values}
    assert edges["one"] == [0.5, 1.5]
    assert edges["big"] == [1e18 - 128, 1e18 + 128]  # float64's spacing there is 128
    assert edges["neg"] == [-1e18 - 128, -1e18 + 128]
    f32 = float(np.float32(1e18))  # 999999984306749440, spacing 128 too
    assert edges["f32"] == [f32 - 128, f32 + 128]
    top = float(np.finfo(float).max)
    assert edges["top"] == [np.nextafter(top, 0), top]  # no inf edge
    assert all(line[k]["counts"] == [2] for k in values)


def test_hparams_line_has_null_step(writer):
    writer.write_hparams({})  # wrote a line of `"hparams": {}`: empty writes write none
    writer.write_hparams(
        {"lr": 0.1, "opt": "adam", "layers": [1, 2], "n": np.int32(4), "b": False}
        | {"nb": np.bool_(True), "ns": np.str_("sgd"), "adam": {"b1": 0.9, "eps": {"v": 1e-8}}}
        # One-element arrays (a learning rate computed with jnp) are numbers, not their str().
        | {"jlr": jnp.float32(0.5), "a0": np.asarray(3), "jb": jnp.bool_(True), "v": np.ones(2)}
    )
    writer.flush()
    (line,) = _strict_lines(writer.path)
    assert line == {
        "step": None,
        "time": 123.5,
        "collection": "train",
        "hparams": {"lr": 0.1, "opt": "adam", "layers": "[1, 2]", "n": 4, "b": False}
        | {"nb": True, "ns": "sgd", "adam.b1": 0.9, "adam.eps.v": 1e-8}
        | {"jlr": 0.5, "a0": 3, "jb": True, "v": "[1. 1.]"},
    }
    # True == 1 in Python: the comparison above takes a bool written as 1; JSON's true is not.
    assert [k for k, v in line["hparams"].items() if type(v) is bool] == ["b", "nb", "jb"]


def test_lines_are_visible_before_flush_and_the_file_is_appended(tmp_path):
    path = tmp_path / "m.jsonl"
    w = writers.JsonlWriter(path)
    w.write_scalars(0, {"a": 1})
    # Line-buffered: a reader (tail -f) sees the line without flush().
    assert _strict_lines(path) == [
        {"step": 0, "time": _strict_lines(path)[0]["time"], "collection": None, "a": 1}
    ]
    w.close()
    again = writers.JsonlWriter(path)
    again.write_scalars(1, {"a": 2})
    again.close()
    assert [line["a"] for line in _strict_lines(path)] == [1, 2]


def test_url_logs_are_parts_uploaded_per_flush_and_read_back_in_order(tmp_path, monkeypatch):
    import fsspec

    fs = fsspec.filesystem("memory")
    monkeypatch.chdir(tmp_path)
    w = writers.JsonlWriter("memory://jl-bucket/run/metrics.jsonl", clock=lambda: 1.0)
    w.write_scalars(1, {"a": 1})
    w.write_scalars(2, {"a": 2})
    assert not fs.exists("/jl-bucket/run/metrics.jsonl.d")  # buffered until a flush
    w.flush()
    w.write_scalars(3, {"a": 3})
    w.close()
    first, second = sorted(fs.ls("/jl-bucket/run/metrics.jsonl.d", detail=False))
    assert re.fullmatch(r"/jl-bucket/run/metrics.jsonl.d/000000-00000000-[0-9a-f]{8}.jsonl", first)
    assert second == first.replace("-00000000-", "-00000001-")  # the writer's token
    again = writers.JsonlWriter("memory://jl-bucket/run/metrics.jsonl", clock=lambda: 1.0)
    again.write_scalars(4, {"a": 4})
    again.close()  # a new writer continues with the next part
    lines = writers.read_jsonl("memory://jl-bucket/run/metrics.jsonl")
    assert [(line["step"], line["a"]) for line in lines] == [(1, 1), (2, 2), (3, 3), (4, 4)]
    assert list(tmp_path.iterdir()) == []  # no local "memory:" directory created
    fs.rm("/jl-bucket", recursive=True)
    with pytest.raises(FileNotFoundError, match="no JSONL log at 'memory://jl-bucket/run"):
        writers.read_jsonl("memory://jl-bucket/run/metrics.jsonl")


def test_a_log_copied_to_a_url_is_read_before_the_parts_and_kept_by_a_resume():
    # `gsutil cp metrics.jsonl gs://b/run/`: read_jsonl read the parts under .d/ alone, so
    # the copied steps 1-3 were missing (FileNotFoundError with no parts yet).
    import fsspec

    fs, url = fsspec.filesystem("memory"), "memory://jl-copied/run/metrics.jsonl"
    try:
        copied = b"".join(b'{"step": %d, "a": %d}\n' % (s, s) for s in (1, 2, 3)) + b'{"step": 4'
        fs.pipe_file("/jl-copied/run/metrics.jsonl", copied)  # its last line torn: left out
        assert [line["step"] for line in writers.read_jsonl(url)] == [1, 2, 3]
        with writers.JsonlWriter(url, clock=lambda: 1.0) as w:
            assert w._log.last_step == 3  # a lower step is warned about, as locally
            w.write_scalars(4, {"a": 40})
        lines = writers.read_jsonl(url)
        assert [(line["step"], line["a"]) for line in lines] == [(1, 1), (2, 2), (3, 3), (4, 40)]
        with writers.JsonlWriter(url, clock=lambda: 2.0, resume_step=2) as w:
            w.write_scalars(3, {"a": 300})
        lines = writers.read_jsonl(url)  # the copy's steps up to 2 once, then the new ones
        assert [(line["step"], line["a"]) for line in lines] == [(1, 1), (2, 2), (3, 300)]
        assert fs.cat_file("/jl-copied/run/metrics.jsonl") == copied  # never written
    finally:
        fs.rm("/jl-copied", recursive=True)


@pytest.mark.parametrize("run", ["run", "p::q"])
def test_a_url_log_copied_down_is_read_from_its_parts(tmp_path, run):
    # `gsutil cp -r gs://b/run .` gives run/metrics.jsonl.d/<parts>: read_jsonl("run") and
    # read_jsonl("run/metrics.jsonl") raised a bare FileNotFoundError with the parts there
    # (and with them under p::q, fsspec read the file:// URL made of it as a chain).
    import fsspec

    fs, url = fsspec.filesystem("memory"), "memory://jl-down/run/metrics.jsonl"
    try:
        with writers.JsonlWriter(url, clock=lambda: 1.0, flush_secs=1e9) as w:
            for step in (1, 2, 3):
                w.write_scalars(step, {"a": step})
                w.flush()  # one part each
        fs.get("/jl-down/run", str(tmp_path / run), recursive=True)
    finally:
        fs.rm("/jl-down", recursive=True)
    assert len(os.listdir(tmp_path / run / "metrics.jsonl.d")) == 3
    for path in (tmp_path / run, tmp_path / run / "metrics.jsonl"):
        assert [(line["step"], line["a"]) for line in writers.read_jsonl(path)] == [
            (1, 1),
            (2, 2),
            (3, 3),
        ]


def test_a_url_log_with_its_object_copied_down_is_read_as_on_the_url(tmp_path):
    # A local log copied up, appended to on the URL, then copied down: the local file was read
    # alone, [1] where the URL reads [1, 2], and after a resume the stale object's [1, 2].
    import fsspec

    fs, url = fsspec.filesystem("memory"), "memory://jl-both/run/metrics.jsonl"
    try:
        fs.pipe_file("/jl-both/run/metrics.jsonl", b'{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n')
        with writers.JsonlWriter(url, clock=lambda: 1.0) as w:
            w.write_scalars(3, {"a": 3})
        fs.get("/jl-both/run", str(tmp_path / "run"), recursive=True)
        with writers.JsonlWriter(url, clock=lambda: 2.0, resume_step=1) as w:
            w.write_scalars(2, {"a": 20})
        fs.get("/jl-both/run", str(tmp_path / "resumed"), recursive=True)
    finally:
        fs.rm("/jl-both", recursive=True)
    assert os.path.isfile(tmp_path / "run" / "metrics.jsonl")
    for path in (tmp_path / "run", tmp_path / "run" / "metrics.jsonl"):
        assert [(line["step"], line["a"]) for line in writers.read_jsonl(path)] == [
            (1, 1),
            (2, 2),
            (3, 3),
        ]
    lines = writers.read_jsonl(tmp_path / "resumed")  # generation 1: the object is left
    assert [(line["step"], line["a"]) for line in lines] == [(1, 1), (2, 20)]


def test_a_log_suffix_in_upper_case_names_the_file(tmp_path):
    # "run.JSONL" was taken for a directory: run.JSONL/metrics.jsonl.
    for name in ("run.JSONL", "run.NDJson", "run.Log"):
        with writers.JsonlWriter(tmp_path / name, clock=lambda: 1.0) as w:
            w.write_scalars(3, {"loss": 0.25})
        assert os.path.isfile(tmp_path / name)
        assert writers.read_jsonl(tmp_path / name) == [
            {"step": 3, "time": 1.0, "collection": None, "loss": 0.25}
        ]
    assert sorted(os.listdir(tmp_path)) == ["run.JSONL", "run.Log", "run.NDJson"]


def test_a_url_log_copied_down_is_continued_as_on_the_url(tmp_path, caplog):
    # A local writer appended to run/metrics.jsonl, which read_jsonl reads before the parts
    # copied down with it: [1, 4, 2, 3], and resumed at 2 it kept the parts' 3: [1, 3, 2, 3].
    import fsspec

    fs, url = fsspec.filesystem("memory"), "memory://jl-cont/run/metrics.jsonl"
    try:
        fs.pipe_file("/jl-cont/run/metrics.jsonl", b'{"step": 1, "a": 1}\n')  # a log copied up
        with writers.JsonlWriter(url, clock=lambda: 1.0, flush_secs=1e9) as w:
            for step in (2, 3):
                w.write_scalars(step, {"a": step})
                w.flush()  # one part each
        fs.get("/jl-cont/run", str(tmp_path / "run"), recursive=True)
    finally:
        fs.rm("/jl-cont", recursive=True)
    run = tmp_path / "run"
    with writers.JsonlWriter(run, clock=lambda: 2.0) as w:
        w.write_scalars(2, {"a": 20})  # below the parts' 3: warned about, as on the URL
        w.write_scalars(4, {"a": 4})
    assert [(line["step"], line["a"]) for line in writers.read_jsonl(run)] == [
        (1, 1),
        (2, 2),
        (3, 3),
        (2, 20),
        (4, 4),
    ]
    assert "step 2 comes after step 3" in caplog.text
    with writers.JsonlWriter(run / "metrics.jsonl", clock=lambda: 3.0, resume_step=2) as w:
        w.write_scalars(3, {"a": 30})
    assert [(line["step"], line["a"]) for line in writers.read_jsonl(run)] == [
        (1, 1),
        (2, 2),
        (2, 20),
        (3, 30),
    ]
    assert (run / "metrics.jsonl").read_bytes() == b'{"step": 1, "a": 1}\n'  # never written


def test_a_part_cut_by_a_killed_file_url_write_loses_its_line_alone(tmp_path):
    # A file:// part is written in place: cut mid-line, its rest was glued onto the next
    # part's first line, so read_jsonl refused the log ("line 3 ... is not JSON"), and a
    # resume kept the glued line, under step 3, in the next generation.
    url = f"file://{tmp_path}/run/metrics.jsonl"
    with writers.JsonlWriter(url, clock=lambda: 1.0, flush_secs=1e9) as w:
        for step in (1, 2, 3):
            w.write_scalars(step, {"a": step})
            w.flush()  # one part each
    *_, last = sorted((tmp_path / "run" / "metrics.jsonl.d").iterdir())
    last.write_bytes(last.read_bytes()[:20])  # b'{"step": 3, "time": '
    with writers.JsonlWriter(url, clock=lambda: 2.0) as w:
        w.write_scalars(4, {"a": 4})
    assert [line["step"] for line in writers.read_jsonl(url)] == [1, 2, 4]
    with writers.JsonlWriter(url, clock=lambda: 3.0, resume_step=3) as w:
        w.write_scalars(4, {"a": 40})
    assert [(line["step"], line["a"]) for line in writers.read_jsonl(url)] == [
        (1, 1),
        (2, 2),
        (4, 40),
    ]


def test_two_writers_of_one_url_keep_each_others_parts():
    # A preempted run still flushing as its replacement starts: both uploaded part
    # 000000-00000001.jsonl, and the later upload replaced the other's lines.
    import fsspec

    fs, url = fsspec.filesystem("memory"), "memory://jl-two/run/metrics.jsonl"
    try:
        # A part named as before writers had tokens: read first, and continued after.
        fs.pipe_file("/jl-two/run/metrics.jsonl.d/000000-00000000.jsonl", b'{"step": 1}\n')
        old = writers.JsonlWriter(url, clock=lambda: 1.0)
        new = writers.JsonlWriter(url, clock=lambda: 2.0)
        old.write_scalars(2, {"a": 2})
        new.write_scalars(3, {"b": 3})
        old.flush()
        new.flush()
        new.write_scalars(4, {"b": 4})
        new.close()
        old.write_scalars(5, {"a": 5})
        old.close()
        assert len(fs.ls("/jl-two/run/metrics.jsonl.d", detail=False)) == 5
        lines = [(line["step"], line.get("time")) for line in writers.read_jsonl(url)]
        # In part order: both writers' part 1 (in the order of their tokens), then part 2.
        assert lines[0] == (1, None)
        assert sorted(lines[1:3]) == [(2, 1.0), (3, 2.0)]
        assert sorted(lines[3:]) == [(4, 2.0), (5, 1.0)]
    finally:
        fs.rm("/jl-two", recursive=True)


def test_bfloat16_tensors_are_numbers_and_bfloat16_images_are_accepted(writer):
    writer.write_summaries(1, {"t": jnp.array([1.5, jnp.nan, -jnp.inf], jnp.bfloat16)})
    writer.write_images(1, {"i": jnp.ones((2, 2, 3), jnp.bfloat16)})
    writer.write_histograms(1, {"h": jnp.array([0.0, 1.0], jnp.bfloat16)}, {"h": 2})
    writer.flush()
    tensor, image, hist = _strict_lines(writer.path)
    assert tensor["t"] == {
        "type": "tensor",
        "shape": [3],
        "dtype": "bfloat16",
        "values": [1.5, "NaN", "-Infinity"],
    }
    assert image["i"] == {"type": "image", "shape": [2, 2, 3]}
    assert (hist["h"]["counts"], hist["h"]["max"]) == ([1, 1], 1.0)


def test_complex_and_timedelta_tensors_are_written_as_strings(writer):
    # json.dumps refused complex and timedelta64 values (NumPy files the latter as an
    # integer): the writer failed and the line was lost.
    writer.write_summaries(
        1, {"c": np.array([1 + 2j], np.complex64), "d": np.array([90], "timedelta64[s]")}
    )
    writer.flush()
    (line,) = _strict_lines(writer.path)
    assert (line["c"]["values"], line["d"]["values"]) == (["(1+2j)"], ["0:01:30"])


def test_string_tensors_with_lone_surrogates_are_written_escaped_as_texts_are(writer):
    # A string tensor's elements went out as they were: the line held "a\ud800", which strict
    # readers (jq) mangle, while write_texts writes the same string as "b\\ud800".
    writer.write_summaries(1, {"s": np.array(["a\ud800", "ok"])})
    writer.write_texts(2, {"t": "b\ud800"})
    writer.flush()
    with open(writer.path, "rb") as f:
        lines = [json.loads(line.decode("utf-8", errors="strict")) for line in f]
    assert lines[0]["s"]["values"] == ["a\\ud800", "ok"]
    assert lines[1]["t"] == "b\\ud800"
    assert [r["s"]["values"] for r in writers.read_jsonl(writer.path) if "s" in r] == [
        ["a\\ud800", "ok"]
    ]
    json.dumps(lines, ensure_ascii=False).encode("utf-8")  # no lone surrogate left to refuse


def test_bytes_tensors_are_written_decoded_as_string_tensors_are(writer):
    # A bytes element went out as its repr: np.array([b"x"]) read back as "b'x'", while
    # TensorBoard stores the bytes themselves and shows them as text.
    writer.write_summaries(
        1,
        {
            "s": np.array([b"x", "café".encode(), b"a\xff"]),
            "o": np.array([b"y", "z"], dtype=object),
            "scalar": np.bytes_(b"q"),
        },
    )
    writer.flush()
    (line,) = writers.read_jsonl(writer.path)
    assert line["s"]["values"] == ["x", "café", "a\\xff"]  # undecodable: escaped, as surrogates
    assert (line["o"]["values"], line["scalar"]["values"]) == (["y", "z"], "q")
    assert _strict_lines(writer.path) == [line]


class Opt(enum.StrEnum):
    ADAM = "adam"


# Values each backend wrote wrong or refused with another library's error; the TensorBoard
# test of the same name reads them back there.
ODD_HPARAMS = {
    "opt": Opt.ADAM,  # W&B wrote 'ADAM'
    "budget": np.timedelta64(90, "s"),  # refused: "scalar 'hparam' must be a number"
    "shift": np.complex64(1 + 2j),
    "data": os.fsdecode(b"/data/caf\xe9"),  # TensorBoard and MLflow could not encode it
}
ODD_VALUES = {
    "q": jnp.array([3, -2], jnp.int4),  # strings in TensorBoard and JSONL, bytes in .npy
    "almost_constant": np.array([0.3, 0.1 + 0.2]),  # numpy: "Too many bins for data range"
}


def test_odd_values_are_written_as_every_writer_writes_them(writer):
    writer.write_hparams(ODD_HPARAMS)
    writer.write_texts(1, {"t": ODD_HPARAMS["data"]})
    writer.write_scalars(1, {"q": ODD_VALUES["q"][1], "x": np.array([0.25], np.longdouble)})
    writer.write_summaries(1, {"q": ODD_VALUES["q"], "x": np.array([0.25], np.longdouble)})
    writer.write_histograms(1, ODD_VALUES)
    writer.flush()
    hparams, text, scalars, tensors, hists = _strict_lines(writer.path)
    assert hparams["hparams"] == {
        "opt": "adam",
        "budget": "90 seconds",
        "shift": "(1+2j)",
        "data": "/data/caf\\udce9",
    }
    assert text["t"] == "/data/caf\\udce9"
    assert (scalars["q"], scalars["x"]) == (-2, 0.25)
    assert (tensors["q"]["values"], tensors["x"]["values"]) == ([3, -2], [0.25])
    assert (hists["q"]["edges"][0], hists["q"]["edges"][-1], sum(hists["q"]["counts"])) == (
        -2.0,
        3.0,
        2,
    )
    assert hists["almost_constant"]["counts"] == [2]
    assert hists["almost_constant"]["edges"] == [0.3, 0.1 + 0.2]


def test_a_directory_path_gets_metrics_jsonl_as_a_logdir_does(tmp_path):
    # `writer_factory=lambda logdir: writers.JsonlWriter(logdir)`: the manager's summary_dir
    # does not exist yet; it must become a directory, not a file where one belongs.
    (tmp_path / "there").mkdir()
    paths = {
        "new": tmp_path / "run" / "train",
        "there": tmp_path / "there",
        "dotted": tmp_path / "lr_0.001",
        "file": tmp_path / "a.log",
        "memory": "memory://jl-dir/run/train",
    }
    for name, path in paths.items():
        with writers.JsonlWriter(path, clock=lambda: 1.0) as w:
            w.write_scalars(1, {"a": len(name)})
        assert writers.read_jsonl(path) == [
            {"step": 1, "time": 1.0, "collection": None, "a": len(name)}
        ], name
    with writers.JsonlWriter(paths["new"]) as w:
        assert w.path == str(tmp_path / "run" / "train" / "metrics.jsonl")
    assert (tmp_path / "there" / "metrics.jsonl").is_file() and (tmp_path / "a.log").is_file()
    assert (tmp_path / "lr_0.001" / "metrics.jsonl").is_file()
    assert writers.read_jsonl("memory://jl-dir/run/train/metrics.jsonl")[0]["a"] == 6
    # The logdir holds TensorBoard's files too, and the plot command finds the run.
    with writers.TensorBoardWriter(paths["new"]) as tb:
        tb.write_scalars(1, {"a": 3.0})
    assert len(glob.glob(str(tmp_path / "run/train/events.out.tfevents.*"))) == 1


def test_bad_input_raises_and_keeps_what_was_written(writer):
    writer.write_scalars(0, {"a": 1.0})
    with pytest.raises(ValueError, match=r"keys \['step'\] are reserved"):
        writer.write_scalars(1, {"step": 1})
    with pytest.raises(TypeError, match="every key must be a str"):
        writer.write_scalars(1, {5: 1.0})
    with pytest.raises(ValueError, match="non-empty names"):
        writer.write_scalars(1, {"": 1.0})
    with pytest.raises(ValueError, match="non-negative"):
        writer.write_scalars(-3, {"a": 1.0})
    with pytest.raises(TypeError, match="step must be a non-negative integer"):
        writer.write_scalars(2.5, {"a": 1.0})
    with pytest.raises(ValueError, match=r"image 'i' must have shape .* got shape \(3, 3\)"):
        writer.write_images(1, {"i": np.zeros((3, 3))})
    with pytest.raises(TypeError, match="'s' must be a number"):
        writer.write_scalars(1, {"ok": 2.0, "s": "x"})
    writer.close()
    with pytest.raises(writers.WriterClosedError):
        writer.write_scalars(5, {"a": 1.0})
    writer.close()
    assert _strict_lines(writer.path) == [
        {"step": 0, "time": 123.5, "collection": "train", "a": 1.0}
    ]


@settings(max_examples=60, deadline=None)
@given(
    numbers=st.dictionaries(
        st.text(min_size=1, max_size=50).filter(
            lambda k: not k.isspace() and k not in ("step", "time", "collection")
        ),
        st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**70), 2**70),
        min_size=1,  # an empty write writes no line (test_multi)
        max_size=10,
    )
)
def test_any_scalars_round_trip_through_strict_json(tmp_path_factory, numbers):
    path = tmp_path_factory.mktemp("jsonl") / "m.jsonl"
    with writers.JsonlWriter(path, clock=lambda: 1.0) as w:
        w.write_scalars(9, numbers)
    (line,) = _strict_lines(path)
    assert list(line) == ["step", "time", "collection", *numbers]
    for key, value in numbers.items():
        got = line[key]
        if isinstance(value, int):
            assert got == value and type(got) is int
        elif np.isnan(value):
            assert got == "NaN"
        else:
            assert float(got) == value


def test_a_pipe_gets_the_lines_and_resume_is_refused_naming_it():
    read_end, write_end = os.pipe()
    try:
        path = f"/dev/fd/{write_end}"  # as `JsonlWriter("/dev/stdout")` piped into jq
        w = writers.JsonlWriter(path, collection="train", clock=lambda: 5.0)
        w.write_scalars(1, {"loss": 0.5})
        w.write_texts(2, {"note": "hi"})
        w.close()
        with pytest.raises(
            ValueError, match=r"resume_step=3 rewrites the log.*not a log file of its own"
        ):
            writers.JsonlWriter(path, resume_step=3)
    finally:
        os.close(write_end)
    with os.fdopen(read_end, encoding="utf-8") as pipe:
        lines = [json.loads(line) for line in pipe.read().splitlines()]
    assert lines == [
        {"step": 1, "time": 5.0, "collection": "train", "loss": 0.5},
        {"step": 2, "time": 5.0, "collection": "train", "note": "hi"},
    ]


_STDOUT_LOOP = """
import sys
import writers
w = writers.JsonlWriter("/dev/stdout", clock=lambda: 0.0)
for step in range(1, 4):
    print(f"step {step} done", flush=True)
    w.write_scalars(step, {"loss": 1.0 / step})
if sys.argv[1:] == ["eval"]:  # a second writer on the stream, as eval beside train
    writers.JsonlWriter("/dev/stdout", collection="eval", clock=lambda: 0.0).write_scalars(4, {"x": 1})
w.close()
"""


@pytest.mark.parametrize("second_writer", [False, True])
def test_dev_stdout_redirected_to_a_file_keeps_every_line_of_both(tmp_path, second_writer):
    """`python train.py > out.txt`: reopened by path, /dev/stdout had a position of its own,
    and the program's prints overwrote the log's lines; what the file held is kept, and a
    second writer on the stream (eval beside train) is not refused by a lock."""
    out = tmp_path / "out.txt"
    out.write_text("build: compiling...")  # earlier output, no newline at its end
    with open(out, "r+") as stdout:  # as `> out.txt` opens it: no O_APPEND
        stdout.seek(0, os.SEEK_END)
        args = [sys.executable, "-c", _STDOUT_LOOP, *(["eval"] if second_writer else [])]
        subprocess.run(args, stdout=stdout, check=True, timeout=120)
    lines = out.read_text().splitlines()
    assert lines[0] == "build: compiling...step 1 done"
    assert lines[1:] == [
        '{"step": 1, "time": 0.0, "collection": null, "loss": 1.0}',
        "step 2 done",
        '{"step": 2, "time": 0.0, "collection": null, "loss": 0.5}',
        "step 3 done",
        '{"step": 3, "time": 0.0, "collection": null, "loss": 0.3333333333333333}',
        *(['{"step": 4, "time": 0.0, "collection": "eval", "x": 1}'] if second_writer else []),
    ]


def test_a_directory_named_like_a_log_file_holds_metrics_jsonl(tmp_path):
    run = tmp_path / "run.log"
    run.mkdir()
    with writers.JsonlWriter(run, clock=lambda: 2.0) as w:
        w.write_scalars(1, {"a": 1.0})
    assert writers.read_jsonl(run) == [{"step": 1, "time": 2.0, "collection": None, "a": 1.0}]
    assert [p.name for p in run.iterdir()] == ["metrics.jsonl"]


def test_a_second_writer_of_this_process_on_one_log_is_refused_naming_this_process(tmp_path):
    with writers.JsonlWriter(tmp_path):
        with pytest.raises(ValueError, match="a JsonlWriter of this process holds a lock.*close"):
            writers.JsonlWriter(tmp_path / "metrics.jsonl")
    writers.JsonlWriter(tmp_path).close()  # closed: the lock is gone


@pytest.mark.parametrize("torn_bytes", [15, 100_000])  # shorter and longer than the 64 KiB tail
def test_a_line_torn_by_a_crash_is_dropped_so_the_next_run_appends_whole_lines(
    tmp_path, caplog, torn_bytes
):
    path = tmp_path / "metrics.jsonl"
    w = writers.JsonlWriter(path, clock=lambda: 1.0)
    w.write_scalars(1, {"a": 1.0})
    w.write_texts(2, {"t": "x" * 70_000})  # a line longer than the tail read back
    w.close()
    with open(path, "a", encoding="utf-8") as f:  # what a kill in the middle of a write leaves
        f.write(('{"step": 3, "time": 1.0, "a": ' + "9" * torn_bytes)[:torn_bytes])
    resumed = writers.JsonlWriter(path, clock=lambda: 1.0)
    resumed.write_scalars(2, {"a": 4.0})  # at the last whole line's step: no backwards warning
    resumed.close()
    assert [(line["step"], line.get("a")) for line in _strict_lines(path)] == [
        (1, 1.0),
        (2, None),
        (2, 4.0),
    ]
    assert writers.read_jsonl(path)[-1] == {"step": 2, "time": 1.0, "collection": None, "a": 4.0}
    (dropped,) = [r.getMessage() for r in caplog.records if "partial last line" in r.getMessage()]
    assert f"({torn_bytes} bytes)" in dropped and str(path) in dropped
    assert not [r for r in caplog.records if "comes after step" in r.getMessage()]


@pytest.mark.parametrize("url", [None, "memory://jl-long/metrics.jsonl"])
def test_a_step_below_one_on_a_last_line_over_64_kib_is_warned_about(tmp_path, caplog, url):
    """Only the log's last 64 KiB was read back: a longer last line was a fragment without its
    step, and a run logging lower steps onto the log went unwarned."""
    path = url or tmp_path / "metrics.jsonl"
    with writers.JsonlWriter(path, clock=lambda: 1.0) as w:
        w.write_scalars(100, {f"key_{i:05d}": i / 7 for i in range(5000)})  # ~150 KB
        w.write_hparams({"lr": 0.1})  # a last line without a step: the one before counts
    with writers.JsonlWriter(path, clock=lambda: 1.0) as w:
        w.write_scalars(1, {"loss": 1.0})
    assert [line["step"] for line in writers.read_jsonl(path)] == [100, None, 1]
    (warned,) = [r.getMessage() for r in caplog.records if "comes after step" in r.getMessage()]
    assert "step 1 comes after step 100" in warned
    if url:
        import fsspec

        fsspec.filesystem("memory").rm("/jl-long", recursive=True)


@pytest.mark.parametrize("before", [b"", b'{"step": 4, "time": 1.0, "a": 4.'])
def test_nul_bytes_a_crash_left_at_the_end_are_dropped_and_every_line_kept(
    tmp_path, caplog, before
):
    """A crash can leave a file's last blocks zero-filled. The NUL bytes were kept as another
    program's last line, and the next line written after them made the log unreadable."""
    path = tmp_path / "metrics.jsonl"
    with writers.JsonlWriter(path, clock=lambda: 1.0) as w:
        for step in (1, 2, 3):
            w.write_scalars(step, {"a": float(step)})
    with open(path, "ab") as f:
        f.write(before + b"\0" * 100)
    with writers.JsonlWriter(path, clock=lambda: 1.0) as w:
        w.write_scalars(4, {"a": 4.0})
    assert [(line["step"], line["a"]) for line in writers.read_jsonl(path)] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 4.0),
    ]
    (dropped,) = [r.getMessage() for r in caplog.records if "partial last line" in r.getMessage()]
    assert f"({len(before) + 100} bytes)" in dropped
    # A whole line before the NUL bytes is kept; a log already holding a line of them reads.
    path.write_bytes(b'{"step": 1}\n' + b"\0" * 10 + b"\n" + b'{"step": 2}' + b"\0" * 10)
    with writers.JsonlWriter(path, clock=lambda: 1.0) as w:
        w.write_scalars(3, {"a": 3.0})
    assert [line["step"] for line in writers.read_jsonl(path)] == [1, 2, 3]
    assert [r for r in caplog.records if "line 2 of" in r.getMessage() and "NUL" in r.getMessage()]
    # A blank line (`echo >> metrics.jsonl`) failed the whole read too: skipped likewise.
    path.write_bytes(b'{"step": 1}\n\n  \r\n{"step": 2}\n')
    assert [line["step"] for line in writers.read_jsonl(path)] == [1, 2]
    assert [r for r in caplog.records if "line 3 of" in r.getMessage()]


def test_a_line_holding_nul_bytes_is_skipped_and_the_lines_around_it_read(tmp_path, caplog):
    """Blocks a crash zero-filled inside the log join the start of one line to the end of a
    later one; read_jsonl refused the whole log ("line 3 ... is not JSON"), and for a line
    starting with NUL bytes named a 'utf-32-be' codec."""
    path = tmp_path / "metrics.jsonl"
    lines = [b'{"step": %d, "a": %d.0}\n' % (step, step) for step in range(1, 6)]
    for damaged in (
        b'{"step": 3, "a"' + b"\0" * 4096 + b".0}\n",  # lines 3 and 4 joined by the fill
        b"\0" * 4096 + b'"a": 4.0}\n',  # the fill from a line's start
    ):
        path.write_bytes(b"".join(lines[:2]) + damaged + lines[4])
        assert [(x["step"], x["a"]) for x in writers.read_jsonl(path)] == [
            (1, 1.0),
            (2, 2.0),
            (5, 5.0),
        ]
    (skipped, *_) = [r.getMessage() for r in caplog.records if "NUL" in r.getMessage()]
    assert "skipping line 3 of" in skipped and "<4096 NUL>" in skipped
    with writers.JsonlWriter(path, clock=lambda: 1.0) as w:  # the log goes on after it
        w.write_scalars(6, {"a": 6.0})
    assert [x["step"] for x in writers.read_jsonl(path)] == [1, 2, 5, 6]


@pytest.mark.parametrize(
    "name, before",
    [
        ("results.json", '{\n  "lr": 0.1\n}'),  # pretty-printed JSON: its closing brace
        ("app.log", "line 1\nprogress 99%"),  # a progress bar's last line
        ("metrics.jsonl", '{"step": 1, "time": 1.0, "a": 1.0}'),  # a whole line, its \n lost
    ],
)
def test_a_last_line_no_killed_writer_left_is_kept(tmp_path, caplog, name, before):
    """Any last line without a newline was taken for a killed writer's and cut off, even when
    nothing was written: another program's data, lost."""
    path = tmp_path / name
    path.write_text(before)
    writers.JsonlWriter(path).close()
    assert path.read_text() == before  # nothing written: the file is as it was
    with writers.JsonlWriter(path, clock=lambda: 2.0) as w:
        w.write_scalars(2, {"a": 2.0})
    assert path.read_text() == before + '\n{"step": 2, "time": 2.0, "collection": null, "a": 2.0}\n'
    assert not [r for r in caplog.records if "partial last line" in r.getMessage()]


def test_read_jsonl_names_the_line_that_is_no_json_and_skips_one_being_written(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n{"step": 3, "a"')
    assert writers.read_jsonl(path) == [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}]
    path.write_bytes(b'{"step": 1, "a": 1.0}\nedited by hand\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"line 2 of .*metrics.jsonl is not JSON .*edited by hand"):
        writers.read_jsonl(tmp_path)


def test_a_file_system_without_flock_writes_without_the_lock_and_says_so(
    tmp_path, monkeypatch, caplog
):
    # Lustre mounted without -o flock answers flock() with ENOSYS (NFS without lockd: ENOLCK).
    # No such mount exists here, so the call fails the same way through fcntl.
    import fcntl

    def no_flock(fd, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    path = tmp_path / "metrics.jsonl"
    with writers.JsonlWriter(path) as w:
        w.write_scalars(1, {"loss": 0.5})
    assert [line["loss"] for line in writers.read_jsonl(path)] == [0.5]
    assert writers.read_jsonl(tmp_path) == writers.read_jsonl(path)  # a run dir reads its log
    logged = [r.getMessage() for r in caplog.records if "cannot lock the log" in r.getMessage()]
    assert len(logged) == 1 and "Function not implemented" in logged[0], logged


def test_a_clock_returning_a_numpy_float_is_written_as_a_number(tmp_path):
    # A clock giving np.float32 (a simulated clock kept in NumPy) failed every write with
    # "Object of type float32 is not JSON serializable".
    path = str(tmp_path / "metrics.jsonl")
    with writers.JsonlWriter(path, clock=lambda: np.float32(1.5)) as w:
        w.write_scalars(1, {"a": 1.0})
    assert writers.read_jsonl(path) == [{"step": 1, "time": 1.5, "collection": None, "a": 1.0}]
