"""How a StreamLink reads its byte stream: in chunks, so one read usually brings a whole frame (header and payload)
or several, and the frames already read are returned without reading again. The link used to read each frame's
4-byte header and its payload separately: two reads (two system calls and two scheduling points) per frame, which
showed in the per-request CPU profile of the serving path."""

from __future__ import annotations

import struct

import anyio
import anyio.abc
import pytest

from asyncdp import messages
from asyncdp.transport import StreamLink


class _ChunkStream(anyio.abc.ByteStream):
    """A byte stream over chunks given in advance; a receive returns at most ``max_bytes`` of the next chunk (the
    rest stays for the next receive), as a socket's does. Counts the receives and what each asked for."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.asked: list[int] = []

    async def receive(self, max_bytes: int = 65536) -> bytes:
        self.asked.append(max_bytes)
        if not self.chunks:
            raise anyio.EndOfStream
        chunk = self.chunks.pop(0)
        if len(chunk) > max_bytes:
            self.chunks.insert(0, chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        return chunk

    async def send(self, item: bytes) -> None:
        raise anyio.BrokenResourceError

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


def _frame(msg: messages.Message) -> bytes:
    payload = messages.encode(msg)
    return struct.pack(">I", len(payload)) + payload


async def _receive_all(link: StreamLink) -> list[messages.Message]:
    got: list[messages.Message] = []
    while True:
        try:
            got.append(await link.receive())
        except anyio.EndOfStream:
            return got


@pytest.mark.anyio
async def test_frames_that_arrive_together_are_read_from_the_stream_once():
    beats = [messages.Heartbeat(sender="e0", seq=i) for i in range(10)]
    stream = _ChunkStream([b"".join(_frame(b) for b in beats)])
    assert await _receive_all(StreamLink(stream)) == beats
    assert len(stream.asked) == 2  # the chunk, then the end of the stream (it was 21: a header, a payload each)


@pytest.mark.anyio
async def test_a_frame_split_into_single_bytes_is_reassembled():
    beats = [messages.Heartbeat(sender="e0", seq=1), messages.Heartbeat(sender="e0", seq=2)]
    data = b"".join(_frame(b) for b in beats)
    assert await _receive_all(StreamLink(_ChunkStream([data[i:i + 1] for i in range(len(data))]))) == beats


@pytest.mark.anyio
async def test_a_frame_longer_than_a_read_asks_for_its_remaining_size_and_a_short_one_for_a_chunk():
    big = messages.UtilityResult(call_id=1, ok=True, value="x" * 300_000)
    data = _frame(big)
    stream = _ChunkStream([data[:100], data[100:]])
    assert await _receive_all(StreamLink(stream)) == [big]
    assert stream.asked[0] == 64 << 10  # a header to read: a chunk
    assert stream.asked[1] == len(data) - 100  # the payload's remaining bytes, more than a chunk


@pytest.mark.anyio
async def test_a_stream_that_ends_inside_a_frame_ends_the_link():
    data = _frame(messages.Heartbeat(sender="e0", seq=1))
    link = StreamLink(_ChunkStream([data, data[:-1]]))
    assert await link.receive() == messages.Heartbeat(sender="e0", seq=1)
    with pytest.raises(anyio.EndOfStream):
        await link.receive()


@pytest.mark.anyio
async def test_concurrent_senders_on_one_link_never_interleave_their_frames(tmp_path):
    """Many tasks send on one link at once, with frames larger than a socket's buffer (so sends wait part way):
    the reader gets every frame whole, each sender's in its order."""
    from asyncdp.transport import listen, serve_links

    listener, addr = await listen("unix", directory=str(tmp_path))
    senders, per_sender = 8, 20
    got: list[messages.Message] = []
    done = anyio.Event()

    async def handler(link: StreamLink) -> None:
        while len(got) < senders * per_sender:
            got.append(await link.receive())
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_links, listener, handler)
        link = StreamLink(await anyio.connect_unix(addr.removeprefix("unix:")))

        async def send_all(sender: int) -> None:
            for seq in range(per_sender):
                await link.send(messages.UtilityResult(call_id=sender * 1000 + seq, ok=True, value="v" * 150_000))

        async with anyio.create_task_group() as senders_tg:
            for sender in range(senders):
                senders_tg.start_soon(send_all, sender)
        with anyio.fail_after(10):
            await done.wait()
        await link.aclose()
        tg.cancel_scope.cancel()
    ids = [msg.call_id for msg in got]  # type: ignore[attr-defined]
    assert sorted(ids) == sorted(s * 1000 + q for s in range(senders) for q in range(per_sender))
    for sender in range(senders):
        assert [i for i in ids if i // 1000 == sender] == [sender * 1000 + q for q in range(per_sender)]
