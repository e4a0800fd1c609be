"""``--chat-template-content-format auto`` on the chat templates real models ship, as a user meets them.

The templates in ``chat_templates/`` are written for these tests in the structure of the ones the named models
ship (Llama 3.1 with tools, Llama 3.2 Vision, Qwen2.5, Qwen3 with ``<think>`` and ``enable_thinking``, Qwen2-VL,
Qwen3-VL, Mixtral and Mistral v0.3 with their strict alternation, Mistral Small 3.1, Gemma without a system role,
Gemma 3, Phi-3, DeepSeek-V3 and -R1, Granite 3, ChatML, LLaVA 1.5, SmolVLM, Kimi K2). Each row says what
asyncdp detects and what vLLM's detector says (it answers "openai" only for a ``for`` loop over
``message.content`` / ``message['content']`` of a message taken from ``messages``, a slice or an alias of it).

They differ on two templates, both of which take a string or parts: Qwen3-VL's hands the content to a macro
that loops over it, Kimi K2's reads it with ``message.get('content')``. asyncdp gives them parts, so several
text parts of one message render as the template joins them (vLLM joins them with a newline first); one part or
a string renders the same either way.

Whatever the format, the user's words must reach the prompt: each template is rendered through ``POST
/tokenize`` (the rendering of ``/v1/chat/completions``) with the user's content as a string and as text parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncdp.api.content_format import detect_content_format, resolve_content_format
from asyncdp.testing import FakeEngineClient
from asyncdp.testing.tokenizer import byte_tokenizer
from tests.api.conftest import running

TEMPLATES = Path(__file__).parent / "chat_templates"

# template file -> (asyncdp's format, vLLM's format, whether the template takes a system message)
REAL = {
    "chatml": ("string", "string", True),
    "deepseek_r1": ("string", "string", True),
    "deepseek_v3": ("string", "string", True),
    "gemma": ("string", "string", False),  # raises on a system message
    "gemma3": ("openai", "openai", True),
    "granite3": ("string", "string", True),
    "kimi_k2": ("openai", "string", True),
    "llama3_1_tools": ("string", "string", True),
    "llama3_2_vision": ("openai", "openai", True),
    "llava_1_5": ("openai", "openai", True),
    "mistral_small_3_1": ("openai", "openai", True),
    "mistral_v0_3_tools": ("string", "string", True),
    "mixtral": ("string", "string", False),  # raises unless user and assistant alternate from the first message
    "phi3": ("string", "string", True),
    "qwen2_5": ("string", "string", True),
    "qwen2_vl": ("openai", "openai", True),
    "qwen3": ("string", "string", True),
    "qwen3_vl": ("openai", "string", True),
    "smolvlm": ("openai", "openai", True),
}


def source(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def tokenizer(template: str) -> Any:
    tok = byte_tokenizer()
    tok.chat_template = template
    return tok


def test_every_template_file_has_a_row() -> None:
    assert sorted(p.stem for p in TEMPLATES.glob("*.jinja")) == sorted(REAL)


@pytest.mark.parametrize("name", sorted(REAL))
def test_the_detected_format(name: str) -> None:
    expected = REAL[name][0]
    assert detect_content_format(source(name)) == expected
    assert resolve_content_format(tokenizer(source(name)), "auto") == expected


def test_asyncdp_and_vllm_differ_only_on_templates_that_take_both() -> None:
    differ = sorted(name for name, (ours, vllms, _) in REAL.items() if ours != vllms)
    assert differ == ["kimi_k2", "qwen3_vl"]
    for name in differ:  # each renders a string content too (its "is string" branch)
        assert "is string" in source(name)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the rendering does not depend on the backend


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(REAL))
async def test_the_users_words_reach_the_prompt_as_a_string_and_as_parts(name: str) -> None:
    tok = tokenizer(source(name))
    system = [{"role": "system", "content": "Be brief."}] if REAL[name][2] else []
    prompts = []
    async with running(FakeEngineClient(tokenizer=tok)) as srv:
        for content in ("Hello there", [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]):
            r = await srv.http.post("/tokenize", json={"messages": [*system, {"role": "user", "content": content}]})
            assert r.status_code == 200, r.text
            prompts.append(str(tok.decode(r.json()["tokens"])))
    as_string, as_parts = prompts
    assert "Hello there" in as_string
    assert "Hello" in as_parts and "there" in as_parts
    if system:
        assert "Be brief." in as_string
