"""The per-summary fast paths (key, kind and layout caches) give the same results as a first call."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
from clu import values
from hypothesis import given, settings
from hypothesis import strategies as st

import writers
from tests.writers.recording import RecordingWriter
from writers import _checks
from writers.console import _number, _numbers


class LooksLikeKey:
    """Not a str, but equal to (and hashed like) one: must not pass as a cached key."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return other == self.name


def test_a_new_bad_key_still_raises_after_the_good_keys_were_cached(tmp_path):
    w = writers.JsonlWriter(tmp_path / "m.jsonl")
    for step in range(3):
        w.write_scalars(step, {"loss": 0.5, "acc": 1.0})
    with pytest.raises(ValueError, match=r"keys must be non-empty names, got \[' '\]"):
        w.write_scalars(3, {"loss": 0.5, " ": 1.0})
    with pytest.raises(TypeError, match=r"every key must be a str, got 7 \(int\)"):
        w.write_scalars(3, {"loss": 0.5, 7: 1.0})
    with pytest.raises(TypeError, match=r"every key must be a str, got .*\(LooksLikeKey\)"):
        _checks.check_keys({LooksLikeKey("loss"): 0.5}, "check")
    w.close()
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2]


def test_a_key_utf8_cannot_encode_is_refused_before_any_writer_writes(tmp_path):
    """A key from `os.fsdecode` of a Latin-1 file name: JSONL and the console wrote it,
    then TensorBoard's encode failed, and its other keys of the call were lost there too."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    key = "eval/" + os.fsdecode(b"caf\xe9")
    w = writers.create_default_writer(tmp_path, console=False)
    with pytest.raises(ValueError, match=r"keys \['eval/caf\\udce9'\] hold lone surrogates"):
        w.write_scalars(1, {"loss": 0.5, key: 1.0})
    w.write_scalars(2, {"loss": 0.25, "eval/café": 1.0})  # a real non-ASCII name is fine
    w.close()
    assert [(x["step"], x["loss"]) for x in writers.read_jsonl(tmp_path)] == [(2, 0.25)]
    events = ea.EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(2, 0.25)]
    assert [e.value for e in events.Scalars("eval/café")] == [1.0]


def test_steps_and_numbers_convert_as_before_through_the_fast_paths():
    assert _checks.check_step(5) == 5
    with pytest.raises(ValueError, match="step must be a non-negative integer, got -1"):
        _checks.check_step(-1)
    with pytest.raises(TypeError, match="got True of type bool"):
        _checks.check_step(True)
    inputs = {
        "f32": np.float32(0.25),
        "f16": np.float16(-2.5),
        "i64": np.int64(-3),
        "u8": np.uint8(200),
        "b": True,
        "nb": np.bool_(False),
        "arr": np.array([1.5], np.float32),
    }
    out = _checks.check_numbers(inputs, "check")
    assert out == {"f32": 0.25, "f16": -2.5, "i64": -3, "u8": 200, "b": 1, "nb": 0, "arr": 1.5}
    assert [type(v) for v in out.values()] == [float, float, int, int, int, int, float]
    # One-element arrays take the fast path (a Sum's compute() is a 0-d array): the same
    # numbers and types as to_number gives; any other array still gets to_number's message.
    arrays = {
        "0d": np.array(2.5, np.float32),
        "u64": np.array([[2**63 + 1]], np.uint64),
        "bool": np.array(True),
        "ld": np.array(0.5, np.longdouble),
    }
    fast = _checks.collect_numbers(arrays, _checks.Problems("check"))
    assert fast == {k: _checks.to_number(k, v) for k, v in arrays.items()}
    assert fast == {"0d": 2.5, "u64": 2**63 + 1, "bool": 1, "ld": 0.5}
    assert [type(v) for v in fast.values()] == [float, int, int, float]
    with pytest.raises(ValueError, match=r"'two' must hold exactly one number, got an array of sh"):
        _checks.check_numbers({**arrays, "two": np.zeros(2, np.float32)}, "check")


def test_write_values_kinds_are_the_same_on_first_and_repeated_calls():
    class MyScalar(values.Scalar):
        pass

    summary = {
        "a": values.Scalar(np.float32(0.5)),
        "b": MyScalar(2),
        "c": np.array(3.0),
        "d": values.Text("hi"),
        "e": 4,
    }
    w = RecordingWriter()
    for step in range(3):
        writers.write_values(w, step, summary)
    expected = [
        ("write_scalars", (step, {"a": np.float32(0.5), "b": 2, "c": np.array(3.0), "e": 4}), {})
        for step in range(3)
    ]
    assert [c for c in w.calls if c[0] == "write_scalars"] == expected
    assert type(w.calls[0][1][1]["a"]) is np.float32  # the writer gets the value unconverted
    # A clu Scalar of a class seen before but holding a non-scalar is still rejected.
    with pytest.raises(TypeError, match=r"'a': Scalar of ndarray of shape \(2,\), 'b': MyScalar\."):
        writers.write_values(w, 3, {"a": values.Scalar(np.zeros(2)), "b": MyScalar(np.zeros(2))})
    assert len(w.calls) == 6


def test_console_layout_follows_each_call_s_own_keys():
    out = io.StringIO()
    w = writers.ConsoleWriter(out, clock=lambda: 0.0)  # a fixed clock: no steps/s
    w.write_scalars(1, {"b/x": 1.0, "a": 2.0})
    w.write_scalars(2, {"a": 2.0, "b/x": 1.0})  # same keys, other order
    w.write_scalars(3, {"long_name": 3.0, "a": 2.0})
    w.write_texts(4, {"a": "one\ntwo", "bb": "x"})
    assert out.getvalue() == (
        "step 1\n  a    2\n  b/x  1\n"
        "step 2\n  a    2\n  b/x  1\n"
        "step 3\n  a          2\n  long_name  3\n"
        "step 4\n  a   one\n      two\n  bb  x\n"
    )


def test_jsonl_lines_with_and_without_non_finite_values(tmp_path):
    w = writers.JsonlWriter(tmp_path / "m.jsonl", clock=lambda: 1.0)
    w.write_scalars(1, {"a": np.float32(0.5), "n": 3})
    w.write_scalars(2, {"a": float("nan"), "b": -np.inf, "big": 10**400})
    w.write_scalars(3, {"big": 10**400, "a": 1.5})
    w.close()
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 1, "time": 1.0, "collection": None, "a": 0.5, "n": 3},
        {"step": 2, "time": 1.0, "collection": None, "a": "NaN", "b": "-Infinity", "big": 10**400},
        {"step": 3, "time": 1.0, "collection": None, "big": 10**400, "a": 1.5},
    ]


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["loss", "timing/seqs_per_second", "x/s", "n"]),
        st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**20), 10**20),
    )
)
def test_console_numbers_match_number_for_every_value(values):
    assert _numbers(values) == {k: _number(v) for k, v in values.items()}


def test_multi_writer_and_write_values_still_reject_bad_calls_after_good_ones():
    rec = RecordingWriter()
    multi = writers.MultiWriter({"rec": rec})
    for step in range(2):
        multi.write_scalars(step, {"loss": 1.0})
        writers.write_values(multi, step, {"loss": 1.0})
    with pytest.raises(TypeError, match=r"MultiWriter.write_scalars: 2 problems:\n  - step must"):
        multi.write_scalars(1.5, {"loss": 1.0, 3: 2.0})
    with pytest.raises(
        ValueError, match=r"write_values: step must be a non-negative integer, got -2"
    ):
        writers.write_values(multi, -2, {"loss": 1.0})
    with pytest.raises(ValueError, match=r"write_values: keys must be non-empty names, got \[''\]"):
        writers.write_values(multi, 2, {"loss": 1.0, "": 2.0})
    assert [c[1] for c in rec.calls] == [(0, {"loss": 1.0})] * 2 + [(1, {"loss": 1.0})] * 2


def test_scalar_events_with_cached_tags_match_protobuf_with_and_without_overflow():
    from tensorboardX.proto import event_pb2, summary_pb2

    from writers import _tb_summary

    overflow = ({"a": 1e39, "b": -1e300}, {"a": 10**40, "b": -(2**70)})  # 10**40: an int
    for numbers in ({"a": 0.5, "b": 2}, *overflow, {"a": -0.0, "b": 7}):
        encoded = _tb_summary.scalar_event(9, numbers)
        values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in numbers.items()]
        expected = event_pb2.Event(
            step=9,
            wall_time=event_pb2.Event.FromString(encoded).wall_time,
            summary=summary_pb2.Summary(value=values),
        )
        assert encoded == expected.SerializeToString()
