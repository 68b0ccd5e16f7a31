"""Closes buffering writers at interpreter exit if the program did not (no `__del__`)."""

import atexit
import functools
import weakref
from collections.abc import Callable
from typing import Any

from absl import logging


def register(writer: Any, name: str) -> Callable[[], None]:
    """Registers `writer.close()` (through a weak reference) to run at exit; returns the hook."""
    return atexit.register(functools.partial(_close, weakref.ref(writer), name))


unregister = atexit.unregister


def _close(ref: weakref.ReferenceType[Any], name: str) -> None:
    try:
        if (writer := ref()) is not None:
            writer.close()
    except Exception:  # noqa: BLE001  (nobody is left to catch it at exit)
        logging.exception("%s failed while closing at exit", name)
