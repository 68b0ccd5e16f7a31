"""TensorBoard event files: TFRecord framing with a fast CRC32C, in pure Python + numpy.

An event file is a sequence of records `[len: u64][masked_crc(len): u32][data]
[masked_crc(data): u32]`, little-endian, where the CRC is CRC32C (Castagnoli).
tensorboardX computes that CRC one byte at a time in Python (about 0.1 ms per
kilobyte here, more than half the cost of writing a 50-scalar event) unless a
compiled `crc32c` package is installed. `crc32c` below gets the same numbers
from numpy: CRC is linear over GF(2), so the CRC of a block is the XOR of one
precomputed table entry per byte position, and blocks are chained by advancing the
running register over the block length with the same tables.

`EventFile` writes one file per writer, named like tensorboardX's
(`events.out.tfevents.<unix seconds>.<host><suffix>`), never overwriting an
existing file (a counter is added instead).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from typing import Any

import numpy as np

_POLY = 0x82F63B78  # CRC32C, reflected.
_BLOCK = 2048  # bytes per vectorized block; the tables take _BLOCK * 1 KiB.


def _byte_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _byte_table()
_tables: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
_tables_lock = threading.Lock()


def _block_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`ahead[k, b]`: the register contribution of byte b followed by k zero bytes."""
    global _tables
    if _tables is not None:
        return _tables
    with _tables_lock:
        if _tables is None:
            table = np.array(_TABLE, dtype=np.uint32)
            ahead = np.empty((_BLOCK, 256), np.uint32)
            ahead[0] = table
            for k in range(1, _BLOCK):
                prev = ahead[k - 1]
                ahead[k] = table[prev & 0xFF] ^ (prev >> 8)  # one more zero byte
            rows = np.arange(_BLOCK - 1, -1, -1, dtype=np.intp) * 256
            _tables = ahead, ahead.reshape(-1), rows
        return _tables


def crc32c(data: bytes) -> int:
    """CRC32C of `data` (same value as `crc32c.crc32c` and tensorboardX's)."""
    crc = 0xFFFFFFFF
    if len(data) < 64:  # numpy's call overhead is not worth it for short records.
        for byte in data:
            crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF
    ahead, flat, rows = _block_tables()
    buf = np.frombuffer(data, np.uint8)
    for start in range(0, len(buf), _BLOCK):
        block = buf[start : start + _BLOCK]
        m = len(block)
        if m < 4:
            for byte in block.tolist():
                crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
            continue
        # Register after the block = (old register advanced over m zero bytes)
        # XOR (contribution of the block's bytes from a zero register).
        from_data = int(np.bitwise_xor.reduce(flat[rows[_BLOCK - m :] + block]))
        advanced = int(
            ahead[m - 1, crc & 0xFF]
            ^ ahead[m - 2, (crc >> 8) & 0xFF]
            ^ ahead[m - 3, (crc >> 16) & 0xFF]
            ^ ahead[m - 4, crc >> 24]
        )
        crc = advanced ^ from_data
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The masked CRC that TFRecord stores."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


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
    `flush()`. Paths with a scheme (`gs://...`, `s3://...`) go through tensorboardX's
    record-writer factories, which need `google-cloud-storage` or `boto3` and upload
    the file on each flush.

    Args:
      logdir: Directory for the file (created if missing).
      filename_suffix: Appended to the file name.

    Raises:
      ValueError: `logdir` has a scheme tensorboardX has no writer for.
    """

    def __init__(self, logdir: str, filename_suffix: str = ""):
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
        self._lock = threading.Lock()
        self._closed = False
        self._local = "://" not in logdir
        if not self._local:
            self._open_remote(logdir, name + filename_suffix)
            return
        os.makedirs(logdir, exist_ok=True)
        base = os.path.join(logdir, name)
        for attempt in range(1000):
            self.path = base + (f".{attempt}" if attempt else "") + filename_suffix
            try:
                self._file: Any = open(self.path, "xb")  # noqa: SIM115  (closed in close())
                return
            except FileExistsError:
                continue
        raise FileExistsError(f"EventFile: could not create a new file next to {base}")

    def _open_remote(self, logdir: str, filename: str) -> None:
        from tensorboardX import record_writer

        scheme = logdir.split("://", 1)[0]
        if scheme not in record_writer.REGISTERED_FACTORIES:
            known = sorted(record_writer.REGISTERED_FACTORIES)
            raise ValueError(
                f"TensorBoardWriter: no writer for {scheme}:// paths (logdir={logdir!r}); "
                f"tensorboardX knows {known}. Use a local directory or one of those."
            )
        record_writer.directory_check(logdir)
        self.path = logdir.rstrip("/") + "/" + filename
        self._file = record_writer.open_file(self.path)

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
                self._file.close()

    def _flush(self) -> None:
        self._file.flush()
        if self._local:
            os.fsync(self._file.fileno())
