"""What the DP coordinator publishes and how often, in trio's virtual time: the idle heartbeat snapshot,
changing stats at most every 100 ms, what a snapshot carries (and, behind an external load balancer, does
not), and the heartbeats it sends its engines and clients."""

from __future__ import annotations

import pytest
import trio

from asyncdp.coordinator.core import CoordinatorConfig
from asyncdp.messages import RankStats, StatsSnapshot
from tests.coordinator.harness import DENSE2, coordinator

# ---------------------------------------------------------------- publishing cadence


@pytest.mark.trio
async def test_idle_coordinator_publishes_heartbeat_snapshot_every_5s(autojump_clock):
    async with coordinator(DENSE2) as h:
        await h.engines(2)
        c = await h.client()
        start = trio.current_time()
        await trio.sleep(21)
        times = [t - start for t, m in c.drain() if isinstance(m, StatsSnapshot)]
    assert len(times) == 4
    assert all(b - a == pytest.approx(5.0) for a, b in zip(times, times[1:], strict=False))


@pytest.mark.trio
async def test_changing_stats_are_published_at_most_every_100ms(autojump_clock):
    async with coordinator(DENSE2) as h:
        e0, _ = await h.engines(2)
        c = await h.client()
        await trio.sleep(6)  # past the first heartbeat snapshot
        c.drain()
        start = trio.current_time()
        for k in range(100):  # a change every 10 ms for 1 s
            await e0.send(RankStats(dp_rank=0, num_waiting=k, num_running=1, kv_cache_usage=0.5))
            await trio.sleep(0.01)
        await trio.sleep(0.2)
        snaps = [(t - start, m) for t, m in c.drain() if isinstance(m, StatsSnapshot)]
    gaps = [b[0] - a[0] for a, b in zip(snaps, snaps[1:], strict=False)]
    assert 9 <= len(snaps) <= 11
    assert min(gaps) >= 0.1 - 1e-9 and max(gaps) <= 0.1 + 0.011
    assert snaps[-1][1].counts == [(99, 1, 0.5), (0, 0, 0.0)]
    assert [m.seq for _, m in snaps] == sorted({m.seq for _, m in snaps})


@pytest.mark.trio
async def test_snapshots_carry_every_ranks_prompt_tokens_still_to_compute_and_cache_fill(autojump_clock):
    async with coordinator(DENSE2) as h:
        e0, e1 = await h.engines(2)
        c = await h.client()
        await trio.sleep(6)
        c.drain()
        await e1.send(RankStats(dp_rank=1, num_waiting=1, num_running=0, kv_cache_usage=0.0, prefill_tokens=55_000,
                                cache_fill=0.75))
        await trio.sleep(0.2)
        snaps = [m for _, m in c.drain() if isinstance(m, StatsSnapshot)]
    assert snaps[-1].counts == [(0, 0, 0.0), (1, 0, 0.0)] and snaps[-1].prefill_tokens == [0, 55_000]
    assert snaps[-1].cache_fill == [0.0, 0.75]


@pytest.mark.trio
async def test_external_mode_snapshots_carry_no_counts(autojump_clock):
    config = CoordinatorConfig(dp_size=2, wave_mode=False, external_lb=True)
    async with coordinator(config) as h:
        e0, _ = await h.engines(2)
        c = await h.client()
        await e0.send(RankStats(dp_rank=0, num_waiting=3, num_running=1, kv_cache_usage=0.5))
        _, snap = await c.expect(StatsSnapshot)
    assert snap.counts is None


@pytest.mark.trio
async def test_coordinator_heartbeats_engines_and_clients_every_interval(autojump_clock):
    async with coordinator(DENSE2) as h:
        e0, _ = await h.engines(2)
        c = await h.client()
        await trio.sleep(10.5)
    assert len(e0.beats) >= 10 and len(c.beats) >= 9
    assert all(b - a == pytest.approx(1.0) for a, b in zip(e0.beats, e0.beats[1:], strict=False))
