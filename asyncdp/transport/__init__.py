"""Framed, typed message links over anyio byte streams (TCP, Unix) and in-memory pairs, behind one interface.

A :class:`Link` carries :mod:`asyncdp.messages` objects: ``send(msg)``, ``receive()`` (raises
``anyio.EndOfStream`` at EOF, ``ProtocolError`` on a bad frame) and ``aclose()``. Addresses are strings:
``unix:/path`` or ``tcp:host:port``. Listeners always bind a fresh Unix path or TCP port 0 and report the real
address (spec §5.1: no pick-a-port-then-bind races). Given the deployment secret, a stream link runs a mutual
challenge-response before its first frame (:mod:`asyncdp.transport.link_auth`).
"""

from asyncdp.transport.endpoints import (
    LinkListener,
    accept_link,
    connect,
    connect_with_retry,
    listen,
    listen_links,
    serve_links,
)
from asyncdp.transport.links import (
    LINK_ERRORS,
    Link,
    MemoryLink,
    StreamLink,
    memory_link_pair,
)

__all__ = ["LINK_ERRORS", "Link", "LinkListener", "listen_links", "MemoryLink", "StreamLink", "accept_link", "connect", "connect_with_retry", "listen", "memory_link_pair", "serve_links"]
