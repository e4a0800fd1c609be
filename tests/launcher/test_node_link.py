"""The node link between the head and a headless node (asyncdp/launcher/handshake.py, headless.py): how each side
tells a node stopped in order from a lost one. Memory links, virtual time, no child process."""

from __future__ import annotations

import logging
import socket

import anyio
import msgspec
import pytest

from asyncdp import messages as m
from asyncdp.config.deployment import resolve
from asyncdp.config.flags import EngineConfig, ServeConfig
from asyncdp.config.roles import LaunchPlan
from asyncdp.launcher.handshake import handshake
from asyncdp.launcher.headless import follow_head
from asyncdp.launcher.node import RunningNode, book_for
from asyncdp.transport import memory_link_pair

SUMMARY = {"model_identity": "m"}


def _plan(tmp_path, shutdown_timeout_s: float = 0.0, **serve) -> LaunchPlan:
    dep = resolve(ServeConfig(data_parallel_size=2, data_parallel_size_local=1, **serve), is_moe=False,
                  num_experts=0, env={})
    return LaunchPlan(engine=EngineConfig(), served_model_name="m", model_path=str(tmp_path), deployment=dep,
                      shutdown_timeout_s=shutdown_timeout_s)


@pytest.fixture
def head(tmp_path):
    """A dense head serving rank 0, rank 1 on a headless node; started."""
    sock = socket.socket()
    plan = _plan(tmp_path)
    node = RunningNode(plan, sock, str(tmp_path), book=book_for(plan, SUMMARY))
    node.started = True
    yield node
    sock.close()


def _node_hello() -> m.NodeHello:
    return m.NodeHello(start_rank=1, size_local=1, host="h1", pid=200, protocol_version=m.PROTOCOL_VERSION,
                       config_summary=SUMMARY)


async def _node_joins_then_leaves(head: RunningNode, *, say_stopping: bool) -> None:
    head_end, node_end = memory_link_pair()
    async with anyio.create_task_group() as tg:
        tg.start_soon(handshake, head, head_end)
        await node_end.send(_node_hello())
        assert isinstance(await node_end.receive(), m.NodeAccepted)
        if say_stopping:
            await node_end.send(m.NodeStopping(reason="a signal to the node", shutdown_timeout=5.0))
            for seq in range(1, 4):  # its rank drains for a while, heartbeating meanwhile
                await anyio.sleep(2)
                await node_end.send(m.Heartbeat(sender="node-1", seq=seq))
        await node_end.aclose()  # its process ended
    await head_end.aclose()


@pytest.mark.trio
async def test_a_headless_node_that_said_it_stops_is_logged_at_info_as_stopped_not_lost(head, autojump_clock,
                                                                                       caplog):
    """A headless node stopped by its own SIGTERM says ``NodeStopping`` and drains; its link then closes. The
    head used to log ERROR "lost the headless node ... its node link closed" for this orderly departure."""
    caplog.set_level(logging.INFO, logger="asyncdp.launcher")
    await _node_joins_then_leaves(head, say_stopping=True)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "asyncdp.launcher"]
    assert not [line for level, line in lines if level >= logging.WARNING], lines
    assert (logging.INFO, "the headless node with rank 1 (h1, pid 200) is stopping (a signal to the node): rank 1 "
            "drains for up to 5 s, new requests go to the other ranks") in lines
    assert (logging.INFO, "the headless node with rank 1 (h1, pid 200) stopped in order; rank 1 leaves the "
            "balancer, the other ranks keep serving") in lines
    assert head.failure is None and not head.shutdown.is_set()
    assert [n.state for n in head.book.nodes] == ["alive", "stopped"]
    # its rank left; a dense node restarted in its place takes it back, as after a loss
    entry, problem = head.book.admit_node(_node_hello())
    assert problem is None and entry is head.book.nodes[1] and entry.state == "alive"


@pytest.mark.trio
async def test_a_headless_node_whose_link_closes_unannounced_is_lost_at_error(head, autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="asyncdp.launcher")
    await _node_joins_then_leaves(head, say_stopping=False)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["lost the headless node with rank 1 (h1, pid 200): its node link closed; rank 1 leaves the "
                      "balancer, the other ranks keep serving"]
    assert [n.state for n in head.book.nodes] == ["alive", "lost"] and head.failure is None


@pytest.mark.trio
async def test_a_lost_headless_node_restarted_in_its_place_is_accepted_again_and_its_engine_answered(
        head, autojump_clock, caplog):
    """Dense: the head used to answer a restarted node with HandshakeError "a running deployment takes no rank
    back". Now the node link is accepted (the same node entry, alive, the new pid), the process table lists
    only the live launcher, and the node's engine gets its HandshakeInit."""
    caplog.set_level(logging.INFO, logger="asyncdp.launcher")
    await _node_joins_then_leaves(head, say_stopping=False)
    head.init_ready.set()
    head_end, node_end = memory_link_pair()
    engine_head, engine_end = memory_link_pair()
    async with anyio.create_task_group() as tg:
        tg.start_soon(handshake, head, head_end)
        await node_end.send(msgspec.structs.replace(_node_hello(), pid=201))
        accepted = await node_end.receive()
        assert isinstance(accepted, m.NodeAccepted) and accepted.node_index == 1
        tg.start_soon(handshake, head, engine_head)
        await engine_end.send(m.Hello(protocol_version=m.PROTOCOL_VERSION, dp_rank=1, local=False, headless=True,
                                      host="h1", pid=301))
        assert isinstance(await engine_end.receive(), m.HandshakeInit)
        await engine_end.send(m.Ready(dp_rank=1, local=False, headless=True, config_hash=None, config_summary={}))
        await anyio.sleep(0.1)
        assert head.book.ready == {1} and [(n.state, n.pid) for n in head.book.nodes[1:]] == [("alive", 201)]
        launchers = [p.pid for p in head.process_table() if p.role == "headless_launcher"]
        assert launchers == [201]
        await engine_end.aclose()
        await node_end.aclose()
    await head_end.aclose()
    await engine_head.aclose()
    assert head.failure is None and not head.shutdown.is_set()
    assert ("the headless node with rank 1 (h1, pid 201) joined again: rank 1 rejoins the deployment as its "
            "engine gets ready") in caplog.text


@pytest.fixture
def headless(tmp_path):
    plan = _plan(tmp_path, 5.0, headless=True, data_parallel_start_rank=1, data_parallel_address="127.0.0.1")
    return RunningNode(plan, None, str(tmp_path))


async def _frames_until_eof(link) -> list[m.Message]:
    frames = []
    with anyio.fail_after(30):
        try:
            while True:
                msg = await link.receive()
                if not isinstance(msg, m.Heartbeat):
                    frames.append(msg)
        except anyio.EndOfStream:
            pass
    return frames


@pytest.mark.trio
@pytest.mark.parametrize("how", ["own_signal", "head_shutdown", "failure"])
async def test_a_headless_node_says_node_stopping_only_when_it_stops_on_its_own(headless, autojump_clock, how):
    node_end, head_end = memory_link_pair()
    async with anyio.create_task_group() as tg:
        tg.start_soon(follow_head, headless, node_end)
        await anyio.sleep(3)
        if how == "own_signal":  # what the launcher's signal watcher does
            headless.asked_to_stop.set()
            headless.shutdown.set()
        elif how == "head_shutdown":
            await head_end.send(m.NodeShutdown(reason="the head received a signal", shutdown_timeout=5.0))
        else:  # a failure, with the operator's signal on top (an orchestrator stopping a failing node): no goodbye
            headless.asked_to_stop.set()
            headless.fail("engine rank 1 exited with code -9; no local rank left: stopping this node")
        await anyio.sleep(5)  # its engines drain
        await node_end.aclose()  # what the launcher does once they are gone
        frames = await _frames_until_eof(head_end)
    await head_end.aclose()
    said = [f for f in frames if isinstance(f, m.NodeStopping)]
    if how == "own_signal":
        assert said == [m.NodeStopping(reason="a signal to the node", shutdown_timeout=5.0)]
    else:
        assert said == []
