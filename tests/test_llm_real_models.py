"""The offline API on the real built-in models: parity with transformers, prefix caching, preemption, seeds.

These go through ``asyncdp.LLM`` end to end (scheduler, block manager, torch model runner, sampler), so they
check the pieces together rather than one at a time.
"""

import random

import pytest
import torch

import asyncdp
from asyncdp import LLM, SamplingParams
from asyncdp.errors import InvalidSamplingParams, ModelNotFoundError, PromptTooLongError
from asyncdp.model import load_tokenizer, resolve_model

MODELS = ["builtin:tiny-dense", "builtin:tiny-moe"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(32, 126) for _ in range(rng.randint(5, 60))] for _ in range(n)]


def _hf_greedy(model: str, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    import transformers

    path = resolve_model(model)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path)).eval()
    out = []
    for p in prompts:  # one at a time: no padding can change the reference
        ids = torch.tensor([p])
        gen = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, min_new_tokens=max_new,
                          do_sample=False, pad_token_id=0)
        out.append(gen[0, len(p):].tolist())
    return out


@pytest.mark.parametrize("model", MODELS)
def test_greedy_batch_matches_transformers_generate_token_for_token(model):
    prompts = _prompts(6)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    with LLM(model, max_num_seqs=8) as llm:
        ours = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    assert ours == _hf_greedy(model, prompts, 12)


@pytest.mark.parametrize("model", MODELS)
def test_outputs_identical_with_prefix_caching_off_and_under_preemption(model):
    shared = [65 + i % 26 for i in range(48)]  # a shared prefix long enough to fill blocks
    prompts = [shared + p for p in _prompts(8, seed=1)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with LLM(model, enable_prefix_caching=True, block_size=16) as llm:
        cached = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
        hits = llm.llm_engine.stats().prefix_cache_hits
    with LLM(model, enable_prefix_caching=False, block_size=16) as llm:
        uncached = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    # 16 blocks of 16 tokens cannot hold 8 sequences of ~130 tokens: the scheduler must preempt.
    with LLM(model, num_kv_blocks=17, block_size=16, max_model_len=256) as llm:
        squeezed = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
        preemptions = llm.llm_engine.stats().num_preemptions
    assert hits > 0
    assert preemptions > 0
    assert cached == uncached == squeezed


def test_seeded_sampling_is_reproducible_whatever_the_batch():
    target = _prompts(1, seed=7)[0]
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    noise = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    with LLM("builtin:tiny-dense") as llm:
        alone = llm.generate([target], params)[0].outputs[0].token_ids
        batch = llm.generate([*_prompts(5, seed=8), target], [noise] * 5 + [params])
    assert batch[-1].outputs[0].token_ids == alone


def test_bad_input_raises_one_clear_exception_naming_the_field():
    with pytest.raises(ModelNotFoundError, match="tiny-nope"):
        LLM("builtin:tiny-nope")
    with LLM("builtin:tiny-dense", max_model_len=64) as llm:
        with pytest.raises(PromptTooLongError, match="max_model_len"):
            llm.generate([[70] * 80], SamplingParams(max_tokens=4))
        with pytest.raises(InvalidSamplingParams, match="temperature"):
            llm.generate(["hi"], SamplingParams(temperature=-1.0))
        with pytest.raises(InvalidSamplingParams, match="top_p"):
            llm.generate(["hi"], SamplingParams(top_p=0.0))
        # The engine is still usable after rejected input: nothing half-added stays behind.
        out = llm.generate(["hello"], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 3
        assert not llm.llm_engine.has_unfinished()


def test_text_prompts_decode_to_the_same_text_the_tokenizer_gives():
    tok = load_tokenizer(resolve_model("builtin:tiny-dense"))
    with LLM("builtin:tiny-dense") as llm:
        out = llm.generate("Once upon a time", SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))[0]
    completion = out.outputs[0]
    assert completion.finish_reason == "length"
    assert completion.text == tok.decode(completion.token_ids, skip_special_tokens=True)


def test_public_api_is_pinned():
    assert sorted(asyncdp.__all__) == sorted(["LLM", "CompletionOutput", "RequestOutput", "SamplingParams", "StructuredOutputs",
                                              "__version__"])
    for name in asyncdp.__all__:
        assert getattr(asyncdp, name) is not None


def test_prompt_token_ids_outside_the_vocabulary_are_rejected_before_the_model():
    from asyncdp.errors import InvalidRequestError

    with LLM("builtin:tiny-dense") as llm:
        vocab = llm.llm_engine.executor.vocab_size
        with pytest.raises(InvalidRequestError, match="prompt"):
            llm.generate([[65, vocab + 5, 66]], SamplingParams(max_tokens=2))
        out = llm.generate([[65, 66]], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 2
