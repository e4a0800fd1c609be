"""E9 on the head front-end (spec §4.2): when ``--engine-ready-timeout-s`` ends with ranks missing, the startup
failure names them, whichever wait sees the end first (the coordinator's own wait ends a moment later and closes
its links, so engines and handshakes may end before the launcher's deadline is noticed). In virtual time."""

from __future__ import annotations

import shlex
import socket
from dataclasses import dataclass

import anyio
import pytest
import trio

from asyncdp import messages as m
from asyncdp.cli import build_serve_config
from asyncdp.config.flags import EngineConfig
from asyncdp.config.roles import LaunchPlan
from asyncdp.launcher.handshake import handshake
from asyncdp.launcher.node import RunningNode
from asyncdp.launcher.startup import run_startup
from asyncdp.transport import memory_link_pair


@dataclass(frozen=True)
class Facts:
    is_moe: bool = False
    num_experts: int = 0


@pytest.fixture
def head(tmp_path):
    """A head with rank 0 of 2 (rank 1 on another node); each test starts its engine-ready deadline (10 s)."""
    args = "-dp 2 -dpl 1 -dpa 127.0.0.1 -dpp 29550 --api-server-count 1 --engine-ready-timeout-s 10"
    config = build_serve_config(shlex.split(args), env={}, model_facts=lambda _name: Facts())
    plan = LaunchPlan(engine=EngineConfig(executor="sim"), served_model_name="m", model_path=str(tmp_path),
                      deployment=config.deployment, engine_ready_timeout_s=10.0)
    with socket.socket() as sock:
        node = RunningNode(plan, sock, str(tmp_path))
        node.init_ready.set()
        yield node


def _hello(dp_rank: int) -> m.Hello:
    return m.Hello(protocol_version=m.PROTOCOL_VERSION, dp_rank=dp_rank, local=True, headless=False, host="h", pid=1)


async def _engine_0_leaves_after(node: RunningNode, delay_s: float) -> None:
    node.ranks_deadline = trio.current_time() + 10.0
    launcher_end, engine_end = memory_link_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handshake, node, launcher_end)
        await engine_end.send(_hello(0))
        assert isinstance(await engine_end.receive(), m.HandshakeInit)
        await trio.sleep(delay_s)
        await engine_end.aclose()  # the coordinator gave up waiting for rank 1 and rank 0 stopped
    await launcher_end.aclose()


@pytest.mark.trio
async def test_a_handshake_ending_after_the_deadline_is_reported_as_the_rank_that_never_came(head, autojump_clock):
    await _engine_0_leaves_after(head, 10.2)
    assert head.failure is not None and head.failure.startswith(
        "startup failed: ranks 0..1 not ready; rank 1 not connected yet after --engine-ready-timeout-s (10 s): "
        "rank 1 never arrived; start the headless node that runs rank 1 (--headless --data-parallel-start-rank 1) "
        "with -dpa 127.0.0.1 -dpp 29550"), head.failure


@pytest.mark.trio
async def test_a_handshake_ending_before_the_deadline_names_the_engine(head, autojump_clock):
    await _engine_0_leaves_after(head, 1.0)
    assert head.failure == "startup failed: the handshake with engine rank 0 broke off (EndOfStream)"


@pytest.mark.trio
async def test_a_startup_wait_ending_after_the_deadline_is_reported_as_the_rank_that_never_came(head,
                                                                                               autojump_clock):
    head.ranks_deadline = trio.current_time() + 10.0

    async def a_wait_of_its_own() -> None:
        with anyio.fail_after(10.5):  # an API server's own wait, started a moment after the launcher's
            await anyio.sleep_forever()

    await run_startup(head, a_wait_of_its_own)
    assert head.failure is not None and "rank 1 never arrived" in head.failure, head.failure
