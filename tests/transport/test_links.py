import struct

import anyio
import anyio.abc
import pytest

from asyncdp import messages
from asyncdp.errors import ForeignPeerError, ProtocolError
from asyncdp.transport import connect, listen, memory_link_pair, serve_links


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["unix", "tcp"])
async def test_messages_round_trip_over_sockets_in_order(kind, tmp_path):
    listener, addr = await listen(kind, directory=str(tmp_path))
    received: list[messages.Message] = []
    done = anyio.Event()

    async def handler(link):
        async for msg in link:
            received.append(msg)
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_links, listener, handler)
        link = await connect(addr)
        sent = [messages.Heartbeat(sender="e0", seq=i) for i in range(50)]
        sent.append(messages.StatsSnapshot(counts=[(1, 2, 0.5)], wave=3, running=True, seq=9))
        for msg in sent:
            await link.send(msg)
        await link.aclose()
        with anyio.fail_after(5):
            await done.wait()
        tg.cancel_scope.cancel()
    assert received == sent


@pytest.mark.anyio
async def test_unknown_frame_type_raises_protocol_error(tmp_path):
    listener, addr = await listen("unix", directory=str(tmp_path))
    errors: list[Exception] = []
    done = anyio.Event()

    async def handler(link):
        try:
            await link.receive()
        except ProtocolError as exc:
            errors.append(exc)
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_links, listener, handler)
        stream = await anyio.connect_unix(addr.removeprefix("unix:"))
        payload = b"\x81\xa4type\xa7Unknown"
        await stream.send(struct.pack(">I", len(payload)) + payload)
        with anyio.fail_after(5):
            await done.wait()
        await stream.aclose()
        tg.cancel_scope.cancel()
    assert errors and "Unknown" in str(errors[0])


@pytest.mark.anyio
async def test_memory_link_reports_end_of_stream_after_peer_closes():
    a, b = memory_link_pair()
    await a.send(messages.Goodbye(dp_rank=1))
    await a.aclose()
    assert await b.receive() == messages.Goodbye(dp_rank=1)
    with pytest.raises(anyio.EndOfStream):
        await b.receive()
    await b.aclose()


@pytest.mark.anyio
async def test_a_receive_cancelled_between_a_frames_header_and_payload_loses_nothing(tmp_path):
    """A liveness deadline may cancel a receive at any point; the watcher may then read on (a late wake of its
    own process): the next receive must return the whole frame, not read the payload as a header."""
    listener, addr = await listen("unix", directory=str(tmp_path))
    got: list[object] = []
    done = anyio.Event()
    header_sent, payload_sent = anyio.Event(), anyio.Event()

    async def handler(link):
        await header_sent.wait()
        with anyio.move_on_after(0.2) as scope:
            await link.receive()  # reads the header, then waits for a payload that is not there yet
        assert scope.cancelled_caught
        payload_sent.set()
        got.append(await link.receive())
        got.append(await link.receive())
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_links, listener, handler)
        stream = await anyio.connect_unix(addr.removeprefix("unix:"))
        first, second = messages.Heartbeat(sender="e0", seq=1), messages.Heartbeat(sender="e0", seq=2)
        payload = messages.encode(first)
        await stream.send(struct.pack(">I", len(payload)))
        header_sent.set()
        await payload_sent.wait()
        await stream.send(payload)
        second_payload = messages.encode(second)
        await stream.send(struct.pack(">I", len(second_payload)) + second_payload)
        with anyio.fail_after(5):
            await done.wait()
        await stream.aclose()
        tg.cancel_scope.cancel()
    assert got == [first, second]


async def _first_frame_from(answer: bytes, then: bytes = b"") -> BaseException:
    """Connect a link to a TCP peer that answers ``answer`` (and ``then`` after the link's first frame) and return
    what the link's receives raised."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    raised: list[BaseException] = []

    async def peer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.send(answer)
            if then:
                await stream.send(then)
            await anyio.sleep_forever()

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, peer)
        link = await connect(f"tcp:127.0.0.1:{port}")
        with anyio.fail_after(5):
            try:
                while True:
                    await link.receive()
            except Exception as exc:
                raised.append(exc)
        await link.aclose()
        tg.cancel_scope.cancel()
    return raised[0]


def _frame(msg_bytes: bytes) -> bytes:
    return struct.pack(">I", len(msg_bytes)) + msg_bytes


@pytest.mark.anyio
async def test_an_http_answer_as_the_first_frame_is_a_foreign_peer_quoting_its_status_line():
    exc = await _first_frame_from(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
    assert isinstance(exc, ForeignPeerError) and not exc.other_version
    assert "HTTP/1.1 400 Bad Request" in exc.seen and "1213486160" not in str(exc)
    assert "--data-parallel-rpc-port" in exc.handshake_problem("tcp:h:1")


@pytest.mark.anyio
async def test_a_first_frame_of_another_protocol_version_is_named_as_such():
    import msgspec

    newer = msgspec.msgpack.encode({"type": "NodeAccepted", "head_host": "h", "protocol_version": 99})
    exc = await _first_frame_from(_frame(newer))
    assert isinstance(exc, ForeignPeerError) and exc.other_version
    assert "a NodeAccepted message of protocol_version 99" in exc.seen
    assert f"protocol_version {messages.PROTOCOL_VERSION}" in exc.handshake_problem("tcp:h:1")


@pytest.mark.anyio
async def test_an_absurd_frame_size_after_the_first_frame_is_a_plain_protocol_error():
    hello = messages.encode(messages.Heartbeat(sender="p", seq=1))
    exc = await _first_frame_from(_frame(hello), then=b"HTTP/1.1 400 Bad Request\r\n\r\n")
    assert isinstance(exc, ProtocolError) and not isinstance(exc, ForeignPeerError)
    assert "exceeds" in str(exc)
