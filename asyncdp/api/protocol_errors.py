"""OpenAI-style JSON answers to HTTP/1.1 requests that cannot be parsed, in place of Hypercorn's empty ones.

Theory of operation. A request h11 cannot parse (``Content-Length: abc``, a request line that is no request line,
a head over ``h11_max_incomplete_size``, ``Transfer-Encoding: gzip``) never reaches the app: Hypercorn's
``H11Protocol._handle_events`` catches h11's ``RemoteProtocolError`` and calls
``self._send_error_response(error.error_status_hint)``, which sends a bare status line (no reason phrase),
``content-length: 0`` and closes the connection. A client then saw nothing that said what was wrong, and for an
unsupported transfer coding h11's hint is a 501: a 5xx for bad client input.

:class:`JsonErrorH11Protocol` overrides that one method (and ``handle``, only to keep a reference to the bytes of
a request head still being parsed, so the answer can name the transfer coding it refuses). It answers with the
body :func:`asyncdp.api.errors.error_body` makes, ``content-type: application/json``, a reason phrase and
``connection: close``; the status is h11's hint, except that a 5xx hint becomes a 400 (asyncdp answers bad input
with a 4xx, never a 5xx). The message is built from the ``h11.RemoteProtocolError`` being handled: Hypercorn
calls ``_send_error_response`` inside its ``except`` block, so ``sys.exc_info()`` is that error.

:func:`install` puts the class where Hypercorn's ``ProtocolWrapper`` looks its HTTP/1.1 protocol up (the name
``H11Protocol`` in ``hypercorn.protocol``), which serves both the asyncio and the trio backends. It is called by
:func:`asyncdp.api.serve.serve_http` (so by ``asyncdp serve`` and ``asyncdp route``), once per process, and it
installs nothing (with a warning) when Hypercorn's internals no longer look as this module expects;
``tests/api/test_protocol_errors.py`` fails on a Hypercorn version other than :data:`TESTED_HYPERCORN` or a
changed ``_handle_events``, so an upgrade is re-checked here rather than silently losing the JSON answers.
"""

from __future__ import annotations

import ast
import inspect
import logging
import re
import sys
from http import HTTPStatus
from typing import Any

import h11
import hypercorn.protocol
import orjson
from hypercorn.events import Event, RawData
from hypercorn.protocol.h11 import H11Protocol

from asyncdp.api.errors import error_body

log = logging.getLogger("asyncdp.api")

# The Hypercorn versions whose H11Protocol this override was read against (tests pin the installed one to these).
TESTED_HYPERCORN = frozenset({"0.18.0"})
_MAX_DETAIL_CHARS = 200
# h11 quotes the line it refuses as Python writes a bytearray: "illegal request line: bytearray(b'GET /x')"
_BYTES_REPR = re.compile(r"""bytearray\((b'(?:[^'\\]|\\.)*'|b"(?:[^"\\]|\\.)*")\)""")
_TRANSFER_ENCODING = re.compile(rb"(?im)^transfer-encoding[ \t]*:[ \t]*([^\r\n]*?)[ \t]*\r?$")


def protocol_error_answer(status_hint: int, error: BaseException | None, head: bytes,
                          max_head_bytes: int) -> tuple[int, str]:
    """PURE: the status and message that answer a request h11 refused with ``error`` (hint ``status_hint``);
    ``head``: the request's bytes received so far (to name a refused transfer coding)."""
    detail = str(error) if isinstance(error, h11.ProtocolError) and str(error) else HTTPStatus(status_hint).phrase
    detail = _BYTES_REPR.sub(lambda m: repr(ast.literal_eval(m.group(1)).decode("latin-1")), detail)
    if len(detail) > _MAX_DETAIL_CHARS:  # h11 quotes a refused request line whole: up to the head limit
        detail = detail[:_MAX_DETAIL_CHARS] + "..."
    if status_hint == 431:
        return 431, f"the request's head (request line and headers) is too large: keep it under {max_head_bytes} bytes"
    if status_hint == 501:  # h11's hint for a Transfer-Encoding it does not support, and only for that
        codings = [m.group(1).decode("latin-1") for m in _TRANSFER_ENCODING.finditer(head.partition(b"\r\n\r\n")[0])]
        if len(codings) > 1 or "multiple" in detail:
            return 400, "a request may carry one Transfer-Encoding header, and only 'chunked'"
        coding = repr(codings[0]) if codings else "in the request"
        return 400, f"unsupported Transfer-Encoding {coding}: only 'chunked' is supported (or send Content-Length)"
    status = 400 if status_hint >= 500 else status_hint
    return status, f"malformed HTTP request: {detail}"


class JsonErrorH11Protocol(H11Protocol):
    """Hypercorn's HTTP/1.1 protocol, answering requests it cannot parse in OpenAI's error shape (see the module
    docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # References to the chunks of a request head being parsed (none copied); cleared once a request parsed.
        self._head: list[bytes] = []

    async def handle(self, event: Event) -> None:
        head = self._head
        if isinstance(event, RawData) and self.connection.their_state is h11.IDLE:
            head.append(event.data)
        await super().handle(event)
        if head and self.connection.their_state is not h11.IDLE:
            head.clear()

    async def _send_error_response(self, status_code: int) -> None:
        error = sys.exc_info()[1]  # the h11.RemoteProtocolError Hypercorn is handling
        status, message = protocol_error_answer(status_code, error, b"".join(self._head),
                                                self.config.h11_max_incomplete_size)
        body = orjson.dumps(error_body(status, message))
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close"), *self.config.response_headers("h11")]
        await self._send_h11_event(h11.Response(status_code=status, reason=HTTPStatus(status).phrase.encode(),
                                                headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


def hook_fits() -> str:
    """Why :class:`JsonErrorH11Protocol` cannot be installed on the Hypercorn in use, or ``""`` when it can."""
    if hypercorn.protocol.H11Protocol not in (H11Protocol, JsonErrorH11Protocol):
        return f"hypercorn.protocol.H11Protocol is {hypercorn.protocol.H11Protocol!r}, not Hypercorn's own"
    for name, params in (("_send_error_response", ["self", "status_code"]), ("handle", ["self", "event"])):
        method = getattr(H11Protocol, name, None)
        if method is None or list(inspect.signature(method).parameters) != params:
            return f"H11Protocol.{name} is missing or no longer takes {params}"
    return ""


def install() -> bool:
    """Make Hypercorn's ``ProtocolWrapper`` serve HTTP/1.1 with :class:`JsonErrorH11Protocol` (idempotent);
    False, with a warning, where :func:`hook_fits` says it does not fit."""
    if hypercorn.protocol.H11Protocol is JsonErrorH11Protocol:
        return True
    why = hook_fits()
    if why:
        log.warning("malformed HTTP requests get Hypercorn's empty error answers: %s", why)
        return False
    hypercorn.protocol.H11Protocol = JsonErrorH11Protocol  # type: ignore[misc]
    return True
