"""Where writers put bytes: local files with plain file IO, URLs through fsspec.

Local paths (and mounted file systems) keep plain `open()`: appends are cheap,
`tail -f` works, `fsync` makes a flush durable. Anything with a scheme
(`gs://`, `s3://`, `memory://`, any protocol fsspec knows) goes through fsspec,
where an object cannot be appended to. Re-uploading a growing object on every
flush (tensorboardX's GCS writer) costs bytes that grow with the square of the
run, so remote logs here are written as *parts*: every flush uploads only the
bytes written since the previous flush, as a new object whose name sorts after
the earlier ones. Upload bytes grow linearly with the data; the number of
objects grows with the number of flushes.

Credentials and endpoints are fsspec's: its config files or environment
variables (`FSSPEC_GS_TOKEN`, `FSSPEC_S3_ENDPOINT_URL`, ...), or the
libraries' own (`GOOGLE_APPLICATION_CREDENTIALS`, `STORAGE_EMULATOR_HOST`,
`AWS_*`).

Files created here honour the process umask (mode `0o666 & ~umask`), unlike
`tempfile.mkstemp`'s fixed 0600.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any

_EXTRAS = {"gs": "gcs", "gcs": "gcs", "s3": "s3", "s3a": "s3"}


def is_remote(path: str) -> bool:
    """True for URLs with a scheme (`gs://b/x`), False for local paths."""
    return "://" in path


def join(base: str, *names: str) -> str:
    """`os.path.join` for local paths, `/`-joining for URLs."""
    if not is_remote(base):
        return os.path.join(base, *names)
    return "/".join([base.rstrip("/"), *names])


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec file system of `url` and the path within it.

    Raises:
      ValueError: fsspec knows no such protocol.
      ImportError: the protocol's package (gcsfs, s3fs, ...) is not installed;
        the message names the extra to install.
    """
    try:
        import fsspec
        import fsspec.core
    except ImportError as err:  # pragma: no cover  (fsspec is a declared dependency)
        raise ImportError(
            f"Writing to {url!r} needs fsspec: pip install 'jax-metrics-manager'."
        ) from err
    scheme = url.split("://", 1)[0]
    if scheme not in fsspec.available_protocols():
        raise ValueError(
            f"{url!r}: fsspec knows no {scheme}:// protocol. Use a local path or a URL "
            "fsspec can open (gs://, s3://, memory://, ...)."
        )
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as err:
        extra = _EXTRAS.get(scheme)
        fix = f"pip install 'jax-metrics-manager[{extra}]'" if extra else "install its package"
        raise ImportError(f"Writing to {url!r} needs fsspec's {scheme}:// backend: {fix}.") from err


def makedirs(path: str) -> None:
    """Creates a local directory and its parents; object stores need none."""
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)


def _temp_path(path: str) -> str:
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.{uuid.uuid4().hex[:12]}.tmp")


def replace_file(path: str, chunks: Iterable[bytes]) -> None:
    """Replaces `path` with the bytes of `chunks`, atomically for any reader.

    Local: the chunks go to a temporary file in the same directory (mode
    `0o666 & ~umask`), which is flushed, fsynced and renamed over `path`
    (`os.replace`), then the directory is fsynced. A crash at any moment
    leaves either the complete old file or the complete new one (plus, at
    worst, a stray `.<name>.*.tmp`). Remote: one object upload, which object
    stores make visible all at once.

    Args:
      path: the file or URL to replace.
      chunks: the new content, in pieces (a large log is streamed, not held).
    """
    if is_remote(path):
        fs, fs_path = filesystem(path)
        fs.pipe_file(fs_path, b"".join(chunks))
        return
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = _temp_path(path)
    # os.open with 0o666 lets the kernel apply the umask, as open() does.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power loss
    finally:
        os.close(dir_fd)


def list_names(directory: str) -> list[str]:
    """Sorted base names of the objects directly under a remote `directory` (none if missing)."""
    fs, fs_path = filesystem(directory)
    fs.invalidate_cache(fs_path)  # another process (an earlier run) may have written
    try:
        entries = fs.ls(fs_path, detail=False)
    except FileNotFoundError:
        return []
    return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries)


def remove(urls: Iterable[str]) -> None:
    """Deletes remote objects (missing ones are fine)."""
    urls = list(urls)
    if not urls:
        return
    fs, _ = filesystem(urls[0])
    for url in urls:
        try:
            fs.rm_file(filesystem(url)[1])
        except FileNotFoundError:
            pass


class PartStream:
    """An append-only remote log written as numbered objects, one per upload.

    `write` buffers bytes; `flush` uploads the bytes written since the last
    upload as the object `name(index)`, then counts `index` up, so each byte
    is uploaded once. A buffer that reaches `roll_bytes` is uploaded without
    waiting for a flush. `write` and `flush` are thread-safe.

    Args:
      directory: URL of the directory holding the parts.
      name: the object name of part `index`; names must sort in write order.
      first_index: index of the first part this stream writes.
      roll_bytes: upload once this many bytes are buffered.
    """

    def __init__(
        self,
        directory: str,
        name: Callable[[int], str],
        *,
        first_index: int = 0,
        roll_bytes: int = 8 << 20,
    ) -> None:
        self._fs, self._dir = filesystem(directory)
        self._url = directory.rstrip("/")
        self._name = name
        self._index = first_index
        self._roll_bytes = roll_bytes
        self._buffer: list[bytes] = []
        self._size = 0
        self._lock = threading.Lock()

    @property
    def next_path(self) -> str:
        """URL of the part the next upload creates."""
        return f"{self._url}/{self._name(self._index)}"

    def write(self, data: bytes) -> None:
        """Buffers `data`; uploads the buffer once it holds `roll_bytes`."""
        with self._lock:
            self._buffer.append(data)
            self._size += len(data)
            if self._size >= self._roll_bytes:
                self._upload()

    def flush(self) -> None:
        """Uploads the bytes written since the last upload as a new part (if any)."""
        with self._lock:
            self._upload()

    def _upload(self) -> None:
        if not self._size:
            return
        data = b"".join(self._buffer)
        self._fs.pipe_file(f"{self._dir.rstrip('/')}/{self._name(self._index)}", data)
        self._index += 1
        self._buffer, self._size = [], 0
