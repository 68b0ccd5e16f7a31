"""A script in a subprocess, signalled once it prints a line: the real fault of the signal
tests, shared by the manager's and the writers'."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest


def signal_after(
    script: str,
    args: list[str],
    line: str,
    signum: int,
    *,
    delay: float = 0.2,
    timeout: float = 60,
    cwd: str | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """Runs `python -c script *args`, waits until it prints `line` (with its newline), then
    `delay` seconds more, and sends `signum`. Returns the ended process and the rest of its
    output; a process still running after `timeout` seconds is killed and the test fails."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args], cwd=cwd, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    while (printed := proc.stdout.readline()) != line:
        assert printed, f"the script ended before printing {line!r}"
    time.sleep(delay)
    proc.send_signal(signum)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the process hung after signal {signum}")
    return proc, out
