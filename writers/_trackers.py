"""What `WandbWriter` and `MlflowWriter` share: the optional import, process 0, write methods."""

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from writers import _checks, _encode
from writers._base import BaseWriter


class TrackerWriter(BaseWriter):
    """Process 0 only (others check inputs and log nothing), raw tensors refused, `_pictures`."""

    _tracker = ""
    _owned = False  # close() ends the run: this writer started or resumed it

    def _start(
        self, module: str, resume_step: int | None, process_index: int | None
    ) -> tuple[ModuleType, int | None, bool]:
        """Imports `module`, checks `resume_step`; returns them and whether this is process 0."""
        try:
            library = importlib.import_module(module)
        except ImportError as err:
            raise ImportError(
                f"{self._where()} needs the {module!r} package, which is not installed ({err}). "
                f"Install the extra: pip install 'jax-metrics-manager[{module}]'."
            ) from err
        if resume_step is not None:
            resume_step = _checks.check_step(resume_step, f"{self._where()}(resume_step=...)")
        if process_index is None:
            import jax  # imported here: `import writers` must not import JAX

            process_index = jax.process_index()
        return library, resume_step, process_index == 0

    def _summaries(self, step: int, values: Mapping[str, Any], metadata: Any) -> None:
        raise NotImplementedError(
            f"{self._where()}.write_summaries: {self._tracker} has no raw-tensor type, so "
            f"{sorted(values)} cannot be stored. Write them as scalars (one element) or "
            "histograms instead."
        )

    def _images(self, step: int, images: dict[str, np.ndarray]) -> None:
        self._pictures(
            "write_images", step, {k: _checks.images_as_uint8(v) for k, v in images.items()}
        )

    def _videos(self, step: int, videos: dict[str, np.ndarray]) -> None:
        self._pictures("write_videos", step, {k: _encode.filmstrip(v) for k, v in videos.items()})

    def _hparams(self, hparams: Mapping[str, Any]) -> None:
        self._params({k: _encode.hparam(v) for k, v in hparams.items()})

    def flush(self) -> None:
        """Does nothing: each call has been handed to the tracker's client when it returns."""

    def close(self) -> None:
        """Ends the run if this writer started or resumed it (waits for it); idempotent."""
        if not self._closed:
            self._closed = True
            if self._owned:
                self._end_run()

    def _pictures(self, method: str, step: int, images: dict[str, np.ndarray]) -> None: ...
    def _params(self, hparams: dict[str, bool | int | float | str]) -> None: ...
    def _end_run(self) -> None: ...
