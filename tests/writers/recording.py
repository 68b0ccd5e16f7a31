"""A real writer for tests that keeps every call it gets, to check what wrappers forward."""

from __future__ import annotations

from typing import Any

from writers import MetricWriter


class RecordingWriter(MetricWriter):
    """A real MetricWriter that keeps every call as (method, args, kwargs)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def _record(self, method: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((method, args, kwargs))

    def write_summaries(self, step, values, metadata=None):
        self._record("write_summaries", step, dict(values), metadata=metadata)

    def write_scalars(self, step, scalars):
        self._record("write_scalars", step, dict(scalars))

    def write_images(self, step, images):
        self._record("write_images", step, dict(images))

    def write_videos(self, step, videos):
        self._record("write_videos", step, dict(videos))

    def write_audios(self, step, audios, *, sample_rate):
        self._record("write_audios", step, dict(audios), sample_rate=sample_rate)

    def write_texts(self, step, texts):
        self._record("write_texts", step, dict(texts))

    def write_histograms(self, step, arrays, num_buckets=None):
        self._record("write_histograms", step, dict(arrays), num_buckets=num_buckets)

    def write_hparams(self, hparams):
        self._record("write_hparams", dict(hparams))

    def flush(self):
        self._record("flush")

    def close(self):
        self._record("close")
