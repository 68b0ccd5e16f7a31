"""Base classes of this package's writers: the closed state, the input checks, forwarding.

Every write starts with `self._begin(method, step, values)`: it raises `WriterClosedError`
after `close()` and checks the step and the keys (skipped for a `_checks.Checked` mapping,
checked once already at the public entry point), so every writer rejects the same inputs
with the same messages.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

from writers import _checks
from writers.interface import Array, MetricWriter, Scalar, WriterClosedError


class BaseWriter(MetricWriter):
    """`MetricWriter` with the closed flag and the shared checks of this package."""

    _closed: bool = False

    @property
    def closed(self) -> bool:
        """True once `close()` has been called."""
        return self._closed

    def _where(self) -> str:
        return type(self).__name__

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise WriterClosedError(
                f"{self._where()}.{method}: the writer is closed. Create a new writer, or close "
                "it only after the last write."
            )

    def _begin(self, method: str, step: Any, values: Mapping[str, Any]) -> int:
        self._check_open(method)
        if type(values) is _checks.Checked:
            return step
        return _checks.check_call(f"{self._where()}.{method}", step, values)

    def _begin_hparams(self, hparams: Mapping[str, Any]) -> None:
        self._check_open("write_hparams")
        _checks.check_keys(hparams, f"{self._where()}.write_hparams")


class ForwardingWriter(BaseWriter):
    """Checks each call once, then passes it on by keyword to `_forward(method, **kwargs)`."""

    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None:
        step = self._begin("write_summaries", step, values)
        self._forward("write_summaries", step=step, values=values, metadata=metadata)

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        self._forward(
            "write_scalars", step=self._begin("write_scalars", step, scalars), scalars=scalars
        )

    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        self._forward("write_images", step=self._begin("write_images", step, images), images=images)

    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        self._forward("write_videos", step=self._begin("write_videos", step, videos), videos=videos)

    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        step = self._begin("write_audios", step, audios)
        self._forward("write_audios", step=step, audios=audios, sample_rate=sample_rate)

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        self._forward("write_texts", step=self._begin("write_texts", step, texts), texts=texts)

    def write_histograms(
        self, step: int, arrays: Mapping[str, Array], num_buckets: Mapping[str, int] | None = None
    ) -> None:
        step = self._begin("write_histograms", step, arrays)
        self._forward("write_histograms", step=step, arrays=arrays, num_buckets=num_buckets)

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        self._begin_hparams(hparams)
        self._forward("write_hparams", hparams=hparams)

    @abc.abstractmethod
    def _forward(self, method: str, **kwargs: Any) -> None:
        """Runs `method(**kwargs)` on the wrapped writer(s)."""
