"""Offline LLM API and the engine factory, with a fake ``asyncdp.model`` (no checkpoint, no torch)."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from engine_testing import EOS_ID, VOCAB_SIZE, ScriptedExecutor, make_byte_tokenizer

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.build import build_engine_core
from asyncdp.errors import (
    ConfigError,
    InvalidRequestError,
    InvalidSamplingParams,
    ModelNotFoundError,
    PromptTooLongError,
    ShuttingDownError,
)
from asyncdp.llm import LLM
from asyncdp.sampling_params import SamplingParams


@dataclass
class FakeInfo:
    vocab_size: int = VOCAB_SIZE
    max_position_embeddings: int = 256
    eos_token_ids: frozenset = frozenset({EOS_ID})
    is_moe: bool = False
    num_experts: int = 0
    generation_defaults: tuple = ()  # (ModelInfo's: no sampling defaults in generation_config.json)


def hf_tokenizer():
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=make_byte_tokenizer(), eos_token="<eos>")


@pytest.fixture
def fake_model(monkeypatch):
    built: list[ScriptedExecutor] = []
    mod = types.ModuleType("asyncdp.model")

    def resolve_model(name):
        if name != "builtin:fake":
            raise ModelNotFoundError(f"unknown model {name!r}")
        return Path("/nonexistent/fake")

    mod.resolve_model = resolve_model
    mod.resolve_tokenizer = lambda tokenizer, model_path: model_path
    mod.load_tokenizer = lambda path: hf_tokenizer()
    mod.read_model_info = lambda path: FakeInfo()
    runner = types.ModuleType("asyncdp.engine.model_runner")

    class TorchExecutor(ScriptedExecutor):
        def __init__(self, config, model_path, *, dp=None, dp_rank=0):
            super().__init__({}, num_kv_blocks=config.num_kv_blocks or 64, max_model_len=256)
            built.append(self)

    runner.TorchExecutor = TorchExecutor
    monkeypatch.setitem(sys.modules, "asyncdp.model", mod)
    monkeypatch.setitem(sys.modules, "asyncdp.engine.model_runner", runner)
    return built


def test_generate_returns_outputs_in_prompt_order_for_mixed_prompt_forms(fake_model):
    llm = LLM("builtin:fake", executor="sim", num_kv_blocks=128)
    params = SamplingParams(max_tokens=4)
    outs = llm.generate(["hello", "a much longer prompt than the first", "x"], params)
    assert [o.prompt for o in outs] == ["hello", "a much longer prompt than the first", "x"]
    assert all(o.finished and len(o.outputs[0].token_ids) == 4 for o in outs)
    assert outs[0].outputs[0].finish_reason == "length"
    single = llm.generate([104, 105], params)  # one prompt given as token ids
    assert len(single) == 1 and single[0].prompt_token_ids == [104, 105]
    many = llm.generate([[104, 105], [106]], [params, SamplingParams(max_tokens=2)])
    assert [len(o.outputs[0].token_ids) for o in many] == [4, 2]
    assert outs[2].outputs[0].text == llm.generate("x", params)[0].outputs[0].text


def test_n_greater_than_one_fans_out_into_indexed_completions(fake_model):
    llm = LLM("builtin:fake", executor="sim", num_kv_blocks=128)
    out = llm.generate("hi", SamplingParams(n=3, max_tokens=3, seed=5))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 3 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # seeds 5, 6, 7


def test_invalid_params_leave_no_request_behind(fake_model):
    llm = LLM("builtin:fake", executor="sim", num_kv_blocks=128)
    with pytest.raises(InvalidSamplingParams):
        llm.generate(["ok", "bad"], [SamplingParams(), SamplingParams(temperature=-1.0)])
    assert not llm.llm_engine.has_unfinished()
    assert llm.generate("ok", SamplingParams(max_tokens=2))[0].finished


def test_factory_builds_the_torch_executor_by_default(fake_model):
    core = build_engine_core(EngineConfig(model="builtin:fake", num_kv_blocks=32))
    assert core.executor is fake_model[0] and core.max_model_len == 256


def test_factory_shuts_the_executor_down_when_the_core_cannot_be_built(fake_model):
    with pytest.raises(ConfigError, match="--max-model-len"):
        build_engine_core(EngineConfig(model="builtin:fake", num_kv_blocks=4, max_model_len=200))
    assert fake_model[0].shut_down


def test_factory_rejects_max_model_len_beyond_the_model(fake_model):
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        build_engine_core(EngineConfig(model="builtin:fake", executor="sim", max_model_len=1000))
    assert fake_model == []


def test_unknown_model_raises_model_not_found(fake_model):
    with pytest.raises(ModelNotFoundError):
        LLM("builtin:nope", executor="sim")


def test_text_of_a_completion_matches_decoding_its_tokens(fake_model):
    llm = LLM("builtin:fake", num_kv_blocks=128)  # the fake torch executor plays scripted tokens
    llm.llm_engine.executor.scripts = {"0": list("h\u00e9llo w\u00f6rld \u20ac!".encode()) + [EOS_ID]}
    out = llm.generate("hi", SamplingParams(max_tokens=40))[0].outputs[0]
    assert out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True) == "h\u00e9llo w\u00f6rld \u20ac!"
    assert out.finish_reason == "stop"


def test_an_engine_argument_of_the_wrong_type_is_a_config_error_naming_the_keyword(fake_model):
    with pytest.raises(ConfigError, match=r"max_num_seqs \(--max-num-seqs\) must be int \(got '8'\)"):
        LLM("builtin:fake", executor="sim", max_num_seqs="8")


@pytest.mark.parametrize(("prompts", "where"), [
    (None, "prompts"), (5, "prompts"), (b"hi", "prompts"), ([b"hi"], r"prompts\[0\]"),
    (np.array([104, 105]), r"prompts\[0\]"), ({"text": "hi"}, "prompts"), ({"prompt": 5}, "prompts"),
    ({"prompt_token_ids": "hi"}, "prompts"), ([[104, 105], [1.5, 2.0]], r"prompts\[1\]"), ([[True]], r"prompts\[0\]"),
])
def test_a_prompt_of_an_unaccepted_type_is_refused_at_the_boundary(fake_model, prompts, where):
    llm = LLM("builtin:fake", executor="sim", num_kv_blocks=128)
    with pytest.raises(InvalidRequestError, match=f"^{where} must be a string, a list of token ids") as err:
        llm.generate(prompts, SamplingParams(max_tokens=2))
    assert err.value.field == "prompts"
    assert not llm.llm_engine.has_unfinished()


def test_sampling_params_of_an_unaccepted_type_are_refused_naming_the_argument(fake_model):
    llm = LLM("builtin:fake", executor="sim", num_kv_blocks=128)
    for bad in ({"max_tokens": 3}, [SamplingParams(), {"max_tokens": 3}]):
        with pytest.raises(InvalidRequestError, match="sampling_params must be a SamplingParams") as err:
            llm.generate(["a", "b"], bad)
        assert err.value.field == "sampling_params"


def test_accepted_prompt_forms_still_generate(fake_model):
    llm = LLM("builtin:fake", executor="sim", num_kv_blocks=128)
    params = SamplingParams(max_tokens=2)
    outs = llm.generate(({"prompt_token_ids": (104, 105)}, {"prompt": "hi"}, (104,)), params)
    assert [o.prompt_token_ids for o in outs] == [[104, 105], list(b"hi"), [104]]
    assert len(llm.generate((p for p in ["a", "b"]), params)) == 2 and llm.generate([], params) == []


def test_an_llm_used_after_shutdown_says_it_is_shut_down(fake_model):
    with LLM("builtin:fake", num_kv_blocks=128) as llm:  # the fake torch executor records its shutdown
        assert llm.generate("hi", SamplingParams(max_tokens=2))[0].finished
    assert fake_model[0].shut_down
    with pytest.raises(ShuttingDownError, match="this LLM is shut down"):
        llm.generate("hi", SamplingParams(max_tokens=2))
    llm.shutdown()  # idempotent
    other = LLM("builtin:fake", executor="sim", num_kv_blocks=128)
    other.shutdown()
    with pytest.raises(ShuttingDownError, match="this LLM is shut down"):
        other.generate([[104]])


@pytest.mark.parametrize("prompts", ["", [[]], {"prompt_token_ids": []}])
def test_an_empty_prompt_is_an_invalid_request_not_a_prompt_too_long(fake_model, prompts):
    llm = LLM("builtin:fake", executor="sim", num_kv_blocks=128)
    with pytest.raises(InvalidRequestError, match="at least one token") as err:
        llm.generate(prompts, SamplingParams(max_tokens=2))
    assert not isinstance(err.value, PromptTooLongError) and err.value.field == "prompt"
    assert not llm.llm_engine.has_unfinished()


def test_n_samples_of_the_largest_seed_wrap_into_64_bits_as_the_http_api_does(fake_model):
    llm = LLM("builtin:fake", executor="sim", num_kv_blocks=128)  # the sim executor's tokens follow the seed
    out = llm.generate("hi", SamplingParams(n=2, seed=2**64 - 1, max_tokens=4))[0].outputs
    alone = [llm.generate("hi", SamplingParams(seed=seed, max_tokens=4))[0].outputs[0] for seed in (2**64 - 1, 0)]
    assert [c.token_ids for c in out] == [c.token_ids for c in alone]
