"""``--enable-prompt-tokens-details``: ``usage.prompt_tokens_details.cached_tokens``, the prompt tokens the prefix
cache supplied, on chat and completions, whole and streamed, with ``n > 1`` and several prompts.

The fake engine client simulates the engine's prefix cache (whole 16-token blocks, one token left to compute), so
a prompt of 40 byte-tokens sent a second time finds 32 of them cached.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running, sse_events

pytestmark = pytest.mark.anyio

PROMPT = "a prompt of exactly forty byte tokens..."  # the fake's tokenizer: one token per byte
OTHER = "another prompt, forty tokens long, too.."
assert len(PROMPT) == len(OTHER) == 40


def details(usage: dict[str, Any]) -> int | None:
    return usage["prompt_tokens_details"]["cached_tokens"] if "prompt_tokens_details" in usage else None


async def test_without_the_flag_usage_has_no_prompt_tokens_details() -> None:
    async with running() as srv:
        for _ in range(2):
            done = await srv.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
            chat = await srv.http.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2})
            assert "prompt_tokens_details" not in done.json()["usage"]
            assert "prompt_tokens_details" not in chat.json()["usage"]


async def test_completion_reports_zero_then_the_cached_prefix_of_a_repeated_prompt() -> None:
    async with running(enable_prompt_tokens_details=True) as srv:
        client = srv.openai()
        first = await client.completions.create(model="fake-model", prompt=PROMPT, max_tokens=3)
        second = await client.completions.create(model="fake-model", prompt=PROMPT, max_tokens=3)
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # a 0 is reported, not left out
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens == 32
    assert second.usage.prompt_tokens == 40


async def test_chat_reports_the_cached_prefix_of_the_rendered_prompt() -> None:
    messages: Any = [{"role": "system", "content": PROMPT}, {"role": "user", "content": "hi"}]
    async with running(enable_prompt_tokens_details=True) as srv:
        client = srv.openai()
        await client.chat.completions.create(model="fake-model", messages=messages, max_tokens=2)
        # the next turn shares the system message: its rendered prompt starts with the same blocks
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
        res = await client.chat.completions.create(model="fake-model", messages=messages, max_tokens=2)
        submitted = srv.fake.submitted[-1]
    assert res.usage is not None and res.usage.prompt_tokens_details is not None
    assert res.usage.prompt_tokens_details.cached_tokens == srv.fake.cached_tokens[submitted[0]]
    assert res.usage.prompt_tokens_details.cached_tokens >= 32


@pytest.mark.parametrize("route", ["completions", "chat"])
async def test_streamed_usage_chunk_carries_the_cached_tokens(route: str) -> None:
    if route == "completions":
        path, body = "/v1/completions", {"prompt": PROMPT}
    else:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]}
    body |= {"max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    async with running(enable_prompt_tokens_details=True) as srv:
        await srv.http.post(path, json={**body, "stream": False, "stream_options": None})
        r = await srv.http.post(path, json=body)
        expected = srv.fake.cached_tokens[srv.fake.submitted[-1][0]]
    chunks = [orjson.loads(e) for e in sse_events(r.text) if e != "[DONE]"]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert details(chunks[-1]["usage"]) == expected >= 32


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["completions", "chat"])
async def test_n_samples_report_the_prompts_hit_once_not_per_sample(route: str, stream: bool) -> None:
    """n = 3 on a prompt seen before: every sample finds it cached, and the usage reports it once (sample 0's)."""
    if route == "completions":
        path, body = "/v1/completions", {"prompt": PROMPT}
    else:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]}
    body |= {"max_tokens": 2}
    streamed = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    async with running(enable_prompt_tokens_details=True) as srv:
        await srv.http.post(path, json=body)
        r = await srv.http.post(path, json={**body, "n": 3, "seed": 5, **streamed})
        assert r.status_code == 200, r.text
        usage = orjson.loads(sse_events(r.text)[-2])["usage"] if stream else r.json()["usage"]
        request_id = srv.fake.submitted[-1][0].rsplit("-", 2)[0]
        hits = [srv.fake.cached_tokens[f"{request_id}-0-{i}"] for i in range(3)]
    assert hits[0] >= 32 and hits == [hits[0]] * 3
    assert details(usage) == hits[0]


@pytest.mark.parametrize("stream", [False, True])
async def test_n_samples_of_a_new_prompt_report_sample_zeros_hit(stream: bool) -> None:
    """A prompt seen for the first time: samples after the first may hit the blocks it computed; the usage
    reports the first sample's hit, the offline LLM's figure, not a sibling's."""
    streamed = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    async with running(enable_prompt_tokens_details=True) as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "n": 2, **streamed})
        usage = orjson.loads(sse_events(r.text)[-2])["usage"] if stream else r.json()["usage"]
        request_id = srv.fake.submitted[-1][0].rsplit("-", 2)[0]
        hits = {i: srv.fake.cached_tokens[f"{request_id}-0-{i}"] for i in range(2)}
    assert sorted(hits.values()) == [0, 32]  # whichever started second hit the other's blocks
    assert details(usage) == hits[0]


async def test_best_of_reports_sample_zeros_hit_whichever_sample_wins() -> None:
    async with running(enable_prompt_tokens_details=True) as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "best_of": 3})
        request_id = r.json()["id"]
        hit = srv.fake.cached_tokens[f"{request_id}-0-0"]
    assert details(r.json()["usage"]) == hit


@pytest.mark.parametrize("stream", [False, True])
async def test_several_prompts_report_the_sum_of_their_hits(stream: bool) -> None:
    """Completions with a list of prompts: the usage counts every prompt's tokens, and so its cached tokens sum
    over the prompts (vLLM reports the last prompt's only)."""
    streamed = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    async with running(enable_prompt_tokens_details=True) as srv:
        await srv.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
        r = await srv.http.post("/v1/completions", json={"prompt": [PROMPT, OTHER], "max_tokens": 2, **streamed})
        again = await srv.http.post("/v1/completions", json={"prompt": [OTHER, PROMPT], "max_tokens": 2,
                                                             **streamed})
    first = orjson.loads(sse_events(r.text)[-2])["usage"] if stream else r.json()["usage"]
    second = orjson.loads(sse_events(again.text)[-2])["usage"] if stream else again.json()["usage"]
    assert (first["prompt_tokens"], details(first)) == (80, 32)  # PROMPT cached, OTHER new
    assert (second["prompt_tokens"], details(second)) == (80, 64)  # both cached, whatever their order


async def test_prompt_logprobs_compute_every_position_so_nothing_is_cached() -> None:
    async with running(enable_prompt_tokens_details=True) as srv:
        await srv.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})
        r = await srv.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 1})
    assert details(r.json()["usage"]) == 0


async def test_fake_client_caches_whole_blocks_only() -> None:
    fake = FakeEngineClient(block_size=4)
    async with running(fake, enable_prompt_tokens_details=True) as srv:
        await srv.http.post("/v1/completions", json={"prompt": [1, 2, 3, 4, 5, 6, 7], "max_tokens": 1})
        r = await srv.http.post("/v1/completions", json={"prompt": [1, 2, 3, 4, 5, 6, 9, 9, 9], "max_tokens": 1})
        whole = await srv.http.post("/v1/completions", json={"prompt": [1, 2, 3, 4], "max_tokens": 1})
    assert details(r.json()["usage"]) == 4  # the second block differs in its last tokens
    assert details(whole.json()["usage"]) == 0  # one token is always left to compute: no whole block below it
