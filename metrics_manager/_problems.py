"""Error collection shared by the device-side modules: check every input, then raise once.

`Problems` gathers what is wrong with a call's inputs so that one error lists all of it
(`TypeError` if any problem is about a type, `ValueError` otherwise); `describe` says
what came, for those messages.
"""

from typing import Any


def describe(x: Any) -> str:
    """A short description of a value for error messages: type, and shape/dtype for arrays."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{type(x).__name__} of shape {tuple(x.shape)} and dtype {x.dtype}"
    text = repr(x)
    return f"{type(x).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


class Problems:
    """Collects every problem of a call so that one error lists them all."""

    def __init__(self) -> None:
        self.type_errors: list[str] = []
        self.value_errors: list[str] = []

    def raise_if_any(self, context: str) -> None:
        """Raises one error naming every collected problem, prefixed by `context`."""
        problems = self.type_errors + self.value_errors
        if not problems:
            return
        error = TypeError if self.type_errors else ValueError
        if len(problems) == 1:
            raise error(f"{context}: {problems[0]}")
        raise error(
            f"{context}: {len(problems)} problems:\n" + "\n".join(f"- {p}" for p in problems)
        )
