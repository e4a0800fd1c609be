"""Prompt logprobs in the engine core (sim executor): filed per position, sent once on the first output, kept
across preemption, no prefix-cache hit while owed; and what the scheduler hands the executor for them."""

from __future__ import annotations

import math

from engine_testing import VOCAB_SIZE, encode, scripted_core, sim_core

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.executor import ModelBatch, ScheduledChunk
from asyncdp.engine.request import RequestStatus
from asyncdp.engine.sim_executor import SimExecutor
from asyncdp.messages import RequestOutput
from asyncdp.sampling_params import SamplingParams

UNIFORM = -math.log(VOCAB_SIZE)


def outputs_by_request(core) -> dict[str, list[RequestOutput]]:
    seen: dict[str, list[RequestOutput]] = {}
    while core.has_unfinished():
        for out in core.step().outputs:
            seen.setdefault(out.request_id, []).append(out)
    return seen


def assert_uniform_prompt_logprobs(prompt: list[int], outs: list[RequestOutput], top: int) -> None:
    assert outs[0].prompt_logprobs is not None and all(o.prompt_logprobs is None for o in outs[1:])
    entries = outs[0].prompt_logprobs
    assert len(entries) == len(prompt) and entries[0] is None
    for token, entry in zip(prompt[1:], entries[1:], strict=True):
        assert entry is not None and entry.token_id == token and entry.logprob == UNIFORM
        assert [t.token_id for t in entry.top] == list(range(top))


def test_sim_prompt_logprobs_cover_each_chunk_row_that_predicts_a_prompt_token() -> None:
    ex = SimExecutor(EngineConfig(executor="sim"), VOCAB_SIZE, max_model_len=64)
    prompt = encode("abcdef")
    params = SamplingParams(prompt_logprobs=1)
    first = ScheduledChunk("a", prompt[:4], 0, [1, 2], False, params, 0, prompt, [], 1)
    last = ScheduledChunk("a", prompt[4:], 4, [1, 2], True, params, 0, prompt, [], 1)
    plain = ScheduledChunk("b", [7], 3, [3], True, SamplingParams(), 0)
    res = ex.execute(ModelBatch([first, plain]))
    assert res.prompt_logprobs is not None and res.prompt_logprobs[1] is None
    assert [e.token_id for e in res.prompt_logprobs[0]] == prompt[1:5]  # rows 0..3 predict tokens 1..4
    res = ex.execute(ModelBatch([last]))
    assert res.prompt_logprobs is not None
    assert [e.token_id for e in res.prompt_logprobs[0]] == prompt[5:]  # the last row predicts an output token
    assert ex.execute(ModelBatch([plain])).prompt_logprobs is None


def test_prompt_logprobs_come_once_on_the_first_output_with_chunked_prefill() -> None:
    core = sim_core(max_num_batched_tokens=3)
    prompt = encode("a longer prompt")
    core.add_request("a", prompt, SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=2))
    core.add_request("b", prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    seen = outputs_by_request(core)
    assert_uniform_prompt_logprobs(prompt, seen["a"], 2)
    assert all(o.prompt_logprobs is None for o in seen["b"])


def test_prompt_logprobs_are_neither_lost_nor_repeated_when_preempted_before_and_after_the_first_output() -> None:
    core = sim_core(num_kv_blocks=11, block_size=4, max_num_batched_tokens=8)
    prompts = {f"r{i}": encode(f"prompt {i} " * 2) for i in range(4)}
    for rid, prompt in prompts.items():
        core.add_request(rid, prompt, SamplingParams(max_tokens=8, ignore_eos=True, prompt_logprobs=2))
    seen: dict[str, list[RequestOutput]] = {}
    preempted_before = preempted_after = 0
    while core.has_unfinished():
        for out in core.step().outputs:
            seen.setdefault(out.request_id, []).append(out)
        for req in core.scheduler.waiting:
            if req.status == RequestStatus.PREEMPTED:
                preempted_after += bool(req.output_token_ids)
                preempted_before += not req.output_token_ids
    assert preempted_before and preempted_after
    for rid, prompt in prompts.items():
        assert_uniform_prompt_logprobs(prompt, seen[rid], 2)


def test_a_request_owed_prompt_logprobs_takes_no_prefix_hit_but_publishes_its_blocks() -> None:
    core, ex = scripted_core({}, block_size=4)
    prompt = encode("shared prefix, twice over")
    core.add_request("asks", prompt, SamplingParams(max_tokens=2, prompt_logprobs=0))
    core.step()
    assert ex.batches[0].chunks[0].start_pos == 0
    core.add_request("later", prompt, SamplingParams(max_tokens=2))
    core.add_request("asks-too", prompt, SamplingParams(max_tokens=2, prompt_logprobs=0))
    core.step()
    starts = {c.request_id: c.start_pos for c in ex.batches[1].chunks}
    assert starts["later"] > 0 and starts["asks-too"] == 0


def test_chunks_reference_the_requests_token_lists_without_copying() -> None:
    core, ex = scripted_core({})
    core.add_request("a", encode("hi"), SamplingParams(max_tokens=3, presence_penalty=1.0))
    core.step()
    core.step()
    req = core.scheduler.requests["a"]
    for batch in ex.batches:
        chunk = batch.chunks[0]
        assert chunk.prompt_token_ids is req.prompt_token_ids and chunk.output_token_ids is req.output_token_ids
        assert chunk.prompt_logprobs is None
