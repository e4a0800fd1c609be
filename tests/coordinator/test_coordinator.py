"""The DP coordinator over in-memory links, with fake engines and clients, in trio's virtual time."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

import anyio
import pytest
import trio

from asyncdp.coordinator.core import CoordinatorConfig, serve_coordinator
from asyncdp.dp.liveness import PEER_STOP_GRACE_S
from asyncdp.dp.prefix_directory import LONG_PLACEMENT_TOKENS
from asyncdp.errors import AsyncDPError, ConfigError, EngineDeadError, ProtocolError, StartupError
from asyncdp.messages import (
    CoordinatorReady,
    EngineDead,
    FirstRequest,
    Goodbye,
    Heartbeat,
    PrefixClaim,
    PrefixOwner,
    PrefixPlaced,
    RankStats,
    StartWave,
    StartWaveRequest,
    StatsSnapshot,
    Subscribe,
    Teardown,
    WaveComplete,
)

# ---------------------------------------------------------------- in-memory transport fakes


class MemoryLink:
    """One end of a duplex in-memory link carrying message objects (the Link interface of asyncdp.transport)."""

    def __init__(self, send, recv) -> None:
        self._send, self._recv = send, recv

    async def send(self, msg) -> None:
        await self._send.send(msg)

    async def receive(self):
        return await self._recv.receive()

    async def aclose(self) -> None:
        self.close_nowait()

    def close_nowait(self) -> None:
        self._send.close()
        self._recv.close()


def link_pair(max_buffer: int = 1000) -> tuple[MemoryLink, MemoryLink]:
    a_send, b_recv = anyio.create_memory_object_stream(max_buffer)
    b_send, a_recv = anyio.create_memory_object_stream(max_buffer)
    return MemoryLink(a_send, a_recv), MemoryLink(b_send, b_recv)


class MemoryListener:
    def __init__(self) -> None:
        self._send, self._recv = anyio.create_memory_object_stream(100)
        self.links: list[MemoryLink] = []

    def connect(self, max_buffer: int = 1000) -> MemoryLink:
        ours, theirs = link_pair(max_buffer)
        self._send.send_nowait(theirs)
        self.links += [ours, theirs]
        return ours

    def close(self) -> None:
        self._send.close()
        self._recv.close()
        for link in self.links:  # links nobody accepted or closed: no unclosed-stream warnings
            link.close_nowait()

    async def serve(self, handler) -> None:
        async with anyio.create_task_group() as tg:
            async for link in self._recv:
                tg.start_soon(handler, link)


class FakePeer:
    """An engine or client: heartbeats every second, queues every non-heartbeat frame with its arrival time."""

    def __init__(self, link: MemoryLink, nursery: trio.Nursery, name: str, *, reading: bool = True) -> None:
        self.link = link
        self.name = name
        self.beats: list[float] = []
        self.eof_at: float | None = None
        self._q_send, self._q_recv = trio.open_memory_channel(10_000)
        self._hb_scope = trio.CancelScope()
        if reading:  # a peer that never reads still heartbeats: it is alive, only stuck
            nursery.start_soon(self._read)
        nursery.start_soon(self._heartbeat)

    async def _read(self) -> None:
        try:
            while True:
                msg = await self.link.receive()
                if isinstance(msg, Heartbeat):
                    self.beats.append(trio.current_time())
                else:
                    self._q_send.send_nowait((trio.current_time(), msg))
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self.eof_at = trio.current_time()

    async def _heartbeat(self) -> None:
        with self._hb_scope:
            seq = 0
            while True:
                await trio.sleep(1.0)
                seq += 1
                try:
                    await self.link.send(Heartbeat(sender=self.name, seq=seq))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return

    def stop_heartbeats(self) -> None:
        self._hb_scope.cancel()

    async def send(self, msg) -> None:
        await self.link.send(msg)

    async def expect(self, cls, within_s: float = 10.0):
        """The next queued message of type ``cls`` (others are skipped), as (arrival time, message)."""
        with trio.fail_after(within_s):
            while True:
                t, msg = await self._q_recv.receive()
                if isinstance(msg, cls):
                    return t, msg

    def drain(self) -> list[tuple[float, object]]:
        out = []
        while True:
            try:
                out.append(self._q_recv.receive_nowait())
            except trio.WouldBlock:
                return out

    async def close(self) -> None:
        self.stop_heartbeats()
        await self.link.aclose()


class Harness:
    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.engine_listener = MemoryListener()
        self.client_listener = MemoryListener()
        self.error: BaseException | None = None
        self.done = trio.Event()
        self.ended_at: float | None = None

    async def engine(self, rank: int) -> FakePeer:
        peer = FakePeer(self.engine_listener.connect(), self.nursery, f"engine-{rank}")
        await peer.send(Subscribe(dp_rank=rank))
        return peer

    async def engines(self, n: int) -> list[FakePeer]:
        peers = [await self.engine(r) for r in range(n)]
        for p in peers:
            await p.expect(CoordinatorReady)
        return peers

    async def client(self, index: int = 0) -> FakePeer:
        peer = FakePeer(self.client_listener.connect(), self.nursery, f"client-{index}")
        await peer.send(Subscribe(client_id=index))
        await peer.expect(StatsSnapshot)  # the welcome snapshot
        return peer


@asynccontextmanager
async def coordinator(config: CoordinatorConfig, *, stopping: trio.Event | None = None):
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)

        async def main() -> None:
            try:
                await serve_coordinator(config, h.engine_listener, h.client_listener, stopping=stopping)
            except AsyncDPError as exc:
                h.error = exc
            h.ended_at = trio.current_time()
            h.done.set()

        nursery.start_soon(main)
        try:
            yield h
        finally:
            nursery.cancel_scope.cancel()
            h.engine_listener.close()
            h.client_listener.close()


MOE2 = CoordinatorConfig(dp_size=2, wave_mode=True)
DENSE2 = CoordinatorConfig(dp_size=2, wave_mode=False)


# ---------------------------------------------------------------- startup


@pytest.mark.trio
async def test_coordinator_ready_only_after_all_engines_subscribe(autojump_clock):
    async with coordinator(MOE2) as h:
        e0 = await h.engine(0)
        await trio.sleep(3)
        assert [m for _, m in e0.drain()] == []
        e1 = await h.engine(1)
        (t0, _), (t1, _) = await e0.expect(CoordinatorReady), await e1.expect(CoordinatorReady)
        assert t0 == t1 == pytest.approx(3.0)


@pytest.mark.trio
async def test_duplicate_engine_subscribe_is_startup_error(autojump_clock):
    async with coordinator(MOE2) as h:
        await h.engine(1)
        await h.engine(1)
        await h.done.wait()
    assert isinstance(h.error, StartupError) and "duplicate" in str(h.error)


@pytest.mark.trio
async def test_unknown_engine_rank_is_startup_error(autojump_clock):
    async with coordinator(MOE2) as h:
        await h.engine(2)
        await h.done.wait()
    assert isinstance(h.error, StartupError) and "unknown engine rank 2" in str(h.error)


@pytest.mark.trio
async def test_missing_engine_after_subscribe_timeout_names_the_rank(autojump_clock):
    config = CoordinatorConfig(dp_size=3, wave_mode=False, subscribe_timeout_s=30)
    async with coordinator(config) as h:
        await h.engine(0)
        await h.engine(2)
        await h.done.wait()
    assert isinstance(h.error, StartupError) and "[1]" in str(h.error)
    assert h.ended_at == pytest.approx(30.0)


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


def test_config_rejects_heartbeat_interval_above_timeout():
    with pytest.raises(ConfigError, match="--dp-heartbeat-interval-s"):
        CoordinatorConfig(dp_size=2, wave_mode=True, heartbeat_interval_s=6.0)


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
async def test_silent_client_is_dropped_but_coordinator_continues(autojump_clock):
    async with coordinator(DENSE2) as h:
        await h.engines(2)
        quiet = await h.client(0)
        quiet.stop_heartbeats()
        await trio.sleep(7)
        assert quiet.eof_at is not None
        other = await h.client(1)
        assert not h.done.is_set() and other.eof_at is None


@pytest.mark.trio
async def test_a_client_that_stops_reading_is_cut_off_when_its_outbox_is_full_and_others_are_served(
        autojump_clock, caplog):
    """No silent loss: the coordinator never skips a message for a peer that does not read; once that peer's
    outbox is full it closes the peer's link (the peer sees EOF and subscribes again) and serves on."""
    caplog.set_level(logging.INFO, logger="asyncdp.coordinator.core")
    config = CoordinatorConfig(dp_size=2, wave_mode=False, outbox_size=2)
    async with coordinator(config) as h:
        await h.engines(2)
        other = await h.client(0)
        stuck_link = h.client_listener.connect(max_buffer=1)
        stuck = FakePeer(stuck_link, h.nursery, "client-1", reading=False)
        await stuck.send(Subscribe(client_id=1))
        # Heartbeats every 1 s: one fills the link's buffer, one blocks the writer, two fill the outbox; the
        # next one finds it full (long before a send could time out, after heartbeat_timeout_s).
        await trio.sleep(config.heartbeat_timeout_s + 1)
        with trio.fail_after(0.1):  # cut: what was queued, then EOF (a live link would go on forever)
            with pytest.raises((anyio.EndOfStream, anyio.ClosedResourceError)):
                while True:
                    await stuck_link.receive()
        beats_before = len(other.beats)
        await trio.sleep(3)
        assert len(other.beats) >= beats_before + 2 and other.eof_at is None and not h.done.is_set()
    assert any("client 1 is not reading (outbox full" in r.getMessage() for r in caplog.records)


@pytest.mark.trio
async def test_an_unknown_inbox_item_is_a_protocol_error(autojump_clock):
    from asyncdp.coordinator.core import Coordinator

    coord = Coordinator(DENSE2)
    async with coord._inbox_send, coord._inbox_recv:
        with pytest.raises(ProtocolError, match="unknown inbox item"):
            await coord._handle(("lost", 0, "positional", False))


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


# ---------------------------------------------------------------- a dropped client follows it again (issue #12)


@pytest.mark.trio
async def test_a_client_the_coordinator_dropped_for_silence_subscribes_again_and_gets_snapshots(autojump_clock):
    """A client whose heartbeats stopped (its event loop was blocked) is dropped by the real coordinator; the
    DP client connects and subscribes again instead of staying "coordinator dead" for good."""
    from asyncdp.apiserver.client import ClientConfig, DPClient
    from asyncdp.testing.links import MemoryLinkListener

    config = CoordinatorConfig(dp_size=2, wave_mode=False, heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0,
                               subscribe_timeout_s=None)
    engines, clients = MemoryLinkListener(name="engines"), MemoryLinkListener(name="clients")
    # A heartbeat interval past the coordinator's timeout stands in for a blocked event loop.
    client = DPClient(ClientConfig(client_index=0, client_count=1, managed_ranks=(0, 1), dp_size=2,
                                   model_name="m", max_model_len=64, heartbeat_interval_s=30.0), tokenizer=None)
    connects = 0

    async def connect():
        nonlocal connects
        connects += 1
        return clients.connect()

    try:
        await _follow_a_silent_client(config, engines, clients, client, connect, lambda: connects)
    finally:
        engines.close()
        clients.close()


async def _follow_a_silent_client(config, engines, clients, client, connect, connects) -> None:
    async with anyio.create_task_group() as tg:
        await tg.start(serve_coordinator, config, engines, clients)
        t0 = trio.current_time()
        tg.start_soon(client.follow_coordinator, connect)
        await trio.sleep(1.0)
        assert client.coordinator_state == "alive" and client.snapshot_age_s() is not None
        await trio.sleep(5.5)  # dropped after 5 s of silence, then followed again after the backoff
        assert connects() == 2
        assert client.coordinator_state == "alive"
        assert client.coordinator.snapshot_received_at >= t0 + 5.5  # the new subscription's snapshot
        client.begin_shutdown()
        tg.cancel_scope.cancel()


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


# ---------------------------------------------------------------- the prefix directory


def claim(seq: int, hashes: list[int], proposal: int, first: int = 0, last: int = 3) -> PrefixClaim:
    return PrefixClaim(seq=seq, hashes=hashes, proposal=proposal, prompt_tokens=16 * len(hashes),
                       first_rank=first, last_rank=last)


@pytest.mark.trio
async def test_clients_agree_on_a_new_prefix_through_the_coordinator_and_a_dead_owner_loses_it(autojump_clock,
                                                                                               caplog):
    async with coordinator(CoordinatorConfig(dp_size=4, wave_mode=False)) as h:
        engines = await h.engines(4)
        a, b = await h.client(0), await h.client(1)
        await a.send(claim(7, [11, 12, 13, 14], proposal=1))
        t_sent = trio.current_time()
        t, owner = await a.expect(PrefixOwner)
        assert owner == PrefixOwner(seq=7, owner=1, matched=0, others=[0.0] * 4) and t == t_sent  # at once
        await b.send(claim(3, [11, 12, 99], proposal=2))  # the same system prompt, another question
        _, owner = await b.expect(PrefixOwner)
        # the owner, the blocks it shares, and client a's new-prefix tokens (64) on rank 1
        assert owner == PrefixOwner(seq=3, owner=1, matched=2, others=[0.0, 64.0, 0.0, 0.0])
        # a malformed claim (a proposal outside its own scope) is dropped with a warning; the link stays up
        with caplog.at_level(logging.WARNING):
            await b.send(claim(4, [5], proposal=3, first=0, last=1))
            await b.send(claim(5, [5], proposal=0, first=0, last=1))
            _, owner = await b.expect(PrefixOwner)
        assert owner.seq == 5 and "dropping a prefix claim" in caplog.text
        # the owner's engine dies: the prefix is placed again, not on it
        await engines[1].close()
        await trio.sleep(6)
        await b.send(claim(6, [11, 12, 99], proposal=1))
        _, owner = await b.expect(PrefixOwner)
        assert owner.owner != 1 and owner.matched == 0


@pytest.mark.trio
async def test_a_claims_candidates_reach_the_directory_which_counts_every_clients_prefixes(autojump_clock, caplog):
    async with coordinator(CoordinatorConfig(dp_size=4, wave_mode=False)) as h:
        await h.engines(4)
        a, b = await h.client(0), await h.client(1)
        await a.send(claim(1, [21, 22], proposal=0))
        _, owner = await a.expect(PrefixOwner)
        assert owner.owner == 0
        await trio.sleep(10)  # the recent new-prefix tokens decay away; the entry stays
        # b never saw a's prefix: for it, rank 0 is as good as rank 3, but rank 0 owns one prefix and rank 3 none
        await b.send(PrefixClaim(seq=1, hashes=[31], proposal=0, prompt_tokens=16, first_rank=0, last_rank=3,
                                 candidates=[0, 3]))
        _, owner = await b.expect(PrefixOwner)
        assert owner.owner == 3
        with caplog.at_level(logging.WARNING):  # a candidate outside the claimant's scope: dropped, link kept
            await b.send(PrefixClaim(seq=2, hashes=[41], proposal=0, prompt_tokens=16, first_rank=0, last_rank=1,
                                     candidates=[0, 2]))
            await b.send(claim(3, [41], proposal=1))
            _, owner = await b.expect(PrefixOwner)
        assert owner.seq == 3 and "dropping a prefix claim" in caplog.text


@pytest.mark.trio
async def test_a_deep_claim_reaches_the_directory_which_records_the_proposal_unplaced(autojump_clock):
    async with coordinator(CoordinatorConfig(dp_size=4, wave_mode=False)) as h:
        await h.engines(4)
        a, b = await h.client(0), await h.client(1)
        await a.send(claim(1, [21], proposal=1))  # a new prefix on rank 1: its new-prefix tokens are counted
        await a.expect(PrefixOwner)
        # a plain claim proposing rank 1 now gives way; a deep one (a run after a prefix b placed) keeps it
        await b.send(claim(1, [51, 52], proposal=1))
        _, plain = await b.expect(PrefixOwner)
        await b.send(PrefixClaim(seq=2, hashes=[61, 62], proposal=1, prompt_tokens=32, first_rank=0, last_rank=3,
                                 deep=True))
        _, deep = await b.expect(PrefixOwner)
        await a.send(PrefixClaim(seq=2, hashes=[61, 62, 63], proposal=3, prompt_tokens=48, first_rank=0,
                                 last_rank=3, deep=True))
        _, found = await a.expect(PrefixOwner)
    assert plain.owner != 1 and deep.owner == 1 and (found.owner, found.matched) == (1, 2)


@pytest.mark.trio
async def test_a_long_new_prefix_is_told_to_every_other_client_at_once(autojump_clock):
    async with coordinator(CoordinatorConfig(dp_size=4, wave_mode=False)) as h:
        await h.engines(4)
        a, b, c = await h.client(0), await h.client(1), await h.client(2)
        await a.send(PrefixClaim(seq=1, hashes=[71, 72], proposal=2, prompt_tokens=LONG_PLACEMENT_TOKENS,
                                 first_rank=0, last_rank=3))
        t_sent = trio.current_time()
        await a.expect(PrefixOwner)
        for other in (b, c):  # the others hear of it before any snapshot could show it
            t, placed = await other.expect(PrefixPlaced)
            assert placed == PrefixPlaced(rank=2, prompt_tokens=LONG_PLACEMENT_TOKENS) and t == t_sent
        await trio.sleep(0.01)
        assert not [msg for _, msg in a.drain() if isinstance(msg, PrefixPlaced)]  # the claimant knows
        # not the claimant; not a shorter new prefix, a known one or a deep claim's run
        await a.send(PrefixClaim(seq=2, hashes=[81], proposal=1, prompt_tokens=LONG_PLACEMENT_TOKENS - 1,
                                 first_rank=0, last_rank=3))
        await b.send(PrefixClaim(seq=1, hashes=[71, 72, 73], proposal=0, prompt_tokens=3 * LONG_PLACEMENT_TOKENS,
                                 first_rank=0, last_rank=3))
        await c.send(PrefixClaim(seq=1, hashes=[91], proposal=0, prompt_tokens=LONG_PLACEMENT_TOKENS, first_rank=0,
                                 last_rank=3, deep=True))
        for peer in (a, b, c):
            await peer.expect(PrefixOwner)
        await trio.sleep(0.01)
        assert not [msg for peer in (a, b, c) for _, msg in peer.drain() if isinstance(msg, PrefixPlaced)]


@pytest.mark.trio
async def test_a_client_that_leaves_takes_its_new_prefix_counts_with_it(autojump_clock):
    async with coordinator(CoordinatorConfig(dp_size=4, wave_mode=False)) as h:
        await h.engines(4)
        a, b = await h.client(0), await h.client(1)
        await a.send(claim(1, [21, 22], proposal=2))
        await a.expect(PrefixOwner)
        await b.send(claim(1, [31], proposal=0))
        _, owner = await b.expect(PrefixOwner)
        assert owner.others == [0.0, 0.0, 32.0, 0.0]  # a's new prefix on rank 2
        await a.close()
        await trio.sleep(0.001)  # (the counts decay over 0.5 s: 0.2 % in this time)
        await b.send(claim(2, [41], proposal=1))
        _, owner = await b.expect(PrefixOwner)
        assert owner.others == [0.0, 0.0, 0.0, 0.0]
