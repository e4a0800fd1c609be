"""Helpers for the tests that run ``asyncdp bench`` as a child process and signal it mid-run."""

from __future__ import annotations

import os
import select
import subprocess
import time
from pathlib import Path


def read_until(fd: int, marker: bytes, timeout: float) -> bytes:
    """What the pipe ``fd`` gave until ``marker`` came (or it closed, or ``timeout`` passed)."""
    got = b""
    deadline = time.monotonic() + timeout
    while marker not in got and (left := deadline - time.monotonic()) > 0:
        if not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        got += chunk
    return got


def cpu_s(pid: int) -> float:
    """The CPU seconds process ``pid`` has used (user + system, from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_busy(proc: subprocess.Popen[bytes], seconds: float, timeout: float) -> bool:
    """Until ``proc`` has run ``seconds`` more of CPU (it is well into the work it began): True, or False when it
    exited or ``timeout`` passed first. A wall-clock sleep would say nothing on a loaded machine."""
    start = cpu_s(proc.pid)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if cpu_s(proc.pid) - start >= seconds:
            return True
        time.sleep(0.02)
    return False


def reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` if it still runs, wait for it, and close its stderr pipe."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()
