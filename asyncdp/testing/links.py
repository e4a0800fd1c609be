"""In-memory links for the simulation harness: link ends that report what passes through them, and a listener.

A :class:`SimLink` is a :class:`~asyncdp.transport.MemoryLink` with three optional hooks (``on_send``,
``on_receive``, ``on_close``), a synchronous ``close_nowait()`` and a reading gate (``stall()`` /
``unstall()``), so a harness can observe traffic without mocking any role, can cut a link at once (the peer
sees EOF, its sends break) and can play a peer that stops reading (the link's buffer fills, the sender's
sends block). :class:`MemoryLinkListener`
has the ``serve(handler)`` shape :func:`~asyncdp.coordinator.core.serve_coordinator` expects from a listener.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import anyio

from asyncdp import messages as m
from asyncdp.transport import MemoryLink

LINK_BUFFER = 4096


class SimLink(MemoryLink):
    """A memory link end that reports what passes through it and can be closed without awaiting.

    ``on_send(msg)`` runs after a successful send, ``on_receive(msg)`` after each receive, ``on_close()`` once,
    at the first close. Closing closes this end's two streams, so the peer sees EOF and its sends break.
    """

    def __init__(self, send: Any, receive: Any, *, name: str, codec: bool) -> None:
        super().__init__(send, receive, name=name, codec=codec)
        self._streams = (send, receive)
        self.on_send: Callable[[m.Message], None] | None = None
        self.on_receive: Callable[[m.Message], None] | None = None
        self.on_close: Callable[[], None] | None = None
        self.closed = False
        self._gate: anyio.Event | None = None

    async def send(self, msg: m.Message) -> None:
        await super().send(msg)
        if self.on_send is not None:
            self.on_send(msg)

    def stall(self) -> None:
        """Stop delivering to this end's reader (it blocks in ``receive``) until :meth:`unstall`."""
        if self._gate is None:
            self._gate = anyio.Event()

    def unstall(self) -> None:
        if self._gate is not None:
            self._gate.set()
            self._gate = None

    async def receive(self) -> m.Message:
        while self._gate is not None:
            await self._gate.wait()
        msg = await super().receive()
        if self.on_receive is not None:
            self.on_receive(msg)
        return msg

    async def aclose(self) -> None:
        self.close_nowait()

    def close_nowait(self) -> None:
        for stream in self._streams:
            stream.close()
        if not self.closed:
            self.closed = True
            if self.on_close is not None:
                self.on_close()


def sim_link_pair(*, name: str, codec: bool = False, max_buffer: int = LINK_BUFFER) -> tuple[SimLink, SimLink]:
    """Two connected :class:`SimLink` ends (``codec=True`` round-trips every message through the wire codec)."""
    a_send, b_recv = anyio.create_memory_object_stream[Any](max_buffer)
    b_send, a_recv = anyio.create_memory_object_stream[Any](max_buffer)
    return (SimLink(a_send, a_recv, name=f"{name}:a", codec=codec),
            SimLink(b_send, b_recv, name=f"{name}:b", codec=codec))


class MemoryLinkListener:
    """An in-memory listener for :func:`serve_coordinator`: ``connect()`` hands one end of a fresh link to the
    caller and queues the other end for ``serve(handler)``, which runs ``handler(link)`` per link; ``offer(link)``
    queues a link end made elsewhere."""

    def __init__(self, *, name: str, codec: bool = False) -> None:
        self.name = name
        self._codec = codec
        self._send, self._recv = anyio.create_memory_object_stream[Any](math.inf)
        self._links: list[SimLink] = []

    def offer(self, link: Any) -> None:
        """Queue a link end made elsewhere (any link) for ``serve``; its maker closes it."""
        self._send.send_nowait(link)

    def connect(self) -> SimLink:
        ours, theirs = sim_link_pair(name=self.name, codec=self._codec)
        self._links += [ours, theirs]
        self._send.send_nowait(theirs)
        return ours

    async def serve(self, handler: Callable[[Any], Any]) -> None:
        async with anyio.create_task_group() as tg:
            async for link in self._recv:
                tg.start_soon(handler, link)

    def close(self) -> None:
        self._send.close()
        self._recv.close()
        for link in self._links:  # also the ends nobody accepted
            link.close_nowait()
