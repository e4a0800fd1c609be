"""A retried rendezvous lets go of each failed attempt's store client: its socket to the head's store is closed
before the next attempt, not kept until the group is up (nor by the error when every attempt fails)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from asyncdp.errors import StartupError
from asyncdp.messages import DPGroupInfo
from asyncdp.model import distributed
from asyncdp.model.rendezvous import host_rendezvous_store

ESTABLISHED = "01"


def connections_to(port: int) -> int:
    """Established TCP connections on this machine whose remote end is ``port`` (the store's clients)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == ESTABLISHED:
                count += 1
    return count


@pytest.fixture
def environ() -> Iterator[None]:
    saved = dict(os.environ)  # init_dp_group pins gloo's interface in the environment
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="counts sockets through /proc (Linux)")
def test_each_failed_attempts_store_is_closed_before_the_next(monkeypatch: pytest.MonkeyPatch,
                                                                environ: None) -> None:
    head, port = host_rendezvous_store("127.0.0.1", timeout_s=10.0)
    before = connections_to(port)  # (the head's store is a client of its own server too)
    open_at_attempt: list[int] = []

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        open_at_attempt.append(connections_to(port))
        if len(open_at_attempt) < 3:
            raise RuntimeError("The server socket has failed to listen on any local network address: "
                               "Address already in use")
        raise RuntimeError("connection refused")  # not retried: the third attempt is the last

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setattr(distributed, "retry_address_in_use",
                        partial(distributed.retry_address_in_use, sleep=lambda s: None))
    info = DPGroupInfo(master_addr="127.0.0.1", master_port=port, dp_size=2, backend="gloo",
                       launch_nonce=bytes(16))
    with pytest.raises(StartupError, match="connection refused"):
        distributed.init_dp_group(info, 0, timeout_s=10.0)
    assert open_at_attempt == [before + 1] * 3  # the attempt's own store client only: the failed ones' are closed
    assert connections_to(port) == before
    del head
