"""Request shapes that client libraries (the ``openai`` SDK, LangChain, LiteLLM, llama-index, agent frameworks)
send: each is served as vLLM serves it, or refused with a 400 naming the field, never accepted and ignored when
it would change the answer.

Before: several text parts were joined with nothing between them (vLLM joins them with a newline, so the same
request rendered another prompt); a ``refusal`` part, which the SDK lets an assistant message carry, was a 400;
an ``image_url`` part got a message that did not say images are what is refused; a tool call's ``arguments``
reached the template as a JSON string where tool-call templates expect an object; ``parallel_tool_calls``,
``metadata`` and ``prediction``, which change nothing here, were 400s; ``tool_choice: "auto"`` without tools was
a 400; and ``max_completion_tokens`` on completions was ignored (16 tokens came back).
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running

pytestmark = pytest.mark.anyio


def prompt_of(fake: FakeEngineClient) -> str:
    return fake.tokenizer.decode(fake.submitted[-1][1])


async def test_several_text_parts_are_joined_with_newlines_as_vllm_does() -> None:
    async with running() as srv:
        await srv.openai().chat.completions.create(model="fake-model", max_tokens=1, messages=[
            {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]}])
        assert prompt_of(srv.fake) == "<|im_start|>user\nHello\nworld<|im_end|>\n<|im_start|>assistant\n"


async def test_a_tool_messages_text_parts_are_joined_too() -> None:
    async with running() as srv:
        await srv.openai().chat.completions.create(model="fake-model", max_tokens=1, messages=[
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "calling"},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a"},
                                                               {"type": "text", "text": "b"}]}])
        assert "<|im_start|>tool\na\nb<|im_end|>" in prompt_of(srv.fake)


async def test_an_assistant_refusal_part_is_its_text() -> None:
    async with running() as srv:
        await srv.openai().chat.completions.create(model="fake-model", max_tokens=1, messages=[
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
            {"role": "user", "content": "why?"}])
        assert "<|im_start|>assistant\nI can't.<|im_end|>" in prompt_of(srv.fake)


async def test_an_image_part_is_a_400_naming_the_part_and_its_type() -> None:
    async with running() as srv:
        with pytest.raises(openai.BadRequestError) as info:
            await srv.openai().chat.completions.create(model="fake-model", messages=[{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])
        assert srv.fake.submitted == []
    error = info.value.body
    assert isinstance(error, dict) and error["param"] == "messages[0].content[1]"
    assert "'image_url'" in error["message"] and "text-only" in error["message"]


@pytest.mark.parametrize(("part", "param"), [
    ({"type": "text"}, "messages[0].content[0].text"),
    ({"type": "text", "text": 5}, "messages[0].content[0].text"),
    ({"text": "no type"}, "messages[0].content[0]"),
    ("a bare string", "messages[0].content[0]"),
])
async def test_a_malformed_part_is_a_400_naming_it(part: Any, param: str) -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [part]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


# Renders each tool call's name and arguments as tool-call templates do (an object, not a JSON string).
TOOL_TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
    "{% if m.tool_calls is defined %}{% for c in m.tool_calls %}"
    "<call {{ c.function.name }} {{ c.function.arguments | tojson }}>"
    "{% endfor %}{% endif %}{% endfor %}"
)


async def test_tool_call_arguments_reach_the_template_as_an_object() -> None:
    fake = FakeEngineClient()
    fake.tokenizer.chat_template = TOOL_TEMPLATE
    messages: Any = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "v", "arguments": "not json"}}]},
        {"role": "assistant", "content": "done", "tool_calls": []},
    ]
    async with running(fake) as srv:
        await srv.openai().chat.completions.create(model="fake-model", max_tokens=1, messages=messages)
        prompt = prompt_of(srv.fake)
    # decoded JSON; a string that is not JSON stays what the model wrote; an empty list is no tool call at all
    assert prompt == '[user]weather?[assistant]<call w {"city": "Paris"}><call v "not json">[assistant]done', prompt


@pytest.mark.parametrize("value", [True, False])
async def test_parallel_tool_calls_without_tools_is_accepted(value: bool) -> None:
    async with running() as srv:
        res = await srv.openai().chat.completions.create(model="fake-model", max_tokens=2, parallel_tool_calls=value,
                                                         messages=[{"role": "user", "content": "hi"}])
    assert res.choices[0].message.content


async def test_metadata_and_prediction_change_nothing_and_are_accepted() -> None:
    messages: Any = [{"role": "user", "content": "hi"}]
    async with running() as srv:
        client = srv.openai()
        plain = await client.chat.completions.create(model="fake-model", max_tokens=4, seed=1, messages=messages)
        tagged = await client.chat.completions.create(
            model="fake-model", max_tokens=4, seed=1, messages=messages, metadata={"session": "s1"}, store=False,
            prediction={"type": "content", "content": "a guess"})
        completion = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2,
                                                                  "metadata": {"k": "v"}})
        with pytest.raises(openai.BadRequestError) as stored:
            await client.chat.completions.create(model="fake-model", messages=messages, store=True)
    assert tagged.choices[0].message.content == plain.choices[0].message.content
    assert completion.status_code == 200
    assert isinstance(stored.value.body, dict) and stored.value.body["param"] == "store"


async def test_tool_choice_auto_without_tools_is_accepted_and_tools_are_refused_saying_why() -> None:
    messages: Any = [{"role": "user", "content": "hi"}]
    tools: Any = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]
    async with running() as srv:
        client = srv.openai()
        ok = await client.chat.completions.create(model="fake-model", max_tokens=2, tool_choice="auto",
                                                  messages=messages)
        with pytest.raises(openai.BadRequestError) as with_tools:
            await client.chat.completions.create(model="fake-model", tools=tools, tool_choice="auto",
                                                 messages=messages)
        with pytest.raises(openai.BadRequestError) as required:
            await client.chat.completions.create(model="fake-model", tool_choice="required", messages=messages)
    assert ok.choices[0].message.content
    for info, param in ((with_tools, "tools"), (required, "tool_choice")):
        assert isinstance(info.value.body, dict) and info.value.body["param"] == param
        assert "tool-call parser" in info.value.body["message"]


async def test_completions_honour_max_completion_tokens() -> None:
    async with running() as srv:
        client = srv.openai()
        alone = await client.completions.create(model="fake-model", prompt="a",
                                                extra_body={"max_completion_tokens": 3})
        both = await client.completions.create(model="fake-model", prompt="a", max_tokens=9,
                                               extra_body={"max_completion_tokens": 2})
        prompt_only = await client.completions.create(model="fake-model", prompt="abc", echo=True,
                                                      extra_body={"max_completion_tokens": 0})
        with pytest.raises(openai.BadRequestError) as zero:
            await client.completions.create(model="fake-model", prompt="a", extra_body={"max_completion_tokens": 0})
        with pytest.raises(openai.BadRequestError) as too_long:
            await client.completions.create(model="fake-model", prompt="a",
                                            extra_body={"max_completion_tokens": 10_000})
    assert alone.usage is not None and alone.usage.completion_tokens == 3
    assert both.usage is not None and both.usage.completion_tokens == 2  # it wins, as in chat
    assert prompt_only.choices[0].text == "abc"
    for info in (zero, too_long):
        assert isinstance(info.value.body, dict) and info.value.body["param"] == "max_completion_tokens"
