"""``tool_choice: "auto"`` with ``--tool-call-parser`` ``mistral``, ``qwen3_coder`` and ``llama4_pythonic``, whole
and streamed through the official ``openai`` client, as tests/api/test_chat_auto_tool_choice.py checks the others:
the calls in the model's text become ``tool_calls`` (``qwen3_coder``'s arguments typed by the tools' schemas,
``mistral``'s ids nine letters and digits), the text around them content, and the format's special tokens are
kept in the text the parser reads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncdp.testing import FakeEngineClient, byte_tokenizer
from tests.api.conftest import running, sse_events, whole_and_streamed
from tests.api.test_chat_auto_tool_choice import CHAT, STREAM_WARNING, TEMPLATE

pytestmark = pytest.mark.anyio

TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                         "metric": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "get_time"}},
]
CASES = {  # parser (and what the case shows): (reply, special tokens, content, calls)
    "mistral": ('Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich", "days": 2}[TOOL_CALLS]get_time[ARGS]{}',
                ["[TOOL_CALLS]", "[ARGS]"], "Checking.",
                [("get_weather", '{"city": "Zürich", "days": 2}'), ("get_time", "{}")]),
    "qwen3_coder": ("OK.\n<tool_call>\n<function=get_weather>\n"
                    "<parameter=days>\n2\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n"
                    "</tool_call>\n<tool_call><function=get_time></function></tool_call>", [], "OK.",
                    [("get_weather", '{"days": 2, "metric": true}'), ("get_time", "{}")]),
    "qwen3_coder without <tool_call>": ("OK.\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n"
                                        "</function>\n</tool_call>\n<function=get_time>\n</function>", [], "OK.",
                                        [("get_weather", '{"days": 2}'), ("get_time", "{}")]),
    "llama4_pythonic": ('<|python_start|>[get_weather(city="Zürich", days=2), get_time()]<|python_end|> Checking.',
                        ["<|python_start|>", "<|python_end|>"], " Checking.",
                        [("get_weather", '{"city": "Zürich", "days": 2}'), ("get_time", "{}")]),
}


@pytest.mark.filterwarnings(STREAM_WARNING)
@pytest.mark.parametrize("case", list(CASES))
async def test_auto_turns_the_calls_into_tool_calls_whole_and_streamed(case: str) -> None:
    reply, special, content, expected = CASES[case]
    parser = case.split()[0]
    tok = byte_tokenizer()
    if special:
        tok.add_special_tokens({"additional_special_tokens": special})  # as Mistral's and Llama 4's mark them
    fake = FakeEngineClient(tokenizer=tok, replies=lambda _prompt, _seed: reply)
    fake.tokenizer.chat_template = TEMPLATE
    body: Any = {"model": "fake-model", "messages": CHAT, "tools": TOOLS, "max_tokens": 200}
    async with running(fake, tool_call_parser=parser) as srv:
        whole, accumulated = await whole_and_streamed(srv.openai(), body)
        raw = await srv.http.post("/v1/chat/completions", json={**body, "stream": True})
    assert [s[2].skip_special_tokens for s in fake.submitted] == [not special] * 3
    for answer in (whole, accumulated):
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == content
        calls = choice.message.tool_calls or []
        assert [(c.type, c.function.name, c.function.arguments) for c in calls] == [
            ("function", name, arguments) for name, arguments in expected]
        for c in calls:
            assert (len(c.id) == 9 and c.id.isalnum()) if parser == "mistral" else c.id.startswith("chatcmpl-tool-")
    deltas = [ch["delta"] for c in (json.loads(e) for e in sse_events(raw.text) if e != "[DONE]")
              for ch in c["choices"]]
    assert [tc["index"] for d in deltas for tc in d.get("tool_calls", [])] == [0, 1]
    assert "".join(d.get("content") or "" for d in deltas) == content
