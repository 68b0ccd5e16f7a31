"""`MlflowWriter`: MLflow runs through `MlflowClient`, one tracker call per write call.

Needs the `mlflow` extra (imported when the first writer is made). Works with any tracking
store: a server (`http://host:5000`) or a database (`sqlite:///mlflow.db`, no server). Only
process 0 creates a run and logs; the others check their inputs and log nothing.

Where values land: scalars are metrics, one `log_batch` per call (split into batches of
MLflow's 1000-metric limit; NaN kept, infinities as the store keeps them: the SQL store
clamps them to +-1.797e308); hparams are params (100 per batch; MLflow params never change,
so a different value for a key the run has raises MLflow's error). Texts, images, videos,
audio, histograms and raw tensors are artifacts, all files of one call in one
`log_artifacts`, at `<kind>/<key>/step_<step 8 digits>[_<i>].<ext>`: `.txt`, `.png` per
image, filmstrip `.png` `[H, T*W, C]` per video, 16-bit `.wav` per clip, histograms as
`.json` (`count`, `min`, `max`, `mean`, `edges`, `counts`), raw tensors (`write_summaries`)
as exact `.npy` files under `summaries/` (TensorBoard's metadata is not kept); keys must
then be relative paths (no `..`, `.` or empty parts).

Resume: `resume_step=R` attaches to `run_id`, or to the latest run named `run_name`.
MLflow's metric history is append-only, so the writer first reads each metric's last logged
step and skips any (key, step) at or before it, with one absl warning: each step keeps
exactly one point, the earlier run's where it had one. Artifacts of a re-logged step are
replaced. Outside resume, repeated keys at one step are recorded as given.

Example:
  >>> import os, tempfile, writers
  >>> uri = "sqlite:///" + os.path.join(tempfile.mkdtemp(), "mlflow.db")
  >>> w = writers.MlflowWriter("demo", tracking_uri=uri, process_index=0)
  >>> w.write_scalars(1, {"loss": 0.5, "accuracy": 0.75})  # one log_batch, two metrics
  >>> w.close()
"""

import json
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from absl import logging

from writers import _base, _encode


class MlflowWriter(_base.TrackerWriter):
    """Logs every write call to an MLflow run with one `MlflowClient` call.

    Args:
      experiment_name: Experiment of a new run (created if missing; None: "Default").
      tracking_uri: Tracking store (None: MLflow's default, `MLFLOW_TRACKING_URI`).
      collection: What is logged (`train`, `eval/task`): the default run name.
      run_id: Log into this existing run (left running by `close()` unless resumed).
      run_name: Name of a new run, or of the run to resume (default: `collection`).
      resume_step: Resume the run at this step (see the module docstring).
      tags: Tags of a new run.
      artifact_location: Artifact root of a new experiment (None: the store's default).
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
        mlflow, resume_step, here = self._start("mlflow", resume_step, process_index)
        from mlflow.entities import Metric, Param
        from mlflow.utils import validation

        self._metric, self._param = Metric, Param
        self._max_metrics = validation.MAX_METRICS_PER_BATCH
        self._max_params = validation.MAX_PARAMS_TAGS_PER_BATCH
        self._clock = clock
        self._client: Any = None
        self.run_id: str | None = None
        self._last_steps: dict[str, int] = {}
        self._skipped = 0
        if not here:
            return
        self._client = client = mlflow.MlflowClient(tracking_uri)
        run_name = run_name or collection
        self._owned = run_id is None or resume_step is not None
        if run_id is None and resume_step is not None:  # the latest run named run_name
            found = client.get_experiment_by_name(experiment_name or "Default")
            runs = []
            if found is not None and run_name:
                runs = client.search_runs(
                    [found.experiment_id],
                    filter_string=f"tags.`mlflow.runName` = '{run_name}'",
                    order_by=["attributes.start_time DESC"],
                    max_results=1,
                )
            if not runs:
                raise ValueError(
                    f"MlflowWriter: resume_step={resume_step} found no run named {run_name!r} in "
                    f"experiment {experiment_name!r}. Pass run_id=, or the run_name the run was "
                    "created with (it defaults to the collection)."
                )
            run_id = runs[0].info.run_id
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

    def _scalars(self, step: int, numbers: dict[str, int | float]) -> None:
        if self._client is None:
            return
        if self._last_steps:  # resumed: skip the points the run's history already has
            kept = {k: v for k, v in numbers.items() if step > self._last_steps.get(k, -1)}
            if len(kept) < len(numbers) and not self._skipped:
                logging.warning(
                    "MlflowWriter: resumed run %s already has %s at step %d; metric history "
                    "cannot be rewritten, so points up to each metric's last logged step are "
                    "skipped.",
                    self.run_id,
                    sorted(set(numbers) - set(kept)),
                    step,
                )
            self._skipped += len(numbers) - len(kept)
            numbers = kept
        stamp = int(self._clock() * 1000)
        metrics = [self._metric(k, float(v), stamp, step) for k, v in numbers.items()]
        for start in range(0, len(metrics), self._max_metrics):
            self._client.log_batch(self.run_id, metrics=metrics[start : start + self._max_metrics])

    def _pictures(self, method: str, step: int, images: dict[str, Any]) -> None:
        files = {k: [_encode.png(i) for i in v] for k, v in images.items()}
        self._files(method, method.removeprefix("write_"), step, files, ".png")

    def _audios(self, step: int, clips: dict[str, Any], sample_rate: int) -> None:
        files = {k: [_encode.wav(c, sample_rate) for c in v] for k, v in clips.items()}
        self._files("write_audios", "audio", step, files, ".wav")

    def _texts(self, step: int, texts: dict[str, str]) -> None:
        self._files("write_texts", "texts", step, {k: v.encode() for k, v in texts.items()})

    def _histograms(self, step: int, arrays: dict[str, Any], buckets: dict) -> None:
        hists = {k: _encode.histogram(v, buckets.get(k)) for k, v in arrays.items()}
        files = {k: json.dumps(h).encode() for k, h in hists.items()}
        self._files("write_histograms", "histograms", step, files, ".json")

    def _params(self, hparams: dict[str, Any]) -> None:
        if self._client is None:
            return
        params = [self._param(k, str(v)) for k, v in hparams.items()]
        for start in range(0, len(params), self._max_params):
            self._client.log_batch(self.run_id, params=params[start : start + self._max_params])

    def _end_run(self) -> None:
        self._client.set_terminated(self.run_id)

    def _store(self, paths: dict[str, bytes]) -> None:
        if self._client is None:
            return
        with tempfile.TemporaryDirectory() as tmp:
            _base.write_tree(tmp, paths)
            self._client.log_artifacts(self.run_id, tmp)
