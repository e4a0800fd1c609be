"""A proxied request's body: held whole when small (so another endpoint can be sent it), streamed when large.

Theory of operation. :meth:`RequestBody.read_replayable` reads the client's body until it is complete or more than
``replay_bytes`` (``--replay-buffer-bytes``) arrived. A body that completed is sent whole, with its
``Content-Length``, and can be sent again to the next endpoint as often as failover needs. A larger one is sent
as it arrives (:meth:`RequestBody.content` is then a stream: the bytes held first, then the rest read from the
client while the endpoint takes it), so the router never holds more than about ``replay_bytes`` of it; such a
body can be sent again only while the stream has not started reading past what is held
(:attr:`RequestBody.replayable`): a connection refused before sending anything still fails over, an endpoint that
answers its drain 503 after reading it does not.

Over ``max_bytes`` (``--max-request-body-bytes``; at once when ``Content-Length`` says so) reading raises
:class:`BodyTooLarge`; :meth:`RequestBody.drain` then reads and discards the rest, so the 413 that follows reaches
the client instead of a connection reset. A client that leaves while its body is read raises :class:`ClientGone`;
one that sends nothing more of it for ``idle_timeout_s`` (a stalled upload) raises :class:`ClientTooSlow`, so a
client that stops half-way holds neither this request nor, for a streamed body, an endpoint's connection forever.
:meth:`RequestBody.wait_released` returns once nothing reads the client's side for the body any more (it is
complete, or the endpoint answered without reading it all): from then on the proxy's disconnect watcher reads it.

``asyncdp serve`` drains a refused body too (:mod:`asyncdp.api.body`), but not from an ASGI ``receive``: Quart's
ASGI layer owns ``receive`` and feeds the request's body object, which its ``after_request`` hook iterates; the
byte limit lives in that body class. What the two could share is the ``move_on_after`` around a loop, so each keeps
its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

Receive = Callable[[], Awaitable[dict[str, Any]]]

# A client that sends no part of its body for this long is answered 408 (asyncdp serve's own bound on reading a
# body is Quart's BODY_TIMEOUT, 60 s for all of it; this one is per part, so a large body on a slow link still gets
# through).
BODY_IDLE_TIMEOUT_S = 60.0


class BodyTooLarge(Exception):
    """The body is over ``max_bytes``."""


class ClientGone(Exception):
    """The client disconnected before its body arrived whole."""


class ClientTooSlow(Exception):
    """The client sent nothing more of its body for ``idle_timeout_s``."""



class RequestBody:
    """One request's body (see the module docstring). ``content_length``: the client's header, if it sent one."""

    def __init__(self, receive: Receive, *, max_bytes: int, replay_bytes: int, content_length: int | None,
                 idle_timeout_s: float = BODY_IDLE_TIMEOUT_S) -> None:
        self._receive = receive
        self.idle_timeout_s = idle_timeout_s
        self.max_bytes = max_bytes
        self.replay_bytes = replay_bytes
        self.content_length = content_length
        self.num_bytes = 0  # received so far
        self.complete = False  # the last body event arrived
        self.is_released = False
        self._released: anyio.Event | None = None  # made only when someone waits (rarely: most bodies are whole)
        self._held: list[bytes] = []
        self._whole: bytes | None = None
        self._pulled = False  # a stream read past the held bytes: they are gone, it cannot be sent again

    @property
    def replayable(self) -> bool:
        return not self._pulled

    async def read_replayable(self) -> None:
        """Read until the body is complete or over ``replay_bytes``; BodyTooLarge, ClientGone, ClientTooSlow."""
        if self.content_length is not None and self.content_length > self.max_bytes:
            raise BodyTooLarge
        while not self.complete and self.num_bytes <= self.replay_bytes:
            self._held.append(await self._next())
        if self.complete:
            self._whole = b"".join(self._held)
            self._held.clear()
            self.release()

    def content(self) -> bytes | _BodyStream:
        """What httpx sends: the whole body, or a stream of it (only once it is not :attr:`replayable`)."""
        return self._whole if self._whole is not None else _BodyStream(self)

    def release(self) -> None:
        """Nothing reads the client's side for the body any more: it is complete, or the endpoint answered."""
        self.is_released = True
        if self._released is not None:
            self._released.set()

    async def wait_released(self) -> None:
        if not self.is_released:
            if self._released is None:
                self._released = anyio.Event()
            await self._released.wait()

    async def drain(self, timeout_s: float) -> None:
        """Read and discard the rest of the body, for up to ``timeout_s`` (a refused body's answer follows)."""
        with anyio.move_on_after(timeout_s):
            while not self.complete:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    break
                self.complete = not message.get("more_body", False)
        self._held.clear()
        self.release()

    async def _next(self) -> bytes:
        message: dict[str, Any] | None = None
        with anyio.move_on_after(self.idle_timeout_s):
            message = await self._receive()
        if message is None:
            raise ClientTooSlow
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk: bytes = message.get("body", b"")
        self.num_bytes += len(chunk)
        self.complete = not message.get("more_body", False)
        if self.num_bytes > self.max_bytes:
            raise BodyTooLarge
        return chunk


class _BodyStream:
    """The body as an async iterator of chunks for httpx: the held bytes, then the rest as it arrives. An iterator
    class, not an async generator, so that one left unfinished (the endpoint answered early) needs no closing."""

    def __init__(self, body: RequestBody) -> None:
        self._body = body
        self._held = deque(body._held)

    def __aiter__(self) -> _BodyStream:
        return self

    async def __anext__(self) -> bytes:
        body = self._body
        if self._held:
            return self._held.popleft()
        if body.complete:
            body.release()
            raise StopAsyncIteration
        if not body._pulled:
            body._pulled = True
            body._held.clear()  # sent, and no longer of use: a body sent in part cannot be sent again
        chunk = await body._next()
        if body.complete:
            body.release()
        return chunk
