"""The DP coordinator losing engines, in trio's virtual time: in wave mode (MoE) an engine's EOF, silence,
EngineDead or Goodbye tears the others down (orderly only when the deployment is stopping); a dense
coordinator serves on, takes a restarted rank back, and ends when every engine is gone."""

from __future__ import annotations

import logging

import pytest
import trio

from asyncdp.coordinator.core import CoordinatorConfig
from asyncdp.dp.liveness import PEER_STOP_GRACE_S
from asyncdp.errors import EngineDeadError
from asyncdp.messages import CoordinatorReady, EngineDead, Goodbye, RankStats, StatsSnapshot, Teardown
from tests.coordinator.harness import DENSE2, MOE2, coordinator

# ---------------------------------------------------------------- engine loss


@pytest.mark.trio
async def test_moe_engine_eof_tears_down_the_others_at_once(autojump_clock):
    config = CoordinatorConfig(dp_size=3, wave_mode=True)
    async with coordinator(config) as h:
        e0, e1, e2 = await h.engines(3)
        t_fail = trio.current_time()
        await e1.close()
        (t0, td0), (t2, td2) = await e0.expect(Teardown), await e2.expect(Teardown)
        await h.done.wait()
    assert td0 == td2 and td0.dead_rank == 1
    assert t0 - t_fail <= 0.01 and t2 - t_fail <= 0.01
    assert isinstance(h.error, EngineDeadError) and "engine rank 1" in str(h.error)


@pytest.mark.trio
async def test_moe_silent_engine_is_dead_after_heartbeat_timeout(autojump_clock):
    async with coordinator(MOE2) as h:
        e0, e1 = await h.engines(2)
        t_silent = trio.current_time()
        e1.stop_heartbeats()
        t, td = await e0.expect(Teardown, within_s=20)
        await h.done.wait()
    assert 5.0 <= t - t_silent <= 6.0
    assert td.dead_rank == 1 and "heartbeat" in td.reason
    assert isinstance(h.error, EngineDeadError)


@pytest.mark.trio
async def test_moe_engine_dead_message_tears_down_with_its_reason(autojump_clock):
    async with coordinator(MOE2) as h:
        e0, e1 = await h.engines(2)
        await e0.send(EngineDead(dp_rank=0, reason="CUDA error"))
        _, td = await e1.expect(Teardown)
        await h.done.wait()
    assert td.dead_rank == 0 and "CUDA error" in td.reason
    assert isinstance(h.error, EngineDeadError)


@pytest.mark.trio
async def test_moe_goodbye_is_orderly_teardown(autojump_clock):
    async with coordinator(MOE2) as h:
        e0, e1 = await h.engines(2)
        await e1.send(Goodbye(dp_rank=1))
        _, td = await e0.expect(Teardown)
        await h.done.wait()
    assert td.reason == "rank 1 shut down" and td.dead_rank == 1
    assert not td.orderly  # one rank left on its own: its peers must report the group's end as a failure
    assert h.error is None


@pytest.mark.trio
async def test_goodbye_while_the_deployment_stops_is_an_orderly_teardown_for_every_peer(autojump_clock):
    stopping = trio.Event()
    async with coordinator(MOE2, stopping=stopping) as h:
        e0, e1 = await h.engines(2)
        stopping.set()  # the launcher announced an orderly shutdown before signalling the engines
        await e1.send(Goodbye(dp_rank=1))
        _, td = await e0.expect(Teardown)
        await h.done.wait()
    assert td.orderly and td.dead_rank == 1


@pytest.mark.trio
async def test_a_stop_announced_within_the_grace_after_a_goodbye_makes_the_teardown_orderly(autojump_clock):
    # SIGTERM to every rank server of an external-LB group: the peer's signal was read first, this deployment's
    # a moment later. Its peers were shutting down too, so they exit 0 (spec §8.7).
    stopping = trio.Event()
    async with coordinator(MOE2, stopping=stopping) as h:
        e0, e1 = await h.engines(2)
        await e1.send(Goodbye(dp_rank=1))
        await trio.sleep(PEER_STOP_GRACE_S * 0.75)
        assert [m for _, m in e0.drain() if isinstance(m, Teardown)] == []
        stopping.set()
        _, td = await e0.expect(Teardown)
        await h.done.wait()
    assert td.orderly and td.dead_rank == 1


@pytest.mark.trio
async def test_a_goodbye_with_no_stop_within_the_grace_tears_down_as_a_failure_once_it_ends(autojump_clock):
    async with coordinator(MOE2) as h:
        e0, e1 = await h.engines(2)
        sent = trio.current_time()
        await e1.send(Goodbye(dp_rank=1))
        at, td = await e0.expect(Teardown)
        await h.done.wait()
    assert not td.orderly and at - sent == pytest.approx(PEER_STOP_GRACE_S, abs=0.1)


@pytest.mark.trio
async def test_dense_engine_loss_keeps_serving_and_ends_when_all_gone(autojump_clock):
    async with coordinator(DENSE2) as h:
        e0, e1 = await h.engines(2)
        c = await h.client()
        await e0.close()
        await e1.send(RankStats(dp_rank=1, num_waiting=2, num_running=0, kv_cache_usage=0.0))
        _, snap = await c.expect(StatsSnapshot)
        assert snap.counts[1] == (2, 0, 0.0)
        await trio.sleep(12)
        assert not h.done.is_set() and e1.eof_at is None
        assert [m for _, m in e1.drain() if isinstance(m, Teardown)] == []
        await e1.send(Goodbye(dp_rank=1))
        await h.done.wait()
    assert h.error is None


@pytest.mark.trio
async def test_a_dense_ranks_engine_that_subscribes_again_rejoins_the_statistics(autojump_clock, caplog):
    """A restarted dense node's engine subscribes for its dead rank (spec §13): it gets CoordinatorReady and its
    stats are published again. The coordinator used to fail with a "duplicate Subscribe" StartupError."""
    caplog.set_level(logging.INFO, logger="asyncdp.coordinator.core")
    async with coordinator(DENSE2) as h:
        e0, e1 = await h.engines(2)
        c = await h.client()
        await e1.send(RankStats(dp_rank=1, num_waiting=3, num_running=1, kv_cache_usage=0.5))
        await c.expect(StatsSnapshot)
        await e1.close()
        await trio.sleep(1)
        again = await h.engine(1)
        await again.expect(CoordinatorReady)
        _, snap = await c.expect(StatsSnapshot)
        assert snap.counts[1] == (0, 0, 0.0)  # the lost engine's last counts are gone with it
        await again.send(RankStats(dp_rank=1, num_waiting=2, num_running=0, kv_cache_usage=0.0))
        while (await c.expect(StatsSnapshot))[1].counts[1] != (2, 0, 0.0):
            pass
        assert not h.done.is_set() and h.error is None
    assert "engine rank 1 subscribed again (its node was restarted)" in caplog.text


@pytest.mark.trio
async def test_a_restarted_engine_waits_until_its_silent_predecessor_is_marked_dead(autojump_clock):
    """A lost host is seen only after the heartbeat timeout: the new engine's CoordinatorReady waits for that, and
    the old link's end afterwards does not take the rank down again."""
    async with coordinator(DENSE2) as h:
        e0, e1 = await h.engines(2)
        c = await h.client()
        e1.stop_heartbeats()
        start = trio.current_time()
        again = await h.engine(1)
        t, _ = await again.expect(CoordinatorReady)
        assert 5.0 <= t - start <= 6.5
        await e1.link.aclose()
        await trio.sleep(1)
        await again.send(RankStats(dp_rank=1, num_waiting=4, num_running=0, kv_cache_usage=0.0))
        while (await c.expect(StatsSnapshot))[1].counts[1] != (4, 0, 0.0):
            pass
        await e0.close()
        await trio.sleep(1)
        assert not h.done.is_set()  # rank 1 is alive: not every engine is gone


@pytest.mark.trio
async def test_a_bad_subscription_after_startup_drops_that_link_and_the_dense_coordinator_serves_on(autojump_clock):
    async with coordinator(DENSE2) as h:
        await h.engines(2)
        stray = await h.engine(7)
        await trio.sleep(1)
        assert stray.eof_at is not None and not h.done.is_set() and h.error is None


@pytest.mark.trio
async def test_dense_engines_closing_while_the_deployment_stops_are_logged_as_left_not_lost(autojump_clock, caplog):
    caplog.set_level(logging.DEBUG, logger="asyncdp.coordinator.core")
    stopping = trio.Event()
    async with coordinator(DENSE2, stopping=stopping) as h:
        e0, e1 = await h.engines(2)
        stopping.set()  # the launcher announced an orderly shutdown before stopping the engines
        await e0.close()
        await e1.close()
        await h.done.wait()
    messages = [r.getMessage() for r in caplog.records]
    assert not any("lost" in msg for msg in messages), messages
    assert all(r.levelno <= logging.INFO for r in caplog.records), messages
    assert "every engine rank left; the coordinator stops" in messages


@pytest.mark.trio
async def test_dense_engine_closing_while_serving_is_a_warning_that_it_was_lost(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="asyncdp.coordinator.core")
    async with coordinator(DENSE2) as h:
        e0, e1 = await h.engines(2)
        await e0.close()
        await e1.close()
        await h.done.wait()
    lost = [r for r in caplog.records if "engine rank 0 lost" in r.getMessage()]
    assert len(lost) == 1 and lost[0].levelno == logging.WARNING


@pytest.mark.trio
async def test_a_dense_engine_that_says_goodbye_left_in_order_and_is_logged_at_info_not_as_lost(autojump_clock,
                                                                                              caplog):
    """A dense rank its own node stopped in order (a headless or hybrid node's SIGTERM) says ``Goodbye`` before its
    link closes: a departure at INFO. The coordinator used to log WARNING "engine rank 1 lost" for it."""
    caplog.set_level(logging.INFO, logger="asyncdp.coordinator.core")
    async with coordinator(DENSE2) as h:
        e0, e1 = await h.engines(2)
        await e1.send(Goodbye(dp_rank=1))
        await e1.close()
        await trio.sleep(1)
        assert not h.done.is_set() and e0.eof_at is None  # the other rank serves on
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert (logging.INFO, "engine rank 1 left in order (its node is stopping); it leaves the load statistics") \
        in messages, messages
    assert not [m for level, m in messages if level >= logging.WARNING], messages
