"""Re-export of `writers._problems`, the project's one error collector."""

from writers._problems import Problems, describe

__all__ = ["Problems", "describe"]
