"""A stop signal while an ``asyncdp`` command still imports (about a second, before it has signal handling of its
own): a server (``serve``, ``route``) exits 0 as a stopped server does, another command 128 + the signal, each
with one line and no traceback. Before, Ctrl-C printed a ``KeyboardInterrupt`` traceback (or an ``ImportError``
when it landed inside a C extension's import) and SIGTERM killed the process (-15).

The command's import of ``asyncdp.cli`` is held by a gate (``tests/e2e/import_gate``) that says when it began, so the
signal comes, for certain, while the command imports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GATE = ROOT / "tests" / "e2e" / "import_gate"


@pytest.mark.parametrize(("argv", "sig", "code"), [
    (["serve", "builtin:tiny-dense", "-dp", "2", "--port", "0"], signal.SIGINT, 0),
    (["serve", "builtin:tiny-dense", "-dp", "2", "--port", "0"], signal.SIGTERM, 0),
    (["route", "--endpoint", "http://127.0.0.1:9", "--port", "0"], signal.SIGINT, 0),
    (["bench", "routing", "--workload", "w1", "--scale", "quick"], signal.SIGINT, 130),
    (["bench", "routing", "--workload", "w1", "--scale", "quick"], signal.SIGTERM, 143),
])
def test_a_stop_while_the_command_imports_ends_it_without_a_traceback(
        argv: list[str], sig: signal.Signals, code: int, tmp_path: Path) -> None:
    gate = tmp_path / "importing"
    env = {**os.environ, "ASYNCDP_TEST_IMPORT_GATE": str(gate), "TMPDIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(GATE), str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "asyncdp", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not gate.exists():
            assert proc.poll() is None, proc.communicate()[0].decode()
            assert time.monotonic() < deadline, "the command never reached the import of asyncdp.cli"
            time.sleep(0.01)
        proc.send_signal(sig)
        out = proc.communicate(timeout=30)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, out
    assert "Traceback" not in out, out
    assert f"asyncdp: stopped by {sig.name} while starting" in out, out
