"""PURE: the headers the router sends upstream and returns to the client.

Theory of operation. A proxied request keeps its headers, less the hop-by-hop ones (RFC 9110 §7.6.1: the fixed
list and whatever the ``Connection`` header names) and less ``Host`` and ``Content-Length``, which httpx sets for
the endpoint (a streamed body of known length gets the client's ``Content-Length`` back, see
:func:`upstream_headers`). Two headers tell the endpoint about the client, as a reverse proxy's do:

* ``X-Forwarded-For``: the chain the client sent (every such header, in order, joined by ``", "``), with the
  address of the peer that connected to the router appended; the router trusts nothing in the chain and changes
  none of it.
* ``X-Forwarded-Proto``: ``http`` or ``https``, how the client reached the router; a value the client sent is
  replaced (only the router knows it).

``Forwarded`` (RFC 7239) and every other header pass through as they came. The answer's headers come back less
the hop-by-hop ones and ``Date``/``Server``, which the router's own HTTP server sets.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                        b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"proxy-connection"})
X_FORWARDED_FOR = b"x-forwarded-for"
X_FORWARDED_PROTO = b"x-forwarded-proto"
NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length", b"expect"}
NOT_RETURNED = HOP_BY_HOP | {b"date", b"server"}


def forwarded_headers(headers: Iterable[tuple[bytes, bytes]], drop: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """``headers`` less ``drop`` and less every header the ``Connection`` header names (RFC 9110 §7.6.1)."""
    headers = list(headers)
    named = {token.strip().lower() for name, value in headers if name.lower() == b"connection"
             for token in value.split(b",")}
    return [(name, value) for name, value in headers if name.lower() not in drop and name.lower() not in named]


def upstream_headers(scope: dict[str, Any], content_length: bytes | None = None) -> list[tuple[bytes, bytes]]:
    """The headers of the request ``scope`` (ASGI) as the router sends it upstream (see the module docstring);
    ``content_length``: the client's ``Content-Length`` to keep, for a body streamed as it arrives. One pass over
    the headers (this runs for every request)."""
    headers: list[tuple[bytes, bytes]] = []
    chain: list[bytes] = []
    connection: list[bytes] = []
    for name, value in scope["headers"]:
        lower = name.lower()
        if lower == X_FORWARDED_FOR:
            if value.strip():
                chain.append(value.strip())
        elif lower == b"connection":
            connection.append(value)
        elif lower not in NOT_FORWARDED and lower != X_FORWARDED_PROTO:
            headers.append((name, value))
    if connection:  # drop what it names (RFC 9110 §7.6.1), the chain included
        named = {token.strip().lower() for value in connection for token in value.split(b",")}
        headers = [(name, value) for name, value in headers if name.lower() not in named]
        if X_FORWARDED_FOR in named:
            chain.clear()
    client = scope.get("client")
    if client:  # None over a UNIX socket: nothing to add
        chain.append(str(client[0]).encode("ascii", "replace"))
    if chain:
        headers.append((X_FORWARDED_FOR, b", ".join(chain)))
    headers.append((X_FORWARDED_PROTO, b"https" if scope.get("scheme") == "https" else b"http"))
    if content_length is not None:
        headers.append((b"content-length", content_length))
    return headers
