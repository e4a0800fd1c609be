"""After startup (dense), a peer that says ``Hello`` for a rank a restarted node brings back, is answered
``HandshakeInit`` and then goes silent (a stranger, or an engine that hung) held that rank for good: the real
engine's ``Hello`` was refused as the rank "connected twice". The wait for its ``Ready`` has the startup's
deadline, ``--engine-ready-timeout-s``; past it the peer is dropped with one line and the rank is free again.
Memory links, virtual time."""

from __future__ import annotations

import logging
import socket

import anyio
import msgspec
import pytest
import trio

from asyncdp import messages as m
from asyncdp.launcher.handshake import handshake
from asyncdp.launcher.node import RunningNode, book_for
from asyncdp.transport import memory_link_pair
from tests.launcher.test_node_link import SUMMARY, _node_hello, _node_joins_then_leaves, _plan


@pytest.fixture
def started_head(tmp_path):
    """A dense head serving rank 0, rank 1 on a headless node; started."""
    with socket.socket() as sock:
        plan = _plan(tmp_path)
        node = RunningNode(plan, sock, str(tmp_path), book=book_for(plan, SUMMARY))
        node.started = True
        node.book.ready.add(0)
        yield node


def _hello(pid: int) -> m.Hello:
    return m.Hello(protocol_version=m.PROTOCOL_VERSION, dp_rank=1, local=False, headless=True, host="h1", pid=pid)


async def _keep_alive(link) -> None:
    """The restarted node's side of its node link: heartbeats, and whatever the head sends is read."""
    async def read() -> None:
        async for _ in link:
            pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        for seq in range(1, 10_000):
            await anyio.sleep(1)
            await link.send(m.Heartbeat(sender="node-1", seq=seq))


@pytest.mark.trio
async def test_a_peer_silent_after_handshake_init_frees_the_rank_after_the_engine_ready_timeout(
        started_head: RunningNode, autojump_clock, caplog):
    head = started_head
    await _node_joins_then_leaves(head, say_stopping=False)
    head.init_ready.set()
    (head_end, node_end), (silent_head, silent_end), (engine_head, engine_end) = (
        memory_link_pair(), memory_link_pair(), memory_link_pair())
    async with anyio.create_task_group() as tg:
        tg.start_soon(handshake, head, head_end)
        await node_end.send(msgspec.structs.replace(_node_hello(), pid=201))
        assert isinstance(await node_end.receive(), m.NodeAccepted)
        tg.start_soon(_keep_alive, node_end)
        dropped = trio.Event()

        async def silent_peer() -> None:
            await handshake(head, silent_head)
            dropped.set()

        tg.start_soon(silent_peer)
        await silent_end.send(_hello(301))
        assert isinstance(await silent_end.receive(), m.HandshakeInit)
        start = trio.current_time()
        with trio.fail_after(head.plan.engine_ready_timeout_s + 5):
            await dropped.wait()
        assert 1 not in head.book.connected
        assert trio.current_time() - start == pytest.approx(head.plan.engine_ready_timeout_s, abs=1.5)
        tg.start_soon(handshake, head, engine_head)  # the rank's real engine is answered
        await engine_end.send(_hello(302))
        assert isinstance(await engine_end.receive(), m.HandshakeInit)
        tg.cancel_scope.cancel()
    for link in (head_end, node_end, silent_head, silent_end, engine_head, engine_end):
        await link.aclose()
    assert head.failure is None
    lines = [r for r in caplog.records if r.name == "asyncdp.launcher" and r.levelno >= logging.WARNING
             and "pid 301" in r.getMessage()]
    assert len(lines) == 1 and "--engine-ready-timeout-s" in lines[0].getMessage()
