"""Chat ``tools`` with the tool choices that need no tool-call parser, served as vLLM serves them without
``--enable-auto-tool-choice``: ``"none"`` (the tools reach the chat template, the answer is text), a named
function (the output constrained to its parameters' schema, the answer one tool call) and ``"required"`` (a JSON
array of calls, the answer its tool calls, ``finish_reason: "tool_calls"``), whole and streamed.

Found by pointing the official ``openai`` client at ``asyncdp serve builtin:smollm2-135m``: every request with
``tools`` was a 400 (``tools is not supported by this server``), even ``tool_choice="none"``, which asks for
no parsing at all, and the named and ``"required"`` choices that vLLM serves through structured outputs."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from asyncdp.api.offload import INLINE_BODY_BYTES, heavy_body
from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running, sse_events

pytest.importorskip("llguidance", reason="tool choices that constrain the output need llguidance")
pytestmark = pytest.mark.anyio

CHAT: Any = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time"}},
]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
# Prints the names of the tools it is given, then the messages (ChatML-like).
TEMPLATE = ("{% if tools %}TOOLS={{ tools | map(attribute='function') | map(attribute='name') | join(',') }};"
            "{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")


class ScriptedFake(FakeEngineClient):
    """Generates the bytes of ``script`` (then spaces), whatever the prompt."""

    def __init__(self, script: str) -> None:
        super().__init__()
        self.script = script.encode()

    def _token_at(self, prompt: list[int], seed: int | None, k: int) -> int:  # type: ignore[override]
        return self.script[k] if k < len(self.script) else ord(" ")


async def test_tool_choice_none_gives_the_tools_to_the_template_and_answers_text() -> None:
    fake = FakeEngineClient()
    fake.tokenizer.chat_template = TEMPLATE
    async with running(fake) as srv:
        r = await srv.openai().chat.completions.create(model="fake-model", messages=CHAT, tools=TOOLS,
                                                       tool_choice="none", max_tokens=4)
    prompt = fake.tokenizer.decode(fake.submitted[0][1])
    assert prompt.startswith("TOOLS=get_weather,get_time;<user>Weather in Paris?"), prompt
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    assert fake.submitted[0][2].structured is None


@pytest.mark.filterwarnings(  # the openai client's stream leaves httpcore's generator to the collector (trio)
    "ignore:Exception ignored in. <async_generator object:pytest.PytestUnraisableExceptionWarning")
async def test_a_named_function_constrains_the_output_to_its_parameters_and_answers_one_call() -> None:
    async with running() as srv:
        client = srv.openai()
        r = await client.chat.completions.create(model="fake-model", messages=CHAT, tools=TOOLS, tool_choice=NAMED,
                                                 max_tokens=7, seed=1)
        stream = await client.chat.completions.create(model="fake-model", messages=CHAT, tools=TOOLS,
                                                      tool_choice=NAMED, max_tokens=7, seed=1, stream=True)
        chunks = [c async for c in stream]
    constraint = srv.fake.submitted[0][2].structured
    assert constraint is not None and json.loads(constraint.json_schema or "") == WEATHER
    assert constraint.param == "tool_choice"  # what a grammar failure mid-generation names
    message = r.choices[0].message
    (call,) = message.tool_calls or []
    assert message.content == "" and call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert call.function.name == "get_weather" and len(call.function.arguments) == 7
    assert r.choices[0].finish_reason == "length"  # as generated (the fake writes no JSON)
    deltas = [d for c in chunks for ch in c.choices for d in (ch.delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function and deltas[0].function.name == "get_weather"
    assert all(d.id is None and d.function and d.function.name is None for d in deltas[1:])
    assert "".join(d.function.arguments or "" for d in deltas if d.function) == call.function.arguments
    assert not any(ch.delta.content for c in chunks for ch in c.choices)
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["length"]


async def test_required_answers_the_generated_calls_with_finish_reason_tool_calls() -> None:
    answer = [{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]
    fake = ScriptedFake(json.dumps(answer) + "|")
    body = {"model": "fake-model", "messages": CHAT, "tools": TOOLS, "tool_choice": "required", "stop": ["|"],
            "max_tokens": 200}
    async with running(fake) as srv:
        whole = await srv.openai().chat.completions.create(**body)
        streamed = await srv.http.post("/v1/chat/completions", json={**body, "stream": True, "n": 2})
    schema = json.loads(fake.submitted[0][2].structured.json_schema or "")
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    assert [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]] == [["get_weather"],
                                                                                        ["get_time"]]
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object", "properties": {}}
    message = whole.choices[0].message
    assert message.content == "" and whole.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert len({c.id for c in message.tool_calls or []}) == 2
    events = [json.loads(e) for e in sse_events(streamed.text) if e != "[DONE]"]
    calls = {ch["index"]: ch["delta"]["tool_calls"] for e in events for ch in e["choices"]
             if "tool_calls" in ch["delta"]}
    assert sorted(calls) == [0, 1]  # each choice's calls, in one delta at its end
    for index, deltas in calls.items():
        assert [(d["index"], d["function"]["name"]) for d in deltas] == [(0, "get_weather"), (1, "get_time")]
        finish = [ch["finish_reason"] for e in events for ch in e["choices"] if ch["index"] == index]
        assert finish[-1] == "tool_calls" and set(finish[:-1]) == {None}
    # the text is held back: no chunk carries it as content
    assert not any(ch["delta"].get("content") for e in events for ch in e["choices"])


async def test_required_cut_short_comes_back_as_text_and_parallel_tool_calls_false_allows_one_call() -> None:
    fake = ScriptedFake('[{"name": "get_time", "parameters": {}}]')
    async with running(fake) as srv:
        r = await srv.openai().chat.completions.create(model="fake-model", messages=CHAT, tools=TOOLS,
                                                       tool_choice="required", max_tokens=10,
                                                       parallel_tool_calls=False)
    assert json.loads(fake.submitted[0][2].structured.json_schema or "")["maxItems"] == 1
    assert r.choices[0].message.content == '[{"name": ' and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "length"


async def test_required_hoists_the_tools_defs_to_the_root_where_their_references_resolve() -> None:
    defs = {"City": {"type": "string"}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"c": {"$ref": "#/$defs/City"}}, "$defs": defs}}}]
    clash = [*tools, {"type": "function", "function": {"name": "g", "parameters": {
        "type": "object", "$defs": {"City": {"type": "integer"}}}}}]
    async with running() as srv:
        ok = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "tools": tools,
                                                               "tool_choice": "required", "max_tokens": 2})
        bad = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "tools": clash,
                                                                "tool_choice": "required", "max_tokens": 2})
    assert ok.status_code == 200, ok.text
    schema = json.loads(srv.fake.submitted[0][2].structured.json_schema or "")
    assert schema["$defs"] == defs and "$defs" not in schema["items"]["anyOf"][0]["properties"]["parameters"]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tools[1].function.parameters", bad.text


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": TOOLS}, "tools"),  # no tool_choice means "auto": needs a tool-call parser
    ({"tools": TOOLS, "tool_choice": "auto"}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": NAMED}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "retrieval"}], "tool_choice": "none"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": ""}}], "tool_choice": "none"}, "tools"),
    ({"tools": TOOLS, "tool_choice": NAMED, "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$defs": 5}}}],
      "tool_choice": "required"}, "tools[0].function.parameters"),  # was an AttributeError: a 500
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "pattern": "^a{99999999}$"}}, "required": ["x"]}}}], "tool_choice": "required"},
     "tools"),
])
async def test_what_cannot_be_served_is_a_400_naming_the_parameter(extra: dict, param: str) -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(param), r.json()
    assert srv.fake.submitted == []


async def test_echo_with_tool_calls_and_tools_on_completions_are_400s() -> None:
    messages = [*CHAT, {"role": "assistant", "content": "Calling"}]
    async with running() as srv:
        echo = await srv.http.post("/v1/chat/completions", json={
            "messages": messages, "tools": TOOLS, "tool_choice": NAMED, "echo": True,
            "continue_final_message": True, "add_generation_prompt": False})
        completion = await srv.http.post("/v1/completions", json={"prompt": "a", "tools": TOOLS,
                                                                  "tool_choice": "none"})
        with pytest.raises(openai.BadRequestError):
            await srv.openai().completions.create(model="fake-model", prompt="a",
                                                  extra_body={"tools": TOOLS, "tool_choice": "required"})
    assert echo.status_code == 400 and echo.json()["error"]["param"] == "echo", echo.text
    assert completion.status_code == 400 and completion.json()["error"]["param"] == "tools"
    assert srv.fake.submitted == []


async def test_tokenize_renders_the_tools_as_a_chat_request_does() -> None:
    """vLLM's ``/tokenize`` takes ``tools`` with messages; they were ignored, so the count left them out."""
    fake = FakeEngineClient()
    fake.tokenizer.chat_template = TEMPLATE
    async with running(fake) as srv:
        counted = await srv.http.post("/tokenize", json={"messages": CHAT, "tools": TOOLS})
        await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "tools": TOOLS, "tool_choice": "none",
                                                          "max_tokens": 1})
    assert counted.status_code == 200, counted.text
    assert counted.json()["tokens"] == fake.submitted[0][1]
    assert fake.tokenizer.decode(counted.json()["tokens"]).startswith("TOOLS=get_weather,get_time;")


def test_a_small_body_with_a_tool_choice_is_prepared_in_a_worker_thread() -> None:
    """A named or "required" tool choice compiles the tools' schemas as a grammar (0.65 s for 200 tools): like the
    other constraint parameters, it sends the request's preparation off the event loop, however small the body."""
    body = json.dumps({"messages": CHAT, "tools": TOOLS[1:], "tool_choice": "required"}).encode()
    assert len(body) < INLINE_BODY_BYTES and heavy_body(body)


def test_a_required_answer_nested_past_the_recursion_limit_is_text() -> None:
    """A parameters schema that allows any object lets a model nest deeper than Python's recursion limit: the
    answer comes back as text (as one cut short), never a RecursionError's 500."""
    from asyncdp.api.tool_calls import required_calls

    deep = '[{"name": "f", "parameters": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}]"
    assert required_calls(deep) is None
    assert required_calls('[{"name": "f", "parameters": {"x": 1}}]') is not None
