"""Pure tests of body decoding, prompt forms, sampling-parameter translation and rank-hint parsing."""

from __future__ import annotations

import pytest

from asyncdp.api.chat_messages import chat_messages
from asyncdp.api.engine_client import RankHint
from asyncdp.api.params import prompts, sampling_params
from asyncdp.api.rank_hint import parse_rank_hint
from asyncdp.api.schemas import ChatRequest, CompletionRequest, decode_body
from asyncdp.errors import HTTPError, InvalidSamplingParams


def completion(**fields: object) -> CompletionRequest:
    import orjson

    return decode_body(orjson.dumps({"prompt": "p", **fields}), CompletionRequest)


def test_unknown_fields_are_ignored_and_types_are_checked() -> None:
    assert completion(logit_bias={"1": 2}).prompt == "p"
    with pytest.raises(HTTPError) as err:
        completion(n="2")
    assert err.value.status == 400 and err.value.param == "n"
    with pytest.raises(HTTPError) as missing:
        decode_body(b"{}", ChatRequest)
    assert missing.value.param == "messages"


@pytest.mark.parametrize(("prompt", "expected"), [
    ("ab", ["ab"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]), ([[1], [2, 3]], [[1], [2, 3]]),
])
def test_prompt_forms(prompt: object, expected: list) -> None:
    assert prompts(completion(prompt=prompt)) == expected


@pytest.mark.parametrize("prompt", [[], [[]], [True], [1, "a"], 5, None])
def test_bad_prompt_forms_are_400(prompt: object) -> None:
    with pytest.raises(HTTPError):
        prompts(completion(prompt=prompt))


def test_sampling_params_map_openai_and_vllm_fields() -> None:
    req = completion(temperature=0, top_p=0.5, stop="x", top_k=5, min_p=0.1, min_tokens=2, ignore_eos=True,
                     stop_token_ids=[7], seed=3, n=2)
    params = sampling_params(req, max_tokens=16, logprobs=1)
    assert (params.temperature, params.top_p, params.stop, params.top_k, params.min_p) == (0.0, 0.5, ("x",), 5, 0.1)
    assert (params.min_tokens, params.ignore_eos, params.stop_token_ids, params.seed, params.n) == (
        2, True, (7,), 3, 2)
    assert params.max_tokens == 16 and params.logprobs == 1


def test_out_of_range_value_names_its_field() -> None:
    # Decoding enforces the schema's range; SamplingParams.validate() checks again behind it.
    with pytest.raises(HTTPError) as decoded:
        completion(top_p=2.0)
    assert decoded.value.status == 400 and decoded.value.param == "top_p"
    with pytest.raises(InvalidSamplingParams) as err:
        sampling_params(CompletionRequest(prompt="p", top_p=2.0), max_tokens=16, logprobs=None)
    assert err.value.field == "top_p"


def test_chat_content_parts_are_joined_text_one_per_line() -> None:
    import orjson

    req = decode_body(orjson.dumps({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}), ChatRequest)
    assert chat_messages(req.messages) == [{"role": "user", "content": "a\nb"}]  # as vLLM joins them


def test_rank_hint_header_and_body_forms() -> None:
    req = completion(data_parallel_global_rank=5)
    assert parse_rank_hint({"X-data-parallel-rank": " 1 "}, req) == RankHint(local_index=1, global_rank=5)
    assert parse_rank_hint({}, completion()) is None
    assert parse_rank_hint({"X-data-parallel-rank": "2"}, completion(data_parallel_rank=2)) == RankHint(2, None)


@pytest.mark.parametrize(("headers", "body", "message"), [
    ({"X-data-parallel-rank": "x"}, {}, "data_parallel_rank must be an integer (got 'x')."),
    ({}, {"data_parallel_rank": True}, "data_parallel_rank must be an integer (got True)."),
    ({}, {"data_parallel_global_rank": "1.0"}, "data_parallel_global_rank must be an integer (got '1.0')."),
])
def test_non_integer_rank_hint_is_e1(headers: dict, body: dict, message: str) -> None:
    with pytest.raises(HTTPError) as err:
        parse_rank_hint(headers, completion(**body))
    assert str(err.value) == message and err.value.status == 400


def test_local_and_global_hints_naming_different_engines_conflict() -> None:
    # Resolved once, by the client against its managed ranks (4, 5): no /server_info document per request.
    from asyncdp.api.errors import status_and_body
    from asyncdp.dp.hints import resolve_rank_hint
    from asyncdp.errors import InvalidRequestError

    ranks = (4, 5)
    hint = parse_rank_hint({}, completion(data_parallel_rank=1, data_parallel_global_rank=5))
    assert hint and resolve_rank_hint(ranks, hint.local_index, hint.global_rank) == 1
    hint = parse_rank_hint({}, completion(data_parallel_rank=0, data_parallel_global_rank=5))
    assert hint is not None
    with pytest.raises(InvalidRequestError) as err:
        resolve_rank_hint(ranks, hint.local_index, hint.global_rank)
    assert status_and_body(err.value)[0] == 400
