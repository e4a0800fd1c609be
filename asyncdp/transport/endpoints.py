"""Where links come from: addresses, connecting, listening and accepting, with the deployment secret's handshake.

Addresses are strings, ``unix:/path`` or ``tcp:host:port``. :func:`listen` binds a fresh Unix path or TCP port 0
(or the user-facing rpc port) and reports the real address; :func:`serve_links` and :class:`LinkListener` hand
each accepted connection to a handler as a :class:`~asyncdp.transport.links.StreamLink`; :func:`connect` and
:func:`connect_with_retry` open one.

With a deployment secret (``secret=``), a link first runs :mod:`asyncdp.transport.link_auth`'s challenge-response:
the connecting side raises :class:`~asyncdp.errors.LinkAuthError` when the peer fails it, the accepting side
(:func:`accept_link`) drops such a peer with one log line before reading any frame. Without one (``None``), links
are unauthenticated. Memory links never are.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteStream

from asyncdp import messages
from asyncdp.transport import link_auth
from asyncdp.transport.links import (
    ACCEPTED_FIRST_FRAME_MAX_BYTES,
    LINK_ERRORS,
    StreamLink,
    frame_bytes,
    remote_of,
)
from asyncdp.transport.socket_stream import link_byte_stream

log = logging.getLogger(__name__)

_TELL_S = 1.0  # a refused asyncdp peer without a secret is told why within this
_TELL_DRAIN_BYTES = 1 << 16


def _parse(addr: str) -> tuple[str, str, int]:
    kind, _, rest = addr.partition(":")
    if kind == "unix" and rest:
        return "unix", rest, 0
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        if host and port.isdigit():
            return "tcp", host.strip("[]"), int(port)
    raise ValueError(f"bad link address {addr!r}: expected unix:/path or tcp:host:port")


async def connect(addr: str, *, name: str | None = None, secret: bytes | None = None) -> StreamLink:
    """A link to the listener at ``addr``. With ``secret``, both sides prove they hold it first
    (:func:`asyncdp.transport.link_auth.prove`: :class:`~asyncdp.errors.LinkAuthError` when the peer does not)."""
    kind, where, port = _parse(addr)
    if kind == "unix":
        stream: anyio.abc.ByteStream = await anyio.connect_unix(where)
    else:
        stream = await anyio.connect_tcp(where, port)
    try:
        if secret is None:
            return StreamLink(await link_byte_stream(stream), name=name or addr)
        buffered = BufferedByteStream(stream)
        await link_auth.prove(buffered, secret, addr)
        return StreamLink(await link_byte_stream(buffered), name=name or addr)
    except BaseException:
        await _close(stream)
        raise


async def accept_link(stream: anyio.abc.ByteStream, *, name: str = "peer", secret: bytes | None = None,
                      refusals: link_auth.RefusalLog | None = None) -> StreamLink | None:
    """An accepted connection as a link whose first frame is small (``ACCEPTED_FIRST_FRAME_MAX_BYTES``). With
    ``secret``: once the peer proved it holds it (:func:`asyncdp.transport.link_auth.verify`); else None, the
    connection closed and the refusal logged through ``refusals`` (the listener's), nothing it sent decoded."""
    if secret is None:
        try:
            return StreamLink(await link_byte_stream(stream), name=name,
                              max_first_frame_bytes=ACCEPTED_FIRST_FRAME_MAX_BYTES)
        except BaseException:
            await _close(stream)
            raise
    remote = remote_of(stream)  # now: a peer that reset its connection has no address any more
    buffered = BufferedByteStream(stream)
    try:
        refusal = await link_auth.verify(buffered, secret)
        if refusal is None:
            return StreamLink(await link_byte_stream(buffered), name=name,
                              max_first_frame_bytes=ACCEPTED_FIRST_FRAME_MAX_BYTES)
        (refusals or link_auth.RefusalLog(name)).note(remote, refusal)
        if refusal.plain_frame:  # an asyncdp peer without a secret: it reads why (the one message every version does)
            await _tell(buffered, messages.HandshakeError(
                reason=f"this deployment's links need its secret: {link_auth.SET_THE_SECRET}"))
    except BaseException:
        await _close(stream)
        raise
    await _close(stream)
    return None


async def _tell(stream: BufferedByteStream, msg: messages.Message) -> None:
    """Send ``msg`` as the link's one frame, then end the link so that the peer reads it: half-close, and discard
    what the peer sent (closing a socket with unread bytes resets it, and the frame is lost) until it closes too,
    at most ``_TELL_DRAIN_BYTES`` within ``_TELL_S``."""
    with anyio.move_on_after(_TELL_S):
        try:
            await stream.send(frame_bytes(msg))
            await stream.send_eof()
            drained = 0
            while drained < _TELL_DRAIN_BYTES:
                drained += len(await stream.receive())
        except (*LINK_ERRORS, anyio.IncompleteRead):
            pass


async def _close(stream: anyio.abc.ByteStream) -> None:
    with anyio.CancelScope(shield=True):
        try:
            await stream.aclose()
        except (anyio.BrokenResourceError, OSError):
            pass


async def connect_with_retry(
    addr: str,
    *,
    timeout_s: float,
    what: str,
    retry_interval_s: float = 0.05,
    log_every_s: float = 10.0,
    secret: bytes | None = None,
) -> StreamLink:
    """Connect, retrying while the peer is not listening yet; log progress every ``log_every_s``. A peer that
    fails the secret handshake is no retry: :class:`~asyncdp.errors.LinkAuthError` at once."""
    start = anyio.current_time()
    next_log = start + log_every_s
    with anyio.fail_after(timeout_s):
        while True:
            try:
                return await connect(addr, secret=secret)
            except OSError:
                now = anyio.current_time()
                if now >= next_log:
                    log.info("waiting for %s at %s (%.0f s)", what, addr, now - start)
                    next_log = now + log_every_s
                await anyio.sleep(retry_interval_s)


async def listen(
    kind: str, *, host: str = "127.0.0.1", port: int = 0, directory: str | None = None, prefix: str = "asyncdp"
) -> tuple[anyio.abc.Listener[anyio.abc.SocketStream], str]:
    """Bind a fresh listener (``kind`` is "unix" or "tcp") and return it with its real address.

    TCP binds ``port`` 0 (the kernel picks) unless the port is user-facing (``--data-parallel-rpc-port``); a
    busy port raises :class:`OSError` as the socket layer reports it."""
    if kind == "unix":
        directory = directory or tempfile.gettempdir()
        fd, path = tempfile.mkstemp(prefix=f"{prefix}-", suffix=".sock", dir=directory)
        os.close(fd)
        os.unlink(path)
        listener = await anyio.create_unix_listener(path)
        return listener, f"unix:{path}"
    if kind == "tcp":
        multi = await anyio.create_tcp_listener(local_host=host, local_port=port)
        # One address, one socket: the plain listener (it has accept(), which the engine links' reader uses).
        tcp = multi.listeners[0] if len(multi.listeners) == 1 else multi
        sockname = tcp.extra(anyio.abc.SocketAttribute.local_address)
        host_part = f"[{sockname[0]}]" if ":" in str(sockname[0]) else sockname[0]
        return tcp, f"tcp:{host_part}:{sockname[1]}"
    raise ValueError(f"unknown listener kind {kind!r}")


async def serve_links(
    listener: anyio.abc.Listener[anyio.abc.SocketStream],
    handler: Callable[[StreamLink], Any],
    *,
    name: str = "peer",
    secret: bytes | None = None,
) -> None:
    """Accept connections forever, running ``handler(link)`` for each in the listener's task group; with
    ``secret``, only for those whose peer proved it holds it (:func:`accept_link`)."""
    refusals = link_auth.RefusalLog(name)

    async def wrap(stream: anyio.abc.SocketStream) -> None:
        link = await accept_link(stream, name=name, secret=secret, refusals=refusals)
        if link is None:
            return
        try:
            await handler(link)
        finally:
            await link.aclose()

    async with listener:  # the listener belongs to this task: closed on cancellation too
        await listener.serve(wrap)


class LinkListener:
    """An anyio socket listener that hands out :class:`StreamLink` objects (``serve(handler)``)."""

    def __init__(self, listener: anyio.abc.Listener[anyio.abc.SocketStream], addr: str, *, name: str = "peer",
                 secret: bytes | None = None) -> None:
        self.listener = listener
        self.addr = addr
        self.name = name
        self.secret = secret

    async def serve(self, handler: Callable[[StreamLink], Any]) -> None:
        await serve_links(self.listener, handler, name=self.name, secret=self.secret)

    async def aclose(self) -> None:
        await self.listener.aclose()


async def listen_links(kind: str, *, name: str = "peer", secret: bytes | None = None, **kwargs: Any) -> LinkListener:
    listener, addr = await listen(kind, **kwargs)
    return LinkListener(listener, addr, name=name, secret=secret)
