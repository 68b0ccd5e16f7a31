"""The drawing half of `writers.plot`: a PNG with matplotlib, a text plot with plotext."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from writers import _storage

if TYPE_CHECKING:
    from writers.plot import Series

_EXTRA = "pip install 'jax-metrics-manager[plot]'"


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
    """Writes a PNG to `path` (atomically), a panel per key (`raw`: raw values faint behind)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError as err:
        raise ImportError(f"writers.plot: a PNG needs matplotlib; {_EXTRA}") from err
    ncols = 1 if len(keys) <= 3 else 2
    # A `Figure` with the Agg canvas, not pyplot: no global state, no display.
    figure = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(math.ceil(len(keys) / ncols), ncols, squeeze=False).ravel()
    # One color per run, the same in every panel (matplotlib's default cycle).
    colors = {run: f"C{i % 10}" for i, run in enumerate(dict.fromkeys(s.run for s in series))}
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
    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=dpi, format="png")
    _storage.replace_file(path, [buffer.getvalue()])


def text(keys: Sequence[str], series: Sequence[Series], cols: int, rows: int, color: bool) -> str:
    """A `cols` x `rows` character plot of the smoothed lines, panels stacked (no NaN/inf)."""
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
