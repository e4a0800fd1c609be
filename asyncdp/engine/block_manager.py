"""Paged KV cache bookkeeping with prefix caching (vLLM v1 semantics, spec routing-bench §5 rules 4-6).

The cache is ``num_blocks`` blocks of ``block_size`` token slots. A request owns an ordered list of block ids
(``Request.block_ids``) covering its computed and scheduled tokens. Blocks are reference counted: a block shared
through the prefix cache is referenced by every request using it.

Prefix caching. Every *full* block of a request's tokens has a chained hash
``hash_block_tokens(parent_hash, tokens)`` (64-bit BLAKE2b over the parent hash and the token ids, both
little-endian; the first block's parent is ``ROOT_HASH``, or for a request with a ``cache_salt`` the salt's own
hash, :func:`salt_root`), so a hash names the whole prefix up to and including the block, and the salt it was
computed under: requests with different salts, or with and without one, share no block (vLLM mixes the salt into
the first block's hash the same way). A full block is published in the hash map as soon as it is *scheduled*
(rule 5), so a request admitted in a later step can reuse it. On admission, the hit is the longest run of
published blocks, capped at ``floor((num_tokens - 1) / block_size)`` blocks because the last token must be
computed (rule 4).

Free blocks live in one LRU queue (an ``OrderedDict``, O(1) at both ends); allocation takes the oldest. Free
blocks that still carry a hash stay findable until they are reused (evicted). A finished or preempted sequence
releases its blocks tail first, so its root blocks, shared by most prefixes, are evicted last (rule 6). Blocks
that carry no hash go to the *front* of the queue: reusing them first costs no cached content.

``usage`` is referenced blocks / usable blocks: cached blocks nothing references count as free, as in vLLM.

Scratch block. With ``reserve_scratch_block=True`` block 0 is never handed out; an executor may use it as the
KV target of dummy batches (MoE lockstep) and padding. Usable blocks are then ``num_blocks - 1``.

Cost: an allocation is O(new blocks); hashing is incremental (each full block hashed once per request, kept in
``Request.block_hashes`` across preemption); nothing iterates over a request's whole context per step.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Sequence
from hashlib import blake2b

from asyncdp.engine.request import Request
from asyncdp.errors import ConfigError
from asyncdp.sampling_params import salt_root as root_of_salt

ROOT_HASH = 0

_structs: dict[int, struct.Struct] = {}


def hash_block_tokens(parent_hash: int, token_ids: Sequence[int]) -> int:
    """Chained block hash: BLAKE2b-64 of ``parent_hash`` (u64 LE) followed by the token ids (u32 LE each)."""
    n = len(token_ids)
    packer = _structs.get(n)
    if packer is None:
        packer = _structs[n] = struct.Struct(f"<Q{n}I")
    return int.from_bytes(blake2b(packer.pack(parent_hash, *token_ids), digest_size=8).digest(), "little")


def salt_root(cache_salt: str | None) -> int:
    """The parent of a prompt's first block: ``ROOT_HASH`` unsalted, else the salt's own hash
    (:func:`asyncdp.sampling_params.salt_root`, which the routing policies chain from too)."""
    return ROOT_HASH if cache_salt is None else root_of_salt(cache_salt)


def compute_block_hashes(token_ids: Sequence[int], block_size: int, parent_hash: int = ROOT_HASH) -> list[int]:
    """Hashes of every full block of ``token_ids`` (a trailing partial block has none)."""
    out: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent_hash = hash_block_tokens(parent_hash, token_ids[start:start + block_size])
        out.append(parent_hash)
    return out


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        reserve_scratch_block: bool = False,
    ) -> None:
        first = 1 if reserve_scratch_block else 0
        if num_blocks - first < 1:
            raise ConfigError(f"--num-kv-blocks must leave at least one usable KV block (got {num_blocks}).")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.num_usable_blocks = num_blocks - first
        self.scratch_block_id: int | None = 0 if reserve_scratch_block else None
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(first, num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id
        self.prefix_cache_queries = 0  # tokens looked up at first admission (cumulative)
        self.prefix_cache_hits = 0  # tokens found (cumulative)

    # ------------------------------------------------------------------ views

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        return (self.num_usable_blocks - len(self._free)) / self.num_usable_blocks

    @property
    def cache_fill(self) -> float:
        """The share of the blocks holding cached content (in use or free for reuse): how full the prefix cache is,
        which ``usage`` (free blocks count as free, cached or not) does not say. Routers with several API servers
        see only their own sends of it (asyncdp.dp.asyncdp_state, the memory term)."""
        return len(self._cached) / self.num_usable_blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def block_hash(self, block_id: int) -> int | None:
        return self._hash[block_id]

    def free_block_ids(self) -> list[int]:
        """Free blocks in eviction order (next to be reused first)."""
        return list(self._free)

    def cached_block_id(self, block_hash: int) -> int | None:
        return self._cached.get(block_hash)

    # ------------------------------------------------------------------ operations

    def _ensure_hashes(self, req: Request, num_full_blocks: int) -> list[int]:
        hashes = req.block_hashes
        n = len(hashes)
        if n < num_full_blocks:
            bs = self.block_size
            tokens = req.all_token_ids
            parent = hashes[-1] if hashes else salt_root(req.sampling_params.cache_salt)
            for i in range(n, num_full_blocks):
                parent = hash_block_tokens(parent, tokens[i * bs:(i + 1) * bs])
                hashes.append(parent)
        return hashes

    def find_cached_prefix(self, req: Request) -> list[int]:
        """Block ids of the longest cached prefix of ``req`` (capped so one token is left to compute).

        Changes nothing; pass the result to :meth:`allocate` to take the blocks.
        """
        if not self.enable_prefix_caching:
            return []
        max_blocks = (req.num_tokens - 1) // self.block_size
        if max_blocks <= 0:
            return []
        hashes = self._ensure_hashes(req, max_blocks)
        cached = self._cached
        hits: list[int] = []
        for i in range(max_blocks):
            bid = cached.get(hashes[i])
            if bid is None:
                break
            hits.append(bid)
        return hits

    def allocate(self, req: Request, num_new_tokens: int, cached_prefix: Sequence[int] = ()) -> bool:
        """Give ``req`` blocks for ``num_computed_tokens (+ cached prefix) + num_new_tokens`` tokens.

        ``cached_prefix`` (from :meth:`find_cached_prefix`) is only passed at admission, when ``req`` holds no
        blocks. Returns False, changing nothing, when the free blocks do not suffice. Full blocks covered by the
        scheduled tokens are published to the prefix cache.
        """
        bs = self.block_size
        ref = self._ref
        free = self._free
        num_computed = len(cached_prefix) * bs if cached_prefix else req.num_computed_tokens
        total = num_computed + num_new_tokens
        block_ids = req.block_ids
        need = -(-total // bs) - len(block_ids) - len(cached_prefix)
        reclaimed = 0
        for bid in cached_prefix:
            if ref[bid] == 0:
                reclaimed += 1
        if need + reclaimed > len(free):
            return False
        for bid in cached_prefix:
            if ref[bid] == 0:
                del free[bid]
            ref[bid] += 1
            block_ids.append(bid)
        if cached_prefix:
            req.num_registered_blocks = len(cached_prefix)
        if need > 0:
            hashes = self._hash
            cached = self._cached
            for _ in range(need):
                bid, _none = free.popitem(last=False)
                h = hashes[bid]
                if h is not None:  # evict its cached content
                    hashes[bid] = None
                    if cached.get(h) == bid:
                        del cached[h]
                ref[bid] = 1
                block_ids.append(bid)
        if self.enable_prefix_caching and total // bs > req.num_registered_blocks:
            self._publish(req, total // bs)
        return True

    def _publish(self, req: Request, num_full_blocks: int) -> None:
        hashes = self._ensure_hashes(req, num_full_blocks)
        block_hash = self._hash
        cached = self._cached
        block_ids = req.block_ids
        for i in range(req.num_registered_blocks, num_full_blocks):
            bid = block_ids[i]
            if block_hash[bid] is None:
                h = hashes[i]
                if h not in cached:  # a twin computed concurrently keeps the entry; this block stays anonymous
                    cached[h] = bid
                    block_hash[bid] = h
        req.num_registered_blocks = num_full_blocks

    def record_admission(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_query_tokens
        self.prefix_cache_hits += num_hit_tokens

    def free(self, req: Request) -> None:
        """Release all of ``req``'s blocks, tail first (roots are evicted last)."""
        ref = self._ref
        free = self._free
        block_hash = self._hash
        for bid in reversed(req.block_ids):
            r = ref[bid] - 1
            ref[bid] = r
            if r == 0:
                free[bid] = None
                if block_hash[bid] is None:
                    free.move_to_end(bid, last=False)
        req.block_ids = []
        req.num_registered_blocks = 0

    def forget_from(self, req: Request, first_block: int) -> None:
        """Unpublish ``req``'s blocks from index ``first_block`` on: the forward that was to write their KV
        failed, so no later request may take them as a cache hit (they hold whatever was there before)."""
        block_hash = self._hash
        cached = self._cached
        for bid in req.block_ids[first_block:]:
            h = block_hash[bid]
            if h is not None:
                block_hash[bid] = None
                if cached.get(h) == bid:
                    del cached[h]
        req.num_registered_blocks = min(req.num_registered_blocks, first_block)

    def clear(self) -> None:
        """Every block free and nothing cached (the counters stay): for an engine that dropped every request
        after a call broke off midway, whose reference counts and hash map may be half-updated."""
        first = 0 if self.scratch_block_id is None else 1
        self._ref = [0] * self.num_blocks
        self._hash = [None] * self.num_blocks
        self._free = OrderedDict.fromkeys(range(first, self.num_blocks))
        self._cached = {}

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash. Only possible when no block is referenced; returns whether it happened."""
        if len(self._free) != self.num_usable_blocks:
            return False
        self._cached.clear()
        self._hash = [None] * self.num_blocks
        return True
