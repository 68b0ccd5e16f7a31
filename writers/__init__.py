"""Pluggable metric writers with CLU's interface and no TensorFlow.

`writers` is usable on its own, with or without `metrics_manager`: every writer
implements `MetricWriter` (CLU's method and parameter names), `write_values`
writes a mapping of `clu.values` objects, and `create_default_writer` builds the
usual console + TensorBoard + JSONL set behind background workers.

Example:
  >>> import writers
  >>> w = writers.LoggingWriter(collection="train")
  >>> writers.write_values(w, 1, {"loss": 0.5})
  >>> w.close()
"""

from writers.interface import MetricWriter, WriterClosedError, WriterError
from writers.logging_writer import LoggingWriter
from writers.noop import NoopWriter
from writers.values import write_values

__all__ = [
    "LoggingWriter",
    "MetricWriter",
    "NoopWriter",
    "WriterClosedError",
    "WriterError",
    "write_values",
]
