"""Runnable examples: `python -m examples.demo` is what `make demo` runs."""
