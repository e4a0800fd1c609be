"""Chat's ``reasoning_effort`` (OpenAI's, the ``openai`` client's own argument), as vLLM: the chat template gets
it as the variable ``reasoning_effort``, and ``enable_thinking`` (``false`` for ``"none"``, else ``true``) unless
``chat_template_kwargs`` sets that; it wins over ``chat_template_kwargs``' own ``reasoning_effort``; a value that
is not one of vLLM's (and the client's) seven is a 400 naming it."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionUserMessageParam

from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running
from tests.api.test_chat_auto_tool_choice import scripted

pytestmark = pytest.mark.anyio

USER: ChatCompletionUserMessageParam = {"role": "user", "content": "hi"}
SHOWS = ("[{{ reasoning_effort | default('-') }} {{ enable_thinking | default('-') }}]"
         "{% for m in messages %}{{ m['content'] }}{% endfor %}")


def showing() -> FakeEngineClient:
    fake = FakeEngineClient()
    fake.tokenizer.chat_template = SHOWS
    return fake


async def test_the_template_gets_the_effort_and_the_prompt_changes_with_it() -> None:
    async with running(showing()) as srv:
        client = srv.openai()
        answers = [await client.chat.completions.create(model="fake-model", messages=[USER], max_tokens=1,
                                                        **({} if effort is None else {"reasoning_effort": effort}))
                   for effort in (None, "low", "xhigh", "none")]
    rendered = [srv.fake.tokenizer.decode(ids) for _, ids, _, _ in srv.fake.submitted]
    assert rendered == ["[- -]hi", "[low True]hi", "[xhigh True]hi", "[none False]hi"]
    assert [a.usage.prompt_tokens for a in answers if a.usage] == [len(r) for r in rendered]


async def test_it_wins_over_chat_template_kwargs_which_still_set_enable_thinking() -> None:
    async with running(showing()) as srv:
        client = srv.openai()
        for effort, kwargs in ((None, {"reasoning_effort": "high"}), ("low", {"reasoning_effort": "high"}),
                               ("medium", {"enable_thinking": False}), ("none", {"enable_thinking": True})):
            await client.chat.completions.create(model="fake-model", messages=[USER], max_tokens=1,
                                                 extra_body={"chat_template_kwargs": kwargs},
                                                 **({} if effort is None else {"reasoning_effort": effort}))
    rendered = [srv.fake.tokenizer.decode(ids) for _, ids, _, _ in srv.fake.submitted]
    assert rendered == ["[high -]hi", "[low True]hi", "[medium False]hi", "[none True]hi"]


@pytest.mark.parametrize("value", ["extreme", "LOW", 3, ""])
async def test_a_value_vllm_does_not_know_is_a_400_naming_it(value: Any) -> None:
    async with running(showing()) as srv:
        with pytest.raises(openai.BadRequestError) as caught:
            await srv.openai().chat.completions.create(model="fake-model", messages=[USER], max_tokens=1,
                                                       extra_body={"reasoning_effort": value})
    body: dict[str, Any] = caught.value.body  # type: ignore[assignment]
    assert body["param"] == "reasoning_effort", body
    assert srv.fake.submitted == []


async def test_none_turns_qwen3s_thinking_off_as_enable_thinking_false_does() -> None:
    async with running(scripted("</think>4"), reasoning_parser="qwen3") as srv:
        off = await srv.openai().chat.completions.create(model="fake-model", messages=[USER],
                                                         reasoning_effort="none")
        on = await srv.openai().chat.completions.create(model="fake-model", messages=[USER],
                                                        reasoning_effort="high")
    assert off.choices[0].message.content == "</think>4"
    assert on.choices[0].message.content == "4"


async def test_an_effort_the_servers_template_raises_on_is_a_400_naming_it() -> None:
    fake = showing()
    fake.tokenizer.chat_template = ("{% if reasoning_effort == 'max' %}{{ raise_exception('no max here') }}"
                                    "{% endif %}" + SHOWS)
    async with running(fake) as srv:
        with pytest.raises(openai.BadRequestError) as caught:
            await srv.openai().chat.completions.create(model="fake-model", messages=[USER], max_tokens=1,
                                                       reasoning_effort="max")
    body: dict[str, Any] = caught.value.body  # type: ignore[assignment]
    assert body["param"] == "reasoning_effort" and "no max here" in body["message"], body
