"""``GET /openapi.json`` describes the chat answers, the parsers' included: each answer the server sends, whole
and every streamed event, validates against the document it serves, with and without ``--reasoning-parser`` and
``--enable-auto-tool-choice --tool-call-parser hermes`` (``content: null``, ``message.reasoning``,
``delta.reasoning``, ``tool_calls`` and ``finish_reason: "tool_calls"``); a server with a reasoning parser
documents ``reasoning`` as present in every message, as it is.

Before, the 200 answers had no schema at all (``{"application/json": {}}``), so schemathesis's
response_schema_conformance checked the errors only, and a client generated from the document knew nothing of the
answers' fields."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import pytest

from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running, sse_events
from tests.api.test_chat_auto_tool_choice import TEMPLATE, TOOLS

pytestmark = pytest.mark.anyio

CHAT: Any = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
# per seed: thinking then a call; only thinking (content null); plain text (no reasoning)
REPLIES = {1: "<think>\nLet me look.\n</think>\n\n" + CALL, 2: "<think>\nHmm, let me", 3: "It is sunny."}
FLAGS: list[dict[str, Any]] = [{}, {"reasoning_parser": "qwen3"}, {"tool_call_parser": "hermes"},
                               {"reasoning_parser": "qwen3", "tool_call_parser": "hermes"}]


def validator(doc: dict[str, Any], ref: dict[str, str]) -> jsonschema_rs.Validator:
    return jsonschema_rs.Draft202012Validator({**ref, "components": doc["components"]})


def errors(v: jsonschema_rs.Validator, instance: Any) -> list[str]:
    return [f"{e.message} at {list(e.instance_path)}" for e in v.iter_errors(instance)]


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "+".join(f.values()) or "no-flags")
async def test_every_chat_answer_validates_against_the_served_document(flags: dict[str, Any]) -> None:
    fake = FakeEngineClient(replies=lambda _prompt, seed: REPLIES[seed or 1])
    fake.tokenizer.chat_template = TEMPLATE
    bodies: list[dict[str, Any]] = [{"messages": CHAT, "seed": seed, "max_tokens": 200} for seed in REPLIES]
    if "tool_call_parser" in flags:
        bodies += [{**b, "tools": TOOLS} for b in bodies]
    bodies.append({"messages": CHAT, "seed": 1, "logprobs": True, "top_logprobs": 1, "prompt_logprobs": 1,
                   "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    ids = {"messages": CHAT, "seed": 3, "logprobs": True, "top_logprobs": 2, "return_token_ids": True,
           "return_tokens_as_token_ids": True, "truncate_prompt_tokens": 9}  # vLLM's token-id parameters
    bodies += [ids, {**ids, "seed": 1, "include_reasoning": False}]  # (the ids withheld with the thinking)
    async with running(fake, **flags) as srv:
        doc = (await srv.http.get("/openapi.json")).json()
        answers = []
        for body in bodies:
            for stream in (False, True):
                sent = {**body, "stream": True} if stream else {k: v for k, v in body.items() if k != "stream_options"}
                r = await srv.http.post("/v1/chat/completions", json=sent)
                assert r.status_code == 200, r.text
                answers.append((sent, r))
    ok = doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    whole = validator(doc, ok["application/json"]["schema"])
    event = validator(doc, ok["text/event-stream"]["schema"])
    chunk = validator(doc, {"$ref": "#/components/schemas/ChatCompletionChunk"})
    problems, seen = [], set()
    for sent, r in answers:
        if not sent.get("stream"):
            problems += [f"{sent}: {p}" for p in errors(whole, r.json())]
            seen.add(("usage details", "completion_tokens_details" in r.json()["usage"]))
            for choice in r.json()["choices"]:
                seen.add(("content null", choice["message"]["content"] is None))
                seen.add(("reasoning", "reasoning" in choice["message"]))
                seen.add(("finish", choice["finish_reason"]))
            continue
        for data in sse_events(r.text):
            problems += [f"{sent} event {data[:80]}: {p}" for p in errors(event, {"data": data})]
            if data != "[DONE]":
                problems += [f"{sent} chunk {data[:80]}: {p}" for p in errors(chunk, json.loads(data))]
                seen |= {("delta", key) for ch in json.loads(data)["choices"] for key in ch["delta"]}
                if json.loads(data).get("usage"):
                    seen.add(("usage details", "completion_tokens_details" in json.loads(data)["usage"]))
    assert not problems, "\n".join(problems)
    reasoning = "reasoning_parser" in flags
    message = doc["components"]["schemas"]["ChatCompletion"]["properties"]["choices"]["items"]["properties"][
        "message"]
    assert ("reasoning" in message["required"]) == reasoning  # every message has it, with the flag only
    assert ("reasoning", True) in seen if reasoning else ("reasoning", False) in seen
    # every usage has completion_tokens_details with the flag, none without it
    assert ("usage details", reasoning) in seen and ("usage details", not reasoning) not in seen
    if reasoning:  # the shapes the flags add were sent, and validated
        assert {("content null", True), ("delta", "reasoning")} <= seen
    if "tool_call_parser" in flags:
        assert {("finish", "tool_calls"), ("delta", "tool_calls")} <= seen


async def test_a_wrong_answer_does_not_validate() -> None:
    """The schemas are not vacuous: a message without ``content``, a ``reasoning`` that is a number, an unknown
    finish reason, a call without arguments and a ``reasoning_tokens`` that is no count are refused."""
    async with running(reasoning_parser="qwen3") as srv:
        doc = (await srv.http.get("/openapi.json")).json()
    whole = validator(doc, {"$ref": "#/components/schemas/ChatCompletion"})
    good: dict[str, Any] = {"id": "x", "object": "chat.completion", "created": 1, "model": "m", "usage": {
        "prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}, "choices": [{
            "index": 0, "logprobs": None, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None, "reasoning": None, "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}]}
    assert not errors(whole, good)
    message = good["choices"][0]["message"]
    for bad in ({**message, "reasoning": 5}, {k: v for k, v in message.items() if k != "content"},
                {k: v for k, v in message.items() if k != "reasoning"},
                {**message, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}]}):
        assert errors(whole, {**good, "choices": [{**good["choices"][0], "message": bad}]}), bad
    assert errors(whole, {**good, "choices": [{**good["choices"][0], "finish_reason": "done"}]})
    details = {**good, "usage": {**good["usage"], "completion_tokens_details": {"reasoning_tokens": 1}}}
    assert not errors(whole, details)
    for bad_count in (-1, "1", None):
        assert errors(whole, {**details, "usage": {**good["usage"], "completion_tokens_details": {
            "reasoning_tokens": bad_count}}}), bad_count
