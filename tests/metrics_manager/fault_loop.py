"""A training loop run as a subprocess by the fault tests (SIGTERM, SIGKILL, hung writers).

    python -m tests.metrics_manager.fault_loop MODE SUMMARY_DIR [PERIOD_S]

MODE: `every_step` (one summary per step), `periodic` (one every PERIOD_S seconds), `hang`
(a writer that never returns, next to JSONL), `hang_signal` (one every step with a writer
that never returns first, the default deadline, JSONL and TensorBoard), `hang_no_deadline`
(the same with `writer_deadline_s=None`), `slow_signal` (the same with a writer taking 3 s a
write instead), `unclosed` (50
summaries queued, then the program ends without closing the manager), `fork` (forked
children: data-loader workers terminated with SIGTERM, and one that exits normally),
`preemption` (one `jax.distributed` process that stops at JAX's preemption sync point),
`close_signal` (SIGTERM 0.5 s into a close() that still has 40 summaries to write),
`own_handler` (the program's own SIGTERM handler sets a flag; a writer hangs),
`close_exit`/`close_ctrl_c` (close() interrupted by a handler's sys.exit, or by Ctrl-C),
`restored_handler` (a second run after the program restored its SIGTERM handler), `wandb`
(`every_step` with an offline W&B writer beside JSONL and TensorBoard), `long_call`
(5 summaries, then the main thread waits in `block_until_ready` on a computation that never
ends), `multiprocess` (see
`test_failures.test_a_writer_failing_on_process_0_does_not_hang_process_1`),
`multiprocess_refused` (the same loop writing keys JSONL reserves, no failing writer).
After each `write_metrics_summary` returns it prints `issued <step>` (flushed), so the test
knows what was issued before the signal.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

import writers
from metrics_manager import MetricsManager, Sum


class HangingWriter(writers.NoopWriter):
    """Never returns from a write (a dead NFS mount, a stuck remote logger)."""

    def write_scalars(self, step, scalars):
        threading.Event().wait()


class FailingWriter(writers.NoopWriter):
    def write_scalars(self, step, scalars):
        raise OSError(f"remote logger down (step {step})")


def files_and(first: dict | None = None, last: dict | None = None):
    """A writer_factory: JSONL and TensorBoard (no console), after `first`, before `last`."""

    def factory(logdir, collection=None):
        default = writers.create_default_writer(logdir, collection=collection, console=False)
        return writers.MultiWriter({**(first or {}), **default.writers, **(last or {})})

    return factory


@jax.jit
def step_fn(x):
    return x + 1.0, {"loss": Sum(jnp.sum(x))}


class CloseRecorder(writers.NoopWriter):
    """Appends the pid of the process closing it to `path`."""

    def __init__(self, path: str) -> None:
        self.path = path

    def close(self) -> None:
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


def main(mode: str, summary_dir: str, period: float = 0.2) -> None:
    if mode in ("multiprocess", "multiprocess_refused"):
        return multiprocess(summary_dir, int(period), refused=mode == "multiprocess_refused")
    if mode == "fork":
        return forked_children(summary_dir)
    if mode == "preemption":
        return preemption_sync_point(summary_dir)
    if mode == "close_signal":
        return signal_during_close(summary_dir)
    if mode == "own_handler":
        return own_signal_handler(summary_dir)
    if mode in ("close_exit", "close_ctrl_c"):
        return interrupted_close(summary_dir, mode.removeprefix("close_"))
    if mode == "restored_handler":
        return restored_handler(summary_dir)
    if mode == "long_call":
        return inside_a_long_call(summary_dir)
    if mode == "hang":

        def factory(logdir):
            return writers.MultiWriter(
                {
                    "jsonl": writers.JsonlWriter(os.path.join(logdir, "metrics.jsonl")),
                    "stuck": HangingWriter(),
                }
            )

        manager = MetricsManager(
            "train", summary_dir, writer_factory=factory, writer_deadline_s=1.0, max_pending=2
        )
        x = jnp.zeros(4)
        for step in range(1, 21):
            x, metrics = step_fn(x)
            manager.write_metrics_summary(metrics, step, 1)
        start = time.monotonic()
        manager.close()
        print(f"closed in {time.monotonic() - start:.2f} s", flush=True)
        print("errors:", *[str(f) for f in manager.errors], sep="\n", flush=True)
        return None

    hangs = mode in ("hang_signal", "hang_no_deadline")
    first = {"stuck": HangingWriter()} if hangs else {}
    if mode == "slow_signal":
        first = {"slow": SlowWriter(3.0)}  # a tracker over a slow link: under every deadline
    factory = files_and(first=first)
    if mode == "wandb":  # W&B offline beside the files (WANDB_MODE=offline from the test)

        def factory(logdir, collection=None):
            tracker = writers.WandbWriter("fault", logdir=logdir, process_index=0)
            return files_and(last={"wandb": tracker})(logdir, collection)

    deadline = {"writer_deadline_s": None} if mode == "hang_no_deadline" else {}
    manager = MetricsManager("train", summary_dir, writer_factory=factory, **deadline)
    x = jnp.zeros(4)
    if mode == "unclosed":
        for step in range(1, 51):
            x, metrics = step_fn(x)
            manager.write_metrics_summary(metrics, step, 1)
        return None  # no close(): the interpreter exits with the summaries still queued
    last = time.monotonic()
    for step in range(1, 1_000_000):
        x, metrics = step_fn(x)
        if mode != "periodic" or time.monotonic() - last >= period:
            last = time.monotonic()
            manager.write_metrics_summary(metrics, step, 1)
            print(f"issued {step}", flush=True)
        time.sleep(0.002)


def inside_a_long_call(summary_dir: str) -> None:
    # The slow writer keeps summaries queued when the signal comes: only a flush saves them.
    factory = files_and(first={"slow": SlowWriter(1.0)})
    manager = MetricsManager("train", summary_dir, writer_factory=factory)
    x = jnp.zeros(4)
    for step in range(1, 6):
        x, metrics = step_fn(x)
        manager.write_metrics_summary(metrics, step, 1)
        print(f"issued {step}", flush=True)

    @jax.jit
    def endless(a):  # hours of matrix products: a signal must not wait for them to end
        return jax.lax.fori_loop(0, 2**30, lambda i, a: jnp.sin(a @ a), a)

    busy = endless(jnp.full((256, 256), 1e-3))
    print("computing", flush=True)
    busy.block_until_ready()


def _sleep() -> None:
    time.sleep(60)


def forked_children(summary_dir: str) -> None:
    import multiprocessing

    factory = files_and(last={"recorder": CloseRecorder(os.path.join(summary_dir, "closed_by"))})
    manager = MetricsManager("train", summary_dir, writer_factory=factory)
    x = jnp.zeros(4)
    for step in range(1, 6):
        x, metrics = step_fn(x)
        manager.write_metrics_summary(metrics, step, 1)
    workers = [multiprocessing.get_context("fork").Process(target=_sleep) for _ in range(2)]
    for worker in workers:
        worker.start()
    time.sleep(0.5)
    start = time.monotonic()
    for worker in workers:
        worker.terminate()  # SIGTERM, as a data loader's shutdown or Slurm's preemption sends
    for worker in workers:
        worker.join()
    codes = [worker.exitcode for worker in workers]
    print(f"terminated in {time.monotonic() - start:.2f} s with {codes}", flush=True)
    start = time.monotonic()
    if (pid := os.fork()) == 0:
        print(f"child's SIGTERM handler {signal.getsignal(signal.SIGTERM)!r}", flush=True)
        try:  # a loader worker logging through the parent's manager: refused, not lost
            manager.write_scalars(100, {"loss": 100.0})
        except RuntimeError as err:
            print(f"child's write: {err}", flush=True)
        manager.close()  # the parent's to close: nothing happens
        sys.exit(0)  # a normal exit: the interpreter runs the inherited atexit hooks
    _, status = os.waitpid(pid, 0)
    print(f"exited in {time.monotonic() - start:.2f} s with {status}", flush=True)
    for step in range(6, 11):
        x, metrics = step_fn(x)
        manager.write_metrics_summary(metrics, step, 1)
    manager.close()
    print(f"parent {os.getpid()}", flush=True)


def preemption_sync_point(summary_dir: str) -> None:

    from jax.experimental import multihost_utils

    from tests.storage_servers import free_port

    jax.distributed.initialize(f"127.0.0.1:{free_port()}", num_processes=1, process_id=0)

    factory = files_and()
    with MetricsManager("train", summary_dir, writer_factory=factory) as manager:
        x = jnp.zeros(4)
        for step in range(1, 100_000):
            x, metrics = step_fn(x)
            manager.write_metrics_summary(metrics, step, 1)
            print(f"issued {step}", flush=True)
            if multihost_utils.reached_preemption_sync_point(step):
                print(f"sync point at {step}", flush=True)  # a checkpoint would be saved here
                break
            time.sleep(0.01)
        print(f"SIGINT: {getattr(signal.getsignal(signal.SIGINT), '__name__', None)}", flush=True)
    print("closed", flush=True)


class SlowWriter(writers.NoopWriter):
    def __init__(self, seconds: float = 0.1) -> None:
        self.seconds = seconds

    def write_scalars(self, step, scalars):
        time.sleep(self.seconds)


def signal_during_close(summary_dir: str) -> None:

    factory = files_and(last={"slow": SlowWriter()})
    manager = MetricsManager("train", summary_dir, writer_factory=factory, max_pending=100)
    for step in range(1, 41):
        manager.write_scalars(step, {"loss": float(step)})
        print(f"issued {step}", flush=True)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    manager.close()  # 4 s of slow writes still queued
    print("closed", flush=True)


def interrupted_close(summary_dir: str, how: str) -> None:
    """close() with 30 summaries of slow writes queued, interrupted 0.5 s in: by SIGTERM whose
    handler (the program's, set after the manager's) calls sys.exit(143), or by Ctrl-C with
    handle_signals=False (KeyboardInterrupt)."""

    factory = files_and(last={"slow": SlowWriter(0.1)})
    own = how == "exit"
    manager = MetricsManager(
        "train", summary_dir, writer_factory=factory, max_pending=100, handle_signals=own
    )
    if own:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for step in range(1, 31):
        manager.write_scalars(step, {"loss": float(step)})
        print(f"issued {step}", flush=True)
    signum = signal.SIGTERM if own else signal.SIGINT
    threading.Timer(0.5, os.kill, (os.getpid(), signum)).start()
    manager.close()
    print("closed", flush=True)


def restored_handler(summary_dir: str) -> None:
    """Two runs in one process (a sweep); between them the program restores the SIGTERM
    handler it had: the second manager must install its own again."""

    saved = signal.getsignal(signal.SIGTERM)
    with MetricsManager("first", summary_dir, writer_factory=files_and()):
        pass
    signal.signal(signal.SIGTERM, saved)
    manager = MetricsManager(
        "train", summary_dir, writer_factory=files_and(last={"slow": SlowWriter(0.05)})
    )
    x = jnp.zeros(4)
    for step in range(1, 1_000_000):
        x, metrics = step_fn(x)
        manager.write_metrics_summary(metrics, step, 1)
        print(f"issued {step}", flush=True)


def own_signal_handler(summary_dir: str) -> None:

    signalled: list[float] = []
    signal.signal(signal.SIGTERM, lambda *_: signalled.append(time.monotonic()))  # stop soon

    factory = files_and(first={"stuck": HangingWriter()})
    with MetricsManager("train", summary_dir, writer_factory=factory) as manager:
        x = jnp.zeros(4)
        step = 0
        while not signalled:
            step += 1
            x, metrics = step_fn(x)
            manager.write_metrics_summary(metrics, step, 1)
            print(f"issued {step} at {time.monotonic()}", flush=True)
            time.sleep(0.01)
        print(f"own handler ran at {signalled[0]}", flush=True)  # a checkpoint would be saved
    print(f"closed at {time.monotonic()}", flush=True)


def multiprocess(summary_dir: str, process_id: int, refused: bool = False) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=os.environ["COORDINATOR"], num_processes=2, process_id=process_id
    )
    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    sharding = jax.NamedSharding(mesh, jax.P("d"))
    manager = MetricsManager(
        "train",
        summary_dir,
        writer_deadline_s=5.0,
        writer_factory=lambda d: writers.MultiWriter(
            {
                "jsonl": writers.JsonlWriter(os.path.join(d, "metrics.jsonl")),
                **({"tensorboard": writers.TensorBoardWriter(d)} if refused else {}),
                **({} if refused else {"failing": FailingWriter()}),
            }
        ),
    )
    local = np.ones((jax.local_device_count(),), np.float32)
    x = jax.make_array_from_process_local_data(sharding, local)
    if refused:  # `step` and `time` are JSONL's own fields: only process 0 has the writer
        total = jax.jit(lambda v: {"loss": Sum(jnp.sum(v)), "step": Sum(100 * jnp.max(v))})
    else:
        total = jax.jit(lambda v: {"loss": Sum(jnp.sum(v))})
    for step in range(1, 11):
        metrics = total(x)  # a cross-process reduction every step: a hang would stop here
        summary = manager.write_metrics_summary(metrics, step, 1).result()
        if refused:
            manager.write_scalars(step, {"time": 1.0, "lr": 0.1})
        x = x + 1.0
    manager.close()
    print(
        f"process {process_id} done loss={float(summary['loss'].value)} "
        f"errors={len(manager.errors)}",
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 0.2)
