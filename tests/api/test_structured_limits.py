"""Structured-output schemas nested deeper than ``MAX_SCHEMA_DEPTH``: a 400 naming the parameter, whether the
schema is a string holding JSON (``json.loads`` would recurse past the interpreter's limit) or an object the
request decoder accepted just under its own limit (``json.dumps`` would), and a refusal offline too. Before the
check these were RecursionErrors: 500s over HTTP."""

from __future__ import annotations

import pytest

from asyncdp.errors import InvalidSamplingParams
from asyncdp.sampling_params import SamplingParams
from asyncdp.sampling_params.structured import MAX_SCHEMA_DEPTH, StructuredOutputs, json_depth, load_schema
from tests.api.conftest import running

pytest.importorskip("llguidance", reason="structured outputs need the optional llguidance package")

CHAT = b'"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1'


def _nested_text(depth: int) -> str:
    return "[" * depth + "]" * depth


def _nested_object(depth: int) -> str:  # depth levels of objects, as JSON text
    return '{"a": ' * (depth - 1) + "{}" + "}" * (depth - 1)


def _wrap(param: str, value: str) -> str:
    """``value`` (JSON text) placed where ``param`` goes in a chat body."""
    if param == "response_format.json_schema.schema":
        return f'"response_format": {{"type": "json_schema", "json_schema": {{"name": "p", "schema": {value}}}}}'
    if param == "structured_outputs.json":
        return f'"structured_outputs": {{"json": {value}}}'
    return f'"{param}": {value}'


def _as_string(text: str) -> str:
    return '"' + text + '"'  # brackets and braces with no quotes inside: a JSON string as it stands


@pytest.mark.anyio
@pytest.mark.parametrize("param", ["guided_json", "structured_outputs.json"])
@pytest.mark.parametrize("depth", [MAX_SCHEMA_DEPTH + 1, 5000])
async def test_a_schema_string_nested_too_deeply_is_a_400_naming_the_parameter(param: str, depth: int) -> None:
    body = b"{" + CHAT + b", " + _wrap(param, _as_string(_nested_text(depth))).encode() + b"}"
    async with running() as srv:
        r = await srv.http.post("/v1/chat/completions", content=body,
                                headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "nested too deeply" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == param
    assert not srv.fake.submitted


@pytest.mark.anyio
@pytest.mark.parametrize("param", ["guided_json", "structured_outputs.json", "response_format.json_schema.schema"])
@pytest.mark.parametrize("depth", [MAX_SCHEMA_DEPTH + 1, 975, 985, 990])
async def test_a_schema_object_nested_too_deeply_is_a_400_naming_the_parameter(param: str, depth: int) -> None:
    # just under the request decoder's own limit: decoded fine, then json.dumps recursed (a 500) before the check
    body = b"{" + CHAT + b", " + _wrap(param, _nested_object(depth)).encode() + b"}"
    async with running() as srv:
        r = await srv.http.post("/v1/chat/completions", content=body,
                                headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "nested too deeply" in r.json()["error"]["message"]
    assert not srv.fake.submitted
    if r.json()["error"]["message"] != "The request body is nested too deeply.":  # the decoder's own limit
        assert r.json()["error"]["param"] == param  # (stack-dependent: trio's is deeper at 990)


@pytest.mark.anyio
async def test_a_schema_at_the_limit_is_not_refused_for_depth() -> None:
    body = b"{" + CHAT + b", " + _wrap("guided_json", _nested_object(MAX_SCHEMA_DEPTH)).encode() + b"}"
    async with running() as srv:
        r = await srv.http.post("/v1/chat/completions", content=body,
                                headers={"content-type": "application/json"})
    assert "nested too deeply" not in r.text  # (the grammar library refuses it for its own recursion limit)


@pytest.mark.parametrize("depth", [MAX_SCHEMA_DEPTH + 1, 5000, 100_000])
def test_offline_params_refuse_a_schema_nested_too_deeply(depth: int) -> None:
    params = SamplingParams(structured=StructuredOutputs(json_schema=_nested_text(depth)))
    with pytest.raises(InvalidSamplingParams, match="nested too deeply") as info:
        params.validate()
    assert info.value.field == "structured.json_schema"


def test_json_depth_measures_without_recursing() -> None:
    deep: list = []
    for _ in range(50_000):
        deep = [deep]
    assert json_depth(deep) == 50_001
    assert json_depth({"a": [1, {"b": 2}], "c": 3}) == 3
    assert json_depth(7) == 0
    assert load_schema('{"a": [1]}', "f") == {"a": [1]}
