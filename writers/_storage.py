"""Where writers put bytes: local files with plain file IO, URLs through fsspec.

Local paths keep `open()`: cheap appends, `tail -f`, `fsync`. Anything with a scheme
(`gs://`, `s3://`, `memory://`) goes through fsspec, where objects cannot be appended to;
re-uploading a growing object on every flush costs bytes that grow with the square of the run,
so remote logs are written as parts: each flush uploads only the new bytes as a new object
whose name sorts after the earlier ones (credentials: the README's "Cloud storage"). Files
created here honour the umask (`0o666 & ~umask`), unlike `tempfile.mkstemp`'s 0600.
"""

import errno
import os
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from absl import logging

_EXTRAS = {"gs": "gcs", "gcs": "gcs", "s3": "s3", "s3a": "s3"}


# What to do when writing a run's files failed with this errno (a read-only mount or a file
# in a directory's place was told to "free space there").
_FIXES = {
    errno.ENOSPC: "free space there",
    errno.EDQUOT: "free space there",
    errno.EFBIG: "free space there",
    errno.EROFS: "its file system is read-only: mount it read-write",
    errno.EACCES: "this user may not write there: give it permission",
    errno.EPERM: "this user may not write there: give it permission",
    errno.ENOTDIR: "a file stands where a directory of that path should be: move it",
    errno.EEXIST: "a file stands where a directory of that path should be: move it",
}


def os_error_fix(err: OSError) -> str:
    """What to do about `err`, raised writing a run's files, for a note on it."""
    return _FIXES.get(err.errno or 0, "the error above says what failed")


def is_remote(path: str) -> bool:
    """True for URLs with a scheme (`gs://b/x`), False for local paths."""
    return "://" in path


def join(base: str, *names: str) -> str:
    """`os.path.join` for local paths, `/`-joining for URLs."""
    if not is_remote(base):
        return os.path.join(base, *names)
    return "/".join([base.rstrip("/"), *names])


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec file system of `url` and the path within it (without a trailing `/`)."""
    import fsspec.core  # a declared dependency, imported on the first remote path

    scheme = url.split("://", 1)[0]
    if scheme not in fsspec.available_protocols():
        raise ValueError(
            f"{url!r}: fsspec knows no {scheme}:// protocol. Use a local path or a URL "
            "fsspec can open (gs://, s3://, memory://, ...)."
        )
    # file:// makes directories as it writes, as local paths do (it raised FileNotFoundError
    # at every flush); object stores have no directories to make.
    if scheme in ("file", "local"):  # made directly: url_to_fs read a '::' in it as a chain
        return fsspec.filesystem(scheme, auto_mkdir=True), url.split("://", 1)[1].rstrip("/")
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except ImportError as err:
        extra = _EXTRAS.get(scheme)
        fix = f"pip install 'jax-metrics-manager[{extra}]'" if extra else "install its package"
        raise ImportError(f"Writing to {url!r} needs fsspec's {scheme}:// backend: {fix}.") from err
    return fs, path.rstrip("/")


def names_in(fs: Any, path: str) -> list[str]:
    """The names in directory `path` of `fs`, listed afresh (another process, an earlier run,
    may have written); [] where there is none, FileNotFoundError where its bucket is none."""
    fs.invalidate_cache(path)
    try:
        return [entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(path, detail=False)]
    except FileNotFoundError:
        _check_bucket(fs, path)
        return []
    except Exception as err:
        # The client's error names a host at most ("Cannot connect to host 127.0.0.1:4443"),
        # not the run's URL.
        err.add_note(
            f"listing {fs.unstrip_protocol(path)!r} failed: check the storage's endpoint, "
            "the network and the credentials"
        )
        raise


def _check_bucket(fs: Any, path: str) -> None:
    """Raises FileNotFoundError naming the bucket of `path` (gcsfs, s3fs) if there is none:
    a run started on a misspelt bucket was taken, and every upload failed until `close()`
    with the client's bare "b/nobucket/o" or "Not Found". Any other answer (a user who may
    write objects but not read the bucket's metadata) leaves it to the uploads."""
    if not callable(getattr(fs, "split_path", None)):
        return  # no buckets (memory://, file://)
    bucket = fs.split_path(path)[0]
    try:
        fs.info(bucket)
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"bucket {bucket!r} does not exist (or this account cannot see it), so "
            f"{fs.unstrip_protocol(path)!r} can be neither written nor read: create the bucket, "
            "or fix the URL's bucket name"
        ) from err
    except Exception:  # noqa: BLE001  (denied, or unreachable: the uploads will say)
        return


def restore_if_deleted(fd: int, path: str, owner: str) -> bool | None:
    """Writes local file `path`, open at `fd`, back to `path` if it was deleted while open
    (the run's directory removed by mistake: every later write reached no reader, with no
    error). None: it was not deleted; True: written back, and the caller reopens `path` to
    append; False: left deleted, warned about, and the caller stops asking.

    Never replaces a file that is at `path` now (a new run's log: two processes would each
    replace the other's at every flush), and never raises where the deleted file's bytes
    cannot be read (no /proc): it warns and writes on to the deleted file."""
    if os.fstat(fd).st_nlink:
        return None
    try:
        with open(f"/proc/self/fd/{fd}", "rb") as deleted:  # Linux: the unlinked file's bytes
            contents = deleted.read()
        problem = None if _create_file(path, contents) else "a new file is there now, left as it is"
    except OSError as err:
        problem = f"it cannot be written there again ({err})"
    if problem:
        logging.warning(
            "%s: %s was deleted while open, and %s; later writes go to the deleted file, "
            "which no reader sees",
            owner,
            path,
            problem,
        )
        return False
    logging.warning(
        "%s: %s was deleted while open; its %d bytes are written there again, and later "
        "writes go there",
        owner,
        path,
        len(contents),
    )
    return True


def _create_file(path: str, contents: bytes) -> bool:
    """Creates local file `path` holding `contents`, whole for any reader; False, leaving it
    as it is, if a file is there (a hard link never replaces one, as a rename would)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    # Unnamed until linked, so a process killed meanwhile leaves nothing behind (a named copy
    # of an event file would be read by TensorBoard as a second one).
    fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o666)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        written = 0
        while written < len(contents):
            written += os.write(fd, contents[written:])
        os.fsync(fd)
        # linkat(2) following /proc's link to the unnamed file (a dir_fd makes Python use it)
        name = os.path.basename(path)
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
        os.fsync(dir_fd)  # the link itself survives a power loss
    except FileExistsError:
        return False
    finally:
        os.close(fd)
        os.close(dir_fd)
    return True


def replace_file(path: str, chunks: Iterable[bytes]) -> None:
    """Replaces `path` (a file or URL) with the bytes of `chunks`, atomically for any reader;
    a symlink's target is replaced, and a pipe or device (`/dev/stdout`) written to."""
    if is_remote(path):
        fs, fs_path = filesystem(path)
        try:
            fs.pipe_file(fs_path, b"".join(chunks))
        except FileNotFoundError:
            _check_bucket(fs, fs_path)
            raise
        return
    if os.path.exists(path) and not os.path.isfile(path):  # a pipe or device: written through
        with open(path, "wb") as stream:
            stream.writelines(chunks)
        return
    path = os.path.realpath(path)  # a symlink's target: replacing the link left it stale
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "xb") as f:  # mode 0o666 less the umask (mkstemp would give 0600)
            f.writelines(chunks)
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


class PartStream:
    """Appends as parts `name(i)`, sorting in write order: one per flush.

    A write only buffers; a flush uploads outside the buffer's lock, so a slow or failing upload
    (the client retrying through an outage) never holds up a write. A failed upload keeps its
    bytes for the next flush, dropping the oldest writes (whole) past `max_buffer_bytes`, but
    never the first writes made with `keep=True` (a file's header) until they have gone up.
    """

    def __init__(
        self,
        directory: str,
        name: Callable[[int], str],
        *,
        max_buffer_bytes: float,
        first_index: int = 0,
    ):
        self._fs, self._dir = filesystem(directory)
        self._url = directory  # for messages: `_dir` lacks the scheme, and read as a local path
        self._name = name
        self._index = first_index
        self._max = max_buffer_bytes
        self._buffer: list[bytes] = []
        self._size = 0  # bytes in the buffer
        self._header = 0  # writes at the buffer's start that are never dropped
        self.dropped = Dropped(f"{directory}/", self._max)
        self._lock = threading.Lock()  # the buffer
        self._upload = threading.Lock()  # one upload at a time, so parts keep their order
        self._failed, self._error = 0, repr(None)  # uploads that failed, the last one's error

    def write(self, data: bytes, keep: bool = False) -> None:
        """Buffers `data`; `keep` (only before any other write): never dropped."""
        with self._lock:
            self._header += keep
            self._buffer.append(data)
            self._size += len(data)

    def flush(self) -> None:
        failed = self._failed
        with self._upload:
            if self._failed != failed:
                # The upload this call waited for failed: storage is down now. A second try
                # would double the wait (a flush in an outage took two client retry budgets,
                # ~70 s on gcsfs, and its writer was taken for hung).
                raise OSError(
                    f"{self._url}: the upload under way when this flush began failed "
                    f"({self._error}); its data is kept for the next flush"
                )
            with self._lock:
                chunks, self._buffer, size, self._size = self._buffer, [], self._size, 0
            if not chunks:
                return
            try:
                self._fs.pipe_file(f"{self._dir}/{self._name(self._index)}", b"".join(chunks))
            except BaseException as err:
                with self._lock:
                    self._buffer[:0], self._size = chunks, self._size + size
                    self._trim(err)
                self._failed, self._error = self._failed + 1, repr(err)
                raise
            self._index += 1
            with self._lock:  # a write's `+=` under it: never undone
                self._header = 0
            self.dropped.outage = False

    def _trim(self, err: BaseException) -> None:
        """Under the buffer's lock: drops the oldest writes past the bound, but not the header
        (a TensorBoard file's version and purge_step: without them the stale steps of an
        earlier run showed again) and not the newest."""
        cut = self._header
        while self._size > self._max and cut < len(self._buffer) - 1:
            self._size -= len(self._buffer[cut])
            cut += 1
        del self._buffer[self._header : cut]
        self.dropped.add(cut - self._header, err)


class Dropped:
    """What a full outage buffer dropped: logged once per outage, noted on every error."""

    def __init__(self, where: str, limit: float) -> None:
        self.count = 0  # writes dropped so far
        self.outage = False  # dropping since the last upload or send that went through
        self._where, self._limit = where, limit

    def add(self, count: int, err: BaseException) -> None:
        self.count += count
        if count and not self.outage:
            self.outage = True
            logging.warning(
                "%s: unreachable for longer than the buffer's %s hold: dropping the "
                "oldest writes until an upload or send goes through",
                self._where,
                # a bound under 1 MiB read "0 MiB"
                f"{self._limit / 2**20:g} MiB"
                if self._limit >= 2**20
                else f"{self._limit / 2**10:g} KiB",
            )
        if self.count:
            err.add_note(f"{self.count} oldest writes dropped so far: the buffer is full")
