"""Window timing: `block_until_ready_or_deleted` and the manager's window rule.

The rule (`manager._ready_time`): a window end whose arrays are already ready (or donated)
when the worker looks is the caller's own clock reading; only arrays still computing are
waited for, and the clock is read when they are ready. So a busy worker never moves a window,
which is what keeps `timing/*` right for steps of microseconds.
"""

from __future__ import annotations

import doctest
import threading

import jax
import jax.numpy as jnp
import pytest

import writers
from metrics_manager import timer as timer_lib
from metrics_manager.manager import MetricsManager, _ready_time
from metrics_manager.metrics import StepsPerTime, Sum
from metrics_manager.timer import block_until_ready_or_deleted


class FakeClock:
    """Returns the given times in order and records how often it was read."""

    def __init__(self, *times: float) -> None:
        self._times = list(times)
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self._times.pop(0)


def _donated() -> jax.Array:
    x = jnp.arange(4.0)
    jax.jit(lambda a: a * 2, donate_argnums=0)(x)
    assert x.is_deleted(), "CPU donation is expected to delete the input"
    return x


def test_docstring_examples_run():
    result = doctest.testmod(timer_lib)
    assert result.attempted >= 2
    assert result.failed == 0


def test_already_ready_values_use_the_callers_clock_reading():
    clock = FakeClock()
    assert _ready_time({"x": jnp.ones(2), "gone": _donated()}, 7.0, clock) == 7.0
    assert clock.reads == 0  # never read late by a busy worker


def test_values_still_computing_are_waited_for_then_the_clock_is_read(monkeypatch):
    pending = jnp.ones(3)
    monkeypatch.setattr(type(pending), "is_ready", lambda self: False)
    waited = []
    monkeypatch.setattr(timer_lib, "block_until_ready_or_deleted", lambda t: waited.append(t))
    assert _ready_time({"x": pending}, 7.0, FakeClock(9.5)) == 9.5
    assert len(waited) == 1


def test_a_busy_worker_does_not_shorten_the_window():
    """Window of 100 steps of 50 us: start and end read on the caller, the worker is late."""
    clock = FakeClock(1.000, 1.005)  # start_duration_timer, then write_metrics_summary
    gate = threading.Event()

    class SlowWriter(writers.NoopWriter):
        def write_texts(self, step, texts):
            gate.wait(30)  # the worker is busy while the window runs

    with MetricsManager("t", writer_factory=lambda d: SlowWriter(), clock=clock) as manager:
        manager.write_texts(0, {"note": "busy"})
        manager.start_duration_timer(block_on=jnp.ones(2))
        future = manager.write_metrics_summary({"sps": StepsPerTime(steps=100)}, 100, 100)
        gate.set()
        summary = future.result()
    assert float(summary["sps"].value) == pytest.approx(100 / 0.005)  # 20,000 steps/s


def test_donated_state_and_metrics_count_as_ready():
    clock = FakeClock(0.0, 2.5)
    with MetricsManager("t", writer_factory=lambda d: writers.NoopWriter(), clock=clock) as m:
        m.start_duration_timer(block_on={"params": _donated()})
        summary = m.write_metrics_summary({"sps": StepsPerTime(steps=5)}, 5, 5).result()
    assert float(summary["sps"].value) == 2.0


def test_a_leaf_donated_during_the_batched_wait_counts_as_ready(monkeypatch):
    """The one batched wait fails because a buffer was donated meanwhile: still ready."""
    victim, other = jnp.arange(3.0), jnp.ones(2)
    seen = []

    def batched_wait(arrays):
        seen.append(len(arrays))
        victim.delete()  # donated to a later step while we waited
        raise RuntimeError("Array has been deleted")

    monkeypatch.setattr(jax, "block_until_ready", batched_wait)
    block_until_ready_or_deleted({"victim": victim, "other": other, "host": 1.0})
    assert seen == [2]  # the two live arrays in one call, the host value skipped


def _per_thread_clock(caller: list[float], worker: list[float]):
    """Scripted readings for the calling thread and for the manager's worker, apart."""
    main = threading.get_ident()
    return lambda: (caller if threading.get_ident() == main else worker).pop(0)


@pytest.mark.parametrize("computing_at_the_call", [True, False])
def test_a_device_scalar_the_worker_waited_for_ends_a_window_computing_at_the_call(
    monkeypatch, computing_at_the_call
):
    """`write_scalar(loss)` then the summary, the host ahead: the worker waits for the loss
    (ready at 9 s), then finds the same step's metrics ready. Ending at the summary call
    (0.01 s) read 500 steps/s for 5/9. Metrics already ready at the call (the loss being a
    later computation's, an eval's) end there, at 0.01 s."""
    loss, total = jnp.float32(2.0), jnp.float32(5.0)
    looks = {"total": 0}
    ready = type(loss).is_ready

    def is_ready(self):
        if self is total:  # computing when the caller looks, ready when the worker does
            looks["total"] += 1
            return not computing_at_the_call or looks["total"] > 1
        return self is not loss and ready(self)

    monkeypatch.setattr(type(loss), "is_ready", is_ready)
    clock = _per_thread_clock(caller=[0.0, 0.01], worker=[9.0])
    with MetricsManager("t", writer_factory=lambda d: writers.NoopWriter(), clock=clock) as m:
        m.start_duration_timer(block_on=jnp.ones(2))
        m.write_scalar("loss", loss, 5)
        metrics = {"sps": StepsPerTime(steps=5), "total": Sum(total)}
        summary = m.write_metrics_summary(metrics, 5, 5).result()
    expected = 5 / 9.0 if computing_at_the_call else 5 / 0.01
    assert float(summary["sps"].value) == pytest.approx(expected)
    assert float(summary["total"].value) == 5.0


def test_the_next_window_counts_the_summary_calls_own_time(monkeypatch):
    """A summary every step of a host-bound loop: the summary call (0.3 s here) is the loop's
    cost too, so the next window starts that much before its `start_duration_timer` call;
    the loop's time after the call returned (0.2 s here: an eval) stays out."""
    from metrics_manager import manager as manager_lib

    monkeypatch.setattr(manager_lib, "_call_clock", FakeClock(100.0, 100.3, 200.0, 200.1))
    clock = _per_thread_clock(caller=[0.0, 1.0, 1.5, 2.0], worker=[])
    with MetricsManager("t", writer_factory=lambda d: writers.NoopWriter(), clock=clock) as m:
        sps = []
        for step in (4, 8):
            m.start_duration_timer(block_on=jnp.ones(2))
            sps.append(m.write_metrics_summary({"sps": StepsPerTime(steps=4)}, step, 4))
        values = [float(future.result()["sps"].value) for future in sps]
    # Windows [0, 1] and [1.5 - 0.3, 2]: 0.2 s between the summary's return and the timer.
    assert values == [pytest.approx(4 / 1.0), pytest.approx(4 / 0.8)]
