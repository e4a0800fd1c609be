"""The dense coordinator when every engine rank is lost: it ends on one node, and serves on where a restarted node
can bring the ranks back (``ranks_can_return``: an API-only head, or a head whose ranks all lived elsewhere)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import trio

from asyncdp.messages import CoordinatorReady, RankStats, StatsSnapshot
from tests.coordinator.harness import DENSE2, coordinator

ACROSS_NODES = dataclasses.replace(DENSE2, ranks_can_return=True)


@pytest.mark.trio
async def test_every_rank_lost_across_nodes_the_coordinator_serves_on_and_takes_a_restarted_rank_back(
        autojump_clock, caplog):
    """An API-only head kept alive (ASYNCDP_KEEP_ALIVE_ON_ENGINE_DEATH) lost its only headless node: the node
    restarted in its place must find the coordinator. It used to stop ("every engine rank is gone"), and the new
    node's engines then failed their startup connecting to it."""
    caplog.set_level(logging.INFO, logger="asyncdp.coordinator.core")
    async with coordinator(ACROSS_NODES) as h:
        e0, e1 = await h.engines(2)
        c = await h.client()
        await e0.close()
        await e1.close()
        await trio.sleep(12)
        assert not h.done.is_set() and h.error is None
        again = await h.engine(1)
        await again.expect(CoordinatorReady)
        await again.send(RankStats(dp_rank=1, num_waiting=2, num_running=0, kv_cache_usage=0.0))
        while (await c.expect(StatsSnapshot))[1].counts[1] != (2, 0, 0.0):
            pass
    assert "every engine rank is gone; the coordinator serves on" in caplog.text


@pytest.mark.trio
@pytest.mark.parametrize("across_nodes", [False, True])
async def test_every_rank_gone_the_coordinator_ends_on_one_node_or_once_the_deployment_stops(autojump_clock,
                                                                                             across_nodes):
    """On one node nothing brings a lost rank back: the coordinator ends when every rank is gone. Across nodes it
    ends when the ranks leave an orderly shutdown."""
    stopping = trio.Event()
    async with coordinator(ACROSS_NODES if across_nodes else DENSE2, stopping=stopping) as h:
        e0, e1 = await h.engines(2)
        if across_nodes:
            stopping.set()
        await e0.close()
        await e1.close()
        with trio.fail_after(1):
            await h.done.wait()
    assert h.error is None
