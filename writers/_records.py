"""TensorBoard event files in TFRecord framing, written synchronously so `flush()` means on disk."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from typing import Any

from tensorboardX.record_writer import masked_crc32c

from writers import _storage


class EventFile:
    """An append-only event file in `logdir` (a directory or URL), named like tensorboardX's.

    Raises:
      ImportError: `logdir` is a URL whose fsspec backend (gcsfs, s3fs) is missing.
    """

    def __init__(self, logdir: str, filename_suffix: str = ""):
        now = time.time()
        name = f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}"
        self._lock = threading.Lock()
        self._closed = False
        self._local = not _storage.is_remote(logdir)
        self._file: Any
        if not self._local:
            # One object per flush, named so TensorBoard reads one stream; microseconds keep a
            # later writer's parts after an earlier one's within a second.
            prefix = f"{name}.{int(now * 1e6) % 1_000_000:06d}."
            self._file = _storage.PartStream(logdir, lambda i: f"{prefix}{i:08d}{filename_suffix}")
            self.path = _storage.join(logdir, f"{prefix}{0:08d}{filename_suffix}")
            return
        os.makedirs(logdir, exist_ok=True)
        base = os.path.join(logdir, name)
        for attempt in range(1000):
            self.path = base + (f".{attempt}" if attempt else "") + filename_suffix
            with contextlib.suppress(FileExistsError):
                # Unbuffered, so a killed process loses no event written; flush() adds the fsync.
                self._file = open(self.path, "xb", buffering=0)  # noqa: SIM115
                return
        raise FileExistsError(f"EventFile: could not create a new file next to {base}")

    def write(self, data: bytes) -> None:
        """Appends one serialized event as `[len][crc(len)][data][crc(data)]`, little endian."""
        header = struct.pack("<Q", len(data))
        header += struct.pack("<I", masked_crc32c(header))
        record = header + data + struct.pack("<I", masked_crc32c(data))
        with self._lock:
            self._file.write(record)

    def flush(self) -> None:
        """Writes buffered records out (fsyncs local files, uploads remote ones)."""
        with self._lock:
            if not self._closed:
                self._flush()

    def close(self) -> None:
        """Flushes and closes the file; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._flush()
            finally:
                if self._local:
                    self._file.close()

    def _flush(self) -> None:
        self._file.flush()
        if self._local:
            os.fsync(self._file.fileno())
