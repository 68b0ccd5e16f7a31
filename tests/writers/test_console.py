"""ConsoleWriter: exact text in plain mode, colours only on a TTY, progress and ETA."""

from __future__ import annotations

import io
import os

import jax.numpy as jnp
import numpy as np
import pytest

import writers
from writers.console import _duration, _number


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_block_is_aligned_grouped_by_prefix_and_formatted_for_humans():
    out = io.StringIO()
    w = writers.ConsoleWriter(out, collection="train")
    w.write_scalars(
        1200,
        {
            "timing/seqs_per_second": 12345.6,
            "loss": 2.3456789,
            "eval/accuracy": 0.5,
            "timing/steps_per_second": 12.3456,
            "grad_norm": float("nan"),
            "tokens": 1234567,
            "lr": 1e-4,
            "z": -np.inf,
        },
    )
    assert out.getvalue() == (
        "step 1,200 | train\n"
        "  grad_norm                NaN\n"
        "  loss                     2.346\n"
        "  lr                       0.0001\n"
        "  tokens                   1,234,567\n"
        "  z                        -inf\n"
        "  eval/accuracy            0.5\n"
        "  timing/seqs_per_second   12,346\n"
        "  timing/steps_per_second  12.35\n"
    )
    assert "\x1b[" not in out.getvalue()


def test_wide_characters_keep_the_value_column_aligned():
    out = io.StringIO()
    w = writers.ConsoleWriter(out)
    w.write_scalars(1, {"損失": 1.5, "loss_avg": 2.0, "精度/top1": 0.5})
    w.write_texts(1, {"メモ": "two\nlines"})
    assert out.getvalue() == (
        "step 1\n"
        "  loss_avg   2\n"
        "  損失       1.5\n"  # two columns per character: 4 columns, padded with 5 spaces
        "  精度/top1  0.5\n"
        "step 1\n"
        "  メモ  two\n"
        "        lines\n"  # the continuation sits under the value column
    )


def test_one_very_long_key_does_not_push_every_value_to_the_right():
    out = io.StringIO()
    w = writers.ConsoleWriter(out)
    long = "eval/" + "x" * 60
    w.write_scalars(1, {"loss": 1.5, long: 2.0})
    w.write_texts(1, {"note": "two\nlines", long: "z"})
    pad = " " * 44  # "loss" padded to the value column, 48 columns
    assert out.getvalue() == (
        f"step 1\n  loss{pad}  1.5\n  {long}  2\n"
        f"step 1\n  note{pad}  two\n{' ' * 52}lines\n  {long}  z\n"
    )


def test_colour_only_on_a_tty(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    tty = FakeTty()
    writers.ConsoleWriter(tty).write_scalars(1, {"loss": float("nan")})
    assert "\x1b[" in tty.getvalue()
    plain = io.StringIO()
    writers.ConsoleWriter(plain).write_scalars(1, {"loss": float("nan")})
    assert plain.getvalue() == "step 1\n  loss  NaN\n"
    forced = io.StringIO()
    writers.ConsoleWriter(forced, color=True).write_scalars(1, {"loss": 1.0})
    assert "\x1b[" in forced.getvalue()
    for on, colored in ((1, True), (0, False), (np.True_, True)):  # as bool(color) reads
        out = io.StringIO()
        writers.ConsoleWriter(out, color=on).write_scalars(1, {"loss": 1.0})
        assert ("\x1b[" in out.getvalue()) is colored, on
    monkeypatch.setenv("NO_COLOR", "1")
    no_color = FakeTty()
    writers.ConsoleWriter(no_color).write_scalars(1, {"loss": 1.0})
    assert no_color.getvalue() == "step 1\n  loss  1\n"


def test_colour_is_decided_once_not_on_every_write(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)

    class CountingTty(FakeTty):
        calls = 0

        def isatty(self) -> bool:
            CountingTty.calls += 1
            return True

    tty = CountingTty()
    w = writers.ConsoleWriter(tty)
    for step in range(5):
        w.write_scalars(step, {"loss": 1.0})
    assert CountingTty.calls == 1
    assert tty.getvalue().count("\x1b[") >= 5  # every block coloured
    plain = io.StringIO()
    monkeypatch.setattr("sys.stdout", plain)  # stream=None follows sys.stdout
    w = writers.ConsoleWriter(color=None)
    w.write_scalars(1, {"loss": 1.0})
    monkeypatch.setattr("sys.stdout", tty)
    w.write_scalars(2, {"loss": 1.0})
    assert plain.getvalue() == "step 1\n  loss  1\n"
    assert CountingTty.calls == 2  # a new sys.stdout is asked once


def test_progress_line_excludes_the_first_compiling_window():
    out, clock = io.StringIO(), FakeClock()
    w = writers.ConsoleWriter(out, total_steps=1000, clock=clock)
    clock.now = 95.0  # compilation + first 100 steps: not used for the rate
    w.write_scalars(100, {"loss": 1.0})
    clock.now = 115.0  # 200 steps in 20 s -> 10 steps/s, 700 steps left -> 70 s
    w.write_scalars(300, {"loss": 0.5})
    clock.now = 175.0  # 900 steps in 80 s from the first write -> 11.25 steps/s
    w.write_scalars(1000, {"loss": 0.25})
    headers = [line for line in out.getvalue().splitlines() if line.startswith("step")]
    assert headers == [
        "step 100/1,000 (10.0%)",
        "step 300/1,000 (30.0%) | 10 steps/s | ETA 1m 10s",
        "step 1,000/1,000 (100.0%) | 11.25 steps/s",
    ]


def test_rates_count_from_the_first_scalars_not_a_text_written_before_compiling():
    """A config text at step 0, then 60 s of compilation: 1.4 steps/s were shown for 10."""
    out, clock = io.StringIO(), FakeClock()
    w = writers.ConsoleWriter(out, total_steps=1000, clock=clock)
    w.write_texts(0, {"config": "lr = 0.1"})  # at 0 s, before compiling
    clock.now = 30.0
    w.write_scalars(0, {"eval/loss": 2.0})  # an eval before training: scalars of step 0...
    clock.now = 61.0
    w.write_scalars(0, {"timing/compilation_seconds": 61.0})  # ...but the step's last count
    clock.now = 70.0
    w.write_scalars(100, {"loss": 1.0})  # 100 steps in 9 s
    clock.now = 80.0
    w.write_histograms(200, {"w": np.ones(3)})  # 200 steps in 19 s
    headers = [line for line in out.getvalue().splitlines() if line.startswith("step")]
    assert headers == [
        "step 0/1,000 (0.0%)",
        "step 0/1,000 (0.0%)",
        "step 0/1,000 (0.0%)",
        "step 100/1,000 (10.0%) | 11.11 steps/s | ETA 1m 21s",
        "step 200/1,000 (20.0%) | 10.53 steps/s | ETA 1m 16s",
    ]


@pytest.mark.parametrize("stream", [io.StringIO, FakeTty])
def test_terminal_escapes_in_a_key_are_shown_not_run(stream):
    out = stream()
    writers.ConsoleWriter(out).write_scalars(1, {"a\x1b[2Jb": 1.0, "loss": 2.0})
    text = out.getvalue()
    assert "\x1b[2J" not in text and "a\\x1b[2Jb" in text
    if stream is io.StringIO:  # aligned as shown: the escaped key is 9 columns wide
        assert text == "step 1\n  a\\x1b[2Jb  1\n  loss       2\n"


def test_a_newline_tab_or_bidi_control_in_a_key_is_shown_escaped_in_its_row():
    """A newline split the key over two lines, its value in the key column; a tab counted
    as 0 columns; U+202E reversed the rest of the line on a terminal."""
    out = io.StringIO()
    writers.ConsoleWriter(out).write_scalars(1, {"a\nb": 6, "a\tb": 1.0, "x\u202ey": 2.0})
    assert out.getvalue() == ("step 1\n  a\\tb      1\n  a\\nb      6\n  x\\u202ey  2\n")


def test_the_progress_line_reads_100_percent_only_at_the_last_step():
    out, clock = io.StringIO(), FakeClock()
    w = writers.ConsoleWriter(out, total_steps=10_000, clock=clock)
    w.write_scalars(9_996, {"loss": 1.0})  # 99.96%: it read 100.0%
    w.write_scalars(10_000, {"loss": 1.0})
    headers = [line.split(" |")[0] for line in out.getvalue().splitlines() if "step" in line]
    assert headers == ["step 9,996/10,000 (99.9%)", "step 10,000/10,000 (100.0%)"]


def test_other_kinds_have_readable_lines():
    out = io.StringIO()
    w = writers.ConsoleWriter(out)
    w.write_texts(1, {"config": "a = 1\nb = 2"})
    w.write_images(1, {"img": np.zeros((2, 4, 4, 3))})
    w.write_histograms(1, {"h": np.array([1.0, 2.0, 3.0, 6.0])})
    w.write_audios(1, {"a": np.zeros((1, 8, 1))}, sample_rate=16000)
    w.write_videos(1, {"v": np.zeros((1, 2, 3, 3, 1))})
    w.write_summaries(1, {"t": np.zeros((2, 3), np.float32)})
    w.write_hparams({"lr": 0.1, "opt": "adam"})
    w.write_scalars(2, {})  # printed a bare "step 2" header
    w.write_texts(2, {})
    w.write_hparams({})  # printed a bare "hyperparameters" header
    assert out.getvalue() == (
        "step 1\n  config  a = 1\n          b = 2\n"
        "step 1\n  img  image [2, 4, 4, 3]\n"
        "step 1\n  h  histogram n=4 min=1 mean=3 max=6\n"
        "step 1\n  a  audio [1, 8, 1] @ 16,000 Hz\n"
        "step 1\n  v  video [1, 2, 3, 3, 1]\n"
        "step 1\n  t  tensor [2, 3] float32\n"
        "hyperparameters\n  lr   0.1\n  opt  adam\n"
    )


def test_number_and_duration_formatting():
    assert _number(999.94) == "999.9" and _number(1500.4) == "1,500"
    # `.4g` rounds these up to `1000`: shown whole, as 1000.0 is (they read `1000`, `-1000`).
    assert _number(999.95) == "1,000" and _number(-999.99) == "-1,000"
    assert _number(999.9499999999999) == "999.9" and _number(1000.0) == "1,000"
    assert _number(123456.789) == "123,457" and _number(-2.5e14) == "-250,000,000,000,000"
    assert _number(1e15) == "1e+15" and _number(float("inf")) == "inf"
    # 999999999999999.9 read `1,000,000,000,000,000` next to 1e15's `1e+15`.
    assert _number(999_999_999_999_999.5) == "1e+15" and _number(-999_999_999_999_999.9) == "-1e+15"
    assert _number(999_999_999_999_999.4) == "999,999,999,999,999"
    # A float32 Sum of token counts reads exactly, not as 1.311e+05 (4 digits of 131,072).
    out = io.StringIO()
    writers.ConsoleWriter(out).write_scalars(3, {"nonpadding_tokens": 131072.0, "loss": 0.5})
    assert out.getvalue() == "step 3\n  loss               0.5\n  nonpadding_tokens  131,072\n"
    out = io.StringIO()
    writers.ConsoleWriter(out).write_scalars(4, {"a": 999.96, "b": 1000.4, "c": -999.99})
    assert out.getvalue() == "step 4\n  a  1,000\n  b  1,000\n  c  -1,000\n"
    # A float that `.4g` rounds to a whole number keeps its zeros: 0.99996 read `1`, as an
    # exact 1 does (an accuracy just below 1 shown as a perfect one).
    out = io.StringIO()
    scalars = {"acc": 0.99996, "exact": 1.0, "neg": -9.9996, "pct": 99.996}
    writers.ConsoleWriter(out).write_scalars(5, scalars)
    assert out.getvalue() == "step 5\n  acc    1.000\n  exact  1\n  neg    -10.00\n  pct    100.0\n"
    assert _duration(59.4) == "59s" and _duration(3600) == "1h 00m"
    assert (_duration(65), _duration(725), _duration(11220)) == ("1m 05s", "12m 05s", "3h 07m")


def test_bad_input_and_closed_writer():
    for bad in (0, -5):
        with pytest.raises(ValueError, match="total_steps must be a positive int"):
            writers.ConsoleWriter(io.StringIO(), total_steps=bad)
    for bad in (2.5, True, "10"):
        with pytest.raises(TypeError, match="total_steps must be a positive int"):
            writers.ConsoleWriter(io.StringIO(), total_steps=bad)
    out = io.StringIO()
    w = writers.ConsoleWriter(out)
    with pytest.raises(TypeError, match="every key must be a str"):
        w.write_scalars(0, {None: 1.0})
    with pytest.raises(ValueError, match="non-negative"):
        w.write_scalars(-5, {"a": 1.0})
    w.write_scalars(0, {"a": 1.0})
    w.close()
    w.close()
    with pytest.raises(writers.WriterClosedError):
        w.write_scalars(1, {"a": 1.0})
    assert out.getvalue() == "step 0\n  a  1\n"
    assert not out.closed  # the stream belongs to the caller


@pytest.mark.parametrize("color", [False, True])  # True: through rich (`| less -R`)
def test_a_pipe_whose_reader_is_gone_ends_the_output_once(color):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (`train.py | head`) has exited
    stream = os.fdopen(write_end, "w", buffering=1)  # line-buffered: each block is written
    w = writers.ConsoleWriter(stream, color=color)
    try:
        with pytest.raises(BrokenPipeError, match=r"closed the pipe \(e\.g\. `\| head`\)"):
            w.write_scalars(0, {"a": 1.0})
        # Nobody can read what follows: later calls print nothing and raise nothing...
        w.write_scalars(1, {"a": 2.0})
        w.write_texts(1, {"note": "x"})
        w.flush()
        # ...and the descriptor points at /dev/null, so the interpreter's flush at exit
        # (of sys.stdout, in a real run) succeeds instead of ending the process with 120.
        assert os.readlink(f"/proc/self/fd/{stream.fileno()}") == os.devnull
        stream.write("more\n")
        stream.flush()
    finally:
        w.close()
        stream.close()


@pytest.mark.parametrize("stream", [io.StringIO, FakeTty])
def test_terminal_escapes_in_a_text_are_shown_not_run(stream):
    out = stream()
    w = writers.ConsoleWriter(out)
    w.write_texts(3, {"sample": "ok\x1b[2J\rgone\x07\tend\nnext"})
    text = out.getvalue()
    assert "\x1b[2J" not in text and "\r" not in text and "\x07" not in text
    assert "ok\\x1b[2J\\rgone\\x07" in text and "end" in text and "next" in text  # rich: tab


@pytest.mark.parametrize("stream", [io.StringIO, FakeTty])
def test_terminal_escapes_and_lone_surrogates_in_a_hyperparameter_are_shown_not_run(stream):
    # A config value (a run name from a file, a prompt) was printed raw: the terminal ran its
    # escapes, and a lone surrogate (a file name undecodable as UTF-8) reached the stream as is.
    class Config:
        def __str__(self):
            return "cfg\x1b[31m"

    out = stream()
    writers.ConsoleWriter(out).write_hparams(
        {"name": "run\x1b[2J\rgone", "file": "a\udce9b", "config": Config(), "lr": 0.1}
    )
    text = out.getvalue()
    assert "\x1b[2J" not in text and "\x1b[31m" not in text and "\r" not in text
    assert "run\\x1b[2J\\rgone" in text and "cfg\\x1b[31m" in text and "0.1" in text
    assert "a\\udce9b" in text and "\udce9" not in text
    text.encode()  # every character of it can be written to a UTF-8 stream


def test_nan_hparam_reads_as_a_nan_scalar_does():
    out = io.StringIO()
    w = writers.ConsoleWriter(out)
    w.write_hparams({"lr": float("nan"), "wd": np.float32("nan"), "eps": float("inf")})
    w.write_scalars(1, {"lr": float("nan")})
    # A jax bfloat16 (not a np.floating) and a 0-d array read `nan` here; "nan" text stays.
    nans = {"bf": jnp.array(jnp.nan, jnp.bfloat16), "arr": np.array(np.nan), "s": "nan"}
    w.write_hparams({**nans, "bf1": jnp.array(1.5, jnp.bfloat16)})
    assert out.getvalue() == (
        "hyperparameters\n  eps  inf\n  lr   NaN\n  wd   NaN\nstep 1\n  lr  NaN\n"
        "hyperparameters\n  arr  NaN\n  bf   NaN\n  bf1  1.5\n  s    nan\n"
    )


def test_a_narrow_float_hparam_reads_as_the_other_writers_write_it():
    # A bfloat16 0.1 (jax or NumPy) read `0.100098` (its str()) where JSONL, TensorBoard and
    # the trackers write 0.1, the shortest decimal of its dtype; a float8 0.1 read `0.101562`.
    import ml_dtypes

    hparams = {
        "bf": jnp.array(0.1, jnp.bfloat16),
        "np_bf": np.array(0.1, ml_dtypes.bfloat16),
        "f8": np.array(0.1, ml_dtypes.float8_e4m3fn),
        "f32": np.float32(1 / 3),
        "lr": 0.1,
        "n": 3,
    }
    out = io.StringIO()
    writers.ConsoleWriter(out).write_hparams(hparams)
    assert out.getvalue() == (
        "hyperparameters\n  bf     0.1\n  f32    0.33333334\n  f8     0.1\n  lr     0.1\n"
        "  n      3\n  np_bf  0.1\n"
    )


def test_a_list_of_numpy_numbers_reads_as_the_other_writers_write_it():
    # Printed as `[np.int64(64), np.int64(32)]` (NumPy 2's repr) where TensorBoard and JSONL
    # write `[64, 32]`.
    out = io.StringIO()
    writers.ConsoleWriter(out).write_hparams(
        {"layers": [np.int64(64), np.int64(32)], "betas": (np.float32(0.5), np.float64(0.999))}
    )
    assert out.getvalue() == "hyperparameters\n  betas   (0.5, 0.999)\n  layers  [64, 32]\n"


def test_closed_stdout_prints_nothing_as_print_does(monkeypatch):
    monkeypatch.setattr("sys.stdout", None)  # what Python sets for `train.py >&-`
    clock = FakeClock()
    w = writers.ConsoleWriter(collection="train", total_steps=10, clock=clock)
    w.write_scalars(1, {"loss": 0.5})  # raised AttributeError at every write and flush
    w.write_texts(1, {"note": "x"})
    w.write_hparams({"lr": 0.1})
    w.flush()
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)  # stdout is looked up at each write
    clock.now = 2.0
    w.write_scalars(2, {"loss": 0.25})
    w.close()
    assert out.getvalue() == "step 2/10 (20.0%) | 0.5 steps/s | ETA 16s | train\n  loss  0.25\n"


@pytest.mark.parametrize("color", [False, True])
def test_a_line_break_in_the_collection_is_shown_not_run(color):
    # `collection="a\nb"` put a raw line break (and a terminal escape, run) in every header.
    out = io.StringIO()
    writers.ConsoleWriter(out, collection="a\nb\x1b[2J", color=color).write_scalars(1, {"x": 1})
    text = out.getvalue()
    if color:
        text = text.replace("\x1b[1m", "").replace("\x1b[36m", "").replace("\x1b[0m", "")
    assert text == "step 1 | a\\nb\\x1b[2J\n  x  1\n"


@pytest.mark.parametrize("color", [False, True])
def test_blank_lines_of_a_text_have_no_trailing_spaces(color):
    out = io.StringIO()
    w = writers.ConsoleWriter(out, color=color)
    w.write_texts(1, {"config": "a = 1\n\n# b\nb = 2"})  # as the gin config's blank lines
    text = out.getvalue()
    if color:
        text = text.replace("\x1b[1m", "").replace("\x1b[36m", "").replace("\x1b[0m", "")
    assert text == "step 1\n  config  a = 1\n\n          # b\n          b = 2\n"


@pytest.mark.parametrize("color", [False, True])
def test_an_empty_value_has_no_trailing_spaces(color):
    # `write_texts(1, {"e": ""})` wrote "  e  " (and "  e        " beside a longer key).
    out = io.StringIO()
    w = writers.ConsoleWriter(out, color=color)
    w.write_texts(1, {"e": "", "longkey": "v", "n": "\nx"})
    w.write_hparams({"h": ""})
    text = out.getvalue()
    if color:
        text = text.replace("\x1b[1m", "").replace("\x1b[36m", "").replace("\x1b[0m", "")
    assert text == "step 1\n  e\n  longkey  v\n  n\n           x\nhyperparameters\n  h\n"


@pytest.mark.parametrize("color", [False, True])
def test_a_stream_that_is_not_utf8_gets_escapes_not_an_error(tmp_path, color):
    # PYTHONIOENCODING=ascii or a latin-1 locale: each write with a non-ASCII key or text
    # raised UnicodeEncodeError, a writer failure every time.
    path = tmp_path / "out.txt"
    with open(path, "w", encoding="ascii") as stream:
        w = writers.ConsoleWriter(stream, color=color)
        w.write_scalars(1, {"café": 1.5})
        w.write_texts(1, {"note": "日本 ok"})
        w.close()
    text = path.read_text(encoding="ascii")
    assert "caf\\xe9" in text and "1.5" in text
    assert "\\u65e5\\u672c ok" in text


@pytest.mark.parametrize("color", [False, True])
def test_keys_escaped_for_a_stream_that_is_not_utf8_stay_aligned(tmp_path, color):
    # Padded by their width before escaping: `caf\xe9` (7 columns) was padded as `café` (4),
    # so its value stood 3 columns right of the others.
    path = tmp_path / "out.txt"
    with open(path, "w", encoding="ascii") as stream:
        w = writers.ConsoleWriter(stream, color=color)
        w.write_scalars(1, {"café": 1.5, "loss": 0.5, "日本": 2.0})
        w.write_texts(1, {"café": "a\nb", "n": "c"})
        w.close()
    text = path.read_text(encoding="ascii")
    for code in ("\x1b[1m", "\x1b[36m", "\x1b[0m"):
        text = text.replace(code, "")
    assert text.splitlines() == [
        "step 1",
        "  caf\\xe9       1.5",
        "  loss          0.5",
        "  \\u65e5\\u672c  2",
        "step 1",
        "  caf\\xe9  a",
        "           b",
        "  n        c",
    ]


def test_a_text_ending_in_a_line_break_opens_no_blank_line_in_the_block():
    # "hello\n" printed "  a  hello", then an empty line, then "  b  world": the block looked
    # like two, and the config text of the demo ended in one too.
    out = io.StringIO()
    w = writers.ConsoleWriter(out, color=False)
    w.write_texts(1, {"a": "hello\n", "b": "world\r\n", "c": "x\n\n"})
    assert out.getvalue() == "step 1\n  a  hello\n  b  world\n  c  x\n\n"


def test_windows_line_breaks_in_a_text_are_line_breaks():
    out = io.StringIO()
    writers.ConsoleWriter(out, color=False).write_texts(3, {"t": "a\r\nb\rc"})
    assert out.getvalue().splitlines()[1:] == ["  t  a", "     b\\rc"]
