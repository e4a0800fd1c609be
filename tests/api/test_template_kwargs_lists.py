"""``documents`` and ``tools`` given inside ``chat_template_kwargs``, and ``media_io_kwargs``, on chat and on
``/tokenize``, as vLLM takes them: both lists reach the template (the request's top-level ``documents`` wins over
``chat_template_kwargs``' and ``chat_template_kwargs``' ``tools`` over the request's, as vLLM merges them), a shape
the template cannot take is a 400 naming the place, and the names that would break rendering stay refused;
``media_io_kwargs`` (options for media loaders) is checked for its type and has no effect on a text-only model.
Every prompt ``/tokenize`` counts is the one the chat request renders."""

from __future__ import annotations

from typing import Any

import pytest

from asyncdp.testing import FakeEngineClient
from tests.api.conftest import Server, running

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "hi"}]
SHOWS = ("{% for d in documents or [] %}[{{ d.title }}]{% endfor %}"
         "{% for t in tools or [] %}({{ t.function.name }}){% endfor %}"
         "{% for m in messages %}{{ m['content'] }}{% endfor %}")
DOCS = [{"title": "Moon", "text": "The Moon orbits the Earth."}, {"title": "Sun", "text": "The Sun is a star."}]
OTHER_DOCS = [{"title": "Mars", "text": "Mars is red."}]


def tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def showing() -> FakeEngineClient:
    fake = FakeEngineClient()
    fake.tokenizer.chat_template = SHOWS
    return fake


async def chat_and_count(srv: Server, extra: dict[str, Any]) -> tuple[str, int]:
    """The prompt the chat request renders, after checking ``/tokenize`` counts that same prompt."""
    chat = await srv.http.post("/v1/chat/completions", json={
        "model": "fake-model", "messages": USER, "max_tokens": 1, "tool_choice": "none", **extra})
    counted = await srv.http.post("/tokenize", json={"messages": USER, **extra})
    assert chat.status_code == counted.status_code == 200, (chat.text, counted.text)
    assert counted.json()["tokens"] == srv.fake.submitted[-1][1]
    assert counted.json()["count"] == chat.json()["usage"]["prompt_tokens"]
    return str(srv.fake.tokenizer.decode(srv.fake.submitted[-1][1])), counted.json()["count"]


async def test_documents_and_tools_in_chat_template_kwargs_reach_the_template() -> None:
    async with running(showing()) as srv:
        docs, _ = await chat_and_count(srv, {"chat_template_kwargs": {"documents": DOCS}})
        tools, _ = await chat_and_count(srv, {"chat_template_kwargs": {"tools": [tool("get_time")]}})
        nulls, _ = await chat_and_count(srv, {"chat_template_kwargs": {"documents": None, "tools": None}})
    assert (docs, tools, nulls) == ("[Moon][Sun]hi", "(get_time)hi", "hi")


async def test_the_requests_documents_win_and_chat_template_kwargs_tools_win_as_vllm_merges_them() -> None:
    # vLLM: build_chat_params puts the request's documents over chat_template_kwargs' (unless null), and
    # chat_template_kwargs over the tools the server passes for the request's tools.
    async with running(showing()) as srv:
        both, _ = await chat_and_count(srv, {
            "documents": DOCS, "tools": [tool("outer")],
            "chat_template_kwargs": {"documents": OTHER_DOCS, "tools": [tool("inner")]}})
        null_inner, _ = await chat_and_count(srv, {
            "documents": DOCS, "tools": [tool("outer")], "chat_template_kwargs": {"documents": None, "tools": None}})
    assert both == "[Moon][Sun](inner)hi"
    assert null_inner == "[Moon][Sun](outer)hi"


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"documents": "the moon"}, "chat_template_kwargs.documents"),
    ({"documents": [1]}, "chat_template_kwargs.documents[0]"),
    ({"documents": [{"title": "t", "text": 5}]}, "chat_template_kwargs.documents[0]"),
    ({"documents": {"title": "t"}}, "chat_template_kwargs.documents"),
    ({"tools": "get_time"}, "chat_template_kwargs.tools"),
    ({"tools": [1]}, "chat_template_kwargs.tools[0]"),
    ({"tools": tool("get_time")}, "chat_template_kwargs.tools"),
])
async def test_a_list_in_chat_template_kwargs_the_template_cannot_take_is_a_400_naming_its_place(
        kwargs: dict[str, Any], param: str) -> None:
    async with running(showing()) as srv:
        chat = await srv.http.post("/v1/chat/completions", json={
            "model": "fake-model", "messages": USER, "max_tokens": 1, "chat_template_kwargs": kwargs})
        counted = await srv.http.post("/tokenize", json={"messages": USER, "chat_template_kwargs": kwargs})
    for refused in (chat, counted):
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["type"] == "BadRequestError", refused.text
        assert error["param"] == param and param in error["message"]
    assert srv.fake.submitted == []


@pytest.mark.parametrize("name", ["tokenize", "return_dict", "chat_template", "messages", "conversation",
                                  "add_generation_prompt", "continue_final_message", "return_assistant_tokens_mask"])
async def test_only_the_names_that_would_break_rendering_are_refused(name: str) -> None:
    kwargs = {"documents": DOCS, "tools": [tool("get_time")]}
    async with running(showing()) as srv:
        lists = await srv.http.post("/tokenize", json={"messages": USER, "chat_template_kwargs": kwargs})
        refused = await srv.http.post("/tokenize", json={
            "messages": USER, "chat_template_kwargs": {**kwargs, name: True}})
    assert lists.status_code == 200, lists.text
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "chat_template_kwargs"
    assert name in refused.json()["error"]["message"]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/tokenize"])
async def test_media_io_kwargs_has_no_effect_on_a_text_only_model_and_a_bad_type_is_a_400(route: str) -> None:
    body: dict[str, Any] = {"model": "fake-model", "messages": USER, "max_tokens": 1}
    async with running(showing()) as srv:
        plain = await srv.http.post(route, json=body)
        given = [await srv.http.post(route, json={**body, "media_io_kwargs": value})
                 for value in ({"video": {"num_frames": 40}}, {}, None)]
        bad = [await srv.http.post(route, json={**body, "media_io_kwargs": value})
               for value in ("fps=2", [{"video": {}}], {"video": 40})]
    assert plain.status_code == 200 and [r.status_code for r in given] == [200] * 3
    if route == "/tokenize":
        assert all(r.json()["tokens"] == plain.json()["tokens"] for r in given)
    else:
        assert len({tuple(ids) for _, ids, _, _ in srv.fake.submitted}) == 1
    for refused in bad:
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["type"] == "BadRequestError", refused.text
        assert error["param"] == "media_io_kwargs"


async def test_the_openapi_document_publishes_media_io_kwargs_as_an_object_of_objects() -> None:
    async with running() as srv:
        schemas = (await srv.http.get("/openapi.json")).json()["components"]["schemas"]
    for name in ("ChatRequest", "TokenizeChat"):
        field = str(schemas[name]["properties"]["media_io_kwargs"])
        assert "object" in field and "enum" not in field
