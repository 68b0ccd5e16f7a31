"""Pluggable metric writers with CLU's interface and no TensorFlow."""

__all__: list[str] = []
