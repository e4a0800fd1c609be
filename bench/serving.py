"""One ``asyncdp serve`` for a benchmark: launched on a free loopback port, waited for on ``/health``, stopped with
SIGTERM (the launcher stops its children in order) and killed as a process group if it does not exit."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import httpx

ROOT = Path(__file__).resolve().parents[1]


def exit_on_sigterm() -> None:
    """SIGTERM (``timeout``, an orchestrator, ``kill``) ends the script as Ctrl-C does, by an exception, so the
    ``finally`` clauses stop the servers it started; by default Python dies at once and leaves them running (each
    leads its own session). Only from the main thread, and only over the default handler."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1 (0 or a negative count is a usage error, exit 2, not a traceback or a hang)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {value})")
    return value


def free_port() -> int:
    """A port that was free a moment ago (the launcher binds ``--port`` itself; a lost race shows as an exit
    before ``/health`` answers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def asyncdp_serve(model: str, *args: str, log: IO[bytes] | None = None, env: dict[str, str] | None = None,
                  timeout_s: float = 120.0) -> Iterator[tuple[str, int]]:
    """Yield ``(base_url, launcher pid)`` once ``/health`` answers 200; the output goes to ``log`` (else nowhere)."""
    exit_on_sigterm()
    port = free_port()
    cmd = [sys.executable, "-m", "asyncdp", "serve", model, "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT if log else
                            subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, cwd=ROOT,
                            start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{base_url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            try:  # the poll interval, ending early if the server died
                raise RuntimeError(f"asyncdp serve exited with {proc.wait(timeout=0.2)} before ready")
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"asyncdp serve was not ready in {timeout_s:g} s") from None
        yield base_url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
