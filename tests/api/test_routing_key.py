"""The routing key a request carries to the balancer's policy: X-Session-ID, then X-User-ID, then the body's
prompt_cache_key, then its user (asyncdp.api.routing_key)."""

from __future__ import annotations

import pytest

from tests.api.conftest import running

pytestmark = pytest.mark.anyio

CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("headers", "body", "key"), [
    ({}, {}, None),
    ({}, {"user": "u1"}, "u1"),
    ({}, {"user": "u1", "prompt_cache_key": "conv-7"}, "conv-7"),
    ({"X-User-ID": "alice"}, {"user": "u1", "prompt_cache_key": "conv-7"}, "alice"),
    ({"x-session-id": "s-42", "X-User-ID": "alice"}, {"prompt_cache_key": "conv-7"}, "s-42"),
    ({"X-Session-ID": ""}, {"user": "u1"}, "u1"),  # an empty key is none
])
async def test_the_routing_key_reaches_the_client_from_the_first_source_that_names_one(headers, body, key) -> None:
    async with running() as srv:
        whole = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, **body}, headers=headers)
        streamed = await srv.http.post("/v1/chat/completions", headers=headers,
                                       json={"messages": CHAT, "max_tokens": 1, "stream": True, **body})
    assert whole.status_code == 200 and streamed.status_code == 200, (whole.text, streamed.text)
    assert [srv.fake.routing_keys[rid] for rid, *_ in srv.fake.submitted] == [key, key]


async def test_every_sequence_of_a_request_carries_its_key_and_a_long_key_is_digested_the_same_each_time() -> None:
    long_key = "user-" + "x" * 5000
    async with running() as srv:
        for _ in range(2):
            r = await srv.http.post("/v1/completions", json={"prompt": ["a", "b"], "n": 2, "max_tokens": 1,
                                                             "user": long_key})
            assert r.status_code == 200, r.text
    keys = [srv.fake.routing_keys[rid] for rid, *_ in srv.fake.submitted]
    assert len(keys) == 8 and len(set(keys)) == 1
    assert keys[0].startswith("blake2b:") and len(keys[0]) < 64  # bounded, whatever the id's length


async def test_openai_parameters_without_an_effect_here_are_refused_unless_they_ask_for_nothing() -> None:
    async with running() as srv:
        verbose = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "verbosity": "low"})
        default = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1,
                                                                    "verbosity": "medium", "include_reasoning": False,
                                                                    "safety_identifier": "h-123"})
    assert verbose.status_code == 400 and verbose.json()["error"]["param"] == "verbosity"
    assert default.status_code == 200, default.text
