"""LoggingWriter: CLU's line format, read back from the absl log records."""

from __future__ import annotations

import logging as py_logging

import numpy as np
import pytest

import writers


@pytest.fixture
def log_lines(caplog):
    caplog.set_level(py_logging.INFO, logger="absl")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "absl"]

    return lines


def test_scalars_line_matches_clu_format(log_lines):
    w = writers.LoggingWriter(collection="train")
    w.write_scalars(
        12,
        {
            "loss": 0.123456789,
            "accuracy": np.float32(0.5),
            "steps": 7,
            "nan": float("nan"),
            "big": 1234567.0,
        },
    )
    assert log_lines() == [
        "[12] collection=train accuracy=0.5, big=1.23457e+06, loss=0.123457, nan=nan, steps=7"
    ]


def test_scalar_keys_with_line_breaks_and_escapes_stay_on_one_line(log_lines):
    # A key's "\n" split the line: `grep '^\[5\]'` lost `x=1.5`, and "\x1b[2J" cleared a terminal.
    w = writers.LoggingWriter(collection="train")
    w.write_scalars(5, {"k\nx": 1.5, "a\x1b[2J": 2, "z\u202eb": 0.25, "caf\u00e9 t": 3.0})
    assert log_lines() == [
        "[5] collection=train a\\x1b[2J=2, caf\u00e9 t=3, k\\nx=1.5, z\\u202eb=0.25"
    ]


def test_no_collection_part_without_a_collection(log_lines):
    w = writers.LoggingWriter()
    w.write_scalars(3, {"b": 2, "a": 1.0})
    assert log_lines() == ["[3] a=1, b=2"]


def test_other_kinds_are_logged_like_clu(log_lines):
    w = writers.LoggingWriter(collection="eval")
    w.write_texts(1, {"note": "hi"})
    w.write_images(1, {"img": np.zeros((2, 4, 4, 3))})
    w.write_histograms(1, {"w": np.array([0.0, 1.0, 1.0, 2.0])}, num_buckets={"w": 2})
    w.write_histograms(1, {"c": np.full(3, 5.0)})
    w.write_hparams({})  # an empty call: no line, as for every kind (it logged "{}")
    w.write_hparams({"lr": 0.1})
    w.write_summaries(1, {"raw": np.zeros((2, 3))})
    w.write_audios(1, {"a": np.zeros((1, 10, 2))}, sample_rate=8000)
    w.write_videos(1, {"v": np.zeros((1, 2, 3, 3, 3))})
    assert log_lines() == [
        "[1] collection=eval Got texts: {'note': 'hi'}.",
        "[1] collection=eval Got images: {'img': (2, 4, 4, 3)}.",
        "[1] collection=eval Histogram for 'w' = {[0, 1): 1, [1, 2]: 3}",
        "[1] collection=eval Histogram for 'c' = {[4.5, 5.5]: 3}",
        "[Hyperparameters] collection=eval {'lr': 0.1}",
        "[1] collection=eval Got raw tensors: {'raw': (2, 3)}.",
        "[1] collection=eval Got audios: {'a': (1, 10, 2)}.",
        "[1] collection=eval Got videos: {'v': (1, 2, 3, 3, 3)}.",
    ]


def test_empty_calls_log_no_line(log_lines):
    w = writers.LoggingWriter()
    w.write_scalars(1, {})  # logged "[1] "
    w.write_texts(2, {})  # "[2] Got texts: {}."
    w.write_images(3, {})
    w.write_videos(4, {})
    w.write_audios(5, {}, sample_rate=8000)
    w.write_summaries(6, {})
    w.write_histograms(7, {})
    w.write_scalars(8, {"a": 1})
    assert log_lines() == ["[8] a=1"]


def test_bad_input_raises_and_logs_nothing(log_lines):
    w = writers.LoggingWriter()
    with pytest.raises(TypeError, match="'s' must be a number"):
        w.write_scalars(0, {"ok": 1.0, "s": "x"})
    with pytest.raises(ValueError, match=r"image 'i' must have shape"):
        w.write_images(0, {"i": np.zeros((4, 4))})
    with pytest.raises(ValueError, match="1 NaN/Inf entries"):
        w.write_histograms(0, {"h": np.array([1.0, np.inf])})
    assert log_lines() == []


def test_write_after_close_raises_and_close_is_idempotent(log_lines):
    w = writers.LoggingWriter()
    w.write_scalars(0, {"a": 1})
    w.close()
    w.close()
    w.flush()
    with pytest.raises(writers.WriterClosedError, match="LoggingWriter.write_scalars"):
        w.write_scalars(1, {"a": 2})
    assert log_lines() == ["[0] a=1"]


def test_a_line_break_in_the_collection_is_shown_not_run(log_lines):
    # `collection="a\nb"` split every line: `[1] collection=a`, then `b x=1`.
    w = writers.LoggingWriter(collection="a\nb\x1b[2J")
    w.write_scalars(1, {"x": 1})
    w.write_hparams({"lr": 0.1})
    assert log_lines() == [
        "[1] collection=a\\nb\\x1b[2J x=1",
        "[Hyperparameters] collection=a\\nb\\x1b[2J {'lr': 0.1}",
    ]
