"""`MlflowWriter`: MLflow runs through `MlflowClient`, sent in batches by a timer.

Needs the `mlflow` extra (imported when the first writer is made). Works with any tracking
store: a server (`http://host:5000`) or a database (`sqlite:///mlflow.db`, no server). Only
process 0 creates a run and logs; the others check their inputs and log nothing.

Write calls only check and buffer, so the loop never waits on the tracker: a timer sends
the buffer every `flush_secs`, as do `flush()` and `close()`. While the tracker is
unreachable, what failed to send stays buffered (in memory, up to `max_buffer_mb`: past it
the oldest metrics, then files, are dropped and logged) and goes with the next send; what
the store refuses at a send (a param another client changed, a deleted run, a file the
artifact server answers with a 4xx other than 408 and 429) is dropped, and that send raises.
A changed param of this writer's run is refused by its `write_hparams` (under a manager or
`AsyncWriter`, on the worker: a writer failure). At start, the constructor fails with a
ConnectionError naming an http(s) tracking URI where no server answers within about 15 s,
instead of waiting out MLflow's 4 minutes of retries.

Where values land: scalars are metrics (`log_batch`, up to MLflow's 1000 metrics a batch;
float64, so ints past 2**53 are rounded; NaN kept, infinities as the store keeps them: the
SQL store clamps them to +-1.797e308, and SQLite reads -0.0 back as 0.0);
hparams are params (100 per batch; MLflow params never change, so a different value for a
key the run has is refused). Metric and param names MLflow would refuse are refused at the
call. Texts, images, videos, audio, histograms and raw tensors are artifacts, all files of
one send in one `log_artifacts`, at `<kind>/<key>/step_<step 8 digits>[-<n>][_<i>].<ext>`:
`.txt`, `.png` per image, filmstrip `.png` `[H, T*W, C]` per video, 16-bit `.wav` per
clip, histograms as `.json` (`count`, `min`, `max`, `mean`, `edges`, `counts`), raw tensors
(`write_summaries`) as exact `.npy` files under `summaries/` (TensorBoard's metadata is not
kept); keys must then be relative paths (no `..`, `.` or empty parts, parts of at most 255
bytes, 1,024 in all) without `#`, `?` or `%`, which a tracking server reads as URL syntax.

Resume: `resume_step=R` attaches to `run_id`, or to the latest run named `run_name` (none
yet, as for an eval the preempted run never reached: a new run, with a warning; with
neither, nor a collection, it is refused).
MLflow's metric history is append-only, so the writer first reads each metric's last logged
step and skips any (key, step) at or before it, with one absl warning: each step keeps at
most one point, the earlier run's up to that key's last logged step (so a step the earlier run
did not log below it, with a key logged every 5 steps, keeps none). Artifacts of a re-logged
step are replaced. Outside resume, repeated keys at one step are recorded as given (each
`write_scalars` gets a later millisecond timestamp than the one before, since MLflow's store
keeps one point per key, step, timestamp and value): a key's n-th file at one step (n > 1,
before a write at another step) is `step_<step>-<n>...`.

Example:
  >>> import os, tempfile, writers
  >>> uri = "sqlite:///" + os.path.join(tempfile.mkdtemp(), "mlflow.db")
  >>> w = writers.MlflowWriter("demo", tracking_uri=uri, process_index=0)
  >>> w.write_scalars(1, {"loss": 0.5, "accuracy": 0.75})  # buffered
  >>> w.close()  # sends the buffer (one log_batch here) and ends the run
"""

import errno
import json
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from absl import logging

from writers import _base, _checks, _encode, _storage

_METRIC_BYTES = 180  # a buffered scalar's memory (tracemalloc), for `max_buffer_mb`
# How `_check_server` tries a tracking server at start, where the MLFLOW_HTTP_REQUEST_*
# variables are unset: 4 tries, 4 s and 8 s apart (MLflow's backoff, up to 1 s of jitter
# each), each giving up on a connection after 5 s; the answer itself may take MLflow's
# MLFLOW_HTTP_REQUEST_TIMEOUT (120 s), so a slow server still works.
_START_RETRIES, _START_BACKOFF, _START_CONNECT_S = 3, 2, 5.0


class MlflowWriter(_base.TrackerWriter):
    """Logs to an MLflow run: write calls buffer, a timer sends (see the module docstring).

    Args:
      experiment_name: Experiment of a new run (created if missing; None: "Default").
      tracking_uri: Tracking store (None: MLflow's default, `MLFLOW_TRACKING_URI`).
      collection: What is logged (`train`, `eval/task`): the default run name.
      run_id: Log into this existing run (left running by `close()` unless resumed).
      run_name: Name of a new run, or of the run to resume (default: `collection`).
      resume_step: Resume the run at this step (see the module docstring).
      tags: Tags of a new run.
      artifact_location: Artifact root of a new experiment (None: the store's default).
      flush_secs: A background timer sends the buffer this often.
      max_buffer_mb: The most kept in memory while sends fail (a metric counted as 180
        bytes, a file as its size); past it the oldest are dropped (logged). None: no bound.
      close_timeout_s: `close()` (at exit too) gives up after this long against a server
        that does not answer, instead of waiting out the client's retries. None: it waits.
      clock: Unix seconds for metric timestamps (patch it in tests).
      process_index: This process's index (None: `jax.process_index()`); only 0 logs.

    Raises:
      ImportError: `mlflow` is not installed (install the `mlflow` extra).
      TypeError: `experiment_name`, `tracking_uri`, `run_id` or `artifact_location` is not a
        str (or None), or `tags` is not a mapping of str to str (or None).
      ValueError: `resume_step` is negative, or given with no run_id, run_name or collection.
      ConnectionError: no server answers at an http(s) `tracking_uri` within about 15 s
        (see `_check_server`).
    """

    _url_paths = True
    # Write calls only buffer under a lock, and sends are one at a time: a manager whose
    # flush() was abandoned in the client's retries goes on calling it (skipping its writes
    # while that flush was inside lost every value written in `quarantine_s`).
    takes_overlapping_calls = True

    def __init__(
        self,
        experiment_name: str | None = None,
        *,
        tracking_uri: str | None = None,
        collection: str | None = None,
        run_id: str | None = None,
        run_name: str | None = None,
        resume_step: int | None = None,
        tags: Mapping[str, str] | None = None,
        artifact_location: str | None = None,
        flush_secs: float = 5.0,
        max_buffer_mb: float | None = 256.0,
        close_timeout_s: float | None = 60.0,
        clock: Callable[[], float] = time.time,
        process_index: int | None = None,
    ):
        _checks.check_options("MlflowWriter", collection=collection, clock=clock)
        # MLflow's own answers to these were "'int' object has no attribute 'decode'"
        # (tracking_uri = 5, or a Path), "'PosixPath' object has no attribute 'startswith'"
        # (artifact_location) and "expected string or bytes-like object" (run_id).
        problems = _checks.Problems("MlflowWriter")
        for arg, value, example in (
            ("experiment_name", experiment_name, "'my-experiment'"),
            ("tracking_uri", tracking_uri, "'sqlite:///mlflow.db' or 'http://host:5000'"),
            ("run_id", run_id, "'3f8a2b...' (a run's 32 hex digits)"),
            ("artifact_location", artifact_location, "'/data/artifacts' or 's3://b/artifacts'"),
        ):
            if value is not None and not isinstance(value, str):
                fix = (
                    "pass str(path)"
                    if isinstance(value, os.PathLike)
                    else "in gin write it in quotes"
                )
                problems.type_problem(
                    f"{arg} must be a str such as {example}, or None; got {value!r} "
                    f"({type(value).__name__}); {fix}"
                )
        if tags is not None and not isinstance(tags, Mapping):
            # MLflow's answer to `tags = 'team:vision'` (or a list of pairs) was "'str' object
            # has no attribute 'get'", after the experiment was made.
            problems.type_problem(
                f"tags must be a mapping of tag names to values such as {{'team': 'vision'}}, "
                f"or None; got {tags!r} ({type(tags).__name__}); in gin write a dict"
            )
        elif tags is not None and (
            other := {
                k: v for k, v in tags.items() if not (isinstance(k, str) and isinstance(v, str))
            }
        ):
            # A tracking server's client answered {'seed': 1} with "bad argument type for
            # built-in operation" (a SQLite store took it), after the experiment was made.
            problems.type_problem(
                f"tags must map str names to str values, got {other!r}; pass "
                "{'seed': '1'} (str(value)), or log numbers as hparams"
            )
        problems.raise_if_any()
        flush_secs = _checks.check_seconds(flush_secs, "MlflowWriter")
        self._max = _checks.buffer_bytes(max_buffer_mb, "MlflowWriter")
        self._close_timeout = None
        if close_timeout_s is not None:
            what = ("close_timeout_s", "seconds such as 60.0", "None waits for the server")
            self._close_timeout = _checks.check_positive(close_timeout_s, "MlflowWriter", *what)
        self.dropped = _storage.Dropped("MlflowWriter", self._max)
        mlflow, resume_step, here = self._start("mlflow", resume_step, process_index)
        if resume_step is not None and run_id is None and not (run_name or collection):
            # It warned "found no run named None" and started a new run, never having looked.
            raise ValueError(
                f"MlflowWriter: resume_step={resume_step} needs the run to resume; pass "
                "run_id=, or the run_name (or collection) the run was created with."
            )
        from mlflow.entities import Metric
        from mlflow.exceptions import MlflowException
        from mlflow.utils import validation
        from requests import HTTPError  # a dependency of mlflow's: its artifact uploads raise it

        self._metric, self._error, self._validation = Metric, MlflowException, validation
        self._http_error = HTTPError
        self._clock = clock
        self._client: Any = None
        self.run_id: str | None = None
        self._last_steps: dict[str, int] = {}
        self._warned_skip = False
        self._stamp = -1  # ms of the last write_scalars: each later one's is greater
        self._valid_names: set[tuple[bool, str]] = set()  # (is a param, name) MLflow accepts
        self._params_logged: dict[str, str] = {}  # the run's params: they never change
        self._lock = threading.Lock()  # guards the buffer below
        self._sending = threading.Lock()  # one send at a time, in order
        self._pending_params: list[Any] = []
        self._pending_metrics: list[Any] = []
        self._pending_files: dict[str, bytes] = {}
        self._in_flight = 0  # metrics and files taken out of the buffer by a send under way
        self._close_state: str | None = None  # "done", or "failed": a later close() sends
        if not here:
            return
        self._client = client = mlflow.MlflowClient(tracking_uri)
        _check_server(client)
        run_name = run_name or collection
        self._owned = run_id is None or resume_step is not None
        if run_id is None and resume_step is not None:  # the latest run named run_name
            found = client.get_experiment_by_name(experiment_name or "Default")
            runs = []
            if found is not None and run_name:
                runs = _latest_run_named(client, found.experiment_id, run_name)
            if runs:
                run_id = runs[0].info.run_id
            else:  # an eval whose first summary the preempted run never reached
                logging.warning(
                    "MlflowWriter: resume_step=%d found no run named %r in experiment %r, so "
                    "a new run starts (nothing to rewind). If one exists, pass run_id=, or the "
                    "run_name it was created with (it defaults to the collection).",
                    resume_step,
                    run_name,
                    experiment_name,
                )
                resume_step = None
        if run_id is None:
            if experiment_name is None:
                experiment_id = "0"  # MLflow's "Default" experiment
            elif (found := client.get_experiment_by_name(experiment_name)) is not None:
                experiment_id = found.experiment_id
            else:
                experiment_id = client.create_experiment(
                    experiment_name, artifact_location=artifact_location
                )
            run_id = client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
        else:
            data = client.get_run(run_id).data
            self._params_logged = dict(data.params)
            if resume_step is not None:
                client.update_run(run_id, status="RUNNING")
                # Each metric's latest point, which every store picks by (step, timestamp,
                # value), has its last step: reading each history took minutes on long runs.
                self._last_steps = {m.key: m.step for m in data.to_proto().metrics}
        self.run_id = run_id
        self._stop_timer = _base.flush_every(
            self, flush_secs, f"MlflowWriter(run {run_id})", last=self._last_send
        )

    def flush(self) -> None:
        """Sends everything buffered; what failed to send stays buffered.

        Raises:
          ValueError: the store refused some values (they are dropped; the rest was sent).
          Exception: the client's error, when the tracker cannot be reached.
        """
        super().flush()

    def close(self) -> None:
        """Stops the timer, sends the buffer and ends the run if this writer started or
        resumed it (FAILED where a `with` block of the writer raised, as `with
        mlflow.start_run()`; KILLED where a signal's default action ends the process; else
        FINISHED); idempotent once it went through. Raises as `flush()` does (the run is then
        left running, and what failed stays buffered: a later `close()` tries again).

        Raises:
          TimeoutError: the server did not answer within `close_timeout_s` (MLflow's client
            retries a request for about 4 minutes by default); what was not sent is named, and is still
            sent if the server answers before the process ends (or a later `close()` waits again).
        """
        if self._closed and self._close_state == "done":
            return
        self._closed = True
        if self._client is None:
            return
        if self._close_state == "failed":  # the timer's thread ended: send from this one
            self._last_send()
            self._close_state = "done"
            return
        # The timer's thread sends and ends the run: it may be in the client's retries.
        try:
            stopped = self._stop_timer(self._close_timeout)
        except BaseException:
            self._close_state = "failed"
            raise
        if stopped:
            self._close_state = "done"
        else:
            with self._lock:
                waiting = self._in_flight + len(self._pending_metrics) + len(self._pending_files)
            raise TimeoutError(
                f"MlflowWriter(run {self.run_id}): close() gave up after "
                f"{self._close_timeout:g} s without an answer from the tracking server; up to "
                f"{waiting} metric(s) and file(s) are not sent yet (sent if it answers before "
                "the process ends). Raise close_timeout_s, or lower "
                "MLFLOW_HTTP_REQUEST_MAX_RETRIES."
            )

    def _last_send(self) -> None:
        self._flush()
        if self._owned:
            self._end_run()

    def _flush(self) -> None:
        if self._client is None:
            return
        with self._sending:
            with self._lock:
                params, self._pending_params = self._pending_params, []
                metrics, self._pending_metrics = self._pending_metrics, []
                files, self._pending_files = self._pending_files, {}
                self._in_flight = len(metrics) + len(files)
            refused: list[str] = []
            failed: BaseException | None = None
            try:
                for kind, pending, limit in (
                    ("params", params, self._validation.MAX_PARAMS_TAGS_PER_BATCH),
                    ("metrics", metrics, self._validation.MAX_METRICS_PER_BATCH),
                ):
                    while pending:
                        self._send(refused, kind, pending[:limit])
                        del pending[:limit]
                if files:
                    self._send(refused, "artifacts", files)
                    files = {}
                self.dropped.outage = False
            except BaseException as err:
                failed = err
                raise
            finally:  # what was not sent goes back before what came meanwhile
                with self._lock:
                    self._pending_params[:0], self._pending_metrics[:0] = params, metrics
                    self._pending_files = {**files, **self._pending_files}
                    self._in_flight = 0
                    if failed is not None:
                        self._trim(failed)
            if refused:
                raise ValueError(
                    f"MlflowWriter: run {self.run_id} refused {'; '.join(refused)}; "
                    "those values are dropped, the rest was sent."
                )

    def _trim(self, err: BaseException) -> None:
        """Under the lock: drops the oldest metrics, then files, past `max_buffer_mb`."""
        files = self._pending_files
        over: float = len(self._pending_metrics) * _METRIC_BYTES + sum(map(len, files.values()))
        over -= self._max
        cut = min(math.ceil(max(over, 0) / _METRIC_BYTES), len(self._pending_metrics))
        del self._pending_metrics[:cut]
        over -= cut * _METRIC_BYTES
        while over > 0 and len(files) > 1:
            over -= len(files.pop(next(iter(files))))
            cut += 1
        self.dropped.add(cut, err)

    def _send(self, refused: list[str], kind: str, batch: Any) -> None:
        """Sends params, metrics (lists) or artifacts (path: bytes); notes refusals in `refused`."""
        try:
            if kind == "artifacts":
                with tempfile.TemporaryDirectory() as tmp:
                    unwritable = []
                    for path, data in batch.items():
                        try:
                            _base.write_tree(tmp, {path: data})
                        except (OSError, ValueError) as err:
                            if getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
                                raise  # a full disk passes: the files wait for the next send
                            unwritable.append(f"{path!r}: {err}")  # would fail every send
                    if unwritable:
                        refused.append(f"{len(unwritable)} files ({'; '.join(unwritable[:3])})")
                    try:
                        self._client.log_artifacts(self.run_id, tmp)
                    except self._http_error as err:
                        if not _refusal(getattr(err.response, "status_code", 0)):
                            raise
                        # One file the server refused ended the upload of the files after it.
                        self._send_each(refused, tmp, batch)
            else:
                self._client.log_batch(self.run_id, **{kind: batch})
        except self._error as err:  # a client error (4xx) comes back the same every time
            if not _refusal(err.get_http_status_code()):
                raise
            if kind == "params" and len(batch) > 1:  # one changed param fails its whole batch
                for param in batch:
                    self._send(refused, kind, [param])
                return
            names = sorted({getattr(x, "key", x) for x in batch})
            refused.append(
                f"{len(batch)} {kind} ({', '.join(names[:5])}{', ...' * (len(names) > 5)}): {err}"
            )

    def _send_each(self, refused: list[str], tmp: str, files: Mapping[str, bytes]) -> None:
        """Uploads each of `files` (written under `tmp`) on its own, noting in `refused` those
        the artifact server refuses with a 4xx: each was retried at every later send before
        (a 400 for a path the server's store refuses, every send failing the same way, close()
        too, and the run left RUNNING); a transient error raises, and the files wait."""
        failed: list[tuple[str, BaseException]] = []
        for path in files:
            local = os.path.join(tmp, *path.split("/"))
            if not os.path.isfile(local):
                continue  # it could not be written: noted by the caller
            try:
                self._client.log_artifact(self.run_id, local, path.rpartition("/")[0] or None)
            except self._http_error as err:
                if not _refusal(getattr(err.response, "status_code", 0)):
                    raise
                failed.append((path, err))
        if failed:
            names = [path for path, _ in failed]
            refused.append(
                f"{len(names)} files ({', '.join(names[:5])}{', ...' * (len(names) > 5)}): "
                f"{failed[0][1]}"
            )

    def key_problem(self, method: str, keys: Iterable[str]) -> str | None:
        """The names the store would refuse at a send (MLflow's own check: characters,
        path-like names, length), or artifact paths a file system would."""
        if method not in ("write_scalars", "write_hparams"):
            return super().key_problem(method, keys)
        params = method == "write_hparams"
        bad = []
        for name in keys:
            if (params, name) not in self._valid_names:
                try:
                    if params:
                        self._validation._validate_param(name, "")
                    else:
                        self._validation._validate_metric(name, 0.0, 0, 0)
                    self._valid_names.add((params, name))
                except self._error as err:
                    bad.append(f"{name!r}: {err.message}")
        return f"MLflow refuses the names {'; '.join(bad)}" if bad else None

    def _scalars(self, step: int, numbers: dict[str, int | float]) -> None:
        self._refuse_keys("write_scalars", numbers)
        if self._client is None:
            return
        if self._last_steps:  # resumed: skip the points the run's history already has
            kept = {k: v for k, v in numbers.items() if step > self._last_steps.get(k, -1)}
            if len(kept) < len(numbers) and not self._warned_skip:
                self._warned_skip = True
                logging.warning(
                    "MlflowWriter: resumed run %s already has %s at step %d; metric history "
                    "cannot be rewritten, so points up to each metric's last logged step are "
                    "skipped.",
                    self.run_id,
                    sorted(set(numbers) - set(kept)),
                    step,
                )
            numbers = kept
        with self._lock:
            # MLflow's store keeps one point per key, step, timestamp and value: the same
            # value written twice in a millisecond was one point. Later by 1 ms where needed.
            self._stamp = stamp = max(int(self._clock() * 1000), self._stamp + 1)
            self._pending_metrics += [
                self._metric(k, _encode.as_float(v), stamp, step) for k, v in numbers.items()
            ]

    def _pictures(self, method: str, step: int, images: dict[str, Any]) -> None:
        files = self._encoded(images, lambda v: [_encode.png(i) for i in v])
        self._files(method, method.removeprefix("write_"), step, files, ".png")

    def _audios(self, step: int, clips: dict[str, Any], sample_rate: int) -> None:
        files = self._encoded(clips, lambda v: [_encode.wav(c, sample_rate) for c in v])
        self._files("write_audios", "audio", step, files, ".wav")

    def _texts(self, step: int, texts: dict[str, str]) -> None:
        self._files("write_texts", "texts", step, {k: v.encode() for k, v in texts.items()})

    _file_methods = frozenset(
        {"write_summaries", "write_texts", "write_images", "write_videos", "write_audios"}
        | {"write_histograms"}
    )

    def _histograms(self, step: int, arrays: dict[str, Any], buckets: dict) -> None:
        given = {k: (v, buckets.get(k)) for k, v in arrays.items()}
        files = self._encoded(given, lambda a: json.dumps(_encode.histogram(*a)).encode())
        self._files("write_histograms", "histograms", step, files, ".json")

    def _params(self, hparams: dict[str, Any]) -> None:
        self._refuse_keys("write_hparams", hparams)
        if self._client is None:
            return
        # MLflow's own check (private, as is `_validate_metric`): it truncates long values.
        params = [self._validation._validate_param(k, str(v)) for k, v in hparams.items()]
        with self._lock:
            # A run resumed from before narrow floats were written as their shortest digits
            # holds '0.10000000149011612' where a float32 0.1 now writes '0.1': the same value,
            # kept as logged (sending the new form failed as a changed param).
            params = [
                p
                for p in params
                if not _same_narrow_float(self._params_logged.get(p.key, p.value), p.value)
            ]
            # A param never changes in MLflow: refused here, not dropped at a later send.
            if changed := [
                f"{p.key!r}: {self._params_logged[p.key]!r} -> {p.value!r}"
                for p in params
                if self._params_logged.get(p.key, p.value) != p.value
            ]:
                raise ValueError(
                    f"{self._name('write_hparams')}: MLflow params never change, and run "
                    f"{self.run_id} has {', '.join(changed)}; none of these params went to "
                    "MLflow. Log a value that changes as a metric (write_scalars), or start a "
                    "new run."
                )
            self._params_logged.update((p.key, p.value) for p in params)
            self._pending_params += params

    def _end_run(self) -> None:
        status = "FAILED" if self._failed else "FINISHED"
        self._client.set_terminated(self.run_id, "KILLED" if self.ending_signal else status)

    def _store(self, paths: dict[str, bytes]) -> None:
        if self._client is None:
            return
        with self._lock:
            self._pending_files.update(paths)


def _refusal(status: int) -> bool:
    """Whether an HTTP status refuses what was sent, and would again: a 4xx, but for 408
    (Request Timeout) and 429 (Too Many Requests), which pass as a 5xx does."""
    return 400 <= status < 500 and status not in (408, 429)


def _check_server(client: Any) -> None:
    """Raises ConnectionError, naming the URI, where no server answers at an http(s) tracking
    URI. MLflow's client retries a refused connection 7 times over about 4 minutes by default
    (249 s measured), so a writer made against a server that was down or a mistyped port
    stalled the program that long at start before failing. Any HTTP answer will do (a 404 or
    401 too: the calls after it report those); what the MLFLOW_HTTP_REQUEST_* variables set is
    kept, and only their unset defaults are shortened here (`_START_RETRIES`), for this one
    request: the run's later requests retry as MLflow's client does."""
    uri = client.tracking_uri
    if not uri.startswith(("http://", "https://")):
        return  # a database or a file store, or a Databricks workspace with its own client
    from mlflow import environment_variables as env
    from mlflow.exceptions import MlflowException
    from mlflow.utils import rest_utils

    retries = None if env.MLFLOW_HTTP_REQUEST_MAX_RETRIES.defined else _START_RETRIES
    backoff = None if env.MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR.defined else _START_BACKOFF
    timeout = None
    if not env.MLFLOW_HTTP_REQUEST_TIMEOUT.defined:  # (connect, read): only connecting is cut
        timeout = (_START_CONNECT_S, env.MLFLOW_HTTP_REQUEST_TIMEOUT.get())
    start = time.monotonic()
    try:
        rest_utils.http_request(
            client._tracking_client.store.get_host_creds(),
            "/health",
            "GET",
            max_retries=retries,
            backoff_factor=backoff,
            timeout=timeout,
            raise_on_status=False,
        )
    except MlflowException as err:
        raise ConnectionError(
            f"MlflowWriter: no MLflow tracking server answered at {uri} (tried for "
            f"{time.monotonic() - start:.0f} s: {err.message}). Start the server there, or pass "
            "the tracking_uri= (or set MLFLOW_TRACKING_URI to the URI) of one that runs; "
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES and MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR set how long "
            "this waits for a server that is still starting."
        ) from err


def _latest_run_named(client: Any, experiment_id: str, name: str) -> list[Any]:
    """The latest run named `name` (a list of 0 or 1). MLflow's filter strings have no escape:
    a quote of the other kind surrounds the name, and one holding both is matched here."""
    order = ["attributes.start_time DESC"]
    if quote := next((q for q in "'\"" if q not in name), None):
        where = f"tags.`mlflow.runName` = {quote}{name}{quote}"
        return client.search_runs([experiment_id], where, order_by=order, max_results=1)
    token = None
    while True:
        page = client.search_runs([experiment_id], order_by=order, page_token=token)
        if found := [run for run in page if run.info.run_name == name]:
            return found[:1]
        if not (token := page.token):
            return []


def _same_narrow_float(logged: str, value: str) -> bool:
    """Whether param `logged` is a float32, float16 or bfloat16 value in full digits
    ('0.10000000149011612') whose shortest digits (`_encode.shortest`) are `value` ('0.1')."""
    if logged == value:
        return False
    try:
        before, after = float(logged), float(value)
    except ValueError:
        return False
    import ml_dtypes  # noqa: PLC0415  (JAX's own dependency: its bfloat16)

    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        with np.errstate(over="ignore"):
            exact = float(np.asarray(before).astype(dtype)) == before
        if exact and _encode.shortest(before, dtype) == after:
            return True
    return False
