"""A request's own ``chat_template`` (vLLM's, with ``--trust-request-chat-template``) and ``documents``, through
the official client: the template renders the prompt, only on a server that trusts request templates; one that
does not parse, fails, reaches for Python's internals or is too large is a 400 naming ``chat_template``; the
documents reach the template (the server's, or the request's) as ``documents``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionUserMessageParam

from asyncdp.api.request_templates import UNTRUSTED
from asyncdp.api.schemas import MAX_CHAT_TEMPLATE_CHARS
from asyncdp.testing import FakeEngineClient
from asyncdp.testing.tokenizer import byte_tokenizer
from tests.api.conftest import Server, running

pytestmark = pytest.mark.anyio

USER: ChatCompletionUserMessageParam = {"role": "user", "content": "hi"}
BRACKETS = "{% for m in messages %}<<{{ m.role }}:{{ m.content }}>>{% endfor %}"
DOCS = [{"title": "Moon", "text": "The Moon orbits the Earth."}, {"title": "Sun", "text": "The Sun is a star."}]


def prompt_of(srv: Server, index: int = 0) -> str:
    return str(byte_tokenizer().decode(srv.fake.submitted[index][1]))


async def chat_error(srv: Server, **extra: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as caught:
        await srv.openai().chat.completions.create(model="fake-model", messages=[USER], max_tokens=1,
                                                   extra_body=extra)
    body: dict[str, Any] = caught.value.body  # type: ignore[assignment]
    return body


async def test_the_requests_template_renders_its_prompt() -> None:
    async with running(trust_request_chat_template=True) as srv:
        own = await srv.openai().chat.completions.create(model="fake-model", messages=[USER], max_tokens=1,
                                                         extra_body={"chat_template": BRACKETS})
        server = await srv.openai().chat.completions.create(model="fake-model", messages=[USER], max_tokens=1)
    assert prompt_of(srv, 0) == "<<user:hi>>"
    assert own.usage is not None and own.usage.prompt_tokens == len("<<user:hi>>")
    assert prompt_of(srv, 1) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"  # the server's, still
    assert server.usage is not None and server.usage.prompt_tokens > own.usage.prompt_tokens


async def test_a_template_that_loops_over_parts_gets_parts() -> None:
    parts = "{% for m in messages %}{% for p in m.content %}[{{ p.type }}={{ p.text }}]{% endfor %}{% endfor %}"
    async with running(trust_request_chat_template=True) as srv:  # (the server's ChatML template reads strings)
        await srv.openai().chat.completions.create(model="fake-model", messages=[USER], max_tokens=1,
                                                   extra_body={"chat_template": parts})
    assert prompt_of(srv) == "[text=hi]"


async def test_a_request_template_is_refused_without_the_flag() -> None:
    async with running() as srv:
        body = await chat_error(srv, chat_template=BRACKETS)
        tokenize = await srv.http.post("/tokenize", json={"messages": [USER], "chat_template": BRACKETS})
    assert body["param"] == "chat_template" and body["message"] == UNTRUSTED
    assert tokenize.status_code == 400 and tokenize.json()["error"]["param"] == "chat_template"
    assert srv.fake.submitted == []


@pytest.mark.parametrize(("template", "words"), [
    ("{% for m in messages %}{{ m.content }", "line 1"),  # does not parse
    ("{% if %}", "line 1"),
    ("{{ raise_exception('no system messages here') }}", "no system messages here"),  # the template refuses
    ("{{ messages[0].content + 1 }}", "TypeError"),
])
async def test_a_template_that_fails_is_a_400_naming_it(template: str, words: str) -> None:
    async with running(trust_request_chat_template=True) as srv:
        body = await chat_error(srv, chat_template=template)
    assert body["param"] == "chat_template" and words in body["message"], body
    assert srv.fake.submitted == []


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ raise_exception.__globals__['__builtins__'] }}",
    "{{ messages[0].__class__.__base__ }}",
    "{% set x = messages.append(messages[0]) %}",  # the sandbox is immutable too
])
async def test_a_template_cannot_reach_python_internals(template: str) -> None:
    async with running(trust_request_chat_template=True) as srv:
        body = await chat_error(srv, chat_template=template)
    assert body["param"] == "chat_template" and "SecurityError" in body["message"], body
    assert srv.fake.submitted == []


@pytest.mark.parametrize("reach", ["''.__class__", "raise_exception.__globals__", "messages[0].__class__",
                                   "cycler.__init__", "namespace.__init__"])
async def test_an_internal_attribute_alone_is_undefined(reach: str) -> None:
    async with running(trust_request_chat_template=True) as srv:  # (Jinja's sandbox: printed, it shows nothing)
        await srv.openai().chat.completions.create(model="fake-model", messages=[USER], max_tokens=1,
                                                   extra_body={"chat_template": f"[{{{{ {reach} }}}}]{BRACKETS}"})
    assert prompt_of(srv) == "[]<<user:hi>>"


async def test_the_servers_template_is_sandboxed_as_well() -> None:
    tok = byte_tokenizer()
    tok.chat_template = "{{ ''.__class__.__mro__ }}"
    async with running(FakeEngineClient(tokenizer=tok)) as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": [USER], "max_tokens": 1})
    assert r.status_code == 400 and "unsafe" in r.json()["error"]["message"], r.text


async def test_a_template_too_large_is_a_400() -> None:
    big = "{# " + "x" * MAX_CHAT_TEMPLATE_CHARS + " #}" + BRACKETS
    async with running(trust_request_chat_template=True) as srv:
        body = await chat_error(srv, chat_template=big)
    assert body["param"] == "chat_template" and str(MAX_CHAT_TEMPLATE_CHARS) in body["message"], body


async def test_tokenize_renders_the_requests_template() -> None:
    async with running(trust_request_chat_template=True) as srv:
        r = await srv.http.post("/tokenize", json={"messages": [USER], "chat_template": BRACKETS})
        await srv.openai().chat.completions.create(model="fake-model", messages=[USER], max_tokens=1,
                                                   extra_body={"chat_template": BRACKETS})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == srv.fake.submitted[0][1]


async def test_documents_reach_the_servers_template() -> None:
    tok = byte_tokenizer()
    tok.chat_template = (Path(__file__).parent / "chat_templates" / "granite3.jinja").read_text(encoding="utf-8")
    async with running(FakeEngineClient(tokenizer=tok, max_model_len=4096)) as srv:
        await srv.openai().chat.completions.create(model="fake-model", messages=[USER], max_tokens=1,
                                                   extra_body={"documents": DOCS})
        await srv.openai().chat.completions.create(model="fake-model", messages=[USER], max_tokens=1)
    with_docs, without = prompt_of(srv, 0), prompt_of(srv, 1)
    assert ("<|start_of_role|>documents<|end_of_role|>Document 0\nThe Moon orbits the Earth.\n\nDocument 1\n"
            "The Sun is a star.<|end_of_text|>") in with_docs
    assert "documents" not in without


async def test_documents_reach_the_requests_template() -> None:
    template = "{% for d in documents %}[{{ d.title }}|{{ d.text }}]{% endfor %}" + BRACKETS
    async with running(trust_request_chat_template=True) as srv:
        await srv.openai().chat.completions.create(model="fake-model", messages=[USER], max_tokens=1,
                                                   extra_body={"chat_template": template, "documents": DOCS})
    assert prompt_of(srv) == "[Moon|The Moon orbits the Earth.][Sun|The Sun is a star.]<<user:hi>>"


@pytest.mark.parametrize(("documents", "param"), [
    ("the moon", "documents"), ([1], "documents[0]"), ([{"title": "t", "text": 5}], "documents[0]"),
    ([{"title": None}], "documents[0]"), ({"title": "t"}, "documents"),
])
async def test_documents_must_be_objects_of_strings(documents: Any, param: str) -> None:
    async with running() as srv:
        body = await chat_error(srv, documents=documents)
    assert body["param"] == param, body
    assert srv.fake.submitted == []
