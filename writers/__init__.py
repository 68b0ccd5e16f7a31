"""Pluggable metric writers with CLU's interface and no TensorFlow, usable on their own.

Trackers (`WandbWriter`, `MlflowWriter`) and tensorboardX are imported on first use:
`import writers` imports neither TensorFlow, torch nor JAX, and writing TensorBoard files
does not import torch even where it is installed (`writers._tbx`).

Example:
  >>> import tempfile, writers
  >>> w = writers.create_default_writer(tempfile.mkdtemp(), collection="train", console=False)
  >>> writers.write_values(w, 1, {"loss": 0.5})
  >>> w.close()
"""

from writers._jsonl_log import read_jsonl
from writers.async_writer import AsyncMultiWriter, AsyncWriter, ensure_flushes
from writers.console import ConsoleWriter
from writers.factory import create_default_writer, create_tracker_writer
from writers.interface import MetricWriter, NoopWriter, WriterClosedError, WriterError
from writers.jsonl import JsonlWriter
from writers.logging_writer import LoggingWriter
from writers.mlflow_writer import MlflowWriter
from writers.multi import MultiWriter
from writers.tensorboard import TensorBoardWriter
from writers.values import group_values, write_values
from writers.wandb_writer import WandbWriter

__all__ = [
    "AsyncMultiWriter",
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
    "ensure_flushes",
    "group_values",
    "read_jsonl",
    "write_values",
]
