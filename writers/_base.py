"""Base classes of this package's writers: the closed state, the input checks, forwarding.

Every backend thus rejects the same inputs with the same messages, and implements only hooks.
"""

import abc
from collections.abc import Mapping
from typing import Any

import numpy as np

from writers import _checks
from writers.interface import Array, MetricWriter, Scalar, WriterClosedError


class BaseWriter(MetricWriter):
    """`MetricWriter` that checks each call, then calls the hook of its kind.

    Hooks get numbers as Python ints and floats, arrays as numpy arrays (images `[H, W, C]` or
    `[N, H, W, C]`, videos `[N, T, H, W, C]`, audio `[N, T, C]`) and `num_buckets` as a dict.
    """

    _closed: bool = False

    @property
    def closed(self) -> bool:
        """True once `close()` has been called."""
        return self._closed

    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None:
        self._summaries(self._begin("write_summaries", step, values), values, metadata)

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        step = self._begin("write_scalars", step, scalars)
        self._scalars(step, _checks.check_numbers(scalars, self._name("write_scalars")))

    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        step = self._begin("write_images", step, images)
        self._images(step, _checks.check_arrays(images, self._name("write_images"), "image"))

    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        step = self._begin("write_videos", step, videos)
        self._videos(step, _checks.check_arrays(videos, self._name("write_videos"), "video"))

    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        step = self._begin("write_audios", step, audios)
        clips = _checks.check_audios(audios, sample_rate, self._name("write_audios"))
        self._audios(step, clips, sample_rate)

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        step = self._begin("write_texts", step, texts)
        self._texts(step, _checks.check_texts(texts, self._name("write_texts")))

    def write_histograms(
        self, step: int, arrays: Mapping[str, Array], num_buckets: Mapping[str, int] | None = None
    ) -> None:
        step = self._begin("write_histograms", step, arrays)
        checked = _checks.check_arrays(arrays, self._name("write_histograms"), "histogram")
        self._histograms(step, checked, dict(num_buckets or {}))

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        self._check_open("write_hparams")
        _checks.check_keys(hparams, self._name("write_hparams"))
        self._hparams(hparams)

    def flush(self) -> None:
        """Makes everything written so far durable (on disk, on screen)."""
        if not self._closed:
            self._flush()

    def close(self) -> None:
        """Flushes; idempotent. Later writes raise `WriterClosedError`."""
        if not self._closed:
            self._flush()
            self._closed = True

    def _summaries(self, step: int, values: Mapping[str, Any], metadata: Any) -> None: ...
    def _scalars(self, step: int, numbers: dict[str, int | float]) -> None: ...
    def _texts(self, step: int, texts: dict[str, str]) -> None: ...
    def _histograms(self, step: int, arrays: dict[str, np.ndarray], buckets: dict) -> None: ...
    def _hparams(self, hparams: Mapping[str, Any]) -> None: ...
    def _flush(self) -> None: ...

    # Backends that record media by shape only implement `_media` instead of these three.
    def _images(self, step: int, images: dict[str, np.ndarray]) -> None:
        self._media(step, "image", images)

    def _videos(self, step: int, videos: dict[str, np.ndarray]) -> None:
        self._media(step, "video", videos)

    def _audios(self, step: int, clips: dict[str, np.ndarray], sample_rate: int) -> None:
        self._media(step, "audio", clips, sample_rate)

    def _media(
        self, step: int, kind: str, arrays: dict[str, np.ndarray], sample_rate: int | None = None
    ) -> None: ...

    def _where(self) -> str:
        return type(self).__name__

    def _name(self, method: str) -> str:
        return f"{self._where()}.{method}"

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise WriterClosedError(
                f"{self._name(method)}: the writer is closed; create a new one to write more."
            )

    def _begin(self, method: str, step: Any, values: Mapping[str, Any]) -> int:
        self._check_open(method)
        if type(values) is _checks.Checked:
            return step
        return _checks.check_call(self._name(method), step, values)


class ForwardingWriter(BaseWriter):
    """Checks each call's step and keys once, then passes it on by keyword to `_forward`."""

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        step = self._begin("write_scalars", step, scalars)
        self._forward("write_scalars", step=step, scalars=scalars)

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

    # `BaseWriter` passes summaries and hparams to these hooks unconverted.
    def _summaries(self, step: int, values: Mapping[str, Any], metadata: Any) -> None:
        self._forward("write_summaries", step=step, values=values, metadata=metadata)

    def _hparams(self, hparams: Mapping[str, Any]) -> None:
        self._forward("write_hparams", hparams=hparams)

    @abc.abstractmethod
    def _forward(self, method: str, **kwargs: Any) -> None:
        """Runs `method(**kwargs)` on the wrapped writer(s)."""
