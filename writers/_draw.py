"""The drawing half of `writers.plot`: a PNG with matplotlib, a text plot with plotext.

Both take the keys (one panel each) and the series of `writers.plot.load_series`. The PNG
is drawn on a `matplotlib.figure.Figure` with the Agg canvas: no pyplot, so no global
backend or figure registry is touched, and it works with no display. matplotlib and
plotext are imported only here, on the first drawing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from writers.plot import Series

_EXTRA = "pip install 'jax-metrics-manager[plot]'"


def _colors(series: Sequence[Series]) -> dict[str, str]:
    """One color per run, the same in every panel (matplotlib's default cycle)."""
    palette = [f"C{i}" for i in range(10)]
    runs = list(dict.fromkeys(s.run for s in series))
    return {run: palette[i % len(palette)] for i, run in enumerate(runs)}


def png(
    keys: Sequence[str],
    series: Sequence[Series],
    path: str,
    *,
    width: int,
    height: int,
    dpi: int,
    raw: bool,
) -> None:
    """Writes a `width` x `height` pixel PNG to `path` (atomically: a temporary file, renamed).

    Args:
      keys: one panel per key, in order (one column up to 3 keys, else two).
      series: the lines; each is drawn in its key's panel.
      path: the PNG file.
      width: pixels.
      height: pixels.
      dpi: dots per inch (fonts and lines scale with it).
      raw: also draw the unsmoothed values, faintly, behind the smoothed line.

    Raises:
      ImportError: matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError as err:
        raise ImportError(f"writers.plot: a PNG needs matplotlib; {_EXTRA}") from err
    ncols = 1 if len(keys) <= 3 else 2
    nrows = math.ceil(len(keys) / ncols)
    figure = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(nrows, ncols, squeeze=False).ravel()
    colors = _colors(series)
    for ax, key in zip(axes, keys, strict=False):
        for s in (s for s in series if s.key == key):
            if raw:
                ax.plot(s.steps, s.values, color=colors[s.run], alpha=0.25, linewidth=1)
            ax.plot(s.steps, s.smoothed, color=colors[s.run], linewidth=1.5, label=s.label)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp")
    figure.savefig(tmp, dpi=dpi, format="png")
    os.replace(tmp, path)  # `--follow` readers never see a half-written PNG


def text(keys: Sequence[str], series: Sequence[Series], cols: int, rows: int, color: bool) -> str:
    """A text plot `cols` x `rows` characters, one panel per key stacked, smoothed lines.

    Non-finite values are left out (plotext cannot place them).

    Raises:
      ImportError: plotext is not installed.
    """
    try:
        import plotext  # noqa: PLC0415
    except ImportError as err:
        raise ImportError(f"writers.plot: a terminal plot needs plotext; {_EXTRA}") from err
    figure = plotext.figure  # plotext draws on one module-wide figure: reset it first
    figure.clear.all()
    figure.plot_size(cols, rows)
    if len(keys) > 1:
        figure.subplots(len(keys), 1)
    for row, key in enumerate(keys, start=1):
        panel = figure.subplot(row, 1) if len(keys) > 1 else figure
        panel.title(key)
        for s in (s for s in series if s.key == key):
            finite = np.isfinite(s.smoothed)
            if not finite.any():
                continue
            signal = panel.signal(s.steps[finite].tolist(), s.smoothed[finite].tolist())
            signal.label(s.label)
            signal.lines()
            panel.draw(signal)
    return figure.build().string(colorless=not color)
