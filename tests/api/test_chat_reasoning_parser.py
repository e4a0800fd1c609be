"""``--reasoning-parser`` (``create_app``'s ``reasoning_parser``): a reasoning model's thinking comes back in
``message.reasoning`` (``delta.reasoning`` streamed), apart from its content, whole and streamed, through the
official ``openai`` client; the tool-call parser sees only the content; a constraint on an answer that may think
is a 400; ``/v1/completions`` is untouched.

Before, the flag did not exist: the thinking, tags and all, was the answer's content."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncdp.testing import FakeEngineClient, byte_tokenizer
from tests.api.conftest import running, sse_events
from tests.api.test_chat_auto_tool_choice import STREAM_WARNING, TEMPLATE, TOOLS, without_ids

pytestmark = pytest.mark.anyio

CHAT: Any = [{"role": "user", "content": "2+2?"}]
THOUGHT = "<think>\nTwo and two make four.\n</think>\n\nIt is 4."


def scripted(reply: str | dict[int, str]) -> FakeEngineClient:
    """A fake whose every sequence writes ``reply`` (or, per seed, ``reply[seed]``)."""
    fake = FakeEngineClient(replies=lambda _prompt, seed: reply if isinstance(reply, str) else reply[seed or 0])
    fake.tokenizer.chat_template = TEMPLATE
    return fake


def deltas_of(body: str, index: int = 0) -> list[dict[str, Any]]:
    chunks = [json.loads(e) for e in sse_events(body) if e != "[DONE]"]
    return [ch["delta"] for c in chunks for ch in c["choices"] if ch["index"] == index]


async def test_the_thinking_comes_back_apart_from_the_content() -> None:
    async with running(scripted(THOUGHT), reasoning_parser="qwen3") as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 200})
        plain = await srv.http.post("/v1/completions", json={"prompt": "2+2?", "max_tokens": 200})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "\n\nIt is 4.",
                                 "reasoning": "\nTwo and two make four.\n"}
    assert choice["finish_reason"] == "stop"
    assert r.json()["usage"]["completion_tokens"] == len(THOUGHT)  # every generated token, the thinking's too
    assert plain.json()["choices"][0]["text"] == THOUGHT  # as vLLM: completions are not parsed


async def test_an_answer_that_only_thought_has_null_content_and_one_that_did_not_think_null_reasoning() -> None:
    async with running(scripted({1: "<think>\nHmm, let me", 2: "</think>\n\nHi"}), reasoning_parser="deepseek_r1",
                       ) as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "n": 2, "seed": 1})
    first, second = r.json()["choices"]
    assert first["message"] == {"role": "assistant", "content": None, "reasoning": "\nHmm, let me"}
    assert second["message"] == {"role": "assistant", "content": "\n\nHi", "reasoning": None}


async def test_the_stream_sends_the_thinking_as_it_comes_then_the_content() -> None:
    async with running(scripted(THOUGHT), reasoning_parser="qwen3") as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "stream": True})
    deltas = deltas_of(r.text)
    assert deltas[0] == {"role": "assistant", "content": None}  # null, not "": as the whole answer's
    assert "".join(d.get("reasoning", "") for d in deltas) == "\nTwo and two make four.\n"
    assert "".join(d.get("content") or "" for d in deltas) == "\n\nIt is 4."
    kinds = [k for d in deltas[1:] for k in d]
    assert kinds == sorted(kinds, key=lambda k: k != "reasoning")  # all the reasoning first
    assert len([d for d in deltas if "reasoning" in d]) > 10  # one token at a time, not held to the end
    assert not any("think>" in (d.get("reasoning") or "") + (d.get("content") or "") for d in deltas)


@pytest.mark.filterwarnings(STREAM_WARNING)
@pytest.mark.parametrize("reply", [THOUGHT, "<think>\nUnfinished", "No tags at all </thin"])
async def test_the_openai_client_accumulates_the_stream_into_the_whole_answer(reply: str) -> None:
    async with running(scripted(reply), reasoning_parser="deepseek_r1") as srv:
        client = srv.openai()
        whole = await client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=200)
        async with client.chat.completions.stream(model="fake-model", messages=CHAT, max_tokens=200) as stream:
            accumulated = await stream.get_final_completion()
    message = whole.choices[0].message
    assert message.reasoning  # type: ignore[attr-defined]  (vLLM's field, not in the openai types)
    assert accumulated.choices[0].message.model_dump(exclude_none=True) == message.model_dump(exclude_none=True)
    assert accumulated.choices[0].finish_reason == whole.choices[0].finish_reason


CALL = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


@pytest.mark.filterwarnings(STREAM_WARNING)
async def test_the_tool_call_parser_sees_only_the_content() -> None:
    reply = f"<think>Maybe {CALL} would help.</think>\n\nChecking.\n{CALL}"
    body: Any = {"model": "fake-model", "messages": CHAT, "tools": TOOLS, "max_tokens": 200}
    async with running(scripted(reply), tool_call_parser="hermes", reasoning_parser="qwen3") as srv:
        client = srv.openai()
        whole = await client.chat.completions.create(**body)
        async with client.chat.completions.stream(**body) as stream:
            accumulated = await stream.get_final_completion()
    message = whole.choices[0].message
    assert message.reasoning == f"Maybe {CALL} would help."  # type: ignore[attr-defined]
    assert message.content == "\n\nChecking."
    assert [c.function.name for c in message.tool_calls or []] == ["get_time"]  # one: the thought one is text
    assert whole.choices[0].finish_reason == "tool_calls"
    assert without_ids(accumulated.choices[0].message) == without_ids(message)


async def test_each_of_n_choices_is_parsed_on_its_own_when_streamed() -> None:
    async with running(scripted({7: THOUGHT, 8: "</think>Plain."}), reasoning_parser="qwen3") as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "n": 2, "seed": 7, "stream": True})
    for index, reasoning, content in ((0, "\nTwo and two make four.\n", "\n\nIt is 4."), (1, "", "Plain.")):
        deltas = deltas_of(r.text, index)
        assert "".join(d.get("reasoning", "") for d in deltas) == reasoning
        assert "".join(d.get("content") or "" for d in deltas) == content


async def test_qwen3_with_thinking_off_is_all_content_and_deepseek_r1_ignores_the_switch() -> None:
    body = {"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}}
    async with running(scripted("</think>4"), reasoning_parser="qwen3") as srv:
        qwen = await srv.http.post("/v1/chat/completions", json=body)
    async with running(scripted("</think>4"), reasoning_parser="deepseek_r1") as srv:
        deepseek = await srv.http.post("/v1/chat/completions", json=body)
    assert qwen.json()["choices"][0]["message"] == {"role": "assistant", "content": "</think>4", "reasoning": None}
    assert deepseek.json()["choices"][0]["message"] == {"role": "assistant", "content": "4", "reasoning": None}


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
])
async def test_a_constraint_on_an_answer_that_may_think_is_a_400(extra: dict[str, Any], param: str) -> None:
    async with running(scripted("{}"), reasoning_parser="qwen3") as srv:
        refused = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, **extra})
        unthinking = await srv.http.post("/v1/chat/completions", json={
            "messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}, **extra})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
    assert "--reasoning-parser qwen3" in refused.json()["error"]["message"]
    assert '"enable_thinking": false' in refused.json()["error"]["message"]
    assert unthinking.status_code == 200, unthinking.text  # the template closed the thinking: all is answer
    assert len(srv.fake.submitted) == 1


async def test_include_reasoning_false_drops_the_thinking_and_the_logprobs_that_would_show_it() -> None:
    body = {"messages": CHAT, "include_reasoning": False, "logprobs": True}
    async with running(scripted(THOUGHT), reasoning_parser="qwen3") as srv:
        r = await srv.http.post("/v1/chat/completions", json=body)
        s = await srv.http.post("/v1/chat/completions", json={**body, "stream": True})
    choice = r.json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "\n\nIt is 4.", "reasoning": None}
    assert choice["logprobs"] is None  # (as vLLM)
    chunks = [json.loads(e) for e in sse_events(s.text) if e != "[DONE]"]
    assert all("reasoning" not in ch["delta"] and ch["logprobs"] is None for c in chunks for ch in c["choices"])
    assert "".join(d.get("content") or "" for d in deltas_of(s.text)) == "\n\nIt is 4."


async def test_without_the_flag_the_thinking_stays_in_the_content() -> None:
    async with running(scripted(THOUGHT)) as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT})
        s = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "stream": True})
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": THOUGHT}
    assert deltas_of(s.text)[0] == {"role": "assistant", "content": ""}


async def test_think_tags_a_tokenizer_marks_special_are_kept_in_the_text_unless_the_request_says() -> None:
    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    fake = FakeEngineClient(tokenizer=tok, replies=lambda _prompt, _seed: THOUGHT)
    async with running(fake, reasoning_parser="qwen3") as srv:
        for extra in ({}, {"skip_special_tokens": True}, {"chat_template_kwargs": {"enable_thinking": False}}):
            r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, **extra})
            assert r.status_code == 200, r.text
    assert [s[2].skip_special_tokens for s in fake.submitted] == [False, True, True]


def test_an_unknown_parser_is_refused_by_create_app() -> None:
    from asyncdp.api import create_app

    with pytest.raises(ValueError, match="reasoning_parser must be one of deepseek_r1, qwen3"):
        create_app(FakeEngineClient(), reasoning_parser="granite")
