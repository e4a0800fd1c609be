"""Conformance vectors for asyncdp's policy spreading new prompts (asyncdp/dp/asyncdp_policy.py, ``spread``,
``spread_tokens``, ``spread_gated``): a prompt no rank holds goes to the rank with the fewest prefixes among
those within one prefill of the cheapest, and only while no prefix is hot and most recent prompts were not
new, hand-computed.

Prompts are 16-token blocks (the policy's block size); the memory term is off (``memory_tokens=0``)."""

from __future__ import annotations

import pytest

from asyncdp.dp.asyncdp_policy import AsyncdpPolicy
from tests.dp.asyncdp_requests import INF, prompt, route


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
