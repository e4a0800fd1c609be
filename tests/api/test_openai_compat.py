"""The official ``openai`` client accepts our responses, streamed and whole, on both backends."""

from __future__ import annotations

import orjson
import pytest

from tests.api.conftest import running, sse_events

pytestmark = pytest.mark.anyio

# openai's AsyncStream stops reading at [DONE] without closing its (and httpx's) inner async generators;
# trio's asyncgen finalizer then warns about them. That is the client library's cleanup, not ours: the raw
# SSE tests below read our streams to the end with httpx and need no such filter.
openai_stream_cleanup = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <async_generator object:pytest.PytestUnraisableExceptionWarning")


async def test_completion_returns_text_usage_and_cmpl_id() -> None:
    async with running() as srv:
        res = await srv.openai().completions.create(model="fake-model", prompt="hello", max_tokens=7)
    prompt_ids = srv.fake.tokenizer.encode("hello")
    expected = srv.fake.tokenizer.decode(srv.fake.expected_token_ids(prompt_ids, None, 7))
    assert res.id.startswith("cmpl-")
    assert res.object == "text_completion"
    assert res.model == "fake-model"
    assert res.choices[0].text == expected
    assert res.choices[0].finish_reason == "length"
    assert res.usage is not None
    assert (res.usage.prompt_tokens, res.usage.completion_tokens, res.usage.total_tokens) == (5, 7, 12)


@openai_stream_cleanup
async def test_streamed_completion_text_equals_non_streamed_and_reports_usage() -> None:
    async with running() as srv:
        client = srv.openai()
        whole = await client.completions.create(model="fake-model", prompt="abc", max_tokens=9, seed=3)
        stream = await client.completions.create(model="fake-model", prompt="abc", max_tokens=9, seed=3,
                                                 stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 9


async def test_chat_renders_template_and_returns_assistant_message() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    async with running() as srv:
        res = await srv.openai().chat.completions.create(model="fake-model", messages=messages, max_tokens=5)
        submitted_prompt = srv.fake.submitted[0][1]
    rendered = srv.fake.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert srv.fake.tokenizer.decode(submitted_prompt) == rendered
    assert res.id.startswith("chatcmpl-")
    assert res.object == "chat.completion"
    assert res.choices[0].message.role == "assistant"
    assert len(res.choices[0].message.content) == 5
    assert res.usage is not None and res.usage.prompt_tokens == len(submitted_prompt)


@openai_stream_cleanup
async def test_streamed_chat_starts_with_role_delta_and_matches_non_streamed() -> None:
    messages = [{"role": "user", "content": "stream please"}]
    async with running() as srv:
        client = srv.openai()
        whole = await client.chat.completions.create(model="fake-model", messages=messages,
                                                     max_completion_tokens=8)
        stream = await client.chat.completions.create(model="fake-model", messages=messages,
                                                      max_completion_tokens=8, stream=True)
        chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_n2_with_seed_returns_two_distinct_choices() -> None:
    async with running() as srv:
        res = await srv.openai().completions.create(model="fake-model", prompt="x", max_tokens=4, n=2, seed=1)
    assert sorted(c.index for c in res.choices) == [0, 1]
    assert res.choices[0].text != res.choices[1].text
    assert res.usage is not None and res.usage.completion_tokens == 8


async def test_completion_logprobs_have_top_alternatives_per_token() -> None:
    async with running() as srv:
        res = await srv.openai().completions.create(model="fake-model", prompt="q", max_tokens=3, logprobs=2)
    lp = res.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.top_logprobs is not None
    assert "".join(lp.tokens) == res.choices[0].text
    assert all(len(top) == 2 for top in lp.top_logprobs)
    assert lp.text_offset == [0, 1, 2]


async def test_chat_logprobs_list_top_logprobs() -> None:
    async with running() as srv:
        res = await srv.openai().chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "lp"}], max_tokens=3, logprobs=True,
            top_logprobs=3)
    content = res.choices[0].logprobs.content
    assert [c.token for c in content] == list(res.choices[0].message.content)
    assert all(len(c.top_logprobs) == 3 for c in content)


@openai_stream_cleanup
async def test_streamed_chat_logprobs_have_one_entry_per_token_while_a_stop_string_holds_the_text_back() -> None:
    # Text that may begin a stop string is held back until it cannot: with a stop string made of the whole answer
    # but its last character, no chunk before the last carries text, but the stream must still carry each token's
    # logprobs, one entry per token, as the whole response does.
    kwargs = {"model": "fake-model", "messages": [{"role": "user", "content": "lp"}], "max_tokens": 12,
              "logprobs": True, "top_logprobs": 2, "seed": 5}
    async with running() as srv:
        client = srv.openai()
        answer = (await client.chat.completions.create(**kwargs)).choices[0].message.content
        kwargs["stop"] = [answer[:-1] + "\x01"]
        whole = await client.chat.completions.create(**kwargs)
        stream = await client.chat.completions.create(**kwargs, stream=True)
        chunks = [c async for c in stream]
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert whole.choices[0].message.content == answer and len(whole.choices[0].logprobs.content) == 12
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 1  # the text came out at the end
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole.choices[0].logprobs.content]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content


async def test_prompt_forms_strings_and_token_ids_each_give_choices() -> None:
    async with running() as srv:
        two = await srv.http.post("/v1/completions", json={"prompt": ["ab", "cd"], "max_tokens": 2})
        ids = await srv.http.post("/v1/completions", json={"prompt": [97, 98], "max_tokens": 2})
        id_lists = await srv.http.post("/v1/completions", json={"prompt": [[97], [98, 99]], "max_tokens": 2})
    assert [c["index"] for c in two.json()["choices"]] == [0, 1]
    assert two.json()["usage"]["prompt_tokens"] == 4
    assert ids.json()["choices"][0]["text"] == two.json()["choices"][0]["text"]
    assert id_lists.json()["usage"]["prompt_tokens"] == 3


async def test_stop_string_ends_with_finish_reason_stop() -> None:
    async with running() as srv:
        res = await srv.openai().completions.create(model="fake-model", prompt="hello", max_tokens=20,
                                                    stop=[" "])
    assert res.choices[0].finish_reason == "stop"
    assert len(res.choices[0].text) == 5


async def test_models_lists_the_served_model() -> None:
    async with running() as srv:
        models = await srv.openai().models.list()
    assert [m.id for m in models.data] == ["fake-model"]


async def test_raw_sse_ends_with_done() -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "z", "max_tokens": 2, "stream": True})
    events = sse_events(r.text)
    assert r.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "[DONE]"
    assert all("choices" in orjson.loads(e) for e in events[:-1])


async def test_streamed_chat_with_n2_gives_each_choice_a_role_then_its_own_text() -> None:
    body = {"messages": [{"role": "user", "content": "two"}], "max_tokens": 6, "n": 2, "seed": 4}
    async with running() as srv:
        whole = (await srv.http.post("/v1/chat/completions", json=body)).json()
        streamed = await srv.http.post("/v1/chat/completions", json={**body, "stream": True})
    chunks = [orjson.loads(e) for e in sse_events(streamed.text)[:-1]]
    per_choice: dict[int, list[dict]] = {0: [], 1: []}
    for chunk in chunks:
        per_choice[chunk["choices"][0]["index"]].append(chunk["choices"][0])
    for index, deltas in per_choice.items():
        assert deltas[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(d["delta"].get("content", "") for d in deltas) == whole["choices"][index]["message"]["content"]
        assert deltas[-1]["finish_reason"] == "length"


async def test_streamed_completion_of_two_prompts_reports_usage_over_both() -> None:
    body = {"prompt": ["ab", "cde"], "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json=body)
    chunks = [orjson.loads(e) for e in sse_events(r.text)[:-1]]
    assert {c["choices"][0]["index"] for c in chunks if c["choices"]} == {0, 1}
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
