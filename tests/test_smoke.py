"""The packages import and the test process sees the fake device mesh."""

import jax


def test_eight_fake_cpu_devices():
    assert jax.device_count() == 8
    assert jax.devices()[0].platform == "cpu"


def test_packages_import():
    import metrics_manager
    import writers

    assert isinstance(metrics_manager.__all__, list)
    assert isinstance(writers.__all__, list)
