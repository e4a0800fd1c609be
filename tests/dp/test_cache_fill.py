"""The ranks' prefix cache fill, from the coordinator's snapshot to asyncdp's memory term.

asyncdp steers new content to emptier caches by a memory term: how full its own index says each rank is. With
several API servers, each index holds only what its own server sent; where each server keeps its own conversations
(keep-alive connections, a session-affine balancer: ``--router-assign key`` in the benchmark), each sees a part of
every rank's content and would fill one rank's cache several times over. The ranks report their fill; with several
routers the memory term takes the larger of the two, with one router its own index (exact about what it sent)."""

from __future__ import annotations

import random

import pytest

from asyncdp.dp.asyncdp_policy import AsyncdpPolicy
from asyncdp.dp.balance import LoadBalancer, make_policy
from asyncdp.dp.policy import Decision, RankLoad, RequestView, Snapshot


def new_prompt(n: int) -> RequestView:
    return RequestView(f"p{n}", tuple(range(10_000 * (n + 1), 10_000 * (n + 1) + 512)), routing_key=f"user{n}")


def place(routers: int, fills: list[float], n: int) -> int:
    p = make_policy("asyncdp")
    assert isinstance(p, AsyncdpPolicy)
    state = p.init(len(fills), 0, routers)
    snap = Snapshot(tuple(RankLoad(cache_fill=f) for f in fills), delivered_at_us=1_000, has_prefill_tokens=True)
    p.on_snapshot(state, snap)
    return p.select(new_prompt(n), snap, state, 1_010, random.Random(0)).dp_rank


@pytest.mark.parametrize("n", range(6))
def test_several_routers_keep_new_content_off_a_rank_whose_cache_the_others_filled(n):
    # Ranks 0-2 report full caches of other API servers' conversations; this router's own index is empty.
    assert place(4, [1.0, 1.0, 1.0, 0.0], n) == 3


def test_one_router_goes_by_its_own_index_which_knows_all_it_sent():
    assert {place(1, [1.0, 1.0, 1.0, 0.0], n) for n in range(6)} != {3}


def test_the_fill_raises_the_memory_term_only_where_it_says_more_than_the_index():
    p = AsyncdpPolicy()
    state = p.init(2, 0, 4, {"kv_blocks_per_rank": 1000})
    for k in range(5):  # this router's own prompts on rank 0: 5 x 32 blocks of 1000
        req = new_prompt(100 + k)
        p.on_dispatch(state, req, Decision(0), 0)
    own = state.memory[0]
    assert own == pytest.approx(p.memory_tokens * 160 / 1000)
    p.on_snapshot(state, Snapshot((RankLoad(cache_fill=0.1), RankLoad(cache_fill=0.5)), delivered_at_us=1))
    assert state.memory == [pytest.approx(own), pytest.approx(p.memory_tokens * 0.5)]


def test_from_counts_and_a_client_read_the_fill_of_their_own_ranks():
    s = Snapshot.from_counts([[1, 0, 0.5], [0, 2, 0.1]], cache_fill=[0.25, 0.5])
    assert [x.cache_fill for x in s.loads] == [0.25, 0.5] and not s.has_prefill_tokens
    with pytest.raises(ValueError, match="1 cache fills for 2 ranks"):
        Snapshot.from_counts([[1, 0, 0.5], [0, 2, 0.1]], cache_fill=[0.25])
    lb = LoadBalancer([2, 3], 0, 4, "asyncdp")  # a hybrid node's client: global ranks 2 and 3 of 4
    lb.on_snapshot([[0, 0, 0.0]] * 4, prefill_tokens=[0] * 4, cache_fill=[0.1, 0.2, 0.3, 0.4])
    assert lb._snap is not None and [x.cache_fill for x in lb._snap.loads] == [0.3, 0.4]
    lb.on_snapshot([[0, 0, 0.0]] * 4, cache_fill=[0.1, 0.2])  # not its ranks: none
    assert lb._snap is not None and [x.cache_fill for x in lb._snap.loads] == [0.0, 0.0]
