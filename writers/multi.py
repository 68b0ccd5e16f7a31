"""`MultiWriter`: fans every call out to several writers; one failure stops none.

Each call goes to every writer in order, with its own copy of each dict (a writer that pops
a key changes nothing the others get), even when an earlier one raised; the failures are
then raised together as one `WriterError` naming each failing writer. `close()` closes every
writer even if some fail. Steps and keys are checked once, before fan-out, so a bad step or
key raises a plain `TypeError` or `ValueError` and reaches no writer. Writers need not subclass
`MetricWriter`: anything with CLU's method and parameter names works.

Example:
  >>> import writers
  >>> w = writers.MultiWriter({"log": writers.LoggingWriter(), "none": writers.NoopWriter()})
  >>> w.write_scalars(1, {"loss": 0.5})
  >>> w.close()
"""

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from writers import _checks
from writers._base import ForwardingWriter
from writers.interface import WriterError


class MultiWriter(ForwardingWriter):
    """Writes every call to each of several writers and reports all failures.

    Args:
      writers: name -> writer, or a sequence (named by class, `#i` added to repeated names).

    Raises:
      TypeError: an object lacks CLU's writer methods, or a name is not a str.
    """

    calling: Any = None  # the writer a call is inside, if any

    def __init__(self, writers: Sequence[Any] | Mapping[str, Any]):
        self._writers = list(named_writers(writers, "MultiWriter").items())
        _checks.check_writers(dict(self._writers), "MultiWriter")
        self._reserve(dict(self._writers))
        self._close_again: set[str] = set()  # writers whose close() raised: closed again

    @property
    def writers(self) -> dict[str, Any]:
        """The wrapped writers by name."""
        return dict(self._writers)

    def flush(self) -> None:
        """Flushes every writer; raises `WriterError` naming those that failed."""
        if not self._closed:
            self._forward("flush")

    def close(self) -> None:
        """Closes every writer even if some fail; idempotent once every close went through.
        A later call closes again the writers whose `close()` raised (a writer at a URL keeps
        what it could not upload for it: the second call had returned at once).

        Raises:
          WriterError: naming every writer whose `close()` raised.
        """
        if self._closed and not self._close_again:
            return
        self._closed = True
        try:
            self._forward("close", only=self._close_again or None)
        except WriterError as err:
            self._close_again = {name for name, _ in err.failures}
            raise
        self._close_again = set()

    def _forward(self, method: str, only: Collection[str] | None = None, **kwargs: Any) -> None:
        """Calls `method` on every writer (those named in `only`, if given)."""
        failures: list[tuple[str, BaseException]] = []
        try:
            for name, writer in self._writers:
                if only is not None and name not in only:
                    continue
                self.calling = writer  # where a call abandoned as hung is (a manager's deadline)
                try:
                    getattr(writer, method)(**_checks.own_dicts(kwargs))
                except Exception as err:  # noqa: BLE001  (reported below, with the writer's name)
                    failures.append((name, err))
        finally:  # after a SystemExit too: a stale one is taken for the writer a hang is in
            self.calling = None
        if failures:
            raise WriterError(f"MultiWriter.{method}", failures) from failures[0][1]


def named_writers(writers: Sequence[Any] | Mapping[str, Any], context: str) -> dict[str, Any]:
    """Writers by name: a mapping's keys, else class names (`#i` added to repeated ones)."""
    if isinstance(writers, Mapping):
        _checks.check_keys(writers, context)
        return dict(writers)
    if isinstance(writers, str) or not isinstance(writers, Iterable):
        raise TypeError(
            f"{context}: writers must be a dict of name -> writer or a list of writers, got "
            f"{type(writers).__name__}; wrap a single writer in a list: [writer]"
        )
    items = list(writers)
    names = [type(w).__name__ for w in items]
    return {
        name if names.count(name) == 1 else f"{name}#{i}": w
        for i, (name, w) in enumerate(zip(names, items, strict=True))
    }
