"""``--reasoning-parser`` (``create_app``'s ``reasoning_parser``): a reasoning model's thinking comes back in
``message.reasoning`` (``delta.reasoning`` streamed), apart from its content, whole and streamed, through the
official ``openai`` client; the tool-call parser sees only the content; a constraint on an answer that may think
starts after ``</think>`` (its token ids reach the engine as the grammar's ``start_after``), and its calls or JSON
are read from the content; ``/v1/completions`` is untouched.

Before, the flag did not exist: the thinking, tags and all, was the answer's content."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncdp.testing import FakeEngineClient, byte_tokenizer
from tests.api.conftest import GrammarFake, running, sse_events, whole_and_streamed
from tests.api.test_chat_auto_tool_choice import (
    STREAM_WARNING,
    TEMPLATE,
    TOOLS,
    scripted,
    without_ids,
)

pytestmark = pytest.mark.anyio

CHAT: Any = [{"role": "user", "content": "2+2?"}]
THOUGHT = "<think>\nTwo and two make four.\n</think>\n\nIt is 4."


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
        whole, accumulated = await whole_and_streamed(client, {"model": "fake-model", "messages": CHAT, "max_tokens": 200})
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
        whole, accumulated = await whole_and_streamed(client, body)
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
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
])
async def test_a_constraint_on_an_answer_that_may_think_starts_after_the_thinking(extra: dict[str, Any],
                                                                                  param: str) -> None:
    """Before, a 400: the grammar would have constrained the thinking too. Now, as vLLM, it starts after
    ``</think>``: the engine gets its token ids as the grammar's ``start_after`` (eight bytes with the byte
    tokenizer); without thinking (qwen3's ``enable_thinking: false``) the grammar applies from the start."""
    async with running(scripted("</think>{}"), reasoning_parser="qwen3") as srv:
        thinking = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, **extra})
        unthinking = await srv.http.post("/v1/chat/completions", json={
            "messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}, **extra})
    assert thinking.status_code == 200, thinking.text
    assert unthinking.status_code == 200, unthinking.text
    (_, _, params, _), (_, _, plain, _) = srv.fake.submitted
    assert params.structured is not None and params.structured.param == param
    assert params.structured.start_after == tuple(b"</think>")
    assert plain.structured is not None and plain.structured.start_after == ()


async def test_a_start_after_is_the_one_token_a_tokenizer_makes_of_the_tag() -> None:
    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    fake = FakeEngineClient(tokenizer=tok, replies=lambda _prompt, _seed: "</think>{}")
    body = {"messages": CHAT, "response_format": {"type": "json_object"}}
    async with running(fake, reasoning_parser="deepseek_r1") as srv:
        r = await srv.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    params = fake.submitted[0][2]
    assert params.structured is not None and params.structured.start_after == (tok.convert_tokens_to_ids("</think>"),)


SCHEMA: Any = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
JSON_BODY: Any = {"messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {
    "name": "a", "schema": SCHEMA}}}


async def test_a_constrained_answer_is_its_thinking_then_its_constrained_content() -> None:
    reply = '<think>Four, as JSON.</think>{"a": 4}'
    async with running(scripted(reply), reasoning_parser="deepseek_r1") as srv:
        whole = await srv.http.post("/v1/chat/completions", json=JSON_BODY)
        streamed = await srv.http.post("/v1/chat/completions", json={**JSON_BODY, "stream": True})
        cut = await srv.http.post("/v1/chat/completions", json={**JSON_BODY, "max_tokens": 11})
    choice = whole.json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": '{"a": 4}', "reasoning": "Four, as JSON."}
    assert choice["finish_reason"] == "stop"
    deltas = deltas_of(streamed.text)
    assert "".join(d.get("reasoning", "") for d in deltas) == "Four, as JSON."
    assert "".join(d.get("content") or "" for d in deltas) == '{"a": 4}'
    # cut by max_tokens inside the thinking: no grammar ever applied; all of it is reasoning
    cut_choice = cut.json()["choices"][0]
    assert cut_choice["message"] == {"role": "assistant", "content": None, "reasoning": "Four"}
    assert cut_choice["finish_reason"] == "length"


@pytest.mark.filterwarnings(STREAM_WARNING)
async def test_required_tool_calls_are_read_from_the_content_after_the_thinking() -> None:
    calls = '[{"name": "get_time", "parameters": {}}]'
    reply = f"<think>Maybe {calls}? Yes.</think>{calls}"
    body: Any = {"model": "fake-model", "messages": CHAT, "tools": TOOLS, "tool_choice": "required",
                 "max_tokens": 200}
    async with running(scripted(reply), reasoning_parser="qwen3") as srv:
        client = srv.openai()
        whole, accumulated = await whole_and_streamed(client, body)
    message = whole.choices[0].message
    assert message.reasoning == f"Maybe {calls}? Yes."  # type: ignore[attr-defined]
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls or []] == [("get_time", "{}")]
    assert whole.choices[0].finish_reason == "tool_calls"
    assert without_ids(accumulated.choices[0].message) == without_ids(message)


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

    choices = ("deepseek_r1, deepseek_v3, ernie45, glm45, granite, holo2, hunyuan_a13b, kimi_k2, minimax_m2, "
               "minimax_m2_append_think, mistral, openai_gptoss, qwen3, seed_oss, step3")
    with pytest.raises(ValueError, match=f"reasoning_parser must be one of {choices}"):
        create_app(FakeEngineClient(), reasoning_parser="olmo3")


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
async def test_a_tool_choice_cut_inside_the_thinking_has_no_call_whole_or_streamed(tool_choice: Any) -> None:
    """No grammar ever applied and no call was written: a named choice's whole answer had a call with empty
    arguments (its stream none) before the fix of ``answer``."""
    body: Any = {"messages": CHAT, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 10}
    async with running(scripted('<think>Hmm. Hmm.</think>{"x": 1}'), reasoning_parser="qwen3") as srv:
        whole = await srv.http.post("/v1/chat/completions", json=body)
        streamed = await srv.http.post("/v1/chat/completions", json={**body, "stream": True})
    choice = whole.json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "", "reasoning": "Hmm"}
    assert choice["finish_reason"] == "length"
    deltas = deltas_of(streamed.text)
    assert not any("tool_calls" in d for d in deltas) and "".join(d.get("reasoning", "") for d in deltas) == "Hmm"


@pytest.mark.filterwarnings(STREAM_WARNING)
@pytest.mark.parametrize(("parser", "call", "calls"), [
    ("qwen3_coder", "<tool_call>\n<function=get_time>\n</function>\n</tool_call>", ["get_time"]),
    ("hermes", CALL, []),  # (vLLM's qwen3 ends the thinking only at a call that <function follows)
])
async def test_a_tool_call_written_while_thinking_ends_the_thinking_whole_and_streamed(
        parser: str, call: str, calls: list[str]) -> None:
    reply = "<think>I should call it" + call
    body: Any = {"model": "fake-model", "messages": CHAT, "tools": TOOLS, "max_tokens": 200}
    async with running(scripted(reply), tool_call_parser=parser, reasoning_parser="qwen3") as srv:
        whole, accumulated = await whole_and_streamed(srv.openai(), body)
    message = whole.choices[0].message
    assert message.reasoning == ("I should call it" if calls else "I should call it" + call)  # type: ignore
    assert [c.function.name for c in message.tool_calls or []] == calls
    assert without_ids(accumulated.choices[0].message) == without_ids(message)
    assert whole.usage.completion_tokens_details.reasoning_tokens == len(  # type: ignore[union-attr]
        (message.reasoning or "").encode())  # (byte tokens)


CONFIRM: Any = {"type": "function", "function": {"name": "confirm", "parameters": {
    "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}}}


@pytest.mark.filterwarnings(STREAM_WARNING)
async def test_a_named_tool_choice_written_while_thinking_is_constrained_after_the_tool_call_tag() -> None:
    """Qwen3.5 and Qwen3-Coder may call while thinking, without ``</think>``: vLLM ends the reasoning at the first
    ``<tool_call>`` generated, for its grammar too, so the engine's matchers (``GrammarFake``) turn the model's
    ``{"ok": "sure"}`` after it into ``{"ok":false}``, the call's arguments; its thinking is the reasoning.
    Before, the grammar waited for ``</think>``: the call was free, and all of it reasoning."""
    fake = GrammarFake('Let me confirm.<tool_call>{"ok": "sure"}')
    fake.tokenizer.chat_template = TEMPLATE
    body: Any = {"model": "fake-model", "messages": CHAT, "tools": [CONFIRM], "max_tokens": 200,
                 "tool_choice": {"type": "function", "function": {"name": "confirm"}}}
    async with running(fake, tool_call_parser="qwen3_coder", reasoning_parser="qwen3") as srv:
        whole, accumulated = await whole_and_streamed(srv.openai(), body)
    message = whole.choices[0].message
    assert message.reasoning == "Let me confirm."  # type: ignore[attr-defined]
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
        ("confirm", '{"ok":false}')]
    assert without_ids(accumulated.choices[0].message) == without_ids(message)
    assert whole.usage.completion_tokens_details.reasoning_tokens == len("Let me confirm.")  # type: ignore[union-attr]
