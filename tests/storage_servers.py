"""Local storage servers for the remote-storage tests and benchmark, counting uploaded bytes.

* GCS: `gcp-storage-emulator` (GCS's JSON API), found by gcsfs (and TensorBoard's
  fsspec reader) through `STORAGE_EMULATOR_HOST`, with `token="anon"`.
* S3: moto in server mode, found by s3fs through `endpoint_url` (fsspec config) and by
  TensorBoard's own S3 reader through `S3_ENDPOINT`, with fake keys.

Both listen on a free port of 127.0.0.1; nothing reaches the internet. gcsfs's
experimental zonal-bucket support would ask Google's control plane about each
bucket, so it is turned off before gcsfs is imported.

Uploaded bytes are counted where the server reads request bodies: every body byte
a client sent (object data plus the upload protocol's own framing, such as GCS's
multipart metadata or S3's chunk signatures), HTTP request lines and headers
excluded. `requests` counts the requests that carried a body.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # read when gcsfs is imported

BUCKET = "bucket"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Counter:
    """Body bytes and requests received by a server (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.uploaded_bytes = 0
        self.requests = 0

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.uploaded_bytes += nbytes
            self.requests += 1

    def reset(self) -> None:
        with self._lock:
            self.uploaded_bytes = self.requests = 0


class GcsServer:
    """gcp-storage-emulator on a free port, with bucket `bucket`, counting uploads."""

    def __init__(self) -> None:
        from gcp_storage_emulator import server

        self.counter = Counter()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        read = server._read_raw_data

        def counting_read(handler: Any) -> bytes | None:
            data = read(handler)
            if data:
                self.counter.add(len(data))
            return data

        server._read_raw_data = counting_read  # the one place the emulator reads bodies
        read_data = server._read_data

        def exact_read_data(handler: Any, query: Any) -> Any:
            content_type = handler.headers.get("Content-Type") or ""
            if not content_type.startswith("multipart/related"):
                return read_data(handler, query)
            return _multipart_upload(server._read_raw_data(handler), content_type)

        server._read_data = exact_read_data
        self._server = server.create_server(
            "127.0.0.1", self.port, in_memory=True, default_bucket=BUCKET
        )
        # The emulator re-serializes the metadata of every object (its persistence file,
        # read only at start-up) after each upload: server time growing with the object
        # count, which would hide what the client does. In memory nothing reads it back.
        self._server._storage._write_config_to_file = lambda: None
        self._server.start()

    def environment(self) -> dict[str, str]:
        # FSSPEC_GS_TOKEN is for child processes: fsspec reads it when it is imported.
        return {"STORAGE_EMULATOR_HOST": self.url, "FSSPEC_GS_TOKEN": "anon"}

    def fsspec_config(self) -> dict[str, Any]:
        return {"token": "anon"}

    def stop(self) -> None:
        self._server.stop()


def _multipart_upload(raw: bytes, content_type: str) -> dict[str, Any]:
    """A multipart/related upload (metadata, then content), split byte-exactly.

    The emulator parses it with Python's email parser, which drops a last content byte
    that is a line feed (or carriage return): about 1 event file in 250 lost its final
    CRC byte, and TensorBoard skipped that event. Per RFC 2046 the one line break before
    a boundary belongs to the boundary, so exactly one is removed here.
    """
    import json

    boundary = content_type.split("boundary=", 1)[1].strip('"').encode()
    _, meta, content, *_ = raw.split(b"--" + boundary)
    newline = b"\r\n" if content.startswith(b"\r\n") else b"\n"  # the client's line break

    def split(part: bytes) -> tuple[bytes, bytes]:
        head, _, rest = part[len(newline) :].partition(newline + newline)
        return head, rest[: -len(newline)]

    meta_body = split(meta)[1]
    head, data = split(content)
    kind = "application/octet-stream"
    for line in head.splitlines():
        if line.lower().startswith(b"content-type:"):
            kind = line.split(b":", 1)[1].strip().decode()
    return {"meta": json.loads(meta_body), "content": data, "content-type": kind}


class _CountingInput:
    def __init__(self, stream: Any, counter: Counter) -> None:
        self._stream, self._counter, self.nbytes = stream, counter, 0

    def read(self, *args: Any) -> bytes:
        data = self._stream.read(*args)
        self.nbytes += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        n = self._stream.readinto(buffer)
        self.nbytes += n or 0
        return n

    def readline(self, *args: Any) -> bytes:
        data = self._stream.readline(*args)
        self.nbytes += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class S3Server:
    """moto's S3 in server mode on a free port, with bucket `bucket`, counting uploads."""

    def __init__(self) -> None:
        from moto.moto_server.threaded_moto_server import MotoRequestHandler
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        self.counter = Counter()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = DomainDispatcherApplication(create_backend_app)

        def counting_app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
            body = _CountingInput(environ["wsgi.input"], self.counter)
            environ["wsgi.input"] = body
            try:
                yield from app(environ, start_response)
            finally:
                if body.nbytes:
                    self.counter.add(body.nbytes)

        # ThreadedMotoServer's own set-up, with the counting app in front of moto's.
        self._server = make_server(
            "127.0.0.1", self.port, counting_app, True, request_handler=MotoRequestHandler
        )
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket=BUCKET)
        self.counter.reset()

    def environment(self) -> dict[str, str]:
        return {
            "S3_ENDPOINT": self.url,  # TensorBoard's S3 reader
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def fsspec_config(self) -> dict[str, Any]:
        return {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": self.url, "region_name": "us-east-1"},
        }

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def serving(
    server: GcsServer | S3Server, scheme: str, config: dict[str, Any] | None = None
) -> Iterator[None]:
    """Points this process's fsspec `scheme` (`config`, else the server's) and the client
    libraries' variables at `server`; fsspec's cached file systems are dropped on the way in
    and out, so no test meets another's."""
    import fsspec
    import fsspec.config
    import pytest

    cls = fsspec.get_filesystem_class(scheme)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in server.environment().items():
            patch.setenv(key, value)
        patch.setitem(fsspec.config.conf, scheme, config or server.fsspec_config())
        cls.clear_instance_cache()
        try:
            yield
        finally:
            cls.clear_instance_cache()


def copy_event_files(url: str, directory: str) -> None:
    """Copies the TensorBoard event files under `url` into `directory` (for a local reader)."""
    import fsspec.core

    fs, root = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    for name in fs.ls(root, detail=False):
        if "tfevents" in name:
            fs.get(name, os.path.join(directory, os.path.basename(name)))


def s3_behind_a_gate(max_attempts: int) -> tuple[S3Server, Gate, dict[str, Any]]:
    """A real S3 server (moto's), a proxy in front of it that can cut the network, and the
    fsspec config reaching it through the proxy with `max_attempts` tries per request."""
    server = S3Server()
    gate = Gate(server.port)
    config = server.fsspec_config()
    config["client_kwargs"]["endpoint_url"] = gate.url
    config["config_kwargs"] = {"retries": {"max_attempts": max_attempts}}
    return server, gate, config


class Gate:
    """A TCP proxy on a free port in front of `port` that can cut the network: `cut()` resets
    every open connection and every new one until `restore()` (an outage between a client
    and its storage, as the client sees it: connections refused by a dead route)."""

    def __init__(self, port: int) -> None:
        self._target = port
        self._open = True
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            self._open = False
            for s in self._sockets:
                _reset(s)
            self._sockets.clear()

    def restore(self) -> None:
        with self._lock:
            self._open = True

    def _accept(self) -> None:
        while True:
            client, _ = self._listener.accept()
            with self._lock:
                if not self._open:
                    _reset(client)
                    continue
                upstream = socket.create_connection(("127.0.0.1", self._target))
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass  # the other side, or `Gate.cut`, closed it
    _reset(sink)


def _reset(s: socket.socket) -> None:
    """Closes with a TCP reset (linger 0), as a dropped route looks to the peer.

    `shutdown(SHUT_RD)` first wakes the `_pipe` thread blocked in `recv` on it: without it
    Linux defers the close, and its reset, until that `recv` returns, so a request in flight
    at `Gate.cut` could wait forever on a connection the cut never reset (a timed upload of
    the outage test hung past 60 s under load)."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        with contextlib.suppress(OSError):  # not connected, or closed already
            s.shutdown(socket.SHUT_RD)
        s.close()
    except OSError:
        pass
