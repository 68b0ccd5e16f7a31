"""`WandbWriter`: Weights & Biases runs, one `run.log(values, step=step)` per write call.

Needs the `wandb` extra. Only process 0 creates a run and logs; the others check their inputs
and log nothing. Where values land (one history row per step): scalars as numbers (NaN and
infinities kept; ints exact in int64's range, past it floats; -0.0 reads back as 0), texts
as strings, images as a list of `wandb.Image`s per key, videos as one filmstrip image
`[H, T*W, C]` per video (`wandb.Video` would need moviepy; at most 108 images or videos a
key and call, all W&B keeps), audio as `wandb.Audio` 16-bit WAV clips under `<key>` or
`<key>/<i>` when N > 1, histograms as `wandb.Histogram` (at most 512 buckets), hparams in
the run's config (JSON there: a NaN hparam reads back as null; None is written as "None", as every writer does). Raw tensors
(`write_summaries`, which W&B has no type for) are exact `.npy` files in the run's files,
`summaries/<key>/step_<step 8 digits>.npy` (TensorBoard's metadata is not kept; keys must be
relative paths). Images, filmstrips and clips are files named after their key
(`media/images/<key>_<n>_<hash>.png`): a key with a part over 255 bytes, a last part over 210
bytes, or a NUL is refused at the call.

W&B drops a `log` at a step below the last one, so such a write raises `ValueError`; calls at
one step fill one row. `close()` finishes runs this writer started (exit code 1, failed, where
a `with` block of the writer raised, as `with wandb.init()`) and waits for W&B's
service (offline, wandb 0.31's `finish()` can return a few milliseconds before the last
records reach the run file; readers should wait for its `exit` record).

Resume: `run_id` with `resume_step=R` rewinds the run to step R (`resume_from="<id>?_step=R"`,
a W&B private preview: W&B support enables it per entity):
history after R is replaced, and writes at steps up to R (a config at step 0, raw tensor files too), which W&B
would refuse, are left out with one warning: the run keeps the earlier run's values there. Offline, the new run directory holds only
steps after R and names the rewind point for `wandb sync`. R = 0 (a fresh start passing its
restored step) rewinds only a run of that id in W&B's local directory (`<logdir>/wandb`);
without one, it attaches as without R (`resume="allow"`): a new run keeps its step 0, and a run
only the W&B server holds (a restart on another machine) is not rewound. With `collection` set, the run id
is `<run_id>-<collection>`; where characters W&B refuses in an id (such as `/` and `:`) become
`-`, 8 hex digits of the collection's SHA-256 follow (`eval/a`: `<run_id>-eval-a-<hash>`), so
`eval/a`, `eval:a` and `eval-a` log to runs of their own.
Offline, W&B cannot tell a restarted writer the run's last step: with the same `run_id` and
no `resume_step`, steps below the earlier run's are not refused here. Pass `resume_step`.

Keys `_step`, `_runtime`, `_timestamp` and `_wandb` (and the hyperparameter `_wandb`) are
W&B's own and refused; so is one key written as two kinds (a scalar and a text) at one step,
which W&B would keep only once. A key
written again as the same kind at one step keeps its last value in W&B (warned once per key);
a raw tensor written again at one step is a second file, `step_<step>-2.npy`.

Example:
  >>> import tempfile, writers
  >>> w = writers.WandbWriter("demo", logdir=tempfile.mkdtemp(), mode="offline", process_index=0)
  >>> w.write_scalars(1, {"loss": 0.5, "accuracy": 0.75})  # one run.log, two values
  >>> w.close()
"""

import contextlib
import glob
import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from absl import logging

from writers import _base, _checks, _encode, _storage

MAX_HISTOGRAM_BUCKETS = 512  # wandb.Histogram's limit
MAX_IMAGES = 108  # wandb.Image.MAX_ITEMS: W&B keeps the first 108 of a key's images in a log
_RESERVED = dict.fromkeys(("_runtime", "_step", "_timestamp", "_wandb"), "W&B")
_RUN_ID_REFUSED = re.compile(r"[:;,#?/'\s]")  # characters `wandb.init` refuses in an id
# W&B saves each image and clip as `media/<kind>/<key>_<its log count>_<20 hex>.png` (`.wav`)
# in the run's directory, a folder per '/' of the key: the last part gets up to 45 bytes more.
_MEDIA_SUFFIX = len(f"_{2**63}_{'0' * 20}.png")
_MEDIA_METHODS = ("write_images", "write_videos", "write_audios")


def _earlier_run(logdir: str | None, run_id: str | None) -> bool:
    """Whether W&B's directory (`<logdir>/wandb`, or `.wandb`; without logdir, W&B's default
    root: `WANDB_DIR`, else the working directory) holds a run `run_id` (`run-<id>.wandb` in
    an `offline-run-<time>-<id>` or `run-<time>-<id>` folder), one a resume rewinds."""
    if run_id is None:
        return False
    root = logdir if logdir is not None else os.environ.get("WANDB_DIR") or "."
    return any(
        glob.glob(os.path.join(glob.escape(root), folder, "*", glob.escape(f"run-{run_id}.wandb")))
        for folder in ("wandb", ".wandb")
    )


@contextlib.contextmanager
def _settings_checked() -> Iterator[None]:
    """Raises pydantic's `ValidationError` of W&B's settings (`mode='ofline'`) as a ValueError
    with its text. gin re-raises a configurable's error as a copy of its type, which a
    `ValidationError` cannot be, so a `writers.WandbWriter.mode` binding said only
    "ValidationError.__new__() missing 2 required positional arguments"."""
    try:
        yield
    except Exception as err:
        pydantic_core = sys.modules.get("pydantic_core")  # W&B's settings are pydantic models
        if pydantic_core is None or not isinstance(err, pydantic_core.ValidationError):
            raise
        raise ValueError(f"WandbWriter: W&B refused a setting of wandb.init: {err}") from err


class WandbWriter(_base.TrackerWriter):
    """Logs every write call to a W&B run as one `run.log`.

    Args:
      project: W&B project (None: W&B's default, e.g. `WANDB_PROJECT`).
      logdir: Directory for W&B's local files (`<logdir>/wandb/...`); a URL (`gs://`, a
        remote model dir) puts them where W&B's default would (`$WANDB_DIR/wandb`, else `./wandb`).
      collection: What is logged (`train`, `eval/task`): default name; run id `<run_id>-<it>`.
      run_id: Attach to (or create) the run with this id (`resume="allow"`).
      resume_step: Rewind run `run_id` to this step (`resume_from`): later steps are replaced.
        0 without `run_id`, or with one W&B's local directory holds no run of (a fresh start
        of a loop passing its restored step): a new run, which keeps its step 0.
      name: Display name of the run (default: `collection`).
      group: W&B group (e.g. the experiment shared by train and eval).
      entity: W&B entity (user or team).
      mode: "online", "offline" or "disabled" (None: `WANDB_MODE`).
      config: Initial run config (hyperparameters), flattened as `write_hparams` does.
      tags: Tags of the run.
      settings: A `wandb.Settings` for `wandb.init`.
      run: An existing run to log into (not finished by `close()`).
      process_index: This process's index (None: `jax.process_index()`); only 0 logs.

    Raises:
      ImportError: `wandb` is not installed (install the `wandb` extra).
      TypeError: `tags` is a str, not a list of them.
      ValueError: `resume_step` above 0 without `run_id` (0 without it starts a new run),
        or a negative `resume_step`, or a `mode` W&B refuses (`'ofline'`; on every process).
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
        _checks.check_options("WandbWriter", collection=collection)
        if isinstance(tags, str):  # list("baseline") made eight one-letter tags
            raise TypeError(
                f"WandbWriter: tags must be a list of str such as ['baseline'], got {tags!r} "
                f"(str); pass tags=[{tags!r}]."
            )
        if logdir is not None:  # Path("gs://b") made the local './gs:/b/wandb'
            logdir = _checks.check_path(logdir, "WandbWriter", "logdir")
        if config:
            config = self._initial_config(config)
        self._wandb, resume_step, here = self._start("wandb", resume_step, process_index)
        if mode is not None:
            # W&B checks `mode` in wandb.init, which only process 0 calls: `mode = 'ofline'`
            # failed there alone. Its settings model checks it here, locally, on every process.
            with _settings_checked():
                self._wandb.Settings(mode=mode)
        if resume_step == 0 and run_id is None and run is None:
            # A loop passing its restored step passes 0 at a fresh start (the manager allows
            # it): that raised, so a W&B writer set without run_id could not start. A run
            # without an id is new, and holds no step before 0 to keep.
            resume_step = None
        if resume_step is not None and run_id is None and run is None:
            raise ValueError(
                f"WandbWriter: resume_step={resume_step} needs the run to resume; pass "
                "run_id='<the W&B run id>' (shown in the run's URL and its local folder)."
            )
        self._run: Any = None
        self._resumed_at = resume_step  # W&B keeps the run's history up to it
        self._warned_resumed = False
        self._row: dict[str, str] = {}  # key -> write method, of the history row being filled
        self._replaced: set[str] = set()  # keys warned of as written again at one step
        if not here:
            return
        if run is None:
            if run_id is not None and collection:
                part = _RUN_ID_REFUSED.sub("-", collection)
                if part != collection:  # 'eval/a' and 'eval:a' were both run '<id>-eval-a'
                    part += "-" + hashlib.sha256(collection.encode()).hexdigest()[:8]
                run_id = f"{run_id}-{part}"
            if logdir is not None and _storage.is_remote(os.fspath(logdir)):
                # W&B's files are local: os.path.abspath made './gs:/bucket/...' in the cwd.
                local = os.environ.get("WANDB_DIR") or "."
                logging.info(
                    "WandbWriter: logdir %s is a URL; W&B's local files go to %s/wandb "
                    "(WANDB_DIR, else the working directory, as W&B's default)",
                    logdir,
                    os.path.abspath(local),
                )
                logdir = local
            if logdir is not None:  # W&B's service resolves a relative dir against its own cwd
                logdir = os.path.abspath(logdir)
                os.makedirs(logdir, exist_ok=True)
            if resume_step == 0 and not _earlier_run(logdir, run_id):
                # A loop passing its restored step passes 0 at a fresh start: rewinding a run
                # not there dropped the new run's step 0 (its config) and named a rewind
                # point `wandb sync` cannot apply. A new run keeps its step 0.
                resume_step = self._resumed_at = None
            with _settings_checked():
                run = self._wandb.init(
                    project=project,
                    entity=entity,
                    dir=logdir,
                    name=name or collection,
                    group=group,
                    mode=mode,
                    config=config or None,
                    tags=list(tags) if tags else None,
                    settings=settings,
                    reinit="create_new",  # one run per writer: train and eval side by side
                    id=run_id,  # passed with resume_from too: W&B checks that they agree
                    resume="allow" if run_id is not None and resume_step is None else None,
                    resume_from=None if resume_step is None else f"{run_id}?_step={resume_step}",
                )
            self._owned = True
        self._run = run
        self._min_step = int(run.starting_step or 0)
        if resume_step is not None:
            self._min_step = max(self._min_step, resume_step + 1)

    reserved_keys = tuple(_RESERVED)  # W&B's own row fields

    def _initial_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """`config` as `write_hparams` writes it: dotted names, bools, numbers and str. Given
        as it was, `config={"opt": {"lr": 0.1}}` stayed nested beside the `opt.lr` of a later
        `write_hparams`, so the run's config held both, one of them stale."""
        problems = _checks.Problems("WandbWriter(config=...)")
        flat = _checks.flat_hparams(_checks.as_mapping(config), problems)
        problems.raise_if_any()
        if problem := self.key_problem("write_hparams", flat):
            raise ValueError(f"WandbWriter(config=...): {problem}")
        return {k: _encode.hparam(v) for k, v in flat.items()}

    @property
    def run(self) -> Any:
        """The `wandb` run logged into (None on processes other than 0)."""
        return self._run

    def _scalars(self, step: int, numbers: dict[str, int | float]) -> None:
        self._log("write_scalars", step, numbers)

    def _pictures(self, method: str, step: int, images: dict[str, Any]) -> None:
        self._refuse_keys(method, images)
        if too_many := {k: len(v) for k, v in images.items() if len(v) > MAX_IMAGES}:
            what = method.removeprefix("write_")
            raise ValueError(
                f"WandbWriter.{method}: W&B keeps at most {MAX_IMAGES} {what} of a key per "
                f"step (it drops the rest with a warning), got {too_many}. Write at most "
                f"{MAX_IMAGES} under each key, e.g. split them over keys '<key>/0', '<key>/1'."
            )
        if self._run is None:  # each wandb.Image writes a PNG to a temp dir kept until exit
            return
        from PIL import Image  # W&B's own dependency

        def picture(image: np.ndarray) -> Any:  # uint8 [H, W, C], given as a PIL image:
            # wandb.Image squeezes an array, so [1, W, C] lost its height.
            return self._wandb.Image(
                Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)
            )

        self._log(method, step, {k: [picture(i) for i in v] for k, v in images.items()})

    def _audios(self, step: int, clips: dict[str, Any], sample_rate: int) -> None:
        self._refuse_keys("write_audios", clips)
        if self._run is None:
            return
        with tempfile.TemporaryDirectory() as tmp:  # W&B copies each file into the run
            values = {}
            for i, (key, batch) in enumerate(clips.items()):
                for j, clip in enumerate(batch):
                    path = os.path.join(tmp, f"{i}_{j}.wav")
                    with open(path, "wb") as f:
                        f.write(_encode.wav(clip, sample_rate))
                    name = key if len(batch) == 1 else f"{key}/{j}"
                    values[name] = self._wandb.Audio(path, sample_rate=sample_rate)
            self._log("write_audios", step, values)

    def _texts(self, step: int, texts: dict[str, str]) -> None:
        self._log("write_texts", step, texts)

    def _histograms(self, step: int, arrays: dict[str, Any], buckets: dict) -> None:
        too_many = {k: buckets[k] for k in arrays if buckets.get(k, 0) > MAX_HISTOGRAM_BUCKETS}
        if too_many:
            raise ValueError(
                f"WandbWriter.write_histograms: W&B stores at most {MAX_HISTOGRAM_BUCKETS} "
                f"buckets, got num_buckets {too_many}. Ask for {MAX_HISTOGRAM_BUCKETS} or fewer."
            )
        if self._run is None:
            return
        hists = {k: _checks.bucketize(v, buckets.get(k)) for k, v in arrays.items()}
        values = {k: self._wandb.Histogram(np_histogram=h) for k, h in hists.items()}
        self._log("write_histograms", step, values)

    def _store(self, paths: dict[str, bytes]) -> None:
        if self._run is None:
            return
        for file in _base.write_tree(self._run.dir, paths):  # the run's files: synced with it
            self._run.save(file, base_path=self._run.dir, policy="now", glob=False)

    def key_problem(self, method: str, keys: Iterable[str]) -> str | None:
        if method == "write_hparams" and "_wandb" in keys:
            return (
                "the hyperparameter name '_wandb' is W&B's own config entry, which it would "
                "replace; rename it, e.g. 'wandb'"
            )
        if method in _MEDIA_METHODS:  # a file name over 255 bytes: W&B's bare OSError
            parts = {k: k.encode().split(b"/") for k in keys}
            if bad := [
                k
                for k, p in parts.items()
                if "\0" in k or max(map(len, p)) > 255 or len(p[-1]) > 255 - _MEDIA_SUFFIX
            ]:
                return (
                    f"keys {bad} name W&B media files media/<kind>/<key>_<n>_<hash>.png (.wav), "
                    f"a folder per '/': each part must be at most 255 bytes, the last at most "
                    f"{255 - _MEDIA_SUFFIX}, without NUL; shorten them, e.g. 'eval/sample'."
                )
        return super().key_problem(method, keys)

    def _params(self, hparams: dict[str, Any]) -> None:
        self._refuse_keys("write_hparams", hparams)
        if self._run is not None:  # a value written again replaces the earlier one
            self._run.config.update(hparams, allow_val_change=True)

    def _end_run(self) -> None:
        if self.ending_signal:  # the status the process ends with
            self._run.finish(exit_code=128 + self.ending_signal)
        else:
            self._run.finish(exit_code=1 if self._failed else None)

    def _log(self, method: str, step: int, values: dict[str, Any]) -> None:
        if self._run is None or not values:  # an empty row would still advance the run's step
            return
        try:
            self._log_row(method, step, values)
        except Exception as err:
            if type(err).__name__ == "MailboxClosedError":  # its message is empty
                err.add_note(
                    f"WandbWriter: W&B's service process (wandb-core) of run {self._run.id} is "
                    "gone (killed, or out of memory): no later value reaches W&B in this "
                    "process; the other writers keep theirs"
                )
            raise

    def _before_resume(self, method: str, step: int, keys: Iterable[str]) -> bool:
        """Whether `step` is at or before `resume_step`, where the rewound run keeps the run
        before's values: such a write is left out of W&B (warned once)."""
        if self._resumed_at is None or step > self._resumed_at:
            return False
        if not self._warned_resumed:  # a config or compile time at step 0, as T5X writes
            self._warned_resumed = True
            logging.warning(
                "WandbWriter.%s: step %d (keys %s) is at or before resume_step=%d, where "
                "run %s keeps the history of the run before, which W&B does not let a "
                "resumed run write: left out of W&B (the other writers have it). Warned "
                "once; later writes up to step %d are left out silently.",
                method,
                step,
                sorted(keys),
                self._resumed_at,
                self._run.id,
                self._resumed_at,
            )
        return True

    def _files(
        self, method: str, kind: str, step: int, files: Mapping[str, Any], ext: str = ".txt"
    ) -> None:
        # A raw tensor at a step up to resume_step was saved under the run before's file
        # name (`summaries/<key>/step_<step>.npy`), replacing its value at the next sync.
        if self._run is not None and self._before_resume(method, step, files):
            return
        super()._files(method, kind, step, files, ext)

    def _log_row(self, method: str, step: int, values: dict[str, Any]) -> None:
        if self._before_resume(method, step, values):
            return
        last = max(self._min_step, self._run.step or 0)  # also what others logged to the run
        if step < last:
            raise ValueError(
                f"WandbWriter.{method}: W&B history steps never decrease, got step {step} "
                f"for {sorted(values)} after step {last} of run {self._run.id}; W&B would "
                "drop it. Log steps in order (one run per collection: writers sharing a run "
                "share its steps), or resume with resume_step."
            )
        if problem := _checks.reserved_problem(values, _RESERVED):
            raise ValueError(f"WandbWriter.{method}: {problem}")
        if step != self._min_step:
            self._row = {}
        # One row per step holds one value per key: a second kind would replace the first.
        if clash := {k: self._row[k] for k in values if self._row.get(k, method) != method}:
            raise ValueError(
                f"WandbWriter.{method}: keys {sorted(clash)} were written at step {step} by "
                f"{sorted(set(clash.values()))}; W&B keeps one value per key and step, and "
                "would replace it. Give each kind its own key, e.g. 'sample/text'."
            )
        if again := sorted(set(values) & self._row.keys() - self._replaced):
            self._replaced.update(again)
            logging.warning(
                "WandbWriter.%s: %s written again at step %d: W&B keeps one value per key and "
                "step, the last (warned once per key; the other writers keep both)",
                method,
                again,
                step,
            )
        self._min_step = step
        self._row.update(dict.fromkeys(values, method))
        self._run.log(values, step=step)
