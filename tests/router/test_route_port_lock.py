"""``asyncdp route`` holds its port's lock (:mod:`asyncdp.transport.port_lock`) for its lifetime, as ``asyncdp
serve`` and the supervisor do: one asyncdp process per port number on a machine.

The router's socket has no ``SO_REUSEPORT``, so the kernel already refuses a second router or an ``asyncdp serve``
on a port it listens on (with a bare "Address already in use"). What the kernel lets through is the other way
round: a deployment still starting has bound its port without listening on it yet (the launcher of several API
processes, or a supervisor until its children are ready), and a router started then bound and listened on that
port, so the deployment's API processes failed to listen there later. Now the router takes the lock first: it exits
1 with the one line of a busy port, naming the holder's pid, and a deployment started on the router's port is told
the router's pid. Real processes, on ports the kernel gave.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncdp.transport.http_socket import reserve_shared_port
from asyncdp.transport.port_lock import hold_port
from tests.e2e.conftest import ROOT
from tests.router.route_process import route
from tests.router.test_process import dead_endpoint

BOUND_S = 30.0
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}


def held(port: int, pid: int) -> str:
    return f"port {port}: Address already in use (held by another asyncdp deployment, pid {pid})"


def refused_router(log_path: Path, port: int) -> str:
    """Run ``asyncdp route`` on 127.0.0.1 and ``port``; its log once it exited 1. A router that listens instead
    (it logged its address) is stopped and fails the test."""
    cmd = [sys.executable, "-m", "asyncdp", "route", "--endpoint", dead_endpoint(), "--host", "127.0.0.1",
           "--port", str(port)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                                env=ENV)
    try:
        deadline = time.monotonic() + BOUND_S
        while proc.poll() is None and "routing on" not in log_path.read_text():
            if time.monotonic() > deadline:
                pytest.fail(f"the router neither exited nor listened within {BOUND_S} s\n{log_path.read_text()}")
            try:  # another process: poll its exit, 0.1 s at a time
                proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
    text = log_path.read_text()
    assert proc.returncode == 1, f"the router started on a held port (exit {proc.returncode})\n{text}"
    return text


def test_a_second_router_on_the_port_of_a_running_one_exits_1_naming_it(tmp_path: Path) -> None:
    with route(tmp_path / "first.log", dead_endpoint()) as first:  # port 0: the lock is on the port it got
        text = refused_router(tmp_path / "second.log", first.port)
        lines = text.splitlines()
        assert len(lines) == 1 and f"cannot listen on 127.0.0.1 {held(first.port, first.process.pid)}" in lines[0]
        assert first.process.poll() is None  # the first one goes on
        assert first.stop() == 0
    hold_port(first.port).close()  # let go once it exited


def test_a_router_on_the_port_of_a_deployment_still_starting_exits_1(tmp_path: Path) -> None:
    """The port as ``asyncdp serve --api-server-count 2`` holds it while its API processes start: bound with
    ``SO_REUSEPORT``, not listening, and locked (tests' own process here)."""
    with reserve_shared_port("127.0.0.1", 0) as reserved:
        port = reserved.getsockname()[1]
        with hold_port(port):
            text = refused_router(tmp_path / "router.log", port)
    lines = text.splitlines()
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1 {held(port, os.getpid())}" in lines[0], text


def test_a_deployment_on_the_routers_port_exits_1_naming_the_router(tmp_path: Path) -> None:
    with route(tmp_path / "router.log", dead_endpoint()) as router:
        done = subprocess.run([sys.executable, "-m", "asyncdp", "serve", "builtin:tiny-dense", "--host", "127.0.0.1",
                               "--port", str(router.port)], capture_output=True, text=True, timeout=BOUND_S,
                              cwd=ROOT, env=ENV, stdin=subprocess.DEVNULL)
        assert done.returncode == 1, done.stderr
        assert f"cannot listen on 127.0.0.1:{router.port}: Address already in use (held by another asyncdp " \
               f"deployment, pid {router.process.pid})" in done.stderr, done.stderr
        assert router.stop() == 0
