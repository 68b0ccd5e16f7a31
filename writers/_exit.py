"""Closes writers that hold buffered data at interpreter exit, if the user did not.

`close()` is the way to finish a writer (no `__del__` here); this is the safety
net for a script that ends without it, so the last values still reach the disk.
Writers hold only a weak reference through the hook and unregister it in `close()`.
"""

from __future__ import annotations

import atexit
import functools
import weakref
from collections.abc import Callable
from typing import Any

from absl import logging


def register(writer: Any, name: str) -> Callable[[], None]:
    """Registers `writer.close()` to run at exit; returns the hook for `unregister`."""
    hook = functools.partial(_close, weakref.ref(writer), name)
    atexit.register(hook)
    return hook


def unregister(hook: Callable[[], None]) -> None:
    """Removes a hook made by `register` (call it from `close()`)."""
    atexit.unregister(hook)


def _close(ref: weakref.ReferenceType[Any], name: str) -> None:
    writer = ref()
    if writer is None:
        return
    try:
        writer.close()
    except Exception:  # noqa: BLE001  (nobody is left to catch it at exit)
        logging.exception("%s failed while closing at exit", name)
