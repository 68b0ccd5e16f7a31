"""`LoggingWriter`: writes every value to the absl INFO log in CLU's line format.

Scalars: one line per call, `[<step>] collection=<name> k1=v1, k2=v2` (keys sorted, a line
break in one or in the name shown as `\\n`, floats `.6g`, ` collection=<name>` only when set),
so parsers of CLU's logs keep working. Other kinds as CLU logs them: shapes of arrays, the
texts, a line per histogram with its buckets (one video `[T, H, W, C]` is shown with its
batch axis, `[1, T, H, W, C]`, as every writer here takes it; CLU shows it as given).

Example:
  >>> import writers
  >>> w = writers.LoggingWriter(collection="train")
  >>> w.write_scalars(10, {"loss": 0.25, "accuracy": 0.5})  # logs: [10] collection=train accuracy=0.5, loss=0.25
"""

from collections.abc import Mapping
from typing import Any

import numpy as np
from absl import logging

from writers import _checks
from writers._base import BaseWriter
from writers.console import _KEY_CONTROL, _escaped


class LoggingWriter(BaseWriter):
    """Writes values to absl's INFO log, one line per call (one per histogram; none if empty).

    Args:
      collection: Shown as ` collection=<name>` on every line.

    Raises:
      TypeError: `collection` is neither a str nor None.
    """

    def __init__(self, collection: str | None = None):
        _checks.check_options("LoggingWriter", collection=collection)
        # A line break in it is shown as `\n`, as in a key: it split every line in two.
        shown = collection and _KEY_CONTROL.sub(_escaped, collection)
        self._prefix_tail = f" collection={shown}" if shown else ""

    def _summaries(self, step: int, values: Mapping[str, Any], metadata: Any) -> None:
        self._log(step, "Got raw tensors: %s.", _shapes(values))

    def _scalars(self, step: int, numbers: dict[str, int | float]) -> None:
        # A key's line break or terminal escape is shown as `\n`, not run: one call, one line.
        pairs = [(_KEY_CONTROL.sub(_escaped, k), v) for k, v in sorted(numbers.items())]
        text = ", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in pairs)
        self._log(step, "%s", text)

    def _media(
        self, step: int, kind: str, arrays: dict[str, np.ndarray], sample_rate: int | None = None
    ) -> None:
        self._log(step, f"Got {kind}s: %s.", _shapes(arrays))

    def _texts(self, step: int, texts: dict[str, str]) -> None:
        self._log(step, "Got texts: %s.", texts)

    def _histograms(self, step: int, arrays: dict[str, np.ndarray], buckets: dict) -> None:
        for key, arr in arrays.items():
            counts, edges = _checks.bucketize(arr, buckets.get(key))
            self._log(step, "Histogram for %r = {%s}", key, _histogram_text(counts, edges))

    def _hparams(self, hparams: Mapping[str, Any]) -> None:
        if hparams:  # an empty call logs no line, as every empty write
            logging.info("[Hyperparameters]%s %s", self._prefix_tail, dict(hparams))

    def _flush(self) -> None:
        logging.flush()

    def _log(self, step: int, fmt: str, *args: Any) -> None:
        if args[-1]:  # an empty call's values ("", {}): no line, as in every other writer
            logging.info("[%d]%s " + fmt, step, self._prefix_tail, *args)


def _shapes(values: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(np.shape(v)) for k, v in values.items()}


def _histogram_text(counts: np.ndarray, edges: np.ndarray) -> str:
    # `[a, b): n, ..., [y, z]: n`: buckets are right-open except the last one.
    parts = [f"[{edges[i]:.3g}, {edges[i + 1]:.3g}): {int(c)}" for i, c in enumerate(counts[:-1])]
    parts.append(f"[{edges[-2]:.3g}, {edges[-1]:.3g}]: {int(counts[-1])}")
    return ", ".join(parts)
