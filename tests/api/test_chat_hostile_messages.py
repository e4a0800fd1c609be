"""Careless and hostile chat requests, through the official client and raw httpx: each bad input is a 400 in
OpenAI's error shape whose ``param`` names the field at fault, and the odd-but-valid ones are answered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from asyncdp.testing import FakeEngineClient
from asyncdp.testing.tokenizer import byte_tokenizer
from tests.api.conftest import running

pytestmark = pytest.mark.anyio

TEMPLATES = Path(__file__).parent / "chat_templates"
USER = {"role": "user", "content": "hi"}


def call(function: dict[str, Any]) -> list[dict[str, Any]]:
    return [USER, {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                        "function": function}]},
            {"role": "tool", "tool_call_id": "c1", "content": "4"}]


def tokenizer(name: str | None) -> Any:
    tok = byte_tokenizer()
    if name is not None:
        tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    return tok


@pytest.mark.parametrize(("template", "kwargs"), [
    ("llama3_1_tools", {"date_string": 5}),  # a string the template concatenates
    ("granite3", {"strftime_now": "today"}),  # a function the template calls
    (None, {"sanitize_control_tokens": True}),  # Transformers' own argument, which needs tokenize=True
])
async def test_template_kwargs_that_break_the_template_are_named(template: str | None, kwargs: Any) -> None:
    async with running(FakeEngineClient(tokenizer=tokenizer(template), max_model_len=4096)) as srv:
        with pytest.raises(openai.BadRequestError) as caught:
            await srv.openai().chat.completions.create(model="fake-model", messages=[USER], max_tokens=1,
                                                       extra_body={"chat_template_kwargs": kwargs})
        fine = await srv.openai().chat.completions.create(model="fake-model", messages=[USER], max_tokens=1)
    assert caught.value.body["param"] == "chat_template_kwargs"  # type: ignore[index]
    assert fine.choices[0].finish_reason == "length"


@pytest.mark.parametrize(("messages", "param"), [
    (call({"arguments": "{}"}), "messages[1].tool_calls[0].function.name"),
    (call({"name": 3, "arguments": "{}"}), "messages[1].tool_calls[0].function.name"),
    (call({"name": "add", "arguments": 5}), "messages[1].tool_calls[0].function.arguments"),
    (call({"name": "add", "arguments": ["a"]}), "messages[1].tool_calls[0].function.arguments"),
    ([{"role": "user", "content": "x" * 5000}], "messages"),  # longer than max_model_len (4096)
])
async def test_bad_messages_name_the_field(messages: list[dict[str, Any]], param: str) -> None:
    async with running(FakeEngineClient(tokenizer=tokenizer("llama3_1_tools"), max_model_len=4096)) as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["code"] == 400


@pytest.mark.parametrize("messages", [
    call({"name": "add", "arguments": '{"a": 1}'}),  # assistant tool call with null content
    call({"name": "add", "arguments": {"a": 1}}),  # arguments as an object (Transformers' shape)
    call({"name": "add", "arguments": None}),
    [USER, {"role": "assistant", "content": None}, USER],
    [{"role": "user", "content": []}],
    [{"role": "user", "content": "hi", "name": "bob"}],
    [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}, USER],
])
async def test_odd_but_valid_messages_are_answered(messages: list[dict[str, Any]]) -> None:
    async with running(FakeEngineClient(tokenizer=tokenizer("llama3_1_tools"), max_model_len=4096)) as srv:
        r = await srv.openai().chat.completions.create(model="fake-model", messages=messages,  # type: ignore[arg-type]
                                                       max_tokens=1)
    assert r.choices[0].finish_reason == "length"
