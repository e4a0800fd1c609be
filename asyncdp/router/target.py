"""The request target a proxied request is routed on and sent upstream with, and the targets the router refuses.

Theory of operation. Hypercorn hands the ASGI app the target as it came (``raw_path``, percent-encoded) and
decoded (``path``). :func:`request_target` turns it into what the router routes on and forwards:

* **Absolute form.** ``GET http://host/v1/models HTTP/1.1`` (RFC 9112 §3.2.2, which a server must accept) is
  routed and forwarded as its path, ``/v1/models``: the scheme and authority are dropped (the endpoint is the
  router's choice, not the client's), as ``asyncdp serve`` serves the path of such a target.
* **Leading slashes.** ``GET //v1/models`` is routed and forwarded as ``/v1/models``: Werkzeug's route matching
  (``asyncdp serve``) reads a run of leading slashes as one, so the endpoint serves that path, and the router
  routes what the endpoint serves. The check on the routes it forwards is made on that same path, so ``//pause``
  is no route of the router (404), as ``/pause`` is not. (A run of slashes further on, ``/v1//models``, goes
  through as it came: ``asyncdp serve`` answers it with a 308 to ``/v1/models``.)
* **Dot segments.** A path with a ``.`` or ``..`` segment, literal or percent-encoded (``/v1/../pause``,
  ``/v1/%2e%2e/pause``), is not a route (404). httpx resolves literal dot segments in the URL it sends, so
  ``/v1/../pause`` reached the endpoint's ``/pause``: the router's list of proxied paths (``/v1/*``,
  ``/tokenize``, ``/detokenize``) could be left with one ``..``, to every control route of the endpoint.
  ``asyncdp serve`` answers such a path 404 too (it matches routes literally).
* **CONNECT.** A ``CONNECT`` to a proxied path is a 405, as ``asyncdp serve`` answers it: the router opens no
  tunnel, and an endpoint of another kind that answered it 2xx switched both Hypercorn's and httpx's connection
  to a tunnel, so the answer's body raised inside Hypercorn (a traceback, the connection broken).
* **Targets httpx cannot send.** A ``#`` (the client sent a fragment), a control character (HTTP/2 lets one
  through) or a target over httpx's 64 KiB: a 400 that says why, instead of the ``InvalidURL`` raised inside the
  exchange (a 500 with a traceback).

Everything else goes through byte for byte (httpx percent-encodes the few characters a URL path may not hold
literally, such as ``{`` or ``"``, which the endpoint decodes back). :func:`refuse_websocket` answers a WebSocket
handshake, which the router does not forward, as ``asyncdp serve`` does.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import httpx
import orjson

from asyncdp.api.errors import error_body

PROXIED_EXACT = frozenset({"/tokenize", "/detokenize", "/tokenizer_info"})  # (lm-eval's remote tokenizer reads all three)
_ABSOLUTE_FORM = re.compile(rb"[A-Za-z][A-Za-z0-9+.\-]*://[^/?#]*")
_CHECK_BASE = httpx.URL("http://endpoint")  # what a target is checked against: httpx's rules need no real host
# Targets of only these bytes (printable ASCII less '#', the common case) need no check by httpx (about 20 us).
_PLAIN = re.compile(rb"[\x21\x22\x24-\x7e]{1,4096}")


@dataclass(frozen=True, slots=True)
class Target:
    """A request's target: ``path`` (decoded) to route on, ``raw`` (path and query, as sent) to forward, or the
    ``error`` status and message that refuse it."""

    path: str
    raw: bytes = b""
    error: int = 0
    message: str = ""


def request_target(scope: dict[str, Any]) -> Target:
    """The :class:`Target` of the ASGI ``scope`` (see the module docstring)."""
    path: str = scope["path"]
    raw: bytes = scope.get("raw_path") or path.encode("utf-8")
    if (absolute := _ABSOLUTE_FORM.match(raw)) is not None:
        raw = raw[absolute.end():] or b"/"
        path = unquote(raw.decode("ascii", "replace"))
    if path.startswith("//"):  # a run of leading slashes is one, as asyncdp serve's route matching reads it
        path, raw = "/" + path.lstrip("/"), b"/" + raw.lstrip(b"/")
    if scope.get("method") == "CONNECT":
        return Target(path, error=405, message="the router forwards no CONNECT (it opens no tunnel)")
    segments = path.split("/")
    if "." in segments or ".." in segments:
        return Target(path, error=404, message="a path with a '.' or '..' segment is not a route of the router")
    if scope.get("query_string"):
        raw += b"?" + scope["query_string"]
    if _PLAIN.fullmatch(raw) is not None and raw.startswith(b"/"):
        return Target(path, raw)
    try:
        _CHECK_BASE.copy_with(raw_path=raw)
    except httpx.InvalidURL as exc:
        return Target(path, error=400, message=f"the request target is not a URL the router can forward: {exc}")
    return Target(path, raw)


def is_proxied(path: str) -> bool:
    return path.startswith("/v1/") or path in PROXIED_EXACT


def not_a_route(method: str, path: str) -> str:
    return (f"{method} {path} is not a route of the router; it forwards /v1/*, /tokenize, /detokenize and /tokenizer_info and answers "
            "/health and /load")


async def refuse_websocket(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                           send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """A WebSocket handshake (``GET`` with ``Upgrade: websocket``, an ASGI ``websocket`` scope) is not forwarded:
    404 for a path that is no route, else 400, in OpenAI's error shape, as ``asyncdp serve`` answers; without an
    answer the app's return made Hypercorn answer a bare 500."""
    if (await receive())["type"] != "websocket.connect":
        return
    path = request_target(scope).path
    status = 400 if is_proxied(path) or path in ("/health", "/load") else 404
    message = (f"the router does not forward WebSocket connections (GET {path} with Upgrade: websocket)"
               if status == 400 else not_a_route("GET", path))
    if "websocket.http.response" not in scope.get("extensions", {}):  # (Hypercorn has it) a bare 403 then
        await send({"type": "websocket.close", "code": 1008})
        return
    data = orjson.dumps(error_body(status, message))
    await send({"type": "websocket.http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "websocket.http.response.body", "body": data, "more_body": False})
