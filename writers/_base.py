"""Base classes of this package's writers: the closed state, the input checks, forwarding.

Every backend thus rejects the same inputs with the same messages, and implements only hooks.
`flush_every` gives a buffering writer its flush timer and closes it at interpreter exit if
the program did not (`close_at_exit`, which a manager uses too).
"""

import abc
import atexit
import collections
import importlib
import importlib.util
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

import numpy as np
from absl import logging

from writers import _checks, _encode
from writers.interface import Array, MetricWriter, Scalar, WriterClosedError

_PIXEL_FIX = "x / 255 for [0, 255], (x + 1) / 2 for [-1, 1], or uint8"
_RANGE_FIXES = {
    "image": (0, _PIXEL_FIX),
    "video": (0, _PIXEL_FIX),
    "audio": (-1, "x / abs(x).max()"),
}
_INT_PIXEL_FIX = "uint8, x // 257 for 16-bit pixels, or floats in [0, 1]"


class BaseWriter(MetricWriter):
    """`MetricWriter` that checks each call, then calls the hook of its kind.

    Hooks get numbers as Python ints and floats, arrays as numpy arrays (images `[H, W, C]` or
    `[N, H, W, C]`, videos `[N, T, H, W, C]` (a `[T, H, W, C]` one gets its batch axis),
    audio `[N, T, C]`) and `num_buckets` as a dict.
    """

    _closed: bool = False
    encodes_media: bool = False  # images, videos, audio become pixels, samples (not shapes)
    reserved_keys: tuple[str, ...] = ()  # keys the backend stores its own fields under
    flush_failure: str | None = None  # why the last timed flush failed; None once one works

    @property
    def closed(self) -> bool:
        """True once `close()` has been called."""
        return self._closed

    def __enter__(self) -> "BaseWriter":
        """The writer itself, refused at once when closed, as a closed `MetricsManager` is:
        `with writer:` entered silently, and only the block's first write raised, after
        whatever work came before it."""
        self._check_open("__enter__")
        return self

    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None:
        step = self._begin("write_summaries", step, values)
        _checks.check_metadata(metadata, self._name("write_summaries"))  # every backend alike
        self._summaries(step, values, metadata)

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        step = self._begin("write_scalars", step, scalars)
        self._scalars(step, _checks.check_numbers(scalars, self._name("write_scalars")))

    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        step = self._begin("write_images", step, images)
        checked = _checks.check_arrays(images, self._name("write_images"), "image")
        self._images(step, self._clipped("image", checked))

    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        step = self._begin("write_videos", step, videos)
        checked = _checks.check_arrays(videos, self._name("write_videos"), "video")
        # One video [T, H, W, C], as CLU's interface takes it, is a batch of one.
        checked = {k: v[None] if v.ndim == 4 else v for k, v in checked.items()}
        self._videos(step, self._clipped("video", checked))

    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        step = self._begin("write_audios", step, audios)
        problems = _checks.Problems(self._name("write_audios"))
        if err := _checks.sample_rate_problem(sample_rate):
            problems.add(type(err), str(err))
        clips = _checks.check_arrays(audios, problems.context, "audio", problems)
        if not problems and (problem := _checks.byte_rate_problem(sample_rate, clips)):
            problems.value_problem(problem)
        problems.raise_if_any()
        # A batch of N > 1 clips is tagged 'key/0'...'key/N-1' (TensorBoard, W&B): a key of
        # that name in the same call went under the same tag.
        tags = _checks.audio_tags(clips)
        if twice := sorted({t for t in tags if tags.count(t) > 1}):
            raise ValueError(
                f"{self._name('write_audios')}: clips would be tagged {twice} twice (a batch "
                "of N > 1 clips under 'key' is tagged 'key/0' to 'key/N-1'); rename one key"
            )
        self._audios(step, self._clipped("audio", clips), sample_rate)

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        step = self._begin("write_texts", step, texts)
        self._texts(step, _checks.check_texts(texts, self._name("write_texts")))

    def write_histograms(
        self, step: int, arrays: Mapping[str, Array], num_buckets: Mapping[str, int] | None = None
    ) -> None:
        step = self._begin("write_histograms", step, arrays)
        problems = _checks.Problems(self._name("write_histograms"))
        buckets = _checks.check_buckets(num_buckets, problems, arrays)
        checked = _checks.check_arrays(arrays, problems.context, "histogram", problems)
        problems.raise_if_any()
        self._histograms(step, checked, buckets)

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        self._check_open("write_hparams")
        hparams = _checks.as_mapping(hparams)
        problems = _checks.Problems(self._name("write_hparams"))
        _checks.check_keys(hparams, problems.context, problems)  # one error with the nested keys
        flat = _checks.flat_hparams(hparams, problems) if isinstance(hparams, Mapping) else {}
        problems.raise_if_any()
        _checks.check_keys(flat, self._name("write_hparams"))  # nested names too
        self._hparams(flat)

    def flush(self) -> None:
        if not self._closed:
            self._flush()

    def close(self) -> None:
        if not self._closed:
            self._flush()
            self._closed = True

    def _summaries(self, step: int, values: Mapping[str, Any], metadata: Any) -> None: ...
    def _scalars(self, step: int, numbers: dict[str, int | float]) -> None: ...
    def _texts(self, step: int, texts: dict[str, str]) -> None: ...
    def _histograms(self, step: int, arrays: dict[str, np.ndarray], buckets: dict) -> None: ...
    def _hparams(self, hparams: Mapping[str, Any]) -> None: ...
    def _flush(self) -> None: ...

    # Backends that record media by shape only implement `_media` instead of these three.
    def _images(self, step: int, images: dict[str, np.ndarray]) -> None:
        self._media(step, "image", images)

    def _videos(self, step: int, videos: dict[str, np.ndarray]) -> None:
        self._media(step, "video", videos)

    def _audios(self, step: int, clips: dict[str, np.ndarray], sample_rate: int) -> None:
        self._media(step, "audio", clips, sample_rate)

    def _media(
        self, step: int, kind: str, arrays: dict[str, np.ndarray], sample_rate: int | None = None
    ) -> None: ...

    def _clipped(self, kind: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`arrays`, after warning (once per key) of values this writer would clip silently."""
        if not self.encodes_media:
            return arrays
        low, fix = _RANGE_FIXES[kind]
        warned = self.__dict__.setdefault("_range_warned", set())
        for key, arr in arrays.items():
            if key not in warned and (span := _checks.outside_range(arr, low)):
                warned.add(key)
                floats = np.issubdtype(arr.dtype, np.floating)
                message = (
                    f"{'float' if floats else 'integer'} {kind} {key!r} holds values in "
                    f"[{span[0]:g}, {span[1]:g}]"
                )
                logging.warning(
                    "%s: %s, but is read in [%d, %d] and clipped. Pass %s. Warned once per key.",
                    self._where(),
                    message,
                    span[2],
                    span[3],
                    fix if floats else _INT_PIXEL_FIX,
                )
        return arrays

    def _where(self) -> str:
        return type(self).__name__

    def _name(self, method: str) -> str:
        return f"{self._where()}.{method}"

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise WriterClosedError(
                f"{self._name(method)}: the writer is closed; create a new one to write more."
            )

    def key_problem(self, method: str, keys: Iterable[str]) -> str | None:
        """Why this backend would refuse some of `keys` in a `method` call, else None:
        wrappers and the manager ask before any writer writes."""
        return None

    def _refuse_keys(self, method: str, keys: Iterable[str]) -> None:
        """Raises `key_problem`'s answer, if any, as a ValueError naming `method`."""
        if problem := self.key_problem(method, keys):
            raise ValueError(f"{self._name(method)}: {problem}")

    def _begin(self, method: str, step: Any, values: Mapping[str, Any]) -> int:
        self._check_open(method)
        if type(values) is _checks.Checked:
            return step
        return _checks.check_call(self._name(method), step, values)


class ForwardingWriter(BaseWriter):
    """Checks each call's step and keys once, then passes it on by keyword to `_forward`."""

    _reserved: dict[str, str] = {}  # key -> name of the wrapped writer that refuses it
    _wrapped: dict[str, Any] = {}

    def _reserve(self, writers: Mapping[str, Any]) -> None:
        """Refuses at the call the keys a wrapped writer reserves (JSONL's line fields) or
        would refuse (MLflow's names): a `MultiWriter`'s others wrote such a key before, an
        `AsyncWriter` failed one call late."""
        self._reserved = {k: n for n, w in writers.items() for k in getattr(w, "reserved_keys", ())}
        self.reserved_keys = tuple(self._reserved)
        self._wrapped = dict(writers)

    def key_problem(self, method: str, keys: Iterable[str]) -> str | None:
        return keys_problem(self._wrapped, method, keys, {})  # reserved: in `reserved_keys`

    def _begin(self, method: str, step: Any, values: Mapping[str, Any]) -> int:
        step = super()._begin(method, step, values)
        if problem := keys_problem(self._wrapped, method, values, self._reserved):
            raise ValueError(f"{self._name(method)}: {problem}")
        return step

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        step = self._begin("write_scalars", step, scalars)
        if type(scalars) is not _checks.Checked:  # refuse non-numbers now; arrays stay as
            # they are (converting a device array here would wait for it on the caller's thread)
            problems = _checks.Problems(self._name("write_scalars"))
            plain = {}
            for key, value in scalars.items():
                # An array of a dtype NumPy cannot interpret (torch's, a JAX PRNG key's) is read
                # here: a key was refused only by the wrapped writer, an AsyncWriter's a call late.
                dtype = getattr(value, "dtype", None)
                if not _checks._looks_like_array(value) or _checks.numpy_dtype(dtype) is None:
                    plain[key] = value
                elif isinstance(dtype, np.dtype):  # numpy's and JAX's
                    if err := _checks._not_a_scalar(key, value):  # by shape and dtype alone
                        problems.add(type(err), str(err))
            _checks.collect_numbers(plain, problems)
            problems.raise_if_any()
        self._forward("write_scalars", step=step, scalars=scalars)

    # Media are checked by shape and dtype (a device array is not waited for on the caller's
    # thread); values (NaN in a histogram) by each wrapped writer.
    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        step = self._begin("write_images", step, images)
        self._forward("write_images", step=step, images=self._shapes("write_images", images))

    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        step = self._begin("write_videos", step, videos)
        self._forward("write_videos", step=step, videos=self._shapes("write_videos", videos))

    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        step = self._begin("write_audios", step, audios)
        _checks.check_sample_rate(sample_rate, self._name("write_audios"))
        audios = self._shapes("write_audios", audios)
        if problem := _checks.byte_rate_problem(sample_rate, audios):
            raise ValueError(f"{self._name('write_audios')}: {problem}")
        self._forward("write_audios", step=step, audios=audios, sample_rate=sample_rate)

    def write_histograms(
        self, step: int, arrays: Mapping[str, Array], num_buckets: Mapping[str, int] | None = None
    ) -> None:
        step = self._begin("write_histograms", step, arrays)
        problems = _checks.Problems(self._name("write_histograms"))
        buckets = _checks.check_buckets(num_buckets, problems, arrays)
        arrays = _checks.check_shapes("histogram", arrays, problems)
        problems.raise_if_any()
        # As the caller gave it: None stays None and a key's None stays (a CLU writer doing
        # `if num_buckets is not None: num_buckets[key]` got {} and raised KeyError).
        given = None if num_buckets is None else {key: buckets.get(key) for key in num_buckets}
        self._forward("write_histograms", step=step, arrays=arrays, num_buckets=given)

    def _shapes(self, method: str, arrays: Mapping[str, Any]) -> dict[str, Any]:
        if type(arrays) is _checks.Checked:
            return arrays
        problems = _checks.Problems(self._name(method))
        checked = _checks.check_shapes(method.removeprefix("write_")[:-1], arrays, problems)
        problems.raise_if_any()
        return checked

    # `BaseWriter` passes summaries and hparams to these hooks unconverted, texts as plain strs.
    def _summaries(self, step: int, values: Mapping[str, Any], metadata: Any) -> None:
        self._forward("write_summaries", step=step, values=values, metadata=metadata)

    def _texts(self, step: int, texts: dict[str, str]) -> None:
        self._forward("write_texts", step=step, texts=texts)

    def _hparams(self, hparams: Mapping[str, Any]) -> None:
        self._refuse_keys("write_hparams", hparams)
        self._forward("write_hparams", hparams=hparams)

    @abc.abstractmethod
    def _forward(self, method: str, **kwargs: Any) -> None:
        """Runs `method(**kwargs)` on the wrapped writer(s)."""


def _origin(module: str) -> str:
    """Where `module` is found on `sys.path`, for an import error's message."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    return str(spec.origin) if spec and spec.origin else "sys.path"


class TrackerWriter(BaseWriter):
    """Base of `WandbWriter` and `MlflowWriter`: optional import, process 0 logs, files by path."""

    encodes_media = True
    _owned = False  # close() ends the run: this writer started or resumed it
    _file_methods: frozenset[str] = frozenset({"write_summaries"})  # values stored as files
    _url_paths = False  # artifact paths go into URLs unquoted (MLflow)
    _here = False  # this is process 0, which logs (set by `_start`)
    _files_step: int | None = None  # the step of the last files, and the writes of each key
    _files_written: collections.Counter = collections.Counter()
    _failed = False  # a `with` block raised: `_end_run` ends the run as failed
    # Process-wide: set by a manager's signal handler before it closes the writers where the
    # signal's default action then ends the process. Their runs end as killed (MLflow KILLED,
    # W&B exit code 128 + the signal): a run SIGTERM'd at step 30 of 100 ended FINISHED.
    ending_signal: int | None = None

    def key_problem(self, method: str, keys: Iterable[str]) -> str | None:
        if method not in self._file_methods:
            return None
        kind = {"write_audios": "audio"}.get(method, method[6:])
        return _path_problem(kind, keys, self._url_paths)

    def _start(
        self, module: str, resume_step: int | None, process_index: int | None
    ) -> tuple[ModuleType, int | None, bool]:
        """Imports `module`, checks `resume_step`; returns them and whether this is process 0."""
        install = f"pip install 'jax-metrics-manager[{module}]'"
        try:
            library = importlib.import_module(module)
        except ImportError as err:
            if err.name != module:  # it is there, but its own imports fail (or a file shadows it)
                raise ImportError(
                    f"{self._where()} could not import {module!r} from {_origin(module)}: {err}. "
                    f"Reinstall it ({install}), or rename a file of that name that shadows it."
                ) from err
            raise ImportError(
                f"{self._where()} needs the {module!r} package, which is not installed ({err}). "
                f"Install the extra: {install}."
            ) from err
        if not hasattr(library, "__path__"):  # a module, e.g. ./mlflow.py in the working dir
            raise ImportError(
                f"{self._where()} needs the {module!r} package, but {module!r} is "
                f"{library.__file__}, which shadows it: rename that file."
            )
        if resume_step is not None:
            resume_step = _checks.check_step(resume_step, f"{self._where()}(resume_step=...)")
        if process_index is None:
            import jax  # imported here: `import writers` must not import JAX

            process_index = jax.process_index()
        self._here = process_index == 0
        return library, resume_step, self._here

    def _summaries(self, step: int, values: Mapping[str, Any], metadata: Any) -> None:
        # Trackers have no raw-tensor type: exact `.npy` files (TensorBoard's `metadata` is not kept).
        arrays = {k: np.asarray(v) for k, v in values.items()}
        if bad := [f"{k!r} ({a.dtype})" for k, a in arrays.items() if a.dtype.hasobject]:
            raise TypeError(
                f"{self._name('write_summaries')}: tensors {', '.join(bad)} hold Python objects, "
                "which .npy files cannot store safely; write numeric, bool or str arrays."
            )
        files = self._encoded(arrays, _encode.npy)
        self._files("write_summaries", "summaries", step, files, ".npy")

    def _encoded(self, values: Mapping[str, Any], encode: Callable[[Any], Any]) -> dict[str, Any]:
        """Each value `encode`d; on processes other than 0, which store nothing, empty bytes
        (only the keys are checked)."""
        return {k: encode(v) if self._here else b"" for k, v in values.items()}

    # Off process 0 only the keys are checked (`_pictures`): the shapes and ranges were.
    def _images(self, step: int, images: dict[str, np.ndarray]) -> None:
        self._pictures("write_images", step, self._encoded(images, _checks.images_as_uint8))

    def _videos(self, step: int, videos: dict[str, np.ndarray]) -> None:
        self._pictures("write_videos", step, self._encoded(videos, _encode.filmstrip))

    def _hparams(self, hparams: Mapping[str, Any]) -> None:
        self._params({k: _encode.hparam(v) for k, v in hparams.items()})

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        """Closes the writer; a run it ends after the block raised ends as failed, as the
        trackers' own `with` blocks end theirs (MLflow FAILED, W&B exit code 1): it was
        FINISHED with exit code 0, so a crashed run looked complete in the tracker's UI."""
        self._failed = exc is not None
        super().__exit__(exc_type, exc, tb)

    def close(self) -> None:
        """Ends the run if this writer started or resumed it (waits for it); idempotent."""
        if not self._closed:
            self._closed = True
            if self._owned:
                self._end_run()

    def _files(
        self, method: str, kind: str, step: int, files: Mapping[str, Any], ext: str = ".txt"
    ) -> None:
        """`_store`s each key's bytes (or list of bytes) as `<kind>/<key>/step_<8 digits>`,
        `-<n>` for the n-th write of the key at that step (counted until a write at another
        step: a write back at an earlier step, as after a resume, replaces its files), `_<i>`
        for the i-th of a list, and `ext`; a ValueError for a key that is no relative path."""
        if problem := _path_problem(kind, files, self._url_paths):
            raise ValueError(f"{self._name(method)}: {problem}")
        if step != self._files_step:  # a new dict: the class's empty one is never filled
            self._files_step, self._files_written = step, collections.Counter()
        paths = {}
        for key, content in files.items():
            self._files_written[kind, key] += 1
            stem = f"{kind}/{key}/step_{step:08d}"
            if (n := self._files_written[kind, key]) > 1:  # kept beside the first, not over it
                stem += f"-{n}"
            many = isinstance(content, list)
            for i, data in enumerate(content if many else [content]):
                paths[f"{stem}_{i}{ext}" if many else f"{stem}{ext}"] = data
        self._store(paths)

    def _store(self, paths: dict[str, bytes]) -> None: ...
    def _pictures(self, method: str, step: int, images: dict[str, np.ndarray]) -> None: ...
    def _params(self, hparams: dict[str, bool | int | float | str]) -> None: ...
    def _end_run(self) -> None: ...


_URL_UNSAFE = re.compile("[#?%\x00-\x1f\x7f]")


def _path_problem(kind: str, keys: Iterable[str], url_safe: bool = False) -> str | None:
    # A file system refuses a name part over 255 bytes, or a path past PATH_MAX (4,096 with
    # the store's root): one such key would fail every later send of the files buffered
    # with it. `url_safe`: MLflow's client puts the path in a URL unquoted, so a server read
    # 'a#1' as 'a' (two keys, one file) and 'a%41' as 'aA'; it dropped a tab or CR ('a\tb'
    # overwrote 'ab'), answered 404 to a newline (every later send failed), and a part's
    # edge spaces hid its files from listing.
    bad = [
        k
        for k in keys
        if len(k.encode()) > 1024
        or "\0" in k  # no file system takes it: every later send failed on it
        or any(p in ("", ".", "..") or len(p.encode()) > 255 for p in k.split("/"))
        or (url_safe and (_URL_UNSAFE.search(k) or any(p != p.strip() for p in k.split("/"))))
    ]
    if not bad:
        return None
    url = (
        ", without '#', '?', '%' or control characters (a tracking server's URL syntax), no "
        "part starting or ending with whitespace"
        if url_safe
        else ""
    )
    return (
        f"keys {bad} become artifact paths {kind}/<key>/... and must be relative, without "
        f"'', '.' or '..' parts or NUL, each part at most 255 bytes and the key 1,024{url}; rename "
        "them, e.g. 'eval/sample'."
    )


def keys_problem(
    writers: Mapping[str, Any], method: str, keys: Iterable[str], reserved: Mapping[str, str]
) -> str | None:
    """Why some writer of `writers` (by name) would refuse `keys` in `method`, else None."""
    problems = [] if method == "write_hparams" else [_checks.reserved_problem(keys, reserved)]
    for name, writer in writers.items():
        if (check := getattr(writer, "key_problem", None)) and (problem := check(method, keys)):
            problems.append(f"{name}: {problem}")
    return "; ".join(p.rstrip(".") for p in problems if p) or None


def write_tree(root: str, paths: Mapping[str, bytes]) -> list[str]:
    """Writes each `<dir>/.../<name>` -> bytes of `TrackerWriter._files` under `root`; the files."""
    files = []
    for path, data in paths.items():
        file = os.path.join(root, *path.split("/"))
        os.makedirs(os.path.dirname(file), exist_ok=True)
        with open(file, "wb") as f:
            f.write(data)
        files.append(file)
    return files


# Writers a caller left a call inside (a MetricsManager, past `writer_deadline_s`): closed at
# exit, a TensorBoardWriter waited for the hung write's lock, and the process never ended.
ABANDONED: "weakref.WeakSet[Any]" = weakref.WeakSet()


def close_at_exit(writer: Any, name: str) -> Callable[[], None]:
    """Registers `writer.close()` (held weakly) to run at exit; returns the `atexit` hook.

    Not in a forked child: it has the writer's memory but not its threads, and closing its
    copy would send the buffer twice (or end a tracker run the parent still uses); nor
    while an abandoned call is still inside it (`ABANDONED`): the close would wait for it."""
    ref, pid = weakref.ref(writer), os.getpid()

    def close() -> None:
        if os.getpid() != pid:
            return
        try:
            if (alive := ref()) in ABANDONED:
                logging.warning(
                    "%s: not closed at exit: a call abandoned as hung is inside it", name
                )
            elif alive is not None:
                alive.close()
        except Exception:  # noqa: BLE001  (nobody is left to catch it at exit)
            logging.exception("%s failed while closing at exit", name)

    return atexit.register(close)


def flush_every(
    writer: BaseWriter, seconds: float, name: str, last: Callable[[], None] | None = None
) -> Callable[..., bool]:
    """Flushes `writer` every `seconds` on a daemon thread and `close_at_exit`s it.

    Returns `stop(timeout=None)` for `close()`: the thread runs `last` (a final send; no new
    thread, which Python 3.12 refuses at exit) and is waited for up to `timeout`; False if
    that passed first; raises what `last` raised. A failed timed flush is logged once per
    run of failures, kept in `writer.flush_failure` (`health()` shows it) and retried.
    """
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        while not stop.wait(seconds):
            try:
                writer.flush()  # with nothing new: a no-op upload, an fsync of a clean file
                writer.flush_failure = None
            except Exception as err:  # noqa: BLE001  (the timer outlives a failed upload or fsync)
                if writer.flush_failure is None:
                    logging.exception(
                        "%s: a timed flush failed (what it kept is tried again every %g s)",
                        writer._where(),
                        seconds,
                    )
                notes = "".join(f"; {n}" for n in getattr(err, "__notes__", ()))
                writer.flush_failure = f"{type(err).__name__}: {err}{notes}"
        if last is not None:
            try:
                last()
            except BaseException as err:  # noqa: BLE001  (raised by stop(), on the closing thread)
                failed.append(err)

    thread = threading.Thread(target=run, daemon=True, name=f"{writer._where()}-flush")
    thread.start()
    at_exit = close_at_exit(writer, name)

    def stop_and_join(timeout: float | None = None) -> bool:
        atexit.unregister(at_exit)
        stop.set()
        thread.join(timeout)
        if thread.is_alive():
            return False
        if failed:
            raise failed[0]
        return True

    return stop_and_join
