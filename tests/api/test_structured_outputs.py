"""Structured outputs over HTTP: response_format, guided_* and structured_outputs each become one compiled
StructuredOutputs on the sampling params; conflicting or uncompilable constraints, and grammars over the grammar
library's limits, are 400s naming the parameter. A grammar that fails mid-generation is a 400 too (an error event
then [DONE] when streaming), never a 200 with the text cut short."""

from __future__ import annotations

import json

import msgspec
import orjson
import pytest

from asyncdp.sampling_params.structured import StructuredOutputs, grammar_failed
from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running

pytest.importorskip("llguidance", reason="structured outputs need the optional llguidance package")
pytestmark = pytest.mark.anyio

CHAT = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}

CASES = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}},
     StructuredOutputs(json_schema=json.dumps(SCHEMA))),
    ({"response_format": {"type": "json_object"}}, StructuredOutputs(json_object=True)),
    ({"guided_json": SCHEMA}, StructuredOutputs(json_schema=json.dumps(SCHEMA))),
    ({"guided_json": json.dumps(SCHEMA)}, StructuredOutputs(json_schema=json.dumps(SCHEMA))),
    ({"guided_regex": "[ab]{3}"}, StructuredOutputs(regex="[ab]{3}")),
    ({"guided_choice": ["yes", "no"]}, StructuredOutputs(choice=("yes", "no"))),
    ({"guided_grammar": 'start: "x" | "y"'}, StructuredOutputs(grammar='start: "x" | "y"')),
    ({"structured_outputs": {"choice": ["a", "b"]}}, StructuredOutputs(choice=("a", "b"))),
    ({"structured_outputs": {"json": SCHEMA}}, StructuredOutputs(json_schema=json.dumps(SCHEMA))),
    ({"structured_outputs": {"regex": "a+"}}, StructuredOutputs(regex="a+")),
    ({"guided_json": SCHEMA, "guided_whitespace_pattern": ""},
     StructuredOutputs(json_schema=json.dumps(SCHEMA), whitespace_pattern="")),
    ({"response_format": {"type": "json_object"}, "guided_whitespace_pattern": "[ ]?"},
     StructuredOutputs(json_object=True, whitespace_pattern="[ ]?")),
    ({"structured_outputs": {"json_object": True, "whitespace_pattern": " "}},
     StructuredOutputs(json_object=True, whitespace_pattern=" ")),
]


@pytest.mark.parametrize(("extra", "expected"), CASES)
async def test_each_structured_output_source_reaches_the_sampling_params(extra: dict,
                                                                         expected: StructuredOutputs) -> None:
    async with running() as srv:
        chat = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2, **extra})
        completion = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, **extra})
    assert chat.status_code == 200, chat.text
    assert completion.status_code == 200, completion.text
    named = msgspec.structs.replace(expected, param=next(iter(extra)))  # the parameter a later error names
    assert [s[2].structured for s in srv.fake.submitted] == [named, named]


async def test_text_response_format_asks_for_no_constraint() -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/chat/completions", json={
            "messages": CHAT, "max_tokens": 1, "response_format": {"type": "text"}})
    assert r.status_code == 200 and srv.fake.submitted[0][2].structured is None


@pytest.mark.parametrize(("extra", "param"), [
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p"}}}, "response_format.json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"structured_outputs": {"choice": ["a"], "regex": "a"}}, "structured_outputs"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": SCHEMA, "guided_whitespace_pattern": "("}, "guided_whitespace_pattern"),
    ({"structured_outputs": {"json": SCHEMA, "whitespace_pattern": "[ "}}, "structured_outputs"),
    ({"structured_outputs": {"json_object": True, "whitespace_pattern": ""}, "guided_whitespace_pattern": ""},
     "guided_whitespace_pattern"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    # compiles, but would exhaust the grammar library's limits at the first token: refused up front
    ({"guided_regex": "a{99999999}"}, "guided_regex"),
    ({"structured_outputs": {"regex": "(ab){5000000}"}}, "structured_outputs"),
    ({"guided_json": {"type": "string", "pattern": "^a{99999999}$"}}, "guided_json"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "p", "schema": {"type": "string", "pattern": "^a{99999999}$"}}}}, "response_format"),
    ({"guided_grammar": "start: /a{99999999}/"}, "guided_grammar"),
    ({"guided_choice": [f"option {i}" for i in range(2500)]}, "guided_choice"),
])
async def test_bad_or_conflicting_constraints_are_400_naming_the_parameter(extra: dict, param: str) -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(param), r.json()
    assert srv.fake.submitted == []


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_a_grammar_over_the_librarys_limits_is_a_400_saying_so_for_streams_too(route: str) -> None:
    body = {"prompt": "a"} if route == "/v1/completions" else {"messages": CHAT}
    async with running() as srv:
        for stream in (False, True):
            r = await srv.http.post(route, json={**body, "max_tokens": 20, "stream": stream,
                                                 "guided_regex": "a{99999999}"})
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == "guided_regex" and "exceeds the grammar library's limits" in error["message"]
    assert srv.fake.submitted == []


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_a_grammar_failing_mid_generation_is_a_400_whole_and_an_error_event_before_done_streamed(
        route: str) -> None:
    fake = FakeEngineClient()
    fake.fail_after_tokens = 2  # what the DP client raises for the engine's grammar error output
    fake.fail_after_tokens_with = grammar_failed("regex", "lexer error: too many expressions constructed",
                                                 "guided_regex")
    body = {"prompt": "a"} if route == "/v1/completions" else {"messages": CHAT}
    body |= {"max_tokens": 8, "guided_regex": "[a-z]{8}"}
    async with running(fake) as srv:
        whole = await srv.http.post(route, json=body)
        streamed = await srv.http.post(route, json={**body, "stream": True})
    assert whole.status_code == 400, whole.text
    error = whole.json()["error"]
    assert error["param"] == "guided_regex" and "failed during generation" in error["message"]
    # the engine names the parameter the API tells it (its test: test_engine_structured.py)
    assert {params.structured.param for _, _, params, _ in fake.submitted if params.structured} == {"guided_regex"}
    assert streamed.status_code == 200
    events = [line.removeprefix("data: ") for line in streamed.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    last = orjson.loads(events[-2])["error"]
    assert (last["code"], last["param"]) == (400, "guided_regex")
    assert not any('"finish_reason":"stop"' in e or '"finish_reason": "stop"' in e for e in events)
