"""Prompt logprobs of the torch engine against ``log_softmax`` of transformers' logits on the same checkpoint.

Entry i of a request's prompt logprobs is the logprob of prompt token i given tokens < i (entry 0 is None), with
the top-n alternatives. Checked with whole and chunked prefills (chunks spanning steps, one-token chunks among
decodes), with the prefix cache warm (the request must compute every position anyway), under preemption, and
through the offline ``LLM``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.build import build_engine_core
from asyncdp.engine.core import EngineCore
from asyncdp.llm import LLM
from asyncdp.messages import TokenLogprobs
from asyncdp.sampling_params import SamplingParams

TOP = 3
PROMPTS = [[(i * 37 + j * 11) % 200 + 30 for j in range(n)] for i, n in enumerate((23, 7, 2, 41))]
ASK = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=TOP)


def hf_prompt_logprobs(path: Path, prompt: list[int]) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path)).eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)


def assert_matches_reference(path: Path, prompt: list[int], got: list[TokenLogprobs | None] | None) -> None:
    assert got is not None and len(got) == len(prompt) and got[0] is None
    ref = hf_prompt_logprobs(path, prompt)
    for i in range(1, len(prompt)):
        entry = got[i]
        assert entry is not None and entry.token_id == prompt[i]
        assert entry.logprob == pytest.approx(ref[i - 1, prompt[i]].item(), abs=1e-4)
        values, ids = ref[i - 1].topk(TOP)
        assert [t.token_id for t in entry.top] == ids.tolist()
        assert [t.logprob for t in entry.top] == pytest.approx(values.tolist(), abs=1e-4)


def core_for(path: Path, **changes: object) -> EngineCore:
    config = EngineConfig(model=str(path), device="cpu", block_size=4, num_kv_blocks=80).replace(**changes)
    return build_engine_core(config)


def run(core: EngineCore, prompts: list[list[int]], params: SamplingParams, prefix: str
        ) -> dict[str, list[list[TokenLogprobs | None]]]:
    """Every prompt_logprobs field each request's outputs carried (must be exactly one, on the first output)."""
    seen: dict[str, list[list[TokenLogprobs | None]]] = {}
    firsts: set[str] = set()
    for i, p in enumerate(prompts):
        core.add_request(f"{prefix}{i}", p, params)
    while core.has_unfinished():
        for out in core.step().outputs:
            if out.prompt_logprobs is not None:
                assert out.request_id not in firsts, "prompt logprobs came after the first output"
                seen.setdefault(out.request_id, []).append(out.prompt_logprobs)
            firsts.add(out.request_id)
    return seen


@pytest.mark.parametrize("max_num_batched_tokens", [2048, 5])
def test_prompt_logprobs_equal_transformers_log_softmax(model_path: Path, max_num_batched_tokens: int) -> None:
    core = core_for(model_path, max_num_batched_tokens=max_num_batched_tokens)
    seen = run(core, PROMPTS, ASK, "r")
    for i, prompt in enumerate(PROMPTS):
        assert len(seen[f"r{i}"]) == 1
        assert_matches_reference(model_path, prompt, seen[f"r{i}"][0])


def test_prompt_logprobs_are_complete_when_the_prefix_is_already_cached(dense_path: Path) -> None:
    core = core_for(dense_path, enable_prefix_caching=True, max_num_batched_tokens=16)
    prompt = PROMPTS[3]
    run(core, [prompt], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), "warm")
    hits_before = core.stats().prefix_cache_hits
    assert run(core, [prompt], SamplingParams(temperature=0.0, max_tokens=2), "cached") == {}
    assert core.stats().prefix_cache_hits > hits_before  # the cache is warm for this prompt
    hits_before = core.stats().prefix_cache_hits
    seen = run(core, [prompt], ASK, "asks")
    assert core.stats().prefix_cache_hits == hits_before
    assert_matches_reference(dense_path, prompt, seen["asks0"][0])


def test_prompt_logprobs_survive_preemption_and_come_once(dense_path: Path) -> None:
    # 12 usable blocks of 4 tokens cannot hold four prompts of up to 41 tokens plus outputs: the scheduler preempts.
    core = core_for(dense_path, num_kv_blocks=13, max_num_batched_tokens=8, max_model_len=48)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, prompt_logprobs=TOP)
    seen = run(core, PROMPTS, params, "p")
    assert core.stats().num_preemptions > 0
    for i, prompt in enumerate(PROMPTS):
        assert len(seen[f"p{i}"]) == 1
        assert_matches_reference(dense_path, prompt, seen[f"p{i}"][0])


def test_offline_llm_exposes_prompt_logprobs_only_when_asked(dense_path: Path) -> None:
    llm = LLM.from_engine_core(core_for(dense_path))
    asked, plain = llm.generate([PROMPTS[0], PROMPTS[0]], [ASK, SamplingParams(max_tokens=2)])
    assert plain.prompt_logprobs is None
    assert_matches_reference(dense_path, PROMPTS[0], asked.prompt_logprobs)
    only_token = llm.generate(PROMPTS[1], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    assert only_token.prompt_logprobs is not None
    assert all(e is not None and e.top == () for e in only_token.prompt_logprobs[1:])
