"""`dynamo_kv` conformance (routing-bench §2.9): the cost with shared blocks counted once, pending prefill,
output blocks, tie-breaks, temperature, and the presets."""

from __future__ import annotations

import random

import pytest

from asyncdp.dp.peers import PEER_POLICIES
from asyncdp.dp.peers.dynamo import DynamoKvPolicy
from asyncdp.dp.peers.events import KvEvent
from asyncdp.dp.peers.hashing import block_hashes
from asyncdp.dp.policy import Decision, RankLoad, Snapshot
from asyncdp.errors import ConfigError
from tests.dp.peers.helpers import Router, req

P = list(range(1000, 1048))  # 3 blocks of 16
H = block_hashes(P, 16)


def test_cost_counts_a_shared_prefix_once_and_adds_pending_prefill():
    p = DynamoKvPolicy()
    r = Router(p, 2)
    first = req(P[:32])
    r.state.reqs.clear()
    p.on_dispatch(r.state, first, Decision(0), 0)  # rank 0: pending 32 tokens, active {h0, h1}
    assert r.state.pending == [32, 0] and set(r.state.active[0]) == set(H[:2])
    c = p.costs(req(P), r.state, [0, 1], 0)
    # rank 0: prefill (32 + 48)/16 = 5, decode |{h0,h1} ∪ {h0,h1,h2}| = 3 -> 8; rank 1: 3 + 3 = 6
    assert c == {0: 8.0, 1: 6.0}
    p.on_first_token(r.state, first.req_id, 0, 1)
    assert p.costs(req(P), r.state, [0, 1], 1) == {0: 6.0, 1: 6.0}
    p.on_kv_event(r.state, KvEvent(0, "stored", tuple(H[:2])))
    # rank 0 now caches 2 blocks: prefill (48 - 32)/16 = 1, decode 3 -> 4
    assert p.costs(req(P), r.state, [0, 1], 1) == {0: 4.0, 1: 6.0}
    assert r.route(req(P)) == 0


def test_overlap_weight_zero_is_pure_load_balancing():
    p = DynamoKvPolicy(overlap_score_weight=0.0)
    r = Router(p, 2)
    p.on_kv_event(r.state, KvEvent(0, "stored", tuple(H)))
    assert p.costs(req(P), r.state, [0, 1], 0) == {0: 3.0, 1: 3.0}


def test_literal_2025_formula_ignores_earlier_pending_prefill():
    p = PEER_POLICIES["dynamo_kv@literal2025"]()
    assert isinstance(p, DynamoKvPolicy)
    r = Router(p, 2)
    p.on_dispatch(r.state, req(list(range(160))), Decision(0), 0)
    c = p.costs(req(P), r.state, [0, 1], 0)
    assert c[0] == 3.0 + 13.0 and c[1] == 6.0  # only decode blocks differ


def test_output_blocks_grow_per_block_of_generated_tokens_and_everything_is_released_at_finish():
    p = DynamoKvPolicy()
    assert p.needs_tokens
    r = Router(p, 1)
    a = req(P)
    r.route(a)
    p.on_first_token(r.state, a.req_id, 0, 1)
    for _ in range(5):
        p.on_tokens(r.state, a.req_id, 0, 7, 2)  # 35 tokens: 2 full blocks
    assert r.state.output_blocks == [2]
    p.on_finish(r.state, a.req_id, 0, 3)
    assert r.state.output_blocks == [0] and r.state.pending == [0] and not r.state.active[0]


def test_abort_before_the_first_token_releases_pending_prefill():
    p = DynamoKvPolicy()
    r = Router(p, 1)
    a = req(P)
    r.route(a)
    p.on_finish(r.state, a.req_id, 0, 1)
    assert r.state.pending == [0]


def test_ties_go_to_fewer_indexed_blocks_then_uniform_random():
    p = DynamoKvPolicy()
    r = Router(p, 3)
    p.on_kv_event(r.state, KvEvent(0, "stored", (1, 2, 3)))  # unrelated blocks: same cost, bigger index
    picks = {Router(p, 3, seed=s).route(req(P)) for s in range(30)}
    assert picks == {0, 1, 2}
    picks = set()
    for s in range(30):
        rr = Router(p, 3, seed=s)
        p.on_kv_event(rr.state, KvEvent(0, "stored", (1, 2, 3)))
        picks.add(rr.route(req(P)))
    assert picks == {1, 2}


def test_temperature_samples_by_normalised_cost_and_is_seeded():
    p = DynamoKvPolicy(temperature=0.5)
    r = Router(p, 2)
    p.on_kv_event(r.state, KvEvent(0, "stored", tuple(H)))
    picks = [p.select(req(P), None, r.state, 0, random.Random(s)).dp_rank for s in range(400)]
    # costs 3 (rank 0) and 6 (rank 1): p1/p0 = exp(-1/0.5) = 0.135
    assert 0.05 < picks.count(1) / 400 < 0.25
    again = [p.select(req(P), None, r.state, 0, random.Random(s)).dp_rank for s in range(400)]
    assert picks == again
    with pytest.raises(ConfigError):
        DynamoKvPolicy(temperature=-1)


def test_busy_threshold_excludes_ranks_above_it_unless_all_are():
    p = DynamoKvPolicy(busy_threshold=0.8)
    r = Router(p, 2)
    p.on_kv_event(r.state, KvEvent(0, "stored", tuple(H)))
    r.snapshot(Snapshot((RankLoad(kv_usage=0.9), RankLoad(kv_usage=0.5))))
    assert r.route(req(P)) == 1
    r.snapshot(Snapshot((RankLoad(kv_usage=0.9), RankLoad(kv_usage=0.95))))
    assert r.route(req(P)) == 0


def test_approx_treats_a_routed_prefix_as_cached_for_the_ttl():
    p = PEER_POLICIES["dynamo_kv@approx"]()
    assert isinstance(p, DynamoKvPolicy)
    r = Router(p, 2)
    a = req(P)
    first = r.route(a, now_us=0)  # a random tie on an empty cluster
    p.on_finish(r.state, a.req_id, first, 1)
    assert p.overlap(r.state, first, H, 120_000_000) == 3
    assert p.overlap(r.state, first, H, 120_000_001) == 0
    assert p.overlap(r.state, 1 - first, H, 0) == 0
    assert r.route(req(P), now_us=1000) == first


def test_2026_credit_applies_to_the_requests_own_blocks():
    p = PEER_POLICIES["dynamo_kv@credit1.5"]()
    assert isinstance(p, DynamoKvPolicy) and p.credit == 1.5
    r = Router(p, 2)
    p.on_kv_event(r.state, KvEvent(0, "stored", tuple(H[:1])))
    # own prefill blocks 3: rank 0 max(0, 3 - 1.5) = 1.5, rank 1 3; decode 3 each
    assert p.costs(req(P), r.state, [0, 1], 0) == {0: 4.5, 1: 6.0}
    q = PEER_POLICIES["dynamo_kv@2026"]()
    assert isinstance(q, DynamoKvPolicy)
    rq = Router(q, 2)
    q.on_kv_event(rq.state, KvEvent(0, "stored", tuple(H[:1])))
    assert q.costs(req(P), rq.state, [0, 1], 0) == {0: 5.0, 1: 6.0}


def test_early2025_logit():
    p = PEER_POLICIES["dynamo_kv@early2025"]()
    assert isinstance(p, DynamoKvPolicy)
    r = Router(p, 2)
    r.snapshot(Snapshot((RankLoad(waiting=4, kv_usage=0.5), RankLoad(waiting=2, kv_usage=0.25))))
    p.on_kv_event(r.state, KvEvent(0, "stored", tuple(H)))
    # logit rank 0: 2*1 - 0.5 - 4/4 = 0.5; rank 1: 0 - 0.25 - 2/4 = -0.75 (costs are the negated logits)
    assert p.costs(req(P), r.state, [0, 1], 0) == {0: -0.5, 1: 0.75}
    assert r.route(req(P)) == 0
    assert r.state.waiting == [5, 2]
