"""The error collector of both packages (here, as `writers` never imports `metrics_manager`)."""

from typing import Any


def describe(x: Any) -> str:
    """A short description of a value for error messages: type, and shape/dtype for arrays."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{type(x).__name__} of shape {tuple(x.shape)} and dtype {x.dtype}"
    text = repr(x)
    return f"{type(x).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


class Problems:
    """A call's problems, raised as one `TypeError` (if any is about a type) or `ValueError`."""

    def __init__(self, context: str = "") -> None:
        self.context = context
        self.type_errors: list[str] = []
        self.value_errors: list[str] = []

    def add(self, kind: type[Exception], message: str) -> None:
        (self.type_errors if issubclass(kind, TypeError) else self.value_errors).append(message)

    def type_problem(self, message: str) -> None:
        self.type_errors.append(message)

    def value_problem(self, message: str) -> None:
        self.value_errors.append(message)

    def __bool__(self) -> bool:
        return bool(self.type_errors or self.value_errors)

    def message(self, context: str | None = None) -> str:
        """`"<call>: <problem>"`, or `"<call>: N problems:"` and one `  - ` line per problem."""
        problems = self.type_errors + self.value_errors
        if len(problems) == 1:
            return f"{context or self.context}: {problems[0]}"
        lines = "\n".join(f"  - {p}" for p in problems)
        return f"{context or self.context}: {len(problems)} problems:\n{lines}"

    def raise_if_any(
        self, context: str | None = None, error: type[Exception] | None = None
    ) -> None:
        """Raises one error naming every problem, of type `error` if given."""
        if self:
            raise (error or (TypeError if self.type_errors else ValueError))(self.message(context))
