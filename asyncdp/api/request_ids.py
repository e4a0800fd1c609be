"""Request ids: the ``id`` a response shows, and the ids the engines know its sequences by.

vLLM's ``request_id`` (a body field of both routes) names the request in its response: the ``id`` is
``chatcmpl-{request_id}`` (chat) or ``cmpl-{request_id}`` (completions), every streamed chunk's too. An
``X-Request-Id`` header wins over the body field, as in vLLM (which reads it whether or not
``--enable-request-id-headers``, its flag that only echoes the header in the response, is set; asyncdp has no such
flag and sends no such header). Without either, the id is a fresh random one, as before.

A client's id is never an engine's key. The DP client and each engine key their requests by id, and two requests in
flight with the same client id (retries, a proxy's constant) would take each other's outputs; vLLM appends 8 random
characters inside its engine for that reason. Here every request's sequences are named ``{prefix}-{uuid4 hex}-p-i``
whatever the client sent, so they are unique as before, and their length does not grow with the client's id (the id
travels with every token's output between processes).

A client id is 1 to ``MAX_REQUEST_ID_CHARS`` visible ASCII characters (no spaces or control characters): anything
else is a 400 naming ``request_id`` (vLLM takes any string). That admits UUIDs, OpenAI-style ids, W3C trace ids and
base64, and keeps the id safe to log and to put in a header.
"""

from __future__ import annotations

import re
import uuid

from asyncdp.errors import HTTPError

MAX_REQUEST_ID_CHARS = 256
_VISIBLE_ASCII = re.compile(r"[!-~]+")
# The header, lower case, as asyncdp.api.rank_hint.routing_headers collects it.
REQUEST_ID_HEADER = "x-request-id"


def check_request_id(value: str, where: str = "request_id") -> str:
    """``value`` when it is a valid client request id, else a 400 naming ``request_id``."""
    if not (0 < len(value) <= MAX_REQUEST_ID_CHARS and _VISIBLE_ASCII.fullmatch(value)):
        raise HTTPError(400, f"{where} must be 1 to {MAX_REQUEST_ID_CHARS} visible ASCII characters (no spaces or "
                             f"control characters).", param="request_id")
    return value


def request_ids(prefix: str, header: str | None, body: str | None) -> tuple[str, str]:
    """``(the response's id, the base of its sequences' engine ids)`` for a request of route ``prefix``
    (``chatcmpl``, ``cmpl``), given its ``X-Request-Id`` header and its body's ``request_id``."""
    internal = f"{prefix}-{uuid.uuid4().hex}"
    if body is not None:
        check_request_id(body)
    if header is not None:
        return f"{prefix}-{check_request_id(header, 'The X-Request-Id header')}", internal
    return (internal if body is None else f"{prefix}-{body}"), internal
