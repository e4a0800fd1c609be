"""A stranger replays, into a later launch of the same deployment, a sealed value it recorded from an earlier one.

Both launches hold one secret and host their rendezvous store at the same address and port (a restart whose port
came back: the kernel hands out freed ports again). Real rank processes (``rendezvous_rank.py``) join a gloo
group through ``init_dp_group``; each :class:`Ranks` is one launch, with the per-launch nonce its head would draw.
The stranger is a plain ``TCPStore`` client: in the first launch it records rank 1's sealed address; in the
second it writes that record over what rank 1 wrote, before rank 0 reads it. Sealed under the deployment's keys
alone, the record opened in the second launch, and rank 0 took launch 1's dead rank 1 for its peer; bound to its
launch, it stops rank 0 with the one line naming the store, as a value the secret did not seal does.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import secrets
import socket
from collections.abc import Iterator

import torch.distributed as dist

from asyncdp.model.distributed import host_rendezvous_store
from tests.model.rendezvous_ranks import DEADLINE_S, Ranks, first_key, stranger_store


def _store_at(port: int) -> dist.TCPStore:
    """The second launch's store, at the first one's address and port (that store is gone)."""
    sock = socket.create_server(("127.0.0.1", port))  # SO_REUSEADDR: the first store's connections may linger
    store = dist.TCPStore("127.0.0.1", port, world_size=None, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=DEADLINE_S), master_listen_fd=sock.fileno())
    sock.detach()
    return store


@contextlib.contextmanager
def _traps(addresses: list[str]) -> Iterator[list[socket.socket]]:
    """Listening sockets on the ports a launch-1 rank listened on: the second launch's ranks cannot take them,
    and a rank that connects to one took launch 1's address for its peer's."""
    traps = []
    for address in addresses:
        try:
            traps.append(socket.create_server(("127.0.0.1", int(address.rsplit(":", 1)[1]))))
        except OSError:
            continue
    try:
        yield traps
    finally:
        for trap in traps:
            trap.close()


def _connected(traps: list[socket.socket]) -> list[object]:
    peers = []
    for trap in traps:
        trap.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            conn, peer = trap.accept()
            conn.close()
            peers.append(peer)
    return peers


def test_a_value_recorded_in_an_earlier_launch_stops_the_rank_it_is_replayed_to() -> None:
    secret = secrets.token_bytes(32)
    first_store, port = host_rendezvous_store("127.0.0.1", timeout_s=DEADLINE_S)
    stranger = stranger_store(port)
    first = Ranks(port, 2, secret)
    try:
        first.start()
        first.join(1)
        first_name = first_key(stranger)  # rank 1's address in the default group: rank 0 has not joined
        recorded = stranger.get(first_name)
        first.join(0)
        results = [first.result(0), first.result(1)]
        assert [result.get("sum") for result in results] == [3, 3], results
    finally:
        first.kill()
    rank1_listened = results[1]["listening"]
    assert isinstance(rank1_listened, list) and rank1_listened
    del stranger, first_store  # the first launch's store stops
    gc.collect()

    second_store = _store_at(port)
    stranger = stranger_store(port)
    second = Ranks(port, 2, secret)
    with _traps(rank1_listened) as traps:
        try:
            second.start()
            second.join(1)
            name = first_key(stranger)  # where rank 1 of this launch wrote its address, for rank 0 to read
            stranger.set(name, recorded)
            second.join(0)
            result = second.result(0)
            assert not _connected(traps), f"rank 0 took launch 1's rank 1 address, replayed into launch 2: {result}"
            assert result == {"error": f"StartupError: rank 0: the DP group's rendezvous store at 127.0.0.1:{port} "
                                       f"holds a value that this deployment's secret did not seal: a process "
                                       f"without the secret wrote to it (anyone who can reach that port can); keep "
                                       f"--data-parallel-address on a network only the deployment's nodes reach"}
            assert name != first_name  # every launch has names of its own
        finally:
            second.kill()
            del second_store

