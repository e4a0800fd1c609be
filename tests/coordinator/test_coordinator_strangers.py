"""Strangers on the coordinator's engine listener (TCP on the DP address in multi-node deployments), in trio's
virtual time: a link whose first frame is no engine's ``Subscribe{dp_rank}`` is dropped with one line, during
startup and after it, and a MoE group that serves drops a late ``Subscribe`` instead of failing (it takes no
member back). An unknown or duplicate rank during startup stays a startup error (spec §5.3 step 5)."""

from __future__ import annotations

import logging

import anyio
import pytest
import trio

from asyncdp.messages import Heartbeat, RankStats, StatsSnapshot, Subscribe, Teardown
from tests.coordinator.harness import DENSE2, MOE2, coordinator

NOT_AN_ENGINE = [Heartbeat(sender="x", seq=1), Subscribe(client_id=7), RankStats(dp_rank=0, num_waiting=1,
                                                                                  num_running=0, kv_cache_usage=0.0)]


async def _dropped(link) -> None:
    """The coordinator closes ``link`` (it reads EOF) within a second."""
    with trio.fail_after(1):
        while True:
            try:
                await link.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return


@pytest.mark.trio
@pytest.mark.parametrize("first", NOT_AN_ENGINE, ids=lambda msg: type(msg).__name__)
async def test_a_first_frame_that_is_no_engine_subscribe_during_startup_is_dropped(autojump_clock, caplog, first):
    async with coordinator(MOE2) as h:
        stranger = h.engine_listener.connect()
        await stranger.send(first)
        await _dropped(stranger)
        await h.engines(2)  # every real engine still gets CoordinatorReady: startup goes on
        assert not h.done.is_set() and h.error is None
    assert caplog.text.count("dropping the engine link") == 1
    assert type(first).__name__ in caplog.text


@pytest.mark.trio
@pytest.mark.parametrize("first", [Subscribe(dp_rank=0), Subscribe(dp_rank=5), *NOT_AN_ENGINE],
                         ids=lambda msg: f"{type(msg).__name__}{msg.dp_rank if isinstance(msg, Subscribe) else ''}")
async def test_a_moe_group_that_serves_drops_a_late_engine_link_instead_of_tearing_down(autojump_clock, caplog,
                                                                                      first):
    async with coordinator(MOE2) as h:
        e0, e1 = await h.engines(2)
        client = await h.client()
        stranger = h.engine_listener.connect()
        await stranger.send(first)
        await _dropped(stranger)
        await trio.sleep(10)  # heartbeats flow, snapshots go out: the group serves on
        await client.expect(StatsSnapshot)
        assert not h.done.is_set() and h.error is None
        assert not [msg for _, msg in e0.drain() + e1.drain() if isinstance(msg, Teardown)]
    assert caplog.text.count("dropping the engine link") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.trio
async def test_a_dense_coordinator_that_serves_drops_a_first_frame_that_is_no_subscribe(autojump_clock, caplog):
    async with coordinator(DENSE2) as h:
        await h.engines(2)
        stranger = h.engine_listener.connect()
        await stranger.send(Heartbeat(sender="x", seq=1))
        await _dropped(stranger)
        assert not h.done.is_set() and h.error is None
    assert caplog.text.count("dropping the engine link") == 1
