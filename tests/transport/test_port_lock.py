"""The per-port lock of a deployment (:mod:`asyncdp.transport.port_lock`): one holder at a time, the holder's pid
in the refusal, and gone with its process however it ends (a killed deployment never blocks the next one)."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from asyncdp.errors import StartupError
from asyncdp.transport.http_socket import lock_http_port
from asyncdp.transport.port_lock import hold_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix socket names")

ROOT = Path(__file__).resolve().parents[2]
HOLD = ("import sys\nfrom asyncdp.transport.port_lock import hold_port\n"
        "lock = hold_port(int(sys.argv[1]))\nprint('held', flush=True)\nsys.stdin.read()\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_held_port_is_refused_naming_the_holder_and_free_again_once_closed():
    port = free_port()
    lock = hold_port(port)
    try:
        with pytest.raises(OSError) as refused:
            hold_port(port)
        assert refused.value.errno == errno.EADDRINUSE
        held_by = f"held by another asyncdp deployment, pid {os.getpid()}"
        assert refused.value.strerror == f"Address already in use ({held_by})"
        with pytest.raises(StartupError, match=f"^cannot listen on 127.0.0.1:{port}: Address already in use"):
            lock_http_port("127.0.0.1", port)
        assert not lock.get_inheritable()  # children of the launcher do not keep it
    finally:
        lock.close()
    hold_port(port).close()


def test_the_lock_of_a_killed_process_is_gone_with_it():
    port = free_port()
    with subprocess.Popen([sys.executable, "-c", HOLD, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            with pytest.raises(OSError, match=f"pid {holder.pid}\\)"):
                hold_port(port)
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=10)
            hold_port(port).close()
        finally:
            if holder.poll() is None:
                holder.kill()
