"""Strangers and broken peers on the head's handshake listener (the rpc port, reachable by anything on the
network): a connection that closes before its first frame (a port scan, a TCP probe) or that says nothing within
the first frame's deadline is dropped without failing startup, and a ``NodeHello`` claiming an absurd number of
ranks is refused by its range, before anything is built for them."""

from __future__ import annotations

import logging
import socket
import struct

import anyio
import pytest
import trio

from asyncdp import messages as m
from asyncdp.launcher.handshake import HANDSHAKE_HELLO_TIMEOUT_S, handshake
from asyncdp.launcher.node_book import check_config_agreement
from asyncdp.transport import memory_link_pair
from asyncdp.transport.links import MemoryLink
from tests.launcher.test_foreign_peers import head_listener, node_for


class _Seen(logging.Handler):
    """Sets ``event`` once the launcher logs ``text``, or anything at ERROR (a startup failure)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.event = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage() or record.levelno >= logging.ERROR:
            self.event.set()


@pytest.mark.anyio
@pytest.mark.parametrize("sent", [b"", struct.pack(">I", 100) + b"\x82"], ids=["nothing", "half_a_frame"])
async def test_a_connection_closed_before_its_first_frame_is_dropped_without_failing_startup(tmp_path, caplog, sent):
    caplog.set_level(logging.DEBUG, logger="asyncdp.launcher")
    seen = _Seen("closed before its first frame")
    logging.getLogger("asyncdp.launcher").addHandler(seen)
    try:
        async with head_listener(tmp_path) as (node, addr):
            host, port = addr.removeprefix("tcp:").rsplit(":", 1)
            async with await anyio.connect_tcp(host, int(port)) as stream:
                if sent:
                    await stream.send(sent)
            with anyio.fail_after(10):
                await seen.event.wait()
            assert node.failure is None and not node.shutdown.is_set()
    finally:
        logging.getLogger("asyncdp.launcher").removeHandler(seen)
    assert "closed before its first frame" in caplog.text
    assert "Traceback" not in caplog.text


@pytest.mark.trio
async def test_a_connection_silent_past_the_first_frame_deadline_is_dropped_without_failing_startup(
        tmp_path, caplog, autojump_clock):
    with socket.socket() as sock:
        node = node_for("-dp 2 -dpl 1 -dpa 127.0.0.1 --api-server-count 1", tmp_path, sock)
        head_end, stranger_end = memory_link_pair()
        start = trio.current_time()
        with trio.fail_after(HANDSHAKE_HELLO_TIMEOUT_S + 1):
            await handshake(node, head_end)
        assert trio.current_time() - start == pytest.approx(HANDSHAKE_HELLO_TIMEOUT_S)
        assert node.failure is None and not node.shutdown.is_set()
        await stranger_end.aclose()
        await head_end.aclose()
    assert caplog.text.count("sent no frame within 30 s") == 1


@pytest.mark.trio
@pytest.mark.parametrize(("start_rank", "size_local", "shown"), [
    (0, 2**62, f"ranks 0..{2**62 - 1}"), (2**62, 2, f"ranks {2**62}..{2**62 + 1}"),
    (-(2**62), 2**62 + 1, f"ranks {-(2**62)}..0"), (1, 0, "no ranks")])
async def test_a_node_hello_with_ranks_out_of_range_is_refused_by_its_range(tmp_path, start_rank, size_local, shown):
    """``size_local`` 2**62 used to be ``list(range(...))`` before any check: a MemoryError out of the listener's
    task group (a traceback, the launcher gone), or for a size a little smaller, every byte of the host."""
    with socket.socket() as sock:
        node = node_for("-dp 2 -dpl 1 -dpa 127.0.0.1 --api-server-count 1", tmp_path, sock)
        head_end, node_end = memory_link_pair()
        await node_end.send(m.NodeHello(start_rank=start_rank, size_local=size_local, host="h", pid=1,
                                        protocol_version=m.PROTOCOL_VERSION, config_summary={}))
        with trio.fail_after(5):
            await handshake(node, head_end)
            answer = await node_end.receive()
        await node_end.aclose()
        await head_end.aclose()
    assert isinstance(answer, m.HandshakeError)
    assert f"the headless node with {shown} (h, pid 1)" in answer.reason
    assert "outside the deployment's ranks [0, 2)" in answer.reason
    assert node.failure is not None and "outside the deployment's ranks" in node.failure


@pytest.mark.parametrize("value", [float("nan"), b"\x00", 1.5, [1], {"a": 1}, None], ids=repr)
def test_a_ready_whose_summary_holds_no_plain_value_is_a_mismatch_not_a_crash(value):
    """Ready.config_summary comes off the wire as any msgpack: a NaN or bytes in it was a ValueError/TypeError out
    of the JSON hash, raised through the handshake into the listener's task group (a traceback, the head gone)."""
    summaries: dict[int, dict] = {}
    assert check_config_agreement(summaries, 1, {"dp_size": 2}) is None
    problem = check_config_agreement(summaries, 0, {"dp_size": 2, "odd": value})
    assert problem is not None and "engine rank 0" in problem and "odd" in problem
    assert 0 not in summaries  # nothing is recorded from it


@pytest.mark.trio
async def test_a_bad_frame_on_an_engines_handshake_link_after_ready_is_dropped_without_failing_startup(
        tmp_path, autojump_clock, caplog):
    """The handshake link stays open for the deployment's life; a frame on it that this build cannot decode was a
    ProtocolError that failed startup as 'the handshake with engine rank 0 broke off'."""
    with socket.socket() as sock:
        node = node_for("-dp 2 -dpl 1 -dpa 127.0.0.1 --api-server-count 1", tmp_path, sock)
        node.init_ready.set()
        to_head, from_engine = anyio.create_memory_object_stream[bytes](8)
        to_engine, from_head = anyio.create_memory_object_stream[bytes](8)
        head_end = MemoryLink(to_engine, from_engine, name="engine")
        async with anyio.create_task_group() as tg:
            tg.start_soon(handshake, node, head_end)
            await to_head.send(m.encode(m.Hello(protocol_version=m.PROTOCOL_VERSION, dp_rank=0, local=True,
                                                headless=False, host="h", pid=1)))
            assert isinstance(m.decode(await from_head.receive()), m.HandshakeInit)
            await to_head.send(m.encode(m.Ready(dp_rank=0, local=True, headless=False, config_hash=None,
                                                config_summary={})))
            await to_head.send(b"\xc1")
            await trio.sleep(1)
            assert node.failure is None and 0 in node.book.ready
            tg.cancel_scope.cancel()
        for stream in (to_head, from_head, head_end):
            await stream.aclose()
    assert "the handshake link of engine rank 0: dropped bad frame 1" in caplog.text
