"""Block manager: chained hashes, refcounts, LRU eviction order, prefix-hit cap, usage."""

from __future__ import annotations

from hashlib import blake2b

from asyncdp.engine.block_manager import ROOT_HASH, BlockManager, compute_block_hashes, hash_block_tokens
from asyncdp.engine.request import Request
from asyncdp.sampling_params import SamplingParams


def req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(), arrival_time=0.0, max_tokens=16)


def admit(bm: BlockManager, r: Request, n: int | None = None) -> int:
    prefix = bm.find_cached_prefix(r)
    start = len(prefix) * bm.block_size
    n = r.num_tokens - start if n is None else n
    assert bm.allocate(r, n, prefix)
    r.num_computed_tokens = start + n
    return start


def test_block_hash_is_blake2b_of_parent_and_little_endian_token_ids():
    expected = blake2b(
        (7).to_bytes(8, "little") + b"".join(t.to_bytes(4, "little") for t in (1, 2, 300)), digest_size=8)
    assert hash_block_tokens(7, [1, 2, 300]) == int.from_bytes(expected.digest(), "little")


def test_block_hashes_chain_so_equal_blocks_after_different_prefixes_differ():
    a = compute_block_hashes([1, 2, 3, 4, 9, 9, 9, 9], 4)
    b = compute_block_hashes([5, 6, 7, 8, 9, 9, 9, 9], 4)
    assert a[1] != b[1]
    assert a[1] == hash_block_tokens(a[0], [9, 9, 9, 9])
    assert a[0] == hash_block_tokens(ROOT_HASH, [1, 2, 3, 4])
    assert compute_block_hashes([1, 2, 3, 4, 9, 9], 4) == a[:1]  # partial blocks have no hash


def test_shared_prefix_blocks_are_reference_counted_and_freed_when_last_user_leaves():
    bm = BlockManager(16, 4)
    a = req("a", list(range(10)))
    b = req("b", list(range(10)))
    admit(bm, a)
    assert admit(bm, b) == 8  # two full blocks shared
    assert [bm.ref_count(x) for x in b.block_ids[:2]] == [2, 2]
    assert b.block_ids[:2] == a.block_ids[:2] and b.block_ids[2] != a.block_ids[2]
    bm.free(a)
    assert [bm.ref_count(x) for x in b.block_ids] == [1, 1, 1]
    bm.free(b)
    assert bm.num_free_blocks == 16


def test_prefix_hit_is_capped_so_the_last_prompt_token_is_computed():
    bm = BlockManager(16, 4)
    admit(bm, req("a", list(range(8))))
    b = req("b", list(range(8)))
    assert admit(bm, b) == 4  # floor((8-1)/4)*4, not 8
    c = req("c", list(range(9)))
    assert admit(bm, c) == 8


def test_full_block_is_visible_to_later_requests_once_scheduled():
    bm = BlockManager(16, 4)
    a = req("a", list(range(20)))
    admit(bm, a, n=8)  # a chunk of two full blocks; a has not finished its prefill
    b = req("b", list(range(20)))
    assert admit(bm, b) == 8


def test_freed_sequence_is_evicted_tail_first_so_roots_survive_longest():
    bm = BlockManager(4, 4)
    a = req("a", list(range(16)))
    admit(bm, a)  # blocks fully hashed: 4 full blocks (the cap applies to lookups, not to publishing)
    root, second, third, tail = a.block_ids
    bm.free(a)
    assert bm.free_block_ids() == [tail, third, second, root]
    c = req("c", [99] * 5)  # needs 2 blocks: evicts tail and third
    admit(bm, c)
    assert sorted(c.block_ids) == sorted([tail, third])
    assert [bm.cached_block_id(h) for h in a.block_hashes] == [root, second, None, None]


def test_unhashed_free_blocks_are_reused_before_cached_ones():
    bm = BlockManager(4, 4)
    a = req("a", list(range(6)))  # one full block + one partial
    admit(bm, a)
    full, partial = a.block_ids
    bm.free(a)
    assert bm.free_block_ids()[0] == partial
    assert bm.free_block_ids()[-1] == full


def test_usage_counts_referenced_blocks_only_and_cached_free_blocks_as_free():
    bm = BlockManager(11, 4, reserve_scratch_block=True)
    assert bm.num_usable_blocks == 10 and 0 not in bm.free_block_ids()
    a = req("a", list(range(12)))
    admit(bm, a)
    assert bm.usage == 0.3
    bm.free(a)
    assert bm.usage == 0.0 and bm.num_cached_blocks == 3


def test_cache_fill_counts_the_blocks_holding_content_in_use_or_free_until_evicted():
    """What ``usage`` does not say: a finished prompt's blocks stay cached (free for reuse, hits until evicted), so
    the cache is as full after it as during it. Only full, hashed blocks count; a partial tail holds no prefix."""
    bm = BlockManager(11, 4, reserve_scratch_block=True)
    a = req("a", list(range(14)))  # 3 full blocks and a partial one
    admit(bm, a)
    assert (bm.usage, bm.cache_fill) == (0.4, 0.3)
    bm.free(a)
    assert (bm.usage, bm.cache_fill) == (0.0, 0.3)
    b = req("b", list(range(100, 140)))  # 10 blocks: evicts every cached one
    admit(bm, b)
    assert bm.cache_fill == 1.0 and bm.find_cached_prefix(req("a2", list(range(14)))) == []


def test_failed_allocation_changes_nothing():
    bm = BlockManager(4, 4)
    a = req("a", list(range(12)))
    admit(bm, a)
    free_before = bm.free_block_ids()
    b = req("b", list(range(100, 108)))
    assert not bm.allocate(b, 8)
    assert b.block_ids == [] and bm.free_block_ids() == free_before


def test_reclaiming_a_free_cached_block_counts_against_free_space():
    bm = BlockManager(3, 4)
    a = req("a", list(range(9)))
    admit(bm, a)  # 3 blocks
    bm.free(a)
    b = req("b", list(range(9)) + [50] * 8)  # hits 2 cached free blocks, needs 3 more: 5 > 3
    prefix = bm.find_cached_prefix(b)
    assert len(prefix) == 2
    assert not bm.allocate(b, b.num_tokens - 8, prefix)
    assert bm.num_free_blocks == 3


def test_prefix_caching_disabled_never_hits():
    bm = BlockManager(16, 4, enable_prefix_caching=False)
    admit(bm, req("a", list(range(10))))
    assert admit(bm, req("b", list(range(10)))) == 0
    assert bm.num_cached_blocks == 0
