"""An assistant message's reasoning reaches the chat template, as vLLM passes it (``reasoning`` and
``reasoning_content`` both), for templates such as Qwen3's that render an earlier turn's thinking."""

from __future__ import annotations

from typing import Any

import pytest

from asyncdp.testing import FakeEngineClient
from asyncdp.testing.tokenizer import byte_tokenizer
from tests.api.conftest import running

pytestmark = pytest.mark.anyio

# Renders each field under the name it reads; Qwen3's template reads message.reasoning_content.
THINKING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.reasoning_content is string %}<think>{{ message.reasoning_content }}</think>{% endif %}"
    "{% if message.reasoning is defined %}({{ message.reasoning }}){% endif %}"
    "{{ message.content }}<|im_end|>\n{% endfor %}"
)


async def render(messages: list[dict[str, Any]]) -> tuple[int, Any]:
    tok = byte_tokenizer()
    tok.chat_template = THINKING_TEMPLATE
    async with running(FakeEngineClient(tokenizer=tok)) as srv:
        r = await srv.http.post("/tokenize", json={"messages": messages, "add_generation_prompt": False})
    return r.status_code, (tok.decode(r.json()["tokens"]) if r.status_code == 200 else r.json())


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_an_assistant_messages_reasoning_reaches_the_template_under_both_names(field: str) -> None:
    status, prompt = await render([{"role": "user", "content": "2+2?"},
                                   {"role": "assistant", "content": "4", field: "two and two"}])
    assert status == 200, prompt
    assert prompt == ("<|im_start|>user\n2+2?<|im_end|>\n"
                      "<|im_start|>assistant\n<think>two and two</think>(two and two)4<|im_end|>\n")


async def test_reasoning_wins_over_reasoning_content() -> None:
    status, prompt = await render([{"role": "assistant", "content": "4", "reasoning": "new",
                                    "reasoning_content": "old"}])
    assert status == 200, prompt
    assert prompt == "<|im_start|>assistant\n<think>new</think>(new)4<|im_end|>\n"


async def test_without_reasoning_the_template_finds_none() -> None:
    status, prompt = await render([{"role": "assistant", "content": "4", "reasoning_content": None}])
    assert status == 200, prompt
    assert prompt == "<|im_start|>assistant\n4<|im_end|>\n"


async def test_another_roles_reasoning_is_not_passed() -> None:
    """As vLLM: only an assistant turn has reasoning."""
    status, prompt = await render([{"role": "user", "content": "hi", "reasoning_content": "hmm"}])
    assert status == 200, prompt
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n"


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_a_reasoning_that_is_not_a_string_is_a_400_naming_it(field: str) -> None:
    status, body = await render([{"role": "assistant", "content": "4", field: ["x"]}])
    assert status == 400
    assert body["error"]["param"] == f"messages[0].{field}"
