"""Tests for the background duration timer (fake clocks, real arrays, no sleeps)."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import pytest

from metrics_manager import timer as timer_lib
from metrics_manager.timer import DurationTimer, block_until_ready_or_deleted


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


def test_duration_is_difference_of_clock_reads_at_ready_points():
    clock = FakeClock(100.0, 140.0)
    timer = DurationTimer(clock=clock)
    timer.start(block_on={"params": jnp.ones(3)})
    assert timer.started
    duration = timer.stop(block_on=[jnp.zeros(2), 1.0, None]).result()
    timer.close()
    assert duration == 40.0
    assert clock.reads == 2
    assert not timer.started


def test_stop_without_start_gives_none_and_reads_no_clock():
    clock = FakeClock()
    timer = DurationTimer(clock=clock)
    assert timer.stop(block_on=jnp.ones(1)).result() is None
    timer.close()
    assert clock.reads == 0


def test_restart_before_stop_measures_from_last_start():
    timer = DurationTimer(clock=FakeClock(1.0, 5.0, 12.0))
    timer.start()
    timer.start()
    assert timer.stop().result() == 7.0
    timer.close()


def test_donated_buffers_count_as_ready():
    state = {"params": _donated(), "step": jnp.int32(3)}
    block_until_ready_or_deleted(state)  # must not raise
    timer = DurationTimer(clock=FakeClock(0.0, 2.5))
    timer.start(block_on=state)
    assert timer.stop(block_on={"metrics": _donated()}).result() == 2.5
    timer.close()


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


def test_start_and_stop_never_wait_for_the_arrays(monkeypatch):
    """The caller returns while the awaited arrays are still "running".

    A gate stands in for an unfinished device computation: waiting on any
    array blocks until the test opens it. If `start` or `stop` waited on the
    caller's thread, the test would deadlock instead of reaching `gate.set()`.
    """
    gate = threading.Event()
    real_wait = timer_lib.block_until_ready_or_deleted
    opened_before_read = []

    def gated_wait(tree):
        assert gate.wait(timeout=30), "gate never opened"
        real_wait(tree)

    def clock():
        opened_before_read.append(gate.is_set())
        return float(len(opened_before_read))

    monkeypatch.setattr(timer_lib, "block_until_ready_or_deleted", gated_wait)
    timer = DurationTimer(clock=clock)
    timer.start(block_on=jnp.ones(2))
    future = timer.stop(block_on=jnp.ones(2))
    assert not future.done()
    gate.set()
    assert future.result() == 1.0
    timer.close()
    assert opened_before_read == [True, True]


def test_failed_wait_surfaces_in_stop_future(monkeypatch):
    def failing_wait(tree):
        raise RuntimeError("device computation failed")

    monkeypatch.setattr(timer_lib, "block_until_ready_or_deleted", failing_wait)
    timer = DurationTimer(clock=FakeClock(0.0, 1.0))
    timer.start(block_on=jnp.ones(1))
    with pytest.raises(RuntimeError, match="device computation failed"):
        timer.stop().result()
    timer.close()


def test_close_joins_thread_and_is_idempotent():
    before = set(threading.enumerate())
    timer = DurationTimer(clock=FakeClock(0.0, 1.0), thread_name="TimerUnderTest")
    timer.start(block_on=jnp.ones(1))
    timer.stop().result()
    assert any(t.name.startswith("TimerUnderTest") for t in threading.enumerate())
    timer.close()
    timer.close()
    assert set(threading.enumerate()) <= before
    with pytest.raises(RuntimeError, match="closed"):
        timer.start()


def test_bad_clock_is_a_type_error():
    with pytest.raises(TypeError, match="clock must be a callable"):
        DurationTimer(clock=3.0)  # type: ignore[arg-type]
