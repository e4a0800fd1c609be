"""``min_tokens`` that cannot fit the context the prompt leaves is a 400 naming it, on both routes (the engine's own
check, for the offline API, is in tests/engine/test_engine_min_tokens.py),
as vLLM refuses it; before, chat without ``max_tokens`` (up to the context) accepted it and stopped at
``max_model_len`` with ``length``, short of the minimum, without a word."""

from __future__ import annotations

import pytest

from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running

CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.anyio
@pytest.mark.parametrize("extra", [{}, {"max_tokens": None}])
async def test_chat_min_tokens_beyond_the_context_is_a_400(extra: dict) -> None:
    async with running(FakeEngineClient(max_model_len=64)) as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "min_tokens": 3000, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "min_tokens"
    assert "min_tokens (3000) cannot exceed" in error["message"]
    assert not srv.fake.submitted


@pytest.mark.anyio
async def test_chat_min_tokens_that_fit_the_context_are_accepted() -> None:
    async with running(FakeEngineClient(max_model_len=64)) as srv:
        tok = srv.fake.tokenizer
        text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
        prompt = len(tok.encode(text, add_special_tokens=False))
        r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "min_tokens": 64 - prompt})
        over = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "min_tokens": 65 - prompt})
    assert r.status_code == 200, r.text
    assert over.status_code == 400 and over.json()["error"]["param"] == "min_tokens"


@pytest.mark.anyio
@pytest.mark.parametrize(("route", "body"), [
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 5, "min_tokens": 6}),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 5, "min_tokens": 6}),
    ("/v1/completions", {"prompt": "hi", "min_tokens": 17}),  # max_tokens defaults to 16
    ("/v1/completions", {"prompt": "hi", "max_tokens": 5, "min_tokens": 3000}),
])
async def test_min_tokens_above_max_tokens_is_a_400(route: str, body: dict) -> None:
    async with running(FakeEngineClient(max_model_len=64)) as srv:
        r = await srv.http.post(route, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "min_tokens"

