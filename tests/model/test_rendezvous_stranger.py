"""A stranger at the MoE group's rendezvous store, with real rank processes (``rendezvous_rank.py``) joining a
gloo group through ``init_dp_group`` at a store the test hosts with ``host_rendezvous_store``.

The store's server answers anyone who reaches its port: the stranger here is a plain ``TCPStore`` client that
lists the keys, reads the values, and plants a forged rank address where gloo reads it. Without the deployment
secret it steers rank 1 to a socket of its own; with the secret the ranks' keys are opaque and their values
sealed, so it can neither read an address nor plant one, and a value it altered stops the rank that reads it
with a clear error.
"""

from __future__ import annotations

import secrets
import socket
import struct
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from asyncdp.model.distributed import host_rendezvous_store
from tests.model.rendezvous_ranks import DEADLINE_S, Ranks, first_key, stranger_store

LOOPBACK = socket.inet_aton("127.0.0.1")
GLOO_RANK0_KEY = "0//cpu//0/0"  # where torch's default gloo group keeps rank 0's pair address


@pytest.fixture
def store() -> Iterator[tuple[dist.TCPStore, int]]:
    yield host_rendezvous_store("127.0.0.1", timeout_s=DEADLINE_S)


def _sockaddr_port(value: bytes) -> int | None:
    """The port of the first IPv4 loopback ``sockaddr_in`` in ``value`` (AF_INET, port, address), if any."""
    at = value.find(LOOPBACK)
    if at >= 4 and value[at - 4:at - 2] == struct.pack("<H", socket.AF_INET):
        return int(struct.unpack(">H", value[at - 2:at])[0])
    return None


def _trap_below(port: int) -> socket.socket:
    """A listening socket on a port below ``port``: gloo's side with the higher address connects to the other."""
    for _ in range(200):
        sock = socket.create_server(("127.0.0.1", 0))
        if sock.getsockname()[1] < port:
            return sock
        sock.close()
    for candidate in range(port - 1, 1024, -1):
        try:
            return socket.create_server(("127.0.0.1", candidate))
        except OSError:
            continue
    pytest.skip(f"no free port below {port} for the stranger's socket")


def test_a_stranger_at_the_store_neither_reads_nor_plants_a_rank_address(store: tuple[dist.TCPStore, int]) -> None:
    _, port = store
    stranger = stranger_store(port)
    ranks = Ranks(port, 2, secrets.token_bytes(32))
    trap = socket.create_server(("127.0.0.1", 0))
    try:
        ranks.start()
        ranks.join(1)
        seen = first_key(stranger)
        value = stranger.get(seen)
        rank1_port = _sockaddr_port(value)
        forged = value
        if rank1_port is not None:  # rank 1's address, readable: plant a copy that points at the stranger instead
            trap.close()
            trap = _trap_below(rank1_port)
            forged = value.replace(struct.pack(">H", rank1_port) + LOOPBACK,
                                   struct.pack(">H", trap.getsockname()[1]) + LOOPBACK, 1)
        planted = {GLOO_RANK0_KEY, seen.rsplit("/", 1)[0] + "/0"}  # rank 0's name, as torch and as the seen one
        for name in planted:
            stranger.set(name, forged)
        ranks.join(0)
        results = [ranks.result(0), ranks.result(1)]
        trap.setblocking(False)
        try:
            conn, peer = trap.accept()
            conn.close()
            pytest.fail(f"a rank connected to the stranger's socket (from {peer}) instead of its peer")
        except BlockingIOError:
            pass
        assert [result.get("sum") for result in results] == [3, 3], results
        # What the ranks left in the store says nothing: no torch key name, no address in any value.
        assert rank1_port is None
        written = set(stranger.list_keys()) - planted
        assert len(written) >= 4  # two ranks' addresses, in the default group and in the control group
        for name in written:
            assert name.startswith("asyncdp/") and "cpu" not in name
            assert _sockaddr_port(stranger.get(name)) is None
    finally:
        trap.close()
        ranks.kill()


def test_a_value_the_stranger_altered_stops_the_rank_that_reads_it(store: tuple[dist.TCPStore, int]) -> None:
    _, port = store
    stranger = stranger_store(port)
    ranks = Ranks(port, 2, secrets.token_bytes(32))
    try:
        ranks.start()
        ranks.join(1)
        seen = first_key(stranger)
        value = stranger.get(seen)
        stranger.set(seen, value[:-1] + bytes([value[-1] ^ 1]))
        ranks.join(0)
        result = ranks.result(0)
        assert result == {"error": f"StartupError: rank 0: the DP group's rendezvous store at 127.0.0.1:{port} "
                                   f"holds a value that this deployment's secret did not seal: a process without the "
                                   f"secret wrote to it (anyone who can reach that port can); keep "
                                   f"--data-parallel-address on a network only the deployment's nodes reach"}
    finally:
        ranks.kill()
