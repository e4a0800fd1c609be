"""A chat message's ``name`` (and ``tool_calls``, ``tool_call_id``) reach the chat template, as in vLLM: before,
only role and content did, so a template that reads ``message.name`` never saw it and the field was dropped
without a word."""

from __future__ import annotations

import pytest

from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running

pytestmark = pytest.mark.anyio

# Renders every field it is given, so the prompt shows what reached the template.
TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}"
    "{% if m.name is defined %} name={{ m.name }}{% endif %}"
    "{% if m.tool_call_id is defined %} id={{ m.tool_call_id }}{% endif %}"
    "{% if m.tool_calls is defined %} calls={{ m.tool_calls | map(attribute='id') | join(',') }}{% endif %}"
    "]{{ m.content }}{% endfor %}"
)


def _fake() -> FakeEngineClient:
    fake = FakeEngineClient()
    fake.tokenizer.chat_template = TEMPLATE
    return fake


async def test_message_name_reaches_the_chat_template() -> None:
    async with running(_fake()) as srv:
        r = await srv.http.post("/v1/chat/completions", json={"max_tokens": 1, "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "name": "alice", "content": "hi"}]})
        assert r.status_code == 200, r.text
        prompt = srv.fake.tokenizer.decode(srv.fake.submitted[0][1])
    assert prompt.startswith("[system]be brief[user name=alice]hi"), prompt


async def test_tool_call_fields_reach_the_chat_template() -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    async with running(_fake()) as srv:
        r = await srv.http.post("/tokenize", json={"messages": messages})
        assert r.status_code == 200, r.text
        prompt = srv.fake.tokenizer.decode(r.json()["tokens"])
    assert prompt == "[user]weather?[assistant calls=call_1][tool id=call_1]sunny", prompt


async def test_a_message_without_a_name_has_none_in_the_template() -> None:
    async with running(_fake()) as srv:
        r = await srv.http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi", "name": None}]})
        assert r.status_code == 200, r.text
        assert srv.fake.tokenizer.decode(r.json()["tokens"]) == "[user]hi"
