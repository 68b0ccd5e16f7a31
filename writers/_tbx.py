"""The parts of tensorboardX this package uses, imported without importing torch.

tensorboardX's `__init__` imports torch wherever it is installed, only for type annotations,
loading it into JAX programs that never use it (on an H100 machine with PyTorch 2.11,
`import tensorboardX` took 3.3-5.7 s and 0.5 GiB; with torch hidden, the default writers'
first write took 0.4-0.5 s and 39 MiB). So the first import hides torch from tensorboardX; a
program that imported torch or tensorboardX before keeps both as they were. (Another thread
importing torch for the first time during those 0.4 s would fail: a program using torch
imports it at its start.)
"""

# ruff: noqa: F401
import sys

_HIDE = "torch" not in sys.modules and "tensorboardX" not in sys.modules
if _HIDE:
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
try:  # imported from here by the writers' modules
    from tensorboardX import summary
    from tensorboardX.proto import event_pb2, plugin_hparams_pb2, summary_pb2, tensor_pb2
    from tensorboardX.record_writer import masked_crc32c
finally:
    if _HIDE and "torch" in sys.modules and sys.modules["torch"] is None:
        del sys.modules["torch"]
