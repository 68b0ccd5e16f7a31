"""TensorBoard event files: TFRecord framing, written synchronously (not by tensorboardX's queue).

A record is `[len: u64][masked crc32c(len): u32][data][masked crc32c(data): u32]`,
little-endian; the CRC is tensorboardX's, fast with the `crc32c` package (a dependency).

Local files are named like tensorboardX's (`events.out.tfevents.<unix seconds>.<host><suffix>`);
on a URL each flush writes one new object holding the events since the previous one
(`_storage.PartStream`), `events.out.tfevents.<unix seconds>.<host>.<microseconds>.<part><suffix>`.
The seconds are later than any event file's already there: TensorBoard reads a directory's
files in name order, so a writer made in the same second (a resumed run, on any host) reads
after the earlier ones, and a URL's parts read as one stream.
"""

import contextlib
import os
import re
import socket
import struct
import threading
import time
from typing import Any

from writers import _storage
from writers._tbx import masked_crc32c

_STAMP = re.compile(r"events\.out\.tfevents\.(\d+)\..*")


class EventFile:
    """An append-only event file in `logdir` (a directory or URL), named like tensorboardX's.

    Raises:
      ImportError: `logdir` is a URL whose fsspec backend (gcsfs, s3fs) is missing.
    """

    def __init__(self, logdir: str, filename_suffix: str, max_buffer_bytes: float):
        now = time.time()
        self._lock = threading.Lock()  # TensorBoardWriter's flush timer is a second thread
        self._local = not _storage.is_remote(logdir)
        self._deleted_kept = False  # deleted while open, and could not be written back
        self._file: Any
        if not self._local:
            # A later second than any file there, as locally: a replacement run on another
            # host, made in the same second, sorted by host name, and its purge could read
            # before the stale events. Microseconds order one host's writers within a second.
            names = _storage.names_in(*_storage.filesystem(logdir))
            name = f"events.out.tfevents.{_stamp(now, names):010d}"
            prefix = f"{name}.{socket.gethostname()}.{int(now * 1e6) % 1_000_000:06d}."

            def part(index: int) -> str:
                return f"{prefix}{index:08d}{filename_suffix}"

            self._file = _storage.PartStream(logdir, part, max_buffer_bytes=max_buffer_bytes)
            self.path = _storage.join(logdir, part(0))
            return
        os.makedirs(logdir, exist_ok=True)
        # Not a counter after the host: "<host>.1.train" sorted before "<host>.train", so
        # TensorBoard read a resumed run's events first and the stale ones after them.
        stamp = _stamp(now, os.listdir(logdir))
        for _ in range(1000):
            self.path = os.path.join(
                logdir, f"events.out.tfevents.{stamp:010d}.{socket.gethostname()}{filename_suffix}"
            )
            with contextlib.suppress(FileExistsError):
                # Appending: a file another program cut gets the next events at its new end (at
                # the old offset, a run of zero bytes hid them from every reader). Unbuffered, so
                # a killed process loses no event written; flush() adds the fsync.
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                self._file = open(os.open(self.path, flags, 0o666), "ab", buffering=0)  # noqa: SIM115
                return
            stamp += 1  # another writer took it since the listing
        raise FileExistsError(f"EventFile: could not create a new file in {logdir}")

    def write(self, data: bytes, keep: bool = False) -> None:
        """Appends one serialized event as a record; `keep`: the file's first events (version,
        purge), kept through any outage at a URL."""
        header = struct.pack("<Q", len(data))
        header += struct.pack("<I", masked_crc32c(header))
        record = header + data + struct.pack("<I", masked_crc32c(data))
        with self._lock:
            written = self._file.write(record) if self._local else self._file.write(record, keep)
            if self._local and written < len(record):  # the disk took only part of it
                self._complete(record, written)

    def _complete(self, record: bytes, written: int) -> None:
        """Writes the rest of a record, or cuts its start off and raises: a torn record would
        hide every later event from TensorBoard's reader."""
        try:
            while written < len(record):
                written += self._file.write(record[written:])
        except BaseException:
            self._file.seek(-written, os.SEEK_CUR)
            self._file.truncate()
            raise

    def flush(self) -> None:
        """Fsyncs a local file; uploads remote parts outside this lock, never holding up a write."""
        with self._lock if self._local else contextlib.nullcontext():
            self._file.flush()
            if self._local:
                os.fsync(self._file.fileno())
                if self._deleted_kept:
                    return
                restored = _storage.restore_if_deleted(self._file.fileno(), self.path, "EventFile")
                self._deleted_kept = restored is False
                if restored:
                    previous, self._file = self._file, open(self.path, "ab", buffering=0)  # noqa: SIM115
                    previous.close()

    def close(self) -> None:
        """Flushes and closes the file (`TensorBoardWriter.close` calls it once)."""
        try:
            self.flush()
        finally:
            if self._local:
                self._file.close()


def _stamp(now: float, names: list[str]) -> int:
    """A file name's seconds: `now`'s, or past the latest of the event files `names`."""
    stamps = [int(m[1]) for n in names if (m := _STAMP.fullmatch(n))]
    return max([int(now), *(s + 1 for s in stamps)])
