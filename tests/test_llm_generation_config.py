"""The offline ``LLM`` and vLLM's engine arguments ``generation_config``, ``override_generation_config`` and
``max_logprobs`` (docs/howto/offline.md): ``generate`` without sampling params uses ``get_default_sampling_params()``,
the checkpoint's sampling defaults (``max_new_tokens`` as ``max_tokens``) as vLLM's ``LLM`` does; explicit params
are used as they are; logprobs are bounded by ``max_logprobs`` with vLLM's message."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from asyncdp import LLM, SamplingParams
from asyncdp.errors import ConfigError, InvalidSamplingParams
from asyncdp.model import export_builtin

PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def recommending_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-dense whose generation_config.json recommends sampling defaults and an output length."""
    path = export_builtin("builtin:tiny-dense", tmp_path_factory.mktemp("recommending"))
    generation = json.loads((path / "generation_config.json").read_text())
    generation.update(temperature=0.0, top_k=5, max_new_tokens=5, do_sample=False)
    (path / "generation_config.json").write_text(json.dumps(generation))
    return path


def test_generate_without_params_uses_the_checkpoints_defaults_and_given_params_as_they_are(recommending_path, caplog):
    caplog.set_level(logging.WARNING, logger="asyncdp.llm")
    with LLM(str(recommending_path), executor="sim") as llm:
        assert llm.get_default_sampling_params() == SamplingParams(temperature=0.0, top_k=5, max_tokens=5)
        assert len(llm.generate([PROMPT])[0].outputs[0].token_ids) == 5  # (sim: never EOS; 16 without a default)
        assert len(llm.generate([PROMPT], SamplingParams(max_tokens=2))[0].outputs[0].token_ids) == 2
    said = [r.getMessage() for r in caplog.records if "Default sampling parameters" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith(
        "Using default sampling params from model: {'temperature': 0.0, 'top_k': 5, 'max_tokens': 5}"), said


def test_vllm_ignores_the_checkpoints_defaults_and_the_override_adds_to_them(recommending_path):
    with LLM(str(recommending_path), executor="sim", generation_config="vllm") as llm:
        assert llm.get_default_sampling_params() == SamplingParams()
        assert len(llm.generate([PROMPT])[0].outputs[0].token_ids) == 16  # vLLM's SamplingParams() default
    with LLM(str(recommending_path), executor="sim",
             override_generation_config={"temperature": 0.5, "max_new_tokens": 3}) as llm:
        assert llm.get_default_sampling_params() == SamplingParams(temperature=0.5, top_k=5, max_tokens=3)


@pytest.mark.parametrize("name", ["builtin:tiny-dense", "builtin:tiny-moe"])
def test_a_builtin_models_defaults_are_vllms_neutral_ones(name, caplog):
    caplog.set_level(logging.WARNING, logger="asyncdp.llm")
    with LLM(name, executor="sim") as llm:
        assert llm.get_default_sampling_params() == SamplingParams()
    assert not [r for r in caplog.records if r.name == "asyncdp.llm"]


def test_bad_generation_arguments_raise_config_errors_before_loading(tmp_path):
    with pytest.raises(ConfigError, match="--generation-config must be auto, vllm or a folder"):
        LLM("builtin:tiny-dense", executor="sim", generation_config=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="temperature must be >= 0 and finite"):
        LLM("builtin:tiny-dense", executor="sim", override_generation_config={"temperature": -1})
    with pytest.raises(ConfigError, match=r"max_logprobs must be -1 \(no limit\) or >= 0 \(got -2\)"):
        LLM("builtin:tiny-dense", executor="sim", max_logprobs=-2)


def test_max_logprobs_bounds_logprobs_as_vllms_engine_does():
    with LLM("builtin:tiny-dense") as llm:  # vLLM's default: 20
        for params, message in ((SamplingParams(max_tokens=1, logprobs=21), "sample logprobs of 21"),
                                (SamplingParams(max_tokens=1, prompt_logprobs=21), "prompt logprobs of 21")):
            with pytest.raises(InvalidSamplingParams, match=f"Requested {message}, which is greater than max "
                                                            f"allowed: 20"):
                llm.generate([PROMPT], params)
    with LLM("builtin:tiny-dense", max_logprobs=30) as llm:
        out = llm.generate([PROMPT], SamplingParams(max_tokens=1, logprobs=25, prompt_logprobs=25))[0]
        assert len(out.outputs[0].logprobs[0].top) == 25 and len(out.prompt_logprobs[1].top) == 25
    with LLM("builtin:tiny-dense", max_logprobs=-1) as llm:  # the vocabulary is the only limit
        vocab = len(llm.get_tokenizer())
        out = llm.generate([PROMPT], SamplingParams(max_tokens=1, logprobs=vocab))[0]
        assert len(out.outputs[0].logprobs[0].top) == vocab
        with pytest.raises(InvalidSamplingParams, match=f"greater than max allowed: {vocab}"):
            llm.generate([PROMPT], SamplingParams(max_tokens=1, logprobs=vocab + 1))
