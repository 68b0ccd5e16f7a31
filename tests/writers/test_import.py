"""`import writers` stays light: no TensorFlow, torch, JAX, tensorboardX, W&B or MLflow."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

TORCH = "import sys\nprint('torch imported', file=sys.stderr)\nTensor = object\n"
WRITE = (
    "import tempfile, writers\n"
    "w = writers.create_default_writer(tempfile.mkdtemp(), console=False)\n"
    "w.write_scalars(0, {'a': 1.0}); w.write_texts(0, {'t': 'x'}); w.close()\n"
)


def _run(code: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env
    )


def _modules_after(code: str, path: str | None = None) -> set[str]:
    out = _run(code + "\nimport sys\nprint('\\n'.join(sorted(sys.modules)))", path).stdout
    return set(out.split())


def test_import_writers_imports_no_heavy_framework():
    loaded = _modules_after("import writers")
    heavy = {"tensorflow", "torch", "jax", "tensorboardX", "clu", "flax", "wandb", "mlflow"}
    assert heavy.isdisjoint(name.split(".")[0] for name in loaded)


def test_using_the_default_writer_imports_no_tensorflow_or_torch_even_where_installed(
    tmp_path: pathlib.Path,
):
    # tensorboardX's __init__ imports torch where it is installed (a GPU machine's usual
    # image), only for type annotations: a stand-in `torch` on the path shows whether it ran.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(TORCH)
    loaded = {name.split(".")[0] for name in _modules_after(WRITE, str(tmp_path))}
    assert "tensorboardX" in loaded
    assert "tensorflow" not in loaded and "torch" not in loaded
    # Hidden only while tensorboardX is imported: the program can still import torch.
    after = _run(WRITE + "import torch; print(torch.Tensor)", str(tmp_path))
    assert after.stdout.strip() == "<class 'object'>" and "torch imported" in after.stderr
    # A program that imported torch first keeps it, and tensorboardX sees it as usual.
    first = _run(
        "import torch\n" + WRITE + "import tensorboardX.writer as w\nprint(w.numpy_compatible)",
        str(tmp_path),
    )
    assert first.stdout.strip() == "<class 'object'>"
