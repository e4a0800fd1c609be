"""Links over Unix sockets on asyncio read their socket through an asyncio protocol that stays registered
(``asyncdp.transport.socket_stream``), instead of anyio's stream, which registered and unregistered the socket
around every wait and formatted the socket's ``repr`` (two system calls) for a ``KeyError`` that asyncio dropped.
The stream keeps the semantics of anyio's socket streams: what the tests below check, on both backends where the
check is the link's, on asyncio where it is the stream's."""

from __future__ import annotations

import socket

import anyio
import anyio.abc
import pytest

from asyncdp import messages
from asyncdp.transport import StreamLink, accept_link, connect, listen
from asyncdp.transport.socket_stream import READ_LIMIT, LinkSocketStream, link_byte_stream


async def _link_pair(tmp_path, secret: bytes | None = None) -> tuple[StreamLink, StreamLink]:
    """Two ends of one link over a Unix socket, made as the deployment makes them (connect / accept_link)."""
    listener, addr = await listen("unix", directory=str(tmp_path))
    async with listener, anyio.create_task_group() as tg:
        accepted: list[StreamLink | None] = []

        async def accept() -> None:
            stream = await listener.accept()  # type: ignore[attr-defined]
            accepted.append(await accept_link(stream, secret=secret))

        tg.start_soon(accept)
        near = await connect(addr, secret=secret)
    far = accepted[0]
    assert far is not None
    return near, far


async def _stream_pair() -> tuple[anyio.abc.ByteStream, anyio.abc.ByteStream]:
    a, b = socket.socketpair(socket.AF_UNIX)
    return (await link_byte_stream(await anyio.abc.UNIXSocketStream.from_socket(a)),
            await link_byte_stream(await anyio.abc.UNIXSocketStream.from_socket(b)))


@pytest.mark.anyio
@pytest.mark.parametrize("secret", [None, b"s" * 32])
async def test_frames_over_a_link_format_no_socket_repr(tmp_path, monkeypatch, anyio_backend, secret):
    reprs = []
    real_repr = socket.socket.__repr__
    near, far = await _link_pair(tmp_path, secret)
    monkeypatch.setattr(socket.socket, "__repr__", lambda self: reprs.append(1) or real_repr(self))
    beats = [messages.Heartbeat(sender="e0", seq=i) for i in range(20)]

    async def echo() -> None:
        async for msg in far:
            await far.send(msg)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(echo)
            for beat in beats:  # one at a time: every receive, here and in the echo, waits for its socket
                await anyio.wait_all_tasks_blocked()
                await near.send(beat)
                assert await near.receive() == beat
            tg.cancel_scope.cancel()
    await near.aclose()
    await far.aclose()
    if anyio_backend == "asyncio":
        assert len(reprs) == 0  # anyio's stream formatted two per wait
        assert isinstance(near._stream, LinkSocketStream) and isinstance(far._stream, LinkSocketStream)
    # trio's streams are anyio's own, and never formatted one either


@pytest.mark.anyio
async def test_the_peer_closing_ends_the_link_after_what_it_sent(tmp_path, anyio_backend):
    near, far = await _link_pair(tmp_path)
    beats = [messages.Heartbeat(sender="e0", seq=i) for i in range(5)]
    for beat in beats:
        await near.send(beat)
    await near.aclose()
    with anyio.fail_after(10):
        assert [msg async for msg in far] == beats
    await far.aclose()


@pytest.mark.anyio
async def test_a_frame_larger_than_the_read_limit_arrives_whole(tmp_path, anyio_backend):
    near, far = await _link_pair(tmp_path)
    big = messages.UtilityResult(call_id=1, ok=True, value="x" * (3 * READ_LIMIT))
    got: list[messages.Message] = []
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            async def read() -> None:
                for _ in range(3):
                    got.append(await far.receive())

            tg.start_soon(read)
            await near.send(messages.Heartbeat(sender="e0", seq=0))  # (an accepted link's first frame is small)
            await near.send(big)  # more than the kernel holds: returns once the reader has taken enough of it
            await near.send(messages.Heartbeat(sender="e0", seq=1))
    assert got == [messages.Heartbeat(sender="e0", seq=0), big, messages.Heartbeat(sender="e0", seq=1)]
    await near.aclose()
    await far.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_closing_wakes_a_receive_waiting_in_another_task(anyio_backend):
    a, b = await _stream_pair()
    assert isinstance(a, LinkSocketStream)
    caught: list[BaseException] = []

    async def receive() -> None:
        try:
            await a.receive()
        except anyio.ClosedResourceError as exc:
            caught.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(receive)
            await anyio.wait_all_tasks_blocked()
            await a.aclose()
    assert len(caught) == 1
    with pytest.raises(anyio.ClosedResourceError):
        await a.send(b"x")
    await b.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_cancelled_receive_loses_nothing_and_a_second_receiver_is_refused(anyio_backend):
    a, b = await _stream_pair()
    with anyio.move_on_after(0.05):
        await a.receive()
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.receive)
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(anyio.BusyResourceError):
            await a.receive()
        await b.send(b"hello")
    await b.send(b"more")
    with anyio.fail_after(5):
        assert await a.receive(2) == b"mo"
        assert await a.receive() == b"re"
    await b.aclose()
    with anyio.fail_after(5), pytest.raises(anyio.EndOfStream):
        await a.receive()
    with pytest.raises(anyio.ClosedResourceError):
        await b.receive()
    await a.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_send_to_a_peer_that_is_gone_is_a_broken_resource(anyio_backend):
    a, b = await _stream_pair()
    await b.aclose()
    with anyio.fail_after(5), pytest.raises(anyio.BrokenResourceError):
        for _ in range(100):  # the first write may still reach the kernel before the peer's end is known
            await a.send(b"x" * 1024)
    await a.aclose()


@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.anyio
async def test_on_trio_a_stream_is_left_as_anyio_made_it(anyio_backend):
    a, b = socket.socketpair(socket.AF_UNIX)
    stream = await anyio.abc.UNIXSocketStream.from_socket(a)
    assert await link_byte_stream(stream) is stream
    await stream.aclose()
    b.close()
