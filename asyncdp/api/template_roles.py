"""What a chat template does with the system prompt, read once at startup (:func:`resolve_template_roles`).

Two facts, besides the content format (:mod:`asyncdp.api.content_format`):

- Whether the template has a ``developer`` role of its own: its source compares a role with the string
  ``"developer"`` (gpt-oss's, Granite 4's). OpenAI's ``developer`` message is the system prompt for models
  without one, and the official client sends it for newer models; a template that does not know the role drops
  the message, renders it as an unknown role the model never saw, or raises. Such a template gets it as
  ``system`` (:mod:`asyncdp.api.chat_messages` does the renaming, as vLLM's renderer does).
- The shape a system message's content must have to show. Templates that take the system prompt out of
  ``messages[0]`` before their loop (Llama 3.2 Vision's ``messages[0]['content']|trim``, Gemma 3's and Mistral
  Small 3.1's ``content[0]['text']`` when it is not a string) print a string whole, but a list of parts as its
  Python repr or only its first part. So for an "openai" template, the system content is a string whenever a
  string system message shows its text (one system message and one user message rendered), and parts
  otherwise; a "string" template gets strings anyway.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.nodes as nodes

from asyncdp.api.content_format import PROBE_TEXT, ChatTemplate, ContentFormat, read_template, shows_probe
from asyncdp.config.chat_template import PARSER

log = logging.getLogger(__name__)

DEVELOPER = "developer"


@dataclass(frozen=True)
class TemplateRoles:
    """``developer_role``: the template renders ``developer`` itself; ``system_format``: the content format of a
    system message ("string" or "openai")."""

    developer_role: bool = False
    system_format: ContentFormat = "string"


def has_developer_role(source: str | nodes.Template) -> bool:
    """Does the template (its source, or its parsed tree) name the ``developer`` role (a string constant, as in
    ``role == 'developer'`` or ``role in ['system', 'developer']``)? False for a source that does not parse."""
    try:
        tree = PARSER.parse(source) if isinstance(source, str) else source
    except jinja2.TemplateSyntaxError:
        return False
    return any(node.value == DEVELOPER for node in tree.find_all(nodes.Const))


def system_content_format(tokenizer: Any, content_format: ContentFormat) -> ContentFormat:
    """"string" when the template shows a string system message's text (followed by a user message in
    ``content_format``), else ``content_format``."""
    if content_format == "string":
        return "string"
    messages: list[dict[str, Any]] = [{"role": "system", "content": PROBE_TEXT},
                                      {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    return "string" if shows_probe(tokenizer, messages) else content_format  # (no system role: shows nothing)


def resolve_template_roles(tokenizer: Any, content_format: ContentFormat,
                           template: ChatTemplate | None = None) -> TemplateRoles:
    """The roles of the tokenizer's template (``template``: as :func:`read_template` gives it; None: read it)."""
    template = template if template is not None else read_template(tokenizer)
    roles = TemplateRoles(developer_role=template.tree is not None and has_developer_role(template.tree),
                          system_format=system_content_format(tokenizer, content_format) if template.source
                          else "string")
    log.info("chat template roles: %s; system message content as %s",
             "its own developer role" if roles.developer_role else "developer messages given as system",
             "a string" if roles.system_format == "string" else "text parts")
    return roles
