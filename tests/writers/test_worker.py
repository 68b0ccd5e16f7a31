"""`OrderedWorker`: order, abandoned pieces, and jobs nobody waits on."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from writers._worker import OrderedWorker


def test_an_abandoned_piece_that_returns_late_runs_nothing_twice():
    ran: list[str] = []
    stuck: list[str] = []
    release = threading.Event()

    def mark(name):
        return lambda job: ran.append(name)

    def slow(job):
        release.wait()
        ran.append("slow")

    worker = OrderedWorker("test", on_stuck=lambda label, job, cap: stuck.append(label))
    first = worker.submit(
        [("a", mark("a"), None), ("slow", slow, 0.2), ("b", mark("b"), None), ("c", mark("c"), 5)]
    )
    second = worker.submit([("d", mark("d"), None)])
    assert worker.drain(10)  # the waiting caller abandons "slow" after its 0.2 s
    assert first.result(0) is None and second.result(0) is None
    assert ran == ["a", "b", "c", "d"] and stuck == ["slow"]
    assert len(worker.threads) == 2
    release.set()
    worker.threads[0].join(5)
    assert not worker.threads[0].is_alive()
    assert ran == ["a", "b", "c", "d", "slow"]  # it ended on its own thread, nothing ran again
    assert worker.close(5)


def test_a_posted_job_makes_no_future_and_its_error_is_logged(caplog):
    ran: list[int] = []
    worker = OrderedWorker("posted")

    def boom(job):
        raise OSError("disk full")

    assert worker.post([("boom", boom, None), ("never", lambda job: ran.append(1), None)]) is None
    after = worker.submit([("after", lambda job: ran.append(2), None)])
    assert after.result(5) is None and ran == [2]  # the failed job ended; the next one ran
    assert worker.close(5)
    logged = [r.getMessage() for r in caplog.records]
    assert logged == ["posted: a background job failed: OSError('disk full')"]


def test_jobs_run_in_submission_order_with_back_pressure():
    order: list[int] = []
    gate = threading.Event()
    worker = OrderedWorker("order", max_pending=2)
    worker.post([("gate", lambda job: gate.wait(), None)])
    for i in range(2):
        worker.post([(str(i), lambda job, i=i: order.append(i), None)])
    blocked = threading.Thread(
        target=lambda: worker.post([("2", lambda job: order.append(2), None)])
    )
    blocked.start()
    time.sleep(0.2)
    assert blocked.is_alive()  # two jobs wait behind the running one: the third blocks
    gate.set()
    blocked.join(5)
    assert worker.drain(5) and order == [0, 1, 2]
    assert worker.close(5)


def test_hurry_bounds_the_running_and_later_deadlines_until_undone():
    stuck: list[tuple[str, float]] = []
    hang, running = threading.Event(), threading.Event()

    def on_stuck(label, job, cap):
        stuck.append((label, time.monotonic() - start))

    worker = OrderedWorker("hurry", on_stuck=on_stuck)
    worker.post([("running", lambda job: (running.set(), hang.wait()), 60.0)])
    worker.post([("later", lambda job: hang.wait(), 60.0), ("free", lambda job: hang.wait(), None)])
    assert running.wait(5)  # "running" has started with its 60 s deadline
    start = time.monotonic()
    worker.hurry(0.3)
    # "free" has no deadline: bounded too (a writer_deadline_s=None manager never exited)
    assert worker.drain(3.0)
    assert [label for label, _ in stuck] == ["running", "later", "free"]
    assert 0.3 <= stuck[0][1] < 1.2 and 0.6 <= stuck[1][1] < 2.4  # 0.3 s each, not 60 s
    assert 0.9 <= stuck[2][1] < 3.0
    worker.hurry(None)
    assert worker.cap is None
    worker.post([("unbounded", lambda job: hang.wait(), None)])
    assert not worker.drain(1.0)  # undone: a piece with no deadline is not abandoned again
    hang.set()
    assert worker.drain(5) and worker.close(5)


@pytest.mark.parametrize("undone", [False, True])
def test_hurry_abandons_a_running_piece_with_no_deadline_and_nothing_runs_twice(undone):
    # Such a piece takes no lock round when it ends; once abandoned, its thread must not go
    # on with its job's next pieces beside the new thread, also where `hurry` was undone
    # before the abandoned piece returned.
    ran: list[str] = []
    release = threading.Event()
    started = threading.Event()

    def stuck_piece(job):
        started.set()
        release.wait()
        ran.append("stuck")

    worker = OrderedWorker("free")
    job = worker.submit(
        [("stuck", stuck_piece, None)] + [(n, lambda job, n=n: ran.append(n), None) for n in "ab"]
    )
    assert started.wait(5)
    worker.hurry(0.2)
    if undone:
        worker.hurry(None)  # the running piece keeps the bound it got
    assert job.result(5) is None
    assert ran == ["a", "b"] and len(worker.threads) == 2
    release.set()
    worker.threads[0].join(5)
    assert not worker.threads[0].is_alive()
    assert ran == ["a", "b", "stuck"]  # the old thread ended with its piece
    assert worker.close(5)


def test_a_piece_abandoned_after_hurry_was_undone_is_reported_with_the_cap_that_bound_it():
    # A signal's flush that gave up first (its queue wait ended a hair before the piece's
    # capped deadline) undoes `hurry`; the piece, abandoned after that by a later wait, was
    # reported as past its own deadline (writer_deadline_s=60.0), not the signal's 2 s bound.
    stuck: list[tuple[str, float | None]] = []
    release = threading.Event()
    started = threading.Event()

    def hung(job):
        started.set()
        release.wait()

    worker = OrderedWorker("w", on_stuck=lambda label, job, cap: stuck.append((label, cap)))
    job = worker.submit([("writer 'hung'", hung, 60.0), ("next", lambda job: None, None)])
    assert started.wait(5)
    worker.hurry(0.2)
    worker.hurry(None)
    assert job.result(5) is None
    assert stuck == [("writer 'hung'", 0.2)]
    release.set()
    assert worker.close(5)


def test_drain_waits_for_the_jobs_queued_before_it_not_those_queued_meanwhile():
    ran: list[int] = []
    stop = threading.Event()
    worker = OrderedWorker("busy", max_pending=4)

    def produce():  # a loop on another thread that never lets the queue empty
        i = 0
        while not stop.is_set():
            i += 1
            worker.post([(str(i), lambda job, i=i: (time.sleep(0.002), ran.append(i)), None)])

    producer = threading.Thread(target=produce)
    producer.start()
    time.sleep(0.2)
    worker.post([("mark", lambda job: ran.append(-1), None)])
    assert worker.drain(5.0)  # before: it waited for an empty queue, which never came
    assert -1 in ran
    stop.set()
    producer.join(5)
    assert worker.close(5)


def test_a_future_cancelled_before_its_job_starts_skips_the_job_and_nothing_else():
    ran: list[str] = []
    gate, started = threading.Event(), threading.Event()
    worker = OrderedWorker("cancel")
    running = worker.submit([("gate", lambda job: (started.set(), gate.wait()), None)])
    skipped = worker.submit([("skipped", lambda job: ran.append("skipped"), None)])
    after = worker.submit([("after", lambda job: ran.append("after"), None)])
    assert started.wait(5)  # the gate job has started: it can no longer be cancelled
    assert not running.cancel() and skipped.cancel()
    gate.set()
    assert worker.drain(5)
    assert ran == ["after"] and after.result(0) is None and skipped.cancelled()
    assert len(worker.threads) == 1 and worker.threads[0].is_alive()  # before: it died here
    assert worker.submit([("later", lambda job: ran.append("later"), None)]).result(5) is None
    assert worker.close(5)


@pytest.mark.filterwarnings(
    # The thread's death is the point: pytest reports the exception that killed it.
    "ignore::pytest.PytestUnhandledThreadExceptionWarning"
)
def test_a_thread_killed_outside_its_jobs_is_replaced_by_the_next_wait(caplog):
    fired: list[bool] = []

    def hook(*_):  # as a second cProfile raises in each new thread on Python 3.12
        if not fired:
            fired.append(True)
            raise ValueError("Another profiling tool is already active")

    threading.setprofile(hook)
    try:
        worker = OrderedWorker("killed")
        worker.threads[0].join(5)
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    assert fired and not worker.threads[0].is_alive()
    future = worker.submit([("job", lambda job: setattr(job, "result", 7), None)])
    assert worker.drain(5) and future.result(0) == 7
    assert len(worker.threads) == 2
    died = [r.getMessage() for r in caplog.records if "died" in r.getMessage()]
    assert died == ["killed: its thread died; a new one goes on with the queue"]
    assert worker.close(5)


def test_a_worker_that_can_start_no_thread_has_its_waiting_caller_run_the_queue(monkeypatch):
    # Python 3.12.0-3.12.1 start no thread while the interpreter shuts down, so the close of a
    # manager at exit could not replace a hung writer's thread: 4 of 6 summaries were lost.
    release = threading.Event()
    ran: list[str] = []
    stuck: list[str] = []
    worker = OrderedWorker("orphan", on_stuck=lambda label, job, cap: stuck.append(label))
    hung = worker.submit(
        [("hang", lambda job: release.wait(), 0.2), ("b", lambda job: ran.append("b"), None)]
    )
    after = worker.submit(
        [("after", lambda job: ran.append(threading.current_thread().name), None)]
    )

    def refuse(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    assert worker.drain(10)  # abandons "hang", fails to start a thread, runs the rest itself
    assert stuck == ["hang"] and ran == ["b", "MainThread"]
    assert hung.result(0) is None and after.result(0) is None
    later = worker.submit([("later", lambda job: ran.append("later"), None)])
    assert worker.close(5) and later.result(0) is None and ran[-1] == "later"
    assert len(worker.threads) == 1  # only the hung one; nothing was started
    release.set()
    worker.threads[0].join(5)
    assert not worker.threads[0].is_alive() and ran.count("b") == 1


def test_an_overrun_is_noticed_at_the_next_post_without_a_waiting_caller():
    # A loop that posts a summary now and then, with room in the queue, never waits: the
    # overrun was noticed only once max_pending jobs had queued behind the hung piece.
    ran: list[str] = []
    stuck: list[str] = []
    release, started = threading.Event(), threading.Event()
    worker = OrderedWorker("post", on_stuck=lambda label, job, cap: stuck.append(label))
    worker.post(
        [
            ("hung", lambda job: (started.set(), release.wait()), 0.2),
            ("rest", lambda j: ran.append("rest"), None),
        ]
    )
    worker.post([("early", lambda job: ran.append("early"), None)])
    assert started.wait(5)  # its 0.2 s deadline runs from here at the latest
    assert stuck == [] and ran == []  # within its deadline: left alone
    time.sleep(0.3)
    worker.post([("late", lambda job: ran.append("late"), None)])
    assert stuck == ["hung"]  # this post abandoned it
    deadline = time.monotonic() + 5
    while len(ran) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == ["rest", "early", "late"]
    release.set()
    assert worker.close(5)


def test_waiting_on_a_future_abandons_an_overrun_piece_and_timeouts_hold():
    # Only a submit, post or drain noticed an overrun: result() on the future waited forever.
    release = threading.Event()
    stuck: list[str] = []
    worker = OrderedWorker("test", on_stuck=lambda label, job, cap: stuck.append(label))

    def result(job):
        job.result = "computed"

    future = worker.submit([("compute", result, None), ("hung", lambda job: release.wait(), 0.2)])
    with pytest.raises(concurrent.futures.TimeoutError):  # before the deadline: still running
        future.result(timeout=0.05)
    with pytest.raises(concurrent.futures.TimeoutError):
        future.exception(timeout=0.01)
    started = time.monotonic()
    assert future.result(timeout=10) == "computed"
    assert time.monotonic() - started < 2 and stuck == ["hung"]
    assert future.exception(timeout=0) is None
    failing = worker.submit([("boom", lambda job: 1 / 0, None)])
    assert isinstance(failing.exception(timeout=10), ZeroDivisionError)
    release.set()
    assert worker.close(10)
