"""An in-memory "remote" file system for tensorboardX's writer-factory hook."""

from __future__ import annotations


class MemoryFile:
    """A remote file for tensorboardX's writer-factory hook: bytes kept in a dict."""

    store: dict[str, bytes] = {}

    def __init__(self, path: str) -> None:
        self.path, self.buffer = path, bytearray()

    def write(self, data: bytes) -> None:
        self.buffer += data

    def flush(self) -> None:
        MemoryFile.store[self.path] = bytes(self.buffer)

    def close(self) -> None:
        self.flush()


class MemoryFactory:
    def open(self, path: str) -> MemoryFile:
        return MemoryFile(path)

    def directory_check(self, path: str) -> None:
        pass
