"""The MoE DP group's rendezvous store (spec §5.5): the head's ``TCPStore`` and, with a deployment secret, the
sealed view of it every rank joins through.

Theory of operation
-------------------
The head hosts a ``TCPStore`` on the DP address, port 0 (:func:`host_rendezvous_store`); every engine joins it as a
client and hands it to ``torch.distributed.init_process_group``. torch puts each group under a key prefix (the
group name and the device: ``0//cpu//0/<rank>`` for the default group's gloo context, ``0//1//cpu//…`` for the
control group) and gloo writes there each rank's pair address (its listening ``sockaddr`` and pair ids, about 170
bytes), then reads every peer's. The store's server answers anyone who reaches the port, with no credential:
``list_keys`` names every key, ``get`` reads any value, ``set`` and ``delete_key`` change any. So a stranger could
read the ranks' addresses, and by writing a forged address at the key a rank has yet to read, have that rank
connect to it instead of its peer (a rank that reads ``0//cpu//0/0`` before rank 0 wrote it takes whatever is
there).

With a deployment secret, every rank wraps its client in a :class:`SealedStore`. Both the head's ranks and a
headless node's derive the same three keys from the secret and the group's identity (the store's address and port,
``dp_size``, the backend, and the launch nonce: all in ``HandshakeInit.dp_group``), so no key is sent anywhere. The
launch nonce is 16 random bytes the head draws when it hosts the store: a later launch of the same deployment
(same secret, its store at the same address and port, e.g. a restart whose port came back) has other keys, so a
value a stranger recorded from an earlier launch and writes into this one's store fails the check below like any
value the secret did not seal (the nonce needs no secrecy: it reaches the ranks over the authenticated handshake,
so a stranger cannot hand them an old one):

* names: each key torch uses becomes ``asyncdp/`` and 128 bits of HMAC-SHA256 of it, so the names a stranger lists
  say nothing, and the name a rank will read next cannot be guessed from those it sees;
* values: each value is sealed, encrypt-then-MAC: XOR with a SHAKE-256 keystream of the encryption key and a fresh
  16-byte nonce, then an HMAC-SHA256 over the stored name, the nonce and the ciphertext (``MAGIC | nonce | tag |
  ciphertext``, 56 bytes more). A stranger reads no address; a value it wrote, moved from another key, or
  recorded in another launch fails the check, and the rank that reads it fails at once with
  :class:`~asyncdp.errors.StartupError` (rather than connect where the stranger said).

What stays open: a stranger who reaches the store can still delete or overwrite a sealed value (the startup then
fails, with that error or the store's timeout); within one launch it can write a value back under the name it
read it from (a join retried after "address in use" may write the same names again: that points a rank at an address
its peer held earlier in the launch); and counters (``add``, which torch only uses with
``TORCH_DIST_INIT_BARRIER=1``) are named but not sealed. After the rendezvous the ranks talk over gloo's (or
NCCL's) own sockets, which carry no authentication and no encryption. Without a secret the store is used as is.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import secrets
import socket
from dataclasses import dataclass, field

import torch.distributed as dist

from asyncdp.errors import StartupError
from asyncdp.messages import LAUNCH_NONCE_BYTES, DPGroupInfo

STORE_TIMEOUT_S = 300.0  # how long a rank waits in the rendezvous for its peers

__all__ = ["MAGIC", "RendezvousKeys", "SealedStore", "derive_keys", "host_rendezvous_store", "join_rendezvous_store",
           "seal", "store_key", "unseal"]

MAGIC = b"ADPrdv1\x00"
NONCE_BYTES = 16
TAG_BYTES = 32  # SHA-256
_LABEL = b"asyncdp-dp-rendezvous-2"  # 2: the launch nonce
_NAME_PREFIX = "asyncdp/"
_NAME_HEX = 32  # 128 bits


def host_rendezvous_store(host: str, *, timeout_s: float = STORE_TIMEOUT_S) -> tuple[dist.TCPStore, int]:
    """The head's rendezvous store on ``host`` only, bound to port 0; returns it and the port it really got.

    The head keeps the store alive for as long as the deployment runs (engines read addresses from it whenever
    a new communicator is created).
    """
    # A socket bound here, handed over: given only a host, the store's server listens on every interface.
    family, _, _, _, addr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind(addr)
        sock.listen(128)
        port = sock.getsockname()[1]
        store = dist.TCPStore(host, port, world_size=None, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store's now, for the deployment's life
    return store, int(store.port)


@dataclass(frozen=True, slots=True)
class RendezvousKeys:
    """The three keys of one group's sealed store, derived from the deployment secret (never sent)."""

    name: bytes = field(repr=False)
    encrypt: bytes = field(repr=False)
    authenticate: bytes = field(repr=False)


def _mac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


def derive_keys(secret: bytes, info: DPGroupInfo) -> RendezvousKeys:
    """The keys of the group ``info`` describes: the same on every rank that holds ``secret``, another set for
    another secret, store, ``dp_size``, backend or launch (``info.launch_nonce``)."""
    if not secret:
        raise ValueError("a rendezvous key needs a non-empty deployment secret")
    if len(info.launch_nonce) != LAUNCH_NONCE_BYTES:
        raise ValueError(f"a rendezvous key needs the launch's {LAUNCH_NONCE_BYTES}-byte nonce")
    group = "\x00".join((info.master_addr, str(info.master_port), str(info.dp_size), info.backend)).encode()
    root = _mac(secret, _LABEL + b"\x00" + info.launch_nonce + group)
    return RendezvousKeys(name=_mac(root, b"name"), encrypt=_mac(root, b"encrypt"),
                          authenticate=_mac(root, b"authenticate"))


def store_key(keys: RendezvousKeys, key: str) -> str:
    """The name a key of torch's is stored under: opaque, and the same on every rank."""
    return _NAME_PREFIX + hmac.new(keys.name, key.encode(), hashlib.sha256).hexdigest()[:_NAME_HEX]


def _xor(data: bytes, keystream: bytes) -> bytes:
    return (int.from_bytes(data, "big") ^ int.from_bytes(keystream, "big")).to_bytes(len(data), "big")


def _tag(keys: RendezvousKeys, name: str, nonce: bytes, ciphertext: bytes) -> bytes:
    return _mac(keys.authenticate, name.encode() + b"\x00" + nonce + ciphertext)


def seal(keys: RendezvousKeys, name: str, value: bytes, *, nonce: bytes | None = None) -> bytes:
    """``value`` as stored under ``name`` (a :func:`store_key`): encrypted, then authenticated with the name."""
    nonce = secrets.token_bytes(NONCE_BYTES) if nonce is None else nonce
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a nonce has {NONCE_BYTES} bytes")
    ciphertext = _xor(value, hashlib.shake_256(keys.encrypt + nonce).digest(len(value)))
    return MAGIC + nonce + _tag(keys, name, nonce, ciphertext) + ciphertext


def unseal(keys: RendezvousKeys, name: str, blob: bytes) -> bytes | None:
    """The value :func:`seal` stored under ``name``; None when ``blob`` is not one (another key, another secret,
    another group or launch, a stranger's bytes, or a sealed value altered or moved from another name)."""
    head = len(MAGIC) + NONCE_BYTES + TAG_BYTES
    if len(blob) < head or not blob.startswith(MAGIC):
        return None
    nonce, tag, ciphertext = blob[len(MAGIC):len(MAGIC) + NONCE_BYTES], blob[head - TAG_BYTES:head], blob[head:]
    if not hmac.compare_digest(tag, _tag(keys, name, nonce, ciphertext)):
        return None
    return _xor(ciphertext, hashlib.shake_256(keys.encrypt + nonce).digest(len(ciphertext)))


class SealedStore(dist.Store):
    """A store client whose keys are :func:`store_key` names and whose values are :func:`seal` ed.

    torch calls it from C++ (gloo's and NCCL's rendezvous): whoever hands it to ``init_process_group`` keeps a
    reference for as long as the group lives, since a Python store gone from Python answers nothing.
    """

    def __init__(self, inner: dist.Store, keys: RendezvousKeys, *, where: str) -> None:
        super().__init__()
        self._inner = inner
        self._keys = keys
        self._where = where  # names the store in errors: "rank 1: the DP group's rendezvous store at host:port"

    def _name(self, key: str) -> str:
        return store_key(self._keys, key)

    def set(self, key: str, value: bytes | str) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        name = self._name(key)
        self._inner.set(name, seal(self._keys, name, data))  # type: ignore[arg-type]

    def get(self, key: str) -> bytes:
        name = self._name(key)
        value = unseal(self._keys, name, self._inner.get(name))
        if value is None:
            raise StartupError(f"{self._where} holds a value that this deployment's secret did not seal: a process "
                               f"without the secret wrote to it (anyone who can reach that port can); keep "
                               f"--data-parallel-address on a network only the deployment's nodes reach")
        return value

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        names = [self._name(k) for k in keys]
        if timeout is None:
            self._inner.wait(names)
        else:
            self._inner.wait(names, timeout)

    def check(self, keys: list[str]) -> bool:
        return self._inner.check([self._name(k) for k in keys])

    def add(self, key: str, value: int) -> int:
        return self._inner.add(self._name(key), value)

    def delete_key(self, key: str) -> bool:
        return self._inner.delete_key(self._name(key))

    def num_keys(self) -> int:
        return self._inner.num_keys()

    # torch's C++ side (the PrefixStore a process group holds over this store, NCCL's watchdog) finds these two by
    # their C++ names; under their Python names alone it raises "Tried to call pure virtual function"
    deleteKey = delete_key
    getNumKeys = num_keys

    def clone(self) -> SealedStore:
        return SealedStore(self._inner.clone(), self._keys, where=self._where)  # type: ignore[attr-defined]


def join_rendezvous_store(info: DPGroupInfo, secret: bytes | None, *, timeout_s: float,
                          where: str) -> dist.Store:
    """A client of the group's store, sealed when the deployment has a secret (the caller keeps it alive)."""
    store = dist.TCPStore(info.master_addr, info.master_port, is_master=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    if not secret:
        return store
    return SealedStore(store, derive_keys(secret, info), where=where)
