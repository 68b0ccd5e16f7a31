"""Number and duration formatting for people reading a terminal (`ConsoleWriter`)."""

from __future__ import annotations

import math
import re

# Keys whose values are rates ("per second"), shown as whole numbers with
# thousands separators once they reach 1,000: 12,345 seqs/s reads better than 1.235e+04.
_RATE_KEY = re.compile(r"per_sec(ond)?|_per_s$|/s$|throughput", re.IGNORECASE)


def is_rate(key: str) -> bool:
    """True when `key` names a rate, e.g. `timing/seqs_per_second`."""
    return bool(_RATE_KEY.search(key))


def number(key: str, value: int | float) -> str:
    """Formats a scalar for a human: 4 significant digits, separators for big rates.

    Ints are shown exactly with thousands separators; NaN as `NaN`; infinities as
    `inf` and `-inf`; rates of 1,000 or more as whole numbers with separators;
    every other float with 4 significant digits (`.4g`).

    Example:
      >>> number("loss", 0.123456), number("timing/seqs_per_second", 12345.6), number("n", 12345)
      ('0.1235', '12,346', '12,345')
    """
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if is_rate(key) and abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def duration(seconds: float) -> str:
    """Formats seconds as `45s`, `12m 05s` or `3h 07m`.

    Example:
      >>> duration(45.2), duration(725), duration(11220)
      ('45s', '12m 05s', '3h 07m')
    """
    total = int(round(seconds))
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def group_key(key: str) -> tuple[str, str]:
    """Sort key that puts un-prefixed names first, then groups by the first `/` part."""
    prefix, sep, _ = key.partition("/")
    return (prefix if sep else "", key)
