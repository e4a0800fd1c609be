"""The shared pure structures: chained hashes equal to the engine's, the radix tree, the LRU index, the ring."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncdp.dp.peers.block_index import BlockIndex
from asyncdp.dp.peers.events import KvEvent, KvEventIndex
from asyncdp.dp.peers.hashing import block_hashes, render_text, stable_hash64, units
from asyncdp.dp.peers.radix import RadixTree
from asyncdp.dp.peers.ring import HashRing
from asyncdp.engine.block_manager import compute_block_hashes
from tests.dp.peers.helpers import req


def test_block_hashes_equal_the_engines_on_fixed_sequences():
    for tokens, bs in [([], 16), (list(range(15)), 16), (list(range(16)), 16), (list(range(100)), 16),
                       ([0] * 64, 32), ([2 ** 31, 7, 2 ** 32 - 1, 5] * 20, 4), (list(range(1000, 1777)), 64)]:
        assert block_hashes(tokens, bs) == compute_block_hashes(tokens, bs)


@given(st.lists(st.integers(0, 2 ** 32 - 1), max_size=200), st.integers(1, 40))
@settings(max_examples=60, deadline=None)
def test_block_hashes_equal_the_engines_on_random_sequences(tokens, bs):
    assert block_hashes(tokens, bs) == compute_block_hashes(tokens, bs)


def test_block_hashes_chain_so_a_shared_prefix_shares_leading_hashes_only():
    a = block_hashes([1] * 32 + [2] * 16, 16)
    b = block_hashes([1] * 32 + [3] * 16, 16)
    assert a[:2] == b[:2] and a[2] != b[2]
    assert block_hashes([2] * 16 + [1] * 16, 16)[1] != a[1]  # the same block after a different parent


def test_block_hashes_limit_and_chars():
    assert len(block_hashes(list(range(100)), 10, limit=3)) == 3
    assert block_hashes("abcd" * 8, 16) == block_hashes([ord(c) for c in "abcd" * 8], 16)


@given(st.lists(st.integers(0, 2 ** 32 - 1), max_size=50))
@settings(max_examples=60, deadline=None)
def test_render_text_is_the_request_views_text(tokens):
    assert render_text(tokens) == req(tokens).text


def test_render_text_handles_ids_beyond_32_bits_like_the_request_view():
    assert render_text([2 ** 40 + 5, 3, 2 ** 24 + 1]) == req([2 ** 40 + 5, 3, 2 ** 24 + 1]).text


def test_char_block_hashes_equal_hashing_the_code_points_as_units():
    text = req(list(range(5000, 5100))).text
    ids = [ord(c) for c in text]
    assert block_hashes(text, 64) == block_hashes(ids, 64) == compute_block_hashes(ids, 64)


def test_units_are_tokens_or_the_four_char_rendering():
    r = req([1, 2, 64])
    assert units(r, "tokens") == (1, 2, 64)
    assert units(r, "chars") == r.text and len(r.text) == 12


def test_stable_hash_is_not_salted():
    assert stable_hash64("conversation-1") == 0xA4D8443E71E35A65  # pinned: BLAKE2b-64, little-endian
    assert stable_hash64("a") != stable_hash64("b")


# ---------------------------------------------------------------- radix tree


def test_radix_match_counts_partial_edges_and_reports_the_node_owners():
    t = RadixTree.empty(3)
    t.insert("abcdef", 0, 10)
    t.insert("abcxyz", 1, 20)
    assert t.match("abcdef")[0] == 6
    n, node = t.match("abcdQQ")
    assert n == 4 and set(node.owners) == {0}
    n, node = t.match("abQ")
    assert n == 2 and set(node.owners) == {0, 1}
    assert t.recent_owner(node) == 1  # rank 1 routed through "abc" last
    assert t.match("zzz")[0] == 0
    assert t.tree_units == [6, 6, 0]


def test_radix_recent_owner_breaks_a_time_tie_by_lowest_rank_and_skips_dead_ranks():
    t = RadixTree.empty(3)
    t.insert("abc", 2, 5)
    t.insert("abc", 1, 5)
    _, node = t.match("abc")
    assert t.recent_owner(node) == 1
    assert t.recent_owner(node, {1}) == 2
    assert t.recent_owner(node, {1, 2}) is None


def test_radix_evicts_least_recent_leaves_per_owner_down_to_the_bound():
    t = RadixTree.empty(2)
    t.insert("aaaa1111", 0, 1)
    t.insert("aaaa2222", 0, 2)
    t.insert("aaaa3333", 0, 3)
    t.insert("aaaa1111", 1, 4)
    assert t.tree_units[0] == 16
    t.evict(12)
    assert t.tree_units[0] == 12
    assert t.match("aaaa2222")[0] == 8 and t.match("aaaa3333")[0] == 8
    _, node = t.match("aaaa1111")
    assert set(node.owners) == {1}  # rank 1 keeps its copy
    t.evict(0)
    assert t.tree_units == [0, 0]
    assert t.match("aaaa")[0] == 0 and not t.root.children


@given(st.lists(st.tuples(st.text("ab", min_size=1, max_size=12), st.integers(0, 2)), max_size=30))
@settings(max_examples=60, deadline=None)
def test_radix_unit_totals_match_a_recount_and_inserted_sequences_match_fully(items):
    t = RadixTree.empty(3)
    for k, (s, r) in enumerate(items):
        t.insert(s, r, k)
        assert t.match(s)[0] == len(s)
    counts = [0, 0, 0]
    stack = [t.root]
    while stack:
        n = stack.pop()
        for r in n.owners:
            counts[r] += len(n.key)
        for c in n.children.values():
            assert set(c.owners) <= set(n.owners) or n is t.root
            stack.append(c)
    assert counts == t.tree_units


def test_radix_works_on_token_tuples():
    t = RadixTree.empty(2)
    t.insert((1, 2, 3, 4), 1, 0)
    assert t.match((1, 2, 9))[0] == 2


# ---------------------------------------------------------------- indexes and ring


def test_block_index_is_an_lru_per_rank_with_capacity_and_ttl():
    ix = BlockIndex.empty(2, capacity=3)
    ix.insert(0, [1, 2, 3])
    ix.insert(0, [1, 4])  # refreshes 1, evicts 2
    assert ix.prefix_run(0, [1, 2, 3]) == 1 and ix.holds(0, 3) and ix.size(0) == 3
    assert ix.prefix_run(1, [1]) == 0
    ttl = BlockIndex.empty(1, capacity=100, ttl_us=10)
    ttl.insert(0, [7], now_us=0)
    assert ttl.holds(0, 7, now_us=10) and not ttl.holds(0, 7, now_us=11)


def test_kv_event_index_tracks_stored_removed_and_cleared():
    ix = KvEventIndex.empty(2)
    ix.apply(KvEvent(0, "stored", (1, 2, 3)))
    ix.apply(KvEvent(0, "removed", (2,)))
    ix.apply(KvEvent(5, "stored", (9,)))  # unknown rank: ignored
    assert ix.overlap(0, [1, 2, 3]) == 1 and ix.size(0) == 2
    ix.apply(KvEvent(0, "cleared"))
    assert ix.size(0) == 0


def test_ring_moves_only_the_dead_ranks_keys():
    ring = HashRing.build(8)
    keys = [f"k{i}" for i in range(2000)]
    before = {k: ring.lookup(k) for k in keys}
    after = {k: ring.lookup(k, {3}) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == 3 for k in moved)
    assert all(after[k] != 3 for k in keys)
    counts = [list(before.values()).count(r) for r in range(8)]
    assert min(counts) > 2000 / 8 / 2  # 128 points per rank spread the keys


def test_ring_placement_is_pinned_so_it_is_the_same_in_every_process():
    assert HashRing.build(4) == HashRing.build(4)
    assert [HashRing.build(4).lookup(f"s{i}") for i in range(8)] == [0, 2, 0, 2, 3, 0, 2, 3]
