"""TensorBoard event files: TFRecord framing, written synchronously.

An event file is a sequence of records `[len: u64][masked_crc(len): u32][data]
[masked_crc(data): u32]`, little-endian, where the CRC is CRC32C (Castagnoli).
The CRC is tensorboardX's `masked_crc32c`, which is fast because the `crc32c`
package (a declared dependency, hardware CRC instructions) is installed; without
it tensorboardX falls back to a byte-at-a-time Python loop, more than half the
cost of writing a 50-scalar event. The file itself is written here rather than
through tensorboardX's queue-backed `EventFileWriter` so that `flush()` means
"on disk" and a writer never overwrites an existing file.

`EventFile` writes one file per writer, named like tensorboardX's
(`events.out.tfevents.<unix seconds>.<host><suffix>`), never overwriting an
existing file (a counter is added instead). On a URL (`gs://`, `s3://`, any
fsspec protocol) it writes one object per flush instead, holding the events
since the previous flush (`_storage.PartStream`):
`events.out.tfevents.<unix seconds>.<host>.<microseconds>.<part><suffix>`.
TensorBoard reads every event file of a run directory in name order, so the
parts read as one stream, and a later writer's parts sort after an earlier
one's. Upload bytes grow linearly with the events written, not with their
square as with tensorboardX's whole-file re-upload on every flush.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from typing import Any

from tensorboardX.record_writer import masked_crc32c as _tbx_masked_crc32c

from writers import _storage


def masked_crc32c(data: bytes) -> int:
    """The masked CRC32C that TFRecord stores (tensorboardX's, computed by `crc32c`)."""
    return _tbx_masked_crc32c(data)


def record(data: bytes) -> bytes:
    """`data` framed as one TFRecord."""
    header = struct.pack("<Q", len(data))
    return (
        header
        + struct.pack("<I", masked_crc32c(header))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


class EventFile:
    """An append-only event file; `write` and `flush` are thread-safe.

    Local paths (and mounted file systems) are written with `open()` and fsynced on
    `flush()`. URLs (`gs://...`, `s3://...`, any fsspec protocol) are written as one
    new object per flush holding the records since the previous one.

    Args:
      logdir: Directory for the file (created if missing), or a URL.
      filename_suffix: Appended to the file name.

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
            # Microseconds keep a later writer's parts after an earlier one's within a second.
            prefix = f"{name}.{int(now * 1e6) % 1_000_000:06d}."
            self._file = _storage.PartStream(logdir, lambda i: f"{prefix}{i:08d}{filename_suffix}")
            self.path = self._file.next_path
            return
        os.makedirs(logdir, exist_ok=True)
        base = os.path.join(logdir, name)
        for attempt in range(1000):
            self.path = base + (f".{attempt}" if attempt else "") + filename_suffix
            try:
                # Unbuffered: every event reaches the OS at once, so a killed process
                # (SIGKILL) loses none that was written; flush() adds the fsync.
                self._file = open(self.path, "xb", buffering=0)  # noqa: SIM115
                return
            except FileExistsError:
                continue
        raise FileExistsError(f"EventFile: could not create a new file next to {base}")

    def write(self, data: bytes) -> None:
        """Appends one serialized event."""
        framed = record(data)
        with self._lock:
            self._file.write(framed)

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
