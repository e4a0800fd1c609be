"""A tool call in the conversation reaches the chat template as vLLM gives it: a call with no arguments (null or
"", as clients send for a tool without parameters) has an empty object, so Llama 3.1's template renders
``"parameters": {}`` (it rendered ``""`` or ``null``), and a call that is not a function call (no ``function``
object, another ``type``) is a 400 naming it (a template reading ``call.function`` failed on it, or rendered
nothing for it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running

pytestmark = pytest.mark.anyio

LLAMA = (Path(__file__).parent / "chat_templates" / "llama3_1_tools.jinja").read_text(encoding="utf-8")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def conversation(*calls: Any) -> list[Any]:
    return [{"role": "user", "content": "What time is it?"},
            {"role": "assistant", "content": None, "tool_calls": list(calls)}]


async def render(messages: list[Any]) -> Any:
    fake = FakeEngineClient()
    fake.tokenizer.chat_template = LLAMA
    async with running(fake) as srv:
        r = await srv.http.post("/tokenize", json={"messages": messages, "add_generation_prompt": False})
    return r


@pytest.mark.parametrize("arguments", ["", None, "{}"])
async def test_a_call_without_arguments_has_an_empty_object(arguments: Any) -> None:
    r = await render(conversation({"id": "c1", "type": "function", "function": {"name": "now", "arguments": arguments}}))
    assert r.status_code == 200, r.text
    prompt = FakeEngineClient().tokenizer.decode(r.json()["tokens"])
    assert prompt.endswith('{"name": "now", "parameters": {}}<|eot_id|>'), prompt


@pytest.mark.parametrize("call", [
    {"id": "c1"},
    {"id": "c1", "type": "function", "function": "now"},
    {"id": "c1", "type": "custom", "custom": {"name": "now", "input": ""}},
])
async def test_a_call_that_is_not_a_function_call_is_a_400_naming_it(call: Any) -> None:
    fake = FakeEngineClient()
    fake.tokenizer.chat_template = LLAMA
    async with running(fake) as srv:
        with pytest.raises(openai.BadRequestError) as info:
            await srv.openai().chat.completions.create(model="fake-model", max_tokens=1, messages=conversation(call))
    body: Any = info.value.body
    assert body["param"] == "messages[1].tool_calls[0]", body
    assert body["message"].startswith("messages[1].tool_calls[0] must be a function call"), body
