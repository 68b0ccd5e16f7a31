"""`import writers` stays light: no TensorFlow, torch, JAX, tensorboardX, W&B or MLflow."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    script = code + "\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    return set(out.stdout.split())


def test_import_writers_imports_no_heavy_framework():
    loaded = _modules_after("import writers")
    heavy = {"tensorflow", "torch", "jax", "tensorboardX", "clu", "flax", "wandb", "mlflow"}
    assert heavy.isdisjoint(name.split(".")[0] for name in loaded)


def test_using_the_default_writer_still_imports_no_tensorflow_or_torch():
    code = (
        "import tempfile, writers\n"
        "w = writers.create_default_writer(tempfile.mkdtemp(), console=False)\n"
        "w.write_scalars(0, {'a': 1.0}); w.write_texts(0, {'t': 'x'}); w.close()"
    )
    loaded = {name.split(".")[0] for name in _modules_after(code)}
    assert "tensorboardX" in loaded
    assert "tensorflow" not in loaded and "torch" not in loaded
