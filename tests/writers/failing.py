"""Writers for failure tests: one that raises OSError on every call, one in CLU's style."""

from __future__ import annotations

import threading

from writers import MetricWriter


class BrokenDiskWriter(MetricWriter):
    """Raises OSError on every call, like a writer whose disk is full."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _fail(self, method: str) -> None:
        self.calls.append(method)
        raise OSError(28, "No space left on device")

    def write_summaries(self, step, values, metadata=None):
        self._fail("write_summaries")

    def write_scalars(self, step, scalars):
        self._fail("write_scalars")

    def write_images(self, step, images):
        self._fail("write_images")

    def write_videos(self, step, videos):
        self._fail("write_videos")

    def write_audios(self, step, audios, *, sample_rate):
        self._fail("write_audios")

    def write_texts(self, step, texts):
        self._fail("write_texts")

    def write_histograms(self, step, arrays, num_buckets=None):
        self._fail("write_histograms")

    def write_hparams(self, hparams):
        self._fail("write_hparams")

    def flush(self):
        self._fail("flush")

    def close(self):
        self._fail("close")


class CluInterfaceWriter:
    """Written against CLU's interface: exact signatures, no base class from us."""

    def __init__(self) -> None:
        self.scalars: list[tuple[int, dict]] = []
        self.texts: list[tuple[int, dict]] = []
        self.audios: list[tuple[int, dict, int]] = []
        self.histograms: list[tuple[int, dict, dict | None]] = []
        self.hparams: list[dict] = []
        self.summaries: list[tuple[int, dict, object]] = []
        self.flushed = 0
        self.closed = False

    def write_summaries(self, step, values, metadata=None):
        self.summaries.append((step, dict(values), metadata))

    def write_scalars(self, step, scalars):
        self.scalars.append((step, dict(scalars)))

    def write_images(self, step, images):
        pass

    def write_videos(self, step, videos):
        pass

    def write_audios(self, step, audios, *, sample_rate):
        self.audios.append((step, dict(audios), sample_rate))

    def write_texts(self, step, texts):
        self.texts.append((step, dict(texts)))

    def write_histograms(self, step, arrays, num_buckets=None):
        self.histograms.append((step, dict(arrays), num_buckets))

    def write_hparams(self, hparams):
        self.hparams.append(dict(hparams))

    def flush(self):
        self.flushed += 1

    def close(self):
        self.closed = True


class GatedWriter(CluInterfaceWriter):
    """Blocks in write_scalars until `gate` is set, to fill an AsyncWriter's queue."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def write_scalars(self, step, scalars):
        self.entered.set()
        self.gate.wait()
        super().write_scalars(step, scalars)
