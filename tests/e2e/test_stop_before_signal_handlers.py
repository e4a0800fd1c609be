"""A stop signal inside a server's running event loop, before the server's own signal handling is in place: the
server stops in order (its "received SIG..." line, exit 0), without a traceback, and leaves no process behind.

Before, SIGTERM kept raising there (``_StoppedEarly``, from :mod:`asyncdp.__main__`) and SIGINT went to asyncio's
own handling. On asyncio a stop that landed in a callback of the loop's own was logged as ``Exception in callback
... _StoppedEarly`` with its traceback and lost: ``asyncdp serve``, ``asyncdp route`` and the multi-port supervisor
went on starting, and served. Now :func:`asyncdp.runtime.run` holds both signals from the loop's first instant
until the server's receiver takes them (:func:`asyncdp.runtime.take_early_stops`).

The process is held by a gate (``tests/e2e/signal_gate``) in a callback of its first event loop's own, right after
the main task's first step, so the signal comes, for certain, in that window: no race, no sleep for ordering."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import BASE_ARGS, descendants, free_port, free_port_pair

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent.parent
GATE = ROOT / "tests" / "e2e" / "signal_gate"
LOCAL = ("--host", "127.0.0.1")
SERVE = ("serve", "builtin:tiny-dense", "-dp", "2", *LOCAL, "--port", "0", *BASE_ARGS)
ROUTE = ("route", "--endpoint", "http://127.0.0.1:9", *LOCAL, "--port", "0")
STOP_DEADLINE_S = 30.0  # a stop with nothing started yet takes well under a second


def supervisor() -> tuple[str, ...]:
    """A multi-port supervisor of two ranks (its ports picked free, not the default ones)."""
    return ("serve", "builtin:tiny-moe", "-dp", "2", "-dpl", "2", "--data-parallel-multi-port-external-lb", *LOCAL,
            "--port", str(free_port_pair()), "--data-parallel-supervisor-port", str(free_port()),
            "-dpa", "127.0.0.1", "-dpp", str(free_port()), *BASE_ARGS)


@pytest.mark.parametrize(("argv", "sig", "received"), [
    (SERVE, signal.SIGTERM, "received SIGTERM: shutting down"),
    (SERVE, signal.SIGINT, "received SIGINT: shutting down"),
    (ROUTE, signal.SIGTERM, "received SIGTERM: draining"),
    (ROUTE, signal.SIGINT, "received SIGINT: draining"),
    (None, signal.SIGTERM, "received SIGTERM: stopping every child"),
], ids=["serve-SIGTERM", "serve-SIGINT", "route-SIGTERM", "route-SIGINT", "supervisor-SIGTERM"])
def test_a_stop_in_the_event_loop_before_the_servers_handlers_stops_it_in_order(
        argv: tuple[str, ...] | None, sig: signal.Signals, received: str, tmp_path: Path) -> None:
    gate = tmp_path / "held"
    env = {**os.environ, "ASYNCDP_TEST_SIGNAL_GATE": str(gate), "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(GATE), str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "asyncdp", *(argv or supervisor())], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    seen: dict[int, int] = {}  # every process of its tree, ever (pid -> start time): none may outlive it
    try:
        deadline = time.monotonic() + 120
        while not gate.exists():
            assert proc.poll() is None, proc.communicate()[0].decode()
            assert time.monotonic() < deadline, "the command never reached its event loop"
            time.sleep(0.01)
        proc.send_signal(sig)
        (tmp_path / "held.release").touch()
    finally:
        out = ended(proc, seen, STOP_DEADLINE_S)
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    assert received in out, out
    assert "routing on" not in out and "serving builtin" not in out, out  # it never said it serves
    assert not _alive(seen), out


def ended(proc: subprocess.Popen[bytes], seen: dict[int, int], deadline_s: float) -> str:
    """``proc``'s output once it ended by itself within ``deadline_s`` (or was killed, with every process of its
    tree, then), adding each process of its tree meanwhile to ``seen`` (pid -> start time)."""
    deadline = time.monotonic() + deadline_s
    while proc.poll() is None and time.monotonic() < deadline:
        seen.update(descendants(proc.pid))
        time.sleep(0.02)
    seen.update(descendants(proc.pid))
    if proc.poll() is None:
        for pid in seen:
            _kill(pid)
        proc.kill()
    return proc.communicate(timeout=30)[0].decode()


def _alive(processes: dict[int, int]) -> list[int]:
    """Those of ``processes`` (pid -> start time) still running (the same process, not a reused pid)."""
    alive = []
    for pid, started in processes.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[19]) == started:
            alive.append(pid)
    return alive


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
