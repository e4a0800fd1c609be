"""SIGTERM to a multi-port supervisor while its children's interpreters still start, before they have any signal
handling of their own: each child ends as a server stopped while it starts does (``asyncdp: stopped by SIGTERM
while starting``, exit 0), and so the supervisor exits 0, its stop orderly, with no process left.

Before, the signal it forwarded killed them at once (SIGTERM's default action: ``exited with signal SIGTERM``) and
the supervisor exited 1, its stop counted as not orderly. Now the supervisor starts them with SIGTERM and SIGINT
blocked, and ``asyncdp.__main__`` unblocks both once its own handling is in place.

The children are held at the start of their interpreters by a gate (``tests/e2e/start_gate``) until the signal
reached them: no race, no sleep for ordering."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import BASE_ARGS, descendants, free_port, free_port_pair
from tests.e2e.test_stop_before_signal_handlers import _alive, ended

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent.parent
GATE = ROOT / "tests" / "e2e" / "start_gate"


def _signal_came(pid: int, sig: signal.Signals) -> bool:
    """Whether ``pid`` has ended, or has ``sig`` pending (blocked, waiting for its handling)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    if fields.get("State", "").startswith("Z"):
        return True
    pending = int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)
    return bool(pending & (1 << (sig - 1)))


def test_sigterm_while_the_supervisors_children_start_stops_them_in_order_with_exit_0(tmp_path: Path) -> None:
    held = tmp_path / "held"
    held.mkdir()
    env = {**os.environ, "ASYNCDP_TEST_START_GATE": str(held), "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(GATE), str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("ASYNCDP_TEST_START_GATE_DEPTH", None)
    argv = ["serve", "builtin:tiny-moe", "-dp", "2", "-dpl", "2", "--data-parallel-multi-port-external-lb",
            "--host", "127.0.0.1", "--port", str(free_port_pair()), "--data-parallel-supervisor-port", str(free_port()),
            "-dpa", "127.0.0.1", "-dpp", str(free_port()), *BASE_ARGS]
    proc = subprocess.Popen([sys.executable, "-m", "asyncdp", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    seen: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 120
        while len(children := [int(p.name) for p in held.iterdir() if p.name.isdigit()]) < 2:
            assert proc.poll() is None, proc.communicate()[0].decode()
            assert time.monotonic() < deadline, "the supervisor's children never started"
            time.sleep(0.01)
        seen.update(descendants(proc.pid))
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while not all(_signal_came(pid, signal.SIGTERM) for pid in children):
            assert time.monotonic() < deadline, "the supervisor never passed the signal on"
            time.sleep(0.01)
    finally:
        (held / "release").touch()
        out = ended(proc, seen, 60)
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    assert out.count("asyncdp: stopped by SIGTERM while starting") == 2, out
    assert not _alive(seen), out
