"""Pluggable metric writers with CLU's interface and no TensorFlow.

`writers` is usable on its own, with or without `metrics_manager`: every writer
implements `MetricWriter` (CLU's method and parameter names), `write_values`
writes a mapping of `clu.values` objects with one call per kind, and
`create_default_writer` builds the usual console + TensorBoard + JSONL set, each
behind its own background worker. File writers take local paths or fsspec URLs
(`gs://`, `s3://`); `read_jsonl` reads a JSONL log back from either.

Backends: `ConsoleWriter` (people at a terminal), `TensorBoardWriter` (event
files; tensorboardX is imported only when one is created), `JsonlWriter` (one
JSON line per call), `LoggingWriter` (absl log, CLU's line format), `NoopWriter`.
Trackers: `WandbWriter` and `MlflowWriter` (extras `[wandb]`, `[mlflow]`; each
library is imported when its first writer is made, never by `import writers`) and
`create_tracker_writer` (the default set plus one tracker).
Combinators: `MultiWriter` (fan-out; one failure stops none) and `AsyncWriter`
(ordered background worker, bounded queue). Importing this package imports
neither TensorFlow nor torch (nor JAX).

Example:
  >>> import tempfile, writers
  >>> w = writers.create_default_writer(tempfile.mkdtemp(), collection="train", console=False)
  >>> writers.write_values(w, 1, {"loss": 0.5})
  >>> w.close()
"""

from writers._jsonl_log import read_jsonl
from writers.async_writer import AsyncWriter
from writers.console import ConsoleWriter
from writers.factory import create_default_writer
from writers.interface import MetricWriter, WriterClosedError, WriterError
from writers.jsonl import JsonlWriter
from writers.logging_writer import LoggingWriter
from writers.mlflow_writer import MlflowWriter
from writers.multi import MultiWriter
from writers.noop import NoopWriter
from writers.tensorboard import TensorBoardWriter
from writers.tracker_factory import create_tracker_writer
from writers.values import group_values, write_values
from writers.wandb_writer import WandbWriter

__all__ = [
    "AsyncWriter",
    "ConsoleWriter",
    "JsonlWriter",
    "LoggingWriter",
    "MetricWriter",
    "MlflowWriter",
    "MultiWriter",
    "NoopWriter",
    "TensorBoardWriter",
    "WandbWriter",
    "WriterClosedError",
    "WriterError",
    "create_default_writer",
    "create_tracker_writer",
    "group_values",
    "read_jsonl",
    "write_values",
]
