"""A request's own chat template (vLLM's ``chat_template`` request field), served with
``--trust-request-chat-template``.

Without the flag such a request is a 400 naming ``chat_template``, with vLLM's message: a template is code the
server runs, and one can spend its CPU (nested loops) or print whatever prompt it likes. With it, the template
is read as the server's own is at startup (:mod:`asyncdp.api.content_format`, :mod:`asyncdp.api.template_roles`):
it must parse (else a 400 naming ``chat_template`` with Jinja's line and message), and its content format
(``--chat-template-content-format auto`` detects it, a given format applies to it too) and roles are worked
out, once per distinct template (the last :data:`CACHED_TEMPLATES` are kept).

Transformers renders every chat template, the tokenizer's, ``--chat-template`` and a request's, in Jinja's
``ImmutableSandboxedEnvironment``: a template reads the values it is given and calls the functions Transformers
gives it (``raise_exception``, ``strftime_now``), never Python's internals. ``''.__class__``, a function's
``__globals__`` or a list's ``append`` are a ``SecurityError``, which the chat route answers as a 400 naming
``chat_template`` (``asyncdp.api.chat_render``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import jinja2

from asyncdp.api.content_format import ChatTemplate, ContentFormat, resolve_content_format
from asyncdp.api.template_roles import TemplateRoles, resolve_template_roles
from asyncdp.config.chat_template import PARSER
from asyncdp.errors import HTTPError

# vLLM's words for a request template the server was not told to trust.
UNTRUSTED = ("Chat template is passed with request, but --trust-request-chat-template is not set. Refused request "
             "with untrusted chat template.")
CACHED_TEMPLATES = 32


@dataclass(frozen=True)
class RequestTemplate:
    """A request's template, read: its source, and how messages reach it."""

    source: str
    content_format: ContentFormat
    roles: TemplateRoles


class _WithTemplate:
    """The tokenizer, with ``source`` as its chat template: what the startup detectors read and render."""

    def __init__(self, tokenizer: Any, source: str) -> None:
        self._tokenizer = tokenizer
        self._source = source

    def get_chat_template(self, chat_template: str | None = None, tools: Any = None) -> str:
        return self._source

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        return self._tokenizer.apply_chat_template(conversation, chat_template=self._source, **kwargs)


class RequestTemplates:
    """The templates requests bring, read (:meth:`read`); one per app that trusts them."""

    def __init__(self, tokenizer: Any, content_format: str = "auto") -> None:
        self._tokenizer = tokenizer
        self._content_format = content_format  # --chat-template-content-format, as given ("auto" detects)
        self._read: OrderedDict[str, RequestTemplate] = OrderedDict()
        self._lock = threading.Lock()  # (prepare runs on worker threads for large bodies)

    def read(self, source: str) -> RequestTemplate:
        """``source`` read as a chat template; a 400 naming ``chat_template`` when it does not parse."""
        with self._lock:
            known = self._read.get(source)
            if known is not None:
                self._read.move_to_end(source)
                return known
        try:
            tree = PARSER.parse(source)
        except jinja2.TemplateSyntaxError as exc:
            raise HTTPError(400, f"chat_template is not a valid Jinja template (line {exc.lineno}: {exc.message}).",
                            param="chat_template") from None
        template = ChatTemplate(source, tree)
        tokenizer = _WithTemplate(self._tokenizer, source)
        content_format = resolve_content_format(tokenizer, self._content_format, template)
        read = RequestTemplate(source, content_format, resolve_template_roles(tokenizer, content_format, template))
        with self._lock:
            self._read[source] = read
            while len(self._read) > CACHED_TEMPLATES:
                self._read.popitem(last=False)
        return read


def request_template(templates: RequestTemplates | None, source: str | None) -> RequestTemplate | None:
    """The request's template (None: the server's). ``templates`` is None on a server without
    ``--trust-request-chat-template``: then any template is a 400. An empty one is the server's, as in vLLM."""
    if source is None:
        return None
    if templates is None:
        raise HTTPError(400, UNTRUSTED, param="chat_template")
    return templates.read(source) if source else None
