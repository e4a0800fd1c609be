"""``usage.completion_tokens_details.reasoning_tokens`` with ``--reasoning-parser``, as vLLM (PR 45802): the
generated tokens of the thinking, tags left out, summed over the choices; whole, in a stream's final usage chunk
and, per choice so far, in ``continuous_usage_stats``; 0 when the request does not think; absent without a parser.

The fake generates one token per character and the byte tokenizer encodes ``<think>`` and ``</think>`` as their
bytes, so the tags are found by their ids and the count is the reasoning's length in characters (ASCII).

Before, ``usage`` had no ``completion_tokens_details``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.api.conftest import running, sse_events
from tests.api.test_chat_auto_tool_choice import STREAM_WARNING, scripted

pytestmark = pytest.mark.anyio

CHAT: Any = [{"role": "user", "content": "2+2?"}]
THOUGHT = "<think>\nTwo and two make four.\n</think>\n\nIt is 4."
THINKING = len("\nTwo and two make four.\n")  # 24: the tags' 15 tokens and the answer's are not reasoning


def chunks(body: str) -> list[dict[str, Any]]:
    return [json.loads(e) for e in sse_events(body) if e != "[DONE]"]


@pytest.mark.filterwarnings(STREAM_WARNING)
async def test_the_thinking_tokens_are_counted_whole_and_in_the_final_usage_chunk() -> None:
    async with running(scripted(THOUGHT), reasoning_parser="qwen3") as srv:
        client = srv.openai()
        whole = await client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=200)
        stream = await client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=200,
                                                      stream=True, stream_options={"include_usage": True})
        last = [chunk async for chunk in stream][-1]
    for used in (whole.usage, last.usage):
        assert used is not None and used.completion_tokens_details is not None
        assert used.completion_tokens_details.reasoning_tokens == THINKING
        assert used.completion_tokens == len(THOUGHT)  # every generated token still
    assert last.choices == []


async def test_n_choices_sum_their_reasoning_tokens() -> None:
    replies = {7: THOUGHT, 8: "<think>ab</think>c", 9: "</think>Plain."}
    body = {"messages": CHAT, "n": 3, "seed": 7, "max_tokens": 200}
    async with running(scripted(replies), reasoning_parser="deepseek_r1") as srv:
        whole = await srv.http.post("/v1/chat/completions", json=body)
        streamed = await srv.http.post("/v1/chat/completions", json={
            **body, "stream": True, "stream_options": {"include_usage": True}})
    assert whole.json()["usage"]["completion_tokens_details"] == {"reasoning_tokens": THINKING + 2 + 0}
    assert chunks(streamed.text)[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": THINKING + 2}


async def test_continuous_usage_stats_count_each_choice_so_far() -> None:
    body = {"messages": CHAT, "n": 2, "seed": 7, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    async with running(scripted({7: THOUGHT, 8: "<think>ab</think>c"}), reasoning_parser="qwen3") as srv:
        r = await srv.http.post("/v1/chat/completions", json=body)
    *per_chunk, final = chunks(r.text)
    counts: dict[int, list[int]] = {0: [], 1: []}
    for chunk in per_chunk:
        counts[chunk["choices"][0]["index"]].append(chunk["usage"]["completion_tokens_details"]["reasoning_tokens"])
    for index, total in ((0, THINKING), (1, 2)):
        assert counts[index][0] == 0  # the role's chunk
        assert counts[index] == sorted(counts[index]) and counts[index][-1] == total
    assert final["usage"]["completion_tokens_details"] == {"reasoning_tokens": THINKING + 2}


@pytest.mark.parametrize(("reply", "max_tokens", "reasoning_tokens"), [
    ("<think>\nStill thinking", 200, len("\nStill thinking")),  # the opening tag left out
    ("No tags at all (the template opened the block)", 200, len("No tags at all (the template opened the block)")),
    (THOUGHT, 10, len("\nTw")),  # cut by max_tokens inside the thinking
    ("<think>\nAlmost done</thi", 200, len("\nAlmost done</thi")),  # a tag that never completed is reasoning
])
async def test_an_answer_that_never_closes_the_thinking_is_all_reasoning(reply: str, max_tokens: int,
                                                                       reasoning_tokens: int) -> None:
    async with running(scripted(reply), reasoning_parser="deepseek_r1") as srv:
        whole = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": max_tokens})
        streamed = await srv.http.post("/v1/chat/completions", json={
            "messages": CHAT, "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}})
    assert whole.json()["choices"][0]["message"]["content"] is None
    assert whole.json()["usage"]["completion_tokens_details"] == {"reasoning_tokens": reasoning_tokens}
    assert chunks(streamed.text)[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": reasoning_tokens}


async def test_no_thinking_is_zero_and_hidden_thinking_still_counts() -> None:
    off = {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}}
    async with running(scripted(THOUGHT), reasoning_parser="qwen3") as srv:
        unthinking = await srv.http.post("/v1/chat/completions", json=off)
        unthinking_streamed = await srv.http.post("/v1/chat/completions", json={
            **off, "stream": True, "stream_options": {"include_usage": True}})
        hidden = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "include_reasoning": False})
        plain = await srv.http.post("/v1/completions", json={"prompt": "2+2?", "max_tokens": 200})
    assert unthinking.json()["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert chunks(unthinking_streamed.text)[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert hidden.json()["choices"][0]["message"]["reasoning"] is None
    assert hidden.json()["usage"]["completion_tokens_details"] == {"reasoning_tokens": THINKING}  # (as vLLM)
    assert "completion_tokens_details" not in plain.json()["usage"]  # completions are not parsed


async def test_without_a_reasoning_parser_there_are_no_completion_tokens_details() -> None:
    async with running(scripted(THOUGHT)) as srv:
        whole = await srv.http.post("/v1/chat/completions", json={"messages": CHAT})
        streamed = await srv.http.post("/v1/chat/completions", json={
            "messages": CHAT, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
        plain = await srv.http.post("/v1/completions", json={"prompt": "2+2?", "max_tokens": 200})
    assert "completion_tokens_details" not in whole.json()["usage"]
    assert not any("completion_tokens_details" in c["usage"] for c in chunks(streamed.text))
    assert "completion_tokens_details" not in plain.json()["usage"]
