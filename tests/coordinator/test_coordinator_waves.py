"""The DP coordinator's waves (MoE, wave mode): a FirstRequest starts a wave on every rank, rank 0's
WaveComplete ends it, stale wave messages are ignored; in trio's virtual time, and once on the asyncio
backend."""

from __future__ import annotations

import logging

import anyio
import pytest
import trio

from asyncdp.coordinator.core import serve_coordinator
from asyncdp.messages import (
    CoordinatorReady,
    FirstRequest,
    StartWave,
    StartWaveRequest,
    StatsSnapshot,
    Subscribe,
    WaveComplete,
)
from tests.coordinator.harness import MOE2, MemoryListener, coordinator

# ---------------------------------------------------------------- waves (MoE)


@pytest.mark.trio
async def test_wave_lifecycle_end_to_end(autojump_clock):
    async with coordinator(MOE2) as h:
        e0, e1 = await h.engines(2)
        c = await h.client()
        t_sent = trio.current_time()
        await c.send(FirstRequest(exclude_rank=1, wave=0))
        (t_a, sw0), (_, sw1) = await e0.expect(StartWave), await e1.expect(StartWave)
        t_pub, pub = await c.expect(StatsSnapshot)
        assert sw0 == sw1 == StartWave(wave=0, exclude_rank=1)
        assert t_a == t_pub == t_sent  # wave changes go out at once
        assert (pub.counts, pub.wave, pub.running) == (None, 0, True)

        await e0.send(WaveComplete(wave=0))
        _, pub = await c.expect(StatsSnapshot)
        assert (pub.counts, pub.wave, pub.running) == (None, 1, False)

        # A client whose snapshot is stale (wave 0) wakes every rank, excluding none.
        await c.send(FirstRequest(exclude_rank=0, wave=0))
        _, sw = await e1.expect(StartWave)
        assert sw == StartWave(wave=1, exclude_rank=None)
        _, pub = await c.expect(StatsSnapshot)
        assert (pub.wave, pub.running) == (1, True)


@pytest.mark.trio
async def test_stale_wave_messages_are_ignored(autojump_clock, caplog):
    caplog.set_level(logging.ERROR, logger="asyncdp.coordinator.core")
    async with coordinator(MOE2) as h:
        e0, e1 = await h.engines(2)
        c = await h.client()
        await c.send(FirstRequest(exclude_rank=0, wave=0))
        await e0.expect(StartWave)  # broadcast to all; the excluded rank ignores it
        await e1.expect(StartWave)
        await c.expect(StatsSnapshot)
        await c.send(FirstRequest(exclude_rank=0, wave=0))  # already running
        await e1.send(StartWaveRequest(dp_rank=1, wave=0))  # running: ignored
        await e1.send(WaveComplete(wave=0, dp_rank=1))  # not rank 0: protocol error
        await e1.send(WaveComplete(wave=0, dp_rank=1))  # logged once
        await trio.sleep(1)
        assert [m for _, m in e0.drain() if isinstance(m, StartWave)] == []
        assert [m.running for _, m in c.drain() if isinstance(m, StatsSnapshot)] in ([], [True])
        await e0.send(WaveComplete(wave=0))
        await c.expect(StatsSnapshot)
        await e0.send(WaveComplete(wave=0))  # stale
        await e1.send(StartWaveRequest(dp_rank=1, wave=1))  # idle, current wave: restart
        _, sw = await e0.expect(StartWave)
        assert sw == StartWave(wave=1, exclude_rank=1)
    assert sum("only rank 0" in r.getMessage() for r in caplog.records) == 1


# ---------------------------------------------------------------- asyncio backend


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_wave_wakeup_on_asyncio():
    engines, clients = MemoryListener(), MemoryListener()
    async with anyio.create_task_group() as tg:
        await tg.start(serve_coordinator, MOE2, engines, clients)
        e = [engines.connect() for _ in range(2)]
        for r, link in enumerate(e):
            await link.send(Subscribe(dp_rank=r))
        with anyio.fail_after(5):
            assert isinstance(await e[0].receive(), CoordinatorReady)
            assert isinstance(await e[1].receive(), CoordinatorReady)
            c = clients.connect()
            await c.send(Subscribe(client_id=0))
            assert isinstance(await c.receive(), StatsSnapshot)
            await c.send(FirstRequest(exclude_rank=0, wave=0))
            assert await e[1].receive() == StartWave(wave=0, exclude_rank=0)
        tg.cancel_scope.cancel()
    engines.close()
    clients.close()
