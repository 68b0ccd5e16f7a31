"""`ConsoleWriter`: a readable block per summary for people watching a terminal.

Each write call prints one block: a header with the step (and, when
`total_steps` is known, a progress line: `step 300/1,000 (30.0%)`, steps/s and an
ETA), then one line per value with the keys aligned and grouped by prefix
(un-prefixed keys first, then `eval/...`, `timing/...`, ...). Numbers are for
humans: 4 significant digits, integers and rates of 1,000 or more with thousands
separators, NaN as `NaN`.

Steps/s and the ETA are measured from the first write onward, so the first window,
which usually includes compilation, does not skew them; they appear from the
second write on. Colour output is rendered with `rich`, only when the stream is
a terminal (or `color=True`); otherwise the same text is written plainly, so CI
logs stay clean (and writing costs no rendering).

Example:
  >>> import io, writers
  >>> out = io.StringIO()
  >>> w = writers.ConsoleWriter(out, collection="train")
  >>> w.write_scalars(10, {"loss": 0.123456, "timing/seqs_per_second": 12345.6})
  >>> print(out.getvalue(), end="")
  step 10 | train
    loss                    0.1235
    timing/seqs_per_second  12,346
"""

from __future__ import annotations

import numbers
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

import numpy as np

from writers import _checks, _format
from writers._base import BaseWriter
from writers.interface import Array, Scalar


class ConsoleWriter(BaseWriter):
    """Prints one aligned block per write call to a terminal or log stream.

    Args:
      stream: Where to print (default `sys.stdout`, looked up at each write).
      collection: Name shown in every header, e.g. `train`.
      total_steps: Last step of the run; enables the progress part of the header.
      color: Force colours on or off; None means "only if the stream is a TTY and
        the NO_COLOR environment variable is unset", decided once (at
        construction for a given `stream`, at the first write to each new
        `sys.stdout` otherwise), not on every write.
      clock: Monotonic seconds, for steps/s and the ETA (patch it in tests).

    Raises:
      ValueError: `total_steps` is not a positive int.
    """

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        collection: str | None = None,
        total_steps: int | None = None,
        color: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if total_steps is not None and (
            isinstance(total_steps, bool)
            or not isinstance(total_steps, numbers.Integral)
            or total_steps < 1
        ):
            raise ValueError(
                f"ConsoleWriter: total_steps must be a positive int or None, got {total_steps!r}."
            )
        self._stream = stream
        self._collection = collection
        self._total = total_steps
        self._color = color
        self._clock = clock
        self._first: tuple[float, int] | None = None  # (time, step) of the first write
        self._last: tuple[float, int] | None = None
        self._rich: tuple[IO[str], Any] | None = None  # (stream, rich Console) for colour
        # (stream, colour on it): isatty() and the environment are read once per stream.
        self._auto: tuple[IO[str], bool] | None = None
        if color is None and stream is not None:
            self._auto = (stream, _auto_color(stream))

    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Prints the shape and dtype of every tensor."""
        step = self._begin("write_summaries", step, values)
        arrays = {k: np.asarray(v) for k, v in values.items()}
        self._block(step, {k: f"tensor {list(a.shape)} {a.dtype}" for k, a in arrays.items()})

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        """Prints every scalar, formatted for humans (see module docstring)."""
        step = self._begin("write_scalars", step, scalars)
        numbers = _checks.check_numbers(scalars, "ConsoleWriter.write_scalars")
        self._block(step, _format.numbers(numbers), numbers)

    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        """Prints the shape of every image array."""
        step = self._begin("write_images", step, images)
        arrays = _checks.check_images(images, "ConsoleWriter.write_images")
        self._block(step, {k: f"image {list(a.shape)}" for k, a in arrays.items()})

    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        """Prints the shape of every video array."""
        step = self._begin("write_videos", step, videos)
        arrays = _checks.check_videos(videos, "ConsoleWriter.write_videos")
        self._block(step, {k: f"video {list(v.shape)}" for k, v in arrays.items()})

    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        """Prints the shape and sample rate of every audio array."""
        step = self._begin("write_audios", step, audios)
        arrays = _checks.check_audios(audios, sample_rate, "ConsoleWriter.write_audios")
        self._block(
            step, {k: f"audio {list(v.shape)} @ {sample_rate:,} Hz" for k, v in arrays.items()}
        )

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Prints every text; continuation lines are indented under the value column."""
        step = self._begin("write_texts", step, texts)
        self._block(step, _checks.check_texts(texts, "ConsoleWriter.write_texts"))

    def write_histograms(
        self,
        step: int,
        arrays: Mapping[str, Array],
        num_buckets: Mapping[str, int] | None = None,
    ) -> None:
        """Prints count, min, mean and max of every array."""
        step = self._begin("write_histograms", step, arrays)
        checked = _checks.check_histograms(arrays, "ConsoleWriter.write_histograms")
        lines = {}
        for key, arr in checked.items():
            flat = arr.astype(np.float64).reshape(-1)
            stats = (("min", flat.min()), ("mean", flat.mean()), ("max", flat.max()))
            parts = " ".join(f"{name}={_format.number(key, float(v))}" for name, v in stats)
            lines[key] = f"histogram n={flat.size:,} {parts}"
        self._block(step, lines)

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Prints a `hyperparameters` block with every value."""
        self._check_open("write_hparams")
        _checks.check_keys(hparams, "ConsoleWriter.write_hparams")
        self._print(self._header_text("hyperparameters"), {k: str(v) for k, v in hparams.items()})

    def flush(self) -> None:
        """Flushes the stream."""
        if not self._closed:
            self._out().flush()

    def close(self) -> None:
        """Flushes the stream (which stays open: it is not ours); idempotent."""
        if not self._closed:
            self.flush()
            self._closed = True

    def _out(self) -> IO[str]:
        return self._stream if self._stream is not None else sys.stdout

    def _block(
        self, step: int, lines: Mapping[str, str], numbers: Mapping[str, float] | None = None
    ) -> None:
        self._observe(step)
        self._print(self._header_text(self._progress(step)), lines, numbers)

    def _observe(self, step: int) -> None:
        now = self._clock()
        if self._first is None:
            self._first = (now, step)
        self._last = (now, step)

    def _progress(self, step: int) -> str:
        parts = [f"step {step:,}" if self._total is None else _progress_step(step, self._total)]
        rate = self._rate()
        if rate is not None:
            parts.append(f"{_format.number('steps_per_second', rate)} steps/s")
            if self._total is not None and step < self._total:
                parts.append(f"ETA {_format.duration((self._total - step) / rate)}")
        return " | ".join(parts)

    def _rate(self) -> float | None:
        if self._first is None or self._last is None:
            return None
        (t0, s0), (t1, s1) = self._first, self._last
        if s1 <= s0 or t1 <= t0:
            return None
        return (s1 - s0) / (t1 - t0)

    def _header_text(self, head: str) -> str:
        return f"{head} | {self._collection}" if self._collection else head

    def _print(
        self, header: str, lines: Mapping[str, str], numbers: Mapping[str, float] | None = None
    ) -> None:
        stream = self._out()
        color = self._color
        if color is None:
            if self._auto is None or self._auto[0] is not stream:
                self._auto = (stream, _auto_color(stream))
            color = self._auto[1]
        layout = _layout(tuple(lines))  # keys in display order, padded to one width
        indent = "\n" + " " * (len(layout[0][1]) + 4) if layout else ""
        if not color:  # CI logs and files: no terminal codes, and no rendering cost.
            body = "".join(
                f"\n  {padded}  " + lines[key].replace("\n", indent) for key, padded in layout
            )
            stream.write(header + body + "\n")
            return
        # (text, style) pieces; colour output styles them (non-finite numbers in red).
        nums = numbers or {}
        pieces = [(header, "bold")]
        for key, padded in layout:
            bad = not _checks.is_finite_number(nums[key]) if key in nums else False
            value = lines[key].replace("\n", indent)
            pieces += [("\n  ", ""), (padded, "cyan"), ("  " + value, "bold red" if bad else "")]
        from rich.text import Text

        self._console(stream).print(Text.assemble(*pieces))

    def _console(self, stream: IO[str]) -> Any:
        if self._rich is None or self._rich[0] is not stream:
            from rich.console import Console

            console = Console(
                file=stream,
                force_terminal=True,
                color_system="auto",
                no_color=False,
                force_jupyter=False,
                highlight=False,
                markup=False,
                emoji=False,
                soft_wrap=True,
                width=10_000,
            )
            self._rich = (stream, console)
        return self._rich[1]


def _layout(keys: tuple[str, ...]) -> list[tuple[str, str]]:
    """Keys in display order (`_format.group_key`), each with its padded column text."""
    layout = _LAYOUTS.get(keys)
    if layout is None:
        width = max(map(len, keys), default=0)
        layout = [(k, k.ljust(width)) for k in sorted(keys, key=_format.group_key)]
        if len(_LAYOUTS) >= 1_000:  # many distinct key sets: keep memory bounded
            _LAYOUTS.clear()
        _LAYOUTS[keys] = layout
    return layout


# Key tuple (in call order) -> `_layout`: summaries repeat the same keys every step.
_LAYOUTS: dict[tuple[str, ...], list[tuple[str, str]]] = {}


def _progress_step(step: int, total: int) -> str:
    percent = 100.0 * step / total if total > 0 else 100.0
    return f"step {step:,}/{total:,} ({percent:.1f}%)"


def _auto_color(stream: IO[str]) -> bool:
    # https://no-color.org: NO_COLOR turns colours off even on a TTY.
    return _isatty(stream) and not os.environ.get("NO_COLOR")


def _isatty(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # closed stream
        return False
