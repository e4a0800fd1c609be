"""``SamplingParams.cache_salt`` (vLLM's ``cache_salt``): the salt is mixed into the hash of a prompt's first block,
so every later block hash (chained from it) differs too, and prompts with different salts, or with and without
one, share no prefix-cache block, while prompts with the same salt share as unsalted ones do. The engine's own
counters (``num_cached_tokens``, the block manager's prefix-cache hits) say the same."""

from __future__ import annotations

from hashlib import blake2b

import pytest
from engine_testing import encode, scripted_core

from asyncdp.dp.policy import salt_root as policy_salt_root
from asyncdp.engine.block_manager import (
    ROOT_HASH,
    BlockManager,
    compute_block_hashes,
    hash_block_tokens,
    salt_root,
)
from asyncdp.engine.core import EngineCore
from asyncdp.engine.request import Request
from asyncdp.errors import InvalidSamplingParams
from asyncdp.sampling_params import SamplingParams

TOKENS = list(range(100, 112))  # three blocks of 4


def req(rid: str, salt: str | None, tokens: list[int] = TOKENS) -> Request:
    return Request(rid, tokens, SamplingParams(cache_salt=salt), arrival_time=0.0, max_tokens=16)


def hit(bm: BlockManager, r: Request) -> int:
    """Admit ``r`` whole (the block manager's hit in tokens, then its blocks are published)."""
    prefix = bm.find_cached_prefix(r)
    start = len(prefix) * bm.block_size
    assert bm.allocate(r, r.num_tokens - start, prefix)
    r.num_computed_tokens = r.num_tokens
    return start


def test_a_salted_prompts_block_hashes_differ_from_the_first_block_on_and_chain_from_the_salt() -> None:
    bm = BlockManager(16, 4)
    plain, salted, twin, other = req("p", None), req("s", "tenant-a"), req("t", "tenant-a"), req("o", "tenant-b")
    for r in (plain, salted, twin, other):
        hit(bm, r)
    assert plain.block_hashes == compute_block_hashes(TOKENS, 4)
    assert salted.block_hashes == compute_block_hashes(TOKENS, 4, salt_root("tenant-a")) == twin.block_hashes
    assert salted.block_hashes[0] == hash_block_tokens(salt_root("tenant-a"), TOKENS[:4])
    assert salted.block_hashes[1] == hash_block_tokens(salted.block_hashes[0], TOKENS[4:8])
    seen = [set(r.block_hashes) for r in (plain, salted, other)]
    assert len(seen[0] | seen[1] | seen[2]) == 9  # three prompts x three blocks, none shared


def test_salt_root_is_a_personalised_blake2b_and_the_routers_equal_it() -> None:
    assert salt_root(None) == ROOT_HASH
    for salt in ("a", "tenant-a", "ünïcode ✓", "x" * 300):
        expected = blake2b(salt.encode(), digest_size=8, person=b"asyncdp-salt").digest()
        assert salt_root(salt) == int.from_bytes(expected, "little") == policy_salt_root(salt)
    assert salt_root("a") != salt_root("b") != ROOT_HASH


def test_the_block_manager_hits_within_one_salt_only() -> None:
    bm = BlockManager(32, 4)
    assert hit(bm, req("a1", "a")) == 0
    assert hit(bm, req("plain", None)) == 0  # the unsalted prompt finds nothing of salt "a"
    assert hit(bm, req("b1", "b")) == 0
    assert hit(bm, req("a2", "a")) == 8  # (12 - 1) // 4 blocks of its own salt
    assert hit(bm, req("b2", "b")) == 8
    assert hit(bm, req("plain2", None)) == 8


def reported_hits(core: EngineCore) -> dict[str, int]:
    out: dict[str, int] = {}
    for _ in range(100):
        if not core.has_unfinished():
            return out
        for o in core.step().outputs:
            out[o.request_id] = o.num_cached_tokens
    raise AssertionError("requests left unfinished")


def test_the_engine_reports_cached_tokens_within_one_salt_and_none_across_salts() -> None:
    core, _ = scripted_core({}, block_size=4)
    prompt = encode("a prompt of twenty-four!")
    got: dict[str, int] = {}
    for rid, salt in [("a1", "a"), ("none1", None), ("b1", "b"), ("a2", "a"), ("b2", "b"), ("none2", None)]:
        core.add_request(rid, prompt, SamplingParams(max_tokens=1, cache_salt=salt))
        got |= reported_hits(core)  # one at a time: each sees what the earlier ones cached
    assert got == {"a1": 0, "none1": 0, "b1": 0, "a2": 20, "b2": 20, "none2": 20}
    stats = core.block_manager
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (6 * 24, 3 * 20)


@pytest.mark.parametrize("salt", ["", 3, b"salt"])
def test_a_salt_must_be_a_non_empty_string(salt: object) -> None:
    with pytest.raises(InvalidSamplingParams, match="cache_salt must be a non-empty string or None") as err:
        SamplingParams(cache_salt=salt).validate()  # type: ignore[arg-type]
    assert err.value.field == "cache_salt"
    assert SamplingParams(cache_salt=" ").validate().cache_salt == " "  # as vLLM: only "" is refused
