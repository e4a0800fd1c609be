"""The optional baselines of routing-bench §2.12 and ``power_of_two@ray``."""

from __future__ import annotations

import pytest

from asyncdp.dp.peers import PEER_POLICIES, RayPowerOfTwoPolicy
from asyncdp.dp.peers.optional import (
    ProdstackLoadAwarePolicy,
    ProdstackPrefixAwarePolicy,
    RayPrefixPolicy,
    SmgLeastLoadPolicy,
    SmgPrefixHashPolicy,
    VllmTokenPolicy,
)
from asyncdp.dp.policy import RankLoad, Snapshot
from tests.dp.peers.helpers import Router, prompt, req

DOC = prompt(1, 96, 0, 0)  # 384 chars: three 128-char chunks


def test_vllm_token_scores_pending_prefill_tokens_times_4_plus_running_tokens_and_bumps_by_prompt_len():
    r = Router(VllmTokenPolicy(), 2)
    r.snapshot(Snapshot((RankLoad(pending_prefill_tokens=100, running_tokens=0),
                         RankLoad(pending_prefill_tokens=0, running_tokens=300))))
    assert r.route(req([1] * 50)) == 1  # 400 vs 300
    assert r.state.waiting_tokens == [100, 50]  # 400 vs 500: rank 0 next
    assert r.route(req([1] * 50)) == 0
    r2 = Router(VllmTokenPolicy(), 2, router_index=1, num_routers=2)
    assert r2.state.start == 1
    r2.route(req([1] * 10))
    assert r2.state.waiting_tokens == [0, 20]  # the bump is prompt_len * C


def test_smg_least_load_is_jsq_on_inflight_before_any_report_then_tokens_over_throughput():
    p = SmgLeastLoadPolicy()
    r = Router(p, 2)
    assert [r.route(req([1] * 10)) for _ in range(3)] == [0, 1, 0]
    r.snapshot(Snapshot((RankLoad(waiting_uncached_tokens=1000, gen_tput_tok_s=4000.0, kv_usage=0.5),
                         RankLoad(waiting_uncached_tokens=500, gen_tput_tok_s=0.0, kv_usage=0.0))))
    # rank 0: 1000/4000 + 0.15*1 = 0.40; rank 1: 500/2000 = 0.25
    assert r.route(req([1] * 200)) == 1
    # rank 1 now has 200 sent tokens: 700/2000 = 0.35 < 0.40
    assert r.route(req([1] * 200)) == 1
    assert r.route(req([1] * 200)) == 0  # 900/2000 = 0.45 > 0.40
    r.snapshot(Snapshot((RankLoad(), RankLoad())))
    assert r.state.sent_tokens == [0, 0]


def test_smg_prefix_hash_keeps_a_prefix_on_its_ring_rank_until_it_is_overloaded():
    p = SmgPrefixHashPolicy()
    r = Router(p, 4)
    long_doc = prompt(2, 256, 0, 0)
    first = req(long_doc + [5])
    home = r.route(first)
    p.on_finish(r.state, first.req_id, home, 1)
    assert r.route(req(long_doc + [6])) == home  # only the first 256 tokens are hashed
    assert r.route(req(long_doc + [7])) != home  # 1 in flight > mean 0.25 * 1.25: the least loaded
    r.state.inflight = [0, 0, 0, 0]
    r.state.inflight[home] = 3  # mean 0.75, 3 > 0.94: overloaded
    assert r.route(req(long_doc)) != home


def test_prodstack_prefixaware_longest_chunk_match_then_lowest_qps():
    r = Router(ProdstackPrefixAwarePolicy(), 3)
    assert [r.route(req(prompt(10 + k, 40, k, 0)), now_us=k) for k in range(3)] == [0, 1, 2]  # misses: lowest QPS
    a = r.route(req(DOC), now_us=3)
    assert a == 0
    assert r.route(req(DOC + [7] * 40), now_us=4) == 0


def test_prodstack_loadaware_trades_match_for_load():
    p = ProdstackLoadAwarePolicy()
    r = Router(p, 2)
    r.route(req(DOC))  # rank 0 holds DOC
    r.state.inflight = [1, 0]
    assert r.route(req(DOC)) == 0  # 1 - (1 - 0.5)/1 = 0.5 vs 0 + 0.5
    r.state.inflight = [5, 1]
    assert r.route(req(DOC)) == 1  # 1 - 2/3 = 0.33 vs 0 + 2/3


def test_ray_prefix_best_match_at_10_percent_else_smallest_tree_then_queue():
    p = RayPrefixPolicy()
    r = Router(p, 3)
    r.state.tree.insert(req(DOC).text, 1, 0)
    r.state.tree.insert(req(DOC).text, 2, 0)
    r.state.inflight = [0, 3, 2]
    assert r.route(req(DOC)) == 2  # both match; the shorter queue
    r.state.inflight = [0, 0, 0]
    assert r.route(req(prompt(50, 40, 0, 0))) == 0  # no match: rank 0 has the smallest tree
    old = RayPrefixPolicy(imbalance_threshold=10)
    r2 = Router(old, 2)
    r2.state.tree.insert(req(DOC).text, 0, 0)
    r2.state.inflight = [11, 0]
    assert r2.route(req(DOC)) == 1


def test_power_of_two_ray_compares_waiting_plus_running_and_wants_fresh_telemetry():
    p = PEER_POLICIES["power_of_two@ray"]()
    assert isinstance(p, RayPowerOfTwoPolicy) and p.metric == "load" and p.wants_oracle_telemetry
    r = Router(p, 2)
    r.snapshot(Snapshot((RankLoad(waiting=1, running=1), RankLoad(waiting=0, running=1))))
    assert all(Router.route(r, req([1])) == 1 for _ in range(5))


@pytest.mark.parametrize("name", ["vllm_token", "smg_least_load", "smg_prefix_hash", "prodstack_prefixaware",
                                  "prodstack_loadaware", "ray_prefix"])
def test_optional_baselines_are_registered(name):
    assert PEER_POLICIES[name]().name == name
