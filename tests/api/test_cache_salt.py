"""``cache_salt`` (vLLM's) on chat and completions: it reaches the engine in ``SamplingParams.cache_salt``, so a
prompt repeated under the same salt reports its cached prefix and under another salt, or none, reports 0 (the
fake engine client simulates the engine's salted prefix cache; tests/e2e/test_prompt_tokens_details.py runs the
real one). A value that is not a non-empty string is a 400 naming it, with vLLM's message for ""."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import running

pytestmark = pytest.mark.anyio

PROMPT = "a prompt of exactly forty byte tokens..."  # the fake's tokenizer: one token per byte
CHAT = [{"role": "user", "content": PROMPT}]


async def test_completions_hit_the_cache_within_one_salt_only() -> None:
    async with running(enable_prompt_tokens_details=True) as srv:
        client = srv.openai()
        got = []
        for salt in ("tenant-a", "tenant-a", "tenant-b", None, "tenant-b"):
            extra = {"cache_salt": salt} if salt is not None else None
            res = await client.completions.create(model="fake-model", prompt=PROMPT, max_tokens=2, extra_body=extra)
            assert res.usage is not None and res.usage.prompt_tokens_details is not None
            got.append(res.usage.prompt_tokens_details.cached_tokens)
        salts = [params.cache_salt for _, _, params, _ in srv.fake.submitted]
    assert got == [0, 32, 0, 0, 32]
    assert salts == ["tenant-a", "tenant-a", "tenant-b", None, "tenant-b"]


async def test_chat_hits_the_cache_within_one_salt_only_and_every_sample_carries_the_salt() -> None:
    messages: Any = CHAT
    async with running(enable_prompt_tokens_details=True) as srv:
        client = srv.openai()
        first = await client.chat.completions.create(model="fake-model", messages=messages, max_tokens=2,
                                                     extra_body={"cache_salt": "s"})
        other = await client.chat.completions.create(model="fake-model", messages=messages, max_tokens=2,
                                                     extra_body={"cache_salt": "t"})
        same = await client.chat.completions.create(model="fake-model", messages=messages, max_tokens=2, n=2,
                                                    extra_body={"cache_salt": "s"})
        last_two = [params.cache_salt for _, _, params, _ in srv.fake.submitted[-2:]]
    hits = [r.usage.prompt_tokens_details.cached_tokens for r in (first, other, same)
            if r.usage is not None and r.usage.prompt_tokens_details is not None]
    assert hits[:2] == [0, 0] and (hits[2] or 0) >= 32
    assert last_two == ["s", "s"]


@pytest.mark.parametrize(("value", "message"), [
    ("", "Parameter 'cache_salt' must be a non-empty string if provided."),
    (5, "cache_salt"), (["salt"], "cache_salt"), ({"salt": 1}, "cache_salt"),
])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_a_salt_that_is_not_a_non_empty_string_is_a_400_naming_it(path: str, value: object,
                                                                       message: str) -> None:
    body = {"prompt": PROMPT} if path == "/v1/completions" else {"messages": CHAT}
    async with running() as srv:
        r = await srv.http.post(path, json={**body, "cache_salt": value})
        null = await srv.http.post(path, json={**body, "max_tokens": 1, "cache_salt": None})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "cache_salt" and message in r.json()["error"]["message"]
    assert null.status_code == 200, null.text
    assert [params.cache_salt for _, _, params, _ in srv.fake.submitted] == [None]
