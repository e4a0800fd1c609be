"""Framed, typed message links over anyio byte streams (TCP, Unix) and in-memory pairs, behind one interface.

A :class:`Link` carries :mod:`asyncdp.messages` objects: ``send(msg)``, ``receive()`` (raises
``anyio.EndOfStream`` at EOF, ``ProtocolError`` on a bad frame) and ``aclose()``. Addresses are strings:
``unix:/path`` or ``tcp:host:port``. Listeners always bind a fresh Unix path or TCP port 0 and report the real
address (spec §5.1: no pick-a-port-then-bind races).
"""

from asyncdp.transport.links import (
    LINK_ERRORS,
    Link,
    LinkListener,
    MemoryLink,
    StreamLink,
    connect,
    connect_with_retry,
    listen,
    listen_links,
    memory_link_pair,
    serve_links,
)

__all__ = ["LINK_ERRORS", "Link", "LinkListener", "listen_links", "MemoryLink", "StreamLink", "connect", "connect_with_retry", "listen", "memory_link_pair", "serve_links"]
