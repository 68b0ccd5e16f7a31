"""`ConsoleWriter`: a readable block per write call for people watching a terminal.

Each call prints a header with the step (with `total_steps`: `step 300/1,000 (30.0%)`, steps/s
and an ETA, measured from the first step's last scalars on so compilation does not skew
them), then one line per value, keys aligned and grouped by prefix (un-prefixed keys first).
Numbers show 4 significant digits (0.99996 as `1.000`, an exact 1.0 as `1`), integers and
numbers from 1,000 to 1e15 whole with thousands separators, NaN as `NaN`; other kinds show
their shapes (histograms: count, min, mean, max). Colour (via `rich`) only on a terminal or
with `color=True`, so CI logs stay plain.

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

import contextlib
import functools
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

import numpy as np

from writers import _checks, _encode
from writers._base import BaseWriter


class ConsoleWriter(BaseWriter):
    """Prints one aligned block per write call to a terminal or log stream.

    Args:
      stream: Where to print (default `sys.stdout`, looked up at each write; with stdout
        closed, `>&-`, nothing is printed, as by `print()`).
      collection: Name shown in every header, e.g. `train`.
      total_steps: Last step of the run; enables the progress part of the header.
      color: Force colours on or off; None: only on a TTY with NO_COLOR unset (once per stream).
      clock: Monotonic seconds, for steps/s and the ETA (patch it in tests).

    Raises:
      TypeError: a setting of the wrong type (`total_steps` not an int, a `stream` without
        `write()`, a `clock` that is not callable).
      ValueError: `total_steps` below 1.
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
        options = dict(stream=stream, collection=collection, total_steps=total_steps)
        _checks.check_options("ConsoleWriter", **options, color=color, clock=clock)
        self._stream = stream
        # Escapes in it shown, not run, as in a key: a line break split every header.
        self._collection = collection and _KEY_CONTROL.sub(_escaped, collection)
        self._total = total_steps
        self._color = color
        self._clock = clock
        self._first: tuple[float, int] | None = None  # (time, step) of the first write
        self._console: tuple[IO[str], Any] | None = None  # (stream, its rich Console or None)
        self._reader_gone = False  # the pipe's reader closed it: nothing written can be read

    def _summaries(self, step: int, values: Mapping[str, Any], metadata: Any) -> None:
        arrays = {k: np.asarray(v) for k, v in values.items()}
        self._block(step, {k: f"tensor {list(a.shape)} {a.dtype}" for k, a in arrays.items()})

    def _scalars(self, step: int, numbers: dict[str, int | float]) -> None:
        self._block(step, _numbers(numbers), numbers)

    def _media(
        self, step: int, kind: str, arrays: dict[str, np.ndarray], sample_rate: int | None = None
    ) -> None:
        rate = "" if sample_rate is None else f" @ {sample_rate:,} Hz"
        self._block(step, {k: f"{kind} {list(a.shape)}{rate}" for k, a in arrays.items()})

    def _texts(self, step: int, texts: dict[str, str]) -> None:
        # A model's text may hold terminal escapes (clear screen, move the cursor): shown, not run.
        # A Windows line break is one: its "\r" was shown as an escape at every line's end.
        # A final line break ends the last line (a file's text, `print`'s): it opened a blank
        # line inside the block, between this text and the next key.
        shown = {
            k: _CONTROL.sub(_escaped, v.replace("\r\n", "\n").removesuffix("\n"))
            for k, v in texts.items()
        }
        self._block(step, shown)

    def _histograms(self, step: int, arrays: dict[str, np.ndarray], buckets: dict) -> None:
        lines = {}
        for key, arr in arrays.items():
            flat = arr.astype(np.float64).reshape(-1)
            stats = (("min", flat.min()), ("mean", _encode.mean(flat)), ("max", flat.max()))
            parts = " ".join(f"{name}={_number(float(v))}" for name, v in stats)
            lines[key] = f"histogram n={flat.size:,} {parts}"
        self._block(step, lines)

    def _hparams(self, hparams: Mapping[str, Any]) -> None:
        # As texts: escapes shown, not run; lone surrogates (undecodable file names) escaped.
        # A NaN reads `NaN`, as in a scalar's line (str() gives `nan`), bfloat16 and jax too.
        # A float reads as the other writers write it: a bfloat16 0.1 as 0.1 (str(): 0.100098).
        with np.printoptions(legacy="1.25"):  # [64, 32], not [np.int64(64), ...], as written
            texts = {k: _hparam_text(v) for k, v in hparams.items()}
        shown = {k: _CONTROL.sub(_escaped, _checks.plain_str(v)) for k, v in texts.items()}
        if shown:  # an empty call: nothing to show, as for every other kind
            self._print("hyperparameters", shown)

    def _flush(self) -> None:
        if not self._reader_gone and (stream := self._out()) is not None:
            with self._broken_pipe(stream):
                stream.flush()  # `close()` leaves the stream open: it is not ours

    @contextlib.contextmanager
    def _broken_pipe(self, stream: IO[str]) -> Iterator[None]:
        """Ends this writer's output once a pipe's reader is gone (`train.py | head`): raises
        the first `BrokenPipeError`, then writes nothing. As Python's docs advise, the stream's
        descriptor then points at /dev/null, or the flush at exit fails too (exit status 120).
        """
        try:
            yield
        except BrokenPipeError as err:
            self._reader_gone = True
            with contextlib.suppress(OSError, ValueError, AttributeError):  # no descriptor
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)
            raise BrokenPipeError(
                err.errno,
                "ConsoleWriter: the reader of its output closed the pipe (e.g. `| head`); it "
                "prints nothing more, and the other writers go on",
            ) from err

    def _out(self) -> IO[str] | None:
        # sys.stdout is None when stdout is closed (`train.py >&-`): print() then writes
        # nothing, and so does this writer, instead of failing at every write.
        return self._stream if self._stream is not None else sys.stdout

    def _block(
        self, step: int, lines: Mapping[str, str], numbers: Mapping[str, float] | None = None
    ) -> None:
        if not lines:  # an empty call: nothing to show (JSONL writes no line either)
            return
        now, total = self._clock(), self._total
        # Rates count from the last scalars of the first step that had some (a summary, or
        # `timing/compilation_seconds`), not from a config text written before compiling.
        if numbers is not None and (self._first is None or self._first[1] == step):
            self._first = (now, step)
        t0, s0 = self._first or (now, step)
        parts = [f"step {step:,}"]
        if total is not None:
            parts[0] += f"/{total:,} ({math.floor(1000 * step / total) / 10:.1f}%)"
        if step > s0 and now > t0:
            rate = (step - s0) / (now - t0)
            parts.append(f"{_number(rate)} steps/s")
            if total is not None and step < total:
                parts.append(f"ETA {_duration((total - step) / rate)}")
        self._print(" | ".join(parts), lines, numbers)

    def _print(
        self, head: str, lines: Mapping[str, str], numbers: Mapping[str, float] | None = None
    ) -> None:
        stream = self._out()
        if self._reader_gone or stream is None:
            return
        header = f"{head} | {self._collection}" if self._collection else head
        if self._console is None or self._console[0] is not stream:  # colour decided once
            color = _auto_color(stream) if self._color is None else self._color
            self._console = (stream, _rich_console(stream) if color else None)
        console = self._console[1]
        layout = _layout(tuple(lines), _encoding(stream))
        # Continuation lines of a multi-line value are indented under the value column
        # (blank ones stay empty, as does an empty value's key line: no trailing spaces).
        indent = "\n" + " " * (min(_cells(layout[0][1]), _KEY_COLUMNS) + 4) if layout else ""
        rows = [  # (key, its column with the gap, value)
            (key, padded + "  " if v[:1] not in ("", "\n") else padded.rstrip(" "), v)
            for key, padded in layout
            for v in (_continued(lines[key], indent),)
        ]
        if console is None:  # plain text, and no rendering cost
            body = "".join(f"\n  {padded}{value}" for _, padded, value in rows)
            with self._broken_pipe(stream):
                stream.write(_encodable(header + body + "\n", stream))
            return
        nums = numbers or {}
        pieces = [(header, "bold")]  # (text, style); non-finite numbers in red
        for key, padded, value in rows:
            bad = key in nums and not (isinstance(nums[key], int) or math.isfinite(nums[key]))
            pieces += [("\n  ", ""), (padded, "cyan"), (value, "bold red" if bad else "")]
        pieces = [(_encodable(text, stream), style) for text, style in pieces]
        from rich.text import Text

        with self._broken_pipe(stream):
            console.print(Text.assemble(*pieces))


_KEY_COLUMNS = 48  # the value column; a longer key is followed by two spaces only
# Control characters, and the bidi controls that reorder what follows them on a terminal.
_BIDI = "\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_BIDI}]")  # all but tab, newline
_LINE_BREAK = re.compile(r"\n(?=[^\n])")  # one that a non-empty line follows
_KEY_CONTROL = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{_BIDI}]")  # a key is one line: all


def _encodable(text: str, stream: IO[str]) -> str:
    """`text` with what `stream`'s encoding cannot write as escapes (`caf\\xe9` on ASCII, as
    Python's own stderr does): a non-UTF-8 stream (PYTHONIOENCODING=ascii, a latin-1 locale)
    raised UnicodeEncodeError at every write with such a key, one writer failure each."""
    return _in_encoding(text, _encoding(stream))


def _encoding(stream: IO[str]) -> str | None:
    """`stream`'s encoding where it is not UTF-8 (what it cannot write is escaped), else None."""
    encoding = getattr(stream, "encoding", None)
    if not isinstance(encoding, str) or encoding.lower().replace("-", "") == "utf8":
        return None
    return encoding


def _in_encoding(text: str, encoding: str | None) -> str:
    """`text` with what `encoding` cannot write as escapes; None: `text` as it is."""
    if encoding is None:
        return text
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:  # an encoding Python does not know: the stream's own concern
        pass
    return text


def _continued(value: str, indent: str) -> str:
    return _LINE_BREAK.sub(indent, value) if "\n" in value else value  # scalars: no regex


def _escaped(match: re.Match[str]) -> str:
    return repr(match.group())[1:-1]  # "\x1b", "\r"


@functools.lru_cache(maxsize=1_000)  # summaries repeat the same keys (in call order) every step
def _layout(keys: tuple[str, ...], encoding: str | None = None) -> list[tuple[str, str]]:
    """Keys, un-prefixed ones first, then grouped by their first `/` part; each padded to
    the same width on screen (a CJK character takes two columns), at most `_KEY_COLUMNS`.
    Padded as written in `encoding` (not UTF-8): `caf\\xe9` takes 7 columns, not 4."""
    # Escapes in a key: shown, not run.
    shown = {k: _in_encoding(_KEY_CONTROL.sub(_escaped, k), encoding) for k in keys}
    width = min(max(map(_cells, shown.values()), default=0), _KEY_COLUMNS)
    return [
        (k, shown[k] + " " * (width - _cells(shown[k])))
        for k in sorted(keys, key=lambda k: (k.partition("/")[0] if "/" in k else "", k))
    ]


def _cells(text: str) -> int:
    """Columns `text` takes on a terminal."""
    from rich.cells import cell_len

    return cell_len(text)


def _rich_console(stream: IO[str]) -> Any:
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # Called inside rich's `except BrokenPipeError`: re-raise it for `_broken_pipe`.
            # Rich's default would end the whole process (SystemExit(1)) from this thread.
            raise  # noqa: PLE0704

    return _Console(file=stream, force_terminal=True, no_color=False, width=10_000, **_RICH)


# Values are plain text, not markup, emoji or code: tell rich not to guess.
_RICH: dict[str, Any] = dict(
    force_jupyter=False, highlight=False, markup=False, emoji=False, soft_wrap=True
)


def _auto_color(stream: IO[str]) -> bool:
    # https://no-color.org: NO_COLOR turns colours off even on a TTY.
    try:
        return bool(stream.isatty()) and not os.environ.get("NO_COLOR")
    except (AttributeError, ValueError):  # no isatty(), or a closed stream
        return False


def _number(value: int | float) -> str:
    """Formats a scalar: ints exactly, floats that round to 1,000 or more whole with separators
    (`12,346`, not `1.235e+04`: a `Sum` of token counts reads exactly), others `.4g`, `NaN`,
    `inf`, `-inf`; from 1e15 on (or what rounds to it), `.4g` again.

    Example:
      >>> _number(0.123456), _number(12345.6), _number(123456.0), _number(12345), _number(2e15)
      ('0.1235', '12,346', '123,456', '12,345', '2e+15')
      >>> _number(0.99996), _number(-9.9996), _number(1.0)
      ('1.000', '-10.00', '1')
    """
    if isinstance(value, int):
        return f"{value:,}"
    if math.isfinite(value):
        # From 999.95 on, `.4g` reads `1000`: whole, as `1,000` is; what rounds to 1e15 reads
        # `1e+15`, as 1e15 does.
        return f"{value:,.0f}" if _WHOLE <= abs(value) < _HUGE else _short(value)
    if math.isnan(value):
        return "NaN"
    return "inf" if value > 0 else "-inf"


_WHOLE = 999.95  # the least float `.4g` rounds to 1000
_HUGE = 999_999_999_999_999.5  # the least float `,.0f` rounds to 1,000,000,000,000,000


def _short(value: float) -> str:
    """`.4g`, with its trailing zeros where it reads whole but `value` is not: 0.99996 read
    `1`, as an exact 1 does; it reads `1.000`."""
    text = f"{value:.4g}"
    if "." in text or "e" in text or value == int(value):
        return text
    return f"{value:#.4g}"


def _hparam_text(value: Any) -> str:
    """A hyperparameter as shown: a float as written (`_encode.hparam`: the shortest decimal of
    its dtype, NaN as `NaN`), anything else as its `str()`."""
    number = _encode.hparam(value)
    if not isinstance(number, float):
        return str(value)
    return "NaN" if math.isnan(number) else str(number)


def _numbers(values: Mapping[str, int | float]) -> dict[str, str]:
    """`_number(value)` for every item; a float below 1,000 in size takes a fast path."""
    return {
        key: _short(value) if type(value) is float and -_WHOLE < value < _WHOLE else _number(value)
        for key, value in values.items()
    }


def _duration(seconds: float) -> str:
    """Formats seconds as `45s`, `12m 05s` or `3h 07m`.

    Example:
      >>> _duration(45.2), _duration(725), _duration(11220)
      ('45s', '12m 05s', '3h 07m')
    """
    total = int(round(seconds))
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"
