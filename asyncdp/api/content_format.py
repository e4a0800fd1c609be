"""The shape a chat template wants ``message.content`` in (vLLM's ``--chat-template-content-format``).

Two kinds of template exist. A "string" template prints ``message.content``; an "openai" template loops over
OpenAI-style parts (``{% for part in message.content %}{% if part.type == 'text' %}{{ part.text }}...``), as the
templates of vision-language models and many recent ones do, and renders nothing when it gets a string (each
character is a "part" without a ``type``). ``auto`` tells them apart by reading the template's source, never by
rendering it:

Parse the source into Jinja's syntax tree and follow three kinds of names through it, without scopes or order
(templates are small and seldom rebind a name): *message lists* (``messages``, and what is set from one:
``{% set loop_messages = messages[1:] %}``, a filtered one), *messages* (a loop variable over a message list, an
element of one such as ``messages[0]`` or ``messages|first``, what is set from one, and a macro parameter that
receives one) and *contents* (``m.content`` or ``m['content']`` of a message ``m``, what is set from one, and a
macro parameter that receives one). The template is "openai" when it treats a content as a list of parts: it
loops over one, reads a part's ``text`` or ``type`` by index (``messages[0]['content'][0]['text']``) or filters
one by attribute (``selectattr``, ``map``). Otherwise it is "string". A template that takes both
(``{% if message.content is string %}...{% else %}{% for part in message.content %}``) is "openai", as in vLLM:
it renders the parts as its authors wrote it to (vLLM's prompt, token for token).

A template that does not parse, or a tokenizer without one, is "string" (the request then fails as before).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import jinja2
import jinja2.ext
import jinja2.nodes as nodes
import jinja2.parser

from asyncdp.config.flags import CHAT_TEMPLATE_CONTENT_FORMATS

log = logging.getLogger(__name__)

ContentFormat = Literal["string", "openai"]

# Filters that pick one element of a list: messages|first is a message, messages|reverse still a list.
_ELEMENT_FILTERS = frozenset({"first", "last", "random"})
# Filters that only make sense over a list of objects: applied to a content, they read it as parts.
_PART_FILTERS = frozenset({"selectattr", "rejectattr", "map", "groupby"})
# The keys of an OpenAI content part a template reads.
_PART_KEYS = frozenset({"type", "text"})


class _GenerationTag(jinja2.ext.Extension):
    """Transformers' ``{% generation %}...{% endgeneration %}`` (assistant-token masks): parsed as its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


_ENV = jinja2.Environment(extensions=[jinja2.ext.loopcontrols, _GenerationTag])  # parsing only, never rendering


def _key(node: nodes.Node) -> Any:
    """The constant key of ``x.key`` or ``x['key']`` / ``x[0]``; None for anything else."""
    if isinstance(node, nodes.Getattr):
        return node.attr
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        return node.arg.value
    return None


def _add(names: set[str], name: str) -> bool:
    if name in names:
        return False
    names.add(name)
    return True


class _Names:
    """The names known to hold message lists, messages and contents; ``learn`` grows them to a fixed point."""

    def __init__(self) -> None:
        self.lists = {"messages"}
        self.messages: set[str] = set()
        self.contents: set[str] = set()

    def is_list(self, e: nodes.Node) -> bool:
        if isinstance(e, nodes.Name):
            return e.name in self.lists
        if isinstance(e, nodes.Getitem) and isinstance(e.arg, nodes.Slice):
            return self.is_list(e.node)
        if isinstance(e, nodes.Filter) and e.name not in _ELEMENT_FILTERS:
            return e.node is not None and self.is_list(e.node)
        return isinstance(e, nodes.CondExpr) and any(self.is_list(b) for b in (e.expr1, e.expr2) if b is not None)

    def is_message(self, e: nodes.Node) -> bool:
        if isinstance(e, nodes.Name):
            return e.name in self.messages
        if isinstance(e, nodes.Getitem) and not isinstance(e.arg, nodes.Slice):
            return not isinstance(_key(e), str) and self.is_list(e.node)  # messages[0], messages[i]
        if isinstance(e, nodes.Filter) and e.name in _ELEMENT_FILTERS:
            return e.node is not None and self.is_list(e.node)
        return isinstance(e, nodes.CondExpr) and any(self.is_message(b) for b in (e.expr1, e.expr2) if b is not None)

    def is_content(self, e: nodes.Node) -> bool:
        if isinstance(e, nodes.Name):
            return e.name in self.contents
        if isinstance(e, nodes.Filter):  # message.content|list, |default([]) ...
            return e.node is not None and self.is_content(e.node)
        if isinstance(e, nodes.CondExpr):
            return any(self.is_content(b) for b in (e.expr1, e.expr2) if b is not None)
        return isinstance(e, (nodes.Getattr, nodes.Getitem)) and _key(e) == "content" and self.is_message(e.node)

    def _bind(self, name: str, value: nodes.Node) -> bool:
        """Record what ``name`` holds when ``value`` is one of the three kinds; True when that is news."""
        for test, names in ((self.is_content, self.contents), (self.is_message, self.messages),
                            (self.is_list, self.lists)):
            if test(value):
                return _add(names, name)
        return False

    def learn(self, tree: nodes.Template) -> None:
        macros = {m.name: [a.name for a in m.args] for m in tree.find_all(nodes.Macro)}
        changed = True
        while changed:  # the sets only grow, so this ends
            changed = False
            for assign in tree.find_all(nodes.Assign):
                if isinstance(assign.target, nodes.Name):
                    changed |= self._bind(assign.target.name, assign.node)
            for loop in tree.find_all(nodes.For):
                if isinstance(loop.target, nodes.Name) and self.is_list(loop.iter):  # its items are messages
                    changed |= _add(self.messages, loop.target.name)
            for call in tree.find_all(nodes.Call):
                params = macros.get(call.node.name) if isinstance(call.node, nodes.Name) else None
                if params is None:
                    continue
                passed = list(zip(params, call.args, strict=False))  # (a macro may take more than it names)
                passed += [(k.key, k.value) for k in call.kwargs if k.key in params]
                for param, value in passed:
                    changed |= self._bind(param, value)


def _reads_parts(tree: nodes.Template, names: _Names) -> bool:
    """Does the template treat some message content as a list of OpenAI parts?"""
    if any(names.is_content(loop.iter) for loop in tree.find_all(nodes.For)):
        return True
    for access in tree.find_all((nodes.Getattr, nodes.Getitem)):  # content[0].text, content[0]['type']
        inner = access.node if isinstance(access, (nodes.Getattr, nodes.Getitem)) else None
        if (_key(access) in _PART_KEYS and isinstance(inner, nodes.Getitem) and isinstance(_key(inner), int)
                and names.is_content(inner.node)):
            return True
    return any(f.name in _PART_FILTERS and f.node is not None and names.is_content(f.node)
               for f in tree.find_all(nodes.Filter))


def detect_content_format(source: str) -> ContentFormat:
    """"openai" when the template ``source`` reads message contents as lists of parts, else "string".

    Raises ``jinja2.TemplateSyntaxError`` when the source does not parse."""
    tree = _ENV.parse(source)
    names = _Names()
    names.learn(tree)
    return "openai" if _reads_parts(tree, names) else "string"


def template_source(tokenizer: Any) -> str | None:
    """The tokenizer's default chat template (its "default" one when it has several); None without one."""
    get = getattr(tokenizer, "get_chat_template", None)
    if get is None:
        return None
    try:
        source = get()
    except ValueError:  # no template, or several without a default
        return None
    return source if isinstance(source, str) else None


def resolve_content_format(tokenizer: Any, given: str) -> ContentFormat:
    """The content format for ``--chat-template-content-format given``; says which at INFO, once per call."""
    if given not in CHAT_TEMPLATE_CONTENT_FORMATS:
        raise ValueError(f"chat_template_content_format must be one of {', '.join(CHAT_TEMPLATE_CONTENT_FORMATS)}, "
                         f"got {given!r}")
    source = template_source(tokenizer)
    detected: ContentFormat = "string"
    if source is None:
        why = "the tokenizer has no chat template"
    else:
        try:
            detected = detect_content_format(source)
            why = ("the template loops over message content parts" if detected == "openai"
                   else "the template reads message content as text")
        except jinja2.TemplateSyntaxError as exc:
            why = f"the template does not parse ({exc})"
    if given == "auto":
        log.info("chat template content format: %r, detected (%s); --chat-template-content-format overrides it",
                 detected, why)
        return detected
    log.info("chat template content format: %r (--chat-template-content-format)", given)
    if source is not None and given != detected:
        log.warning("--chat-template-content-format %s differs from the format detected for this template, %r "
                    "(%s)", given, detected, why)
    return given  # type: ignore[return-value]
