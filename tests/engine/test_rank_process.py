"""The engine process main, without a front-end: what it does when the handshake never comes."""

from __future__ import annotations

import socket

import anyio
import anyio.abc
import pytest
import trio

from asyncdp.config.flags import EngineConfig
from asyncdp.config.roles import EngineRole
from asyncdp.engine.rank_process import HANDSHAKE_TIMEOUT_S, run_rank_process
from asyncdp.transport.control import ControlChannel


@pytest.mark.trio
async def test_missing_front_end_exits_1_after_the_handshake_timeout(tmp_path, autojump_clock):
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    control = ControlChannel(await anyio.abc.UNIXSocketStream.from_socket(child))
    role = EngineRole(dp_rank=0, dp_size=1, engine=EngineConfig(executor="sim"),
                      handshake_addr=f"unix:{tmp_path / 'nobody-listens.sock'}")
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT_S + 60):  # virtual seconds; the parent stays alive throughout
            code = await run_rank_process(role, control)
    finally:
        await control.aclose()
        parent.close()
    assert code == 1


@pytest.mark.anyio
async def test_a_rank_waiting_for_coordinator_ready_keeps_heartbeating_to_the_coordinator(tmp_path):
    """Ranks subscribe as soon as their model is loaded and CoordinatorReady comes only once every rank did: a
    rank that loaded first must not look dead (silent past the heartbeat timeout) to the coordinator meanwhile."""
    from asyncdp import messages as m
    from asyncdp.engine.rank_process import _connect_peers, rank_config
    from asyncdp.transport import listen_links

    coordinator = await listen_links("unix", directory=str(tmp_path), prefix="coord", name="engine")
    role = EngineRole(dp_rank=1, dp_size=2, engine=EngineConfig(executor="sim"), handshake_addr="unix:/unused",
                      heartbeat_interval_s=0.05, heartbeat_timeout_s=0.5)
    init = m.HandshakeInit(clients=[], coordinator=m.CoordinatorAddrs(engine_addr=coordinator.addr,
                                                                      client_addr="unix:/unused"),
                           dp_group=None, client_count=1)
    seen: list[m.Message] = []

    async def slow_coordinator(link) -> None:
        with anyio.fail_after(10):
            while len([msg for msg in seen if isinstance(msg, m.Heartbeat)]) < 3:  # the other rank still loads
                seen.append(await link.receive())
        await link.send(m.CoordinatorReady())
        await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        tg.start_soon(coordinator.serve, slow_coordinator)
        with anyio.fail_after(10):
            clients, link = await _connect_peers(rank_config(role), init)
        tg.cancel_scope.cancel()
    assert link is not None
    await link.aclose()
    assert isinstance(seen[0], m.Subscribe) and seen[0].dp_rank == 1
    assert [type(msg) for msg in seen[1:]] == [m.Heartbeat] * 3


def test_a_collective_broken_by_a_lost_peer_is_one_line_and_a_real_bug_keeps_its_traceback():
    from asyncdp.engine.rank_process import _lost_peer
    from asyncdp.errors import DPGroupError

    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:5: "
                        "Connection reset by peer")
    assert _lost_peer(ExceptionGroup("step", [gloo])) == str(gloo)
    assert _lost_peer(DPGroupError("DP control all-reduce failed on rank 0")) is not None
    assert _lost_peer(ExceptionGroup("step", [gloo, KeyError("slot")])) is None  # a bug among them: traceback
    assert _lost_peer(RuntimeError("shape mismatch")) is None


@pytest.mark.anyio
async def test_a_rank_connects_to_its_clients_only_once_the_coordinator_is_ready(tmp_path):
    """A client drops an engine link whose EngineReady does not come within 30 s; CoordinatorReady waits for every
    rank, which on another node may start minutes later. So the client links open after CoordinatorReady."""
    from asyncdp import messages as m
    from asyncdp.engine.rank_process import _connect_peers, rank_config
    from asyncdp.transport import listen_links

    coordinator = await listen_links("unix", directory=str(tmp_path), prefix="coord", name="engine")
    client = await listen_links("unix", directory=str(tmp_path), prefix="client", name="client")
    role = EngineRole(dp_rank=0, dp_size=2, engine=EngineConfig(executor="sim"), handshake_addr="unix:/unused",
                      heartbeat_interval_s=0.05, heartbeat_timeout_s=0.5)
    init = m.HandshakeInit(clients=[m.ClientAddr(client_index=0, addr=client.addr)],
                           coordinator=m.CoordinatorAddrs(engine_addr=coordinator.addr, client_addr="unix:/unused"),
                           dp_group=None, client_count=1)
    events: list[str] = []
    connected = anyio.Event()

    async def late_coordinator(link) -> None:
        await link.receive()  # Subscribe
        await anyio.sleep(0.3)  # the other rank is still loading
        events.append("coordinator ready")
        await link.send(m.CoordinatorReady())
        await anyio.sleep_forever()

    async def client_side(link) -> None:
        events.append("client connected")
        connected.set()
        await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        tg.start_soon(coordinator.serve, late_coordinator)
        tg.start_soon(client.serve, client_side)
        with anyio.fail_after(10):
            clients, link = await _connect_peers(rank_config(role), init)
            await connected.wait()
        tg.cancel_scope.cancel()
    for peer in [*clients.values(), link]:
        if peer is not None:
            await peer.aclose()
    assert events == ["coordinator ready", "client connected"]


@pytest.mark.anyio
@pytest.mark.parametrize("peer", ["coordinator", "client"])
async def test_a_peer_the_handshake_named_that_is_gone_is_a_startup_error_naming_it(tmp_path, peer):
    """A restarted node's engine was told a coordinator or API server address that no longer listens (it ended
    with the ranks it served): the rank stops with one line that names the peer and its address, where it used to
    log a traceback of the failed connect."""
    from asyncdp import messages as m
    from asyncdp.engine.rank_process import _connect_peers, rank_config
    from asyncdp.errors import StartupError

    gone = f"unix:{tmp_path / 'gone.sock'}"
    role = EngineRole(dp_rank=1, dp_size=2, engine=EngineConfig(executor="sim"), handshake_addr="unix:/unused")
    init = m.HandshakeInit(
        clients=[m.ClientAddr(client_index=0, addr=gone)] if peer == "client" else [],
        coordinator=m.CoordinatorAddrs(engine_addr=gone, client_addr=gone) if peer == "coordinator" else None,
        dp_group=None, client_count=1)
    with anyio.fail_after(10), pytest.raises(StartupError) as info:
        await _connect_peers(rank_config(role), init)
    what = "the DP coordinator" if peer == "coordinator" else "API server 0"
    assert f"rank 1: cannot reach {what} at {gone}" in str(info.value)
