"""``asyncdp serve --reasoning-parser qwen3``: a chat request through the official ``openai`` client gets a 200 and
a well-formed message from a real deployment, whole and streamed. The built-in model writes random text with no
``</think>``, so the answer is all reasoning (as a thinking model cut short); the parsing itself is tested over
the fake engine (tests/api/test_chat_reasoning_parser.py). This proves the flag reaches the API server: without
it, a message has no ``reasoning``.

A ``response_format`` on such a server constrains only what follows ``</think>`` (before, a 400): the built-in
model never writes it, so its greedy answer is all reasoning, the same as without the constraint."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.e2e.conftest import MODEL, serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ASK: Any = [{"role": "user", "content": "What is 2+2?"}]


@pytest.mark.filterwarnings(  # the openai client's stream leaves httpcore's generator to the collector
    "ignore:Exception ignored in. <async_generator object:pytest.PytestUnraisableExceptionWarning")
async def test_the_thinking_comes_back_as_reasoning(tmp_path: Path) -> None:
    with serve(tmp_path, "--reasoning-parser", "qwen3") as server:
        with anyio.fail_after(60):
            async with server.openai() as client:
                whole = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, seed=1)
                stream = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, seed=1,
                                                              stream=True)
                deltas = [ch.delta.model_dump(exclude_none=True) async for c in stream for ch in c.choices]
    (choice,) = whole.choices
    message = choice.message.model_dump()
    assert message["role"] == "assistant" and "reasoning" in message
    assert (message["reasoning"] or "") + (message["content"] or "") != ""
    assert choice.finish_reason in ("stop", "length")
    assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 8
    assert deltas[0] == {"role": "assistant"}  # (content null)
    for field in ("reasoning", "content"):  # seeded: the same text, whole and streamed
        assert "".join(d.get(field, "") for d in deltas) == (message[field] or "")


YES_NO: Any = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
               "required": ["answer"], "additionalProperties": False}


@pytest.mark.skipif(importlib.util.find_spec("llguidance") is None, reason="needs llguidance")
async def test_a_json_schema_leaves_the_thinking_free(tmp_path: Path) -> None:
    """With the grammar applied from the first token, the answer would begin with ``{"answer":"``."""
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "yes_no", "schema": YES_NO, "strict": True}}
    with serve(tmp_path, "--reasoning-parser", "deepseek_r1") as server:
        with anyio.fail_after(60):
            async with server.openai() as client:
                constrained = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=24,
                                                                   temperature=0, response_format=fmt)
                free = await client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=24,
                                                            temperature=0)
    (choice,) = constrained.choices
    message = choice.message.model_dump()
    assert message["content"] is None and message["reasoning"], message  # no </think>: all of it is thinking
    assert not message["reasoning"].startswith("{")
    assert message["reasoning"] == free.choices[0].message.model_dump()["reasoning"]
    assert choice.finish_reason in ("stop", "length")
