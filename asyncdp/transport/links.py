"""Links: length-prefixed msgpack frames over a byte stream, or objects over memory streams.

Frame layout: a 4-byte big-endian payload length, then the payload (``asyncdp.messages.encode``). A send lock
keeps concurrent senders from interleaving frames. A first frame that is not this build's (a length no frame has,
as the ASCII of an HTTP answer gives, or a payload this codec cannot decode) is a
:class:`~asyncdp.errors.ForeignPeerError`: the address names another service, or an asyncdp of another version.
The first frame of an accepted link (anyone on the network may have connected) is at most
``ACCEPTED_FIRST_FRAME_MAX_BYTES``; once the framing is lost (that error, or a frame over ``MAX_FRAME_BYTES``) the
link reads nothing more: its next receive is ``EndOfStream``. ``MemoryLink`` passes message objects through anyio memory
object streams; by default it still round-trips them through the codec so in-process tests exercise the wire
format (``codec=False`` skips that for the simulation harness). Connecting and listening:
:mod:`asyncdp.transport.endpoints` (which runs the deployment secret's handshake before a stream link exists).
"""

from __future__ import annotations

import logging
import struct
from typing import Any

import anyio
import anyio.abc

from asyncdp import messages
from asyncdp.errors import ForeignPeerError, ProtocolError
from asyncdp.transport import link_auth

# What a link operation raises once the peer is gone (closed, reset, or ended); handlers treat them alike.
LINK_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 256 << 20
# The first frame of an accepted link (Hello, NodeHello, EngineReady, Subscribe: a few KiB at most). Until it is
# read the peer may be anyone on the network: it may not make the listener buffer MAX_FRAME_BYTES per connection.
ACCEPTED_FIRST_FRAME_MAX_BYTES = 1 << 20
FOREIGN_PEEK_S = 0.5  # how long a first frame of no asyncdp peer waits for more of its answer, to quote it
FOREIGN_PEEK_BYTES = 64
_READ_CHUNK = 64 << 10  # what one read of a link's stream asks for (a frame longer than that: its remaining size)


class Link:
    """One end of an ordered, reliable, duplex message link."""

    name: str

    @property
    def remote(self) -> str:
        """Who is at the other end, for a log line that names a peer to drop: the link's name here."""
        return self.name

    async def send(self, msg: messages.Message) -> None:
        raise NotImplementedError

    async def receive(self) -> messages.Message:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Link:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> Link:
        return self

    async def __anext__(self) -> messages.Message:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise StopAsyncIteration from None


class StreamLink(Link):
    """``max_first_frame_bytes``: the longest first frame (an accepted link's is small:
    ``ACCEPTED_FIRST_FRAME_MAX_BYTES``). Once the framing is lost (a foreign first frame, a frame over its limit)
    the receive that found it raises, and every later one raises ``EndOfStream``: the rest is no frames. A
    ``BufferedByteStream`` (one that ran the secret handshake) is read on where that left off."""

    def __init__(self, stream: anyio.abc.ByteStream, *, name: str = "link",
                 max_first_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.name = name
        self._stream = stream
        self._buffer = bytearray()  # bytes read and not yet returned as frames (a partial frame, or several)
        self._first = True  # no frame received yet: a bad one means a foreign peer, not a garbled frame
        self._max_first = max_first_frame_bytes
        self._lost = False  # the framing is lost: nothing more is read
        self._remote = remote_of(stream)  # now: a peer that reset its connection has no address any more
        # An uncontended send takes the lock without a scheduling point of its own (acquire_nowait; fast_acquire
        # for the same in acquire): the stream write right after is a checkpoint anyway.
        self._send_lock = anyio.Lock(fast_acquire=True)

    @property
    def remote(self) -> str:
        return self._remote

    async def send(self, msg: messages.Message) -> None:
        payload = messages.encode(msg)
        lock = self._send_lock
        try:  # uncontended: taken at once (the stream's send is the scheduling point)
            lock.acquire_nowait()
        except anyio.WouldBlock:
            await lock.acquire()
        try:
            await self._stream.send(_HEADER.pack(len(payload)) + payload)
        finally:
            lock.release()

    async def receive(self) -> messages.Message:
        """The next frame. Cancellation-safe: a receive cancelled part way (a liveness deadline) loses nothing,
        and the next one goes on where it stopped (what was read stays in the buffer until a whole frame is there).

        The stream is read in chunks of up to ``_READ_CHUNK`` bytes (more for a longer frame): one read usually
        brings a whole frame, header and payload, or several, which the next receives return without reading."""
        if self._lost:
            raise anyio.EndOfStream
        buf = self._buffer
        while len(buf) < _HEADER.size:
            await self._read_more(_HEADER.size - len(buf))
        (size,) = _HEADER.unpack_from(buf)
        if size > (self._max_first if self._first else MAX_FRAME_BYTES):
            self._lost = True
            if self._first:
                header = bytes(buf[:_HEADER.size])
                seen = link_auth.UNEXPECTED_HELLO if header == link_auth.MAGIC[:_HEADER.size] else \
                    link_auth.quote_sent(header + await self._more_of_a_foreign_answer(), 40)
                raise ForeignPeerError(self.name, seen, other_version=False,
                                       protocol_version=messages.PROTOCOL_VERSION)
            raise ProtocolError(f"{self.name}: frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
        end = _HEADER.size + size
        while len(buf) < end:
            await self._read_more(end - len(buf))
        payload = bytes(memoryview(buf)[_HEADER.size:end])
        del buf[:end]
        if not self._first:
            return messages.decode(payload)
        self._first = False
        try:
            return messages.decode(payload)
        except ProtocolError as exc:
            self._lost = True
            tagged = messages.describe_tagged(payload)
            seen = f"{tagged} this build cannot decode: {exc}" if tagged else link_auth.quote_sent(payload, 40)
            raise ForeignPeerError(self.name, seen, other_version=tagged is not None,
                                   protocol_version=messages.PROTOCOL_VERSION) from None

    async def _read_more(self, missing: int) -> None:
        """Append what the stream has (at least one byte, at most ``max(missing, _READ_CHUNK)``) to the buffer;
        ``EndOfStream`` once the peer is gone (a frame cut short included)."""
        try:
            chunk = await self._stream.receive(max(missing, _READ_CHUNK))
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            raise anyio.EndOfStream from None
        self._buffer += chunk

    async def _more_of_a_foreign_answer(self) -> bytes:
        """What a foreign peer sent after its first four bytes, for the log line that names it: what is buffered,
        or else what arrives within a moment (the rest of an HTTP status line, say)."""
        if len(self._buffer) > _HEADER.size:
            return bytes(self._buffer[_HEADER.size:])
        with anyio.move_on_after(FOREIGN_PEEK_S):
            try:
                return await self._stream.receive(FOREIGN_PEEK_BYTES)
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                pass
        return b""

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self._stream.aclose()
            except (anyio.BrokenResourceError, OSError):
                pass


class Frames:
    """A link's frames until it ends: ``await frames.next()`` is the next message, or None once the link ended (EOF,
    broken, closed). A frame this build cannot decode (an unknown type, a malformed field) is dropped (spec §5.1):
    the first of a link logged at WARNING as ``who``'s, later ones at DEBUG, so a broken peer cannot flood the log;
    once the framing is lost the link ends. Cancellation-safe, as ``receive`` is."""

    def __init__(self, link: Link, who: str) -> None:
        self._link = link
        self._who = who
        self.num_dropped = 0

    async def next(self) -> messages.Message | None:
        while True:
            try:
                return await self._link.receive()
            except ProtocolError as exc:
                self.num_dropped += 1
                first = self.num_dropped == 1
                log.log(logging.WARNING if first else logging.DEBUG, "%s: dropped bad frame %d (%s)%s", self._who,
                        self.num_dropped, exc, "; later ones are logged at DEBUG" if first else "")
            except LINK_ERRORS:
                return None


def frame_bytes(msg: messages.Message) -> bytes:
    """``msg`` as one frame on the wire (for a reply written before a link exists)."""
    payload = messages.encode(msg)
    return _HEADER.pack(len(payload)) + payload


def remote_of(stream: anyio.abc.ByteStream) -> str:
    """The peer's TCP address (``host:port``), for log lines; a Unix socket's peer has none."""
    try:
        addr = stream.extra(anyio.abc.SocketAttribute.remote_address)
    except (anyio.TypedAttributeLookupError, OSError):
        return "an unknown address"
    if isinstance(addr, tuple):
        return f"[{addr[0]}]:{addr[1]}" if ":" in str(addr[0]) else f"{addr[0]}:{addr[1]}"
    return "a local process"


class MemoryLink(Link):
    def __init__(
        self,
        send: anyio.abc.ObjectSendStream[Any],
        receive: anyio.abc.ObjectReceiveStream[Any],
        *,
        name: str = "memory",
        codec: bool = True,
    ) -> None:
        self.name = name
        self._send = send
        self._receive = receive
        self._codec = codec

    async def send(self, msg: messages.Message) -> None:
        try:
            await self._send.send(messages.encode(msg) if self._codec else msg)
        except anyio.ClosedResourceError:
            raise anyio.BrokenResourceError from None

    async def receive(self) -> messages.Message:
        try:
            item = await self._receive.receive()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise anyio.EndOfStream from None
        return messages.decode(item) if self._codec else item

    async def aclose(self) -> None:
        await self._send.aclose()
        await self._receive.aclose()


def memory_link_pair(*, max_buffer: int = 1024, codec: bool = True, name: str = "memory") -> tuple[MemoryLink, MemoryLink]:
    """Two connected in-memory link ends."""
    a_send, b_recv = anyio.create_memory_object_stream[Any](max_buffer)
    b_send, a_recv = anyio.create_memory_object_stream[Any](max_buffer)
    return (
        MemoryLink(a_send, a_recv, name=f"{name}:a", codec=codec),
        MemoryLink(b_send, b_recv, name=f"{name}:b", codec=codec),
    )
