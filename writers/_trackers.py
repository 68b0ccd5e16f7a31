"""What `WandbWriter` and `MlflowWriter` share: the optional import, process 0, the write methods."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from writers import _checks, _encode
from writers._base import BaseWriter
from writers.interface import Array, Scalar


def import_extra(module: str, extra: str, writer: str) -> ModuleType:
    """Imports an optional tracker library, or raises an ImportError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{writer} needs the {module!r} package, which is not installed ({err}). Install "
            f"the extra: pip install 'jax-metrics-manager[{extra}]'."
        ) from err


class TrackerWriter(BaseWriter):
    """Checks every call, then hands the converted values to one hook per kind.

    Subclasses set `_tracker` (the service's name in messages) and implement `_scalars`,
    `_images` (uint8 `[N, H, W, C]` per key; videos arrive as filmstrips), `_audios`,
    `_texts`, `_histograms`, `_hparams` and `_end_run`. On processes other than 0 the
    hooks still run (so every process rejects the same keys) and log nothing.
    """

    _tracker = ""
    _owned = False  # close() ends the run: this writer started or resumed it

    def _start(self, resume_step: int | None, process_index: int | None) -> tuple[int | None, bool]:
        """The checked `resume_step`, and whether this process talks to the tracker (index 0)."""
        if resume_step is not None:
            resume_step = _checks.check_step(resume_step, f"{type(self).__name__}(resume_step=...)")
        if process_index is None:
            import jax  # imported here: `import writers` must not import JAX

            process_index = jax.process_index()
        return resume_step, process_index == 0

    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Raises `NotImplementedError`: trackers have no raw-tensor type."""
        self._begin("write_summaries", step, values)
        raise NotImplementedError(
            f"{type(self).__name__}.write_summaries: {self._tracker} has no raw-tensor type, so "
            f"{sorted(values)} cannot be stored. Write them as scalars (one element) or "
            "histograms instead."
        )

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        """Logs every number of the call in one tracker call (see the module docstring)."""
        step = self._begin("write_scalars", step, scalars)
        self._scalars(step, _checks.check_numbers(scalars, self._name("write_scalars")))

    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        """Logs N images per `[N, H, W, C]` key (one per `[H, W, C]` key)."""
        step = self._begin("write_images", step, images)
        arrays = _checks.check_images(images, self._name("write_images"))
        self._images(
            "write_images", step, {k: _checks.images_as_uint8(v) for k, v in arrays.items()}
        )

    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        """Logs each `[N, T, H, W, C]` video as N filmstrip images `[H, T*W, C]`."""
        step = self._begin("write_videos", step, videos)
        arrays = _checks.check_videos(videos, self._name("write_videos"))
        self._images("write_videos", step, {k: _encode.filmstrip(v) for k, v in arrays.items()})

    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        """Logs each clip of `[N, T, C]` as a 16-bit WAV."""
        step = self._begin("write_audios", step, audios)
        self._audios(
            step, _checks.check_audios(audios, sample_rate, self._name("write_audios")), sample_rate
        )

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Logs the texts."""
        step = self._begin("write_texts", step, texts)
        self._texts(step, _checks.check_texts(texts, self._name("write_texts")))

    def write_histograms(
        self, step: int, arrays: Mapping[str, Array], num_buckets: Mapping[str, int] | None = None
    ) -> None:
        """Logs a histogram per array with `num_buckets[key]` buckets (default 30)."""
        step = self._begin("write_histograms", step, arrays)
        checked = _checks.check_histograms(arrays, self._name("write_histograms"))
        self._histograms(step, checked, num_buckets or {})

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Logs the hyperparameters (bools, numbers and strs; anything else as its `str()`)."""
        self._begin_hparams(hparams)
        self._hparams({k: _encode.hparam(v) for k, v in hparams.items()})

    def flush(self) -> None:
        """Does nothing: each call has been handed to the tracker's client when it returns."""

    def close(self) -> None:
        """Ends the run if this writer started or resumed it (waits for it); idempotent."""
        if not self._closed:
            self._closed = True
            if self._owned:
                self._end_run()

    def _name(self, method: str) -> str:
        return f"{self._where()}.{method}"

    def _scalars(self, step: int, numbers: dict[str, int | float]) -> None: ...
    def _images(self, method: str, step: int, images: dict[str, np.ndarray]) -> None: ...
    def _audios(self, step: int, clips: dict[str, np.ndarray], sample_rate: int) -> None: ...
    def _texts(self, step: int, texts: dict[str, str]) -> None: ...
    def _histograms(
        self, step: int, arrays: dict[str, np.ndarray], buckets: Mapping[str, int]
    ) -> None: ...
    def _hparams(self, hparams: dict[str, bool | int | float | str]) -> None: ...
    def _end_run(self) -> None: ...
