"""The sampler's token filters: ``allowed_token_ids`` and ``bad_words`` are never sampled, whatever the seed, the
temperature, the batch or the other processors; logprobs stay raw (vLLM's default); unused, they cost nothing.

Through the whole engine on the built-in dense checkpoint too: every generated id is allowed, no bad word is ever
generated, with n > 1 and alongside a grammar."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from asyncdp.config.flags import EngineConfig
from asyncdp.engine import sampler as sampler_module
from asyncdp.engine.build import build_engine_core
from asyncdp.engine.sampler import Sampler
from asyncdp.llm import LLM
from asyncdp.sampling_params import SamplingParams, StructuredOutputs

VOCAB = 50
EOS = 7
ALLOWED = (3, 11, 29, 48)


def logits(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.5])
def test_only_allowed_ids_are_sampled_over_many_steps_and_seeds(temperature: float) -> None:
    seen: set[int] = set()
    for step in range(60):
        params = [SamplingParams(temperature=temperature, allowed_token_ids=ALLOWED, seed=step),
                  SamplingParams(temperature=temperature, allowed_token_ids=ALLOWED, top_k=3, logit_bias={5: 100.0}),
                  SamplingParams(temperature=temperature)]
        tokens, _ = Sampler({EOS}, seed=step)(logits(3, step), params, [step] * 3)
        assert tokens[0] in ALLOWED and tokens[1] in ALLOWED, tokens  # a +100 bias does not lift the mask
        seen.update(tokens[:2])
    if temperature:
        assert seen == set(ALLOWED)  # every allowed id can still come


def test_an_unfiltered_row_of_the_batch_is_untouched() -> None:
    batch = logits(2, 1)
    plain = [SamplingParams(temperature=0.0)] * 2
    mixed = [SamplingParams(temperature=0.0, allowed_token_ids=[3]), SamplingParams(temperature=0.0)]
    assert Sampler({EOS})(batch, mixed, [0, 0])[0] == [3, Sampler({EOS})(batch, plain, [0, 0])[0][1]]


def test_bad_words_are_never_completed_over_many_steps_and_seeds() -> None:
    """Uniform logits over four ids: without the filter, (1, 2) and 3 come up all the time."""
    bad = SamplingParams(temperature=1.0, allowed_token_ids=[0, 1, 2, 3], bad_words_token_ids=[[1, 2], [3]])
    sampler = Sampler({EOS}, seed=0)
    for seed in range(20):
        out: list[int] = []
        params = SamplingParams(temperature=1.0, seed=seed, allowed_token_ids=[0, 1, 2, 3],
                                bad_words_token_ids=[[1, 2], [3]])
        for step in range(40):
            tokens, _ = sampler(torch.zeros(2, VOCAB), [params, bad], [step, step], output_token_ids=[out, out])
            out.append(tokens[0])
            assert tokens[1] != 3 and not (out[-2:-1] == [1] and tokens[1] == 2)
        assert 3 not in out and all(out[i:i + 2] != [1, 2] for i in range(len(out)))
        if seed == 0:
            assert {0, 1, 2} <= set(out)  # the rest still comes


def test_a_greedy_row_takes_the_best_token_the_filters_leave() -> None:
    row = torch.zeros(1, VOCAB)
    row[0, 10], row[0, 11], row[0, 12] = 5.0, 4.0, 3.0
    params = [SamplingParams(temperature=0.0, bad_words_token_ids=[[9, 10], [11]])]
    assert Sampler({EOS})(row, params, [1], output_token_ids=[[9]])[0] == [12]
    assert Sampler({EOS})(row, params, [1], output_token_ids=[[8]])[0] == [10]


def test_logprobs_are_raw_as_vllm_reports_them() -> None:
    row = torch.zeros(1, VOCAB)
    row[0, 10], row[0, 11] = 5.0, 4.0
    params = [SamplingParams(temperature=0.0, allowed_token_ids=[11], logprobs=1)]
    tokens, lps = Sampler({EOS})(row, params, [0])
    assert tokens == [11] and lps is not None and lps[0] is not None
    raw = torch.log_softmax(row, dim=-1)
    assert lps[0].top[0].token_id == 10 and abs(lps[0].logprob - raw[0, 11].item()) < 1e-6


def test_a_grammar_mask_and_the_filters_combine() -> None:
    row = logits(1, 5)
    grammar = (list(range(1)), torch.tensor([[t in (3, 11, 20) for t in range(VOCAB)]]))
    for seed in range(30):
        params = [SamplingParams(temperature=1.0, seed=seed, allowed_token_ids=[11, 20, 30],
                                 bad_words_token_ids=[[20]])]
        assert Sampler({EOS})(row, params, [0], token_mask=grammar)[0] == [11]


def test_unused_filters_keep_the_greedy_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("a filter ran for a batch that has none")

    monkeypatch.setattr(sampler_module, "allowed_mask", fail)
    monkeypatch.setattr(sampler_module, "apply_bad_words", fail)
    batch = logits(3, 2)
    tokens, lps = Sampler({EOS})(batch, [SamplingParams(temperature=0.0)] * 3, [0] * 3)
    assert tokens == batch.argmax(dim=-1).tolist() and lps is None
    Sampler({EOS})(batch, [SamplingParams(temperature=1.0, logprobs=2)] * 3, [0] * 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_filters_on_cuda_sample_only_what_they_allow() -> None:
    sampler = Sampler({EOS}, device=torch.device("cuda"))
    for step in range(30):
        params = [SamplingParams(temperature=1.0, allowed_token_ids=ALLOWED, bad_words_token_ids=[[3]]),
                  SamplingParams(temperature=0.0, allowed_token_ids=ALLOWED, logprobs=2)]
        tokens, _ = sampler(logits(2, step).cuda(), params, [step, step], output_token_ids=[[], []])
        assert tokens[0] in ALLOWED and tokens[0] != 3 and tokens[1] in ALLOWED


def test_the_engine_generates_only_allowed_ids_and_never_a_bad_word(dense_path: Path) -> None:
    config = EngineConfig(model=str(dense_path), device="cpu", block_size=4, num_kv_blocks=80)
    llm = LLM.from_engine_core(build_engine_core(config))
    a, b, c = (ord(x) for x in "abc")  # the built-in models' tokenizer is byte-level
    allowed = SamplingParams(temperature=1.0, seed=1, n=3, max_tokens=24, allowed_token_ids=[a, b, c])
    banned = SamplingParams(temperature=1.0, seed=2, n=3, max_tokens=24, allowed_token_ids=[a, b, c],
                            bad_words=["ab", "c"])
    for params in (allowed, banned):
        for result in llm.generate([[72, 105], [1, 2, 3]], params):
            for out in result.outputs:
                assert len(out.token_ids) == 24 and set(out.token_ids) <= {a, b, c}, out
                if params is banned:  # tokenized by the engine core (offline: no API server did it)
                    assert "c" not in out.text and "ab" not in out.text, out.text


@pytest.mark.skipif(importlib.util.find_spec("llguidance") is None, reason="needs llguidance")
def test_the_engine_applies_a_grammar_and_the_filters_together(dense_path: Path) -> None:
    config = EngineConfig(model=str(dense_path), device="cpu", block_size=4, num_kv_blocks=80)
    llm = LLM.from_engine_core(build_engine_core(config))
    params = SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=12, structured=StructuredOutputs(regex="[a-d]+"),
                            allowed_token_ids=[ord(x) for x in "abcz"], bad_words=["b"])
    for out in llm.generate([[72, 105]], params)[0].outputs:
        assert out.text and set(out.text) <= {"a", "c"}, out.text
