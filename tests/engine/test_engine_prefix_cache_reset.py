"""``EngineCore.reset_prefix_cache`` (``POST /reset_prefix_cache`` on a rank), as vLLM's scheduler and block pool
reset: the cached blocks no request uses are forgotten and the prefix-cache counters keep counting; while a request
holds blocks the reset is refused and changes nothing, unless ``reset_running_requests`` preempts the running
requests first, which then recompute exactly the tokens they would have had (``KVReadingExecutor`` reads them back
from the KV slots, so a block reused under a stale hash would change them)."""

from __future__ import annotations

from engine_testing import encode, sim_core
from test_engine_kv_consistency import BASE, alone, make_core

from asyncdp.engine.core import EngineCore
from asyncdp.sampling_params import SamplingParams


def run(core: EngineCore) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Step until idle: each request's tokens, and the prefix-cache hit its first output reported."""
    tokens: dict[str, list[int]] = {}
    hits: dict[str, int] = {}
    while core.has_unfinished():
        for out in core.step().outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            hits.setdefault(out.request_id, out.num_cached_tokens)
    return tokens, hits


def test_a_reset_forgets_the_blocks_of_finished_requests_and_the_counters_keep_counting() -> None:
    core = sim_core(block_size=4)
    prompt = encode("abcdefghij")  # two whole blocks are a hit; the third holds the token left to compute
    for rid in ("a", "b"):
        core.add_request(rid, prompt, SamplingParams(max_tokens=2))
        run(core)
    before = core.stats()
    assert before.prefix_cache_hits == 8 and core.block_manager.num_cached_blocks > 0
    assert core.reset_prefix_cache() is True
    bm = core.block_manager
    assert bm.num_cached_blocks == 0 and bm.cache_fill == 0.0 and bm.num_free_blocks == bm.num_usable_blocks
    core.add_request("c", prompt, SamplingParams(max_tokens=2))
    assert run(core)[1] == {"c": 0}  # nothing of it is cached any more
    after = core.stats()
    # vLLM's counters are cumulative: the reset takes nothing off them
    assert (after.prefix_cache_queries, after.prefix_cache_hits) == (before.prefix_cache_queries + 10, 8)


def test_a_reset_is_refused_while_a_request_holds_blocks_and_changes_nothing() -> None:
    core = make_core()
    cached = BASE[:21]
    core.add_request("done", cached, SamplingParams(max_tokens=2))
    run(core)
    core.add_request("busy", BASE[:13] + list(b"#busy"), SamplingParams(max_tokens=8))
    first = core.step().outputs  # it is running: it holds blocks (three of them shared with "done"'s prompt)
    bm = core.block_manager
    held = list(core.scheduler.running[0].block_ids)
    num_cached, num_free = bm.num_cached_blocks, bm.num_free_blocks
    assert core.reset_prefix_cache() is False
    assert (bm.num_cached_blocks, bm.num_free_blocks) == (num_cached, num_free)
    assert core.scheduler.running[0].block_ids == held and all(bm.ref_count(b) == 1 for b in held)
    core.add_request("again", cached, SamplingParams(max_tokens=2))
    tokens, hits = run(core)
    assert hits["again"] == 20  # the cached prompt still hits
    assert first[0].new_token_ids + tokens["busy"] == alone(BASE[:13] + list(b"#busy"), 8)


def test_reset_running_requests_preempts_them_and_they_recompute_the_same_tokens() -> None:
    core = make_core(max_num_seqs=2)
    prompts = {"r1": BASE[:17], "r2": BASE[:9] + list(b"#two"), "w": BASE[:21]}
    for rid, prompt in prompts.items():
        core.add_request(rid, prompt, SamplingParams(max_tokens=10))
    streamed: dict[str, list[int]] = {}
    for _ in range(3):  # r1 and r2 decode; w waits for a sequence slot, owing what the cache does not cover
        for out in core.step().outputs:
            streamed.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert [r.request_id for r in core.scheduler.running] == ["r1", "r2"]
    preemptions = core.scheduler.num_preemptions
    assert core.reset_prefix_cache(reset_running_requests=True) is True
    bm, scheduler = core.block_manager, core.scheduler
    assert bm.num_cached_blocks == 0 and bm.num_free_blocks == bm.num_usable_blocks
    assert not scheduler.running and scheduler.num_preemptions == preemptions + 2
    # every request waits again, owing its every token: nothing of any prompt is cached now
    assert scheduler.prefill_tokens == scheduler.pending_prefill_tokens() == sum(
        r.num_tokens for r in scheduler.requests.values())
    tokens, _ = run(core)
    assert {rid: streamed.get(rid, []) + tokens[rid] for rid in prompts} == {
        rid: alone(prompt, 10) for rid, prompt in prompts.items()}
