"""`WandbWriter`: Weights & Biases runs, one `run.log` per write call.

Needs the `wandb` extra (`pip install 'jax-metrics-manager[wandb]'`); `wandb` is
imported when the first writer is made, never by `import writers`. Each write call
becomes one `run.log(values, step=step)` with every key of the call (never one call
per value). Only process 0 (`jax.process_index()`, or `process_index`) creates a
run and logs; the other processes check their inputs and log nothing.

Where values land (W&B history, one row per step):

* scalars: numbers (NaN and infinities kept as they are);
* texts: strings;
* images: `wandb.Image`s, a list of N per key for `[N, H, W, C]` (needs Pillow,
  part of the extra);
* videos `[N, T, H, W, C]`: each video as one filmstrip image `[H, T*W, C]`
  (`wandb.Video` would need moviepy);
* audio `[N, T, C]`: one `wandb.Audio` 16-bit WAV clip under the key, or under
  `<key>/<i>` when N > 1 (as TensorBoardWriter names them; a list of clips per key
  would need soundfile);
* histograms: `wandb.Histogram` of `num_buckets` equal-width buckets (30 by
  default; W&B stores at most 512, more raises `ValueError`);
* hparams: the run's config (`run.config.update`, values may change);
* raw tensors (`write_summaries`): W&B has no such type: raises `NotImplementedError`.

W&B's limits, enforced here instead of dropped silently: history steps never
decrease within a run (W&B drops a `log` at a step below the last one), so such a
write raises `ValueError`; several calls at one step fill one row, and a key
written twice at one step keeps the last value. `flush()` does nothing (W&B's
service writes in the background); `close()` finishes runs this writer started
(`run.finish()`, which waits for W&B's service). Offline, wandb 0.31's `finish()`
can return a few milliseconds before the service has appended the last records
to the local run file (about 1 run in 15 here); readers of that file should wait
for its `exit` record.

Run identity: `run_id=None` starts a new run; `run_id` alone attaches to that
run (creating it if missing, `resume="allow"`); `run_id` with `resume_step=R`
rewinds it to step R (`resume_from="<id>?_step=R"`): history after R is replaced
by what this run logs, and steps up to R raise. Online, W&B's server applies the
rewind at once. Offline (`WANDB_MODE=offline`) nothing can be rewound locally:
the new offline run directory holds only steps after R and its run record names
the rewind point, which `wandb sync` hands to the server; the earlier run's
directory still holds its own steps. With `collection` set (one run per
collection, as `MetricsManager` builds writers), the run's name defaults to the
collection and its id is `<run_id>-<collection>` (`/` replaced by `-`).

Example:
  >>> import tempfile, writers
  >>> w = writers.WandbWriter("demo", logdir=tempfile.mkdtemp(), mode="offline", process_index=0)
  >>> w.write_scalars(1, {"loss": 0.5, "accuracy": 0.75})  # one run.log, two values
  >>> w.close()
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from writers import _checks, _encode, _trackers
from writers._base import BaseWriter
from writers.interface import Array, Scalar

MAX_HISTOGRAM_BUCKETS = 512  # wandb.Histogram's limit


class WandbWriter(BaseWriter):
    """Logs every write call to a W&B run as one `run.log`.

    Args:
      project: W&B project (None: W&B's default, e.g. `WANDB_PROJECT`).
      logdir: Directory for W&B's local files (`<logdir>/wandb/...`).
      collection: Name of what is logged (`train`, `eval/task`): the default run
        name, and the suffix of the run id when `run_id` is given.
      run_id: Attach to (or create) the run with this id.
      resume_step: Rewind run `run_id` to this step (steps after it are replaced).
      name: Display name of the run (default: `collection`).
      group: W&B group of the run (e.g. the experiment shared by train and eval).
      entity: W&B entity (user or team).
      mode: "online", "offline" or "disabled" (None: W&B's default, `WANDB_MODE`).
      config: Initial run config (hyperparameters).
      tags: Tags of the run.
      settings: A `wandb.Settings` passed to `wandb.init`.
      run: An existing run to log into instead of starting one (not finished by `close()`).
      process_index: This process's index (None: `jax.process_index()`); only 0 logs.

    Raises:
      ImportError: `wandb` is not installed (install the `wandb` extra).
      ValueError: `resume_step` without `run_id`, or a negative `resume_step`.
    """

    def __init__(
        self,
        project: str | None = None,
        *,
        logdir: str | os.PathLike[str] | None = None,
        collection: str | None = None,
        run_id: str | None = None,
        resume_step: int | None = None,
        name: str | None = None,
        group: str | None = None,
        entity: str | None = None,
        mode: str | None = None,
        config: Mapping[str, Any] | None = None,
        tags: Sequence[str] | None = None,
        settings: Any = None,
        run: Any = None,
        process_index: int | None = None,
    ):
        self._wandb = _trackers.import_extra("wandb", "wandb", "WandbWriter")
        if resume_step is not None:
            resume_step = _checks.check_step(resume_step, "WandbWriter(resume_step=...)")
            if run_id is None and run is None:
                raise ValueError(
                    f"WandbWriter: resume_step={resume_step} needs the run to resume; pass "
                    "run_id='<the W&B run id>' (shown in the run's URL and its local folder)."
                )
        self._run = None
        self._owned = False
        self._min_step = 0
        if not _trackers.writes_here(process_index):
            return
        if run is None:
            kwargs: dict[str, Any] = {}
            if run_id is not None:
                if collection:
                    run_id = f"{run_id}-{collection.replace('/', '-')}"
                if resume_step is None:
                    kwargs.update(id=run_id, resume="allow")
                else:  # id and resume_from together: W&B checks that they agree
                    kwargs.update(id=run_id, resume_from=f"{run_id}?_step={resume_step}")
            if logdir is not None:
                # Absolute: W&B's service resolves a relative dir against its own working
                # directory, which is where the process was when its first run started.
                logdir = os.path.abspath(logdir)
                os.makedirs(logdir, exist_ok=True)
            run = self._wandb.init(
                project=project,
                entity=entity,
                dir=logdir,
                name=name or collection,
                group=group,
                mode=mode,
                config=dict(config) if config else None,
                tags=list(tags) if tags else None,
                settings=settings,
                reinit="create_new",  # one run per writer: train and eval side by side
                **kwargs,
            )
            self._owned = True
        self._run = run
        self._min_step = int(run.starting_step or 0)
        if resume_step is not None:
            self._min_step = max(self._min_step, resume_step + 1)

    @property
    def run(self) -> Any:
        """The `wandb` run logged into (None on processes other than 0)."""
        return self._run

    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Raises `NotImplementedError`: W&B has no raw-tensor type."""
        self._begin("write_summaries", step, values)
        raise NotImplementedError(
            f"WandbWriter.write_summaries: W&B has no raw-tensor type, so {sorted(values)} "
            "cannot be stored. Write them as scalars (one element) or histograms instead."
        )

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        """Logs every number of the call in one `run.log`."""
        step = self._begin("write_scalars", step, scalars)
        self._log(
            "write_scalars", step, _checks.check_numbers(scalars, "WandbWriter.write_scalars")
        )

    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        """Logs N `wandb.Image`s per `[N, H, W, C]` key (one per `[H, W, C]` key)."""
        step = self._begin("write_images", step, images)
        arrays = _checks.check_images(images, "WandbWriter.write_images")
        self._log("write_images", step, {k: _images(self._wandb, v) for k, v in arrays.items()})

    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        """Logs each `[N, T, H, W, C]` video as N filmstrip images `[H, T*W, C]`."""
        step = self._begin("write_videos", step, videos)
        arrays = _checks.check_videos(videos, "WandbWriter.write_videos")
        values = {k: _images(self._wandb, _trackers.filmstrip(v)) for k, v in arrays.items()}
        self._log("write_videos", step, values)

    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        """Logs each clip of `[N, T, C]` as a `wandb.Audio` (16-bit WAV) under `<key>/<i>`."""
        step = self._begin("write_audios", step, audios)
        arrays = _checks.check_audios(audios, sample_rate, "WandbWriter.write_audios")
        if self._run is None:
            return
        with tempfile.TemporaryDirectory() as tmp:  # W&B copies each file into the run
            values = {}
            for i, (key, clips) in enumerate(arrays.items()):
                for j, clip in enumerate(clips):
                    path = os.path.join(tmp, f"{i}_{j}.wav")
                    with open(path, "wb") as f:
                        f.write(_encode.wav(clip, sample_rate))
                    name = key if len(clips) == 1 else f"{key}/{j}"
                    values[name] = self._wandb.Audio(path, sample_rate=sample_rate)
            self._log("write_audios", step, values)

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Logs the texts as strings."""
        step = self._begin("write_texts", step, texts)
        self._log("write_texts", step, _checks.check_texts(texts, "WandbWriter.write_texts"))

    def write_histograms(
        self,
        step: int,
        arrays: Mapping[str, Array],
        num_buckets: Mapping[str, int] | None = None,
    ) -> None:
        """Logs a `wandb.Histogram` per array with `num_buckets[key]` buckets (default 30)."""
        step = self._begin("write_histograms", step, arrays)
        checked = _checks.check_histograms(arrays, "WandbWriter.write_histograms")
        buckets = num_buckets or {}
        too_many = {k: buckets[k] for k in checked if buckets.get(k, 0) > MAX_HISTOGRAM_BUCKETS}
        if too_many:
            raise ValueError(
                f"WandbWriter.write_histograms: W&B stores at most {MAX_HISTOGRAM_BUCKETS} "
                f"buckets, got num_buckets {too_many}. Ask for {MAX_HISTOGRAM_BUCKETS} or fewer."
            )
        values = {}
        for key, arr in checked.items():
            counts, edges = _checks.bucketize(arr, buckets.get(key))
            values[key] = self._wandb.Histogram(np_histogram=(counts, edges))
        self._log("write_histograms", step, values)

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Updates the run's config (a value written again replaces the earlier one)."""
        self._check_open("write_hparams")
        _checks.check_keys(hparams, "WandbWriter.write_hparams")
        if self._run is not None:
            values = {k: _trackers.hparam(v) for k, v in hparams.items()}
            self._run.config.update(values, allow_val_change=True)

    def flush(self) -> None:
        """Does nothing: W&B writes in the background and `close()` waits for it."""

    def close(self) -> None:
        """Finishes the run if this writer started it (waits until it is written); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._run is not None and self._owned:
            self._run.finish()

    def _log(self, method: str, step: int, values: dict[str, Any]) -> None:
        if self._run is None:
            return
        if step < self._min_step:
            raise ValueError(
                f"WandbWriter.{method}: W&B history steps never decrease, got step {step} "
                f"for {sorted(values)} after step {self._min_step}; W&B would drop it. Log "
                "steps in order (one writer per collection), or resume with resume_step."
            )
        self._min_step = step
        self._run.log(values, step=step)


def _images(wandb: Any, arr: np.ndarray) -> list[Any]:
    return [wandb.Image(image) for image in _checks.images_as_uint8(arr)]
