"""The sealed store on the NCCL path, at the Store API level on CPU (no CUDA needed).

On CUDA the data group is NCCL, and ProcessGroupNCCL meets its peers through the same store: rank 0 ``set`` s the
128-byte ``ncclUniqueId`` of each communicator under the group's counter (``"0"``, ``"1"``, ...) or a
point-to-point pair's key (``"0:1"``), every other rank ``get`` s it (blocking until it is there), and its watchdog
passes failure signals between ranks with ``check``, ``set`` and ``get`` (and may delete them). Those calls come from C++, through the
group's ``PrefixStore``, into the Python ``SealedStore``. Here each rank is its own client of a real ``TCPStore``
(``host_rendezvous_store``), sealed as ``join_rendezvous_store`` seals it with a secret, and called through a
``dist.PrefixStore`` (C++), as ProcessGroupNCCL calls it; what a stranger reads there is opaque, and an id sealed
in another launch stops the rank that reads it with the one line naming the store.
"""

from __future__ import annotations

import datetime
import os
import threading
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from asyncdp.errors import StartupError
from asyncdp.messages import LAUNCH_NONCE_BYTES, DPGroupInfo
from asyncdp.model.rendezvous import (
    SealedStore,
    derive_keys,
    host_rendezvous_store,
    join_rendezvous_store,
    seal,
    store_key,
)

SECRET = os.urandom(32)
NCCL_UNIQUE_ID_BYTES = 128
TIMEOUT_S = 30.0
GROUP_PREFIX = "default_pg/nccl"  # the group's PrefixStore: NCCL's key "0" is stored as "default_pg/nccl/0"


def _unique_id() -> bytes:
    """An id as ``ncclGetUniqueId`` makes one: binary, NULs and high bytes included."""
    return b"\x00\xff" + os.urandom(NCCL_UNIQUE_ID_BYTES - 4) + b"\x00\x00"


@pytest.fixture
def group() -> Iterator[tuple[DPGroupInfo, int]]:
    _store, port = host_rendezvous_store("127.0.0.1", timeout_s=TIMEOUT_S)
    info = DPGroupInfo(master_addr="127.0.0.1", master_port=port, dp_size=2, backend="nccl",
                       launch_nonce=os.urandom(LAUNCH_NONCE_BYTES))
    yield info, port
    del _store


def _rank(info: DPGroupInfo, dp_rank: int) -> tuple[SealedStore, dist.PrefixStore]:
    """A rank's sealed client, and the C++ prefix store ProcessGroupNCCL would hold over it (keep both alive)."""
    sealed = join_rendezvous_store(info, SECRET, timeout_s=TIMEOUT_S,
                                   where=f"rank {dp_rank}: the DP group's rendezvous store at "
                                         f"{info.master_addr}:{info.master_port}")
    assert isinstance(sealed, SealedStore)
    return sealed, dist.PrefixStore(GROUP_PREFIX, sealed)


def _get_in_thread(store: dist.Store, key: str) -> tuple[threading.Thread, dict[str, object]]:
    """A peer rank's blocking ``get``, begun before the key is there."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = store.get(key)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_an_nccl_unique_id_reaches_the_other_rank_sealed(group: tuple[DPGroupInfo, int]) -> None:
    info, port = group
    (_s0, rank0), (_s1, rank1) = _rank(info, 0), _rank(info, 1)
    uid, p2p_uid = _unique_id(), _unique_id()
    waiting, got = _get_in_thread(rank1, "0")  # broadcastUniqueNCCLID on a rank other than 0
    rank0.set("0", uid)
    rank0.set("0:1", p2p_uid)  # a point-to-point pair's communicator
    waiting.join(TIMEOUT_S)
    assert got == {"value": uid}
    assert rank1.get("0:1") == p2p_uid
    assert rank1.multi_get(["0", "0:1"]) == [uid, p2p_uid]  # torch's fallback: one get per key, each unsealed
    rank0.multi_set(["1", "2"], [b"\x01" * NCCL_UNIQUE_ID_BYTES, b"\x02" * NCCL_UNIQUE_ID_BYTES])
    assert rank1.get("2") == b"\x02" * NCCL_UNIQUE_ID_BYTES
    rank1.wait(["0", "1"], datetime.timedelta(seconds=TIMEOUT_S))
    # What the store holds is opaque: no torch key name, no id.
    stranger = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    names = stranger.list_keys()
    assert len(names) == 4 and all(n.startswith("asyncdp/") and "nccl" not in n for n in names), names
    assert all(uid[2:-2] not in stranger.get(n) for n in names)


def test_the_watchdog_s_signals_pass_through_the_sealed_store(group: tuple[DPGroupInfo, int]) -> None:
    info, _ = group
    (_s0, rank0), (_s1, rank1) = _rank(info, 0), _rank(info, 1)
    signal = "remote_error"  # ProcessGroupNCCL's kStoreErrorSignalKey: the rank that saw the error sets it
    assert not rank0.check([signal])
    rank1.set(signal, (1).to_bytes(4, "little"))
    assert rank0.check([signal]) and rank0.get(signal) == (1).to_bytes(4, "little")
    assert rank0.add("counter", 1) == 1 and rank1.add("counter", 1) == 2
    # torch finds these two by their C++ names (deleteKey, getNumKeys) when it calls from C++, as here
    assert rank0.num_keys() == rank1.num_keys() == 2
    assert rank0.delete_key(signal) and not rank1.check([signal])


def test_an_nccl_id_sealed_in_another_launch_stops_the_rank_that_reads_it(group: tuple[DPGroupInfo, int]) -> None:
    info, port = group
    _sealed, rank1 = _rank(info, 1)
    earlier = DPGroupInfo(master_addr=info.master_addr, master_port=info.master_port, dp_size=info.dp_size,
                          backend=info.backend, launch_nonce=os.urandom(LAUNCH_NONCE_BYTES))
    old_keys = derive_keys(SECRET, earlier)
    name = store_key(derive_keys(SECRET, info), f"{GROUP_PREFIX}/0")  # where this launch's rank 1 reads the id
    stranger = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    stranger.set(name, seal(old_keys, name, _unique_id()))  # sealed with the secret, for another launch
    with pytest.raises(StartupError) as raised:
        rank1.get("0")
    assert str(raised.value) == (
        f"rank 1: the DP group's rendezvous store at 127.0.0.1:{port} holds a value that this deployment's secret "
        f"did not seal: a process without the secret wrote to it (anyone who can reach that port can); keep "
        f"--data-parallel-address on a network only the deployment's nodes reach")
