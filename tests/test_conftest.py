"""The suite's own harness: a SIGTERM to pytest tears the fixtures down (tests/conftest.py), so the processes they
started in their own sessions (the e2e deployments) do not outlive it. A real pytest, a real signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

INNER = '''
import subprocess, sys, pytest

@pytest.fixture(scope="module")
def deployment():
    p = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield p
    p.kill()
    p.wait()

def test_runs_until_terminated(deployment):
    print(f"READY {deployment.pid}", flush=True)
    sys.stdin.read()  # until the outer test signals pytest
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_sigterm_to_pytest_runs_the_fixtures_teardowns(tmp_path: Path) -> None:
    inner = tmp_path / "test_inner.py"
    inner.write_text(INNER)
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "tests.conftest", str(inner)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    child = None
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # the fixture's process is up once the test says so
            lines.append(line)
            if line.startswith("READY "):
                child = int(line.split()[1])
                break
        assert child is not None, "".join(lines)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        out = proc.stdout.read()
        assert code == 2, out  # pytest's "interrupted"
        assert "received SIGTERM" in out, out
        assert not _alive(child), "the fixture's process outlived pytest"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
