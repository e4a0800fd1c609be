"""The head's stop order across nodes (docs/howto/multi-node.md, "Stopping it"): API servers, then the engines,
local and remote, then the coordinator, on a head with local ranks and on an API-only head alike."""

from __future__ import annotations

import anyio
import pytest

from asyncdp import messages as m
from asyncdp.config.deployment import resolve
from asyncdp.config.flags import EngineConfig, ServeConfig
from asyncdp.config.roles import LaunchPlan
from asyncdp.launcher.children import stop_all
from asyncdp.launcher.node import RemoteNodeLink, RunningNode
from asyncdp.launcher.node_book import NodeEntry
from asyncdp.launcher.plan import API_SERVER, COORDINATOR, ENGINE


class _Child:
    """A child that exits as soon as it is stopped, writing its role into ``events``."""

    def __init__(self, role: str, events: list[str]) -> None:
        self.role, self.rank, self.returncode, self.killed = role, 0, None, False
        self.exited = anyio.Event()
        self._events = events

        class _Control:
            async def send(self, msg: object) -> None:
                pass

            async def aclose(self) -> None:
                pass

        self.control = _Control()

    async def stop(self, *, grace_s: float) -> None:
        self._events.append(self.role)
        self.returncode = 0
        self.exited.set()

    def describe(self) -> str:
        return f"{self.role} (fake)"


class _NodeLink:
    """A headless node's node link: the node stops its engines and leaves when told ``NodeShutdown``."""

    def __init__(self, events: list[str]) -> None:
        self._events = events
        self.remote: RemoteNodeLink | None = None

    async def send(self, msg: object) -> None:
        if isinstance(msg, m.NodeShutdown):
            self._events.append("headless node's engines")
            assert self.remote is not None
            self.remote.closed.set()


def _head(tmp_path, *, dp_size_local: int, events: list[str]) -> RunningNode:
    deployment = resolve(ServeConfig(data_parallel_size=2, data_parallel_size_local=dp_size_local), is_moe=False,
                         num_experts=0, env={})
    plan = LaunchPlan(engine=EngineConfig(), served_model_name="m", model_path=str(tmp_path), deployment=deployment)
    node = RunningNode(plan, None, str(tmp_path))
    node.started = True
    roles = [API_SERVER, COORDINATOR] + [ENGINE] * dp_size_local
    node.children += [_Child(role, events) for role in roles]  # type: ignore[misc]
    link = _NodeLink(events)
    link.remote = RemoteNodeLink(NodeEntry(1, "headless", "h", 2, [dp_size_local, 1]), link)  # type: ignore[arg-type]
    node.remote_nodes.append(link.remote)
    return node


@pytest.mark.trio
@pytest.mark.parametrize("dp_size_local", [0, 1], ids=["api_only_head", "head_with_a_rank"])
async def test_the_coordinator_outlives_the_headless_nodes_engines(tmp_path, autojump_clock, dp_size_local):
    # An API-only head stopped its coordinator before it told the headless nodes to stop: their engines, still
    # serving, logged the coordinator's departure as a WARNING ("serving on without load reports") at every
    # orderly stop.
    events: list[str] = []
    node = _head(tmp_path, dp_size_local=dp_size_local, events=events)
    await stop_all(node)
    assert events.index("headless node's engines") < events.index(COORDINATOR)
    assert events.index(API_SERVER) < events.index("headless node's engines")
    assert node.failure is None
