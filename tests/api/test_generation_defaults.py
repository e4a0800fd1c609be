"""The server-wide sampling defaults of ``--generation-config`` / ``--override-generation-config`` in an API server
(docs/reference/http-api.md, "Sampling defaults"): a request that leaves temperature, top_p, top_k, min_p,
repetition_penalty or (chat) max_tokens unset, absent or null, gets the default, as vLLM's OpenAI serving layer; a
request's own value, even the neutral one, wins; a cap bounds every request's max_tokens; a beam search takes the
temperature and max_tokens only; without defaults (the built-in models) nothing changes."""

from __future__ import annotations

from typing import Any

import pytest

from asyncdp.config.generation_config import GenerationDefaults
from tests.api.conftest import running

pytestmark = pytest.mark.anyio

CHAT = [{"role": "user", "content": "hi"}]
QWEN = GenerationDefaults(temperature=0.6, top_p=0.95, top_k=20, min_p=0.05, repetition_penalty=1.1, max_tokens=7)
NEUTRAL = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


def sampled(srv: Any) -> list[tuple[Any, ...]]:
    return [(p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty, p.max_tokens)
            for _, _, p, _ in srv.fake.submitted]


async def test_a_request_that_leaves_them_unset_gets_the_defaults_on_both_routes():
    async with running(generation_defaults=QWEN) as srv:
        c = await srv.http.post("/v1/completions", json={"prompt": "a"})
        chat = await srv.http.post("/v1/chat/completions", json={"messages": CHAT})
        streamed = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "stream": True})
        nulls = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, **dict.fromkeys(NEUTRAL),
                                                                  "max_tokens": None})
    assert [r.status_code for r in (c, chat, streamed, nulls)] == [200] * 4, (c.text, chat.text)
    # completions' max_tokens defaults to 16 (vLLM's request schema), chat's to the default: max_new_tokens
    assert sampled(srv) == [(0.6, 0.95, 20, 0.05, 1.1, 16)] + [(0.6, 0.95, 20, 0.05, 1.1, 7)] * 3
    assert chat.json()["usage"]["completion_tokens"] <= 7


async def test_a_requests_own_values_win_even_the_neutral_ones():
    async with running(generation_defaults=QWEN) as srv:
        c = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 3, **NEUTRAL})
        chat = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 3, **NEUTRAL})
        own = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_completion_tokens": 30,
                                                                "temperature": 0.0, "top_k": 3})
    assert [r.status_code for r in (c, chat, own)] == [200] * 3
    assert sampled(srv) == [(1.0, 1.0, 0, 0.0, 1.0, 3)] * 2 + [(0.0, 0.95, 3, 0.05, 1.1, 30)]


async def test_a_cap_bounds_every_requests_max_tokens_and_the_default_leaves_min_tokens_its_check():
    capped = GenerationDefaults(max_tokens=4, max_tokens_cap=4)
    async with running(generation_defaults=capped) as srv:
        for route, body in (("/v1/completions", {"prompt": "a", "max_tokens": 10}), ("/v1/completions", {"prompt": "a"}),
                            ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}),
                            ("/v1/chat/completions", {"messages": CHAT})):
            r = await srv.http.post(route, json=body)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 4, r.text
        too_many = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "min_tokens": 5})
    assert [p.max_tokens for _, _, p, _ in srv.fake.submitted] == [4, 4, 2, 4]
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "min_tokens", too_many.text


async def test_a_beam_search_takes_only_the_temperature_and_max_tokens():
    """vLLM's BeamSearchParams: temperature (which changes nothing the search ranks) and max_tokens; the search's
    steps run without the default top_p, top_k, min_p and repetition_penalty."""
    async with running(generation_defaults=QWEN) as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "n": 2, "use_beam_search": True})
    assert r.status_code == 200, r.text
    steps = {rid.rsplit("-s", 1)[1].split("-")[0] for rid, _, _, _ in srv.fake.submitted}
    assert 1 <= len(steps) <= 7 and r.json()["usage"]["completion_tokens"] <= 14
    assert {(p.top_p, p.top_k, p.min_p, p.repetition_penalty) for _, _, p, _ in srv.fake.submitted} == {
        (1.0, 0, 0.0, 1.0)}


async def test_without_defaults_every_request_runs_as_before():
    """The built-in models' case (their generation_config.json sets no sampling field): the same parameters as a
    server given no defaults at all."""
    bodies = [("/v1/completions", {"prompt": "a"}), ("/v1/chat/completions", {"messages": CHAT}),
              ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 5, "temperature": 0.3}),
              ("/v1/chat/completions", {"messages": CHAT, "n": 2, "use_beam_search": True, "max_tokens": 2})]
    runs = []
    for kwargs in ({}, {"generation_defaults": GenerationDefaults()}):
        async with running(**kwargs) as srv:
            for route, body in bodies:
                assert (await srv.http.post(route, json=body)).status_code == 200
        runs.append([p for _, _, p, _ in srv.fake.submitted])
    assert runs[0] == runs[1] and runs[0][1].max_tokens is None and runs[0][1].temperature == 1.0
