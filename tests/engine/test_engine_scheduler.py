"""Scheduler: token budget, max_num_seqs, chunked prefill, preemption, abort, pause modes, throttling."""

from __future__ import annotations

import pytest
from engine_testing import run_to_completion, sim_core

from asyncdp.engine.block_manager import BlockManager
from asyncdp.engine.executor import StepResult
from asyncdp.engine.request import Request, RequestStatus
from asyncdp.engine.scheduler import Scheduler
from asyncdp.sampling_params import SamplingParams


def make(num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64) -> Scheduler:
    bm = BlockManager(num_blocks, block_size, reserve_scratch_block=True)
    return Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)


def add(s: Scheduler, rid: str, n: int, base: int | None = None) -> Request:
    base = 1000 * ord(rid[0]) if base is None else base  # distinct prompts: no accidental prefix hits
    r = Request(rid, [base + i % 50 for i in range(n)], SamplingParams(), arrival_time=0.0, max_tokens=100)
    s.add(r)
    return r


def step(s: Scheduler, **kw) -> list[tuple[str, int, bool]]:
    """One schedule + update with token 7 for every sampled chunk; returns (id, tokens, decode?)."""
    batch = s.schedule(**kw)
    s.update(batch, StepResult([7 if c.sample else None for c in batch.chunks]))
    return [(c.request_id, len(c.token_ids), c.start_pos >= len(s.requests[c.request_id].prompt_token_ids))
            for c in batch.chunks]


def test_token_budget_chunks_the_prompt_that_does_not_fit_and_leaves_the_rest_waiting():
    s = make(max_num_batched_tokens=40)
    for rid in "abc":
        add(s, rid, 30)
    assert [(r, n) for r, n, _ in step(s)] == [("a", 30), ("b", 10)]
    assert s.num_running == 2 and s.num_waiting == 1
    # next step: a decodes (1), b continues its prefill (20), c gets the remaining 19
    assert [(r, n) for r, n, _ in step(s)] == [("a", 1), ("b", 20), ("c", 19)]


def test_batch_counts_prefill_tokens_decode_seqs_and_kv_tokens():
    s = make(max_num_batched_tokens=100)
    add(s, "a", 10)
    step(s)
    add(s, "b", 5)
    batch = s.schedule()
    assert (batch.num_prefill_tokens, batch.num_decode_seqs, batch.num_kv_tokens) == (5, 1, 11 + 5)


def test_max_num_seqs_limits_admission():
    s = make(max_num_seqs=2)
    for rid in "abcd":
        add(s, rid, 3)
    assert [r for r, _, _ in step(s)] == ["a", "b"]
    assert s.num_waiting == 2


def test_long_prompt_is_prefilled_in_chunks_and_samples_only_after_the_last_chunk():
    s = make(max_num_batched_tokens=16)
    r = add(s, "a", 40)
    sizes = []
    while not r.output_token_ids:
        batch = s.schedule()
        sizes.append((len(batch.chunks[0].token_ids), batch.chunks[0].sample))
        s.update(batch, StepResult([7 if c.sample else None for c in batch.chunks]))
    assert sizes == [(16, False), (16, False), (8, True)]


def test_block_shortage_preempts_the_most_recently_admitted_to_the_front_of_waiting():
    s = make(num_blocks=1 + 6, block_size=4, max_num_batched_tokens=64)
    add(s, "a", 8, base=0)
    add(s, "b", 8, base=100)
    c = add(s, "c", 8, base=200)
    step(s)  # a, b, c admitted, 2 blocks each = 6 blocks
    assert s.num_running == 3
    step(s)  # a needs a third block: c (admitted last) is preempted
    assert c.status == RequestStatus.PREEMPTED and list(s.waiting) == [c]
    assert c.num_computed_tokens == 0 and c.block_ids == [] and s.num_preemptions == 1


def test_preemption_by_recompute_yields_the_same_tokens_as_an_unconstrained_run():
    prompts = {f"r{i}": [(i * 7 + j) % 200 for j in range(20 + 3 * i)] for i in range(6)}
    params = SamplingParams(max_tokens=24, ignore_eos=True)

    def run(num_kv_blocks):
        core = sim_core(block_size=4, num_kv_blocks=num_kv_blocks, max_num_batched_tokens=64)
        for rid, p in prompts.items():
            core.add_request(rid, p, params)
        res = run_to_completion(core)
        return {k: v["tokens"] for k, v in res.items()}, core.stats().num_preemptions

    roomy, roomy_preemptions = run(400)
    tight, tight_preemptions = run(1 + 24)
    assert roomy_preemptions == 0 and tight_preemptions > 0
    assert tight == roomy


def test_abort_removes_waiting_and_running_requests_and_frees_blocks():
    s = make(max_num_seqs=1)
    a = add(s, "a", 10)
    b = add(s, "b", 10)
    step(s)
    assert [r.request_id for r in s.abort(["a", "b", "unknown"])] == ["a", "b"]
    assert a.status == b.status == RequestStatus.FINISHED_ABORTED
    assert s.num_running == s.num_waiting == 0 and not s.has_unfinished()
    assert s.block_manager.usage == 0.0


def test_pause_wait_keeps_running_requests_stepping_but_admits_nothing():
    s = make(max_num_seqs=4)
    add(s, "a", 5)
    step(s)
    add(s, "b", 5)
    s.pause("wait")
    assert [r for r, _, _ in step(s)] == ["a"]
    assert s.num_unfinished_for_sync() == 1  # the queued request does not count
    s.resume()
    assert [r for r, _, _ in step(s)] == ["a", "b"]


def test_pause_keep_freezes_everything_until_resume():
    s = make()
    a = add(s, "a", 5)
    step(s)
    add(s, "b", 5)
    s.pause("keep")
    assert step(s) == [] and s.num_unfinished_for_sync() == 0 and not s.has_steppable_work()
    assert a.num_output_tokens == 1
    s.resume()
    assert [r for r, _, _ in step(s)] == ["a", "b"]


def test_pause_abort_aborts_everything_and_admits_new_requests_only_after_resume():
    s = make()
    add(s, "a", 5)
    step(s)
    add(s, "b", 5)
    assert sorted(r.request_id for r in s.pause("abort")) == ["a", "b"]
    add(s, "c", 5)
    assert step(s) == [] and s.num_unfinished_for_sync() == 0
    s.resume()
    assert [r for r, _, _ in step(s)] == ["c"]


def test_pause_rejects_unknown_mode():
    with pytest.raises(ValueError, match="abort, wait, keep"):
        make().pause("later")  # type: ignore[arg-type]


def test_throttled_step_admits_no_new_prefill_while_a_request_decodes():
    s = make(max_num_batched_tokens=64)
    add(s, "a", 5)
    step(s)  # a prefilled; decoding from now on
    add(s, "b", 5)
    assert [r for r, _, _ in step(s, throttle_new_prefills=True)] == ["a"]
    assert [r for r, _, _ in step(s, throttle_new_prefills=False)] == ["a", "b"]


def test_throttled_step_admits_anyway_when_the_last_unthrottled_step_was_budget_bound():
    s = make(max_num_batched_tokens=8, max_num_seqs=8)
    add(s, "a", 3)
    step(s)
    add(s, "b", 10)
    add(s, "c", 3)
    step(s)  # unthrottled: a decodes (1), b takes the other 7; c is left waiting for budget
    assert s.num_waiting == 1
    # throttled, but the last unthrottled step was capacity-bound: a 1 + b 3, then c is admitted
    assert [(r, n) for r, n, _ in step(s, throttle_new_prefills=True)] == [("a", 1), ("b", 3), ("c", 3)]


def test_throttled_step_holds_prefill_when_the_last_unthrottled_step_had_budget_left():
    s = make(max_num_batched_tokens=64)
    add(s, "x", 3)
    step(s)
    step(s)  # unthrottled, nothing left waiting
    add(s, "y", 3)
    assert [r for r, _, _ in step(s, throttle_new_prefills=True)] == ["x"]
    assert s.num_waiting == 1


def test_throttle_does_not_block_prefill_when_nothing_decodes():
    s = make()
    add(s, "a", 5)
    assert [r for r, _, _ in step(s, throttle_new_prefills=True)] == ["a"]


def test_load_counters_cover_waiting_and_partial_prefills_but_not_decodes():
    s = make(max_num_batched_tokens=16)
    add(s, "a", 3)
    step(s)  # a decodes from now on
    add(s, "b", 30)
    add(s, "c", 5)
    assert s.pending_prefill_tokens() == 35
    step(s)  # a: 1 decode, b: 15 of 30
    assert s.pending_prefill_tokens() == 15 + 5
    assert s.running_context_tokens() == (3 + 2) + 30


def test_prefill_tokens_counts_what_the_cache_did_not_cover_when_a_request_was_enqueued():
    s = make(max_num_batched_tokens=64)
    a = add(s, "a", 20)
    assert s.prefill_tokens == 20
    step(s)  # a's prompt is computed in one chunk; its 5 full blocks are cached
    assert s.prefill_tokens == 0
    s.finish(a, RequestStatus.FINISHED_STOPPED)
    b = add(s, "b", 24, base=1000 * ord("a"))  # the same first 20 tokens, then 4 more
    # the cached prefix is capped at (24 - 1) // 4 = 5 blocks: 20 tokens covered, 4 owed
    assert b.prefill_debt == 4 and s.prefill_tokens == 4
    add(s, "c", 30)
    assert s.prefill_tokens == 4 + 30
    s.abort(["c"])
    assert s.prefill_tokens == 4
    step(s)
    assert s.prefill_tokens == 0


def test_prefill_tokens_follows_chunks_preemption_aborts_and_retirement():
    """Without a prefix cache every owed token is a prompt token still to compute: the kept counter must match the
    O(queue) recount (pending_prefill_tokens) after every operation, through chunked prefills, preemptions that
    send decoding requests back to the queue, aborts in both queues, and finished requests."""
    import random

    rng = random.Random(5)
    bm = BlockManager(24, 4, enable_prefix_caching=False, reserve_scratch_block=True)  # small: preemptions
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=16)
    preempted = 0
    for k in range(300):
        op = rng.random()
        if op < 0.25:
            add(s, f"r{k}", rng.randint(1, 40), base=k * 50)
        elif op < 0.32 and s.requests:
            s.abort([rng.choice(sorted(s.requests))])
        else:
            step(s)
            done = [r for r in s.running if r.num_output_tokens >= 8 and rng.random() < 0.2]
            for r in done:
                r.status = RequestStatus.FINISHED_LENGTH
            s.retire(done)
        preempted = s.num_preemptions
        assert s.prefill_tokens == s.pending_prefill_tokens(), k
    assert preempted > 0  # the scenario exercised preemption
