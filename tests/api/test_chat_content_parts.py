"""A chat template that loops over OpenAI content parts gets parts (``--chat-template-content-format``, vLLM's).

The template here renders only what it finds in ``{"type": "text"}`` parts, with `` | `` between parts, as
Qwen2-VL's and Llama 3.2 Vision's do past their ``is string`` branch; given a string it would render nothing.
Rendered through ``POST /tokenize`` (the rendering of ``/v1/chat/completions``) and the chat route itself.
"""

from __future__ import annotations

from typing import Any

import pytest

from asyncdp.testing import FakeEngineClient
from asyncdp.testing.tokenizer import byte_tokenizer
from tests.api.conftest import running

pytestmark = pytest.mark.anyio

PARTS_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% if not loop.last %} | {% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Both kinds, and a tool branch that prints its content as text (vLLM gives a tool message a string).
EITHER_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.content is string %}[{{ message.content }}]"
    "{% else %}{% for part in message.content %}({{ part.text }}){% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
)


def _tokenizer(template: str) -> Any:
    tok = byte_tokenizer()
    tok.chat_template = template
    return tok


async def render(template: str, messages: list[dict[str, Any]], **app_kwargs: Any) -> str:
    tok = _tokenizer(template)
    async with running(FakeEngineClient(tokenizer=tok), **app_kwargs) as srv:
        r = await srv.http.post("/tokenize", json={"messages": messages})
        assert r.status_code == 200, r.text
    return str(tok.decode(r.json()["tokens"]))


async def test_a_string_content_renders_as_one_text_part() -> None:
    prompt = await render(PARTS_TEMPLATE, [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Hello world"}])
    assert prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello world<|im_end|>\n"
                      "<|im_start|>assistant\n")


async def test_each_text_part_reaches_the_template_as_a_part() -> None:
    prompt = await render(PARTS_TEMPLATE, [{"role": "user", "content": [
        {"type": "text", "text": "Hello"}, {"type": "input_text", "text": "world"},
        {"type": "refusal", "refusal": "no"}]}])
    assert prompt == "<|im_start|>user\nHello | world | no<|im_end|>\n<|im_start|>assistant\n"


async def test_a_null_content_is_no_parts() -> None:
    prompt = await render(PARTS_TEMPLATE, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n"


async def test_the_string_format_given_by_flag_renders_a_parts_template_empty() -> None:
    """What asyncdp did before: the template loops over the characters of a string and finds no text part."""
    prompt = await render(PARTS_TEMPLATE, [{"role": "user", "content": "Hi"}], chat_template_content_format="string")
    assert prompt == "<|im_start|>user\n | <|im_end|>\n<|im_start|>assistant\n"


def _texts(*texts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text} for text in texts]


async def test_a_template_taking_both_gets_parts_and_a_tool_message_gets_text() -> None:
    prompt = await render(EITHER_TEMPLATE, [{"role": "user", "content": _texts("a", "b")},
                                            {"role": "tool", "tool_call_id": "c1", "content": _texts("x", "y")}])
    assert prompt == "<|im_start|>user\n(a)(b)<|im_end|>\n<|im_start|>tool\n[x\ny]<|im_end|>\n"


async def test_a_string_template_still_gets_the_parts_joined() -> None:
    string_template = ("{% for message in messages %}<|im_start|>{{ message.role }}\n[{{ message.content }}]"
                       "<|im_end|>\n{% endfor %}")
    prompt = await render(string_template, [{"role": "user", "content": _texts("a", "b")}])
    assert prompt == "<|im_start|>user\n[a\nb]<|im_end|>\n"


async def test_chat_completions_renders_the_parts_and_echoes_the_text() -> None:
    """The prompt the engine gets is the parts template's rendering; ``echo`` gives the last message as text."""
    tok = _tokenizer(PARTS_TEMPLATE)
    fake = FakeEngineClient(tokenizer=tok)
    async with running(fake) as srv:
        messages = [{"role": "user", "content": "Count:"},
                    {"role": "assistant", "content": [{"type": "text", "text": "1,"}, {"type": "text", "text": "2,"}]}]
        r = await srv.http.post("/v1/chat/completions", json={
            "messages": messages, "max_tokens": 2, "echo": True, "continue_final_message": True,
            "add_generation_prompt": False})
        assert r.status_code == 200, r.text
        tokens = await srv.http.post("/tokenize", json={
            "messages": messages, "continue_final_message": True, "add_generation_prompt": False})
    body = r.json()
    assert body["usage"]["prompt_tokens"] == tokens.json()["count"]
    assert tok.decode(tokens.json()["tokens"]) == "<|im_start|>user\nCount:<|im_end|>\n<|im_start|>assistant\n1, | 2,"
    assert body["choices"][0]["message"]["content"].startswith("1,\n2,")
