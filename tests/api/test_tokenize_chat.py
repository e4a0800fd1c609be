"""``POST /tokenize`` with ``messages`` takes what vLLM's ``TokenizeChatRequest`` takes and renders it as a chat
request renders its prompt, chat's ``reasoning_effort`` and ``documents`` too (vLLM's ``/tokenize`` ignores them):
the count is the chat request's prompt, never another one's."""

from __future__ import annotations

from typing import Any

import pytest

from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "hi"}]
SHOWS = ("[{{ reasoning_effort | default('-') }} {{ enable_thinking | default('-') }} {{ flavour | default('-') }} "
         "{{ (tools or []) | length }} {{ (documents or []) | length }}]{% for m in messages %}{{ m['content'] }}"
         "{% endfor %}"
         "{% if add_generation_prompt %}>{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_time"}}]


def showing() -> FakeEngineClient:
    fake = FakeEngineClient()
    fake.tokenizer.chat_template = SHOWS
    return fake


async def test_the_fields_vllm_takes_render_the_prompt_a_chat_request_renders() -> None:
    fields: list[dict[str, Any]] = [
        {}, {"chat_template_kwargs": {"flavour": "x", "enable_thinking": False}}, {"add_generation_prompt": False},
        {"tools": TOOLS}, {"add_special_tokens": True},
        {"chat_template_kwargs": {"reasoning_effort": "low", "enable_thinking": True}}]
    async with running(showing()) as srv:
        counted = [await srv.http.post("/tokenize", json={"messages": USER, **extra}) for extra in fields]
        chat = {"model": "fake-model", "messages": USER, "max_tokens": 1}
        for extra in fields[:-1]:  # (tools without a tool-call parser: "none" still shows them, as in vLLM)
            extra = {**extra, "tool_choice": "none"} if "tools" in extra else extra
            assert (await srv.http.post("/v1/chat/completions", json={**chat, **extra})).status_code == 200
        effort = await srv.http.post("/v1/chat/completions", json={**chat, "reasoning_effort": "low"})
    assert [r.status_code for r in counted] == [200] * len(fields) and effort.status_code == 200
    assert [r.json()["tokens"] for r in counted] == [ids for _, ids, _, _ in srv.fake.submitted]
    assert [srv.fake.tokenizer.decode(r.json()["tokens"]) for r in counted[:4]] == [
        "[- - - 0 0]hi>", "[- False x 0 0]hi>", "[- - - 0 0]hi", "[- - - 1 0]hi>"]


@pytest.mark.parametrize("extra", [
    {"reasoning_effort": "low"}, {"reasoning_effort": "none"}, {"documents": [{"title": "t", "text": "d"}]},
    {"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False}}])
async def test_chat_s_own_prompt_fields_count_the_prompt_the_chat_request_renders(extra: dict[str, Any]) -> None:
    # (vLLM's /tokenize ignores reasoning_effort and documents: its count is of another prompt than the chat's)
    async with running(showing()) as srv:
        counted = await srv.http.post("/tokenize", json={"messages": USER, **extra})
        plain = await srv.http.post("/tokenize", json={"messages": USER})
        chat = await srv.http.post("/v1/chat/completions", json={
            "model": "fake-model", "messages": USER, "max_tokens": 1, **extra})
    assert counted.status_code == plain.status_code == chat.status_code == 200
    assert counted.json()["tokens"] == srv.fake.submitted[-1][1] != plain.json()["tokens"]
    assert chat.json()["usage"]["prompt_tokens"] == counted.json()["count"]


@pytest.mark.parametrize(("field", "value"), [("reasoning_effort", "loud"), ("documents", [{"title": 1}]),
                                              ("mm_processor_kwargs", {})])
async def test_a_bad_or_unsupported_prompt_field_is_a_400_naming_it(field: str, value: Any) -> None:
    async with running(showing()) as srv:
        refused = await srv.http.post("/tokenize", json={"messages": USER, field: value})
        null = await srv.http.post("/tokenize", json={"messages": USER, field: None})
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["type"] == "BadRequestError" and field in (error["param"] or "")
    assert null.status_code == 200


@pytest.mark.parametrize("body", [{"prompt": "héllo"}, {"messages": USER}])
async def test_return_token_strs_answers_each_tokens_string_as_vllm(body: dict[str, Any]) -> None:
    async with running(showing()) as srv:
        asked = (await srv.http.post("/tokenize", json={**body, "return_token_strs": True})).json()
        plain = (await srv.http.post("/tokenize", json={**body, "return_token_strs": False})).json()
    assert asked["token_strs"] == srv.fake.tokenizer.convert_ids_to_tokens(asked["tokens"])
    assert len(asked["token_strs"]) == asked["count"] > 0
    assert set(plain) == {"count", "max_model_len", "tokens"} and plain["tokens"] == asked["tokens"]


async def test_the_openapi_document_publishes_tokenize_s_tools_as_accepted() -> None:
    async with running() as srv:
        schema = (await srv.http.get("/openapi.json")).json()["components"]["schemas"]["TokenizeChat"]
    props = schema["properties"]
    assert "enum" not in props["tools"] and "ToolDefinition" in str(props["tools"])
    assert "low" in str(props["reasoning_effort"]) and "array" in str(props["documents"])
    assert props["mm_processor_kwargs"]["enum"] == [None]
