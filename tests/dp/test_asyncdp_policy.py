"""Conformance vectors for asyncdp's own policy (``asyncdp``, asyncdp/dp/asyncdp_policy.py), hand-computed:
affinity against load, the hot-spot bound, keys, snapshots from other routers, the KV penalty, hints, dead
ranks and the bounded index. Its other subjects have their own modules (tests/dp/test_asyncdp_*.py): spread,
decode weights, stalls, hot prefixes, phases.

Prompts are 16-token blocks (the policy's block size). Unless stated the cost is
``pending + 16·decoding + others + kv_penalty + prompt_len - 2·credit`` per rank (module docstring); the
memory term is off (``memory_tokens=0``) except in its own test."""

from __future__ import annotations

import random

import pytest

from asyncdp.dp.asyncdp_policy import AsyncdpPolicy, AsyncdpState, prompt_hashes
from asyncdp.dp.balance import LoadBalancer, make_policy
from asyncdp.dp.policy import Decision, RequestView
from asyncdp.errors import ConfigError, UnavailableError
from tests.dp.asyncdp_requests import decode_on, prompt, route, snapshot


def test_make_policy_builds_asyncdp_and_the_balancer_accepts_it():
    assert make_policy("asyncdp").name == "asyncdp"
    assert getattr(make_policy("asyncdp@spread"), "spread", None) is True
    assert getattr(make_policy("asyncdp@spread512"), "spread_tokens", None) == 512.0
    assert getattr(make_policy("asyncdp@spread512"), "spread_gated", None) is False
    assert getattr(make_policy("asyncdp@no_spread"), "spread", None) is False
    lb = LoadBalancer([0, 1], policy="asyncdp")
    assert lb.select("a", list(range(40))) in (0, 1)


def test_a_prefix_hit_wins_over_a_slightly_lighter_rank():
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(2)
    first = prompt(1)
    assert route(p, s, first, hint=0) == 0
    p.on_first_token(s, first.req_id, 0, 1)  # rank 0: one decoding request, 16 tokens; rank 1: idle
    assert s.base == [16.0, 0.0]
    # rank 0: 16 + 80 - 2·64 (4 blocks hit) = -32; rank 1: 0 + 80 = 80
    assert route(p, s, prompt(2), now_us=2) == 0


def test_a_hit_loses_to_a_rank_lighter_by_more_than_the_hit():
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(2)
    for k in range(9):  # rank 0: nine decoding requests = 144 tokens of load
        req = prompt(10 + k)
        route(p, s, req, hint=0)
        p.on_first_token(s, req.req_id, 0, 1)
    # rank 0: 144 + 80 - 2·64 = 96; rank 1: 80
    assert route(p, s, prompt(2), now_us=2) == 1


def test_the_hot_spot_bound_overrides_affinity():
    # decoding costs nothing: the bound alone, for every prefix (hot_share=0; the next test gates it by demand)
    p = AsyncdpPolicy(decode_tokens=0, hot_ratio=1.5, hot_slack=4, hot_share=0)
    s = p.init(4)
    for k in range(5):
        req = prompt(10 + k)
        route(p, s, req, hint=0)
        p.on_first_token(s, req.req_id, 0, 1)
    # load [5,0,0,0]: mean 1.25, cap max(1.5·1.25, 1.25+4) = 5.25 >= 5: the hit still counts
    assert route(p, s, prompt(2), now_us=2) == 0
    p.on_first_token(s, prompt(2).req_id, 0, 3)
    for k in range(2):
        req = prompt(20 + k)
        route(p, s, req, hint=0)
        p.on_first_token(s, req.req_id, 0, 4)
    # load [8,0,0,0]: mean 2, cap max(3, 6) = 6 < 8: rank 0 is priced as a miss, so the prefix is replicated
    assert route(p, s, prompt(3), now_us=5) != 0


def test_the_hot_spot_bound_holds_only_for_a_prefix_hot_enough_to_make_its_holder_hot():
    def busy_rank_0(p: AsyncdpPolicy, hits: int) -> AsyncdpState:
        s = p.init(4)
        for k in range(hits):
            req = prompt(10 + k)
            route(p, s, req, hint=0)
            p.on_first_token(s, req.req_id, 0, 1)
        return s

    # load [8,0,0,0]: mean 2, cap max(3, 6) = 6 < 8, as above. But the prefix began 8 of this router's last ~256
    # requests: 8/256·4 = 0.125 of a rank's share, under hot_share 0.25. Its hit stays on rank 0: a replica would
    # pay a whole prefill and relieve nothing (rank 0 would be as busy from its other work)
    p = AsyncdpPolicy(decode_tokens=0, hot_ratio=1.5, hot_slack=4)
    s = busy_rank_0(p, 8)
    assert s.load[0] > s.cap and prompt_hashes(prompt(3), 16)[0] not in s.hot
    assert route(p, s, prompt(3), now_us=5) == 0
    # the bound for every prefix (hot_share=0, the preset asyncdp@bound_all) moves the same request off rank 0
    assert getattr(make_policy("asyncdp@bound_all"), "hot_share", None) == 0
    p0 = AsyncdpPolicy(decode_tokens=0, hot_ratio=1.5, hot_slack=4, hot_share=0)
    assert route(p0, busy_rank_0(p0, 8), prompt(3), now_us=5) != 0
    # 20 requests of it (19.3 after the decay): 0.30 of a rank's share, so the bound holds and the hit is replicated
    s = busy_rank_0(p, 20)
    assert s.load[0] > s.cap and prompt_hashes(prompt(3), 16)[0] in s.hot
    assert route(p, s, prompt(3), now_us=5) != 0
    with pytest.raises(ConfigError, match="hot_share"):
        AsyncdpPolicy(hot_share=-1)


def test_ties_keep_affinity_for_a_key_across_routers_and_spread_different_keys():
    p = AsyncdpPolicy(memory_tokens=0)
    picks = {route(p, p.init(4, j, 2), prompt(1, key="conversation-7")) for j in range(2)}
    assert len(picks) == 1  # an idle cluster: every rank ties; the key decides, the same for both routers
    s = p.init(4)
    again = [route(p, s, prompt(1, key="conversation-7")) for _ in range(1)]
    assert again == list(picks)
    spread = {route(p, p.init(4), prompt(k, key=f"user-{k}")) for k in range(32)}
    assert spread == {0, 1, 2, 3}


def test_two_api_servers_do_not_herd_onto_one_rank_in_one_snapshot_window():
    p = AsyncdpPolicy(memory_tokens=0)
    states = [p.init(4, j, 2) for j in range(2)]
    snap = snapshot((0, 0, 0.0), (0, 0, 0.0), (0, 0, 0.0), (0, 0, 0.0))
    per_rank = [0] * 4
    for j, s in enumerate(states):
        p.on_snapshot(s, snap)
        for k in range(4):  # distinct prompts without a shared prefix
            req = RequestView(f"c{j}-{k}", tuple(range(5000 * (4 * j + k + 1), 5000 * (4 * j + k + 1) + 48)))
            per_rank[route(p, s, req)] += 1
    assert per_rank == [2, 2, 2, 2]


def test_a_stale_snapshot_decays_to_the_local_counters():
    p = AsyncdpPolicy(memory_tokens=0, spread=False)  # the load alone decides (spread would count prefixes)
    s = p.init(2)
    local = prompt(1, prefix=tuple(range(7000, 7064)))
    route(p, s, local, hint=1)
    p.on_first_token(s, local.req_id, 1, 0)  # rank 1: one decoding request of ours (16 tokens)
    p.on_snapshot(s, snapshot((10, 0, 0.0), (0, 1, 0.0), at_us=0))  # rank 0: 10 waiting requests of others
    fresh = RequestView("fresh", tuple(range(9000, 9040)))
    assert p.select(fresh, None, s, 100_000, random.Random(0)).dp_rank == 1
    # 3 s later (past the 2 s staleness threshold) the others' work no longer counts: rank 0 is cheaper
    assert p.select(fresh, None, s, 3_000_000, random.Random(0)).dp_rank == 0


def test_snapshots_reconcile_with_local_counts_instead_of_overwriting_them():
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(2)
    a = RequestView("a", tuple(range(40)))
    route(p, s, a, hint=0)  # ours, waiting on rank 0
    p.on_snapshot(s, snapshot((1, 0, 0.0), (0, 0, 0.0)))  # the snapshot shows exactly our request
    assert s.others_cnt == [0, 0]
    assert s.pending == [40, 0]  # the local counter survives the snapshot


def test_this_routers_preempted_requests_are_not_counted_as_other_routers_work():
    # Three of our requests decode on rank 0; the engine preempted two of them, so its snapshot shows them as
    # waiting. They are ours, counted as decoding here: no other router's work is on rank 0. Counting the waiting
    # ones apart from the running ones read them as strangers' queued prompts, which, in a preemption storm past
    # capacity, pushed hits off their holders (W2 at full scale, docs).
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(2)
    for k in range(3):
        decode_on(p, s, prompt(20 + k), 0)
    p.on_snapshot(s, snapshot((2, 1, 0.0), (0, 0, 0.0)))
    assert s.others_cnt == [0, 0] and s.others_tok == [0.0, 0.0]
    # another router's queued request on top of them still counts, as waiting work
    p.on_snapshot(s, snapshot((3, 1, 0.0), (0, 0, 0.0)))
    assert s.others_cnt == [1, 0] and s.others_tok[0] == s.avg_prefill > 0


def test_other_routers_waiting_requests_on_a_rank_out_of_kv_are_not_priced_as_prefill():
    # With several routers, a rank that ran out of KV preempts everyone's requests: its waiting queue is mostly
    # other routers' preempted requests, queued for memory. Priced as prefill (this router's average uncached
    # prompt each) they sent hits off the filling rank as misses, each a new copy of its prefix on a rank that was
    # filling too (W2 at R = 4, docs). Above 90 % KV they weigh as decoding requests; below it, as before.
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(2, 0, 4)
    s.avg_prefill, s.avg_decode = 400.0, 20.0  # this router's averages (of its own requests)
    p.on_snapshot(s, snapshot((6, 4, 0.95), (6, 4, 0.85), at_us=0))  # 10 requests of others on each rank
    assert s.others_cnt == [10, 10]
    assert s.others_tok == [10 * 20.0, 6 * 400.0 + 4 * 20.0]  # above 90 % KV all as decoding; below, 6 as prefill


def test_a_nearly_full_kv_cache_is_penalised():
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(2)
    p.on_snapshot(s, snapshot((0, 0, 0.95), (0, 0, 0.5)))
    assert s.base == [pytest.approx(2048.0), 0.0]  # 4096 · (0.95 - 0.9) / 0.1


def test_hinted_requests_bypass_the_policy_but_count_as_load():
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(2)
    req = RequestView("h", tuple(range(40)), rank_hint=1)
    d = p.select(req, None, s, 0, random.Random(0))
    assert d == Decision(1, hinted=True)
    p.on_dispatch(s, req, d, 0)
    assert s.pending == [0, 40]
    p.on_finish(s, "h", 1, 1)
    assert s.pending == [0, 0] and s.base == [0.0, 0.0]


def test_dead_ranks_are_skipped_and_forgotten_by_the_index():
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(2)
    route(p, s, prompt(1), hint=0)
    p.on_rank_dead(s, 0)
    assert route(p, s, prompt(2)) == 1
    assert all(not mask & 1 for mask in s.owners.values())
    p.on_rank_dead(s, 1)
    with pytest.raises(UnavailableError):
        p.select(prompt(3), None, s, 0, random.Random(0))


def test_the_index_is_bounded_per_rank_and_evicts_tails_first():
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(1, params={"kv_blocks_per_rank": 6})
    first, second = prompt(1), prompt(2, prefix=tuple(range(3000, 3064)))  # 5 blocks each
    route(p, s, first)
    route(p, s, second)  # 10 blocks > 6: the first prompt's 4 tail blocks go, its root stays
    assert len(s.lru[0]) == 6
    assert s.index.match(0, prompt_hashes(first, 16)) == 1
    assert s.index.match(0, prompt_hashes(second, 16)) == 5


def test_a_new_prefix_goes_to_the_rank_whose_index_is_emptier():
    p = AsyncdpPolicy(memory_tokens=4096)
    s = p.init(2, params={"kv_blocks_per_rank": 10})
    first = prompt(1)
    route(p, s, first, hint=0)
    p.on_finish(s, first.req_id, 0, 1)  # rank 0 idle again, but its index holds 5 of 10 blocks
    assert s.base == [pytest.approx(2048.0), 0.0]
    assert route(p, s, prompt(2, prefix=tuple(range(4000, 4064)))) == 1


def test_engine_params_reach_the_policy_before_the_first_decision_and_are_refused_after_it():
    lb = LoadBalancer([0, 1], policy="asyncdp")
    lb.mark_dead(1)
    assert lb.set_engine_params({"kv_blocks_per_rank": 100, "block_size_tokens": 32})
    assert (lb.state.capacity, lb.state.block_size, lb.state.excluded) == (100, 32, {1})  # dead rank kept
    assert lb.select("a", list(range(40))) == 0
    assert not lb.set_engine_params({"kv_blocks_per_rank": 50})  # in-flight accounting would be lost
    assert lb.state.capacity == 100


def test_holders_of_the_whole_run_compare_by_load_not_by_memory():
    p = AsyncdpPolicy(memory_tokens=4096)
    s = p.init(2, params={"kv_blocks_per_rank": 100})
    for rank in (0, 1):
        req = prompt(1 + rank)
        route(p, s, req, hint=rank)
        p.on_finish(s, req.req_id, rank, 1)
    other = RequestView("other", tuple(range(5000, 5160)))  # 10 more blocks in rank 0's index
    route(p, s, other, hint=0)
    p.on_finish(s, other.req_id, 0, 2)
    busy = prompt(9, prefix=tuple(range(7000, 7016)))
    route(p, s, busy, hint=1)
    p.on_first_token(s, busy.req_id, 1, 3)  # rank 1: one decoding request (16 tokens)
    assert s.memory == [pytest.approx(4096 * 15 / 100), pytest.approx(4096 * 7 / 100)]
    assert s.base[0] > s.base[1]  # by the whole cost rank 1 is cheaper: its index is emptier
    assert route(p, s, prompt(3), now_us=4) == 0  # both hold the prefix: the idle one wins
