"""A rank's prefix-cache reset reaches the routing policies (``LoadBalancer.on_cache_reset``, from the rank's
``PrefixCacheReset``): asyncdp's index and the peers' own indexes forget what they sent to that rank, so a prompt
that went there is routed afterwards as a fresh policy routes it, while the other ranks' entries stay."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from asyncdp.dp.asyncdp_policy import prompt_hashes
from asyncdp.dp.balance import LoadBalancer
from asyncdp.dp.policy import RequestView

PROMPT = list(range(1000, 1096))  # six 16-token blocks
OTHER = list(range(5000, 5064))


def sent(lb: LoadBalancer, rid: str, prompt: list[int], rank_hint: int | None = None) -> int:
    """Route one request and finish it (its load gone, what the policy learnt of its prompt kept)."""
    rank = lb.select(rid, prompt, rank_hint, max_tokens=4)
    lb.on_first_token(rid)
    lb.on_finish(rid)
    return rank


def test_asyncdps_index_forgets_the_reset_rank_and_keeps_the_others() -> None:
    lb = LoadBalancer([0, 1], policy="asyncdp")
    sent(lb, "a", PROMPT, rank_hint=1)
    sent(lb, "b", OTHER, rank_hint=0)
    assert sent(lb, "c", PROMPT) == 1  # the predicted hit draws it to rank 1
    index = lb.state.index
    hashes = prompt_hashes(RequestView("x", PROMPT), lb.state.block_size)
    assert index.match(1, hashes) == len(hashes)
    lb.on_cache_reset(1)
    assert index.size(1) == 0 and index.match(1, hashes) == 0 and not index.roots[1]
    assert not any(index.owners.get(h, 0) & 0b10 for h in hashes)
    other = prompt_hashes(RequestView("x", OTHER), lb.state.block_size)
    assert index.match(0, other) == len(other)  # rank 0's entries stay
    lb.on_cache_reset(7)  # a rank this client does not manage: nothing happens


@pytest.mark.parametrize("policy", [
    "asyncdp", "sglang_cache_aware", "sglang_cache_aware@smallest_tree", "prodstack_prefixaware", "ray_prefix",
])
def test_after_a_reset_a_prompt_is_routed_as_a_fresh_policy_routes_it(policy: str) -> None:
    """Rank 1 got the prompt: the policy sends it there again; once rank 1 reset its cache, the policy picks for it
    what a policy that never saw it picks (rank 0: equal loads, no predicted hit; these break ties by rank)."""
    fresh = LoadBalancer([0, 1], policy=policy)
    assert sent(fresh, "z", PROMPT) == 0
    lb = LoadBalancer([0, 1], policy=policy)
    sent(lb, "a", PROMPT, rank_hint=1)
    assert sent(lb, "b", PROMPT) == 1
    lb.on_cache_reset(1)
    assert sent(lb, "c", PROMPT) == 0


@pytest.mark.parametrize(("policy", "held"), [
    ("llmd_weighted", lambda state, rank: state.index.size(rank)),  # (its ties go at random)
    ("llmd_weighted@precise", lambda state, rank: state.speculative.size(rank)),
    ("aibrix_prefix", lambda state, rank: state.index.size(rank)),
    ("dynamo_kv@approx", lambda state, rank: state.approx.size(rank)),
])
def test_the_prefix_index_of_a_reset_rank_is_emptied(policy: str, held: Callable[[Any, int], int]) -> None:
    lb = LoadBalancer([0, 1], policy=policy)
    sent(lb, "a", PROMPT, rank_hint=1)
    sent(lb, "b", OTHER, rank_hint=0)
    assert held(lb.state, 0) > 0 and held(lb.state, 1) > 0
    lb.on_cache_reset(1)
    assert held(lb.state, 0) > 0 and held(lb.state, 1) == 0


@pytest.mark.parametrize("policy", ["sglang_cache_aware@events", "llmd_weighted@precise", "dynamo_kv"])
def test_the_kv_event_index_of_a_reset_rank_is_cleared(policy: str) -> None:
    """The precise peers read the engines' KV events; a reset is the rank's ``cleared`` event (vLLM's
    ``AllBlocksCleared``), which no production component sends: the reset clears their event index itself."""
    from asyncdp.dp.peers import KvEvent

    lb = LoadBalancer([0, 1], policy=policy)
    lb.policy.on_kv_event(lb.state, KvEvent(0, "stored", (1, 2)))
    lb.policy.on_kv_event(lb.state, KvEvent(1, "stored", (1, 2, 3)))
    lb.on_cache_reset(1)
    assert (lb.state.events.size(0), lb.state.events.size(1)) == (2, 0)
