"""gpt-oss through the API (``--reasoning-parser openai_gptoss`` and ``--tool-call-parser openai``, vLLM's), with
the official ``openai`` client: the ``analysis`` channel in ``message.reasoning``, the ``final`` channel (and the
preambles) in ``content``, the messages to ``functions.NAME`` as ``tool_calls``, whole and streamed alike;
``reasoning_tokens`` counted from the analysis bodies' tokens; malformed text answered as content, never a 5xx;
gpt-oss's special tokens kept in the text; a constraint started after the final answer's header. The fake writes
one token per character (the byte tokenizer: the tags as their bytes).

Before, ``create_app`` refused both names, as ``asyncdp serve`` did."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncdp.api.harmony import TAGS
from asyncdp.testing import FakeEngineClient, byte_tokenizer
from tests.api.conftest import GrammarFake, running, sse_events, whole_and_streamed
from tests.api.test_chat_auto_tool_choice import STREAM_WARNING, TEMPLATE, TOOLS, without_ids

pytestmark = pytest.mark.anyio

CHAT: Any = [{"role": "user", "content": "Weather in Paris?"}]
A = "<|channel|>analysis<|message|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>"
WEATHER = "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
TIME = "<|start|>assistant<|channel|>commentary to=functions.get_time json<|message|>"
PARIS = ("get_weather", '{"city": "Paris"}')


def scripted(reply: str) -> FakeEngineClient:
    """A fake that writes ``reply``, with the tools template and room for harmony's long headers."""
    fake = FakeEngineClient(max_model_len=1024, replies=lambda _prompt, _seed: reply)
    fake.tokenizer.chat_template = TEMPLATE
    return fake

# case: (reply, reasoning, content, calls, finish_reason)
REPLIES: dict[str, tuple[str, str | None, str | None, list[tuple[str, str]], str]] = {
    "analysis then final": (A + "Look it up.<|end|>" + FINAL + "It is sunny.", "Look it up.", "It is sunny.", [],
                            "stop"),
    "a final without analysis": ("<|channel|>final<|message|>Hi!", None, "Hi!", [], "stop"),
    "a call after analysis": (A + "Need the weather.<|end|>" + WEATHER + '{"city": "Paris"}', "Need the weather.",
                              None, [PARIS], "tool_calls"),
    "a call without analysis": (WEATHER[len("<|start|>assistant"):] + '{"city": "Paris"}', None, None, [PARIS],
                                "tool_calls"),
    "a preamble and two calls": (A + "Two.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
                                 + WEATHER + '{"city": "Paris"}<|call|>' + TIME + "{}", "Two.", "Checking.",
                                 [PARIS, ("get_time", "{}")], "tool_calls"),
    "a header that is none": ("<|channel|>analysis is what I do<|message|>x", None,
                              "<|channel|>analysis is what I do<|message|>x", [], "stop"),
    "a call to an unknown function": (TIME.replace("get_time", "launch") + "{}", None,
                                      TIME.replace("get_time", "launch") + "{}", [], "stop"),
}


@pytest.mark.filterwarnings(STREAM_WARNING)
@pytest.mark.parametrize("case", list(REPLIES))
async def test_gpt_oss_answers_whole_and_streamed(case: str) -> None:
    reply, reasoning, content, calls, finish_reason = REPLIES[case]
    body: Any = {"model": "fake-model", "messages": CHAT, "tools": TOOLS, "max_tokens": 500}
    async with running(scripted(reply), reasoning_parser="openai_gptoss", tool_call_parser="openai") as srv:
        client = srv.openai()
        whole, accumulated = await whole_and_streamed(client, body)
        raw = await srv.http.post("/v1/chat/completions", json={**body, "stream": True,
                                                                "stream_options": {"include_usage": True}})
    assert raw.status_code == 200
    choice = whole.choices[0]
    assert (choice.message.reasoning, choice.message.content) == (reasoning, content)  # type: ignore[attr-defined]
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []] == calls
    assert choice.finish_reason == finish_reason == accumulated.choices[0].finish_reason
    assert without_ids(accumulated.choices[0].message) == without_ids(choice.message)
    chunks = [json.loads(e) for e in sse_events(raw.text) if e != "[DONE]"]
    deltas = [ch["delta"] for c in chunks for ch in c["choices"]]
    assert [tc["index"] for d in deltas for tc in d.get("tool_calls", [])] == list(range(len(calls)))
    for used in (whole.usage, chunks[-1]["usage"]):
        details = used.completion_tokens_details if whole.usage is used else used["completion_tokens_details"]
        count = details.reasoning_tokens if whole.usage is used else details["reasoning_tokens"]
        assert count == len(reasoning or "")  # (byte tokens: the analysis bodies' characters)


async def test_an_answer_cut_while_thinking_is_reasoning() -> None:
    body: Any = {"model": "fake-model", "messages": CHAT, "max_tokens": len(A) + 5}
    async with running(scripted(A + "Still thinking."), reasoning_parser="openai_gptoss") as srv:
        whole = await srv.openai().chat.completions.create(**body)
        raw = await srv.http.post("/v1/chat/completions", json={**body, "stream": True})
    message = whole.choices[0].message
    assert (message.reasoning, message.content) == ("Still", None)  # type: ignore[attr-defined]
    assert whole.choices[0].finish_reason == "length"
    deltas = [ch["delta"] for c in (json.loads(e) for e in sse_events(raw.text) if e != "[DONE]")
              for ch in c["choices"]]
    assert "".join(d.get("reasoning") or "" for d in deltas) == "Still"
    assert not "".join(d.get("content") or "" for d in deltas)
    assert whole.usage is not None and whole.usage.completion_tokens_details is not None
    assert whole.usage.completion_tokens_details.reasoning_tokens == 5


@pytest.mark.filterwarnings(STREAM_WARNING)
async def test_without_the_tool_call_parser_a_call_stays_content_as_written() -> None:
    reply = A + "Need it.<|end|>" + WEATHER + '{"city": "Paris"}'
    body: Any = {"model": "fake-model", "messages": CHAT, "max_tokens": 300}
    async with running(scripted(reply), reasoning_parser="openai_gptoss") as srv:
        whole, accumulated = await whole_and_streamed(srv.openai(), body)
    message = whole.choices[0].message
    assert (message.reasoning, message.content) == ("Need it.", WEATHER + '{"city": "Paris"}')  # type: ignore
    assert accumulated.choices[0].message.model_dump(exclude_none=True) == message.model_dump(exclude_none=True)


@pytest.mark.filterwarnings(STREAM_WARNING)
async def test_the_tool_call_parser_alone_reads_the_whole_answer() -> None:
    reply = A + "Need it.<|end|>" + WEATHER + '{"city": "Paris"}'
    body: Any = {"model": "fake-model", "messages": CHAT, "tools": TOOLS, "max_tokens": 300}
    async with running(scripted(reply), tool_call_parser="openai") as srv:
        whole, accumulated = await whole_and_streamed(srv.openai(), body)
    message = whole.choices[0].message
    assert message.content == A + "Need it.<|end|>"  # (no reasoning parser: the thinking stays in the content)
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls or []] == [PARIS]
    assert without_ids(accumulated.choices[0].message) == without_ids(message)


async def test_the_special_tokens_stay_in_the_text() -> None:
    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(TAGS)})  # as gpt-oss's tokenizer marks them
    fake = FakeEngineClient(tokenizer=tok, replies=lambda _prompt, _seed: "<|channel|>final<|message|>Hi")
    fake.tokenizer.chat_template = TEMPLATE
    for flags, tools in (({"reasoning_parser": "openai_gptoss"}, {}), ({"tool_call_parser": "openai"},
                                                                      {"tools": TOOLS})):
        async with running(fake, **flags) as srv:
            for extra in ({}, {"skip_special_tokens": True}):
                r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, **tools, **extra})
                assert r.status_code == 200, r.text
    assert [s[2].skip_special_tokens for s in fake.submitted] == [False, True] * 2


async def test_a_constraint_starts_after_the_final_header() -> None:
    fake = FakeEngineClient(replies=lambda _prompt, _seed: A + "x<|end|>" + FINAL + "{}")
    body = {"messages": CHAT, "response_format": {"type": "json_object"}}
    async with running(fake, reasoning_parser="openai_gptoss") as srv:
        r = await srv.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": "{}", "reasoning": "x"}
    params = fake.submitted[0][2]
    assert params.structured is not None and params.structured.start_after == tuple(b"<|channel|>final<|message|>")


TYPED = "<|start|>assistant<|channel|>final <|constrain|>json<|message|>"
OK_SCHEMA: Any = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                  "additionalProperties": False}


@pytest.mark.filterwarnings(STREAM_WARNING)
@pytest.mark.parametrize(("header", "content"), [(TYPED, '{"ok":false}'), (FINAL, '{"ok":false}'),
                                                 (WEATHER, '{"ok": "sure"}')],
                         ids=["a final header with a content type", "one without", "a commentary header"])
async def test_a_constraint_starts_after_any_final_header(header: str, content: str) -> None:
    """The engine's matchers (``GrammarFake``) take the request as the API sends it: after a final header, with
    or without ``<|constrain|>json``, the schema turns the model's ``{"ok": "sure"}`` into ``{"ok":false}``; after
    another channel's header (a call's) the text stays free. Before, only ``<|channel|>final<|message|>`` started
    the grammar, so the answer after ``final <|constrain|>json<|message|>`` stayed ``{"ok": "sure"}``."""
    fake = GrammarFake(A + "Check.<|end|>" + header + '{"ok": "sure"}', max_model_len=1024)
    body: Any = {"model": "fake-model", "messages": CHAT, "max_tokens": 300, "response_format": {
        "type": "json_schema", "json_schema": {"name": "ok", "schema": OK_SCHEMA}}}
    async with running(fake, reasoning_parser="openai_gptoss") as srv:
        whole, accumulated = await whole_and_streamed(srv.openai(), body)
    message = whole.choices[0].message
    expected = content if header != WEATHER else header + content  # (another channel's message is content whole)
    assert (message.reasoning, message.content) == ("Check.", expected)  # type: ignore[attr-defined]
    assert accumulated.choices[0].message.model_dump(exclude_none=True) == message.model_dump(exclude_none=True)
