"""What the launcher says when a dense engine exits while serving (docs/howto/observe.md, "Logs"): the other
ranks keep serving only while some rank is left to serve."""

from __future__ import annotations

import logging

import anyio
import pytest

from asyncdp.config.deployment import resolve
from asyncdp.config.flags import EngineConfig, ServeConfig
from asyncdp.config.roles import LaunchPlan
from asyncdp.launcher.children import watch_child
from asyncdp.launcher.node import RunningNode
from asyncdp.launcher.plan import ENGINE


class _Engine:
    def __init__(self, rank: int, *, exited: bool) -> None:
        self.role, self.rank, self.returncode, self.killed = ENGINE, rank, None, False
        self.exited = anyio.Event()
        if exited:
            self.exited.set()

    async def watch_exit(self) -> int:
        self.exited.set()
        return -9

    def describe(self) -> str:
        return f"engine rank {self.rank} (asyncdp-engine-dp{self.rank}, pid 1)"


def _node(tmp_path, *, dp_size: int, dp_size_local: int | None = None) -> RunningNode:
    deployment = resolve(ServeConfig(data_parallel_size=dp_size, data_parallel_size_local=dp_size_local),
                         is_moe=False, num_experts=0, env={})
    plan = LaunchPlan(engine=EngineConfig(), served_model_name="m", model_path=str(tmp_path), deployment=deployment)
    node = RunningNode(plan, None, str(tmp_path))
    node.started = True
    return node


@pytest.mark.trio
@pytest.mark.parametrize(("dp_size", "dp_size_local", "other_dead", "expected"), [
    (2, None, False, "the other ranks keep serving"),
    (2, None, True, "no rank is left to serve"),  # it said "the other ranks keep serving" with none left
    (1, None, False, "no rank is left to serve"),
    (4, 2, True, "the other ranks keep serving"),  # a head: the headless nodes' ranks serve on
])
async def test_a_dense_engine_exit_says_whether_any_rank_is_left(tmp_path, caplog, dp_size, dp_size_local,
                                                                 other_dead, expected):
    node = _node(tmp_path, dp_size=dp_size, dp_size_local=dp_size_local)
    dying = _Engine(0, exited=False)
    node.children.append(dying)  # type: ignore[arg-type]
    if dp_size > 1:
        node.children.append(_Engine(1, exited=other_dead))  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="asyncdp.launcher"):
        await watch_child(node, dying)  # type: ignore[arg-type]
    assert [r.getMessage() for r in caplog.records] == [
        f"engine rank 0 (asyncdp-engine-dp0, pid 1) exited with code -9; {expected}"]
    assert node.failure is None  # the API servers decide: they exit, or answer 503 with keep-alive
