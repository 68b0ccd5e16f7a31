"""Plots from the logs, no server: chosen keys against step, as a PNG or in the terminal.

Reads `metrics.jsonl` (with the `.d/` parts of a URL log copied down; or else the event
files) of the runs at or under each path and draws one panel per key, runs overlaid, smoothed
as TensorBoard does (`plot` extra: matplotlib, plotext).

Usage:
    python -m writers.plot runs/demo                          # loss and accuracy -> plot.png
    python -m writers.plot runs/demo runs/other --keys loss,learning_rate --out cmp.png
    python -m writers.plot runs/demo --terminal               # over ssh: a text plot
    python -m writers.plot runs/demo --terminal --follow      # redraw as the logs grow

Example:
  >>> import tempfile, writers
  >>> from writers.plot import plot_runs
  >>> logdir = tempfile.mkdtemp()
  >>> w = writers.JsonlWriter(f"{logdir}/train/metrics.jsonl", collection="train")
  >>> for step in (1, 2, 3): w.write_scalars(step, {"loss": 1.0 / step})
  >>> w.close()
  >>> data = plot_runs([logdir], smoothing=0.0)
  >>> [(s.key, s.steps.tolist(), s.values.tolist()) for s in data.series]
  [('loss', [1, 2, 3], [1.0, 0.5, 0.3333333333333333])]
"""

import argparse
import contextlib
import dataclasses
import difflib
import glob
import io
import json
import math
import numbers
import os
import shutil
import struct
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from absl import logging

from writers import _jsonl_log, _storage
from writers._checks import Problems, collapsed_url
from writers.jsonl import _json_array

DEFAULT_KEYS = ("loss", "accuracy")
MAX_DEFAULT_KEYS = 4
_MIN_PANEL_ROWS, _MIN_COLS = 3, 20  # a terminal panel's smallest plotting area
_EXTRA = "pip install 'jax-metrics-manager[plot]'"
_EVENTS_GLOB = "events.out.tfevents.*"
_NON_FINITE = ("NaN", "Infinity", "-Infinity")  # JsonlWriter's spellings; float() reads them
# Terminal markers of runs sharing a panel: a 9th run got the 1st run's `•`, then letters.
_GLYPHS = ("•", "x", "o", "+", "*", "#", "%", "@", *"ABCDEFGHJKLMNPQRSTUVWYZ")


@dataclasses.dataclass(frozen=True)
class Series:
    """One plotted line: `key` of run `run` at `steps` (increasing), raw and smoothed."""

    run: str
    key: str
    steps: np.ndarray
    values: np.ndarray
    smoothed: np.ndarray

    @property
    def label(self) -> str:
        """`<run>:<key>`, the legend entry."""
        return f"{self.run}:{self.key}"


@dataclasses.dataclass(frozen=True)
class PlotData:
    """What one `plot_runs` call drew: keys (one panel each), series, PNG path, text plot."""

    keys: list[str]
    series: list[Series]
    png: str | None = None
    text: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The series as JSON-ready data, non-finite floats as in JSONL (`"NaN"`, `"Infinity"`)."""
        series = [
            {"run": s.run, "key": s.key, "label": s.label, "steps": s.steps.tolist()}
            | {"values": _json_array(s.values), "smoothed": _json_array(s.smoothed)}
            for s in self.series
        ]
        return {"keys": self.keys, "png": self.png, "series": series}


def smooth(values: Sequence[float] | np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's scalar smoothing: a debiased exponential moving average.

    Non-finite values stay as they are; a constant series is returned as is.

    Example:
      >>> smooth([1.0, 0.0], 0.5).tolist()  # (0.5 * 0.5 + 0) / (1 - 0.25)
      [1.0, 0.3333333333333333]
    """
    _problems(weight, {}).raise_if_any()  # 1.0 divided by zero; NaN gave NaN everywhere
    out = np.array(values, dtype=np.float64)  # a copy
    if weight == 0 or out.size == 0 or np.all(out == out[0]):
        return out
    last, count = 0.0, 0
    for i, value in enumerate(out.tolist()):
        if math.isfinite(value):
            last = last * weight + (1 - weight) * value
            count += 1
            out[i] = last / (1 - weight**count)
    return out


def _problems(smoothing: float, sizes: Mapping[str, Any], flag: str = "") -> Problems:
    """What is wrong with the options, each named `flag + name`."""
    problems = Problems("writers.plot")
    if isinstance(smoothing, bool) or not isinstance(smoothing, numbers.Real):
        problems.type_problem(f"{flag}smoothing must be a number in [0, 1), got {smoothing!r}")
    elif not 0 <= smoothing < 1:
        problems.value_problem(
            f"{flag}smoothing must be in [0, 1) (TensorBoard's slider), got {smoothing!r}: 0 "
            "draws the raw values, 0.6 is TensorBoard's default"
        )
    for name, v in sizes.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
            problems.type_problem(f"{flag}{name} must be a positive integer, got {v!r}")
        elif v is not None and not (float(v).is_integer() and float(v) >= 1):
            problems.value_problem(f"{flag}{name} must be a positive integer, got {v!r}")
    return problems


def load_series(
    paths: Sequence[str], keys: Sequence[str] | None = None, smoothing: float = 0.6
) -> tuple[list[str], list[Series]]:
    """The keys to plot and their series, read from the runs at or under `paths`.

    Args:
      paths: Run or experiment directories (see the module docstring).
      keys: Metrics to plot; None: `loss` and `accuracy` (those logged), else the first few.
      smoothing: TensorBoard's smoothing weight in [0, 1).

    Returns:
      The keys, and one series per run that logged each key (runs in path order).

    Raises:
      FileNotFoundError: no run directory at or under a path.
      ValueError: no scalars logged yet, a key no run logged, or `smoothing` outside [0, 1).
    """
    _problems(smoothing, {}).raise_if_any()
    paths = [paths] if isinstance(paths, str | os.PathLike) else list(paths)  # not its letters
    keys = [keys] if isinstance(keys, str) else keys
    table: dict[str, list[tuple[str, dict[int, float]]]] = {}
    for run, files in _find_runs(paths):
        scalars: dict[tuple[str | None, str], dict[int, float]] = {}  # (collection, key): points
        for path in files:
            read = _read_jsonl(path) if path.endswith(".jsonl") else _read_events(path)
            for collection, step, key, value in read:  # a step written twice: the last value
                if key is None:  # a restart at `step`: earlier runs' points from it on go
                    for name, points in scalars.items():
                        scalars[name] = {s: v for s, v in points.items() if s < step}
                    continue
                scalars.setdefault((collection, key), {})[step] = value
        several = len({collection for collection, _ in scalars}) > 1
        for (collection, key), points in scalars.items():
            label = f"{run}[{collection}]" if several else run
            table.setdefault(key, []).append((label, points))
    if not table:
        raise ValueError(
            f"writers.plot: no scalars logged yet under {list(paths)}; expected JSONL lines "
            "with numbers or scalar events. Wait for the first summary, or use --follow."
        )
    if keys is None:
        keys = [key for key in DEFAULT_KEYS if key in table] or list(table)[:MAX_DEFAULT_KEYS]
    elif not (keys := list(dict.fromkeys(keys))):  # a key given twice: one panel
        raise ValueError(
            f"writers.plot: no keys given; pass None for the defaults, or some of "
            f"{_some(sorted(table))}"
        )
    if unknown := [key for key in keys if key not in table]:
        close = [m for key in unknown for m in difflib.get_close_matches(key, table, n=3)]
        raise ValueError(
            f"writers.plot: no run under {list(paths)} logged the key(s) {unknown}; "
            + (f"close: {close}; " if close else "")
            + f"available: {_some(sorted(table))}. Pick some of those with --keys."
        )
    series = []
    for key in keys:
        for label, points in table[key]:
            steps = np.array(sorted(points), dtype=np.int64)
            values = np.array([points[step] for step in steps.tolist()], dtype=np.float64)
            series.append(Series(label, key, steps, values, smooth(values, smoothing)))
    return list(keys), series


def _some(keys: list[str], shown: int = 40) -> str:
    """`keys`, the first `shown` of them when there are more (a run can log thousands)."""
    if len(keys) <= shown:
        return str(keys)
    return f"{str(keys[:shown])[:-1]}, ... and {len(keys) - shown:,} more]"


def _url_problem(url: str) -> str:
    """What to do with a run given as a URL: plots read local files."""
    fix = "copy the run down first (gsutil cp -r, aws s3 cp --recursive)"
    if url.startswith("file://"):  # local already: no copy to make
        fix = f"pass its path, {url.removeprefix('file://')!r}"
    return (
        f"run_dir {url!r} is a URL, and plots are drawn from local files: {fix}; its "
        "metrics.jsonl.d/ is read"
    )


def _find_runs(paths: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """`(label, files)` of each run dir at or under `paths`: `metrics.jsonl`, else event files."""
    problems = Problems(
        "writers.plot: expected run directories holding metrics.jsonl or event files "
        "(runs/demo/train) or directories containing them (runs/demo); pass a run's model_dir"
    )
    found: list[tuple[str, str, tuple[str, ...]]] = []
    for given in paths:
        root = os.path.abspath(given)
        if _storage.is_remote(given):  # from Python it read "'gs://b/run' is not a directory"
            problems.value_problem(_url_problem(given))
            continue
        if not os.path.isdir(root):
            problems.value_problem(f"{given!r} is not a directory")
            continue
        before = len(found)
        for directory, subdirs, _ in os.walk(root):
            subdirs.sort()
            if any(directory == seen for _, seen, _ in found):  # a run and its parent given
                continue
            jsonl = os.path.join(directory, _jsonl_log.LOG_NAME)
            pattern = os.path.join(glob.escape(directory), _EVENTS_GLOB)
            # `.d`: a URL log copied down, read as read_jsonl reads it
            found_jsonl = os.path.isfile(jsonl) or os.path.isdir(jsonl + ".d")
            files = (jsonl,) if found_jsonl else tuple(sorted(glob.glob(pattern)))
            if not files:
                continue
            # A run given itself: `<parent>/<name>`; one found below P: `<P's name>/<rel path>`.
            parent = os.path.dirname(root) if directory == root else root
            label = os.path.join(os.path.basename(parent), os.path.relpath(directory, parent))
            found.append((label.replace(os.sep, "/"), directory, files))
        if len(found) == before and not any(
            os.path.commonpath([root, seen]) == root for _, seen, _ in found
        ):
            problems.value_problem(
                f"no {_jsonl_log.LOG_NAME} and no {_EVENTS_GLOB} files in {given!r} or any directory below it"
            )
    problems.raise_if_any(error=FileNotFoundError)
    labels = [label for label, _, _ in found]
    if len(set(labels)) < len(labels):  # a clash: the paths instead
        labels = [os.path.relpath(directory) for _, directory, _ in found]
    return [(label, f) for label, (_, _, f) in zip(labels, found, strict=True)]


def _read_jsonl(path: str) -> Iterator[tuple[str | None, int, str, float]]:
    """`(collection, step, key, value)` for every number in a JSONL log, in file order.

    Lenient, for a log still being written or written by hand: lines that are no JSON object
    are skipped (a last line without a newline counts when it is a whole object)."""
    data = io.BytesIO(_jsonl_log.read_bytes(path))  # a URL log copied down: with its parts
    with io.TextIOWrapper(data, encoding="utf-8-sig", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a blank line, one torn by a crash or not UTF-8, or still being written
            step = record.get("step") if isinstance(record, dict) else None
            if isinstance(step, float) and step.is_integer():  # 1.0 from pandas
                step = int(step)
            if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 2**63:
                continue  # no step a writer here writes (1e20 by hand): int64 cannot hold it
            collection = record.get("collection")
            for key, value in record.items():  # bools, texts and summarized arrays are no scalars
                if key not in ("step", "time", "collection") and (
                    type(value) in (int, float) or value in _NON_FINITE
                ):
                    with contextlib.suppress(OverflowError):  # an int past float's range
                        yield collection, step, key, float(value)


def _read_events(path: str) -> Iterator[tuple[str | None, int, str | None, float]]:
    """`(None, step, tag, value)` for every scalar (`simple_value`, or TF2's scalars plugin),
    and `(None, step, None, nan)` for a restart at `step` (a writer's `purge_step`), after
    which TensorBoard drops the events at or after `step` read before it."""
    from writers._tbx import event_pb2, masked_crc32c  # noqa: PLC0415  (only to read events)

    with open(path, "rb") as f:
        data = f.read()
    offset = 0
    while offset + 12 <= len(data):
        # A record: [length u64][masked crc of length u32][payload][masked crc of payload u32]
        length, header_crc = struct.unpack_from("<QI", data, offset)
        end = offset + 12 + length + 4
        if end > len(data):
            return  # still being written
        payload = data[offset + 12 : end - 4]
        (payload_crc,) = struct.unpack_from("<I", data, end - 4)
        header = data[offset : offset + 8]
        if header_crc != masked_crc32c(header) or payload_crc != masked_crc32c(payload):
            logging.warning(  # TensorBoard's reader also stops at the first corrupt record
                "writers.plot: record at byte %d of %r fails its CRC check (a corrupted event "
                "file): plotting only the events before it, as TensorBoard does.",
                offset,
                path,
            )
            return
        offset = end
        event = event_pb2.Event.FromString(payload)
        if event.session_log.status == event_pb2.SessionLog.START:
            yield None, int(event.step), None, math.nan
        for value in event.summary.value:  # empty in events without a summary
            if (number := _scalar(value)) is not None:
                yield None, int(event.step), value.tag, number


def _scalar(value: Any) -> float | None:
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.metadata.plugin_data.plugin_name != "scalars":
        return None
    tensor = value.tensor
    for field in (tensor.float_val, tensor.double_val, tensor.int_val, tensor.int64_val):
        if len(field) == 1:
            return float(field[0])
    # DT_FLOAT, DT_DOUBLE, DT_INT32, DT_INT64, as TensorBoard's scalars plugin reads them
    fmt = {1: "<f", 2: "<d", 3: "<i", 9: "<q"}.get(tensor.dtype)
    if fmt and len(tensor.tensor_content) == struct.calcsize(fmt):
        return float(struct.unpack(fmt, tensor.tensor_content)[0])
    return None


def plot_runs(
    paths: Sequence[str],
    keys: Sequence[str] | None = None,
    *,
    out: str | None = None,
    terminal: bool = False,
    smoothing: float = 0.6,
    width: int = 1200,
    height: int = 800,
    dpi: int = 100,
    cols: int | None = None,
    rows: int | None = None,
    color: bool = False,
) -> PlotData:
    """Reads the runs at or under `paths` and draws `keys` against step.

    Args:
      paths: Run or experiment directories (see the module docstring).
      keys: Metrics to plot (None: `loss` and `accuracy`, or the first few keys).
      out: Image file to write (replaced atomically), in the format its suffix names (PNG
        without one: `.svg`, `.pdf`, `.jpg`, any matplotlib writes), or None for no image.
      terminal: Also render a text plot (returned as `PlotData.text`, not printed).
      smoothing: TensorBoard's smoothing weight in [0, 1).
      width: PNG width in pixels.
      height: PNG height in pixels.
      dpi: PNG resolution (fonts scale with it).
      cols: Text plot width (None: the terminal's; 80 where output is no terminal).
      rows: Text plot height (None: the terminal's, less two; 24 where output is no terminal).
      color: ANSI colors in the text plot.

    Returns:
      The keys and series drawn, the PNG path and the text plot.

    Raises:
      FileNotFoundError, ValueError: as `load_series`; ValueError also for a size < 1.
      ImportError: matplotlib (PNG) or plotext (terminal) is not installed.
    """
    sizes = {"width": width, "height": height, "dpi": dpi, "cols": cols, "rows": rows}
    _problems(smoothing, sizes).raise_if_any()
    keys, series = load_series(paths, keys, smoothing)
    text = None
    if out is not None:
        _png(keys, series, out, width=width, height=height, dpi=dpi, raw=smoothing > 0)
    if terminal:
        size = shutil.get_terminal_size((80, 26))  # no terminal (a pipe, a file): 80 x 24
        text = _text(keys, series, cols or size.columns, rows or max(size.lines - 2, 8), color)
    return PlotData(keys, series, out, text)


def _png(
    keys: list[str], series: list[Series], path: str, width: int, height: int, dpi: int, raw: bool
) -> None:
    """Writes a PNG to `path` (atomically), a panel per key (`raw`: raw values faint behind)."""
    try:
        from matplotlib import colormaps  # noqa: PLC0415
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError as err:
        raise ImportError(f"writers.plot: a PNG needs matplotlib; {_EXTRA}") from err
    ncols = 1 if len(keys) <= 3 else 2
    # A `Figure` with the Agg canvas, not pyplot: no global state, no display.
    figure = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(math.ceil(len(keys) / ncols), ncols, squeeze=False).ravel()
    # One color per run, the same in every panel (matplotlib's cycle; tab20 past 10 runs).
    runs = list(dict.fromkeys(s.run for s in series))
    cycle: list[Any] = [f"C{i}" for i in range(10)]
    if len(runs) > 10:
        cycle = [colormaps["tab20"](i) for i in range(20)]
    colors = {run: cycle[i % len(cycle)] for i, run in enumerate(runs)}
    for ax, key in zip(axes, keys, strict=False):
        for s in (s for s in series if s.key == key):
            layers: list[tuple[np.ndarray, dict[str, Any]]] = []
            if raw:
                layers.append((s.values, {"alpha": 0.25, "linewidth": 1}))
            layers.append((s.smoothed, {"alpha": 1.0, "linewidth": 1.5, "label": s.label}))
            for values, style in layers:
                ax.plot(s.steps, values, color=colors[s.run], **style)
                # A point with no finite neighbour draws no line: a marker shows it (one eval).
                finite = np.pad(np.isfinite(values), 1)
                if alone := np.flatnonzero(finite[1:-1] & ~finite[:-2] & ~finite[2:]).tolist():
                    dots = dict(color=colors[s.run], alpha=style["alpha"], ms=4)
                    ax.plot(s.steps[alone], values[alone], "o", **dots)
        drawn = any(np.isfinite(s.values).any() for s in series if s.key == key)
        ax.set(title=key if drawn else f"{key}: no finite values", xlabel="step")
        ax.xaxis.get_major_locator().set_params(integer=True)  # steps: no tick at 2.5
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=dpi, format=_image_format(path))
    _storage.replace_file(path, [buffer.getvalue()])


def _image_format(path: str) -> str:
    """The format `path`'s suffix names (`plot.svg`, `plot.pdf`; PNG without one)."""
    from matplotlib.backend_bases import FigureCanvasBase  # noqa: PLC0415

    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        raise ValueError(
            f"writers.plot: cannot write {path!r}: it names a directory; name the image in it, "
            f"e.g. {os.path.join(path, 'plot.png')!r}"
        )
    suffix = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix not in formats:
        raise ValueError(
            f"writers.plot: cannot write {path!r}: matplotlib writes {', '.join(sorted(formats))}"
            "; name the file plot.png, plot.svg or plot.pdf"
        )
    return suffix


class _TooSmall(ValueError):
    """The text plot does not fit its size: no log can change that, so --follow stops."""


def _text(keys: list[str], series: list[Series], cols: int, rows: int, color: bool) -> str:
    """A `cols` x `rows` character plot of the smoothed lines, panels stacked (gaps at NaN/inf)."""
    try:
        import plotext  # noqa: PLC0415
    except ImportError as err:
        raise ImportError(f"writers.plot: a terminal plot needs plotext; {_EXTRA}") from err
    if (each := rows // len(keys) - 4) < _MIN_PANEL_ROWS or cols < _MIN_COLS:
        fixes = [f"Pass --cols {_MIN_COLS} or more."] if cols < _MIN_COLS else []  # not --rows
        if each < _MIN_PANEL_ROWS:
            fixes.append(
                f"Pass --rows {len(keys) * (_MIN_PANEL_ROWS + 4)} or more (output that is not a "
                "terminal gets 80 x 24), or fewer --keys."
            )
        raise _TooSmall(
            f"writers.plot: {len(keys)} panel(s) in {cols} x {rows} characters leave each "
            f"{cols} x {max(each, 0)} to draw in; a plot needs {_MIN_COLS} x {_MIN_PANEL_ROWS}. "
            + " ".join(fixes)
        )
    figure = plotext.figure  # plotext draws on one module-wide figure: reset it first
    figure.clear.all()
    plotext.terminal.limit(False, False)  # `cols` x `rows` as asked: plotext cut them to 80x24
    figure.plot_size(cols, rows)
    if len(keys) > 1:
        figure.subplots(len(keys), 1)
    # One glyph per run where runs share a panel, so they differ without colors too.
    runs = list(dict.fromkeys(s.run for s in series))
    glyphs = dict(zip(runs, _GLYPHS * len(runs), strict=False)) if len(runs) > 1 else {}
    canvas = (cols, rows // len(keys) - 4)  # a panel's plotting area
    for row, key in enumerate(keys, start=1):
        panel = figure.subplot(row, 1) if len(keys) > 1 else figure
        lines = {}  # label -> (steps, smoothed, joined, glyph), the finite points
        for s in (s for s in series if s.key == key):
            if (points := _finite_points(s.steps, s.smoothed))[0].size:
                lines[s.label] = (*points, glyphs.get(s.run))
        box = (max(map(len, lines), default=0) + 6, 2 * len(lines) + 3)  # plotext's legend
        # A legend taller or wider than half the panel would hide most lines: in the title.
        small = 2 * box[1] > canvas[1] or 2 * box[0] > canvas[0]
        names = [f"{glyph} {label}" if glyph else label for label, (*_, glyph) in lines.items()]
        title = f"{key}: {', '.join(names)}" if small and lines else key
        title = title if lines else f"{key}: no finite values"  # cut too: it went blank
        # A run whose values are all NaN (diverged from the start) draws nothing: named, not
        # left out without a word while the other runs' lines fill the panel.
        if lines and (empty := [s.run for s in series if s.key == key and s.label not in lines]):
            title += f"; no finite values: {', '.join(empty)}"
        # plotext drops a title wider than the plot: the key and the run names went with it.
        panel.title(title if len(title) <= cols else title[: cols - 1] + "…")
        for label, (steps, values, joined, glyph) in lines.items():
            signal = panel.signal(steps.tolist(), values.tolist(), marker=glyph)
            signal.label(label)
            for i in np.flatnonzero(joined).tolist():  # a gap at NaN/inf, as in the PNG
                signal.line(i)
            panel.draw(signal)
        if not lines:
            continue
        low = int(min(x[0] for x, *_ in lines.values()))  # steps increase
        high = int(max(x[-1] for x, *_ in lines.values()))
        # Whole, round steps (5, 10, 15), not plotext's 4.2, 7.3, ...
        ticks = _step_ticks(low, high, max(2, min(cols // 12, 8)))
        panel.ruler("x").ticks(ticks, [str(t) for t in ticks])
        if small:
            panel.legend(active=False)
        else:
            x, y, ha, va = _legend_corner([(x, y) for x, y, *_ in lines.values()], box, canvas)
            panel.legend(x=x, y=y, relative=True, ha=ha, va=va)
    return figure.build().string(colorless=not color)


def _finite_points(
    steps: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The finite points of a line, `(steps, values, joined)`: `joined[i]` when point `i` is
    drawn joined to point `i - 1`, so a NaN or inf between them leaves a gap, as in the PNG.

    Example:
      >>> _finite_points(np.arange(5), np.array([1.0, 2.0, np.nan, 4.0, 5.0]))[2].tolist()
      [False, True, False, True]
    """
    index = np.flatnonzero(np.isfinite(values))
    joined = np.diff(index, prepend=-2) == 1  # the first point: nothing before it
    return steps[index], values[index], joined


def _legend_corner(
    lines: list[tuple[np.ndarray, np.ndarray]], box: tuple[int, int], canvas: tuple[int, int]
) -> tuple[float, float, str, str]:
    """Where the legend (`box`: columns, rows) hides the least of `lines` on a `canvas` of
    (columns, rows): the anchor (x, y in data units) and alignment of the emptiest corner.
    plotext puts it top left, on the start of every falling loss curve."""
    xs = np.concatenate([x for x, _ in lines])
    ys = np.concatenate([y for _, y in lines])
    (x0, x1), (y0, y1) = (_axis(xs), _axis(ys))
    # Each line at 200 points, so a segment crossing the box counts; scaled to [0, 1].
    grids = [np.linspace(x[0], x[-1], 200) for x, _ in lines]
    u = (np.concatenate(grids) - x0) / max(x1 - x0, 1e-12)
    heights = [np.interp(g, x, y) for g, (x, y) in zip(grids, lines, strict=True)]
    v = (np.concatenate(heights) - y0) / max(y1 - y0, 1e-12)
    width, height = (min(b / max(c, 1), 1.0) for b, c in zip(box, canvas, strict=True))
    hidden = {
        (ha, va): np.count_nonzero(
            (u >= 1 - width if ha == "right" else u <= width)
            & (v >= 1 - height if va == "top" else v <= height)
        )
        for ha, va in (("right", "top"), ("right", "bottom"), ("left", "top"), ("left", "bottom"))
    }
    ha, va = min(hidden, key=hidden.__getitem__)  # the first of the emptiest, in the order above
    return (x1 if ha == "right" else x0), (y1 if va == "top" else y0), ha, va


def _axis(values: np.ndarray) -> tuple[float, float]:
    """The axis plotext draws `values` on: one value (a single eval) is widened by 1 on each
    side (`plotext._correct.limits.expand`), which puts it in the middle, not in a corner."""
    low, high = float(values.min()), float(values.max())
    if abs(high - low) <= 1e-5 * abs(high + low) / 2:
        return low - 1, high + 1
    return low, high


def _step_ticks(low: int, high: int, most: int) -> list[int]:
    """At most `most` multiples of 1, 2 or 5 x 10^k in [low, high] (`low` alone if equal)."""
    if high <= low:
        return [low]
    spacing = max((high - low) / (most - 1), 1.0)
    magnitude = 10 ** math.floor(math.log10(spacing))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= spacing)
    return list(range(math.ceil(low / step) * step, high + 1, step)) or [low, high]


def _signature(paths: Sequence[str]) -> tuple[tuple[str, int, int], ...]:
    """Path, size and modification time of every file read (raises while there is no run)."""
    stats = []
    for _, files in _find_runs(paths):
        # A URL log copied down: each part, which a flush retried after a failure rewrites in
        # place (the `.d` directory's mtime changes only when a part is added).
        parts = [glob.glob(os.path.join(glob.escape(f"{f}.d"), "*")) for f in files]
        for path in [*files, *sorted(p for names in parts for p in names)]:
            with contextlib.suppress(FileNotFoundError):  # rotated away since it was listed
                stat = os.stat(path)
                stats.append((path, stat.st_size, stat.st_mtime_ns))
    return tuple(stats)


def _finished(paths: Sequence[str]) -> bool:
    """Whether every run under `paths` is a local JSONL log that no writer holds (Linux).

    A `JsonlWriter` holds an flock on its log while it is open; /proc/locks lists it without
    taking a lock (a probe with flock could refuse a writer opening the log at that moment).
    Event files and a URL log's parts carry no lock: such runs never count as finished.
    Locks are matched by inode number alone: on a btrfs subvolume `stat` gives the
    subvolume's own device, /proc/locks the file system's (a live run read as finished); a
    lock on a file elsewhere with the same number only keeps it following."""
    try:
        with open("/proc/locks") as f:  # "1: FLOCK  ADVISORY  WRITE 12443 fe:00:2164336 0 EOF"
            held = {line.split()[-3].rpartition(":")[2] for line in f}  # any kind: NFS
    except OSError:  # emulates flock by POSIX locks
        return False
    for _, files in _find_runs(paths):
        for path in files:
            if os.path.basename(path) != _jsonl_log.LOG_NAME or not os.path.isfile(path):
                return False
            if os.path.isdir(f"{path}.d"):  # continued as parts, which hold no lock
                return False
            if str(os.stat(path).st_ino) in held:
                return False
    return True


def _follow(
    paths: Sequence[str], draw: Callable[[], None], interval: float, max_redraws: int
) -> None:
    """Calls `draw` whenever the files under `paths` change, `max_redraws` times (0: forever).

    With `max_redraws`, it also returns once the runs have finished (see `_finished`) and
    what they hold is drawn: a finished run's logs never change again, so it waited forever."""
    last: tuple[tuple[str, int, int], ...] | None = None
    redraws, reported = 0, ""
    while True:
        finished = False
        try:
            finished = bool(max_redraws) and _finished(paths)  # before reading: none missed
            signature = _signature(paths)
            if signature != last:
                last = signature
                draw()
                redraws += 1
            if finished:
                return
        except _TooSmall:  # printed once, it polled on until the logs changed, never drawing
            raise
        except (FileNotFoundError, ValueError) as err:  # nothing to draw yet: say why once
            if finished:  # and never will be
                message = f"{err} (--follow: no writer holds the logs; the runs ended)"
                raise ValueError(message) from None
            if str(err) != reported:
                reported = str(err)
                print(f"{err} (--follow: checking every {interval} s)", file=sys.stderr, flush=True)
        if max_redraws and redraws >= max_redraws:
            return
        time.sleep(interval)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m writers.plot", description=(__doc__ or "").split("\n\n")[0]
    )
    add = parser.add_argument
    add("run_dirs", nargs="+", metavar="RUN_DIR", help="run or experiment dirs")
    add("--keys", default="", help="comma-separated keys (default: loss,accuracy)")
    add(
        "--out",
        help="image to write: .png, .svg, .pdf, .jpg, ... (default plot.png, unless --terminal)",
    )
    add("--terminal", action="store_true", help="print a text plot")
    add("--smoothing", type=float, default=0.6, help="TensorBoard's, in [0, 1)")
    add("--width", type=int, default=1200, help="PNG width in pixels")
    add("--height", type=int, default=800, help="PNG height in pixels")
    add("--dpi", type=int, default=100, help="PNG dots per inch")
    add("--cols", type=int, help="text plot width (default: the terminal's)")
    add("--rows", type=int, help="text plot height in lines (default: the terminal's, less 2)")
    add("--follow", action="store_true", help="redraw when the logs grow")
    add("--interval", type=float, default=2.0, help="--follow: seconds per check")
    add(
        "--max_redraws",
        type=int,
        default=0,
        help="--follow: stop after N, or once the runs' JSONL logs are closed (0: never)",
    )
    add("--dump_series", help="write the plotted series as JSON on every draw")
    args = parser.parse_args(argv)
    sizes = {name: getattr(args, name) for name in ("width", "height", "dpi", "cols", "rows")}
    problems = _problems(args.smoothing, sizes, flag="--")
    if not args.interval > 0:
        problems.value_problem(f"--interval must be > 0 seconds, got {args.interval}")
    if args.max_redraws < 0:
        problems.value_problem(f"--max_redraws must be >= 0 (0: no limit), got {args.max_redraws}")
    paths = [("run_dir", d) for d in args.run_dirs]
    for what, path in [*paths, ("--out", args.out), ("--dump_series", args.dump_series)]:
        if problem := collapsed_url(path, what):  # 'gs:/b/p.png' wrote ./gs:/b/p.png
            problems.value_problem(problem)
    for url in filter(_storage.is_remote, args.run_dirs):  # "not a directory"; --follow waited
        problems.value_problem(_url_problem(url))
    if args.out is not None:  # checked now: --follow would wait for it forever
        try:
            _image_format(args.out)
        except ValueError as err:
            problems.value_problem(str(err).removeprefix("writers.plot: "))
    dump = args.dump_series  # checked now: it failed after drawing, "[Errno 21] Is a directory"
    if dump is not None and (dump.endswith(("/", os.sep)) or os.path.isdir(dump)):
        problems.value_problem(
            f"--dump_series {dump!r} names a directory; name the file in it, e.g. "
            f"{os.path.join(dump, 'series.json')!r}"
        )
    if problems:
        parser.error(problems.message())
    if args.out is None and not args.terminal:
        args.out = "plot.png"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    args = _parse(argv)  # None: argparse reads sys.argv[1:]
    keys = [key.strip() for key in args.keys.split(",") if key.strip()] or None  # "loss, acc"
    clear = args.follow and args.terminal and sys.stdout.isatty()
    # https://no-color.org, as the console writer: NO_COLOR turns colours off even on a TTY.
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    options = ("out", "terminal", "smoothing", "width", "height", "dpi", "cols", "rows")

    def draw() -> None:
        kwargs = {name: getattr(args, name) for name in options}
        data = plot_runs(args.run_dirs, keys, color=color, **kwargs)
        if args.dump_series:  # replaced atomically: a reader never sees half a file
            _storage.replace_file(args.dump_series, [json.dumps(data.to_json()).encode() + b"\n"])
        if data.text is not None:  # `rows` lines: plotext ends the last in a newline too
            print(("\x1b[H\x1b[2J" if clear else "") + data.text.removesuffix("\n"), flush=True)
        if data.png and not clear:
            drawn = f"{len(data.series)} series of {', '.join(data.keys)}"
            print(f"wrote {data.png} ({drawn})", flush=True)

    try:
        if args.follow:
            _follow(args.run_dirs, draw, args.interval, args.max_redraws)
        else:
            draw()
    except (OSError, ValueError, ImportError) as err:  # also --out in a read-only dir
        if isinstance(err, BrokenPipeError):  # `| head` stopped reading: nothing to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        print(err, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
