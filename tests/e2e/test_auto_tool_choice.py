"""``asyncdp serve --enable-auto-tool-choice --tool-call-parser hermes``: tools with ``tool_choice="auto"`` through
the official ``openai`` client get a 200 and a well-formed message from API-server processes the launcher
started (``-dp 2 --api-server-count 2``), whole and streamed. The built-in model writes random bytes, so the
answer is content; the parsing itself is tested over the fake engine (tests/api/test_chat_auto_tool_choice.py).
This proves the flags reach every API server: without them, such a request is a 400."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.e2e.conftest import MODEL, serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOOLS: Any = [{"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}}}}]
ASK: Any = [{"role": "user", "content": "What time is it?"}]


@pytest.mark.filterwarnings(  # the openai client's stream leaves httpcore's generator to the collector
    "ignore:Exception ignored in. <async_generator object:pytest.PytestUnraisableExceptionWarning")
async def test_auto_tool_choice_is_served_by_every_api_server(tmp_path: Path) -> None:
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2", "--enable-auto-tool-choice",
               "--tool-call-parser", "hermes") as server:
        with anyio.fail_after(60):
            answers = []
            for _ in range(4):  # a client (a connection) each: the kernel spreads them over the two API servers
                async with server.openai() as client:
                    answers.append(await client.chat.completions.create(
                        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=8, seed=1))
            async with server.openai() as client:
                stream = await client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                                              max_tokens=8, seed=1, stream=True)
                chunks = [c async for c in stream]
    for r in answers:
        (choice,) = r.choices
        assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
        assert choice.finish_reason in ("stop", "length", "tool_calls")
        assert r.usage is not None and 0 < r.usage.completion_tokens <= 8
    deltas = [ch.delta for c in chunks for ch in c.choices]
    assert deltas[0].role == "assistant"
    streamed = "".join(d.content or "" for d in deltas)
    assert streamed == answers[0].choices[0].message.content  # seeded: the same text, whole and streamed
    assert chunks[-1].choices[0].finish_reason == answers[0].choices[0].finish_reason
