"""`NoopWriter`: accepts every call and writes nothing.

Useful on non-zero processes of a multi-host job, in tests, and as a base for
writers that only care about a few kinds of values.

Example:
  >>> import writers
  >>> w = writers.NoopWriter()
  >>> w.write_scalars(0, {"loss": 1.0})
  >>> w.close()
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from writers.interface import Array, MetricWriter, Scalar


class NoopWriter(MetricWriter):
    """A writer that discards everything; every method returns immediately.

    It checks nothing, so subclasses that override a few methods behave like a
    CLU writer with empty methods for the rest.
    """

    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Discards the values."""

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        """Discards the values."""

    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        """Discards the values."""

    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        """Discards the values."""

    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        """Discards the values."""

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Discards the values."""

    def write_histograms(
        self,
        step: int,
        arrays: Mapping[str, Array],
        num_buckets: Mapping[str, int] | None = None,
    ) -> None:
        """Discards the values."""

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Discards the values."""

    def flush(self) -> None:
        """Does nothing."""

    def close(self) -> None:
        """Does nothing."""
