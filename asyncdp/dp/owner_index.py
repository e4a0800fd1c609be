"""The approximate prefix index of asyncdp's policy: which ranks this router sent each block hash to.

``owners`` maps a block hash (a chained hash of each 16-token block, :func:`chain_hashes`) to a bitmask of the
ranks holding it; each rank also keeps an LRU of its hashes bounded by the engine's KV capacity in blocks
(routing-bench H8).
Inserting a prompt refreshes its hashes root last, so, as in the engine's cache, tails are evicted first and every
rank's set stays *prefix-closed*: if a rank holds block k of a prompt it holds blocks 0..k-1 too. That makes a
rank's match a binary search, and so is the deepest run any rank holds (the union of prefix-closed sets is one).

``depth_memo`` maps a first block hash to the deepest run any rank held when a prompt starting with it was last
scored: prompts sharing a first block usually share the run, so the policy checks the guess with two lookups
before it searches. Its entries go when their first block leaves the index, which keeps it bounded.

``roots[r]`` is the set of prefixes rank r holds: the first blocks of the prompts sent to it that are still in
its set. The policy's spread rule places a prompt no rank holds by their number (:mod:`.spread`).

The policy's ``select`` reads ``owners`` and ``depth_memo`` directly (its hot path, gate G7); everything that
changes the index is here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncdp.dp.policy import RequestView


@dataclass(slots=True)
class OwnerIndex:
    capacity: int  # blocks per rank
    lru: list[OrderedDict[int, None]]
    owners: dict[int, int] = field(default_factory=dict)  # block hash -> bitmask of ranks holding it
    depth_memo: dict[int, int] = field(default_factory=dict)  # first block hash -> deepest run last seen
    roots: list[set[int]] = field(default_factory=list)  # per rank: the first blocks it holds

    @classmethod
    def empty(cls, dp_size: int, capacity: int) -> OwnerIndex:
        return cls(capacity, [OrderedDict() for _ in range(dp_size)], roots=[set() for _ in range(dp_size)])

    def size(self, rank: int) -> int:
        """Blocks the rank holds."""
        return len(self.lru[rank])

    def match(self, rank: int, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` the rank holds (a binary search: its set is prefix-closed)."""
        owners, bit = self.owners, 1 << rank
        if not hashes or not owners.get(hashes[0], 0) & bit:
            return 0
        lo, hi = 1, len(hashes)  # hashes[:lo] held; hashes[hi:] not known held
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if owners.get(hashes[mid - 1], 0) & bit:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def deepest_run(self, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` that some rank holds, given that one holds the first (a binary search: the
        union of prefix-closed sets is prefix-closed)."""
        get = self.owners.get
        lo, hi = 1, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if get(hashes[mid - 1], 0):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def insert(self, rank: int, hashes: Sequence[int]) -> None:
        """Record that ``rank`` was sent these blocks; evict its least recent blocks beyond the capacity."""
        lru, owners, bit = self.lru[rank], self.owners, 1 << rank
        roots = self.roots[rank]
        if hashes:
            roots.add(hashes[0])
        for h in reversed(hashes):  # the root last: most recent, so evicted last
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                owners[h] = owners.get(h, 0) | bit
        while len(lru) > self.capacity:
            h, _ = lru.popitem(last=False)
            roots.discard(h)
            self._disown(h, bit)

    def drop_rank(self, rank: int) -> None:
        """Forget every block of a rank (it died: its cache is gone)."""
        lru, bit = self.lru[rank], 1 << rank
        for h in lru:
            self._disown(h, bit)
        lru.clear()
        self.roots[rank].clear()

    def _disown(self, h: int, bit: int) -> None:
        left = self.owners.get(h, 0) & ~bit
        if left:
            self.owners[h] = left
        else:
            self.owners.pop(h, None)
            self.depth_memo.pop(h, None)  # the memo stays bounded by the index


RANK_TUPLES: dict[int, tuple[int, ...]] = {}
_RANKS_MAX = 1 << 16


def ranks_of(mask: int) -> tuple[int, ...]:
    """The ranks of a bitmask in ascending order, memoised (a cache of a pure function: iterating a tuple is
    cheaper in ``select`` than peeling bits). Bounded: cleared when it grows past 65 536 masks."""
    t = RANK_TUPLES.get(mask)
    if t is None:
        t = tuple(r for r in range(mask.bit_length()) if mask >> r & 1)
        if len(RANK_TUPLES) >= _RANKS_MAX:
            RANK_TUPLES.clear()
        RANK_TUPLES[mask] = t
    return t


_memo: list[Any] = [None, 0, ()]  # (request, block size, hashes): the last prompt hashed


def chain_hashes(tokens: Sequence[int], block_size: int, root: int = 0) -> tuple[int, ...]:
    """The chained hash of each complete block of ``block_size`` tokens (a partial tail has none): block k's hash
    is ``hash((hash of block k-1, its tokens))``, from ``root`` (:attr:`RequestView.root_hash`: 0, or the
    request's cache salt's).

    This index only compares a router's prompts with each other, never with the engine's cache, so it needs equal
    hashes for equal prefixes, not the engine's BLAKE2b (:func:`asyncdp.dp.peers.hashing.block_hashes`, which the
    precise-class peers use): Python's hash of a tuple of ints is computed in C, has no per-process salt (every API
    server of a deployment, on one Python, gets the same values, so their tie keys agree) and costs about a
    quarter of BLAKE2b per block here. A collision only mispredicts a hit."""
    t = tokens if type(tokens) is tuple else tuple(tokens)
    h = root
    out = []
    for end in range(block_size, len(t) + 1, block_size):
        h = hash((h, t[end - block_size:end]))
        out.append(h)
    return tuple(out)


def prompt_hashes(req: RequestView, block_size: int) -> tuple[int, ...]:
    """The prompt's chained block hashes (:func:`chain_hashes`), computed once per request: ``select`` and
    ``on_dispatch`` get the same :class:`RequestView` object, so a one-entry memo by identity serves the second
    call (a cache of a pure function; it never changes a result). This is the "hashing" of G7, timed apart from
    the selection."""
    if _memo[0] is req and _memo[1] == block_size:
        return _memo[2]
    hashes = chain_hashes(req.tokens, block_size, req.root_hash)
    _memo[0], _memo[1], _memo[2] = req, block_size, hashes
    return hashes


def common_run(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading blocks two prompts' chained hashes (:func:`chain_hashes`) share: a binary search, since
    equal hashes at block k mean equal prompts up to it."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo
