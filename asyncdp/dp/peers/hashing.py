"""Chained block hashes and the units policies hash (routing-bench §1.2, §2.0 ``units``/``hashes``).

``hash_block(parent, units)`` is the engine's chained hash (``asyncdp.engine.block_manager.hash_block_tokens``):
BLAKE2b-64 over the parent hash (u64 little-endian) followed by each unit as a u32 little-endian, read back
little-endian. Token blocks therefore hash exactly as the engine hashes them, which is what lets a KV event's
block hashes be compared with a prompt's (a test pins the equality). Character units hash the code point of each
character the same way. dp/ may not import the engine, so the algorithm is written twice and tested equal.

``units(req, kind)`` is the sequence a policy works on: the token ids (``"tokens"``) or the fixed 4 characters
per token rendering of C4 (``"chars"``, :attr:`RequestView.text`).
"""

from __future__ import annotations

import struct
import sys
from array import array
from base64 import b64encode
from collections.abc import Sequence
from hashlib import blake2b
from typing import Any

from asyncdp.dp.policy import RequestView
from asyncdp.errors import ConfigError

ROOT_HASH = 0
UNIT_KINDS = ("tokens", "chars")

_structs: dict[int, struct.Struct] = {}


def hash_block(parent_hash: int, block: Sequence[int]) -> int:
    """BLAKE2b-64 of ``parent_hash`` (u64 LE) then the block's units (u32 LE each)."""
    n = len(block)
    packer = _structs.get(n)
    if packer is None:
        packer = _structs[n] = struct.Struct(f"<Q{n}I")
    return int.from_bytes(blake2b(packer.pack(parent_hash, *block), digest_size=8).digest(), "little")


def _unit_bytes(seq: Sequence[int] | str) -> bytes:
    """Every unit as u32 little-endian, in one C-level conversion."""
    if isinstance(seq, str):
        return seq.encode("utf-32-le")  # exactly the u32 LE packing of the code points
    arr = array(_U32, seq)  # raises OverflowError outside [0, 2**32), as the engine's struct packing does
    if _SWAP:
        arr.byteswap()
    return arr.tobytes()


_SWAP = sys.byteorder != "little"
_U32 = next(c for c in "IL" if array(c).itemsize == 4)  # the 4-byte unsigned array type code
_memo: list[Any] = [None, None]  # one entry: (seq, block_size, limit, parent) -> hashes


def block_hashes(seq: Sequence[int] | str, block_size: int, limit: int | None = None,
                 parent_hash: int = ROOT_HASH) -> list[int]:
    """The chained hash of each complete block of ``block_size`` units (a partial tail has none), at most
    ``limit`` of them. A ``str`` is hashed by code points.

    The last result is memoised (policies hash the same prompt in ``select`` and again in ``on_dispatch``); the
    memo is a cache of a pure function, compared by value, so it never changes a result."""
    if block_size < 1:
        raise ConfigError(f"block size must be >= 1 unit (got {block_size}).")
    key = (block_size, limit, parent_hash)
    if _memo[0] is not None and _memo[0][1] == key and _memo[0][0] == seq:
        return list(_memo[1])
    n = len(seq) // block_size
    if limit is not None:
        n = min(n, limit)
    data = _unit_bytes(seq[:n * block_size])
    step = 4 * block_size
    out: list[int] = []
    for b in range(n):
        parent_hash = int.from_bytes(
            blake2b(parent_hash.to_bytes(8, "little") + data[b * step:(b + 1) * step], digest_size=8).digest(),
            "little")
        out.append(parent_hash)
    _memo[0], _memo[1] = ((seq if isinstance(seq, str) else tuple(seq)), key), tuple(out)
    return out


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_PAIRS = [a + b for a in _B64 for b in _B64]  # 12 bits -> 2 characters


def render_text(tokens: Sequence[int]) -> str:
    """:attr:`RequestView.text`: 4 base-64 digits per token (its low 24 bits, big-endian). Standard base64 of
    each token's 3 low bytes is exactly that, with the same alphabet, so the rendering runs at C speed; ids
    outside [0, 2**32) take the table path."""
    try:
        arr = array(_U32, tokens)
    except OverflowError:
        pairs = _PAIRS
        return "".join([pairs[(t >> 12) & 4095] + pairs[t & 4095] for t in tokens])
    if not _SWAP:
        arr.byteswap()  # now big-endian: b3 b2 b1 b0 per token
    be = arr.tobytes()
    low3 = bytearray(3 * len(arr))
    low3[0::3], low3[1::3], low3[2::3] = be[1::4], be[2::4], be[3::4]
    return b64encode(bytes(low3)).decode("ascii")


def units(req: RequestView, kind: str) -> Sequence[int] | str:
    """The request's tokens, or its 4-characters-per-token text (C4), for the radix trees. A salted request's
    (:attr:`RequestView.cache_salt`) start with :func:`salt_marker`, so a tree shares no node between salts."""
    if kind == "tokens":
        seq: tuple[int, ...] | str = tuple(req.tokens)
    elif kind == "chars":
        seq = render_text(req.tokens)
    else:
        raise ConfigError(f"unit kind must be one of {', '.join(UNIT_KINDS)} (got {kind!r}).")
    return seq if req.cache_salt is None else salt_marker(req.root_hash, kind) + seq  # type: ignore[operator]


def salt_marker(root: int, kind: str) -> tuple[int, ...] | str:
    """The units a salted prompt starts with in a radix tree, from its salt's root hash: one negative unit (no
    token id is one) for tokens; for characters its four 16-bit parts as code points of the Supplementary Private
    Use Area-A (which no rendering uses). Equal salts share it, so a tree counts it as 1 or 4 matched units."""
    if kind == "tokens":
        return (-1 - root,)
    return "".join(chr(0xF0000 + ((root >> shift) & 0xFFFF)) for shift in (48, 32, 16, 0))


def stable_hash64(text: str) -> int:
    """A process-independent 64-bit hash of a string (never the salted built-in ``hash``)."""
    return int.from_bytes(blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
