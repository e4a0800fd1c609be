"""The sealed rendezvous store's pure parts (key derivation, names, seal/unseal) and its mapping onto a store,
over torch's in-process ``HashStore`` (no sockets)."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

import asyncdp.messages as m
from asyncdp.errors import StartupError
from asyncdp.messages import DPGroupInfo
from asyncdp.model.rendezvous import (
    MAGIC,
    NONCE_BYTES,
    TAG_BYTES,
    SealedStore,
    derive_keys,
    join_rendezvous_store,
    seal,
    store_key,
    unseal,
)

SECRET = bytes(range(32))
LAUNCH_NONCE = bytes(range(100, 116))
INFO = DPGroupInfo(master_addr="10.0.0.1", master_port=41234, dp_size=4, backend="gloo", launch_nonce=LAUNCH_NONCE)
KEYS = derive_keys(SECRET, INFO)
NAME = store_key(KEYS, "0//cpu//0/1")


def test_every_rank_derives_the_same_keys_from_the_group_info_it_was_sent() -> None:
    # A headless node's engine gets DPGroupInfo inside HandshakeInit over its link; the head's engines too.
    init = m.HandshakeInit(clients=[], coordinator=None, dp_group=INFO, client_count=1)
    received = m.decode(m.encode(init))
    assert isinstance(received, m.HandshakeInit) and received.dp_group is not None
    assert derive_keys(SECRET, received.dp_group) == KEYS
    assert store_key(derive_keys(SECRET, received.dp_group), "0//cpu//0/1") == NAME


@pytest.mark.parametrize("other", [
    {"master_addr": "10.0.0.2"}, {"master_port": 41235}, {"dp_size": 2}, {"backend": "nccl"},
    {"launch_nonce": LAUNCH_NONCE[:-1] + b"\x00"}])  # the same deployment's store, launched again
def test_another_group_has_other_keys(other: dict[str, object]) -> None:
    fields = {"master_addr": INFO.master_addr, "master_port": INFO.master_port, "dp_size": INFO.dp_size,
              "backend": INFO.backend, "launch_nonce": INFO.launch_nonce, **other}
    keys = derive_keys(SECRET, DPGroupInfo(**fields))  # type: ignore[arg-type]
    assert keys != KEYS
    assert store_key(keys, "0//cpu//0/1") != NAME
    assert unseal(keys, NAME, seal(KEYS, NAME, b"addr")) is None


def test_another_secret_has_other_keys_and_none_without_one() -> None:
    keys = derive_keys(SECRET[:-1] + b"\x00", INFO)
    assert len({keys.name, keys.encrypt, keys.authenticate, KEYS.name, KEYS.encrypt, KEYS.authenticate}) == 6
    assert unseal(keys, NAME, seal(KEYS, NAME, b"addr")) is None
    with pytest.raises(ValueError, match="non-empty"):
        derive_keys(b"", INFO)
    for nonce in (b"", LAUNCH_NONCE[:-1]):  # a group without its launch's nonce has no keys
        with pytest.raises(ValueError, match="16-byte nonce"):
            derive_keys(SECRET, DPGroupInfo(master_addr="10.0.0.1", master_port=41234, dp_size=4, backend="gloo",
                                            launch_nonce=nonce))
    assert "10.0.0.1" not in repr(KEYS) and str(KEYS.name) not in repr(KEYS)


def test_names_are_opaque_and_distinct() -> None:
    names = {store_key(KEYS, f"0//cpu//0/{rank}") for rank in range(4)} | {store_key(KEYS, "0//1//cpu//0/0")}
    assert len(names) == 5
    for name in names:
        assert name.startswith("asyncdp/") and len(name) == len("asyncdp/") + 32
        assert set(name[len("asyncdp/"):]) <= set("0123456789abcdef")


@given(st.binary(max_size=600))
def test_a_sealed_value_opens_under_its_name_only(value: bytes) -> None:
    blob = seal(KEYS, NAME, value)
    assert unseal(KEYS, NAME, blob) == value
    assert len(blob) == len(MAGIC) + NONCE_BYTES + TAG_BYTES + len(value)
    assert unseal(KEYS, store_key(KEYS, "0//cpu//0/0"), blob) is None  # moved to another key


def test_a_value_is_encrypted_under_a_fresh_nonce() -> None:
    value = b"\x02\x00\xa8\x6f\x7f\x00\x00\x01" * 8  # a loopback sockaddr, repeated
    first, second = seal(KEYS, NAME, value), seal(KEYS, NAME, value)
    assert first != second
    assert b"\x7f\x00\x00\x01" not in first[len(MAGIC) + NONCE_BYTES:]
    nonce = bytes(NONCE_BYTES)
    assert seal(KEYS, NAME, value, nonce=nonce) == seal(KEYS, NAME, value, nonce=nonce)
    with pytest.raises(ValueError):
        seal(KEYS, NAME, value, nonce=b"short")


@pytest.mark.parametrize("at", ["magic", "nonce", "tag", "ciphertext"])
def test_any_altered_byte_fails_the_check(at: str) -> None:
    blob = bytearray(seal(KEYS, NAME, b"rank 1 listens at 10.0.0.2:40000"))
    index = {"magic": 0, "nonce": len(MAGIC), "tag": len(MAGIC) + NONCE_BYTES,
             "ciphertext": len(MAGIC) + NONCE_BYTES + TAG_BYTES}[at]
    blob[index] ^= 0x01
    assert unseal(KEYS, NAME, bytes(blob)) is None


@pytest.mark.parametrize("blob", [b"", b"plain gloo address", MAGIC, MAGIC + bytes(NONCE_BYTES + TAG_BYTES - 1)])
def test_a_stranger_s_bytes_are_not_a_sealed_value(blob: bytes) -> None:
    assert unseal(KEYS, NAME, blob) is None


def test_the_sealed_store_maps_every_operation_onto_opaque_names() -> None:
    inner = dist.HashStore()
    store = SealedStore(inner, KEYS, where="rank 0: the DP group's rendezvous store at 10.0.0.1:41234")
    store.set("0//cpu//0/0", b"rank 0")
    store.set("text", "a str value")
    assert store.get("0//cpu//0/0") == b"rank 0" and store.get("text") == b"a str value"
    assert store.check(["0//cpu//0/0"]) and not store.check(["0//cpu//0/9"])
    store.wait(["0//cpu//0/0"])
    store.wait(["0//cpu//0/0"], datetime.timedelta(seconds=1))
    assert store.add("counter", 2) == 2 and store.add("counter", 1) == 3
    assert sorted(inner.list_keys()) == sorted(store_key(KEYS, k) for k in ("0//cpu//0/0", "text", "counter"))
    assert unseal(KEYS, store_key(KEYS, "text"), inner.get(store_key(KEYS, "text"))) == b"a str value"
    assert store.num_keys() == inner.num_keys()
    assert store.delete_key("text") and not inner.check([store_key(KEYS, "text")])
    clone = store.clone()
    assert isinstance(clone, SealedStore) and clone.get("0//cpu//0/0") == b"rank 0"


def test_a_value_the_secret_did_not_seal_raises_a_startup_error_naming_the_store() -> None:
    inner = dist.HashStore()
    store = SealedStore(inner, KEYS, where="rank 2: the DP group's rendezvous store at 10.0.0.1:41234")
    inner.set(store_key(KEYS, "0//cpu//0/1"), b"a stranger's address")
    with pytest.raises(StartupError, match=r"^rank 2: the DP group's rendezvous store at 10\.0\.0\.1:41234 holds a "
                                           r"value that this deployment's secret did not seal"):
        store.get("0//cpu//0/1")


def test_without_a_secret_a_rank_joins_the_plain_store() -> None:
    from asyncdp.model.rendezvous import host_rendezvous_store

    _, port = host_rendezvous_store("127.0.0.1", timeout_s=10.0)
    info = DPGroupInfo(master_addr="127.0.0.1", master_port=port, dp_size=2, backend="gloo", launch_nonce=LAUNCH_NONCE)
    assert type(join_rendezvous_store(info, None, timeout_s=10.0, where="rank 0")) is dist.TCPStore
    assert isinstance(join_rendezvous_store(info, SECRET, timeout_s=10.0, where="rank 0"), SealedStore)
