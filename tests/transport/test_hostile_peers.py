"""Strangers on a listener's links, over real sockets on 127.0.0.1: once the framing is lost (a first frame that is
no asyncdp frame, a frame longer than any frame) the link ends instead of reading the rest of the stranger's bytes
as more frames; the first frame of an accepted link is small (no peer's first message is near a megabyte), so a
stranger cannot make a listener buffer 256 MiB per connection; the coordinator drops such a stranger with one
line; and a node link drops a bad frame, not itself."""

from __future__ import annotations

import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

from asyncdp import messages
from asyncdp.coordinator.core import CoordinatorConfig, serve_coordinator
from asyncdp.errors import ForeignPeerError, ProtocolError
from asyncdp.transport import StreamLink, listen, listen_links, serve_links
from asyncdp.transport.heartbeat import keep_link
from asyncdp.transport.links import ACCEPTED_FIRST_FRAME_MAX_BYTES, MAX_FRAME_BYTES, MemoryLink


def _frame(msg: messages.Message) -> bytes:
    payload = messages.encode(msg)
    return struct.pack(">I", len(payload)) + payload


async def _connect(addr: str) -> anyio.abc.SocketStream:
    host, port = addr.removeprefix("tcp:").rsplit(":", 1)
    return await anyio.connect_tcp(host, int(port))


@asynccontextmanager
async def _accepted(handler: Callable[[StreamLink], Awaitable[None]]) -> AsyncIterator[str]:
    """A TCP listener on 127.0.0.1 port 0 serving ``handler`` for each accepted link; yields its address."""
    listener, addr = await listen("tcp", host="127.0.0.1")
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_links, listener, handler)
        yield addr
        tg.cancel_scope.cancel()


async def _receives(link: StreamLink, raised: list[BaseException], done: anyio.Event) -> None:
    """Receive until the link ends, noting every error; three errors are enough to tell."""
    try:
        while len(raised) < 3:
            try:
                await link.receive()
            except ProtocolError as exc:
                raised.append(exc)
    except anyio.EndOfStream as exc:
        raised.append(exc)
    finally:
        done.set()


@pytest.mark.anyio
@pytest.mark.parametrize("garbage", [b"\xff\xff\xff\xff" * 64, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n" * 8],
                         ids=["huge_lengths", "http"])
async def test_a_link_whose_first_frame_is_foreign_ends_instead_of_reading_on(garbage):
    raised: list[BaseException] = []
    done = anyio.Event()
    async with _accepted(lambda link: _receives(link, raised, done)) as addr, await _connect(addr) as stream:
        await stream.send(garbage)
        with anyio.fail_after(5):
            await done.wait()
    assert [type(e) for e in raised] == [ForeignPeerError, anyio.EndOfStream]


@pytest.mark.anyio
async def test_a_frame_longer_than_any_frame_ends_the_link_after_one_protocol_error():
    raised: list[BaseException] = []
    done = anyio.Event()
    async with _accepted(lambda link: _receives(link, raised, done)) as addr, await _connect(addr) as stream:
        await stream.send(_frame(messages.Heartbeat(sender="x", seq=1))
                          + struct.pack(">I", MAX_FRAME_BYTES + 1) + b"\xff" * 64)
        with anyio.fail_after(5):
            await done.wait()
    assert [type(e) for e in raised] == [ProtocolError, anyio.EndOfStream]
    assert "exceeds" in str(raised[0])


@pytest.mark.anyio
async def test_a_bad_frame_that_keeps_the_framing_is_only_that_frame():
    """An unknown type or a malformed field after the first frame is one ProtocolError; the next frame is read."""
    got: list[object] = []
    done = anyio.Event()

    async def handler(link: StreamLink) -> None:
        for _ in range(3):
            try:
                got.append(await link.receive())
            except ProtocolError as exc:
                got.append(type(exc))
        done.set()

    unknown = b"\x81\xa4type\xa7Unknown"
    async with _accepted(handler) as addr, await _connect(addr) as stream:
        beat = messages.Heartbeat(sender="x", seq=1)
        await stream.send(_frame(beat) + struct.pack(">I", len(unknown)) + unknown + _frame(beat))
        with anyio.fail_after(5):
            await done.wait()
    assert got == [messages.Heartbeat(sender="x", seq=1), ProtocolError, messages.Heartbeat(sender="x", seq=1)]


@pytest.mark.anyio
async def test_an_accepted_links_first_frame_over_a_megabyte_is_refused_before_its_payload_is_read():
    raised: list[BaseException] = []
    done = anyio.Event()
    async with _accepted(lambda link: _receives(link, raised, done)) as addr, await _connect(addr) as stream:
        await stream.send(struct.pack(">I", ACCEPTED_FIRST_FRAME_MAX_BYTES + 1) + b"\x82" * 16)  # no payload
        with anyio.fail_after(5):
            await done.wait()
    assert [type(e) for e in raised] == [ForeignPeerError, anyio.EndOfStream]


@pytest.mark.anyio
async def test_the_coordinator_drops_a_stranger_sending_garbage_with_one_line(tmp_path, caplog):
    """It used to log a line per four bytes of garbage and, each counting as heard, keep the stranger for ever."""
    engines = await listen_links("tcp", host="127.0.0.1", name="engine")
    clients = await listen_links("unix", directory=str(tmp_path), name="client")
    config = CoordinatorConfig(dp_size=2, wave_mode=False)
    async with anyio.create_task_group() as tg:
        await tg.start(serve_coordinator, config, engines, clients)
        async with await _connect(engines.addr) as stream:
            await stream.send(b"\xff\xff\xff\xff" * 500)
            with anyio.fail_after(3), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                while True:  # (the coordinator closes it well inside its 5 s heartbeat timeout; a reset when
                    await stream.receive()  # it closes with the rest of the garbage unread)
        tg.cancel_scope.cancel()
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "not an asyncdp peer" in lines[0].getMessage()
    assert "engine link from 127.0.0.1:" in lines[0].getMessage()  # who it was


@pytest.mark.anyio
async def test_a_coordinator_client_sending_bad_frames_is_logged_once_and_kept(tmp_path, caplog):
    """Anyone may subscribe as a client; its frames of unknown type are dropped (spec §5.1), the first logged at
    WARNING and the rest at DEBUG: it used to be a warning per frame, a log flood from one connection."""
    engines = await listen_links("unix", directory=str(tmp_path), name="engine")
    clients = await listen_links("tcp", host="127.0.0.1", name="client")
    config = CoordinatorConfig(dp_size=2, wave_mode=False)
    unknown = b"\x81\xa4type\xa7Unknown"
    async with anyio.create_task_group() as tg:
        await tg.start(serve_coordinator, config, engines, clients)
        async with await _connect(clients.addr) as stream:
            await stream.send(_frame(messages.Subscribe(client_id=5)) + (struct.pack(">I", len(unknown)) + unknown) * 50)
            with anyio.fail_after(5):  # the welcome snapshot, then the heartbeat: it is still served
                while b"Heartbeat" not in await stream.receive():
                    pass
        tg.cancel_scope.cancel()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "Unknown" in lines[0], lines


@pytest.mark.trio
async def test_a_bad_frame_on_a_node_link_is_dropped_and_the_link_kept(autojump_clock, caplog):
    """A node link (spec §5.7) carrying one frame this build cannot decode: the frame is logged and dropped (spec
    §5.1), and the link is followed on until it ends. The ProtocolError used to end the head's node-link handler
    by exception, past the code that marks the node gone, so the book kept a dead node 'alive' and refused the
    node restarted in its place."""
    to_head, from_node = anyio.create_memory_object_stream[bytes](16)
    to_node, from_head = anyio.create_memory_object_stream[bytes](16)
    head_end = MemoryLink(to_node, from_node, name="node link")
    seen: list[messages.Message] = []
    stopping = messages.NodeStopping(reason="a signal", shutdown_timeout=5.0)
    async with anyio.create_task_group() as tg:
        async def node() -> None:
            for frame in (b"\xc1", b"\x81\xa4type\xa7Unknown", messages.encode(stopping)):
                await to_head.send(frame)
            await to_head.aclose()

        tg.start_soon(node)
        with anyio.fail_after(5):
            why = await keep_link(head_end, seen.append, interval_s=1.0, timeout_s=5.0, sender="head")
    await head_end.aclose()
    await from_head.aclose()
    assert why == "closed" and seen == [stopping]
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "node link" in lines[0] and "undecodable" in lines[0]
