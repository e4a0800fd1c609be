"""The node link between the head and a headless node (asyncdp/launcher/handshake.py, headless.py): how each side
tells a node stopped in order from a lost one. Memory links, virtual time, no child process."""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass

import anyio
import msgspec
import pytest

from asyncdp import messages as m
from asyncdp.config.deployment import resolve
from asyncdp.config.flags import EngineConfig, ServeConfig
from asyncdp.config.roles import LaunchPlan
from asyncdp.launcher.handshake import handshake
from asyncdp.launcher.headless import follow_head, leave_head, node_outcome
from asyncdp.launcher.node import RunningNode, book_for
from asyncdp.launcher.plan import ENGINE
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
    node.book.ready.add(0)  # its own rank serves
    yield node
    sock.close()


def _node_hello() -> m.NodeHello:
    return m.NodeHello(start_rank=1, size_local=1, host="h1", pid=200, protocol_version=m.PROTOCOL_VERSION,
                       config_summary=SUMMARY)


CLEAN = m.NodeStopped(clean=True)
KILLED = m.NodeStopped(clean=False, detail="killed before they exited by themselves: engine rank 1 (EngineCore_DP1, "
                       "pid 301); engine rank 1 (EngineCore_DP1, pid 301) was killed, exit code -9; exit status 1")


async def _node_joins_then_leaves(head: RunningNode, *, say_stopping: bool, outcome: m.NodeStopped | None = None
                                  ) -> None:
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
        if outcome is not None:  # its engines are gone, its exit status known: the link's last frame
            await node_end.send(outcome)
        await node_end.aclose()  # its process ended
    await head_end.aclose()


def _lines(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "asyncdp.launcher"]


@pytest.mark.trio
async def test_a_headless_node_that_said_it_stops_is_logged_at_info_as_stopped_not_lost(head, autojump_clock,
                                                                                       caplog):
    """A headless node stopped by its own SIGTERM says ``NodeStopping`` and drains; its link then closes. The
    head used to log ERROR "lost the headless node ... its node link closed" for this orderly departure. It says
    ``NodeStopped(clean)`` last: the head logs "stopped in order" at INFO."""
    caplog.set_level(logging.INFO, logger="asyncdp.launcher")
    await _node_joins_then_leaves(head, say_stopping=True, outcome=CLEAN)
    lines = _lines(caplog)
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
async def test_a_headless_node_whose_drain_went_wrong_after_it_said_it_stops_is_logged_at_error_with_why(
        head, autojump_clock, caplog):
    """``NodeStopping``, then its engine had to be killed at the drain deadline (the node exits 1). The head used
    to log this at INFO as "stopped in order", hiding the failure; now ERROR, with the node's own account."""
    caplog.set_level(logging.INFO, logger="asyncdp.launcher")
    await _node_joins_then_leaves(head, say_stopping=True, outcome=KILLED)
    lines = _lines(caplog)
    assert not [line for _, line in lines if "stopped in order" in line], lines
    assert [(level, line) for level, line in lines if level >= logging.WARNING] == [
        (logging.ERROR, f"the headless node with rank 1 (h1, pid 200) stopped, not in order: {KILLED.detail}; "
                        "rank 1 leaves the balancer, the other ranks keep serving")]
    assert head.failure is None and not head.shutdown.is_set()  # dense: the other ranks keep serving
    # it left on purpose (its operator stopped it): stopped, and a node restarted in its place takes rank 1 back
    assert [n.state for n in head.book.nodes] == ["alive", "stopped"]
    entry, problem = head.book.admit_node(_node_hello())
    assert problem is None and entry is head.book.nodes[1] and entry.state == "alive"


@pytest.mark.trio
async def test_a_headless_node_that_said_it_stops_but_never_said_how_it_ended_is_logged_at_warning(
        head, autojump_clock, caplog):
    """``NodeStopping``, then the link closes with no ``NodeStopped`` (its launcher SIGKILLed in its drain, say):
    no all-clear at INFO, a WARNING that says what is unknown."""
    caplog.set_level(logging.INFO, logger="asyncdp.launcher")
    await _node_joins_then_leaves(head, say_stopping=True)
    lines = _lines(caplog)
    assert not [line for _, line in lines if "stopped in order" in line], lines
    assert [(level, line) for level, line in lines if level >= logging.WARNING] == [
        (logging.WARNING, "the headless node with rank 1 (h1, pid 200) stopped: it said it stops, then its node link "
                          "closed without its outcome (its launcher was killed in its drain, or its last frame was "
                          "lost); rank 1 leaves the balancer, the other ranks keep serving")]
    assert [n.state for n in head.book.nodes] == ["alive", "stopped"] and head.failure is None


@pytest.mark.trio
async def test_a_headless_node_whose_link_closes_unannounced_is_lost_at_error(head, autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="asyncdp.launcher")
    await _node_joins_then_leaves(head, say_stopping=False)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["lost the headless node with rank 1 (h1, pid 200): its node link closed; rank 1 leaves the "
                      "balancer, the other ranks keep serving"]
    assert [n.state for n in head.book.nodes] == ["alive", "lost"] and head.failure is None


@pytest.mark.trio
async def test_a_headless_node_that_failed_on_its_own_is_lost_at_error_with_its_account(head, autojump_clock,
                                                                                        caplog):
    """No ``NodeStopping`` (nobody asked it to stop): its last engine crashed, it says why in ``NodeStopped``."""
    caplog.set_level(logging.INFO, logger="asyncdp.launcher")
    crashed = m.NodeStopped(clean=False, detail="engine rank 1 (EngineCore_DP1, pid 301) exited with code 1; no "
                                                "local rank left: stopping this node; exit status 1")
    await _node_joins_then_leaves(head, say_stopping=False, outcome=crashed)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert errors == [f"lost the headless node with rank 1 (h1, pid 200): {crashed.detail}; rank 1 leaves the "
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
        assert head.book.ready == {0, 1} and [(n.state, n.pid) for n in head.book.nodes[1:]] == [("alive", 201)]
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


FAILURE = "engine rank 1 exited with code -9; no local rank left: stopping this node"


@pytest.mark.trio
@pytest.mark.parametrize("how", ["own_signal", "head_shutdown", "failure"])
async def test_a_headless_node_says_node_stopping_only_when_it_stops_on_its_own_and_how_it_ended_last(
        headless, autojump_clock, how):
    node_end, head_end = memory_link_pair()
    headless.head_link = node_end
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
            headless.fail(FAILURE)
        await anyio.sleep(5)  # its engines drain
        await leave_head(headless, 1 if headless.failure else 0)  # what the launcher does once they are gone
        frames = await _frames_until_eof(head_end)
    await head_end.aclose()
    said = [f for f in frames if isinstance(f, m.NodeStopping)]
    if how == "own_signal":
        assert said == [m.NodeStopping(reason="a signal to the node", shutdown_timeout=5.0)]
    else:
        assert said == []
    assert frames[-1] == (m.NodeStopped(clean=False, detail=f"{FAILURE}; exit status 1") if how == "failure"
                          else m.NodeStopped(clean=True))


@dataclass
class _Engine:  # what node_outcome reads of a ChildProcess
    rank: int
    returncode: int
    killed: bool = False
    role: str = ENGINE

    def describe(self) -> str:
        return f"engine rank {self.rank} (EngineCore_DP{self.rank}, pid {300 + self.rank})"


def test_an_unclean_outcome_names_each_engine_that_did_not_exit_0_killed_or_not(headless):
    headless.children = [_Engine(1, 0), _Engine(2, -9, killed=True), _Engine(3, 1)]  # type: ignore[list-item]
    headless.failure = "killed before they exited by themselves: engine rank 2 (EngineCore_DP2, pid 302)"
    assert node_outcome(headless, 1) == m.NodeStopped(clean=False, detail=(
        "killed before they exited by themselves: engine rank 2 (EngineCore_DP2, pid 302); engine rank 2 "
        "(EngineCore_DP2, pid 302) was killed, exit code -9; engine rank 3 (EngineCore_DP3, pid 303) exited with "
        "code 1; exit status 1"))
    headless.failure = None
    assert node_outcome(headless, 0) == m.NodeStopped(clean=True)


@pytest.mark.trio
async def test_a_lost_node_that_held_every_ready_rank_is_logged_as_leaving_no_rank_to_serve(head, autojump_clock,
                                                                                           caplog):
    """When the lost node held the last ranks that served (an API-only head's only node, say), the head's line
    no longer says that "the other ranks keep serving": none does."""
    caplog.set_level(logging.INFO, logger="asyncdp.launcher")
    head.book.ready.discard(0)  # the head's own rank is gone too
    await _node_joins_then_leaves(head, say_stopping=False)
    assert (logging.ERROR, "lost the headless node with rank 1 (h1, pid 200): its node link closed; rank 1 leaves "
            "the balancer, no rank is left to serve (a node restarted in its place brings them back while the API "
            "servers are up: ASYNCDP_KEEP_ALIVE_ON_ENGINE_DEATH=1)") in _lines(caplog), _lines(caplog)
