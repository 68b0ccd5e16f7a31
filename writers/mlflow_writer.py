"""`MlflowWriter`: MLflow runs through `MlflowClient`, one tracker call per write call.

Needs the `mlflow` extra (`pip install 'jax-metrics-manager[mlflow]'`); `mlflow` is
imported when the first writer is made, never by `import writers`. Works with any
tracking store: a server (`http://host:5000`), a database (`sqlite:///mlflow.db`,
no server needed). Only process 0 (`jax.process_index()`, or `process_index`)
creates a run and logs; the other processes check their inputs and log nothing.

Where values land (what `MlflowClient` reads back):

* scalars: metrics, one `log_batch` per call with every key (1000 metrics per
  batch at most, MLflow's limit: bigger calls are split into 1000-metric
  batches); NaN is kept, infinities are stored as MLflow stores them (the
  SQL store clamps them to +-1.797e308);
* hparams: params (`log_batch`, 100 per batch); MLflow params never change, so
  writing a different value for a key the run already has raises MLflow's error;
* texts, images, videos, audio, histograms: artifacts, all files of one call
  uploaded by one `log_artifacts`, at `<kind>/<key>/step_<step 8 digits>[_<i>].<ext>`:
  texts `.txt`, images `.png` (one per image of `[N, H, W, C]`), videos as filmstrip
  PNGs `[H, T*W, C]`, audio 16-bit `.wav` clips, histograms `.json`
  (`{"edges", "counts", "count", "min", "max", "mean"}`); keys must then be
  relative paths (no `..`, `.` or empty parts);
* raw tensors (`write_summaries`): MLflow has no such type: raises `NotImplementedError`.

Resume: `resume_step=R` attaches to `run_id`, or to the latest run named
`run_name` in the experiment. MLflow's metric history is append-only (no API
deletes a point), so the writer first reads, for every metric of the run, the last
step logged, and then skips any (key, step) at or before it, logging once (absl
warning) how many it skipped: read back per step, each step has exactly one point,
the earlier run's for steps it had already logged. Artifacts of a re-logged step
are replaced. Repeated keys at one step (outside resume) are recorded as given.

Example:
  >>> import os, tempfile, writers
  >>> uri = "sqlite:///" + os.path.join(tempfile.mkdtemp(), "mlflow.db")
  >>> w = writers.MlflowWriter("demo", tracking_uri=uri, process_index=0)
  >>> w.write_scalars(1, {"loss": 0.5, "accuracy": 0.75})  # one log_batch, two metrics
  >>> w.close()
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from absl import logging

from writers import _checks, _encode, _trackers
from writers._base import BaseWriter
from writers.interface import Array, Scalar


class MlflowWriter(BaseWriter):
    """Logs every write call to an MLflow run with one `MlflowClient` call.

    Args:
      experiment_name: Experiment of a new run (created if missing; None: MLflow's
        "Default").
      tracking_uri: Tracking store (None: MLflow's default, `MLFLOW_TRACKING_URI`).
      collection: Name of what is logged (`train`, `eval/task`): the default run name.
      run_id: Log into this existing run (it is left running by `close()` unless resumed).
      run_name: Name of a new run, or of the run to resume (default: `collection`).
      resume_step: Resume the run at this step (see the module docstring).
      tags: Tags of a new run.
      artifact_location: Where a new experiment keeps its artifacts (None: the
        store's default; for a database store without a server, `./mlruns`).
      clock: Unix seconds for metric timestamps (patch it in tests).
      process_index: This process's index (None: `jax.process_index()`); only 0 logs.

    Raises:
      ImportError: `mlflow` is not installed (install the `mlflow` extra).
      ValueError: `resume_step` finds no run to resume, or is negative.
    """

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
        clock: Callable[[], float] = time.time,
        process_index: int | None = None,
    ):
        mlflow = _trackers.import_extra("mlflow", "mlflow", "MlflowWriter")
        from mlflow.entities import Metric, Param
        from mlflow.utils import validation

        self._metric, self._param = Metric, Param
        self._max_metrics = validation.MAX_METRICS_PER_BATCH
        self._max_params = validation.MAX_PARAMS_TAGS_PER_BATCH
        if resume_step is not None:
            resume_step = _checks.check_step(resume_step, "MlflowWriter(resume_step=...)")
        self._clock = clock
        self._client: Any = None
        self.run_id: str | None = None
        self._last_steps: dict[str, int] = {}
        self._skipped = 0
        self._owned = False
        if not _trackers.writes_here(process_index):
            return
        self._client = client = mlflow.MlflowClient(tracking_uri)
        run_name = run_name or collection
        self._owned = run_id is None or resume_step is not None
        if run_id is None and resume_step is not None:
            run_id = self._find_run(experiment_name, run_name, resume_step)
        if run_id is None:
            experiment_id = "0"  # MLflow's "Default" experiment
            if experiment_name is not None:
                found = client.get_experiment_by_name(experiment_name)
                if found is not None:
                    experiment_id = found.experiment_id
                else:
                    experiment_id = client.create_experiment(
                        experiment_name, artifact_location=artifact_location
                    )
            run_id = client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
        elif resume_step is not None:
            client.update_run(run_id, status="RUNNING")
            for key in client.get_run(run_id).data.metrics:
                self._last_steps[key] = max(m.step for m in client.get_metric_history(run_id, key))
        self.run_id = run_id

    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Raises `NotImplementedError`: MLflow has no raw-tensor type."""
        self._begin("write_summaries", step, values)
        raise NotImplementedError(
            f"MlflowWriter.write_summaries: MLflow has no raw-tensor type, so {sorted(values)} "
            "cannot be stored. Write them as scalars (one element) or histograms instead."
        )

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        """Logs every number of the call as a metric in one `log_batch` (1000 per batch)."""
        step = self._begin("write_scalars", step, scalars)
        numbers = _checks.check_numbers(scalars, "MlflowWriter.write_scalars")
        if self._client is None:
            return
        if self._last_steps:
            numbers = self._not_logged_before(step, numbers)
        stamp = int(self._clock() * 1000)
        metrics = [self._metric(k, float(v), stamp, step) for k, v in numbers.items()]
        for start in range(0, len(metrics), self._max_metrics):
            chunk = metrics[start : start + self._max_metrics]
            self._client.log_batch(self.run_id, metrics=chunk)

    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        """Uploads each image as `images/<key>/step_<step>_<i>.png`."""
        step = self._begin("write_images", step, images)
        arrays = _checks.check_images(images, "MlflowWriter.write_images")
        files = {k: [_encode.png(i) for i in _checks.images_as_uint8(v)] for k, v in arrays.items()}
        self._upload("write_images", "images", step, files, ".png")

    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        """Uploads each `[N, T, H, W, C]` video as N filmstrip PNGs `[H, T*W, C]`."""
        step = self._begin("write_videos", step, videos)
        arrays = _checks.check_videos(videos, "MlflowWriter.write_videos")
        files = {k: [_encode.png(i) for i in _trackers.filmstrip(v)] for k, v in arrays.items()}
        self._upload("write_videos", "videos", step, files, ".png")

    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        """Uploads each clip of `[N, T, C]` as `audio/<key>/step_<step>_<i>.wav`."""
        step = self._begin("write_audios", step, audios)
        arrays = _checks.check_audios(audios, sample_rate, "MlflowWriter.write_audios")
        files = {k: [_encode.wav(c, sample_rate) for c in v] for k, v in arrays.items()}
        self._upload("write_audios", "audio", step, files, ".wav")

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Uploads each text as `texts/<key>/step_<step>.txt` (UTF-8)."""
        step = self._begin("write_texts", step, texts)
        checked = _checks.check_texts(texts, "MlflowWriter.write_texts")
        self._upload("write_texts", "texts", step, {k: v.encode() for k, v in checked.items()})

    def write_histograms(
        self,
        step: int,
        arrays: Mapping[str, Array],
        num_buckets: Mapping[str, int] | None = None,
    ) -> None:
        """Uploads each histogram as `histograms/<key>/step_<step>.json` (edges and counts)."""
        step = self._begin("write_histograms", step, arrays)
        checked = _checks.check_histograms(arrays, "MlflowWriter.write_histograms")
        buckets = num_buckets or {}
        files = {}
        for key, arr in checked.items():
            counts, edges = _checks.bucketize(arr, buckets.get(key))
            flat = arr.astype(np.float64).reshape(-1)
            files[key] = json.dumps(
                {
                    "edges": edges.tolist(),
                    "counts": counts.tolist(),
                    "count": int(flat.size),
                    "min": float(flat.min()),
                    "max": float(flat.max()),
                    "mean": float(flat.mean()),
                }
            ).encode()
        self._upload("write_histograms", "histograms", step, files, ".json")

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Logs the hyperparameters as params (strings), 100 per `log_batch`."""
        self._check_open("write_hparams")
        _checks.check_keys(hparams, "MlflowWriter.write_hparams")
        if self._client is None:
            return
        params = [self._param(k, str(_trackers.hparam(v))) for k, v in hparams.items()]
        for start in range(0, len(params), self._max_params):
            self._client.log_batch(self.run_id, params=params[start : start + self._max_params])

    def flush(self) -> None:
        """Does nothing: every call has reached the tracking store when it returns."""

    def close(self) -> None:
        """Marks the run FINISHED if this writer created or resumed it; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._client is not None and self._owned:
            self._client.set_terminated(self.run_id)

    def _find_run(self, experiment: str | None, name: str | None, resume_step: int) -> str:
        found = self._client.get_experiment_by_name(experiment or "Default")
        runs = []
        if found is not None and name:
            runs = self._client.search_runs(
                [found.experiment_id],
                filter_string=f"tags.`mlflow.runName` = '{name}'",
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
        if not runs:
            raise ValueError(
                f"MlflowWriter: resume_step={resume_step} found no run named {name!r} in "
                f"experiment {experiment!r}. Pass run_id=, or the run_name the run was "
                "created with (it defaults to the collection)."
            )
        return runs[0].info.run_id

    def _not_logged_before(self, step: int, numbers: dict[str, Any]) -> dict[str, Any]:
        kept = {k: v for k, v in numbers.items() if step > self._last_steps.get(k, -1)}
        if len(kept) < len(numbers) and not self._skipped:
            logging.warning(
                "MlflowWriter: resumed run %s already has %s at step %d; MLflow metric "
                "history cannot be rewritten, so the earlier points are kept and points up "
                "to each metric's last logged step are skipped.",
                self.run_id,
                sorted(set(numbers) - set(kept)),
                step,
            )
        self._skipped += len(numbers) - len(kept)
        return kept

    def _upload(
        self, method: str, kind: str, step: int, files: dict[str, Any], ext: str = ".txt"
    ) -> None:
        bad = [k for k in files if any(p in ("", ".", "..") for p in k.split("/"))]
        if bad:
            raise ValueError(
                f"MlflowWriter.{method}: keys {bad} become artifact paths {kind}/<key>/..., "
                "so they must be relative paths without '', '.' or '..' parts. Rename them, "
                "e.g. 'eval/sample'."
            )
        if self._client is None:
            return
        with tempfile.TemporaryDirectory() as tmp:
            for key, content in files.items():
                folder = os.path.join(tmp, *key.split("/"))
                os.makedirs(folder, exist_ok=True)
                many = isinstance(content, list)
                for i, data in enumerate(content if many else [content]):
                    name = f"step_{step:08d}_{i}{ext}" if many else f"step_{step:08d}{ext}"
                    with open(os.path.join(folder, name), "wb") as f:
                        f.write(data)
            self._client.log_artifacts(self.run_id, tmp, artifact_path=kind)
