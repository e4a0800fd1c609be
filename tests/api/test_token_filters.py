"""``allowed_token_ids`` and ``bad_words`` (vLLM's): accepted on both routes and carried to the engine in
``SamplingParams``, the bad words already tokenized (vLLM's rules, by the API server's tokenizer); bad values are a
400 naming the parameter, never a 5xx. What the engine does with them: tests/model/test_model_sampler_token_filters.py
and, through the official client against the tiny model, tests/e2e/test_token_filters.py."""

from __future__ import annotations

import pytest

from asyncdp.api.params import REFUSED
from tests.api.conftest import running

pytestmark = pytest.mark.anyio

CHAT = [{"role": "user", "content": "hi"}]


def test_they_are_no_longer_refused() -> None:
    assert "allowed_token_ids" not in REFUSED and "bad_words" not in REFUSED


async def test_both_reach_the_engine_on_both_routes_with_the_words_tokenized() -> None:
    extra = {"allowed_token_ids": [97, 98, 99], "bad_words": ["ab", "c", "ab"], "n": 2, "seed": 1}
    async with running() as srv:
        client = srv.openai()
        completion = await client.completions.create(model="fake-model", prompt="x", max_tokens=2, extra_body=extra)
        chat = await client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=2,  # type: ignore[arg-type]
                                                    extra_body=extra)
    assert len(completion.choices) == len(chat.choices) == 2
    assert len(srv.fake.submitted) == 4  # n = 2, twice
    for _, _, params, _ in srv.fake.submitted:
        assert params.allowed_token_ids == (97, 98, 99)
        assert params.bad_words == ("ab", "c")  # duplicates dropped, as vLLM
        # the byte tokenizer spends a token on the space: no second sequence for " ab" (vLLM's rule)
        assert params.bad_words_token_ids == ((97, 98), (99,))


async def test_the_document_publishes_their_ranges_not_a_refusal() -> None:
    async with running() as srv:
        doc = (await srv.http.get("/openapi.json")).json()
    for name in ("CompletionRequest", "ChatRequest"):
        props = doc["components"]["schemas"][name]["properties"]
        allowed = props["allowed_token_ids"]["anyOf"][1]
        assert allowed["minItems"] == 1 and allowed["items"] == {"type": "integer", "minimum": 0, "maximum": 258}
        assert props["bad_words"]["anyOf"][1]["items"]["type"] == "string"


async def test_empty_bad_words_and_null_ask_for_nothing() -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "bad_words": [],
                                                         "allowed_token_ids": None})
    assert r.status_code == 200
    params = srv.fake.submitted[0][2]
    assert params.allowed_token_ids is None and params.bad_words == () and params.bad_words_token_ids == ()


@pytest.mark.parametrize(("name", "value"), [
    ("allowed_token_ids", []),  # vLLM: empty is an error
    ("allowed_token_ids", [259]),  # outside the vocabulary (259 ids)
    ("allowed_token_ids", [-1]),
    ("allowed_token_ids", [2**40]),
    ("allowed_token_ids", ["a"]),
    ("allowed_token_ids", 5),
    ("bad_words", [""]),
    ("bad_words", ["a", " \t"]),  # strips to nothing: tokenizes to nothing (vLLM: a 400)
    ("bad_words", "ab"),
    ("bad_words", [1]),
    ("bad_words", [f"w{i}" for i in range(129)]),  # more token sequences than vLLM's 128
])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_bad_values_are_400_naming_the_parameter(route: str, name: str, value: object) -> None:
    body = {"prompt": "a"} if route == "/v1/completions" else {"messages": CHAT}
    async with running() as srv:
        r = await srv.http.post(route, json={**body, name: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith(name) and error["type"] == "BadRequestError" and name in error["message"]
    assert srv.fake.submitted == []
