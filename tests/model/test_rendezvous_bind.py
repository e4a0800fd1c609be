"""The MoE group's rendezvous store listens on the DP address only (spec §5.5): torch's TCPStore server binds
every interface whatever host it is given, so a head started with ``-dpa 127.0.0.1`` offered its store (which
anyone may write keys into) to the whole network for the deployment's life."""

from __future__ import annotations

import socket

import pytest
import torch.distributed as dist

from asyncdp.model.distributed import host_rendezvous_store


def test_the_rendezvous_store_listens_on_the_dp_address_only() -> None:
    store, port = host_rendezvous_store("127.0.0.1", timeout_s=10.0)
    client = dist.TCPStore("127.0.0.1", port, is_master=False)
    client.set("k", "v")
    assert store.get("k") == b"v"
    # 127.0.0.2 is this host's loopback too: a store bound to every interface answers there
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=5).close()
