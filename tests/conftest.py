"""Test-wide JAX settings.

Eight fake CPU devices are created for every test process: XLA reads the flag
once, when the backend starts, so it cannot be turned on per test. Tests that
need a mesh use `jax.devices()[:8]`; all others run on device 0 as usual.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (must come after XLA_FLAGS is set)

jax.config.update("jax_numpy_rank_promotion", "raise")
