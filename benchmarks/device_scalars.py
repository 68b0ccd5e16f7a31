"""Loop cost of `write_scalar(key, loss, step)` every step with the step's own device output.

A jitted step (a 384x384 matmul, about 1 ms on 2 cores) returns its loss; the loop writes it
with `manager.write_scalar` to the default writers (TensorBoard and JSONL) at every step. The
manager reads a value still being computed on its worker, so the loop should pay what a host
number costs; `float(loss)` first (hand-rolled logging) makes the loop wait for every step.
Variants, interleaved in a fresh random order each round: no writes, a host number,
the device value, and `float()` of it. A row is the median loop time over the rounds and the
median (min-max) over rounds of its ratio to the no-write loop of the same round.

Run alone: `python -m benchmarks.device_scalars [--quick]`.
"""

from __future__ import annotations

import functools
import tempfile
import time
from typing import Any

from benchmarks import common

VARIANTS = {
    "none": "no writes",
    "host": "write_scalar(0.5): a host number",
    "device": "write_scalar(loss): the step's device output",
    "float": "write_scalar(float(loss)): the loop waits",
}


def make_step(size: int = 384) -> tuple[Any, Any]:
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    @jax.jit
    def step(x):
        y = jnp.tanh(x @ x.T)
        return x + 1e-3 * y, jnp.mean(y)

    x = jnp.full((size, size), 1e-2)
    jax.block_until_ready(step(x))
    return step, x


def one_loop(variant: str, step: Any, x: Any, steps: int) -> float:
    import jax  # noqa: PLC0415

    import writers  # noqa: PLC0415
    from metrics_manager import MetricsManager  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as logdir:
        with MetricsManager(
            "train",
            logdir,
            writer_factory=lambda d: writers.create_default_writer(d, console=False),
        ) as manager:
            start = time.perf_counter()
            for i in range(1, steps + 1):
                x, loss = step(x)
                if variant == "host":
                    manager.write_scalar("loss", 0.5, i)
                elif variant == "device":
                    manager.write_scalar("loss", loss, i)
                elif variant == "float":
                    manager.write_scalar("loss", float(loss), i)
            jax.block_until_ready(x)
            elapsed = time.perf_counter() - start
    return elapsed


def run(quick: bool = False) -> common.Table:
    # One loop's ratio moves by about +-5% on 2 busy cores; the median of 15 rounds by about
    # 1%, so a 5% regression of the device row shows.
    steps, rounds = (300, 3) if quick else (1000, 15)
    step, x = make_step()
    times = common.interleaved(
        {v: functools.partial(one_loop, v, step, x, steps) for v in VARIANTS}, rounds
    )
    table = common.Table(
        key="device_scalars",
        title="12. write_scalar of the step's device output, every step",
        description=" ".join((__doc__ or "").strip().split("\n\n")[0].split()),
        columns=[
            common.Column("variant", "variant"),
            common.Column("ms", "median step (ms)", ".3f"),
            common.Column("x", "x no writes", ".3f"),
            common.Column("spread", "rounds"),
        ],
    )
    ratios = {}
    for variant, label in VARIANTS.items():
        ratios[variant] = [t / base for t, base in zip(times[variant], times["none"], strict=True)]
        table.rows.append(
            {
                "variant": label,
                "ms": 1e3 * common.median(times[variant]) / steps,
                "x": common.median(ratios[variant]),
                "spread": f"{min(ratios[variant]):.3f}x-{max(ratios[variant]):.3f}x",
            }
        )
    # The two ratios the loop's author weighs: what the device value costs over a host
    # number (the worker's read), and what float() first costs (the wait), paired per round.
    for variant, call in (("device", "write_scalar(loss)"), ("float", "float(loss) first")):
        paired = [t / h for t, h in zip(times[variant], times["host"], strict=True)]
        table.headlines.append(
            f"{call}, a device value, every step: {common.median(paired):.3f}x a host number's loop "
            f"(rounds {min(paired):.3f}x-{max(paired):.3f}x)"
        )
    return table


if __name__ == "__main__":
    common.main_for(run)
