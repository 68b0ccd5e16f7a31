"""`LoggingWriter`: writes every value to the absl INFO log in CLU's line format.

Scalars: one line per call, `[<step>] collection=<name> k1=v1, k2=v2`, keys sorted, floats
`.6g` (`nan`, `inf`, `-inf`), ints as they are, ` collection=<name>` only when set, so log
parsers written for CLU's `LoggingWriter` keep working. Other kinds are logged as CLU does:
shapes for tensors, images, videos and audio, the texts, one line per histogram with its
buckets, and `[Hyperparameters]` for hparams.

Example:
  >>> import writers
  >>> w = writers.LoggingWriter(collection="train")
  >>> w.write_scalars(10, {"loss": 0.25, "accuracy": 0.5})  # logs: [10] collection=train accuracy=0.5, loss=0.25
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from absl import logging

from writers import _checks
from writers._base import BaseWriter
from writers.interface import Array, Scalar


class LoggingWriter(BaseWriter):
    """Writes values to absl's INFO log, one line per call (one per histogram).

    Args:
      collection: Name shown as ` collection=<name>` on every line.
    """

    def __init__(self, collection: str | None = None):
        self._prefix_tail = f" collection={collection}" if collection else ""

    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Logs the shape of every tensor."""
        step = self._begin("write_summaries", step, values)
        self._log(step, "Got raw tensors: %s.", _shapes(values))

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        """Logs `[step] collection=name k=v, ...` with keys sorted and floats `.6g`."""
        step = self._begin("write_scalars", step, scalars)
        numbers = _checks.check_numbers(scalars, "LoggingWriter.write_scalars")
        self._log(step, "%s", ", ".join(f"{k}={_format(v)}" for k, v in sorted(numbers.items())))

    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        """Logs the shape of every image array."""
        step = self._begin("write_images", step, images)
        arrays = _checks.check_images(images, "LoggingWriter.write_images")
        self._log(step, "Got images: %s.", _shapes(arrays))

    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        """Logs the shape of every video array."""
        step = self._begin("write_videos", step, videos)
        arrays = _checks.check_videos(videos, "LoggingWriter.write_videos")
        self._log(step, "Got videos: %s.", _shapes(arrays))

    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        """Logs the shape of every audio array."""
        step = self._begin("write_audios", step, audios)
        arrays = _checks.check_audios(audios, sample_rate, "LoggingWriter.write_audios")
        self._log(step, "Got audios: %s.", _shapes(arrays))

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Logs the text mapping."""
        step = self._begin("write_texts", step, texts)
        self._log(step, "Got texts: %s.", _checks.check_texts(texts, "LoggingWriter.write_texts"))

    def write_histograms(
        self, step: int, arrays: Mapping[str, Array], num_buckets: Mapping[str, int] | None = None
    ) -> None:
        """Logs one line per histogram: `Histogram for 'key' = {[a, b): n, ..., [y, z]: n}`."""
        step = self._begin("write_histograms", step, arrays)
        checked = _checks.check_histograms(arrays, "LoggingWriter.write_histograms")
        buckets = num_buckets or {}
        for key, arr in checked.items():
            counts, edges = _checks.bucketize(arr, buckets.get(key))
            self._log(step, "Histogram for %r = {%s}", key, _histogram_text(counts, edges))

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Logs `[Hyperparameters] collection=name {...}`."""
        self._begin_hparams(hparams)
        logging.info("[Hyperparameters]%s %s", self._prefix_tail, dict(hparams))

    def flush(self) -> None:
        """Flushes absl's log handlers."""
        if not self._closed:
            logging.flush()

    def close(self) -> None:
        """Flushes; later writes raise `WriterClosedError`."""
        if not self._closed:
            logging.flush()
            self._closed = True

    def _log(self, step: int, fmt: str, *args: Any) -> None:
        logging.info("[%d]%s " + fmt, step, self._prefix_tail, *args)


def _format(value: int | float) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _shapes(values: Mapping[str, Array]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(np.shape(v)) for k, v in values.items()}


def _histogram_text(counts: np.ndarray, edges: np.ndarray) -> str:
    # Buckets are right-open except the last one, which is closed.
    parts = [f"[{edges[i]:.3g}, {edges[i + 1]:.3g}): {int(c)}" for i, c in enumerate(counts[:-1])]
    parts.append(f"[{edges[-2]:.3g}, {edges[-1]:.3g}]: {int(counts[-1])}")
    return ", ".join(parts)
