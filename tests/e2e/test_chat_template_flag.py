"""``asyncdp serve --chat-template FILE`` with templates in the shape real models ship, through the official
``openai`` client and ``/tokenize`` + ``/detokenize`` (the prompt the server renders):

* Gemma's (no system role, strict alternation, ``raise_exception``): a string and text parts both reach the
  prompt; a system message or two user turns in a row are an OpenAI-style 400 carrying the template's message.
* Qwen3's (``<think>``): ``chat_template_kwargs={"enable_thinking": false}`` closes an empty think block,
  ``continue_final_message`` leaves the assistant's turn open, and with ``add_generation_prompt`` it is a 400.
* LLaVA 1.5's, which renders only text parts: auto detects it and a string content reaches the prompt as a part.

The built-in test model serves them (its byte-level tokenizer spells any text); ``test_real_model`` covers the
real one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest

from tests.e2e.conftest import Server, serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TEMPLATES = Path(__file__).resolve().parents[1] / "api" / "chat_templates"
MODEL = "builtin:tiny-dense"


async def prompt_of(server: Server, **body: Any) -> str:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10.0) as http:
        r = await http.post("/tokenize", json=body)
        assert r.status_code == 200, r.text
        r = await http.post("/detokenize", json={"tokens": r.json()["tokens"]})
        assert r.status_code == 200, r.text
        return str(r.json()["prompt"])


async def refusal(server: Server, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    async with server.openai() as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,  # type: ignore[arg-type]
                                                 extra_body=extra or None)
    assert info.value.status_code == 400
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "BadRequestError" and body["code"] == 400, body
    return body


def detected_format(server: Server) -> str:
    found = re.search(r"chat template content format: '(\w+)'", server.log())
    assert found, server.log()[-2000:]
    return found.group(1)


async def test_gemma_renders_both_shapes_and_its_refusals_are_400s(tmp_path: Path) -> None:
    with serve(tmp_path, "--chat-template", str(TEMPLATES / "gemma.jinja"), model=MODEL) as server:
        with anyio.fail_after(60):
            async with server.openai() as client:
                answer = await client.chat.completions.create(
                    model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "Hello there"}])
            as_string = await prompt_of(server, messages=[{"role": "user", "content": "Hello there"}])
            as_parts = await prompt_of(server, messages=[{"role": "user", "content": [
                {"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}])
            system = await refusal(server, [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "Hi"}])
            twice = await refusal(server, [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hi"}])
        assert detected_format(server) == "string"
    assert answer.choices[0].finish_reason in ("length", "stop")
    assert as_string.endswith("<start_of_turn>user\nHello there<end_of_turn>\n<start_of_turn>model\n")
    assert as_parts.endswith("<start_of_turn>user\nHello\nthere<end_of_turn>\n<start_of_turn>model\n")
    assert system["message"].endswith("System role not supported") and system["param"] == "messages"
    assert twice["message"].endswith("Conversation roles must alternate user/assistant/user/assistant/...")


async def test_qwen3_template_options(tmp_path: Path) -> None:
    turns = [{"role": "user", "content": "Count:"}, {"role": "assistant", "content": "1, 2,"}]
    with serve(tmp_path, "--chat-template", str(TEMPLATES / "qwen3.jinja"), model=MODEL) as server:
        with anyio.fail_after(60):
            default = await prompt_of(server, messages=turns[:1])
            no_thinking = await prompt_of(server, messages=turns[:1], chat_template_kwargs={"enable_thinking": False})
            continued = await prompt_of(server, messages=turns, continue_final_message=True)
            both = await refusal(server, turns, continue_final_message=True, add_generation_prompt=True)
            reserved = await refusal(server, turns[:1], chat_template_kwargs={"add_generation_prompt": False})
            async with server.openai() as client:
                answer = await client.chat.completions.create(
                    model=MODEL, max_tokens=2, messages=turns[:1],  # type: ignore[arg-type]
                    extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert default == "<|im_start|>user\nCount:<|im_end|>\n<|im_start|>assistant\n"
    assert no_thinking == default + "<think>\n\n</think>\n\n"
    assert continued == "<|im_start|>user\nCount:<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n1, 2,"
    assert both["param"] == "continue_final_message"
    assert reserved["param"] == "chat_template_kwargs" and "add_generation_prompt" in reserved["message"]
    assert answer.choices[0].message.role == "assistant"


async def test_a_template_that_reads_only_parts_gets_parts(tmp_path: Path) -> None:
    with serve(tmp_path, "--chat-template", str(TEMPLATES / "llava_1_5.jinja"), model=MODEL) as server:
        with anyio.fail_after(60):
            prompt = await prompt_of(server, messages=[{"role": "user", "content": "Hello there"}])
        assert detected_format(server) == "openai"
    assert prompt == "USER: Hello there ASSISTANT:"
