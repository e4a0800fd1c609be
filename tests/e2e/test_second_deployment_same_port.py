"""A second deployment on the port of one that is still starting fails at startup (E11), as on a busy port.

The API servers of a deployment share its port through ``SO_REUSEPORT``, which the kernel grants to any process of
the same user. The launcher checked for a busy port by listening on it alone, but while the first deployment was
still starting (its launcher had bound the port, no API server listened yet) a second ``asyncdp serve --port P``
passed that check, bound the port too, and served on it: the kernel then split the connections between the two
deployments without a word (20 of 40 ``/server_info`` requests answered by each, by hand). Now the launcher holds
the port's lock (:mod:`asyncdp.transport.port_lock`) for its lifetime and the second one exits 1 with "cannot
listen on 127.0.0.1:P: Address already in use".

The first deployment is held exactly in that window, not raced: a start gate (``port_gate/sitecustomize.py``)
stops its coordinator, the first child, before it runs, and the launcher starts its API servers only once the
coordinator listens. The test releases it after the second launch is over; the first one then serves the port
alone and stops cleanly.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e import conftest
from tests.e2e.conftest import BASE_ARGS, READY_TIMEOUT_S, Server, _in_tree, _launch, _wait_healthy

pytestmark = [pytest.mark.e2e]

GATE_DIR = Path(__file__).resolve().parent / "port_gate"
ARGS = (*BASE_ARGS, "-dp", "2", "--api-server-count", "2", "--dp-coordinator-startup-timeout-s", "120")


def _open_gate_writer(server: Server, gate: Path) -> int:
    """The write end of the gate, once the held child has opened it (an open for writing that does not block
    succeeds only when a reader is there). Fails the test if the launcher exits first or at the deadline."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            return os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
        try:  # poll interval, and an early exit if the launcher died
            code = server.process.wait(timeout=0.1)
            pytest.fail(f"the first launcher exited with {code} before its coordinator started\n{server.log()[-4000:]}")
        except subprocess.TimeoutExpired:
            pass
    pytest.fail(f"the first deployment's coordinator did not start within {READY_TIMEOUT_S} s\n{server.log()[-4000:]}")


def _wait_exit_or_serving(server: Server) -> int | None:
    """The launcher's exit code, or None once it reports that it serves (the deadline fails the test)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if " serving " in server.log():
            return None
        try:
            return server.process.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
    pytest.fail(f"the second launcher neither failed nor served within {READY_TIMEOUT_S} s\n{server.log()[-4000:]}")


def test_a_second_deployment_on_the_port_of_a_starting_one_fails_at_startup(tmp_path, monkeypatch):
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    writer = None
    first = second = None
    try:
        with monkeypatch.context() as env:
            env.setenv("ASYNCDP_TEST_GATE", str(gate))
            env.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(GATE_DIR), os.environ.get("PYTHONPATH")])))
            first = _launch(ARGS, tmp_path / "first.log")
        writer = _open_gate_writer(first, gate)
        # The window: the first launcher holds the port (bound before any child starts), nobody listens on it.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", first.port), timeout=5).close()

        with monkeypatch.context() as same_port:
            same_port.setattr(conftest, "free_port", lambda: first.port)
            second = _launch(ARGS, tmp_path / "second.log")
        code = _wait_exit_or_serving(second)
        assert code == 1, f"the second deployment serves the first one's port {first.port}\n{second.log()[-4000:]}"
        assert f"cannot listen on 127.0.0.1:{first.port}: Address already in use" in second.log()
        assert f"another asyncdp deployment, pid {first.process.pid}" in second.log()
        assert not second.remaining(), "the second launcher started children"

        os.close(writer)  # let the first deployment go on
        writer = None
        assert _wait_healthy(first, READY_TIMEOUT_S), f"the first deployment failed\n{first.log()[-4000:]}"
        with httpx.Client(timeout=5) as http:  # a fresh connection each: the kernel picks a listener per connection
            for _ in range(8):
                pid = http.get(f"{first.base_url}/server_info", headers={"Connection": "close"}).json()[
                    "api_process_pid"]
                assert _in_tree(pid, first.process.pid)
        first.stop()
    finally:
        if writer is not None:
            os.close(writer)
        for server in (first, second):
            if server is not None and (server.process.poll() is None or server.remaining()):
                server.kill_all()
