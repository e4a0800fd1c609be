"""The offline ``LLM`` over an engine core whose tokenizer is a ``tokenizers.Tokenizer`` (no ``len``), as
``LLM.from_engine_core`` takes for custom executors: ``generate`` works, and ``max_logprobs=-1`` bounds logprobs by
that tokenizer's vocabulary (``get_vocab_size()``), as a Hugging Face tokenizer's ``len`` bounds them."""

from __future__ import annotations

import pytest
from engine_testing import VOCAB_SIZE
from test_engine_kv_consistency import make_core

from asyncdp.errors import InvalidSamplingParams
from asyncdp.llm import LLM
from asyncdp.sampling_params import SamplingParams


def test_generate_works_and_no_cap_is_the_tokenizers_vocabulary() -> None:
    llm = LLM.from_engine_core(make_core())
    assert len(llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3))[0].outputs[0].token_ids) == 3
    with pytest.raises(InvalidSamplingParams, match="greater than max allowed: 20"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=1, logprobs=21))
    llm.max_logprobs = -1
    with pytest.raises(InvalidSamplingParams, match=f"greater than max allowed: {VOCAB_SIZE}$"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=1, logprobs=VOCAB_SIZE + 1))
