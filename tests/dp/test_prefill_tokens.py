"""The ranks' prompt tokens still to compute, from the coordinator's snapshot to asyncdp's policy.

A snapshot's counts say how many requests wait or run on a rank, not how long they are: another API server's
50 000-token document is one request, and once admitted it runs (a chunked prefill) and is priced as a decode. With
several routers, asyncdp's policy prices the other routers' prefill work from the tokens the rank reports instead,
less this router's own; with one router there are no others, and the counts path stays as it was."""

from __future__ import annotations

import random

import pytest

from asyncdp.dp.asyncdp_policy import AsyncdpPolicy, AsyncdpState
from asyncdp.dp.balance import LoadBalancer, make_policy
from asyncdp.dp.policy import RankLoad, RequestView, Snapshot

DOC = 50_000


def short(n: int, router: int = 0) -> RequestView:
    base = 1_000_000 * (router + 1) + 1000 * n
    return RequestView(f"s{router}-{n}", tuple(range(base, base + 200)), routing_key=f"u{router}-{n}")


def snap(loads: list[tuple[int, int, int]], at_us: int = 1_000) -> Snapshot:
    """(waiting, running, prefill tokens) per rank."""
    return Snapshot(tuple(RankLoad(w, r, 0.0, prefill_tokens=p) for w, r, p in loads), delivered_at_us=at_us,
                    has_prefill_tokens=True)


def pick(policy: str, routers: int, s: Snapshot, n: int = 0) -> int:
    p = make_policy(policy)
    assert isinstance(p, AsyncdpPolicy)
    state = p.init(len(s.loads), 0, routers)
    p.on_snapshot(state, s)
    return p.select(short(n), s, state, s.delivered_at_us + 10, random.Random(0)).dp_rank


# Rank 0 runs one request: another router's document, in its chunked prefill. Ranks 1-3 run two decodes each.
DOC_ON_0 = [(0, 1, DOC), (0, 2, 0), (0, 2, 0), (0, 2, 0)]


@pytest.mark.parametrize("n", range(8))
def test_several_routers_keep_short_requests_off_another_routers_long_prefill(n):
    assert pick("asyncdp", 4, snap(DOC_ON_0), n) != 0


def test_the_counts_alone_see_one_request_there_and_send_to_it():
    assert pick("asyncdp@counts", 4, snap(DOC_ON_0)) == 0


def test_one_router_prices_from_the_counts_as_before():
    assert pick("asyncdp", 1, snap(DOC_ON_0)) == 0


def test_a_router_does_not_count_its_own_prefill_twice():
    """This router sent the document: the rank's tokens are all its own, already in its pending work, so the rank
    costs what it costs from the counts alone."""
    costs = {}
    for policy in ("asyncdp", "asyncdp@counts"):
        p = make_policy(policy)
        assert isinstance(p, AsyncdpPolicy)
        state: AsyncdpState = p.init(4, 0, 4)
        doc = RequestView("doc", tuple(range(7_000_000, 7_000_000 + DOC)), routing_key="d")
        d = p.select(doc, None, state, 0, random.Random(0))
        p.on_dispatch(state, doc, d, 0)
        loads = [(0, 0, 0)] * 4
        loads[d.dp_rank] = (0, 1, DOC)
        p.on_snapshot(state, snap(loads))
        costs[policy] = list(state.base)
    assert costs["asyncdp"] == costs["asyncdp@counts"]


def test_a_snapshot_without_prompt_tokens_falls_back_to_the_counts():
    """An older coordinator sends counts only: asyncdp prices as asyncdp@counts does."""
    plain = Snapshot(tuple(RankLoad(w, r, 0.0) for w, r, _ in DOC_ON_0), delivered_at_us=1_000)
    assert not plain.has_prefill_tokens
    assert pick("asyncdp", 4, plain) == pick("asyncdp@counts", 4, plain) == 0


def test_from_counts_reads_the_prompt_tokens_beside_the_counts():
    s = Snapshot.from_counts([[1, 0, 0.5], [0, 2, 0.1]], prefill_tokens=[900, 3])
    assert s.has_prefill_tokens and [x.prefill_tokens for x in s.loads] == [900, 3]
    assert [(x.waiting, x.running, x.kv_usage) for x in s.loads] == [(1, 0, 0.5), (0, 2, 0.1)]
    assert not Snapshot.from_counts([[1, 0, 0.5]]).has_prefill_tokens
    with pytest.raises(ValueError, match="2 prefill token counts for 1 ranks"):
        Snapshot.from_counts([[1, 0, 0.5]], prefill_tokens=[1, 2])


def test_a_client_reads_the_prompt_tokens_of_its_own_ranks():
    """A hybrid node's client manages global ranks 2 and 3 of 4: their entries, in its local order."""
    lb = LoadBalancer([2, 3], 0, 4, "asyncdp")
    lb.on_snapshot([[0, 0, 0.0], [0, 0, 0.0], [0, 1, 0.0], [0, 2, 0.0]], prefill_tokens=[5, 6, DOC, 0])
    assert lb._snap is not None and [x.prefill_tokens for x in lb._snap.loads] == [DOC, 0]
    assert lb.select("a", list(range(200))) == 3
    lb.on_snapshot([[0, 0, 0.0], [0, 0, 0.0], [0, 1, 0.0], [0, 2, 0.0]], prefill_tokens=[1, 2])  # not its ranks
    assert lb._snap is not None and not lb._snap.has_prefill_tokens
