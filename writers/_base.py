"""A base class for the backends in this package: closed-state and input checks.

Backends call `self._begin(method, step, values)` at the top of every write; it
raises `WriterClosedError` after `close()` and checks the step and the keys, so
every backend rejects the same inputs with the same messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from writers._checks import Checked, check_call
from writers.interface import MetricWriter, WriterClosedError


class BaseWriter(MetricWriter):
    """`MetricWriter` with the closed flag and the shared checks of this package."""

    _closed: bool = False

    @property
    def closed(self) -> bool:
        """True once `close()` has been called."""
        return self._closed

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise WriterClosedError(
                f"{type(self).__name__}.{method}: the writer is closed. Create a new "
                "writer, or close it only after the last write."
            )

    def _begin(self, method: str, step: Any, values: Mapping[str, Any]) -> int:
        self._check_open(method)
        if type(values) is Checked:  # checked once already, at the public entry point
            return step
        return check_call(f"{type(self).__name__}.{method}", step, values)
