"""`llmd_weighted` conformance (routing-bench §2.8): score arithmetic, the match walk, ties, staleness, presets."""

from __future__ import annotations

import pytest

from asyncdp.dp.peers import PEER_POLICIES
from asyncdp.dp.peers.events import KvEvent
from asyncdp.dp.peers.hashing import block_hashes
from asyncdp.dp.peers.llmd import LlmdWeightedPolicy
from asyncdp.dp.policy import Decision, RankLoad, Snapshot
from tests.dp.peers.helpers import Router, req

A = list(range(100, 116))  # one 16-token block (64 chars)
B = list(range(200, 216))
C = list(range(300, 316))


def snap(rows, at_us=0):
    return Snapshot(tuple(RankLoad(waiting=w, kv_usage=kv, sampled_at_us=at_us) for w, kv in rows))


def test_score_arithmetic_of_the_default_weights():
    p = LlmdWeightedPolicy()
    r = Router(p, 3)
    p.on_dispatch(r.state, req(A), Decision(0), 0)  # rank 0 holds block A
    p.on_dispatch(r.state, req(A + B), Decision(2), 0)  # rank 2 holds A, A+B
    r.snapshot(snap([(4, 0.5), (0, 0.9), (2, 0.1)]))
    s = p.scores(req(A + B), r.state, [0, 1, 2], now_us=0)
    # queue [0, 1, 0.5], kv [0.5, 0.1, 0.9], prefix [1/2, 0, 2/2]
    assert s == pytest.approx({0: 2 * 0 + 2 * 0.5 + 3 * 0.5, 1: 2 * 1 + 2 * 0.1, 2: 2 * 0.5 + 2 * 0.9 + 3 * 1})
    assert r.route(req(A + B)) == 2


def test_the_match_walk_stops_at_the_first_hash_no_rank_holds():
    p = LlmdWeightedPolicy(queue=0, kv_util=0, prefix=1)
    r = Router(p, 2)
    hs = p.prompt_hashes(req(A + B + C))
    r.state.index.insert(1, [hs[0], hs[2]])  # nobody holds block 2 of 3
    r.state.index.insert(0, [hs[0]])
    assert p.prefix_scores(req(A + B + C), r.state, [0, 1]) == {0: pytest.approx(1 / 3), 1: pytest.approx(1 / 3)}


def test_queue_score_is_one_when_all_fresh_ranks_wait_equally_and_stale_ranks_score_zero():
    p = LlmdWeightedPolicy(prefix=0)
    r = Router(p, 2)
    r.snapshot(snap([(3, 0.0), (3, 0.0)], at_us=1_000_000))
    assert p.scores(req(A), r.state, [0, 1], now_us=1_000_000) == {0: 4.0, 1: 4.0}
    assert p.scores(req(A), r.state, [0, 1], now_us=3_000_001) == {0: 0.0, 1: 0.0}  # > 2 s old
    assert p.scores(req(A), r.state, [0, 1], now_us=3_000_000) == {0: 4.0, 1: 4.0}


def test_staleness_threshold_comes_from_params():
    p = LlmdWeightedPolicy(prefix=0)
    r = Router(p, 1, params={"staleness_threshold_ms": 50})
    r.snapshot(snap([(0, 0.0)]))
    assert p.scores(req(A), r.state, [0], now_us=50_001) == {0: 0.0}


def test_ties_are_broken_uniformly_at_random_with_the_given_rng():
    picks = {Router(LlmdWeightedPolicy(), 4, seed=s).route(req(A)) for s in range(40)}
    assert picks == {0, 1, 2, 3}
    assert Router(LlmdWeightedPolicy(), 4, seed=7).route(req(A)) == Router(LlmdWeightedPolicy(), 4, seed=7).route(req(A))


def test_dispatch_inserts_the_first_256_blocks_into_a_bounded_lru():
    p = LlmdWeightedPolicy(lru_capacity_per_rank=3)
    r = Router(p, 1)
    r.route(req(list(range(16 * 300))))
    assert r.state.index.size(0) == 3
    p2 = LlmdWeightedPolicy()
    r2 = Router(p2, 1)
    r2.route(req(list(range(16 * 300))))
    assert r2.state.index.size(0) == 256


def test_block64_and_autotune_presets():
    p = PEER_POLICIES["llmd_weighted@block64"]()
    assert isinstance(p, LlmdWeightedPolicy) and p.block_chars == 256
    assert len(p.prompt_hashes(req(list(range(64 * 2 + 10))))) == 2
    t = PEER_POLICIES["llmd_weighted@autotune"]()
    assert isinstance(t, LlmdWeightedPolicy)
    assert t.init(2, params={"kv_blocks_per_rank": 1234}).index.capacity == 1234


def test_precise_scores_the_leading_run_of_event_or_speculative_blocks():
    p = PEER_POLICIES["llmd_weighted@precise"]()
    assert isinstance(p, LlmdWeightedPolicy)
    assert (p.w_precise, p.w_kv, p.w_queue, p.w_prefix) == (2.0, 1.0, 1.0, 0.0)
    r = Router(p, 2)
    toks = A + B + C
    hs = block_hashes(toks, 16)
    p.on_kv_event(r.state, KvEvent(1, "stored", (hs[0], hs[2])))
    assert p.scores(req(toks), r.state, [0, 1], 0) == {0: 0.0, 1: pytest.approx(2 / 3)}
    assert r.route(req(toks), now_us=0) == 1  # writes speculative entries for rank 1
    assert p.scores(req(toks), r.state, [0, 1], 2_000_000)[1] == pytest.approx(2.0)
    assert p.scores(req(toks), r.state, [0, 1], 2_000_001)[1] == pytest.approx(2 / 3)  # TTL over


def test_prefix_affinity_filter_keeps_sticky_ranks_even_when_they_are_busier():
    p = LlmdWeightedPolicy(prefix_affinity_filter=True, prefix=0.1)
    r = Router(p, 2)
    p.on_dispatch(r.state, req(A + B), Decision(0), 0)
    r.snapshot(snap([(9, 0.9), (0, 0.0)]))
    picks = [Router.route(r, req(A + B)) for _ in range(20)]
    assert picks.count(0) >= 18  # only the 1 % skip can leave the sticky rank
    plain = Router(LlmdWeightedPolicy(prefix=0.1), 2)
    plain.policy.on_dispatch(plain.state, req(A + B), Decision(0), 0)
    plain.snapshot(snap([(9, 0.9), (0, 0.0)]))
    assert plain.route(req(A + B)) == 1
