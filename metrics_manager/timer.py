"""Host-side duration timer for summary windows, measured in a background thread.

A summary window starts when the train state passed to `start` is ready on the
device and ends when the metrics passed to `stop` are ready. JAX dispatches
asynchronously, so "ready" is only known by blocking; the timer does that
blocking in its own thread so the training loop never waits for it.

Buffers that were donated to a later computation (`x.is_deleted()`) count as
ready: the step that consumed them has been dispatched after they were
computed. This is checked per leaf, never by matching error strings.

Usage:

  timer = DurationTimer()
  timer.start(block_on=state)          # returns at once
  ...                                  # train steps
  duration = timer.stop(block_on=metrics)  # Future[float | None]
  duration.result()                    # seconds between the two ready points
  timer.close()

This module runs on the host only; never import it from code traced by jit.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import jax

Clock = Callable[[], float]
"""A function returning the current time in seconds (e.g. `time.perf_counter`)."""


def block_until_ready_or_deleted(tree: Any) -> None:
    """Blocks until every `jax.Array` leaf of `tree` is ready or deleted.

    Deleted (donated) buffers count as ready. Leaves that are not `jax.Array`
    (NumPy arrays, Python numbers, None) are ready by definition.

    Args:
      tree: any pytree.

    Raises:
      Exception: whatever `block_until_ready` raises for a leaf that is still
        alive afterwards (e.g. the computation producing it failed).

    Example:
      >>> import jax.numpy as jnp
      >>> block_until_ready_or_deleted({"x": jnp.ones(3), "y": 1.0})
    """
    arrays = [
        leaf
        for leaf in jax.tree.leaves(tree)
        if isinstance(leaf, jax.Array) and not leaf.is_deleted()
    ]
    try:
        jax.block_until_ready(arrays)  # one batched wait, not one call per leaf
        return
    except Exception:
        pass  # a buffer may have been donated during the wait: sort it out leaf by leaf
    for leaf in arrays:
        try:
            leaf.block_until_ready()
        except Exception:
            if leaf.is_deleted():
                continue
            raise


class DurationTimer:
    """Measures "block_on ready" to "metrics ready" windows without blocking.

    All waiting happens in one background thread owned by the timer, in call
    order, so a `stop` always sees the `start` before it. The clock is read in
    that thread right after the awaited values become ready.

    Args:
      clock: returns the current time in seconds; inject a fake in tests.
        Defaults to `time.perf_counter` (monotonic).
      thread_name: prefix for the background thread's name.

    Example:
      >>> import jax.numpy as jnp
      >>> ticks = iter([10.0, 12.5])
      >>> timer = DurationTimer(clock=lambda: next(ticks))
      >>> timer.start(block_on=jnp.zeros(2))
      >>> timer.stop(block_on=jnp.ones(2)).result()
      2.5
      >>> timer.close()
    """

    def __init__(self, *, clock: Clock | None = None, thread_name: str = "DurationTimer") -> None:
        if clock is not None and not callable(clock):
            raise TypeError(
                f"clock must be a callable returning seconds (e.g. time.perf_counter), "
                f"got {type(clock).__name__}: {clock!r}."
            )
        self._clock: Clock = clock if clock is not None else time.perf_counter
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=thread_name
        )
        self._executor.submit(lambda: None)  # start the thread now, not in the first start()
        self._start: concurrent.futures.Future[float] | None = None

    @property
    def started(self) -> bool:
        """Whether a window is open (`start` was called since the last `stop`)."""
        return self._start is not None

    def _ready_time(self, block_on: Any) -> float:
        block_until_ready_or_deleted(block_on)
        return float(self._clock())

    def start(self, block_on: Any = ()) -> None:
        """Opens a window that begins when `block_on` is ready; returns at once.

        Calling `start` again before `stop` restarts the window.

        Args:
          block_on: pytree to wait for (usually the train state); `()` starts
            the window as soon as the background thread runs.

        Raises:
          RuntimeError: if the timer is closed.
        """
        self._start = self._submit(self._ready_time, block_on)

    def stop(self, block_on: Any = ()) -> concurrent.futures.Future[float | None]:
        """Closes the window when `block_on` is ready; returns at once.

        Args:
          block_on: pytree to wait for (usually the metrics of the window).

        Returns:
          A future of the window's duration in seconds, or of None when no
          window was open (`start` was not called since the last `stop`).

        Raises:
          RuntimeError: if the timer is closed.
        """
        start, self._start = self._start, None
        if start is None:
            done: concurrent.futures.Future[float | None] = concurrent.futures.Future()
            done.set_result(None)
            return done

        def duration() -> float:
            # `start` ran earlier on this same single thread, so it is done.
            return self._ready_time(block_on) - start.result()

        return self._submit(duration)

    def _submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        try:
            return self._executor.submit(fn, *args)
        except RuntimeError as err:  # raised by a shut-down executor
            raise RuntimeError("DurationTimer is closed; create a new one.") from err

    def close(self) -> None:
        """Waits for pending measurements and stops the thread. Idempotent."""
        self._start = None
        self._executor.shutdown(wait=True)
