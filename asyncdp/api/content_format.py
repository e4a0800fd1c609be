"""The shape a chat template wants ``message.content`` in (vLLM's ``--chat-template-content-format``).

Two kinds of template exist. A "string" template prints ``message.content``; an "openai" template loops over
OpenAI-style parts (``{% for part in message.content %}{% if part.type == 'text' %}{{ part.text }}...``), as the
templates of vision-language models and many recent ones do, and renders nothing when it gets a string (each
character is a "part" without a ``type``). ``auto`` tells them apart in two steps.

First it reads the template's source (:func:`detect_content_format`). The source is parsed into Jinja's syntax
tree and every expression is given the kinds of value it may hold, without scopes or order (templates are small
and seldom rebind a name): a *message list* (``messages``, a slice, a filtered copy such as
``messages|selectattr('role', 'equalto', 'user')|list``, ``messages + [...]``), a *message* (an element of a
message list: a loop variable over one, ``messages[0]``, ``messages[-1]``, ``messages|last``), a *content*
(``m.content``, ``m['content']`` or ``m.get('content')`` of a message ``m``), a *content list*
(``messages|map(attribute='content')``), whose elements are contents, and a *part* (an element of a content).
Names set from an expression (``{% set %}``, ``{% with %}``, loop variables, the parameters of a macro given
one) hold its kinds. The template is "openai" when it treats a content as a list of parts: it loops over one,
reads a part's ``text`` or ``type`` (``messages[0]['content'][0]['text']``, ``(m.content|first).type``) or
filters one by attribute (``selectattr``, ``map(attribute=...)``). Otherwise it is "string". A template that
takes both (``{% if message.content is string %}...{% else %}{% for part in message.content %}``) is "openai",
as in vLLM: it renders the parts as its authors wrote it to.

Then it checks that reading against the template itself (:func:`probe_content_format`): one user message whose
text is a marker is rendered both ways. When only one of the two shows the marker (the other renders nothing,
or raises), that format is the answer, whatever the source suggested; otherwise the reading stands. So a shape
the reading does not know, or a template that reads parts on one side path (a system prompt given as parts) but
prints the user's content as text, still gets the format that shows the user's words.

A template that does not parse, or a tokenizer without one, is "string" (the request then fails as before).

An API server reads its tokenizer's template once (:func:`read_template`): the source and its parsed tree go to
both detectors, this one and :mod:`asyncdp.api.template_roles`. (Rendering compiles it once too: Transformers
caches the compiled template by its source.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

import jinja2
import jinja2.nodes as nodes

from asyncdp.config.chat_template import PARSER
from asyncdp.config.flags import CHAT_TEMPLATE_CONTENT_FORMATS

log = logging.getLogger(__name__)

ContentFormat = Literal["string", "openai"]
Kinds = frozenset[str]

# The kinds of value an expression may hold, and what one element of each is.
LIST, MESSAGE, CONTENTS, CONTENT, PART = "message list", "message", "content list", "content", "part"
_ELEMENT = {LIST: MESSAGE, CONTENTS: CONTENT, CONTENT: PART}
_LISTS = frozenset({LIST, CONTENTS, CONTENT})
_NONE: Kinds = frozenset()
# Filters that pick one element of a list: messages|first is a message, messages|reverse still a list.
_ELEMENT_FILTERS = frozenset({"first", "last", "random"})
# Filters that return the list they are given, reordered, fewer, or as it is.
_SAME_FILTERS = frozenset({"list", "reverse", "sort", "unique", "select", "reject", "selectattr", "rejectattr",
                           "default", "d"})
# Filters that read each element of a list by attribute (their first argument); the others do with ``attribute=``.
_BY_ATTRIBUTE = frozenset({"selectattr", "rejectattr", "groupby"})
# The keys of an OpenAI content part a template reads.
_PART_KEYS = frozenset({"type", "text"})
# The text of the one message :func:`probe_content_format` renders.
PROBE_TEXT = "asyncdp-content-format-probe"


def _key(node: nodes.Node) -> Any:
    """The constant key of ``x.key`` or ``x['key']`` / ``x[0]``; None for anything else."""
    if isinstance(node, nodes.Getattr):
        return node.attr
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        return node.arg.value
    return None


def _reads_by_attribute(f: nodes.Filter) -> bool:
    """Does the filter read its elements' attributes (``selectattr('type', ...)``, ``map(attribute='text')``)?"""
    return f.name in _BY_ATTRIBUTE or any(k.key == "attribute" for k in f.kwargs)


def _attribute(f: nodes.Filter) -> Any:
    """The constant ``attribute=`` of a filter such as ``map(attribute='content')``; None without one."""
    return next((k.value.value for k in f.kwargs if k.key == "attribute" and isinstance(k.value, nodes.Const)), None)


def _elements(kinds: Kinds) -> Kinds:
    return frozenset(_ELEMENT[k] for k in kinds if k in _ELEMENT)


class _Names:
    """The kinds each name may hold; ``learn`` grows them to a fixed point."""

    def __init__(self) -> None:
        self.kinds: dict[str, Kinds] = {"messages": frozenset({LIST})}

    def of(self, e: nodes.Node | None) -> Kinds:
        """The kinds the expression ``e`` may hold."""
        if isinstance(e, nodes.Name):
            return self.kinds.get(e.name, _NONE)
        if isinstance(e, nodes.Getitem) and isinstance(e.arg, nodes.Slice):
            return self.of(e.node) & _LISTS  # messages[1:], messages[::-1]
        if isinstance(e, (nodes.Getattr, nodes.Getitem)):
            inner, key = self.of(e.node), _key(e)
            content = frozenset({CONTENT}) if key == "content" and MESSAGE in inner else _NONE
            return content | (_elements(inner) if isinstance(e, nodes.Getitem) and not isinstance(key, str) else _NONE)
        if isinstance(e, nodes.Call):  # m.get('content')
            f, args = e.node, e.args
            if (isinstance(f, nodes.Getattr) and f.attr == "get" and args and isinstance(args[0], nodes.Const)
                    and args[0].value == "content" and MESSAGE in self.of(f.node)):
                return frozenset({CONTENT})
            return _NONE
        if isinstance(e, nodes.Filter):
            inner = self.of(e.node)
            if e.name in _ELEMENT_FILTERS:
                return _elements(inner)
            if e.name in _SAME_FILTERS:
                return inner
            return frozenset({CONTENTS}) if e.name == "map" and _attribute(e) == "content" and LIST in inner else _NONE
        if isinstance(e, nodes.CondExpr):
            return self.of(e.expr1) | self.of(e.expr2)
        if isinstance(e, nodes.Add):  # messages + [extra], [system] + messages[1:]
            return (self.of(e.left) | self.of(e.right)) & {LIST, CONTENTS}
        if isinstance(e, (nodes.List, nodes.Tuple)):  # [messages[0], ...] is a message list
            items = frozenset().union(*(self.of(item) for item in e.items))
            return frozenset(k for k in (LIST, CONTENTS) if _ELEMENT[k] in items)
        return _NONE

    def _bind(self, name: str, kinds: Kinds) -> bool:
        """Record that ``name`` may hold ``kinds``; True when that is news."""
        old = self.kinds.get(name, _NONE)
        if kinds <= old:
            return False
        self.kinds[name] = old | kinds
        return True

    def learn(self, tree: nodes.Template) -> None:
        macros = {m.name: [a.name for a in m.args] for m in tree.find_all(nodes.Macro)}
        changed = True
        while changed:  # the kinds only grow, so this ends
            changed = False
            for assign in tree.find_all(nodes.Assign):
                if isinstance(assign.target, nodes.Name):
                    changed |= self._bind(assign.target.name, self.of(assign.node))
            for with_ in tree.find_all(nodes.With):
                for target, value in zip(with_.targets, with_.values, strict=False):
                    if isinstance(target, nodes.Name):
                        changed |= self._bind(target.name, self.of(value))
            for loop in tree.find_all(nodes.For):
                if isinstance(loop.target, nodes.Name):  # its items are the iterated list's elements
                    changed |= self._bind(loop.target.name, _elements(self.of(loop.iter)))
            for call in tree.find_all(nodes.Call):
                params = macros.get(call.node.name) if isinstance(call.node, nodes.Name) else None
                if params is None:
                    continue
                passed = list(zip(params, call.args, strict=False))  # (a macro may take more than it names)
                passed += [(k.key, k.value) for k in call.kwargs if k.key in params]
                for param, value in passed:
                    changed |= self._bind(param, self.of(value))


def _reads_parts(tree: nodes.Template, names: _Names) -> bool:
    """Does the template treat some message content as a list of OpenAI parts?"""
    if any(CONTENT in names.of(loop.iter) for loop in tree.find_all(nodes.For)):
        return True
    for access in tree.find_all((nodes.Getattr, nodes.Getitem)):  # content[0].text, (content|first).type
        if (isinstance(access, (nodes.Getattr, nodes.Getitem)) and _key(access) in _PART_KEYS
                and PART in names.of(access.node)):
            return True
    return any(_reads_by_attribute(f) and CONTENT in names.of(f.node) for f in tree.find_all(nodes.Filter))


def detect_content_format(source: str | nodes.Template) -> ContentFormat:
    """"openai" when the template (its ``source``, or its parsed tree) reads message contents as lists of parts,
    else "string".

    Raises ``jinja2.TemplateSyntaxError`` when the source does not parse."""
    tree = PARSER.parse(source) if isinstance(source, str) else source
    names = _Names()
    names.learn(tree)
    return "openai" if _reads_parts(tree, names) else "string"


def shows_probe(tokenizer: Any, messages: list[dict[str, Any]]) -> bool:
    """Whether the tokenizer's chat template, given ``messages``, shows :data:`PROBE_TEXT` in its prompt."""
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that refuses the messages in this shape shows nothing
        return False
    return isinstance(text, str) and PROBE_TEXT in text


def probe_content_format(tokenizer: Any) -> ContentFormat | None:
    """The one format in which the tokenizer's chat template shows a user message's text; None when both or
    neither do (one user message, given as a string and as one text part)."""
    as_string = shows_probe(tokenizer, [{"role": "user", "content": PROBE_TEXT}])
    as_parts = shows_probe(tokenizer, [{"role": "user", "content": [{"type": "text", "text": PROBE_TEXT}]}])
    if as_string == as_parts:
        return None
    return "string" if as_string else "openai"


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


@dataclass(frozen=True)
class ChatTemplate:
    """The tokenizer's chat template, read and parsed once (:func:`read_template`). ``source`` is None when the
    tokenizer has none; ``tree`` is None without a source or when it does not parse (``syntax_error`` says why)."""

    source: str | None = None
    tree: nodes.Template | None = None
    syntax_error: str | None = None


def read_template(tokenizer: Any) -> ChatTemplate:
    """The tokenizer's default chat template, parsed (see :func:`template_source`)."""
    source = template_source(tokenizer)
    if source is None:
        return ChatTemplate()
    try:
        return ChatTemplate(source, PARSER.parse(source))
    except jinja2.TemplateSyntaxError as exc:
        return ChatTemplate(source, syntax_error=str(exc))


def _detect(tokenizer: Any, template: ChatTemplate) -> tuple[ContentFormat, str]:
    """The detected format of the tokenizer's template and why, in words."""
    if template.source is None:
        return "string", "the tokenizer has no chat template"
    if template.tree is None:
        return "string", f"the template does not parse ({template.syntax_error})"
    read = detect_content_format(template.tree)
    shown = probe_content_format(tokenizer)
    if shown is not None and shown != read:
        return shown, (f"a user message's text shows only as {'a string' if shown == 'string' else 'text parts'}, "
                       f"although the template's source reads {'parts' if read == 'openai' else 'text'}")
    return read, ("the template loops over message content parts" if read == "openai"
                  else "the template reads message content as text")


def resolve_content_format(tokenizer: Any, given: str, template: ChatTemplate | None = None) -> ContentFormat:
    """The content format for ``--chat-template-content-format given``; says which at INFO, once per call.
    ``template``: the tokenizer's, as :func:`read_template` gives it (None: read it here)."""
    if given not in CHAT_TEMPLATE_CONTENT_FORMATS:
        raise ValueError(f"chat_template_content_format must be one of {', '.join(CHAT_TEMPLATE_CONTENT_FORMATS)}, "
                         f"got {given!r}")
    template = template if template is not None else read_template(tokenizer)
    detected, why = _detect(tokenizer, template)
    if given == "auto":
        log.info("chat template content format: %r, detected (%s); --chat-template-content-format overrides it",
                 detected, why)
        return detected
    log.info("chat template content format: %r (--chat-template-content-format)", given)
    if template.source is not None and given != detected:
        log.warning("--chat-template-content-format %s differs from the format detected for this template, %r "
                    "(%s)", given, detected, why)
    return given  # type: ignore[return-value]
