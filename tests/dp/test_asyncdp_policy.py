"""Conformance vectors for asyncdp's own policy (``asyncdp``, asyncdp/dp/asyncdp_policy.py), hand-computed.

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
from tests.dp.asyncdp_requests import INF, prompt, route, snapshot


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


@pytest.mark.parametrize("spread, spread_tokens, expected", [(False, INF, 0), (True, INF, 2), (True, 16.0, 2),
                                                             (True, 8.0, 0)])
def test_spread_sends_a_new_prompt_to_the_fewest_prefixes_among_ranks_within_one_prefill(spread, spread_tokens,
                                                                                         expected):
    # spread_tokens (asyncdp@spread512): "within" means within min(the prompt, spread_tokens) of the cheapest rank:
    # rank 2's one decoding request (16 tokens) is within 16 tokens of the idle rank, not within 8
    p = AsyncdpPolicy(memory_tokens=0, phase_spread=0, spread=spread, spread_tokens=spread_tokens)
    s = p.init(3)

    def place(rank: int, prefix_id: int, length: int = 64, finish: str = "yes") -> None:
        req = prompt(prefix_id, prefix=tuple(range(prefix_id * 1000, prefix_id * 1000 + length)))
        route(p, s, req, hint=rank)
        if finish == "yes":
            p.on_finish(s, req.req_id, rank, 1)
        elif finish == "decoding":
            p.on_first_token(s, req.req_id, rank, 1)

    for k in (1, 2, 3):
        place(0, k)  # rank 0: idle, 3 prefixes
    place(1, 4, length=400, finish="no")  # rank 1: 1 prefix, a 416-token prefill pending: more than one prefill
    place(2, 5)
    place(2, 6, finish="decoding")  # rank 2: 2 prefixes, one decoding request (16 tokens): within one prefill
    assert [len(r) for r in s.index.roots] == [3, 1, 2]
    new = prompt(7, prefix=tuple(range(7000, 7064)))  # 80 tokens, held by no rank
    assert route(p, s, new, now_us=2) == expected  # vllm-like: the idle rank; spread: fewer prefixes, not rank 1
    assert len(s.index.roots[expected]) == {0: 4, 2: 3}[expected]


@pytest.mark.parametrize("gated, hot, distinct, cooled, expected", [
    (True, False, 37, False, 1), (True, True, 37, False, 0), (True, False, 301, False, 0), (False, True, 37, False, 1),
    (True, True, 37, True, 1)])
def test_spread_applies_only_while_no_prefix_is_hot_and_most_recent_prompts_were_not_new(gated, hot, distinct,
                                                                                           cooled, expected):
    # Counting prefixes evens out the load where prefixes recur about equally often (W2's 150 groups). Not once one
    # prefix began a quarter of a rank's share of the recent requests (W7's top documents), nor where most recent
    # prompts were new (W9: nothing recurs, the phase weights place them): there a new prompt goes to the cheapest
    # rank by load; once no request of about the last 256 began with a hot prefix, it spreads again. The ungated
    # presets (asyncdp@spread, @spread512) spread all the same.
    p = AsyncdpPolicy(memory_tokens=0, phase_spread=0, spread_gated=gated)
    s = p.init(2)

    def place(rank: int, prefix_id: int) -> None:
        req = prompt(prefix_id, prefix=tuple(range(prefix_id * 1000, prefix_id * 1000 + 64)))
        route(p, s, req, hint=rank)
        p.on_finish(s, req.req_id, rank, 1)

    place(0, 1)
    place(0, 2)
    for k in range(3, 3 + distinct):  # each prefix once: none hot; 37 new prompts of 39, or 301 of 303
        place(1, k) if k % 2 else place(0, k)
    assert (s.phase_scale > 0) is (distinct > 100)
    for _ in range(40 if hot else 0):  # prefix 3 begins 41 of the last ~80 requests: hot
        place(1, 3)
    assert bool(s.hot) is hot
    for k in range(300 if cooled else 0):  # 300 requests of the other prefixes, none hot: the hot one went cold
        place(1, 5 + 2 * (k % 10)) if k % 2 else place(0, 4 + 2 * (k % 10))
    assert bool(s.hot) is hot  # it is still marked (until it is sent again), but no recent request was hot
    decoding = prompt(5, prefix=tuple(range(5000, 5064)))
    route(p, s, decoding, hint=1)
    p.on_first_token(s, decoding.req_id, 1, 1)  # rank 1 is 16 tokens busier than rank 0, within 512 of it
    assert len(s.index.roots[0]) == len(s.index.roots[1]) + 1  # and holds one prefix fewer
    assert route(p, s, prompt(9, prefix=tuple(range(999_000, 999_064))), now_us=2) == expected


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


def decode_on(p: AsyncdpPolicy, s: AsyncdpState, req: RequestView, rank: int) -> None:
    """Send ``req`` to ``rank`` (a hint) and let it produce its first token: it is decoding there."""
    route(p, s, req, hint=rank)
    p.on_first_token(s, req.req_id, rank, 1)


def long_prompt(tail: int, length: int) -> RequestView:
    """A prompt of ``length`` tokens that shares nothing with the others (its first token is ``tail``)."""
    return RequestView(f"long{tail}", (tail, *range(50_000 + tail * 100_000, 50_000 + tail * 100_000 + length - 1)))


def test_a_decoding_request_weighs_more_the_longer_its_prompt():
    p = AsyncdpPolicy()  # the default
    assert [p.decode_weight(n) for n in (1, 4096, 6144, 8192, 16_384, 65_536)] == [16, 16, 24, 32, 64, 64]
    ctx = make_policy("asyncdp@ctx_decode")  # the preset that introduced it, kept as an alias of the default
    assert isinstance(ctx, AsyncdpPolicy) and ctx.decode_ref_tokens == p.decode_ref_tokens
    flat = make_policy("asyncdp@flat_decode")  # every decoding request weighs the same
    assert isinstance(flat, AsyncdpPolicy) and flat.decode_weight(65_536) == 16
    with pytest.raises(ConfigError, match="decode_ref_tokens"):
        AsyncdpPolicy(decode_ref_tokens=-1)


@pytest.mark.parametrize(("ref", "expected"), [(4096.0, 1), (0.0, 0)])
def test_a_long_context_decode_outweighs_several_short_ones(ref, expected):
    # rank 0: one decoding request with a 16 384-token prompt (4·16 = 64 tokens of load; 16 when every decoding
    # request weighs the same); rank 1: three with 80-token prompts (48). A new prompt goes to the lighter one.
    p = AsyncdpPolicy(memory_tokens=0, decode_ref_tokens=ref)
    s = p.init(2)
    decode_on(p, s, long_prompt(1, 16_384), 0)
    for k in range(3):
        decode_on(p, s, prompt(10 + k), 1)
    assert s.base == [16.0, 48.0]  # the cost a hit is weighed against stays flat (next test)
    assert s.hbase == ([64.0, 48.0] if ref else [16.0, 48.0])  # what new prompts and a prefix's holders compare
    assert route(p, s, long_prompt(2, 80), now_us=2) == expected


def test_a_hit_weighs_its_holders_decodes_flat_against_the_cheapest_other_rank():
    # rank 0 holds a 16 384-token prefix and decodes 10 requests with it: 10·1 000 = 10 000 tokens of load flat,
    # 40 000 scaled by their context; the hit saves 2·16 384 = 32 768. Weighed flat the hit stays on its holder;
    # weighed scaled it would leave for the idle rank 1 and pay the whole prompt again. Past capacity every rank
    # is loaded like this, and hits leaving their holders spiral into misses (W2 at full scale, docs).
    p = AsyncdpPolicy(memory_tokens=0, decode_tokens=1000, decode_ref_tokens=4096)
    s = p.init(2)
    doc = long_prompt(1, 16_384).tokens
    for k in range(10):
        decode_on(p, s, RequestView(f"d{k}", (*doc, *range(k * 16, k * 16 + 16))), 0)
    assert s.base[0] == 10_000 and s.hbase[0] == 40_000
    assert route(p, s, RequestView("q", (*doc, *range(900, 916))), now_us=2) == 0


def test_the_decode_weights_leave_no_residue_when_the_requests_finish():
    p = AsyncdpPolicy(memory_tokens=0, decode_ref_tokens=4096)
    s = p.init(2)
    reqs = [long_prompt(k, 4096 + 1000 * k) for k in range(1, 8)]  # weights 16·(5096/4096) ...: inexact floats
    for req in reqs:
        decode_on(p, s, req, 0)
    assert s.dec_tokens[0] == pytest.approx(sum(p.decode_weight(r.prompt_len) for r in reqs))
    for req in reqs:
        p.on_finish(s, req.req_id, 0, 2)
    assert s.dec_tokens == [0.0, 0.0] and s.decoding == [0, 0] and s.base == [0.0, 0.0]


def _stalling(rate: float = 16384.0) -> tuple[AsyncdpPolicy, AsyncdpState]:
    p = AsyncdpPolicy(memory_tokens=0, phase_spread=0, stall_tokens_per_s=rate, stall_grace_s=2.0)
    s = p.init(4)
    first = prompt(1)
    route(p, s, first, hint=0)  # the prefix is on rank 0
    p.on_first_token(s, first.req_id, 0, 1)
    return p, s


def test_hits_leave_a_rank_whose_requests_wait_past_the_grace_for_their_first_token():
    p, s = _stalling()
    stuck = prompt(2)
    assert route(p, s, stuck, now_us=10) == 0  # a hit: pending 16 tokens there
    assert route(p, s, prompt(3), now_us=2_000_000) == 0  # waited 2 s: within the grace
    assert s.stalls.terms == [0.0] * 4
    # 3.5 s: 1.5 s past the grace, 24 576 tokens at 16 384 a second; the hit saves 2·64
    p.on_first_token(s, "nobody", 0, 3_500_000)  # any hook refreshes the stall terms
    assert route(p, s, prompt(4), now_us=3_500_010) == 1
    assert s.stalls.terms[0] == pytest.approx(1.5 * 16384, rel=1e-3) and s.stalls.terms[1:] == [0.0] * 3


def test_a_stall_ends_with_the_first_token_of_the_request_that_waited():
    p, s = _stalling()
    stuck = prompt(2)
    route(p, s, stuck, now_us=10)
    p.on_first_token(s, "nobody", 0, 3_000_000)  # a hook at 3 s: rank 0 stalls
    assert s.stalls.terms[0] > 0
    p.on_first_token(s, stuck.req_id, 0, 3_100_000)
    assert s.stalls.terms == [0.0] * 4
    assert route(p, s, prompt(3), now_us=3_200_000) == 0


def test_a_backlog_on_every_rank_is_no_stall_of_any():
    """Overload: half the ranks or more have a request waiting past the grace. Moving hits off them would replicate
    their prefixes onto the few ranks left, evicting others, into a spiral of misses: no stall counts."""
    p, s = _stalling()
    route(p, s, prompt(2), now_us=10)  # rank 0
    route(p, s, prompt(3, prefix=tuple(range(5000, 5064))), now_us=2_000_000, hint=1)  # rank 1, 2 s younger
    p.on_first_token(s, "nobody", 0, 5_000_000)
    assert s.stalls.terms == [0.0] * 4
    assert route(p, s, prompt(4), now_us=5_000_010) == 0


def test_the_stall_term_is_off_by_default():
    p = AsyncdpPolicy()
    s = p.init(4)
    route(p, s, prompt(2), now_us=10)
    route(p, s, prompt(3), now_us=60_000_000)
    assert s.stalls.terms == [0.0] * 4 and not any(s.stalls.waiting)


def test_the_stall_preset_turns_the_term_on_and_bad_values_are_refused():
    p = make_policy("asyncdp@stall")
    assert isinstance(p, AsyncdpPolicy)
    assert p.stall_tokens_per_s == 16384.0 and p.stall_grace_us == 1_000_000
    with pytest.raises(ConfigError):
        AsyncdpPolicy(stall_tokens_per_s=-1.0)
