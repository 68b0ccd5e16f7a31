"""`python -m writers.plot`: series read back equal the logs, PNG size, terminal plot, --follow.

The demo's output (the short run of `python -m examples.demo` that conftest.py's
`demo_run` shares with tests/test_demo.py) is plotted and the plotted series are compared with `metrics.jsonl` read by
`json.loads` and the event files read by TensorBoard's own `EventAccumulator`.
"""

from __future__ import annotations

import json
import math
import os
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

import writers
from writers import plot
from writers.plot import _parse, _read_events, _step_ticks, load_series, plot_runs, smooth

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def demo_dir(demo_run: tuple[str, str]) -> str:
    """The model dir of the short demo run (train and eval/synthetic runs under it)."""
    return demo_run[0]


def _jsonl_series(path: str, key: str) -> tuple[list[int], list[float]]:
    with open(path) as f:
        lines = [json.loads(line) for line in f]
    points = [(line["step"], float(line[key])) for line in lines if key in line]
    return [s for s, _ in points], [v for _, v in points]


def _png_size(path: str) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", head
    return struct.unpack(">II", head[16:24])


def _plot(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "writers.plot", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _write_jsonl(path: str, lines: list[dict]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write("".join(json.dumps(line) + "\n" for line in lines))


# --- smoothing -------------------------------------------------------------------------


def test_smoothing_is_tensorboards_debiased_ema_and_skips_nan():
    # w = 0.5: last = 0.5, 1.25, (NaN skipped), 2.625; debiased by 1 - 0.5**n, n = 1, 2, 3.
    out = smooth([1.0, 2.0, math.nan, 4.0], 0.5)
    assert out[0] == 0.5 / 0.5
    assert out[1] == pytest.approx(1.25 / 0.75)
    assert math.isnan(out[2])
    assert out[3] == pytest.approx(2.625 / 0.875)
    assert smooth([3.0, 3.0, 3.0], 0.9).tolist() == [3.0, 3.0, 3.0]  # constant: unchanged
    assert smooth([1.0, 5.0], 0.0).tolist() == [1.0, 5.0]


def test_step_ticks_are_whole_steps_on_a_short_run(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    drawn: list[Figure] = []
    save = Figure.savefig
    monkeypatch.setattr(
        Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), save(fig, *a, **k))
    )
    run = str(tmp_path / "run")
    _write_jsonl(
        os.path.join(run, "metrics.jsonl"), [{"step": s, "loss": 1 / s} for s in range(1, 21)]
    )
    plot_runs([run], ["loss"], out=str(tmp_path / "p.png"))
    [figure] = drawn
    ticks = figure.axes[0].get_xticks()
    assert len(ticks) >= 3 and all(t == int(t) for t in ticks), ticks  # not 1.5, 2.5, ...


def test_terminal_step_ticks_are_round_whole_steps(tmp_path):
    run = str(tmp_path / "run")
    lines = [{"step": s, "loss": 1 / s} for s in range(1, 21)]
    _write_jsonl(os.path.join(run, "metrics.jsonl"), lines)
    text = plot_runs([run], ["loss"], out=None, terminal=True, cols=80, rows=16).text
    assert text.rstrip().splitlines()[-1].split() == ["5", "10", "15", "20"]  # not 4.2, 7.3


def test_terminal_legend_sits_in_the_corner_the_lines_leave_empty(tmp_path):
    # plotext puts the legend top left, which hid the first third of a falling loss curve.
    run = str(tmp_path / "e" / "run")  # labelled "e/run:<key>"
    lines = [{"step": s, "loss": 4.0 / s, "accuracy": 1 - 1 / s} for s in range(1, 101)]
    _write_jsonl(os.path.join(run, "metrics.jsonl"), lines)
    for key, top in (("loss", False), ("accuracy", True)):  # falls: bottom free; rises: top
        text = plot_runs([run], [key], out=None, terminal=True, cols=80, rows=20).text
        rows = text.splitlines()
        canvas = [i for i, row in enumerate(rows) if "┤" in row or row.lstrip().startswith("│")]
        [label] = [i for i, row in enumerate(rows) if f"e/run:{key}" in row]
        assert rows[label].index(f"e/run:{key}") > 40  # the right half
        middle = (canvas[0] + canvas[-1]) / 2
        assert (label > middle) == top, text  # opposite the line's start: top left or bottom left
        first = canvas[0] if key == "loss" else canvas[-1]  # the line's first point, uncovered
        assert rows[first].split("┤" if "┤" in rows[first] else "│", 1)[1][:2].strip(), text


@pytest.mark.parametrize(
    "low, high, most, ticks",
    [
        (1, 20, 6, [5, 10, 15, 20]),
        (0, 100_000, 8, [0, 20_000, 40_000, 60_000, 80_000, 100_000]),
        (100, 137, 6, [100, 110, 120, 130]),
        (1, 3, 6, [1, 2, 3]),  # never a step below 1
        (7, 7, 6, [7]),
        (1, 8, 2, [1, 8]),  # a narrow terminal: no multiple of 10 between, so the ends
    ],
)
def test_step_ticks(low, high, most, ticks):
    assert _step_ticks(low, high, most) == ticks


# --- the demo's output ------------------------------------------------------------------


def test_series_equal_the_jsonl_and_png_has_the_asked_size(demo_dir, tmp_path):
    png = str(tmp_path / "plot.png")
    data = plot_runs([demo_dir], ["loss", "accuracy"], out=png, width=640, height=480, dpi=80)
    assert _png_size(png) == (640, 480)
    assert data.png == png and data.keys == ["loss", "accuracy"]
    by_label = {s.label: s for s in data.series}
    assert sorted(by_label) == [
        "demo/eval/synthetic:accuracy",
        "demo/eval/synthetic:loss",
        "demo/train:accuracy",
        "demo/train:loss",
    ]
    for run, sub in (("demo/train", "train"), ("demo/eval/synthetic", "eval/synthetic")):
        for key in ("loss", "accuracy"):
            steps, values = _jsonl_series(os.path.join(demo_dir, sub, "metrics.jsonl"), key)
            series = by_label[f"{run}:{key}"]
            assert series.steps.tolist() == steps
            assert series.values.tolist() == values
            np.testing.assert_allclose(series.smoothed, smooth(values, 0.6))
    assert by_label["demo/train:loss"].steps.tolist() == [15, 30, 45, 60]  # test_demo.py's run
    assert by_label["demo/eval/synthetic:loss"].steps.tolist() == [30, 60]


def test_event_reader_agrees_with_tensorboards_reader(demo_dir):
    train = os.path.join(demo_dir, "train")
    (path,) = [os.path.join(train, n) for n in os.listdir(train) if n.startswith("events.")]
    ours: dict[str, list[tuple[int, float]]] = {}
    for _, step, tag, value in _read_events(path):
        ours.setdefault(tag, []).append((step, value))
    acc = event_accumulator.EventAccumulator(train)
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "loss" in tags and set(ours) == set(tags)
    for tag in tags:
        assert ours[tag] == [(e.step, e.value) for e in acc.Scalars(tag)], tag
    # The same values as the JSONL, to float32 precision (simple_value is a float).
    steps, values = _jsonl_series(os.path.join(train, "metrics.jsonl"), "loss")
    assert [s for s, _ in ours["loss"]] == steps
    np.testing.assert_allclose([v for _, v in ours["loss"]], values, rtol=1e-6)


def test_cli_writes_png_and_dumps_the_series(demo_dir, tmp_path):
    png, dump = str(tmp_path / "cli.png"), str(tmp_path / "series.json")
    result = _plot(demo_dir, "--keys", "loss", "--out", png, "--dump_series", dump,
                   "--width", "300", "--height", "200", "--smoothing", "0")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"wrote {png} (2 series of loss)" in result.stdout
    assert _png_size(png) == (300, 200)
    with open(dump) as f:
        series = {s["label"]: s for s in json.load(f)["series"]}
    steps, values = _jsonl_series(os.path.join(demo_dir, "train", "metrics.jsonl"), "loss")
    assert series["demo/train:loss"]["steps"] == steps
    assert series["demo/train:loss"]["values"] == values == series["demo/train:loss"]["smoothed"]


def test_series_dumped_to_dev_stdout_go_down_the_pipe(tmp_path):
    # --dump_series /dev/stdout into a pipe failed (FileNotFoundError: a temporary file beside
    # /proc/<pid>/fd/pipe:[N]); as root it had replaced the /dev/stdout link itself.
    run = str(tmp_path / "run")
    _write_jsonl(os.path.join(run, "metrics.jsonl"), [{"step": 1, "loss": 2.0}])
    result = _plot(run, "--keys", "loss", "--out", str(tmp_path / "p.png"),
                   "--dump_series", "/dev/stdout", "--smoothing", "0")  # fmt: skip
    assert result.returncode == 0, result.stderr
    dumped, wrote = result.stdout.rstrip("\n").split("\n")
    assert [(s["steps"], s["values"]) for s in json.loads(dumped)["series"]] == [([1], [2.0])]
    assert wrote.startswith("wrote ") and os.path.islink("/dev/stdout")


def test_terminal_mode_prints_a_plot_of_each_key(demo_dir):
    result = _plot(os.path.join(demo_dir, "train"), "--terminal", "--cols", "90", "--rows", "30")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "\x1b[" not in result.stdout  # no colors when stdout is not a terminal
    assert [line.strip() for line in lines if line.strip() in ("loss", "accuracy")] == [
        "loss",
        "accuracy",
    ]
    assert sum("┤" in line for line in lines) >= 4  # y ticks of both panels
    assert sum(line.lstrip().startswith("└") for line in lines) == 2  # two x axes
    assert max(len(line) for line in lines) <= 90
    assert not os.path.exists(os.path.join(REPO, "plot.png"))  # --terminal alone: no PNG


@pytest.mark.parametrize("no_color, colored", [("", True), ("1", False)])
def test_terminal_plot_on_a_tty_is_colored_unless_no_color_is_set(
    tmp_path, monkeypatch, capsys, no_color, colored
):
    # NO_COLOR=1 on a terminal still printed ANSI colours; the console writer leaves them out.
    run = str(tmp_path / "run")
    _write_jsonl(os.path.join(run, "metrics.jsonl"), [{"step": s, "loss": 1.0 / s} for s in (1, 2)])
    monkeypatch.setenv("NO_COLOR", no_color)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert writers.plot.main([run, "--terminal", "--cols", "60", "--rows", "12"]) == 0
    out = capsys.readouterr().out
    assert ("\x1b[" in out) is colored
    assert "loss" in out.splitlines()[0]


def test_terminal_mode_prints_as_many_lines_as_rows(tmp_path):
    # --rows 24 printed 25 lines: the plot's 24, each ending in a newline, then a blank one.
    run = str(tmp_path / "run")
    _write_jsonl(os.path.join(run, "metrics.jsonl"), [{"step": s, "loss": 1.0 / s} for s in (1, 2)])
    result = _plot(run, "--terminal", "--keys", "loss", "--cols", "80", "--rows", "24")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 24 and result.stdout.endswith("\n")
    assert result.stdout.splitlines()[-1].strip()  # the x axis' tick labels, not a blank line


# --- reading ---------------------------------------------------------------------------


def test_jsonl_reading_keeps_last_value_per_step_and_skips_partial_lines(tmp_path):
    path = str(tmp_path / "exp" / "train" / "metrics.jsonl")
    _write_jsonl(path, [
        {"step": None, "time": 0.0, "collection": "train", "hparams": {"lr": 0.1}},
        {"step": 0, "time": 0.0, "collection": "train", "config": "text", "flag": True},
        {"step": 1, "time": 0.0, "collection": "train", "loss": 4.0, "acc": 0},
        {"step": 2, "time": 0.0, "collection": "train", "loss": "NaN", "acc": 0.5},
        {"step": 2, "time": 0.0, "collection": "train", "loss": 2.0},  # resumed: repeats 2
        {"step": 3, "time": 0.0, "collection": "train", "loss": "Infinity"},
    ])  # fmt: skip
    with open(path, "a") as f:
        f.write("\n" + '{"step": 4, "time": 0.0, "collection": "train", "loss": 1.')  # torn
    keys, series = load_series([str(tmp_path / "exp")], smoothing=0.0)
    assert keys == ["loss"]  # the default: loss and accuracy, those present
    (loss,) = series
    assert loss.run == "exp/train"
    assert loss.steps.tolist() == [1, 2, 3]
    assert loss.values.tolist() == [4.0, 2.0, math.inf]
    keys, series = load_series([str(tmp_path / "exp" / "train")], ["acc"], smoothing=0.0)
    assert [(s.run, s.steps.tolist(), s.values.tolist()) for s in series] == [
        ("exp/train", [1, 2], [0.0, 0.5])
    ]


def test_default_keys_without_loss_are_the_first_few(tmp_path):
    _write_jsonl(str(tmp_path / "r" / "metrics.jsonl"), [
        {"step": 1, "time": 0.0, "collection": None, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5},
    ])  # fmt: skip
    keys, _ = load_series([str(tmp_path / "r")])
    assert keys == ["a", "b", "c", "d"]


def test_runs_of_several_experiments_are_labelled_apart(tmp_path):
    for exp in ("a", "b"):
        _write_jsonl(str(tmp_path / exp / "train" / "metrics.jsonl"),
                     [{"step": 1, "time": 0.0, "collection": "train", "loss": 1.0}])  # fmt: skip
    _, series = load_series([str(tmp_path / "a"), str(tmp_path / "b")])
    assert [s.label for s in series] == ["a/train:loss", "b/train:loss"]
    # Two experiments of the same name: the labels fall back to the paths.
    for parent in ("x", "y"):
        _write_jsonl(str(tmp_path / parent / "exp" / "train" / "metrics.jsonl"),
                     [{"step": 1, "time": 0.0, "collection": "train", "loss": 1.0}])  # fmt: skip
    _, series = load_series([str(tmp_path / "x" / "exp"), str(tmp_path / "y" / "exp")])
    assert [s.run for s in series] == [
        os.path.relpath(tmp_path / "x" / "exp" / "train"),
        os.path.relpath(tmp_path / "y" / "exp" / "train"),
    ]


def test_a_run_given_twice_a_key_given_twice_and_no_keys(tmp_path):
    # A run and its parent both given plotted that run twice; --keys loss,loss drew the same
    # panel twice; keys=[] raised matplotlib's "Number of rows must be a positive integer".
    _write_jsonl(str(tmp_path / "exp" / "train" / "metrics.jsonl"),
                 [{"step": 1, "time": 0.0, "collection": "train", "loss": 1.0, "acc": 0.5}])  # fmt: skip
    run, exp = str(tmp_path / "exp" / "train"), str(tmp_path / "exp")
    for paths in ([exp, run], [run, exp], [run, run]):
        keys, series = load_series(paths, ["loss", "acc", "loss"])
        assert keys == ["loss", "acc"]
        assert [(s.key, s.values.tolist()) for s in series] == [("loss", [1.0]), ("acc", [0.5])]
    with pytest.raises(ValueError, match=r"^writers.plot: no keys given; pass None for the "):
        load_series([run], [])


def test_event_files_are_read_when_there_is_no_jsonl_and_truncation_is_tolerated(tmp_path, caplog):
    logdir = str(tmp_path / "tb" / "train")
    w = writers.TensorBoardWriter(logdir)
    for step in (1, 2, 3):
        w.write_scalars(step, {"loss": 1.0 / step, "nan": math.nan})
    w.write_texts(3, {"note": "text is not a scalar"})
    w.close()
    keys, series = load_series([str(tmp_path / "tb")], ["loss", "nan"], smoothing=0.0)
    loss, nan = series
    assert loss.run == "tb/train" and loss.steps.tolist() == [1, 2, 3]
    np.testing.assert_allclose(loss.values, [1.0, 0.5, 1 / 3], rtol=1e-7)
    assert np.isnan(nan.values).all()
    # A record still being written (cut short) is left for the next read.
    with open(w.path, "rb") as f:
        data = f.read()
    with open(w.path, "wb") as f:
        f.write(data[:-10])
    _, (loss,) = load_series([logdir], ["loss"])
    assert loss.steps.tolist() == [1, 2, 3]  # only the text event was cut
    # A corrupt record (a flipped byte) ends the file there, as in TensorBoard's reader.
    third = data.rindex(b"loss")  # in the last scalar event, step 3
    with open(w.path, "wb") as f:
        f.write(data[:third] + b"lost" + data[third + 4 :])
    with caplog.at_level("WARNING"):
        _, (loss,) = load_series([logdir], ["loss"])
    assert loss.steps.tolist() == [1, 2]
    assert "fails its CRC check" in caplog.text and os.path.basename(w.path) in caplog.text


def test_events_a_resumed_writer_purged_are_dropped_as_tensorboard_drops_them(tmp_path):
    # MetricsManager(resume_step=50) gives TensorBoard purge_step=51: the new event file
    # restarts at 51, and TensorBoard's reader drops the first run's steps from 51 on.
    logdir = str(tmp_path / "tb")
    for purge, steps, value in ((None, range(0, 101, 10), 1.0), (51, range(60, 81, 10), 2.0)):
        w = writers.TensorBoardWriter(logdir, purge_step=purge)
        for step in steps:
            w.write_scalars(step, {"loss": value})
        w.close()
        time.sleep(0.01)  # event file names hold the time: a second, later file
    _, (loss,) = load_series([logdir], ["loss"], smoothing=0.0)
    accumulator = event_accumulator.EventAccumulator(logdir)
    accumulator.Reload()
    expected = [(e.step, e.value) for e in accumulator.Scalars("loss")]
    assert list(zip(loss.steps.tolist(), loss.values.tolist(), strict=True)) == expected
    assert loss.steps.tolist() == [0, 10, 20, 30, 40, 50, 60, 70, 80]


def test_a_url_run_copied_down_is_plotted_from_its_parts(tmp_path):
    """`gsutil cp -r gs://b/exp .`: with no metrics.jsonl, only its .d/ parts, the run was
    "not found" (or, beside event files, plotted from them); beside the URL's object, the
    object's steps alone."""
    run = tmp_path / "exp" / "train"
    with writers.JsonlWriter(f"file://{run}", flush_secs=1e9) as w:  # the URL's parts
        for step in (2, 3):
            w.write_scalars(step, {"loss": 1.0 / step})
            w.flush()
    _, (loss,) = load_series([str(tmp_path / "exp")], ["loss"], smoothing=0.0)
    assert (loss.run, loss.steps.tolist(), loss.values.tolist()) == (
        "exp/train",
        [2, 3],
        [0.5, 1 / 3],
    )
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 4.0}\n')  # an object at the URL
    _, (loss,) = load_series([str(run)], ["loss"], smoothing=0.0)
    assert (loss.steps.tolist(), loss.values.tolist()) == ([1, 2, 3], [4.0, 0.5, 1 / 3])


def test_hand_written_jsonl_is_read_as_leniently_as_a_torn_one(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_bytes(
        b"\xef\xbb\xbf"  # a byte order mark, from an editor
        + b'{"step": 1, "loss": 4.0}\n'
        + b'{"step": 2.0, "loss": 2.0, "tokens": 1e999, "n": 1'
        + b"0" * 400
        + b"}\n"
        + b"null\n[1, 2]\n\xff\xfe not UTF-8\n"  # JSON but no object, and no UTF-8
        + b'{"step": 1e20, "loss": 0.5}\n{"step": 99999999999999999999999, "loss": 0.5}\n'
        + b'{"step": -1, "loss": 0.5}\n'  # steps int64 cannot hold (an OverflowError before)
        + b'{"step": 3, "loss": 1.0}'  # written with "\n".join: no newline after the last
    )
    _, (loss,) = load_series([str(path.parent)], ["loss"], smoothing=0.0)
    assert (loss.steps.tolist(), loss.values.tolist()) == ([1, 2, 3], [4.0, 2.0, 1.0])
    assert plot_runs(str(path.parent), "loss", smoothing=0.0).keys == ["loss"]  # one path, key


def test_a_point_with_no_finite_neighbour_is_drawn_as_a_marker(tmp_path, monkeypatch):
    # A line of one point draws nothing: the first eval, timing/compilation_seconds.
    from matplotlib.figure import Figure

    drawn: list[Figure] = []
    save = Figure.savefig
    monkeypatch.setattr(
        Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), save(fig, *a, **k))
    )
    values = [{"step": 5, "loss": 0.7, "acc": 0.5}]
    values += [{"step": s, "acc": v} for s, v in ((6, "NaN"), (7, 0.6), (8, "NaN"), (9, 0.8))]
    _write_jsonl(str(tmp_path / "run" / "metrics.jsonl"), values)
    plot_runs([str(tmp_path / "run")], ["loss", "acc"], out=str(tmp_path / "p.png"))
    [figure] = drawn
    markers = [
        (line.get_alpha(), line.get_xydata().tolist())
        for ax in figure.axes
        for line in ax.get_lines()
        if line.get_marker() == "o"
    ]
    isolated = [[5.0, 0.5], [7.0, pytest.approx(0.5625)], [9.0, pytest.approx(0.536 / 0.784)]]
    assert markers == [  # raw values faint (their isolated points were not drawn), then smoothed
        (0.25, [[5.0, 0.7]]),
        (1.0, [[5.0, 0.7]]),
        (0.25, [[5.0, 0.5], [7.0, 0.6], [9.0, 0.8]]),
        (1.0, isolated),  # smoothed (0.6): NaN between, so alone
    ]


def test_a_terminal_line_leaves_a_gap_at_nan_and_inf():
    # The terminal joined the finite points across NaN and inf; the PNG leaves a gap there.
    steps = np.array([10, 20, 30, 40, 50, 60, 70, 80])
    values = np.array([1.0, np.nan, 2.0, 3.0, np.inf, -np.inf, 4.0, 5.0])
    x, y, joined = plot._finite_points(steps, values)
    assert x.tolist() == [10, 30, 40, 70, 80]
    assert y.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert joined.tolist() == [False, False, True, False, True]  # 30 and 70 start anew
    x, y, joined = plot._finite_points(steps[:3], np.array([np.nan, np.nan, 7.0]))
    assert (x.tolist(), y.tolist(), joined.tolist()) == ([30], [7.0], [False])


def test_a_single_point_in_the_terminal_is_not_hidden_by_the_legend(tmp_path):
    # plotext draws one point mid-panel (its axis widened by 1 each side); the legend was
    # anchored at the point itself, as if it sat in a corner, and covered it.
    _write_jsonl(str(tmp_path / "e" / "run" / "metrics.jsonl"), [{"step": 100, "eval_loss": 2.5}])
    text = plot_runs([str(tmp_path / "e")], ["eval_loss"], terminal=True, cols=80, rows=16).text
    assert "e/run:eval_loss" not in text.splitlines()[0]  # a legend box, not in the title
    glyphs = [
        (row, col)
        for row, line in enumerate(text.splitlines())
        for col, c in enumerate(line)
        if c in "▖▗▘▙▚▛▜▝▞▟▀▄▌▐█"
    ]
    (legend,) = [(r, c) for r, c in glyphs if "run:eval_loss" in text.splitlines()[r][c:]]
    (point,) = set(glyphs) - {legend}  # hidden under the legend's frame before
    assert 30 < point[1] < 50  # mid-panel


def test_a_small_terminal_panel_names_its_runs_in_the_title_with_their_glyphs(tmp_path):
    # At 80 x 24, two panels of two runs: plotext's legend box covered a panel's whole height.
    for run, offset in (("train", 1.0), ("eval", 1.5)):
        lines = [{"step": s, "loss": 4.0 / s + offset} for s in range(1, 101)]
        _write_jsonl(str(tmp_path / "exp" / run / "metrics.jsonl"), lines)
    text = plot_runs([str(tmp_path / "exp")], ["loss"], terminal=True, cols=80, rows=11).text
    title, *rows = text.splitlines()
    assert title.strip() == "loss: • exp/eval:loss, x exp/train:loss"
    assert not any("exp/" in row for row in rows)  # no legend box over the lines
    assert any("•" in row for row in rows) and any("x" in row for row in rows)


def test_nine_runs_in_a_terminal_panel_get_nine_different_glyphs(tmp_path):
    # The 9th run was drawn with the 1st run's glyph: without colours the two read as one.
    for i in range(9):
        lines = [{"step": s, "loss": 4.0 / s + i} for s in (1, 2)]
        _write_jsonl(str(tmp_path / "e" / f"r{i}" / "metrics.jsonl"), lines)
    text = plot_runs([str(tmp_path / "e")], ["loss"], terminal=True, cols=200, rows=11).text
    title = text.splitlines()[0].strip()
    glyphs = [name.split(" ")[0] for name in title.removeprefix("loss: ").split(", ")]
    assert glyphs == ["•", "x", "o", "+", "*", "#", "%", "@", "A"]


def test_a_terminal_title_wider_than_the_plot_is_cut_not_dropped(tmp_path):
    # Runs named in the title (their legend would cover the panel) made it 71 characters in
    # 60 columns: plotext drew no title at all, neither the key nor which glyph is which run.
    for run in ("a-long-experiment-name", "b-long-experiment-name"):
        lines = [{"step": s, "loss": 1.0 / s} for s in range(1, 11)]
        _write_jsonl(str(tmp_path / run / "train" / "metrics.jsonl"), lines)
    paths = [str(tmp_path / "a-long-experiment-name"), str(tmp_path / "b-long-experiment-name")]
    text = plot_runs(paths, ["loss"], terminal=True, cols=60, rows=16).text
    title = text.splitlines()[0]
    assert title.strip() == "loss: • a-long-experiment-name/train:loss, x b-long-experim…"
    assert len(title) == 60


def test_a_terminal_title_of_a_key_with_no_finite_values_is_cut_not_dropped(tmp_path):
    # "<key>: no finite values" wider than the plot was not cut: plotext drew the panel blank.
    key = "eval/" + "a_very_long_metric_name_" * 3
    lines = [{"step": s, key: float("nan"), "loss": 1.0} for s in range(1, 5)]
    _write_jsonl(str(tmp_path / "run" / "train" / "metrics.jsonl"), lines)
    text = plot_runs([str(tmp_path / "run")], [key], terminal=True, cols=60, rows=16).text
    assert text.splitlines()[0].strip() == f"{key}: no finite values"[:59] + "…"


# --- errors ----------------------------------------------------------------------------


def test_out_names_the_format_and_a_path_it_cannot_write_exits_2_naming_it(tmp_path):
    run = str(tmp_path / "run")
    _write_jsonl(os.path.join(run, "metrics.jsonl"), [{"step": 1, "loss": 1.0}])
    plot_runs([run], out=str(tmp_path / "plot.svg"))
    assert (tmp_path / "plot.svg").read_text().lstrip().startswith("<?xml")  # not PNG bytes
    plot_runs([run], out=str(tmp_path / "plot.jpg"))  # the README named PNG, SVG, PDF alone
    assert (tmp_path / "plot.jpg").read_bytes()[:3] == b"\xff\xd8\xff"  # a JPEG
    for follow in ((), ("--follow",)):  # --follow polled forever, printing the error once
        result = _plot(run, "--out", str(tmp_path / "plot.txt"), *follow)
        assert result.returncode == 2
        assert "name the file plot.png, plot.svg or plot.pdf" in result.stderr
    (tmp_path / "taken").mkdir()
    result = _plot(run, "--out", str(tmp_path / "taken"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "taken" in result.stderr


def test_errors_say_where_it_looked_and_what_is_available(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as error:
        load_series([str(tmp_path / "empty"), str(tmp_path / "missing")])
    message = str(error.value)
    assert (
        f"no metrics.jsonl and no events.out.tfevents.* files in {str(tmp_path / 'empty')!r}"
        in message
    )
    assert f"{str(tmp_path / 'missing')!r} is not a directory" in message
    _write_jsonl(str(tmp_path / "r" / "metrics.jsonl"),
                 [{"step": 1, "time": 0.0, "collection": None, "loss": 1.0, "acc": 0.5}])  # fmt: skip
    with pytest.raises(ValueError, match=r"key\(s\) \['nope'\]; available: \['acc', 'loss'\]"):
        load_series([str(tmp_path / "r")], ["loss", "nope"])
    with pytest.raises(ValueError, match=r"smoothing must be in \[0, 1\)"):
        load_series([str(tmp_path / "r")], smoothing=1.0)
    # A str compared with 0 ("'<=' not supported"); 1.0 divided by zero in smooth().
    with pytest.raises(TypeError, match=r"smoothing must be a number in \[0, 1\), got '0.5'"):
        load_series([str(tmp_path / "r")], smoothing="0.5")
    with pytest.raises(ValueError, match=r"smoothing must be in \[0, 1\).*got 1.0"):
        smooth([1.0, 2.0], 1.0)
    result = _plot(str(tmp_path / "r"), "--keys", "nope", "--terminal")
    assert result.returncode == 2 and "available: ['acc', 'loss']" in result.stderr
    result = _plot(str(tmp_path / "r"), "--follow", "--smoothing", "1", "--width", "0")
    assert result.returncode == 2  # checked before --follow starts waiting
    assert "--smoothing must be in [0, 1) (TensorBoard's slider), got 1.0" in result.stderr
    assert "--width must be a positive integer, got 0" in result.stderr
    result = _plot("gs://b/exp", "--follow", timeout=30)  # waited: "not a directory" yet
    assert result.returncode == 2 and "run_dir 'gs://b/exp' is a URL" in result.stderr
    assert "copy the run down first (gsutil cp -r, aws s3 cp --recursive)" in result.stderr


def test_a_file_url_run_dir_is_told_its_path_not_a_copy_to_make(tmp_path, capsys):
    # A file:// summary_dir's run is local: "copy the run down first (gsutil cp -r, ...)".
    with pytest.raises(SystemExit) as exit_:
        _parse([f"file://{tmp_path}/run"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert f"run_dir 'file://{tmp_path}/run' is a URL" in err
    assert f"pass its path, '{tmp_path}/run'; its metrics.jsonl.d/ is read" in err
    assert "gsutil" not in err


def test_a_url_run_dir_from_python_is_told_to_copy_the_run_down():
    # The command line said so; plot_runs and load_series said "'gs://b/exp' is not a
    # directory", as for a mistyped local path.
    with pytest.raises(FileNotFoundError) as info:
        load_series(["gs://b/exp"])
    assert (
        "run_dir 'gs://b/exp' is a URL, and plots are drawn from local files: copy the run "
        "down first (gsutil cp -r, aws s3 cp --recursive); its metrics.jsonl.d/ is read"
    ) in str(info.value)
    assert "not a directory" not in str(info.value)


def test_keys_with_spaces_after_the_commas_are_the_keys(tmp_path, capsys):
    """`--keys "loss, acc"` looked for a key ' acc' and was refused."""
    run = str(tmp_path / "r")
    _write_jsonl(os.path.join(run, "metrics.jsonl"), [{"step": 1, "loss": 2.0, "acc": 0.5}])
    dump = str(tmp_path / "series.json")
    args = [run, "--keys", "loss, acc ", "--terminal", "--cols", "40", "--rows", "30"]
    assert writers.plot.main([*args, "--dump_series", dump]) == 0
    with open(dump) as f:
        data = json.load(f)
    assert data["keys"] == ["loss", "acc"]
    assert [(s["key"], s["values"]) for s in data["series"]] == [("loss", [2.0]), ("acc", [0.5])]


def test_an_out_naming_a_directory_is_refused_before_anything_is_read(tmp_path):
    """`--out realdir` failed after reading every log, naming an internal temporary file;
    `--out newdir/` made the directory, then failed the same way."""
    run = str(tmp_path / "run")
    _write_jsonl(os.path.join(run, "metrics.jsonl"), [{"step": 1, "loss": 1.0}])
    (tmp_path / "realdir").mkdir()
    for out in (str(tmp_path / "realdir"), str(tmp_path / "newdir") + "/"):
        result = _plot(run, "--out", out)
        assert result.returncode == 2 and ".tmp" not in result.stderr
        assert f"cannot write {out!r}: it names a directory" in result.stderr
    assert not (tmp_path / "newdir").exists()
    with pytest.raises(ValueError, match="it names a directory"):
        plot_runs([run], out=str(tmp_path / "realdir"))


def test_a_dump_series_naming_a_directory_is_refused_before_anything_is_written(tmp_path, capsys):
    """`--dump_series realdir` wrote the PNG, then failed with "[Errno 21] Is a directory",
    naming neither the flag nor the fix."""
    run = str(tmp_path / "run")
    _write_jsonl(os.path.join(run, "metrics.jsonl"), [{"step": 1, "loss": 1.0}])
    png = tmp_path / "p.png"
    for dump in (str(tmp_path), str(tmp_path / "newdir") + "/"):
        with pytest.raises(SystemExit) as exited:
            writers.plot.main([run, "--out", str(png), "--dump_series", dump])
        assert exited.value.code == 2
        fix = repr(os.path.join(dump, "series.json"))
        assert f"--dump_series {dump!r} names a directory; name the file in it, e.g. {fix}" in (
            capsys.readouterr().err
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_url_with_one_slash_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """`--out gs:/b/p.png` (or `--dump_series`) wrote ./gs:/b/p.png, leaving the bucket empty."""
    run = str(tmp_path / "run")
    _write_jsonl(os.path.join(run, "metrics.jsonl"), [{"step": 1, "loss": 1.0}])
    monkeypatch.chdir(tmp_path)
    for args, flag, url in [
        ([run, "--out", "gs:/b/p.png"], "--out", "gs://b/p.png"),
        ([run, "--terminal", "--dump_series", "s3:/b/s.json"], "--dump_series", "s3://b/s.json"),
        (["gs:/b/run", "--terminal"], "run_dir", "gs://b/run"),
    ]:
        with pytest.raises(SystemExit) as exited:
            writers.plot.main(args)
        assert exited.value.code == 2
        assert f"pass the URL with its '//', {flag}={url!r}" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_a_missing_key_among_thousands_names_some_and_the_close_ones(tmp_path):
    """The message listed all 3,000 keys (about 40 KB)."""
    line = {"step": 1, **{f"layer_{i:04d}/norm": 1.0 for i in range(3000)}}
    _write_jsonl(str(tmp_path / "r" / "metrics.jsonl"), [line])
    with pytest.raises(ValueError) as error:
        load_series([str(tmp_path / "r")], ["layer_0001/nrom"])
    message = str(error.value)
    assert "close: ['layer_0001/norm'" in message
    assert "'layer_0039/norm', ... and 2,960 more]. Pick some" in message
    assert len(message) < 1500


def test_terminal_panels_too_small_to_draw_in_are_refused_with_the_size_they_need(tmp_path):
    """Six keys in 24 rows drew six titled frames with no data, exit status 0."""
    line = {"step": 1, **{k: 1.0 for k in "abcdef"}}
    _write_jsonl(str(tmp_path / "r" / "metrics.jsonl"), [line, {**line, "step": 2}])
    with pytest.raises(ValueError) as error:
        plot_runs([str(tmp_path / "r")], list("abcdef"), terminal=True, cols=80, rows=24)
    assert str(error.value) == (
        "writers.plot: 6 panel(s) in 80 x 24 characters leave each 80 x 0 to draw in; a plot "
        "needs 20 x 3. Pass --rows 42 or more (output that is not a terminal gets 80 x 24), "
        "or fewer --keys."
    )
    with pytest.raises(ValueError) as narrow:  # was told to pass --rows 14, which it had
        plot_runs([str(tmp_path / "r")], ["a", "b"], terminal=True, cols=10, rows=40)
    assert str(narrow.value) == (
        "writers.plot: 2 panel(s) in 10 x 40 characters leave each 10 x 16 to draw in; a plot "
        "needs 20 x 3. Pass --cols 20 or more."
    )
    # --follow printed it once and polled on, drawing nothing, until the log changed.
    follow = ("--terminal", "--follow", "--keys", "a,b", "--cols", "10", "--rows", "40")
    result = _plot(str(tmp_path / "r"), *follow, timeout=30)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "writers.plot: 2 panel(s) in 10 x 40 characters leave each 10 x 16 to draw in; a plot "
        "needs 20 x 3. Pass --cols 20 or more.\n"
    )
    # As asked, not cut to 80 x 24 by plotext when output is no terminal: 3 rows a panel.
    text = plot_runs([str(tmp_path / "r")], list("abcdef"), terminal=True, cols=80, rows=42).text
    assert len(text.splitlines()) == 42
    assert sum("┤" in row for row in text.splitlines()) == 6 * 3


def test_output_that_is_no_terminal_gets_80_by_24(tmp_path, monkeypatch):
    """A pipe got 100 x 30 (shutil's fallback), where the refusal above says 80 x 24."""

    def no_terminal(fd=1):
        raise OSError("not a terminal")

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    monkeypatch.setattr("os.get_terminal_size", no_terminal)
    lines = [{"step": s, **{k: 1.0 / s for k in "abcdef"}} for s in (1, 2)]
    _write_jsonl(str(tmp_path / "r" / "metrics.jsonl"), lines)
    rows = plot_runs([str(tmp_path / "r")], ["a"], terminal=True).text.splitlines()
    assert (len(rows), max(len(row) for row in rows)) == (24, 80)
    with pytest.raises(ValueError, match=r"6 panel\(s\) in 80 x 24 characters"):
        plot_runs([str(tmp_path / "r")], list("abcdef"), terminal=True)


def test_a_key_with_no_finite_value_says_so(tmp_path, monkeypatch):
    _write_jsonl(
        str(tmp_path / "r" / "metrics.jsonl"),
        [{"step": s, "loss": 1.0 / s, "grad": "NaN"} for s in (1, 2)],
    )
    text = plot_runs([str(tmp_path / "r")], ["loss", "grad"], terminal=True, cols=80, rows=30)
    assert "grad: no finite values" in text.text
    titles = []
    monkeypatch.setattr(
        "matplotlib.axes.Axes.set", lambda self, **kw: titles.append(kw.get("title"))
    )
    plot_runs([str(tmp_path / "r")], ["loss", "grad"], out=str(tmp_path / "p.png"))
    assert titles == ["loss", "grad: no finite values"]


def test_a_run_with_no_finite_value_next_to_others_is_named_in_the_text_plot(tmp_path):
    # A run that diverged from its first step drew nothing and was named nowhere: the panel
    # and its legend showed only the other run, as if the diverged one had not been read.
    _write_jsonl(str(tmp_path / "exp" / "a" / "metrics.jsonl"), [{"step": 1, "loss": "NaN"}])
    _write_jsonl(
        str(tmp_path / "exp" / "b" / "metrics.jsonl"),
        [{"step": s, "loss": 1.0 / s} for s in (1, 2)],
    )
    text = plot_runs([str(tmp_path / "exp")], ["loss"], terminal=True, cols=80, rows=20).text
    assert text.splitlines()[0].strip() == "loss; no finite values: exp/a"
    assert "x exp/b:loss" in text  # the legend, with the run's glyph


# --- --follow ----------------------------------------------------------------------------


def test_follow_redraws_when_the_log_grows(tmp_path):
    writer = writers.JsonlWriter(str(tmp_path / "exp" / "train"), collection="train")  # a live run
    for step in (1, 2, 3):
        writer.write_scalars(step, {"loss": 1.0 / step})
    writer.flush()
    png, dump = str(tmp_path / "f.png"), str(tmp_path / "f.json")
    process = subprocess.Popen(
        [sys.executable, "-m", "writers.plot", str(tmp_path / "exp"), "--follow",
         "--interval", "0.1", "--max_redraws", "2", "--out", png, "--dump_series", dump,
         "--smoothing", "0", "--width", "200", "--height", "150"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(dump) and time.monotonic() < deadline:
            time.sleep(0.05)
        with open(dump) as f:
            assert json.load(f)["series"][0]["steps"] == [1, 2, 3]
        # The log is line-buffered: a poll between the two lines redraws steps 1-4, its last
        # redraw. Stopped meanwhile, the follower finds both lines at its next poll.
        process.send_signal(signal.SIGSTOP)
        os.waitpid(process.pid, os.WUNTRACED)  # stopped, not merely signalled
        try:
            for step in (4, 5):
                writer.write_scalars(step, {"loss": 1.0 / step})
            writer.flush()
        finally:
            process.send_signal(signal.SIGCONT)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
        writer.close()
    assert process.returncode == 0, stderr
    assert stdout.count(f"wrote {png}") == 2
    with open(dump) as f:
        (series,) = json.load(f)["series"]
    assert series["steps"] == [1, 2, 3, 4, 5]
    assert series["values"] == [1.0, 0.5, 1 / 3, 0.25, 0.2]
    assert _png_size(png) == (200, 150)


def test_follow_with_max_redraws_returns_on_a_finished_run(tmp_path):
    # The logs of a finished run never change again: --follow --max_redraws 3 drew once and
    # then waited for the other two redraws forever. No writer holds the log: it returns.
    run = str(tmp_path / "exp" / "train")
    writer = writers.JsonlWriter(run, collection="train")
    for step in (1, 2, 3):
        writer.write_scalars(step, {"loss": 1.0 / step})
    writer.close()
    png, dump = str(tmp_path / "f.png"), str(tmp_path / "f.json")
    follow = ("--follow", "--interval", "0.1", "--max_redraws", "3", "--smoothing", "0")
    result = _plot(str(tmp_path / "exp"), *follow, "--out", png, "--dump_series", dump, timeout=20)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(f"wrote {png}") == 1
    with open(dump) as f:
        (series,) = json.load(f)["series"]
    assert series["steps"] == [1, 2, 3] and series["values"] == [1.0, 0.5, 1 / 3]
    # A live run is followed: a writer holding the log keeps it waiting for the next draw.
    writer = writers.JsonlWriter(run, collection="train")
    try:
        assert not plot._finished([str(tmp_path / "exp")])
    finally:
        writer.close()
    assert plot._finished([str(tmp_path / "exp")])
    # On a btrfs subvolume stat() gives the subvolume's device, /proc/locks the file
    # system's: a live run read as finished (its log's lock not found under that device).
    writer = writers.JsonlWriter(run, collection="train")
    real_stat = os.stat

    def subvolume_stat(path, *args, **kwargs):
        info = real_stat(path, *args, **kwargs)
        return os.stat_result((*info[:2], os.makedev(0, 47), *info[3:10]))

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(plot.os, "stat", subvolume_stat)
            assert not plot._finished([str(tmp_path / "exp")])
    finally:
        writer.close()
    # A finished run with nothing to draw never will have: said once, not polled forever.
    writer = writers.JsonlWriter(str(tmp_path / "texts"))
    writer.write_texts(0, {"config": "x"})
    writer.close()
    result = _plot(str(tmp_path / "texts"), *follow, "--out", png, timeout=20)
    assert result.returncode == 2
    assert "no scalars logged yet" in result.stderr and "the runs ended" in result.stderr


def test_follow_sees_a_part_rewritten_in_place(tmp_path):
    # A file:// flush that failed part-way left a part cut mid-line; the retry wrote that part
    # again, whole, under the same name, which changed no mtime of the `.d` directory that
    # --follow watched: steps 2 and 3 were drawn only once another part came.
    run = tmp_path / "run"
    parts = run / "metrics.jsonl.d"
    parts.mkdir(parents=True)
    part = parts / "000000-00000000-0123abcd.jsonl"
    part.write_bytes(b'{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
    before = plot._signature([str(run)])
    assert load_series([str(run)], ["loss"])[1][0].steps.tolist() == [1]
    part.write_bytes(
        b'{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 2.0}\n{"step": 3, "loss": 3.0}\n'
    )
    assert plot._signature([str(run)]) != before
    assert load_series([str(run)], ["loss"])[1][0].steps.tolist() == [1, 2, 3]


# --- imports -----------------------------------------------------------------------------


def test_import_writers_and_writers_plot_load_no_plotting_library():
    script = "import sys, writers, writers.plot\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    loaded = {name.split(".")[0] for name in out.stdout.split()}
    assert {"writers"} <= loaded
    assert loaded.isdisjoint({"matplotlib", "plotext", "tensorboardX", "tensorboard"})


def test_integer_scalars_plugin_tensors_are_read_as_tensorboard_reads_them(tmp_path):
    """An int32 or int64 `write_summaries` tensor with the scalars plugin's metadata shows in
    TensorBoard; the plot read only float and double ones."""
    from tensorboard.plugins.scalar import metadata as scalar_metadata

    meta = scalar_metadata.create_summary_metadata(display_name="", description="")
    with writers.TensorBoardWriter(tmp_path) as w:
        for step in (1, 2):
            w.write_summaries(step, {"i32": np.int32(10 * step)}, metadata=meta)
            w.write_summaries(step, {"i64": np.int64(2**40 + step)}, metadata=meta)
    (event_file,) = [str(p) for p in tmp_path.glob("events.out.tfevents.*")]
    read = [(step, tag, value) for _, step, tag, value in _read_events(event_file)]
    assert (1, "i32", 10.0) in read and (2, "i32", 20.0) in read
    assert (2, "i64", float(2**40 + 2)) in read
