"""The launcher's shell performs the launch table: children start in the table's order with role configs taken
from the table's rows (managed ranks included), with fake children instead of processes."""

from __future__ import annotations

import shlex
import socket
from dataclasses import dataclass

import pytest

from asyncdp import messages as m
from asyncdp.cli import build_serve_config
from asyncdp.config.flags import EngineConfig
from asyncdp.config.roles import ApiServerRole, EngineRole, LaunchPlan, RoleConfig
from asyncdp.errors import StartupError
from asyncdp.launcher import startup
from asyncdp.launcher.node import RunningNode
from asyncdp.launcher.plan import ProcessSpec


@dataclass(frozen=True)
class Facts:
    is_moe: bool = False
    num_experts: int = 0


class FakeChild:
    """Reports every event at once, as a child that started well would."""

    def __init__(self, row: ProcessSpec) -> None:
        self.rank = row.client_index if row.role == "api" else row.dp_rank

    async def wait_event(self, kind: type) -> m.ControlMessage:
        if kind is m.CoordinatorListening:
            return m.CoordinatorListening(engine_addr="unix:/coord-engine", client_addr="unix:/coord-client")
        if kind is m.ApiListening:
            return m.ApiListening(client_addr=f"unix:/api-{self.rank}")
        return m.ChildReady(dp_rank=self.rank)


@pytest.fixture
def spawned(monkeypatch):
    calls: list[tuple[ProcessSpec, RoleConfig]] = []

    async def fake_spawn(node, tg, row, config, **_kwargs):
        calls.append((row, config))
        return FakeChild(row)

    monkeypatch.setattr(startup, "spawn", fake_spawn)
    return calls


def node_for(cmd: str, tmp_path, sock: socket.socket, **plan_fields) -> RunningNode:
    config = build_serve_config(shlex.split(cmd), env={}, model_facts=lambda _name: Facts())
    plan = LaunchPlan(engine=EngineConfig(executor="sim"), served_model_name="m", model_path=str(tmp_path),
                      deployment=config.deployment, **plan_fields)
    return RunningNode(plan, sock, str(tmp_path))


@pytest.mark.anyio
async def test_internal_node_starts_coordinator_api_servers_then_engines_with_the_tables_configs(tmp_path, spawned):
    import anyio

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        node = node_for("-dp 2 --api-server-count 2", tmp_path, sock)
        async with anyio.create_task_group() as tg:
            await startup.start_node(node, tg)
            tg.cancel_scope.cancel()  # the handshake listener's task
        if node.node_table is not None:
            node.node_table.close()
    assert [row.name for row, _ in spawned] == ["asyncdp-coordinator", "asyncdp-api-0", "asyncdp-api-1",
                                                "asyncdp-engine-dp0", "asyncdp-engine-dp1"]
    apis = [config for _, config in spawned if isinstance(config, ApiServerRole)]
    assert [(a.client_index, a.client_count, a.managed_ranks) for a in apis] == [(0, 2, (0, 1)), (1, 2, (0, 1))]
    assert all(a.coordinator_client_addr == "unix:/coord-client" for a in apis)
    engines = [config for _, config in spawned if isinstance(config, EngineRole)]
    assert [e.dp_rank for e in engines] == [0, 1] and all(e.handshake_addr == node.handshake_addr for e in engines)
    assert node.client_addrs == [m.ClientAddr(client_index=0, addr="unix:/api-0"),
                                 m.ClientAddr(client_index=1, addr="unix:/api-1")]
    assert node.coordinator_addrs == m.CoordinatorAddrs(engine_addr="unix:/coord-engine",
                                                        client_addr="unix:/coord-client")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.anyio
async def test_hybrid_head_binds_the_rpc_port_and_waits_for_every_rank_of_the_deployment(tmp_path, spawned):
    import anyio

    rpc = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        node = node_for(f"-dp 4 -dpl 2 -dpr 0 --api-server-count 2 -dpa 127.0.0.1 -dpp {rpc}", tmp_path, sock,
                        engine_ready_timeout_s=0.3)
        async with anyio.create_task_group() as tg:
            # No engine connects (the children are fakes): the head names the ranks it still waits for (E9).
            with pytest.raises(StartupError, match=r"ranks 0\.\.3 not connected yet"):
                await startup.start_node(node, tg)
            tg.cancel_scope.cancel()  # the handshake listener's task
        if node.node_table is not None:
            node.node_table.close()
    assert node.handshake_addr == f"tcp:127.0.0.1:{rpc}"  # the user-facing rpc port, on the DP address
    apis = [config for _, config in spawned if isinstance(config, ApiServerRole)]
    assert [a.managed_ranks for a in apis] == [(0, 1), (0, 1)]  # the deployment's, not range(dp_size)
    engines = [config for _, config in spawned if isinstance(config, EngineRole)]
    assert [(e.dp_rank, e.handshake_addr, e.local_handshake_addr) for e in engines] == [
        (0, f"tcp:127.0.0.1:{rpc}", None), (1, f"tcp:127.0.0.1:{rpc}", None)]


class LoadingEngine(FakeChild):
    """An engine that never reports ``ChildReady`` (its peers on the other node never connect)."""

    def __init__(self, row: ProcessSpec) -> None:
        super().__init__(row)
        self.name, self.role = row.name, row.role

    def event(self, kind: type) -> None:
        return None

    async def wait_event(self, kind: type) -> m.ControlMessage:
        if kind is m.ChildReady and self.role == "engine":
            import anyio

            await anyio.sleep_forever()
        return await super().wait_event(kind)


@pytest.mark.anyio
async def test_a_head_with_ranks_of_its_own_logs_what_it_waits_for_while_its_engines_wait_for_the_others(
        tmp_path, monkeypatch, caplog):
    import logging

    import anyio

    monkeypatch.setattr(startup, "spawn", lambda node, tg, row, config, **_: _async(LoadingEngine(row)))
    monkeypatch.setattr(startup, "PROGRESS_EVERY_S", 0.1)
    caplog.set_level(logging.INFO, logger="asyncdp.launcher")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        node = node_for(f"-dp 4 -dpl 2 -dpa 127.0.0.1 -dpp {free_port()}", tmp_path, sock, engine_ready_timeout_s=0.35)
        async with anyio.create_task_group() as tg:
            with pytest.raises(TimeoutError):  # E9 (the shell reports it)
                await startup.start_node(node, tg)
            tg.cancel_scope.cancel()
        if node.node_table is not None:
            node.node_table.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for")]
    assert len(lines) >= 2, lines  # one every PROGRESS_EVERY_S
    assert lines[0].startswith("waiting for asyncdp-engine-dp0, asyncdp-engine-dp1 to be ready (0 s)"), lines
    assert lines[0].endswith("; the deployment's ranks: ranks 0..3 not ready; ranks 0..3 not connected yet"), lines


async def _async(value):
    return value


@pytest.mark.anyio
async def test_hybrid_node_s_gt_0_engines_join_the_head_and_their_own_front_end(tmp_path, spawned):
    import anyio

    rpc = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        node = node_for(f"-dp 4 -dpl 2 -dpr 2 -dph -dpa 127.0.0.1 -dpp {rpc} --api-server-count 2", tmp_path, sock)
        async with anyio.create_task_group() as tg:
            await startup.start_node(node, tg)
            tg.cancel_scope.cancel()  # the local handshake listener's task
        if node.node_table is not None:
            node.node_table.close()
    assert [row.name for row, _ in spawned] == ["asyncdp-api-0", "asyncdp-api-1", "asyncdp-engine-dp2",
                                                "asyncdp-engine-dp3"]  # no coordinator: the head hosts it
    apis = [config for _, config in spawned if isinstance(config, ApiServerRole)]
    assert [(a.managed_ranks, a.coordinator_client_addr) for a in apis] == [((2, 3), None), ((2, 3), None)]
    engines = [config for _, config in spawned if isinstance(config, EngineRole)]
    assert node.handshake_addr == "" and node.local_handshake_addr.startswith("unix:")
    assert [(e.dp_rank, e.handshake_addr, e.local_handshake_addr, e.local, e.headless) for e in engines] == [
        (2, f"tcp:127.0.0.1:{rpc}", node.local_handshake_addr, False, False),
        (3, f"tcp:127.0.0.1:{rpc}", node.local_handshake_addr, False, False)]


@pytest.mark.anyio
async def test_a_busy_rpc_port_fails_startup_naming_the_flag(tmp_path, spawned):
    import anyio

    with socket.socket() as busy, socket.socket() as sock:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        rpc = busy.getsockname()[1]
        sock.bind(("127.0.0.1", 0))
        node = node_for(f"-dp 4 -dpl 2 -dpa 127.0.0.1 -dpp {rpc} --api-server-count 2", tmp_path, sock)
        async with anyio.create_task_group() as tg:
            with pytest.raises(StartupError, match=f"127.0.0.1:{rpc} .*--data-parallel-rpc-port"):
                await startup.start_node(node, tg)
    assert spawned == []  # before any child
