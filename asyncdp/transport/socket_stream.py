"""A link's Unix socket on the asyncio backend, read by an asyncio protocol that keeps the socket registered.

Why. anyio's asyncio backend reads a Unix socket stream with ``recv`` until it would block, then registers the
socket with the selector for that one wait (``loop.add_reader``) and unregisters it when the wait ends. Each such
wait costs two ``epoll_ctl`` calls, a future, and, in the selector's lookup of a socket not registered yet, two
``KeyError`` messages that format the socket's ``repr`` (``getsockname`` and ``getpeername``: two system calls
each) and are caught and dropped by asyncio. A link waits for its socket after nearly every frame, so this was
about a tenth of an engine's CPU on a zero-cost model.

What. :func:`link_byte_stream` hands such a stream's socket to an asyncio transport (``connect_accepted_socket``)
with :class:`_LinkProtocol`, which stays registered for reading for the life of the link and buffers what arrives
until a receive takes it (at most ``READ_LIMIT`` bytes: then the transport pauses reading until the buffer is
taken below it, so a peer that sends faster than the link reads is held back by the kernel, as before). Any other
stream (trio's, a TCP stream, which anyio's asyncio backend already reads through a transport, a memory stream) is
returned as it is.

Semantics kept from anyio's socket streams: ``receive`` returns between 1 and ``max_bytes`` bytes, raises
``EndOfStream`` once the peer ended and everything before was read, ``BrokenResourceError`` when the connection
broke, ``ClosedResourceError`` after ``aclose`` (a receive waiting in another task wakes up with it); a receive
cancelled while waiting loses nothing. ``send`` hands the whole item to the kernel before it returns (the
transport's write buffer has a high-water mark of 0, as anyio sets it for TCP): a send cancelled while the kernel's
buffer is full leaves the item queued whole, so a cancelled send never cuts a frame. As anyio's Unix socket stream
does, ``send`` is a scheduling point before it writes (a cancellation there sends nothing). ``aclose`` aborts the
transport. Extra attributes are the socket's (``SocketAttribute``).
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from typing import cast

import anyio
import anyio.abc
import anyio.lowlevel
import sniffio
from anyio.streams.buffered import BufferedByteStream

READ_LIMIT = 1 << 20  # bytes buffered before the transport stops reading (until the link takes them below it)
RECV_BYTES = 64 << 10  # what one read of the socket asks for


class _LinkProtocol(asyncio.BufferedProtocol):
    """What the transport reads, as chunks for :class:`LinkSocketStream`; wakes its one waiting receive. The
    transport reads into one reused buffer of ``RECV_BYTES`` (a plain protocol gets a fresh 256 KiB bytes object
    per read, which the allocator maps and unmaps: system time per frame)."""

    def __init__(self, initial: bytes) -> None:
        self._recv_view = memoryview(bytearray(RECV_BYTES))
        self.chunks: deque[bytes] = deque([initial] if initial else ())
        self.size = len(initial)
        self.transport: asyncio.Transport | None = None
        self.eof = False
        self.lost = False
        self.exception: BaseException | None = None
        self.reading_paused = False
        self.writing_paused = False
        self.read_waiter: asyncio.Future[None] | None = None
        self.write_waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(0)  # a send returns once the kernel has it all
        if self.size >= READ_LIMIT:
            self.pause_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._recv_view

    def buffer_updated(self, nbytes: int) -> None:
        self.chunks.append(bytes(self._recv_view[:nbytes]))
        self.size += nbytes
        if self.size >= READ_LIMIT:
            self.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake_reader()
        return True  # half-closed: the link may still send (anyio's streams keep it open too)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.exception = exc
        self._wake_reader()
        self._wake_writer()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake_writer()

    def pause_reading(self) -> None:
        if not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and self.transport is not None and not self.transport.is_closing():
            self.reading_paused = False
            self.transport.resume_reading()

    def _wake_reader(self) -> None:
        waiter = self.read_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_writer(self) -> None:
        waiter = self.write_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class LinkSocketStream(anyio.abc.SocketStream):
    """A connected stream socket read and written through an asyncio transport (see the module docstring)."""

    def __init__(self, sock: socket.socket, transport: asyncio.Transport, protocol: _LinkProtocol) -> None:
        self._sock = sock
        self._transport = transport
        self._protocol = protocol
        self._closed = False

    @property
    def _raw_socket(self) -> socket.socket:
        return self._sock

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if max_bytes < 1:
            raise ValueError("max_bytes must be a positive integer")
        if self._closed:
            raise anyio.ClosedResourceError
        protocol = self._protocol
        chunks = protocol.chunks
        while not chunks:
            self._check_receivable()
            if protocol.read_waiter is not None and not protocol.read_waiter.done():
                raise anyio.BusyResourceError("reading from")
            waiter = protocol.read_waiter = asyncio.get_running_loop().create_future()
            await waiter
        chunk = chunks.popleft()
        if len(chunk) > max_bytes:
            chunks.appendleft(chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        protocol.size -= len(chunk)
        if protocol.reading_paused and protocol.size < READ_LIMIT:
            protocol.resume_reading()
        return chunk

    def _check_receivable(self) -> None:
        """Raise what an empty buffer means when no more bytes can come."""
        if self._closed:
            raise anyio.ClosedResourceError
        protocol = self._protocol
        if protocol.exception is not None:
            raise anyio.BrokenResourceError from protocol.exception
        if protocol.eof or protocol.lost:
            raise anyio.EndOfStream

    async def send(self, item: bytes) -> None:
        await anyio.lowlevel.checkpoint()  # first, as anyio's Unix socket stream: a cancelled send wrote nothing
        self._check_sendable()
        protocol = self._protocol
        self._transport.write(item)
        while protocol.writing_paused and not protocol.lost:  # the kernel's buffer is full: until it took it all
            if protocol.write_waiter is not None and not protocol.write_waiter.done():
                raise anyio.BusyResourceError("writing to")
            waiter = protocol.write_waiter = asyncio.get_running_loop().create_future()
            await waiter
        if self._closed:
            raise anyio.ClosedResourceError
        if protocol.lost or self._transport.is_closing():  # the write failed: the transport is closing itself
            raise anyio.BrokenResourceError from protocol.exception

    def _check_sendable(self) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        if self._protocol.lost or self._transport.is_closing():
            raise anyio.BrokenResourceError from self._protocol.exception

    async def send_eof(self) -> None:
        if self._transport.can_write_eof() and not self._transport.is_closing():
            self._transport.write_eof()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._transport.abort()
            self._protocol._wake_reader()
            self._protocol._wake_writer()
        await anyio.lowlevel.checkpoint()


async def link_byte_stream(stream: anyio.abc.ByteStream) -> anyio.abc.ByteStream:
    """``stream`` as a link should read it: on asyncio, a Unix socket stream of anyio's (or a
    ``BufferedByteStream`` over one, after the secret handshake, with what it holds unread) becomes a
    :class:`LinkSocketStream` over the same socket; anything else is returned unchanged."""
    if sniffio.current_async_library() != "asyncio":
        return stream
    inner = stream.receive_stream if isinstance(stream, BufferedByteStream) else stream
    if not isinstance(inner, anyio.abc.UNIXSocketStream) or isinstance(inner, LinkSocketStream):
        return stream
    sock = inner.extra(anyio.abc.SocketAttribute.raw_socket)
    unread = stream.buffer if isinstance(stream, BufferedByteStream) else b""
    protocol = _LinkProtocol(unread)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock=sock)
    return LinkSocketStream(sock, transport, protocol)
