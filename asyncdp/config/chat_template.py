"""``--chat-template`` (vLLM's flag): the chat template every API server renders prompts with, instead of the
tokenizer's.

The flag names a template file, or is the template itself: a value that is no readable file but holds a Jinja
character (``{``, ``}`` or a newline) is taken as the template, as vLLM reads it. ``asyncdp serve`` reads it
before anything starts and checks that it parses, so a missing file or a syntax error is one line naming the
flag (exit 2), not a 400 on every request; the API servers get its text. :data:`PARSER` parses templates as
Transformers compiles them (with ``loopcontrols`` and its ``{% generation %}`` tag), for this check and for
:mod:`asyncdp.api.content_format`.
"""

from __future__ import annotations

import jinja2
import jinja2.ext
import jinja2.nodes as nodes
import jinja2.parser

from asyncdp.errors import ConfigError

# A value holding one of these is a template, not a path (vLLM's rule).
_JINJA_CHARS = "{}\n"


class GenerationTag(jinja2.ext.Extension):
    """Transformers' ``{% generation %}...{% endgeneration %}`` (assistant-token masks): parsed as its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


PARSER = jinja2.Environment(extensions=[jinja2.ext.loopcontrols, GenerationTag])  # parsing only, never rendering


def read_chat_template(value: str) -> str:
    """The template ``--chat-template value`` gives: the file's text, or ``value`` itself when it is no file and
    holds a Jinja character. A ConfigError naming the flag when it is neither, or does not parse."""
    try:
        with open(value, encoding="utf-8") as f:
            text, where = f.read(), f"--chat-template {value!r}"
    except (OSError, ValueError) as exc:  # (ValueError: not UTF-8, or a NUL in the value)
        if not any(c in value for c in _JINJA_CHARS):
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"--chat-template {value!r} is neither a readable template file ({why}) nor a "
                              f"template (it holds no {{, }} or newline).") from None
        text, where = value, "--chat-template (the template given inline)"
    if not text.strip():
        raise ConfigError(f"{where} is empty; give a Jinja chat template.")
    try:
        PARSER.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"{where} is not a valid Jinja template (line {exc.lineno}: {exc.message}).") from None
    return text
