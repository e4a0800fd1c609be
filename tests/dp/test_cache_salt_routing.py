"""A salted request (``RequestView.cache_salt``, vLLM's ``cache_salt``) hits no prefix-cache block of another salt
or of none in the engine, so every policy that predicts hits must predict none there too: its prompt hashes chain
from the salt's root (``RequestView.root_hash``, the engine's ``salt_root``), its radix-tree units start with the
salt's marker. Otherwise a salted request would be sent after the unsalted prefix's rank for a hit it never gets."""

from __future__ import annotations

import random

import pytest

from asyncdp.dp.balance import LoadBalancer, make_policy
from asyncdp.dp.owner_index import prompt_hashes
from asyncdp.dp.peers.hashing import block_hashes, render_text, units
from asyncdp.dp.policy import Decision, RequestView
from asyncdp.engine.block_manager import BlockManager
from asyncdp.engine.request import Request
from asyncdp.sampling_params import SamplingParams

SHARED = tuple(range(1000, 1256))  # 16 blocks of 16 tokens


def view(rid: str, tail: int, salt: str | None = None) -> RequestView:
    return RequestView(rid, (*SHARED, *range(tail * 100, tail * 100 + 16)), cache_salt=salt)


def test_a_salted_views_block_hashes_are_the_engines_for_that_salt() -> None:
    v = view("r", 1, "tenant")
    engine_req = Request("r", list(v.tokens), SamplingParams(cache_salt="tenant"), arrival_time=0.0, max_tokens=1)
    bm = BlockManager(64, 16)
    assert bm.allocate(engine_req, len(v.tokens))  # publishes (so hashes) every full block
    assert block_hashes(v.tokens, 16, parent_hash=v.root_hash) == engine_req.block_hashes
    assert view("r", 1).root_hash == 0 and v.root_hash != 0


def test_prompt_hashes_share_nothing_across_salts_and_everything_within_one() -> None:
    plain, a, a2, b = (prompt_hashes(v, 16) for v in (view("p", 1), view("a", 1, "a"), view("a2", 1, "a"),
                                                          view("b", 1, "b")))
    assert a == a2 and len(a) == 17
    assert not set(plain) & set(a) and not set(a) & set(b) and not set(plain) & set(b)
    assert units(view("a", 1, "a"), "tokens")[1:] == units(view("p", 1), "tokens")  # after the salt's marker
    assert units(view("a", 1, "a"), "chars")[4:] == render_text(view("p", 1).tokens)
    assert units(view("a", 1, "a"), "chars")[:4] != units(view("b", 1, "b"), "chars")[:4]


PREFIX_POLICIES = ["asyncdp", "sglang_cache_aware", "aibrix_prefix", "prodstack_prefixaware", "ray_prefix"]


def pick_after(name: str, history_salt: str | None, salt: str | None) -> int:
    """Two prompts sharing SHARED sent to rank 1 (under ``history_salt``), then where a third goes, under ``salt``:
    rank 1 on a predicted hit, rank 0 (idle) on none."""
    policy = make_policy(name)
    state = policy.init(2)
    for k in range(2):
        policy.on_dispatch(state, view(f"w{k}", 50 + k, history_salt), Decision(1), k)
    return policy.select(view("q", 90, salt), None, state, 10, random.Random(0)).dp_rank


@pytest.mark.parametrize("name", PREFIX_POLICIES)
def test_a_prefix_aware_policy_predicts_a_hit_within_one_salt_only(name: str) -> None:
    assert pick_after(name, None, None) == 1
    assert pick_after(name, None, "tenant") == 0  # the unsalted prefix is no hit for a salted request
    assert pick_after(name, "tenant", "tenant") == 1
    assert pick_after(name, "tenant", "other") == 0
    assert pick_after(name, "tenant", None) == 0


def test_llmd_and_dynamo_score_no_overlap_across_salts() -> None:
    llmd, dynamo = make_policy("llmd_weighted"), make_policy("dynamo_kv@approx")
    ls, ds = llmd.init(2), dynamo.init(2)
    llmd.on_dispatch(ls, view("w", 50), Decision(1), 0)
    dynamo.on_dispatch(ds, view("w", 50), Decision(1), 0)
    assert llmd.prefix_scores(view("q", 90), ls, [0, 1])[1] > 0  # type: ignore[attr-defined]
    assert llmd.prefix_scores(view("q", 90, "s"), ls, [0, 1])[1] == 0  # type: ignore[attr-defined]
    for salt, expected in ((None, 16), ("s", 0)):
        v = view("q", 90, salt)
        blocks = block_hashes(v.tokens, ds.block_size, parent_hash=v.root_hash)
        assert dynamo.overlap(ds, 1, blocks, 1) == expected  # type: ignore[attr-defined]


def test_the_balancer_hands_the_salt_to_the_policy() -> None:
    lb = LoadBalancer([0, 1], policy="asyncdp")
    assert lb.select("w", view("w", 50).tokens, 1, cache_salt="tenant") == 1
    assert lb.select("a", view("a", 51).tokens, cache_salt="tenant") == 1  # the salted prefix's rank
    assert lb.select("b", view("b", 52).tokens) == 0  # unsalted: no hit on rank 1, the idle rank
