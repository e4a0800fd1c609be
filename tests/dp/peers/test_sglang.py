"""`sglang_cache_aware` conformance (routing-bench §2.7): imbalance rule, cache threshold, owners, tie-breaks."""

from __future__ import annotations

import pytest

from asyncdp.dp.peers import PEER_POLICIES
from asyncdp.dp.peers.events import KvEvent
from asyncdp.dp.peers.hashing import block_hashes
from asyncdp.dp.peers.sglang import SglangCacheAwarePolicy
from asyncdp.dp.policy import RankLoad, Snapshot
from asyncdp.errors import ConfigError
from tests.dp.peers.helpers import Router, prompt, req


def warmed(dp=2, **kw):
    """A router whose tree holds prompt(0, 40, 0, 10) for rank 0, with loads then set by the test."""
    r = Router(SglangCacheAwarePolicy(**kw), dp)
    r.route(req(prompt(0, 40, 0, 10)))
    assert r.state.tree.tree_units[0] == 200
    return r


@pytest.mark.parametrize(("load", "expected"), [
    ([100, 30], 1),    # 70 > 64 and 100 > 1.5*30: imbalanced, lowest load wins over the cached rank
    ([100, 40], 0),    # 60 <= 64: balanced, the cache wins
    ([300, 210], 0),   # 90 > 64 but 300 <= 1.5*210: the relative guard keeps it balanced
    ([65, 0], 1),      # 65 > 64 and 65 > 0
    ([64, 0], 0),      # 64 is not > 64
])
def test_imbalance_needs_both_the_absolute_and_the_relative_threshold(load, expected):
    r = warmed()
    r.state.load = list(load)
    assert r.route(req(prompt(0, 40, 1, 10))) == expected


@pytest.mark.parametrize(("suffix_len", "expected"), [(7, 1), (6, 0)])
def test_cache_threshold_is_strict_over_the_match_fraction_in_chars(suffix_len, expected):
    r = Router(SglangCacheAwarePolicy(), 2)
    r.route(req([1, 2, 3]))  # rank 0 holds a 3-token (12-char) prompt
    r.state.load, r.state.processed = [0, 0], [2, 1]  # lo is rank 1
    tokens = [1, 2, 3] + [4000 + k for k in range(suffix_len)]
    matched, _ = r.state.tree.match(req(tokens).text)
    assert matched == 12
    # 3 of 10 tokens is 0.3, not > 0.3: a miss, to lo; 3 of 9 is above it: rank 0 owns the prefix
    assert r.route(req(tokens)) == expected


def test_lowest_load_breaks_ties_by_processed_count_then_index():
    r = Router(SglangCacheAwarePolicy(), 3)
    r.state.processed = [5, 2, 2]
    assert r.route(req([1, 2, 3])) == 1
    r.state.load, r.state.processed = [1, 1, 0], [0, 0, 9]
    assert r.route(req([4, 5, 6])) == 2


def test_the_owner_is_the_most_recent_one_and_the_prompt_is_inserted_in_the_imbalanced_branch():
    r = warmed(dp=3)
    r.state.load = [100, 100, 0]
    assert r.route(req(prompt(0, 40, 5, 10)), now_us=5) == 2  # imbalanced: lo; still inserted for rank 2
    r.state.load = [0, 0, 0]
    assert r.route(req(prompt(0, 40, 6, 10)), now_us=6) == 2  # the prefix's most recent owner is rank 2
    r.state.load = [0, 0, 0]
    _, node = r.state.tree.match(req(prompt(0, 40, 7, 10)).text)
    node.owners[0] = node.owners[2]  # same access time: the lowest rank wins the tie [ours]
    assert r.route(req(prompt(0, 40, 7, 10)), now_us=7) == 0


def test_load_counts_dispatches_until_finish():
    p = SglangCacheAwarePolicy()
    r = Router(p, 2)
    a = req([1] * 8)
    r.route(a)
    assert r.state.load == [1, 0] and r.state.processed == [1, 0]
    p.on_first_token(r.state, a.req_id, 0, 1)
    assert r.state.load == [1, 0]
    p.on_finish(r.state, a.req_id, 0, 2)
    assert r.state.load == [0, 0] and r.state.processed == [1, 0]


def test_first_token_guard_counts_load_from_the_first_token_only():
    p = SglangCacheAwarePolicy(load_guard_at="first_token")
    assert p.processed_tiebreak is False
    r = Router(p, 2)
    a = req([1] * 8)
    r.route(a)
    assert r.state.load == [0, 0]
    p.on_first_token(r.state, a.req_id, 0, 1)
    assert r.state.load == [1, 0]
    p.on_finish(r.state, a.req_id, 0, 2)
    assert r.state.load == [0, 0]


def test_smallest_tree_miss_policy_ignores_load():
    r = Router(SglangCacheAwarePolicy(miss_policy="smallest_tree"), 2)
    r.state.tree.insert("x" * 50, 1, 0)
    r.state.load = [10, 0]
    assert r.route(req([9] * 4)) == 0  # rank 0's tree is smaller, though it is far busier


def test_rust_defaults_preset_values():
    p = PEER_POLICIES["sglang_cache_aware@rust_defaults"]()
    assert isinstance(p, SglangCacheAwarePolicy)
    assert (p.cache_threshold, p.abs_thr, p.rel_thr, p.max_tree_size) == (0.5, 32, 1.1, 10_000)
    assert p.timer_period_us == 30_000_000 and p.name == "sglang_cache_aware@rust_defaults"
    d = PEER_POLICIES["sglang_cache_aware"]()
    assert isinstance(d, SglangCacheAwarePolicy)
    assert (d.cache_threshold, d.abs_thr, d.rel_thr, d.timer_period_us) == (0.3, 64, 1.5, 60_000_000)


def test_eviction_timer_trims_each_owner_to_max_tree_size():
    p = SglangCacheAwarePolicy(max_tree_size=100)
    r = Router(p, 1)
    for k in range(5):
        r.route(req(prompt(k, 10, k, 0)), now_us=k)  # 40 chars each, sharing a few leading chars
    assert r.state.tree.tree_units[0] > 150
    p.on_timer(r.state, 10)
    assert 60 < r.state.tree.tree_units[0] <= 100
    assert r.state.tree.match(req(prompt(4, 10, 4, 0)).text)[0] == 40  # the most recent prompt stays
    assert r.state.tree.match(req(prompt(0, 10, 0, 0)).text)[0] < 40  # the oldest went first


def test_kv_triggers_make_a_kv_spread_imbalanced():
    r = warmed(balance_token_usage_threshold=0.5)
    r.state.processed = [1, 0]
    r.snapshot(Snapshot((RankLoad(kv_usage=0.9), RankLoad(kv_usage=0.1))))
    assert r.route(req(prompt(0, 40, 1, 10))) == 1


def test_events_flavour_picks_the_largest_exact_overlap_then_lowest_load():
    p = SglangCacheAwarePolicy(events=True)
    r = Router(p, 3)
    toks = list(range(64))
    hs = block_hashes(toks, 16)
    p.on_kv_event(r.state, KvEvent(1, "stored", tuple(hs[:2])))
    p.on_kv_event(r.state, KvEvent(2, "stored", tuple(hs[:3])))
    assert r.route(req(toks)) == 2
    p.on_kv_event(r.state, KvEvent(1, "stored", tuple(hs)))
    p.on_kv_event(r.state, KvEvent(2, "stored", (hs[3],)))
    r.state.load = [0, 1, 0]
    assert r.route(req(toks)) == 2  # equal overlap: lower load
    r.state.load = [0, 0, 0]
    assert r.route(req(list(range(100, 132)))) == 0  # no overlap: lo


def test_dead_owner_is_forgotten():
    p = SglangCacheAwarePolicy()
    r = warmed(dp=2)
    r.state.processed = [0, 5]
    p.on_rank_dead(r.state, 0)
    assert r.state.tree.tree_units[0] == 0
    assert r.route(req(prompt(0, 40, 3, 10))) == 1


def test_bad_knobs_are_config_errors():
    with pytest.raises(ConfigError):
        SglangCacheAwarePolicy(load_guard_at="later")
    with pytest.raises(ConfigError):
        SglangCacheAwarePolicy(miss_policy="biggest_tree")
