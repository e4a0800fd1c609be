"""Run ``python -m asyncdp route`` as a real process for end-to-end tests, and always take it down.

The router binds port 0 and its log line ``routing on http(s)://HOST:PORT`` says where it listens: the helper waits for
that line under a deadline (failing with the log if the process exits first). :meth:`RouterProcess.stop` signals it
and returns its exit code once it is gone; the context manager SIGKILLs whatever is left, so a failing test leaks
nothing. The router has no children: its session (it leads one) must be empty once it exited.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT

READY_TIMEOUT_S = 30.0
_READY = re.compile(r"routing on (https?)://127\.0\.0\.1:(\d+) ")


@dataclass
class RouterProcess:
    process: subprocess.Popen[bytes]
    log_path: Path
    port: int = 0
    scheme: str = "http"

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 15.0) -> int:
        """Send ``sig``; the exit code once the process and its session are gone."""
        self.process.send_signal(sig)
        return self.wait_exit(timeout_s)

    def wait_exit(self, timeout_s: float = 15.0) -> int:
        """The exit code once the process and its session are gone."""
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the router did not exit within {timeout_s} s\n{self.log()[-4000:]}")
        with pytest.raises(ProcessLookupError):
            os.killpg(self.process.pid, 0)
        return code


def _wait_ready(router: RouterProcess) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if (m := _READY.search(router.log())) is not None:
            router.scheme, router.port = m.group(1), int(m.group(2))
            return
        try:  # the poll interval, and an early exit if the router died
            router.process.wait(timeout=0.1)
            pytest.fail(f"the router exited with {router.process.returncode}\n{router.log()[-4000:]}")
        except subprocess.TimeoutExpired:
            pass
    pytest.fail(f"the router did not report its address within {READY_TIMEOUT_S} s\n{router.log()[-4000:]}")


@contextmanager
def route(log_path: Path, *endpoints: str, args: tuple[str, ...] = ()) -> Iterator[RouterProcess]:
    """``asyncdp route`` in front of ``endpoints`` on 127.0.0.1 and a free port, for the block."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "asyncdp", "route", "--host", "127.0.0.1", "--port", "0",
           *(a for url in endpoints for a in ("--endpoint", url)), *args]
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env, cwd=ROOT)
    router = RouterProcess(proc, log_path)
    try:
        _wait_ready(router)
        yield router
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
