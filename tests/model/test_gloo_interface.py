"""gloo's pair sockets listen on the interface that faces the DP address (``asyncdp.model.gloo_interface``), not
wherever the machine's hostname resolves.

The pure parts run everywhere; the process test needs root and ``unshare``: each rank runs in its own UTS and
mount namespace whose hostname resolves to 127.0.0.2 (a hosts file bound over ``/etc/hosts`` there only), the
situation of a host whose name resolves to another address than ``-dpa`` (its LAN address, Debian's 127.0.1.1).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from asyncdp.model.distributed import host_rendezvous_store
from asyncdp.model.gloo_interface import (
    GLOO_SOCKET_IFNAME,
    gloo_environment,
    gloo_interface,
    interface_address,
    local_address_towards,
)
from tests.model.rendezvous_ranks import Ranks


def _loopback_interface() -> str:
    names = [name for _, name in socket.if_nameindex() if interface_address(name) == "127.0.0.1"]
    if not names:
        pytest.skip("no interface holds 127.0.0.1 here")
    return names[0]


def test_the_interface_facing_a_loopback_store_is_the_loopback_one() -> None:
    lo = _loopback_interface()
    assert local_address_towards("127.0.0.1", 29500) == "127.0.0.1"
    assert gloo_interface("127.0.0.1", 29500) == lo
    assert gloo_environment("127.0.0.1", 29500, {}) == {GLOO_SOCKET_IFNAME: lo}


def test_an_operators_gloo_socket_ifname_wins() -> None:
    assert gloo_environment("127.0.0.1", 29500, {GLOO_SOCKET_IFNAME: "eth7"}) == {}


def test_an_ipv6_dp_address_or_an_unknown_interface_changes_nothing() -> None:
    assert local_address_towards("::1", 29500) is None
    assert gloo_interface("::1", 29500) is None
    assert gloo_environment("::1", 29500, {}) == {}
    assert interface_address("no-such-if0") is None


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--uts", "--mount", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare (a UTS and mount namespace per rank)")
def test_gloo_listens_on_the_dp_address_even_where_the_hostname_resolves_elsewhere(tmp_path: Path) -> None:
    _loopback_interface()
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n127.0.0.2 rank-host\n")
    wrapper = ("unshare", "--uts", "--mount", "sh", "-c",
               'mount --bind "$0" /etc/hosts && hostname rank-host && exec "$@"', str(hosts))
    _, port = host_rendezvous_store("127.0.0.1", timeout_s=60.0)
    ranks = Ranks(port, 2, os.urandom(32), wrapper=wrapper)
    try:
        ranks.start()
        ranks.join(0)
        ranks.join(1)
        results = [ranks.result(0), ranks.result(1)]
    finally:
        ranks.kill()
    assert [r.get("sum") for r in results] == [3, 3], results
    for result in results:
        listening = result["listening"]
        assert isinstance(listening, list) and listening, result
        # before: 127.0.0.2, the hostname's address, in every rank
        assert {addr.rsplit(":", 1)[0] for addr in listening} == {"127.0.0.1"}, result
