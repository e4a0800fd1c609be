"""The routes vLLM users call besides generation, and the OpenAPI document generated from the request structs."""

from __future__ import annotations

import pytest

import asyncdp
from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running

pytestmark = pytest.mark.anyio


async def test_model_by_id_and_unknown_model_404() -> None:
    async with running(served_model_names=["m1", "org/m2"]) as srv:
        one = await srv.http.get("/v1/models/org/m2")
        unknown = await srv.http.get("/v1/models/nope")
    assert one.status_code == 200 and one.json()["id"] == "org/m2" and one.json()["object"] == "model"
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "NotFoundError" and unknown.json()["error"]["param"] == "model"


async def test_tokenize_prompt_and_messages_and_detokenize_round_trip() -> None:
    fake = FakeEngineClient(max_model_len=64)
    async with running(fake) as srv:
        prompt = await srv.http.post("/tokenize", json={"prompt": "héllo"})
        messages = await srv.http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
        no_gen = await srv.http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}],
                                                        "add_generation_prompt": False})
        back = await srv.http.post("/detokenize", json={"tokens": prompt.json()["tokens"]})
        wrong_model = await srv.http.post("/detokenize", json={"tokens": [1], "model": "other"})
    body = prompt.json()
    assert set(body) == {"count", "max_model_len", "tokens"}
    assert body["count"] == len(body["tokens"]) == len("héllo".encode()) and body["max_model_len"] == 64
    assert fake.tokenizer.decode(messages.json()["tokens"]).endswith("<|im_start|>assistant\n")
    assert messages.json()["count"] > no_gen.json()["count"]
    assert back.json() == {"prompt": "héllo"}
    assert wrong_model.status_code == 404


async def test_version_and_ping_follow_health() -> None:
    fake = FakeEngineClient()
    async with running(fake) as srv:
        version = await srv.http.get("/version")
        get_ping, post_ping = await srv.http.get("/ping"), await srv.http.post("/ping")
        fake.healthy = False
        sick = await srv.http.get("/ping")
    assert version.json() == {"version": asyncdp.__version__}
    assert get_ping.status_code == post_ping.status_code == 200
    assert sick.status_code == 503 and sick.json()["error"]["code"] == 503


async def test_openapi_document_covers_every_route_with_bodies_ranges_and_errors() -> None:
    async with running() as srv:
        doc = (await srv.http.get("/openapi.json")).json()
        routes = {rule.rule for rule in srv.app.url_map.iter_rules() if rule.endpoint != "static"}
    assert doc["openapi"].startswith("3.1")
    assert {p.replace("{model_id}", "<path:model_id>") for p in doc["paths"]} == routes
    completions = doc["paths"]["/v1/completions"]["post"]
    assert set(completions["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert completions["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorResponse"}
    schemas = doc["components"]["schemas"]
    n = schemas["CompletionRequest"]["properties"]["n"]
    assert {"type": "integer", "minimum": 1, "maximum": 128} in n["anyOf"]
    assert schemas["CompletionRequest"]["properties"]["tools"]["enum"] == [None, []]  # chat: asyncdp.api.tool_calls
    formats = str(schemas["ChatRequest"]["properties"]["response_format"])
    assert all(name in formats for name in ("TextFormat", "JsonObjectFormat", "JsonSchemaFormat"))
    assert "prompt" in schemas["CompletionRequest"]["required"]
    assert doc["paths"]["/tokenize"]["post"]["requestBody"]["content"]["application/json"]["schema"]["anyOf"]

