"""A request's tokens do not depend on how the engine scheduled it (tiny-dense on the CPU, through ``LLM``).

The reference for every prompt is the prompt alone on a fresh engine. Each path is then run over prompts that
share prefixes with each other (ending on a block boundary, mid-block, covering the whole prompt) and with
earlier outputs (a prompt that continues a previous answer hits blocks published while decoding), and must
give the reference tokens: batched, with the prefix cache warm, with KV blocks so scarce that requests are
preempted and recomputed, with chunked prefill, with logprobs asked for. Each test also checks that its path
really ran (preemptions, cache hits), so a change of defaults cannot turn it into another batched run.
"""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.build import build_engine_core
from asyncdp.llm import LLM
from asyncdp.sampling_params import SamplingParams

MAX_MODEL_LEN = 64
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def make_prompts() -> list[list[int]]:
    rng = random.Random(7)
    base = [rng.randrange(32, 127) for _ in range(24)]
    # Shared prefixes of 0..24 tokens with blocks of 4: none, mid-block, on a boundary, the whole base prompt.
    out = [base[:k] + [rng.randrange(32, 127) for _ in range(rng.randrange(1 if k else 2, 6))]
           for k in (0, 3, 4, 5, 8, 11, 16, 23)]
    return [*out, base, base[:16]]  # base[:16]: a hit covering the whole prompt (capped to leave one token)


PROMPTS = make_prompts()


def llm(path: Path, **changes: object) -> LLM:
    config = EngineConfig(model=str(path), device="cpu", block_size=4, num_kv_blocks=128,
                          max_model_len=MAX_MODEL_LEN).replace(**changes)
    return LLM.from_engine_core(build_engine_core(config))


def tokens(results: list) -> list[list[int]]:
    return [r.outputs[0].token_ids for r in results]


def alone(path: Path, prompts: list[list[int]],
          params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
    each = params if isinstance(params, list) else [params] * len(prompts)
    return [tokens(llm(path).generate([p], sp))[0] for p, sp in zip(prompts, each, strict=True)]


@pytest.fixture(scope="module")
def reference(dense_path: Path) -> list[list[int]]:
    return alone(dense_path, PROMPTS, GREEDY)


def continuations(prompts: list[list[int]], outs: list[list[int]]) -> list[list[int]]:
    """Each prompt followed by part of its answer: a later request hitting blocks filled while decoding."""
    return [p + o[:k] for p, o, k in zip(prompts, outs, (3, 5, 9, 12), strict=False)]


@pytest.mark.parametrize("engine_args", [
    {},  # batched, cold cache, then warm
    {"num_kv_blocks": 18, "max_num_batched_tokens": 48},  # 17 usable blocks for ~10 requests: preemptions
    {"max_num_batched_tokens": 5},  # chunked prefill, mid-block chunk ends
    {"num_kv_blocks": 18, "max_num_batched_tokens": 7, "max_num_seqs": 3},  # both, and a full running list
    {"block_size": 1, "num_kv_blocks": 400},
    {"block_size": 16, "num_kv_blocks": 12},
])
def test_greedy_tokens_do_not_depend_on_batching_cache_preemption_or_chunking(
        dense_path: Path, reference: list[list[int]], engine_args: dict) -> None:
    engine = llm(dense_path, **engine_args)
    assert tokens(engine.generate(PROMPTS, GREEDY)) == reference
    warm = engine.generate(PROMPTS, GREEDY)
    assert tokens(warm) == reference
    if not engine_args:  # with room for all, every prompt but the first (no shared prefix) hits the cache
        assert all(r.num_cached_tokens > 0 for r in warm[1:])
    follow = continuations(PROMPTS, reference)
    assert tokens(engine.generate(follow, GREEDY)) == alone(dense_path, follow, GREEDY)
    assert engine.llm_engine.block_manager.prefix_cache_hits > 0
    if engine_args.get("num_kv_blocks") == 18:
        assert engine.llm_engine.scheduler.num_preemptions > 0


def test_asking_for_logprobs_does_not_change_greedy_tokens(
        dense_path: Path, reference: list[list[int]]) -> None:
    with_logprobs = msgspec.structs.replace(GREEDY, logprobs=3)
    results = llm(dense_path).generate(PROMPTS, with_logprobs)
    assert tokens(results) == reference
    assert all(len(r.outputs[0].logprobs or []) == GREEDY.max_tokens for r in results)


def test_seeded_samples_do_not_depend_on_batching_preemption_logprobs_or_the_rank(dense_path: Path) -> None:
    rng = random.Random(3)
    params = [SamplingParams(temperature=rng.choice([0.7, 1.0, 1.5]), top_p=rng.choice([1.0, 0.9]),
                             top_k=rng.choice([0, 20]), seed=rng.randrange(2**32), max_tokens=12,
                             ignore_eos=True)
              for _ in PROMPTS]
    expected = alone(dense_path, PROMPTS, params)
    mixed = [*PROMPTS, *PROMPTS[:4]]  # next to unseeded samples, which draw from the shared generator
    unseeded = [SamplingParams(temperature=1.0, max_tokens=12)] * 4
    assert tokens(llm(dense_path).generate(mixed, params + unseeded))[:len(PROMPTS)] == expected
    scarce = llm(dense_path, num_kv_blocks=18, max_num_batched_tokens=7)
    assert tokens(scarce.generate(PROMPTS, params)) == expected
    assert scarce.llm_engine.scheduler.num_preemptions > 0
    logprobs = [msgspec.structs.replace(p, logprobs=2) for p in params]
    assert tokens(llm(dense_path).generate(PROMPTS, logprobs)) == expected
    config = EngineConfig(model=str(dense_path), device="cpu", block_size=4, num_kv_blocks=128,
                          max_model_len=MAX_MODEL_LEN)
    other_rank = LLM.from_engine_core(build_engine_core(config, dp_rank=3))
    assert tokens(other_rank.generate(PROMPTS, params)) == expected


def test_n_samples_are_the_seeded_requests_seed_plus_index_run_alone(dense_path: Path) -> None:
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=20, ignore_eos=True)
    engine = llm(dense_path, num_kv_blocks=17)  # 16 usable blocks, 3 x 44 tokens sharing 24: preemptions
    result, = engine.generate([PROMPTS[-2]], params)
    assert engine.llm_engine.scheduler.num_preemptions > 0
    single = [msgspec.structs.replace(params, n=1, seed=11 + k) for k in range(3)]
    assert [c.token_ids for c in result.outputs] == alone(dense_path, [PROMPTS[-2]] * 3, single)


def test_generation_runs_exactly_to_max_model_len_with_the_whole_prompt_counted(
        dense_path: Path, reference: list[list[int]]) -> None:
    engine = llm(dense_path)
    engine.generate([PROMPTS[-2]], GREEDY)  # warms the cache for the prompts below
    prompts = [PROMPTS[-2][:20], PROMPTS[-2], PROMPTS[-2] + [65] * 38]
    results = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True))
    for prompt, result in zip(prompts, results, strict=True):
        out = result.outputs[0]
        assert (len(out.token_ids), out.finish_reason) == (MAX_MODEL_LEN - len(prompt), "length")
        assert result.prompt_token_ids == prompt and result.num_cached_tokens > 0
    assert results[1].outputs[0].token_ids[:12] == reference[-2]


def test_generate_interrupted_in_a_forward_leaves_no_uncomputed_block_in_the_prefix_cache(
        dense_path: Path, reference: list[list[int]]) -> None:
    engine = llm(dense_path)
    executor = engine.llm_engine.executor
    real = executor.execute

    def interrupted(batch: object) -> object:
        executor.execute = real
        raise KeyboardInterrupt

    executor.execute = interrupted
    with pytest.raises(KeyboardInterrupt):
        engine.generate(PROMPTS[-2:], GREEDY)
    # Before the fix both prompts hit blocks whose KV no forward wrote, and answered with other tokens.
    assert tokens(engine.generate(PROMPTS[-2:], GREEDY)) == reference[-2:]
