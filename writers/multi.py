"""`MultiWriter`: fans every call out to several writers; one failure stops none.

Each call goes to every writer in order, even when an earlier one raised. After
all of them have run, the failures (if any) are raised together as one
`WriterError` whose message names each failing writer; the others have received
the values. `close()` closes every writer even if some fail. Inputs (step, keys)
are checked once, before fan-out, so a bad call raises a plain `TypeError` or
`ValueError` and reaches no writer.

Writers need not subclass `MetricWriter`: anything with CLU's method and
parameter names works (calls are forwarded by keyword).

Example:
  >>> import writers
  >>> w = writers.MultiWriter({"log": writers.LoggingWriter(), "none": writers.NoopWriter()})
  >>> w.write_scalars(1, {"loss": 0.5})
  >>> w.close()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from writers import _checks
from writers.interface import Array, MetricWriter, Scalar, WriterClosedError, WriterError


class MultiWriter(MetricWriter):
    """Writes every call to each of several writers and reports all failures.

    Args:
      writers: The writers, as a sequence (named after their class, with `#i`
        added to repeated names) or as a mapping from name to writer.

    Raises:
      TypeError: an object lacks CLU's writer methods, or a name is not a str.
    """

    def __init__(self, writers: Sequence[Any] | Mapping[str, Any]):
        if isinstance(writers, Mapping):
            _checks.check_keys(writers, "MultiWriter")
            self._writers = list(writers.items())
        else:
            self._writers = _auto_names(list(writers))
        _checks.check_writers(dict(self._writers), "MultiWriter")
        self._closed = False

    @property
    def writers(self) -> dict[str, Any]:
        """The wrapped writers by name."""
        return dict(self._writers)

    def write_summaries(
        self, step: int, values: Mapping[str, Array], metadata: Mapping[str, Any] | None = None
    ) -> None:
        """Forwards to every writer."""
        step = self._begin("write_summaries", step, values)
        self._each("write_summaries", step=step, values=values, metadata=metadata)

    def write_scalars(self, step: int, scalars: Mapping[str, Scalar]) -> None:
        """Forwards to every writer."""
        step = self._begin("write_scalars", step, scalars)
        self._each("write_scalars", step=step, scalars=scalars)

    def write_images(self, step: int, images: Mapping[str, Array]) -> None:
        """Forwards to every writer."""
        step = self._begin("write_images", step, images)
        self._each("write_images", step=step, images=images)

    def write_videos(self, step: int, videos: Mapping[str, Array]) -> None:
        """Forwards to every writer."""
        step = self._begin("write_videos", step, videos)
        self._each("write_videos", step=step, videos=videos)

    def write_audios(self, step: int, audios: Mapping[str, Array], *, sample_rate: int) -> None:
        """Forwards to every writer."""
        step = self._begin("write_audios", step, audios)
        self._each("write_audios", step=step, audios=audios, sample_rate=sample_rate)

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Forwards to every writer."""
        step = self._begin("write_texts", step, texts)
        self._each("write_texts", step=step, texts=texts)

    def write_histograms(
        self,
        step: int,
        arrays: Mapping[str, Array],
        num_buckets: Mapping[str, int] | None = None,
    ) -> None:
        """Forwards to every writer."""
        step = self._begin("write_histograms", step, arrays)
        self._each("write_histograms", step=step, arrays=arrays, num_buckets=num_buckets)

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Forwards to every writer."""
        self._check_open("write_hparams")
        _checks.check_keys(hparams, "MultiWriter.write_hparams")
        self._each("write_hparams", hparams=hparams)

    def flush(self) -> None:
        """Flushes every writer; raises `WriterError` naming those that failed."""
        if not self._closed:
            self._each("flush")

    def close(self) -> None:
        """Closes every writer even if some fail; idempotent.

        Raises:
          WriterError: naming every writer whose `close()` raised (all were tried).
        """
        if self._closed:
            return
        self._closed = True
        self._each("close")

    def _check_open(self, method: str) -> None:
        if self._closed:
            raise WriterClosedError(f"MultiWriter.{method}: the writer is closed.")

    def _begin(self, method: str, step: Any, values: Any) -> int:
        self._check_open(method)
        if type(values) is _checks.Checked:
            return step
        return _checks.check_call(f"MultiWriter.{method}", step, values)

    def _each(self, method: str, **kwargs: Any) -> None:
        failures: list[tuple[str, BaseException]] = []
        for name, writer in self._writers:
            try:
                getattr(writer, method)(**kwargs)
            except Exception as err:  # noqa: BLE001  (reported below, with the writer's name)
                failures.append((name, err))
        if failures:
            raise WriterError(f"MultiWriter.{method}", failures) from failures[0][1]


def _auto_names(writers: list[Any]) -> list[tuple[str, Any]]:
    names = [type(w).__name__ for w in writers]
    return [
        (name if names.count(name) == 1 else f"{name}#{i}", w)
        for i, (name, w) in enumerate(zip(names, writers, strict=True))
    ]
