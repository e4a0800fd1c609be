"""The supervisor holds its port from its start while the port stays closed to clients (spec §11.3 step 3).

The e2e supervisor test failed now and then on a loaded machine: its readiness poll got a 404 from the supervisor
port before the node was ready. The supervisor only checked its port at start and bound it once every child was
ready, tens of seconds later; meanwhile another test's server was given that port (a port-0 bind hands out a free
port, and this one was free) and answered. It could as well have kept it, and the supervisor would then have
failed at the very moment its node became ready. Now the port is bound (not listening) from the check on: a
connection is refused as before, and no other socket is given it or can bind it.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys

import pytest

from asyncdp.errors import StartupError
from asyncdp.supervisor.health_server import reserve_port, start_listening
from tests.supervisor.fleet import ROOT, ChildSpec, start_fleet


def _bind_error(port: int) -> int | None:
    """The errno of another program's bind of 127.0.0.1:``port`` (a plain socket, as a port-0 bind or a client
    makes), None if it could bind it."""
    with socket.socket() as other:
        try:
            other.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.errno
    return None


def test_a_reserved_port_refuses_connections_and_no_other_socket_gets_it_until_it_listens():
    sock = reserve_port("127.0.0.1", 0, what="the supervisor port")
    try:
        port = sock.getsockname()[1]
        with socket.socket() as client, pytest.raises(ConnectionRefusedError):
            client.connect(("127.0.0.1", port))
        assert _bind_error(port) == errno.EADDRINUSE
        start_listening(sock, what="the supervisor port")
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        sock.close()


def test_a_port_another_program_listens_on_cannot_be_reserved():
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(StartupError, match=f"cannot listen on the supervisor port 127.0.0.1:{port}: "):
            reserve_port("127.0.0.1", port, what="the supervisor port")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="port-0 binds are checked in a network namespace")
def test_a_port_0_bind_is_never_given_a_reserved_port(tmp_path):
    """In a private network namespace whose ephemeral range is two ports, the reserved one is never handed out."""
    script = tmp_path / "ns.py"
    script.write_text(
        "import socket, subprocess\n"
        "from asyncdp.supervisor.health_server import reserve_port\n"
        "subprocess.run(['ip', 'link', 'set', 'lo', 'up'], check=True)\n"
        "open('/proc/sys/net/ipv4/ip_local_port_range', 'w').write('40000 40001\\n')\n"
        "held = reserve_port('127.0.0.1', 40001, what='x')\n"
        "got = set()\n"
        "for _ in range(50):\n"
        "    s = socket.socket(); s.bind(('127.0.0.1', 0)); got.add(s.getsockname()[1]); s.close()\n"
        "print(sorted(got))\n")
    try:
        done = subprocess.run(["unshare", "-n", sys.executable, str(script)], capture_output=True, text=True,
                              timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    except FileNotFoundError:
        pytest.skip("no unshare command")
    if done.returncode != 0:
        pytest.skip(f"no private network namespace here: {done.stderr.strip()[-200:]}")
    assert done.stdout.strip() == "[40000]", done.stdout + done.stderr


def test_while_the_children_start_the_supervisor_port_is_refused_yet_nobody_else_can_bind_it(make_fleet):
    fleet = start_fleet(make_fleet([ChildSpec("a", status=503), ChildSpec("b", status=503)]))
    fleet.wait_probed("b", 1)
    assert fleet.get() is None  # closed: connection refused, not 503
    assert _bind_error(fleet.supervisor_port) == errno.EADDRINUSE  # ... and held
    fleet.set_health("a", 200)
    fleet.set_health("b", 200)
    fleet.wait_for("supervisor /health 200", lambda: fleet.get() == 200, 15.0)
