"""``--chat-template-content-format auto``: the ways a template reaches a message's content besides
``message.content`` and a loop over messages, and the check of the reading against the template itself.

Each shape below was read as "string" (so a template that only loops over parts rendered the user's words as
nothing) until the reading followed it: filter chains over the messages (``messages|map(attribute='content')``,
``...|selectattr('role', 'equalto', 'user')|map(attribute='content')|first``), an element of a content taken by a
negative index or a filter (``content[-1].text``, ``(content|first).type``), ``message.get('content')``, ``{% with
%}``, and a list of messages made with ``+``. vLLM's detector reads all of them as "string".
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from asyncdp.api.content_format import (
    PROBE_TEXT,
    detect_content_format,
    probe_content_format,
    resolve_content_format,
)
from asyncdp.testing.tokenizer import byte_tokenizer

PARTS = "{% if part.type == 'text' %}{{ part.text }}{% endif %}"
OPENAI_SHAPES = {
    "contents mapped from the messages": (
        "{% set contents = messages | map(attribute='content') | list %}{% for message in messages %}"
        "<|{{ message.role }}|>{% for part in contents[loop.index0] %}" + PARTS + "{% endfor %}{% endfor %}"),
    "a loop over the mapped contents": (
        "{% for content in messages | map(attribute='content') %}{% for part in content %}" + PARTS
        + "{% endfor %}{% endfor %}"),
    "the first user's content through a filter chain": (
        "{% set first = messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | first %}"
        "{% for part in first %}" + PARTS + "{% endfor %}"),
    "the mapped contents filtered by part type": (
        "{{ messages | map(attribute='content') | first | selectattr('type', 'equalto', 'text') | list | length }}"),
    "the last part by a negative index": "{% for m in messages %}{{ m.content[-1].text }}{% endfor %}",
    "the first part by a filter": "{% for m in messages %}{% if (m.content | first).type == 'text' %}x{% endif %}{% endfor %}",
    "a part by a computed index": (
        "{% for m in messages %}{% for i in range(m.content | length) %}{{ m.content[i]['text'] }}{% endfor %}"
        "{% endfor %}"),
    "message.get('content')": (
        "{% for m in messages %}{% for part in m.get('content', []) %}" + PARTS + "{% endfor %}{% endfor %}"),
    "a with block": "{% for m in messages %}{% with parts = m.content %}{% for part in parts %}" + PARTS
                    + "{% endfor %}{% endwith %}{% endfor %}",
    "messages joined with +": (
        "{% for m in [{'role': 'system', 'content': []}] + messages %}{% for part in m.content %}" + PARTS
        + "{% endfor %}{% endfor %}"),
    "a macro given a mapped content": (
        "{% macro show(parts) %}{% for part in parts %}" + PARTS + "{% endfor %}{% endmacro %}"
        "{{ show(messages | map(attribute='content') | last) }}"),
}
STRING_SHAPES = {
    # a mapped field that is not the content is no message list: its elements are not messages
    "roles mapped": "{% for r in messages | map(attribute='role') %}{% for c in r.content %}{% endfor %}{% endfor %}",
    "texts joined": "{{ messages | map(attribute='content') | join('\\n') }}",
    "content lines": "{% for m in messages %}{% with text = m.content %}{{ text.split('\\n') | first }}{% endwith %}"
                     "{% endfor %}",
    "one character of the content": "{% for m in messages %}{{ m.content[-1] }}{% endfor %}",
}


@pytest.mark.parametrize("name", OPENAI_SHAPES)
def test_shapes_that_read_parts(name: str) -> None:
    assert detect_content_format(OPENAI_SHAPES[name]) == "openai"


@pytest.mark.parametrize("name", STRING_SHAPES)
def test_shapes_that_read_text(name: str) -> None:
    assert detect_content_format(STRING_SHAPES[name]) == "string"


def _tokenizer(template: str) -> Any:
    tok = byte_tokenizer()
    tok.chat_template = template
    return tok


# Gemma 3's system prompt handling in a text-only template: parts are read on that side path only, and the
# turns print the content as text (given parts, every request would fail: a list added to a string).
SYSTEM_PARTS_ONLY = (
    "{% if messages[0].role == 'system' %}{% if messages[0].content is string %}"
    "{% set system = messages[0].content %}{% else %}{% set system = messages[0].content[0].text %}{% endif %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = 'You are helpful.' %}{% endif %}"
    "<|system|>{{ system }}<|end|>{% for message in messages %}"
    "{{ '<|' + message.role + '|>' + message.content + '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")
# Parts reached through a namespace, which the reading does not follow.
PARTS_IN_A_NAMESPACE = (
    "{% set ns = namespace(parts=[]) %}{% for message in messages %}{% set ns.parts = message.content %}"
    "<|{{ message.role }}|>{% for part in ns.parts %}" + PARTS + "{% endfor %}<|end|>{% endfor %}")


def test_a_template_that_prints_the_users_content_gets_a_string_though_it_reads_parts_elsewhere(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="asyncdp.api.content_format")
    assert detect_content_format(SYSTEM_PARTS_ONLY) == "openai"  # what the source suggests
    assert probe_content_format(_tokenizer(SYSTEM_PARTS_ONLY)) == "string"
    assert resolve_content_format(_tokenizer(SYSTEM_PARTS_ONLY), "auto") == "string"
    assert "'string'" in caplog.records[-1].getMessage() and "shows only as a string" in caplog.records[-1].getMessage()


def test_a_template_that_shows_the_users_words_only_from_parts_gets_parts() -> None:
    assert detect_content_format(PARTS_IN_A_NAMESPACE) == "string"
    assert probe_content_format(_tokenizer(PARTS_IN_A_NAMESPACE)) == "openai"
    assert resolve_content_format(_tokenizer(PARTS_IN_A_NAMESPACE), "auto") == "openai"


@pytest.mark.parametrize("template", [
    "{% for m in messages %}{{ m.content }}{% endfor %}",  # both show: the reading decides
    "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
    "{{ p.text }}{% endfor %}{% endif %}{% endfor %}",
    "{{ raise_exception('no') }}",  # neither shows
    "{% for m in messages %}{{ m.role }}{% endfor %}",
])
def test_the_probe_answers_only_when_one_format_alone_shows_the_text(template: str) -> None:
    assert probe_content_format(_tokenizer(template)) is None


def test_the_probe_text_is_a_users_message() -> None:
    tok = _tokenizer("{% for m in messages %}{{ m.role }}={{ m.content }}{% endfor %}")
    assert probe_content_format(tok) is None
    assert tok.apply_chat_template([{"role": "user", "content": PROBE_TEXT}], tokenize=False) == f"user={PROBE_TEXT}"
