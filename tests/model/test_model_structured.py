"""Structured outputs on a real model (the random-weight tiny dense one): the sampler's batched mask, and every
output of a constrained request following its grammar, greedy and sampled over several seeds."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from asyncdp import LLM, SamplingParams
from asyncdp.engine.executor import TokenMasks
from asyncdp.engine.sampler import Sampler, apply_allowed_tokens
from asyncdp.sampling_params import StructuredOutputs

pytest.importorskip("llguidance", reason="structured outputs need llguidance (pip install llguidance)")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}


def follows_schema(value: object) -> bool:
    """SCHEMA checked by hand (no jsonschema dependency)."""
    if not isinstance(value, dict) or set(value) != {"name", "age", "tags", "ok"}:
        return False
    name, age, tags, ok = value["name"], value["age"], value["tags"], value["ok"]
    return (isinstance(name, str) and len(name) <= 8 and type(age) is int and 0 <= age <= 150
            and isinstance(tags, list) and len(tags) <= 3 and all(t in ("a", "b") for t in tags)
            and isinstance(ok, bool))


def bitmask_of(allowed: list[set[int]], vocab: int) -> np.ndarray:
    """The library's layout: int32 words, bit t % 32 of word t // 32 set when token t is allowed."""
    words = np.zeros((len(allowed), (vocab + 31) // 32), dtype=np.uint32)
    for r, tokens in enumerate(allowed):
        for t in tokens:
            words[r, t // 32] |= np.uint32(1 << (t % 32))
    return words.view(np.int32)


def test_token_masks_unpack_bit_t_of_the_bitmask_as_token_t() -> None:
    vocab = 70
    allowed = [{0, 31, 32, 63, 69}, set()]
    unpacked = TokenMasks(chunk_indices=[0, 1], bitmask=bitmask_of(allowed, vocab)).allowed(vocab)
    assert unpacked.shape == (2, vocab) and unpacked.dtype == bool
    assert [set(np.nonzero(row)[0].tolist()) for row in unpacked] == allowed
    assert not TokenMasks(chunk_indices=[0], bitmask=bitmask_of([{1}], 32)).allowed(40)[0, 32:].any()


def test_allowed_tokens_restrict_only_their_rows_and_argmax_picks_an_allowed_token() -> None:
    vocab = 70
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0))
    allowed = [{3, 31, 63}, {69}]
    mask = torch.from_numpy(TokenMasks(chunk_indices=[0, 2], bitmask=bitmask_of(allowed, vocab)).allowed(vocab))
    before = logits.clone()
    masked = apply_allowed_tokens(logits, [0, 2], mask)
    assert torch.equal(logits, before) and torch.equal(masked[1], logits[1])
    every_row = apply_allowed_tokens(logits[[0, 2]], [0, 1], mask)
    assert torch.equal(every_row, masked[[0, 2]])
    for row, tokens in zip([0, 2], allowed, strict=True):
        finite = set(torch.nonzero(masked[row].isfinite()).flatten().tolist())
        assert finite == tokens
    greedy = SamplingParams(temperature=0.0)
    sampled = SamplingParams(temperature=1.0, seed=3)
    tokens, _ = Sampler({0})(logits, [greedy, greedy, sampled], [0, 0, 0], token_mask=([0, 2], mask))
    assert tokens[0] in allowed[0] and tokens[1] == int(logits[1].argmax()) and tokens[2] == 69


@pytest.fixture(scope="module")
def tiny_llm():
    torch.set_num_threads(1)
    with LLM("builtin:tiny-dense", max_num_seqs=8) as llm:
        yield llm


def _run(llm: LLM, structured: StructuredOutputs, max_tokens: int = 96) -> list[tuple[str, str | None]]:
    ps = [SamplingParams(temperature=0.0, max_tokens=max_tokens, structured=structured)]
    ps += [SamplingParams(temperature=1.0, seed=s, max_tokens=max_tokens, structured=structured) for s in range(4)]
    outs = llm.generate(["Answer: "] * len(ps), ps)
    return [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outs]


def test_choice_request_returns_exactly_one_of_the_choices(tiny_llm: LLM) -> None:
    choices = ("Paris", "London", "Rome")
    for text, reason in _run(tiny_llm, StructuredOutputs(choice=choices)):
        assert text in choices and reason == "stop"


def test_regex_request_output_matches_the_regex(tiny_llm: LLM) -> None:
    pattern = r"[a-z]{2,4}-[0-9]{3}"
    for text, reason in _run(tiny_llm, StructuredOutputs(regex=pattern)):
        assert re.fullmatch(pattern, text) and reason == "stop"


def test_json_schema_request_returns_json_that_follows_the_schema(tiny_llm: LLM) -> None:
    for text, reason in _run(tiny_llm, StructuredOutputs(json_schema=json.dumps(SCHEMA)), max_tokens=128):
        assert reason == "stop", text
        assert follows_schema(json.loads(text)), text


def test_lark_grammar_request_follows_the_grammar(tiny_llm: LLM) -> None:
    grammar = 'start: "(" NUM ("+" NUM)* ")"\nNUM: /[1-9]/'
    for text, _ in _run(tiny_llm, StructuredOutputs(grammar=grammar), max_tokens=12):
        assert re.fullmatch(r"\([1-9](\+[1-9])*\)?", text) and text.startswith("("), text


def test_constrained_and_free_requests_share_a_batch_and_the_free_one_is_unchanged(tiny_llm: LLM) -> None:
    free = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    alone = tiny_llm.generate(["Hello"], free)[0].outputs[0].token_ids
    mixed = tiny_llm.generate(["Hello", "Hello"], [
        free, SamplingParams(temperature=0.0, max_tokens=16, structured=StructuredOutputs(choice=("yes", "no")))])
    assert mixed[0].outputs[0].token_ids == alone
    assert mixed[1].outputs[0].text in ("yes", "no")


def test_a_grammar_failing_mid_generation_raises_naming_the_field_and_the_engine_serves_on(tiny_llm: LLM) -> None:
    from asyncdp.errors import InvalidRequestError
    from asyncdp.sampling_params.structured import PROBE_STEPS

    late = StructuredOutputs(regex=f"[a-z]{{{PROBE_STEPS + 8}}}b{{99999999}}")  # past the validation probe
    with pytest.raises(InvalidRequestError, match="failed during generation") as err:
        tiny_llm.generate(["Answer: "], SamplingParams(temperature=0.0, max_tokens=64, structured=late))
    assert err.value.field == "structured.regex"
    assert not tiny_llm.llm_engine.has_unfinished()
    out = tiny_llm.generate(["Answer: "], SamplingParams(temperature=0.0, max_tokens=8,
                                                         structured=StructuredOutputs(choice=("yes", "no"))))
    assert out[0].outputs[0].text in ("yes", "no") and out[0].outputs[0].finish_reason == "stop"


def test_a_grammar_with_a_marker_leaves_the_text_before_it_free(tiny_llm: LLM) -> None:
    """The marker is the first three tokens the model writes greedily, so it is reached: those are unchanged,
    and what follows is the regex's (a reasoning model's ``</think>`` plays that part behind the API)."""
    free = tiny_llm.generate(["Answer: "], SamplingParams(temperature=0.0, max_tokens=3))[0].outputs[0]
    marker = tuple(free.token_ids)
    structured = StructuredOutputs(regex="[0-9]{3}", start_after=marker)
    out = tiny_llm.generate(["Answer: "], SamplingParams(temperature=0.0, max_tokens=20, structured=structured))
    result = out[0].outputs[0]
    assert tuple(result.token_ids[:3]) == marker and result.text.startswith(free.text)
    assert re.fullmatch("[0-9]{3}", result.text[len(free.text):]) and result.finish_reason == "stop"
