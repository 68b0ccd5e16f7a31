"""`NoopWriter`: accepts every call and writes nothing.

For non-zero processes of a multi-host job, tests, and as a base class: it checks nothing, so a
subclass overriding a few methods acts like a CLU writer with empty methods for the rest.

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
    """A writer that discards everything; every method returns immediately."""

    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None: ...
    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None: ...
    def write_images(self, step: int, images: Mapping[str, Array]) -> None: ...
    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None: ...
    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None: ...
    def write_texts(self, step: int, texts: Mapping[str, str]) -> None: ...
    def write_histograms(
        self, step: int, arrays: Mapping[str, Array], num_buckets: Mapping[str, int] | None = None
    ) -> None: ...
    def write_hparams(self, hparams: Mapping[str, Any]) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
