"""Number and duration formatting for people reading a terminal (`ConsoleWriter`)."""

import functools
import math
import re
from collections.abc import Mapping

# Rates ("per second") of 1,000 or more read better as 12,345 than as 1.235e+04.
_RATE_KEY = re.compile(r"per_sec(ond)?|_per_s$|/s$|throughput", re.IGNORECASE)


@functools.lru_cache(maxsize=100_000)  # the same keys come back at every summary
def is_rate(key: str) -> bool:
    return bool(_RATE_KEY.search(key))


def number(key: str, value: int | float) -> str:
    """Formats a scalar: ints exactly, rates >= 1,000 whole, floats `.4g`, `NaN`, `inf`, `-inf`.

    Example:
      >>> number("loss", 0.123456), number("timing/seqs_per_second", 12345.6), number("n", 12345)
      ('0.1235', '12,346', '12,345')
    """
    if isinstance(value, int):
        return f"{value:,}"
    if math.isfinite(value):
        return f"{value:,.0f}" if abs(value) >= 1000 and is_rate(key) else f"{value:.4g}"
    if math.isnan(value):
        return "NaN"
    return "inf" if value > 0 else "-inf"


def numbers(values: Mapping[str, int | float]) -> dict[str, str]:
    """`number(key, value)` for every item; a float below 1,000 in size takes a fast path.

    Example:
      >>> numbers({"loss": 0.123456, "n": 12345})
      {'loss': '0.1235', 'n': '12,345'}
    """
    return {
        key: f"{value:.4g}"
        if type(value) is float and -1000.0 < value < 1000.0
        else number(key, value)
        for key, value in values.items()
    }


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
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


def group_key(key: str) -> tuple[str, str]:
    """Sort key that puts un-prefixed names first, then groups by the first `/` part."""
    prefix, sep, _ = key.partition("/")
    return (prefix if sep else "", key)
