"""Test-wide JAX settings.

Eight fake CPU devices are created for every test process: XLA reads the flag
once, when the backend starts, so it cannot be turned on per test. Tests that
need a mesh use `jax.devices()[:8]`; all others run on device 0 as usual.

The tracker libraries (W&B, MLflow) are kept off the network: W&B runs offline,
neither reports telemetry or errors, and W&B does not capture the console.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.update(
    WANDB_MODE="offline",
    WANDB_SILENT="true",
    WANDB_CONSOLE="off",
    WANDB_ERROR_REPORTING="false",
    WANDB_DISABLE_GIT="true",
    MLFLOW_DISABLE_TELEMETRY="true",
    DO_NOT_TRACK="true",
)

import jax  # noqa: E402  (must come after XLA_FLAGS is set)
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """One short run of the demo's command line, as `make demo` runs it, shared by the demo
    and plot tests (compiling the demo takes most of a run): (model dir, stdout)."""
    from tests.test_demo import TOTAL_STEPS, _bindings, run_demo

    model_dir = str(tmp_path_factory.mktemp("runs") / "demo")
    return model_dir, run_demo(_bindings(model_dir), TOTAL_STEPS)
