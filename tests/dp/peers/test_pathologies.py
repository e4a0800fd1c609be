"""The routing-bench §8 pathologies visible at policy level, on short synthetic request streams (no simulator):
each shows the defect under the named baseline, with the fixed or default flavour as the contrast."""

from __future__ import annotations

from collections import Counter

from asyncdp.dp.peers import PEER_POLICIES
from asyncdp.dp.peers.events import KvEvent
from asyncdp.dp.peers.hashing import block_hashes
from asyncdp.dp.policy import RankLoad, Snapshot
from tests.dp.peers.helpers import Router, prompt, req


def unique(k: int, n_tokens: int):
    return req(prompt(100_000 + k, 0, k, n_tokens))


def max_over_mean(counts: Counter, dp: int) -> float:
    return max(counts.values()) / (sum(counts.values()) / dp)


# ---------------------------------------------------------------- sglang_cache_aware


def test_first_token_load_guard_herds_a_burst_of_long_prefills_onto_rank_0():
    """sgl-project/sglang#27547 / smg-project/smg#1714: load counted only once decode starts."""
    def burst(name: str) -> Counter:
        r = Router(PEER_POLICIES[name](), 8)
        return Counter(r.route(unique(k, 2000), now_us=k) for k in range(40))  # no first token yet
    herded = burst("sglang_cache_aware@guard_first_token")
    assert herded[0] / 40 > 0.8
    assert max_over_mean(burst("sglang_cache_aware"), 8) == 1.0


def test_no_load_guard_sends_every_miss_to_rank_0():
    """sgl-project/sglang#15473: with no load guard every load is 0 and the first worker always wins."""
    def misses(name: str) -> Counter:
        r = Router(PEER_POLICIES[name](), 4)
        live: list[tuple[str, int]] = []
        out = Counter()
        for k in range(60):
            q = unique(k, 64)
            rank = r.route(q, now_us=k)
            out[rank] += 1
            live.append((q.req_id, rank))
            if len(live) > 8:  # a steady population of in-flight requests
                rid, rk = live.pop(0)
                r.policy.on_first_token(r.state, rid, rk, k)
                r.policy.on_finish(r.state, rid, rk, k)
        return out
    assert misses("sglang_cache_aware@guard_never") == Counter({0: 60})
    assert max(misses("sglang_cache_aware").values()) <= 15


def test_smallest_tree_miss_policy_piles_misses_onto_the_busy_rank_with_the_small_tree():
    """sgl-project/sglang#14305, #14532: the miss death-spiral."""
    def run(name: str) -> tuple[Counter, Counter]:
        r = Router(PEER_POLICIES[name](), 4)
        # ranks 1-3 hold long shared documents (W1 groups); rank 0 is busy with 40 uncached requests
        for g in (1, 2, 3):
            r.state.tree.insert(req(prompt(g, 1000, 0, 0)).text, g, 0)
        r.state.load = [40, 0, 0, 0]
        r.state.processed = [40, 1, 1, 1]
        misses, every = Counter(), Counter()
        for k in range(60):  # W1 mixed 50/50 with W6
            if k % 2:
                rank = r.route(unique(k, 30), now_us=k)
                misses[rank] += 1
            else:
                rank = r.route(req(prompt(1 + k % 3, 1000, k, 20)), now_us=k)
            every[rank] += 1
        return misses, every
    misses, every = run("sglang_cache_aware@smallest_tree")
    assert misses[0] / 30 > 0.5
    assert (every[0] + 40) / ((sum(every.values()) + 40) / 4) > 2  # counting the 40 already there
    fixed, _ = run("sglang_cache_aware")
    assert fixed[0] == 0


def test_request_count_balance_ignores_prompt_tokens():
    """vllm-project/vllm#40795, smg-project/smg#1621: balanced counts, unbalanced tokens (W8)."""
    r = Router(PEER_POLICIES["sglang_cache_aware"](), 2)
    tokens, counts = Counter(), Counter()
    for k in range(40):
        q = unique(k, 8000 if k % 2 == 0 else 100)
        rank = r.route(q, now_us=k)
        tokens[rank] += q.prompt_len
        counts[rank] += 1
    assert counts[0] == counts[1]
    assert max_over_mean(tokens, 2) > 1.5


# ---------------------------------------------------------------- llmd_weighted


def test_load_only_scoring_herds_a_burst_onto_the_rank_a_stale_snapshot_shows_idle():
    """llm-d/llm-d-router#298: stale metrics make routers herd under bursts."""
    r = Router(PEER_POLICIES["llmd_weighted@load_only"](), 4)
    r.snapshot(Snapshot(tuple(RankLoad(waiting=w, kv_usage=0.3, sampled_at_us=0) for w in (2, 2, 0, 2))))
    burst = Counter(r.route(unique(k, 200), now_us=1000) for k in range(32))  # before the next scrape
    assert burst == Counter({2: 32})
    rr = Router(PEER_POLICIES["llmd_weighted@load_only"](), 4)  # contrast: no snapshot, random ties spread
    assert max_over_mean(Counter(rr.route(unique(k, 200)) for k in range(32)), 4) < 2


def test_prefix_only_scoring_hot_spots_a_popular_prefix_on_one_rank():
    """llm-d blog (55 % success), llm-d/llm-d-router#346: prefix-only routing hot-spots."""
    def run(name: str) -> Counter:
        r = Router(PEER_POLICIES[name](), 4, seed=3)
        out = Counter()
        for k in range(40):
            if k == 10:  # the hot rank is now deep in queue and nearly full
                hot = out.most_common(1)[0][0]
                r.snapshot(Snapshot(tuple(RankLoad(waiting=20 if i == hot else 0, kv_usage=0.95 if i == hot else
                                                   0.2, sampled_at_us=10) for i in range(4))))
            out[r.route(req(prompt(7, 512, k, 16)), now_us=10 + k)] += 1
        return out
    hot = run("llmd_weighted@prefix_only")
    assert hot.most_common(1)[0][1] == 40
    assert run("llmd_weighted").most_common(1)[0][1] < 40


# ---------------------------------------------------------------- dynamo_kv


def test_equal_costs_without_kv_events_scatter_a_conversations_turns():
    """ai-dynamo/dynamo#3581 / #392: the index disagrees with the engine, equal scores mean a random pick."""
    def turns(with_events: bool) -> set[int]:
        p = PEER_POLICIES["dynamo_kv"]()
        r = Router(p, 4, seed=5)
        history: list[int] = []
        ranks = set()
        for t in range(10):
            history += [9000 + t * 100 + i for i in range(64)]
            q = req(history, key="conv")
            rank = r.route(q, now_us=t)
            ranks.add(rank)
            p.on_first_token(r.state, q.req_id, rank, t)
            p.on_finish(r.state, q.req_id, rank, t)
            if with_events:
                p.on_kv_event(r.state, KvEvent(rank, "stored", tuple(block_hashes(history, 16))))
        return ranks
    assert len(turns(with_events=False)) > 1
    assert len(turns(with_events=True)) == 1


def test_several_routers_with_local_state_herd_onto_the_same_rank():
    """ai-dynamo/dynamo#589, smg-project/smg#1621: R replicas with local state pick alike; the spread grows
    with R."""
    def spread(num_routers: int) -> int:
        routers = [Router(PEER_POLICIES["sglang_cache_aware"](), 8, router_index=j, num_routers=num_routers)
                   for j in range(num_routers)]
        per_rank = Counter()
        for k in range(4):  # each replica routes 4 distinct requests; arrivals alternate between replicas
            for j, r in enumerate(routers):
                per_rank[r.route(unique(100 * j + k, 64), now_us=k)] += 1
        return max(per_rank.values()) - min(per_rank[i] for i in range(8))
    assert spread(1) <= 1
    assert spread(4) > spread(1)
    assert spread(16) > spread(4)
