"""The file layer of `JsonlWriter`: a local file or remote parts, resume, and reading back."""

import contextlib
import errno
import functools
import glob
import io
import json
import os
import pathlib
import re
import stat
import uuid
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO, TextIO

from absl import logging

try:
    import fcntl
except ImportError:  # not POSIX: logs are opened without the cross-process check
    fcntl = None  # type: ignore[assignment]

from writers import _checks, _storage

_STEP = re.compile(rb'^\{"step": (null|\d+)[,}]')
_PART = re.compile(r"^(\d{6})-(\d{8})(?:-([0-9a-f]{8}))?\.jsonl$")


def _part_name(generation: int, index: int, writer: str = "") -> str:
    """A part's file name; `writer`, a token of the writer that uploads it, keeps two writers
    of one log (a preempted run still flushing as its replacement starts) from replacing
    each other's parts, which share an index."""
    return f"{generation:06d}-{index:08d}{'-' * bool(writer)}{writer}.jsonl"


LOG_NAME = "metrics.jsonl"
_FILE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".log")


def log_file(path: str) -> str:
    """`path` if it names a file (an existing non-directory, or a new path with a log suffix
    in any case: `run.JSONL` too), else `path/metrics.jsonl` (as `JsonlWriter`'s `path` says)."""
    if not _storage.is_remote(path) and os.path.exists(path):
        return _storage.join(path, LOG_NAME) if os.path.isdir(path) else path
    return path if path.lower().endswith(_FILE_SUFFIXES) else _storage.join(path, LOG_NAME)


def as_url(path: str) -> str:
    """`path`, or the `file://` URL of a local log copied down from a URL (`<path>.d/` parts
    beside it, which no local writer makes), so that it is read and continued as parts."""
    if not _storage.is_remote(path) and os.path.isdir(path + ".d"):
        return "file://" + os.path.abspath(path)
    return path


def read_bytes(path: str) -> bytes:
    """The bytes of the log at `path` (a file, or a URL's object and parts) in read order."""
    url = as_url(path)
    return _read_remote(url) if _storage.is_remote(url) else pathlib.Path(path).read_bytes()


def line_step(line: bytes) -> int | None:
    """The `step` of one log line: an int, or None for lines without one or unreadable."""
    match = _STEP.match(line)
    if match:
        return None if match.group(1) == b"null" else int(match.group(1))
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


_DROPPED = (
    "JsonlWriter(%s): dropping a partial last line (%d bytes) left by a process that ended, "
    "or a machine that crashed, while writing it"
)


def kept_lines(lines: Iterable[bytes], resume_step: int, path: str) -> Iterator[bytes]:
    """Lines a run resumed at `resume_step` keeps: no later step, and a newline at the end
    (a last line without one gets it, as an appending writer adds it, unless it is torn).
    A torn last line is dropped with the warning a writer opening `path` without a resume
    gives (it had named no log and shown a dropped NUL fill as b'')."""
    for line in lines:
        if not line.endswith(b"\n"):
            if not (data := line.rstrip(b"\0")) or _torn(data):  # NUL fill: no data
                logging.warning(_DROPPED, path, len(line))
                continue
            line = data + b"\n"
        step = line_step(line)
        if step is None or step <= resume_step:
            yield line


def last_step(f: BinaryIO, end: int) -> int | None:
    """The step of the last line with a step in binary file `f` before `end` (a line's end).

    Reads back in chunks doubling from 64 KiB, so a long line (5,000 scalars: ~150 KB) is
    read whole; past 16 MiB it stops, rather than read all of another program's large file.
    """
    size = 65536
    while end > 0 and size <= 1 << 24:
        start = max(0, end - size)
        f.seek(start)
        lines = f.read(end - start).split(b"\n")[:-1]
        for line in reversed(lines[1:] if start else lines):  # the first may be cut
            if (step := line_step(line)) is not None:
                return step
        if not start:
            return None
        end, size = start + len(lines[0]) + 1, size * 2  # the rest, the cut line included
    return None


class LocalLog:
    """A local JSONL file, rewritten on resume, then appended to line by line."""

    forked = False  # this is a forked child's copy: the parent writes the log

    def __init__(self, path: str, resume_step: int | None):
        self._path = path
        self.last_step: int | None = None
        self._pending = b""  # what a regular file has not taken yet (a full disk)
        self._newline_first = False  # the file ends in a line without its newline
        self._deleted_kept = False  # deleted while open, and could not be written back
        if (stream := _stream(path)) is not None:
            # The program's own stream, through a duplicate of its descriptor: it shares the
            # file position (reopened by path, `> out.txt` had the lines and the prints
            # overwrite each other). Never locked, read back or cut: it holds other output too.
            self._file: TextIO = os.fdopen(os.dup(stream), "w", buffering=1, encoding="utf-8")
            self._regular = False
        else:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._file = _open_locked(path)
            # A pipe or device: lines only, nothing to read back or fsync.
            self._regular = stat.S_ISREG(os.fstat(self._file.fileno()).st_mode)
        _OPEN_LOGS.add(self)
        if not self._regular:
            if resume_step is not None:
                self._file.close()
                raise ValueError(
                    f"JsonlWriter: resume_step={resume_step} rewrites the log, but {path} is "
                    "not a log file of its own (a stream, pipe or device); pass a file path, "
                    "or no resume_step."
                )
            return
        # A rewrite (resume_step) killed mid-way left its copy; holding the lock, no rewrite runs.
        real = os.path.realpath(path)  # replace_file writes a symlinked log's target
        pattern = f".{glob.escape(os.path.basename(real))}.{'[0-9a-f]' * 12}.tmp"  # replace_file's
        for stale in glob.glob(os.path.join(glob.escape(os.path.dirname(real)), pattern)):
            with contextlib.suppress(OSError):
                os.unlink(stale)
        if resume_step is not None:
            with open(path, "rb") as old:
                _storage.replace_file(path, kept_lines(old, resume_step, path))
            previous, self._file = self._file, _open_locked(path)  # the rewritten file
            previous.close()
        with open(path, "rb") as f:
            size, complete = f.seek(0, os.SEEK_END), _complete_size(f)
            self.last_step = last_step(f, complete)
            f.seek(complete)
            # A last line without its newline, less the NUL bytes of blocks a machine crash
            # left zero-filled (they never reached the disk): no writer's data.
            tail = f.read(size - complete).rstrip(b"\0")
        if size == complete:
            return
        if not tail or _torn(tail):  # a process ended mid-line: the next line would be glued
            logging.warning(_DROPPED, path, size - complete)
            os.truncate(path, complete)
        else:  # a file of another program's, or a whole line without its newline: kept
            os.truncate(path, complete + len(tail))  # without NUL bytes after it
            self._newline_first = True  # before the first line written, not now

    def write(self, text: str) -> None:
        if self.forked:
            self._refuse()
        if not self._regular:
            self._file.write(text)
            return
        if self._newline_first:
            self._newline_first, text = False, "\n" + text
        self._pending += text.encode("utf-8")
        self._drain()

    def _drain(self) -> None:
        # Written past Python's buffer: it drops the rest of a line over 8 KiB that the disk
        # took only part of, and the next line was glued onto the fragment. The rest waits
        # here, ahead of later lines, until there is space.
        while self._pending:
            written = os.write(self._file.fileno(), self._pending)
            if written == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._path)
            self._pending = self._pending[written:]

    def flush(self) -> None:
        if self.forked:
            self._refuse()
        if not self._regular:
            self._file.flush()
            return
        self._drain()
        os.fsync(self._file.fileno())
        if self._deleted_kept:
            return
        restored = _storage.restore_if_deleted(self._file.fileno(), self._path, "JsonlWriter")
        self._deleted_kept = restored is False
        if restored:
            previous, self._file = self._file, _open_locked(self._path)
            previous.close()

    def close(self) -> None:
        try:
            self.flush()
        finally:  # the file open now: a flush that restored a deleted log opened a new one
            self._file.close()

    def _refuse(self) -> None:
        raise RuntimeError(
            f"JsonlWriter({self._path}): this process is a fork of the one that opened the "
            "log, which alone writes it (lines from both would interleave, and the lock is "
            "the parent's). Open a JsonlWriter of this process's own, on another path."
        )


def _torn(tail: bytes) -> bool:
    """Whether `tail`, a file's last line without a newline, is the start of a JSON line a
    killed writer left (every line starts with `{`). Another program's last line, or a whole
    object whose newline was lost, is not: dropping it lost that program's data."""
    if not tail.startswith(b"{"):
        return False
    try:
        json.loads(tail)
    except ValueError:
        return True
    return False


def _complete_size(f: Any) -> int:
    """The size of binary file `f` up to the end of its last complete line."""
    end = f.seek(0, os.SEEK_END)
    while end > 0:
        start = max(0, end - 65536)
        f.seek(start)
        newline = f.read(end - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


_OPEN_LOGS: "weakref.WeakSet[LocalLog]" = weakref.WeakSet()


def _same_file(log: LocalLog, path: str) -> bool:
    with contextlib.suppress(ValueError, OSError):  # closed meanwhile
        return os.path.samestat(os.fstat(log._file.fileno()), os.stat(path))
    return False


def _release_in_child() -> None:
    """In a forked child (a pool or data-loader worker), whose copy of a log's descriptor
    would hold the flock after the parent closes the log (and refuse the next run): that
    descriptor now points at /dev/null, and the child's writes to the log raise."""
    if not _OPEN_LOGS:
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for log in list(_OPEN_LOGS):
            log.forked = True
            with contextlib.suppress(ValueError, OSError):  # closed meanwhile
                os.dup2(null, log._file.fileno())
    finally:
        os.close(null)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_release_in_child)


_STREAMS = re.compile(r"/dev/(stdout|stderr)|/(?:dev|proc/self)/fd/(\d+)")


def _stream(path: str) -> int | None:
    """The descriptor of a standard stream that `path` names (`/dev/stdout`, `/dev/fd/2`)."""
    if (match := _STREAMS.fullmatch(path)) is None:
        return None
    return {"stdout": 1, "stderr": 2}[match.group(1)] if match.group(1) else int(match.group(2))


class LogLockedError(ValueError):
    """Another writer holds the lock on a JSONL log (`create_default_writer` adds its cause)."""


def _open_locked(path: str) -> TextIO:
    # flock, not a lock file: the kernel drops it when the process ends, SIGKILL included.
    file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    if fcntl is None or not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
        return file  # a pipe or device: each line is one write, nothing to rewrite
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.close()
        here = [log for log in list(_OPEN_LOGS) if _same_file(log, path)]
        holder = "a JsonlWriter of this process" if here else "another process"
        raise LogLockedError(
            f"JsonlWriter: {holder} holds a lock on {path}; two writers would interleave "
            "lines. Give this run another summary_dir or name, or "
            f"{'close that writer' if here else 'stop the other process'} first."
        ) from None
    except OSError as err:  # a file system without flock (Lustre without -o flock, NFS without
        # lockd): losing the check must not cost the run
        logging.warning(
            "JsonlWriter(%s): cannot lock the log (%s), so a second process writing it would "
            "not be refused; writing without the lock",
            path,
            err,
        )
    return file


class RemoteLog:
    """A remote log: objects cannot be appended to, so parts
    `<path>.d/<generation>-<index>-<writer>.jsonl`, read in (index, writer) order.

    Readers use the highest generation only. Resuming writes the kept lines as part 0 of the
    next generation, then deletes the old one (stale parts left by a crash are ignored). An
    object at `path` itself (a local log copied up) is read before generation 0, and kept
    lines of it go into generation 1 (never written or deleted here).
    """

    def __init__(self, path: str, resume_step: int | None, max_buffer_bytes: float):
        directory = path.rstrip("/") + ".d"
        fs, base = _storage.filesystem(directory)
        generation, current, stale, plain = _latest(fs, base)
        if resume_step is not None and (current or plain):
            lines = [*plain.splitlines(True), *_read_parts(fs, base, current).splitlines(True)]
            tail = b"".join(kept_lines(lines, resume_step, path))
            # No writer token: two runs resuming at once write the same kept lines once.
            _storage.replace_file(f"{directory}/{_part_name(generation + 1, 0)}", [tail])
            stale += current
            generation, current = generation + 1, [_part_name(generation + 1, 0)]
            self.last_step = last_step(io.BytesIO(tail), len(tail))
        else:
            self.last_step = None
            for name in [*reversed(current), None]:  # the last may hold step-less lines alone
                part = _read_parts(fs, base, [name]) if name else plain
                if (step := last_step(io.BytesIO(part), part.rfind(b"\n") + 1)) is not None:
                    self.last_step = step
                    break
        # The new generation is in place: readers ignore the old one already.
        for name in stale:
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(f"{base}/{name}")
        self._stream = _storage.PartStream(
            directory,
            functools.partial(_part_name, generation, writer=uuid.uuid4().hex[:8]),
            first_index=_part_key(current[-1])[0] + 1 if current else 0,
            max_buffer_bytes=max_buffer_bytes,
        )

    def write(self, text: str) -> None:
        self._stream.write(text.encode("utf-8"))

    def flush(self) -> None:
        self._stream.flush()

    close = flush


def _part_key(name: str) -> tuple[int, str]:
    """The read order of a part's name (one `_PART` matches): index, then writer."""
    _, index, writer = _PART.match(name).groups()  # type: ignore[union-attr]
    return int(index), writer or ""


def _latest(fs: Any, base: str) -> tuple[int, list[str], list[str], bytes]:
    """The newest generation of parts in `base`, its parts' names in read order, older parts',
    and in generation 0 (later ones hold its kept lines) the object at the log's own path
    (`base` less `.d`: a local log copied up; JsonlWriter writes none there), else b""."""
    names = _storage.names_in(fs, base)
    parts = [(int(m.group(1)), name) for name in names if (m := _PART.match(name))]
    generation = max((g for g, _ in parts), default=0)
    stale = [name for g, name in parts if g < generation]
    current = sorted((n for g, n in parts if g == generation), key=_part_key)
    plain = b""
    if generation == 0:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            plain = fs.cat_file(base[: -len(".d")])
    return generation, current, stale, plain


def _read_parts(fs: Any, base: str, names: list[str]) -> bytes:
    # Each part ends in a newline; one that does not was cut (a file:// write killed mid-way,
    # not atomic as an object's upload is), and its rest would glue onto the next part's line.
    parts = (fs.cat_file(f"{base}/{name}") for name in names)
    return b"".join(part[: part.rfind(b"\n") + 1] for part in parts)


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Reads a JSONL log written by `JsonlWriter`, local or remote, as one dict per line.

    Args:
      path: The path or URL given to `JsonlWriter` (e.g. `gs://b/run/train/metrics.jsonl`,
        or a directory such as a manager's `summary_dir`, which holds `metrics.jsonl`); a
        URL log copied down (`<path>.d/` parts, and `<path>` if the URL had an object
        there) reads as on the URL.

    Returns:
      The lines in write order (a last line still being written, and lines holding NUL
      bytes, a crash's zero fill, or blank ones are left out: the latter with a warning).

    Raises:
      FileNotFoundError: no log at `path`.
      ValueError: a complete line is not JSON (the message names it).

    Example:
      >>> import os, tempfile, writers
      >>> path = os.path.join(tempfile.mkdtemp(), "metrics.jsonl")
      >>> with writers.JsonlWriter(path, clock=lambda: 1.0) as w:
      ...   w.write_scalars(1, {"loss": 0.5})
      >>> writers.read_jsonl(path)
      [{'step': 1, 'time': 1.0, 'collection': None, 'loss': 0.5}]
    """
    path = log_file(_checks.check_path(path, "read_jsonl", "path"))
    data = read_bytes(path)
    lines = [line for line in data.splitlines(keepends=True) if line.endswith(b"\n")]
    records = []
    for number, line in enumerate(lines, 1):
        # Blocks a crash left zero-filled, or a blank line a person or script added: no data.
        if not line.strip(b"\0 \t\r\n"):
            logging.warning("read_jsonl: skipping line %d of %s: NUL bytes or blank", number, path)
            continue
        # Zero-filled blocks inside the log: the fill joins the start of the line before it to
        # the end of a later one. A writer's line holds no NUL byte (JSON escapes it).
        if b"\0" in line:
            shown = re.sub(rb"\0+", lambda run: b"<%d NUL>" % len(run.group()), line)[:120]
            logging.warning(
                "read_jsonl: skipping line %d of %s: it holds NUL bytes, which a machine crash "
                "leaves where blocks never reached the disk: %r",
                number,
                path,
                shown,
            )
            continue
        try:
            records.append(json.loads(line))
        except ValueError as err:  # JSONDecodeError, UnicodeDecodeError: say where
            raise ValueError(
                f"read_jsonl: line {number} of {path} is not JSON ({err}): {line[:80]!r}. A "
                "JsonlWriter writes one object per line; was the file edited, or written by "
                "something else?"
            ) from err
    return records


def _read_remote(path: str) -> bytes:
    directory = path.rstrip("/") + ".d"
    fs, base = _storage.filesystem(directory)
    for _ in range(5):  # a resume may delete the generation being read: list again
        _, current, _, plain = _latest(fs, base)
        if not current and not plain:
            break
        with contextlib.suppress(FileNotFoundError):  # a last line without its newline: cut
            return plain[: plain.rfind(b"\n") + 1] + _read_parts(fs, base, current)
    raise FileNotFoundError(
        f"read_jsonl: no JSONL log at {path!r} (expected the object or parts under "
        f"{directory}/, written by JsonlWriter). Check the URL and the run's summary_dir."
    )
