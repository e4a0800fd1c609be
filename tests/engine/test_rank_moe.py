"""MoE engine ranks in lockstep (spec §8.3-8.4, §6.5): N EngineRanks with the simulated executor, a
MemoryDPGroup and the real coordinator, in one trio event loop under virtual time."""

from __future__ import annotations

import pytest
import trio

from asyncdp import messages as m
from asyncdp.testing import open_rank_cluster as open_cluster
from asyncdp.transport import Link


def forwards(cluster, r: int) -> int:
    return cluster.ranks[r].state.steps + cluster.ranks[r].state.dummy_steps


@pytest.mark.trio
@pytest.mark.parametrize("n", [2, 3, 4])
async def test_requests_on_every_rank_complete_and_the_group_goes_idle(autojump_clock, n):
    async with open_cluster(n, sync_interval=8) as c:
        with trio.fail_after(30):
            results = [await c.client.add(i % n, f"req-{i}", max_tokens=3 + 5 * i) for i in range(2 * n)]
            for res in results:
                await res.done.wait()
            await c.wait_idle()
        for i, res in enumerate(results):
            assert res.finish_reason == "length"
            assert len(res.tokens) == 3 + 5 * i
        # Lockstep: every rank ran the same number of forwards and of collectives, and agrees on the wave.
        assert len({forwards(c, r) for r in range(n)}) == 1
        assert len({g.num_calls for g in c.groups}) == 1
        assert len({c.ls(r).current_wave for r in range(n)}) == 1
        assert all(c.ranks[r].state.waves_completed >= 1 for r in range(n))
        # The coordinator saw the WaveComplete: clients learn that the group is paused.
        await trio.sleep(0.5)
        assert not c.client.wave_running
        assert c.client.current_wave == c.ls(0).current_wave


@pytest.mark.trio
async def test_idle_rank_runs_dummy_steps_while_a_peer_works(autojump_clock):
    async with open_cluster(3, sync_interval=16) as c:
        with trio.fail_after(30):
            res = await c.client.add(1, "busy", max_tokens=40)
            await res.done.wait()
            await c.wait_idle()
        assert c.ranks[1].state.steps == 40
        for idle in (0, 2):
            assert c.ranks[idle].state.steps == 0
            assert c.ranks[idle].state.dummy_steps == forwards(c, 1)  # one dummy per forward of the busy rank
        # Step 1 saw idle ranks, so every step synced: released on the step the request finished.
        assert forwards(c, 1) == 40
        assert len({c.ls(r).num_syncs for r in range(3)}) == 1 and c.ls(1).num_syncs == 40


@pytest.mark.trio
async def test_busy_group_syncs_every_interval_and_pauses_on_the_last_step_when_ranks_finish_apart(autojump_clock):
    async with open_cluster(2, sync_interval=8) as c:
        with trio.fail_after(30):
            long = await c.client.add(0, "long", max_tokens=30)
            short = await c.client.add(1, "short", max_tokens=12)
            for res in (long, short):
                await res.done.wait()
            await c.wait_idle()
        assert [c.ranks[r].state.steps for r in range(2)] == [30, 12]
        # Syncs at 1 (and 2 when rank 1's request came a step late), 9 (both busy: every interval), 17 (rank 1
        # idle since step 12), then every step until rank 0's last one: no dummy after the last real step.
        assert forwards(c, 0) == 30 and c.ranks[0].state.dummy_steps == 0
        assert c.ranks[1].state.dummy_steps == 30 - 12
        assert 16 <= c.ls(0).num_syncs <= 17
        assert len({c.ls(r).num_syncs for r in range(2)}) == 1


@pytest.mark.trio
@pytest.mark.parametrize(("cadence", "expected_dummies"), [("asyncdp", 1), ("vllm", 32)])
async def test_group_pauses_right_after_a_short_burst_only_with_the_asyncdp_cadence(
        autojump_clock, cadence, expected_dummies):
    async with open_cluster(2, cadence=cadence) as c:
        with trio.fail_after(30):
            for wave in range(3):
                res = await c.client.add(0, f"burst-{wave}", max_tokens=1)
                await res.done.wait()
                await c.wait_idle()
                await trio.sleep(0.5)  # the coordinator publishes the completed wave
                assert not c.client.wave_running
        assert c.ranks[1].state.dummy_steps == 3 * expected_dummies
        assert c.ranks[0].state.dummy_steps == 3 * (expected_dummies - 1)
        assert [c.ranks[r].state.waves_completed for r in range(2)] == [3, 3]
        assert not any(c.ls(r).engines_running for r in range(2))


@pytest.mark.trio
async def test_wave_transitions_send_scheduler_stats_to_client_0(autojump_clock):
    async with open_cluster(2, sync_interval=4) as c:
        with trio.fail_after(30):
            res = await c.client.add(0, "r", max_tokens=6)
            await res.done.wait()
            await c.wait_reported_idle()
        idle_stats = c.client.stats[1]  # rank 1 never had outputs: all its stats come from wave transitions
        assert [s.wave_running for s in idle_stats] == [True, False]
        assert idle_stats[-1].wave == 1
        # Counters are deltas since the previous attached stats: their sum is the rank's total.
        assert sum(s.waves_completed for s in idle_stats) == 1
        assert sum(s.num_dummy_steps for s in idle_stats) == c.ranks[1].state.dummy_steps == 6  # dense: 6 steps
        assert c.client.stats[0][-1].wave_running is False


@pytest.mark.trio
async def test_counters_attached_to_outputs_are_deltas_that_sum_to_the_rank_totals(autojump_clock):
    async with open_cluster(2, sync_interval=4) as c:
        with trio.fail_after(30):
            for i in range(3):
                # The same prompt each time: later requests hit the prefix cache.
                res = await c.client.add(i % 2, f"r{i}", max_tokens=5, prompt_len=40)
                await res.done.wait()
                await c.wait_reported_idle()
        for r in range(2):
            got = c.client.stats[r]
            total = c.ranks[r].scheduler_stats()
            assert len(got) > 2
            for field in ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "num_dummy_steps",
                          "waves_completed"):
                assert sum(getattr(s, field) for s in got) == getattr(total, field), field
        assert c.ranks[0].scheduler_stats().prefix_cache_hits > 0


class InterceptLink(Link):
    """A link end whose sends go through ``on_send(msg, forward)``."""

    def __init__(self, inner: Link, on_send) -> None:
        self.name = inner.name
        self.inner = inner
        self.on_send = on_send

    async def send(self, msg) -> None:
        await self.on_send(msg, self.inner.send)

    async def receive(self):
        return await self.inner.receive()

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.trio
@pytest.mark.parametrize("target", [0, 1])
@pytest.mark.parametrize("order", ["before", "after"])
async def test_request_arriving_as_rank0_reports_wave_complete_restarts_the_group(autojump_clock, target, order):
    """The client still believes the wave runs (no FirstRequest) and stamps the completing wave; the engine
    that gets it must restart the group itself (StartWaveRequest), whichever of the two reaches the
    coordinator first."""
    late: list = []
    cluster = None

    async def on_send(msg, forward):
        if isinstance(msg, m.WaveComplete) and not late:
            assert cluster is not None
            cluster.client.send_first_request = False
            if order == "after":
                await forward(msg)
            late.append(await cluster.client.add(target, "late", max_tokens=5, wave=msg.wave))
            if order == "before":
                await forward(msg)
            return
        await forward(msg)

    wrap = {0: lambda link: InterceptLink(link, on_send)}
    async with open_cluster(2, wrap_coordinator_link=lambda r, link: wrap.get(r, lambda x: x)(link)) as c:
        cluster = c
        with trio.fail_after(30):
            first = await c.client.add(1 - target, "first", max_tokens=3)
            await first.done.wait()
            while not late:
                await c.client.stats_arrived.wait()
            await late[0].done.wait()
            await c.wait_idle()
        assert late[0].finish_reason == "length" and len(late[0].tokens) == 5
        assert c.ls(0).current_wave == c.ls(1).current_wave == 2
        assert forwards(c, 0) == forwards(c, 1)


@pytest.mark.trio
async def test_many_requests_to_random_ranks_with_stale_and_fresh_waves_all_complete(autojump_clock):
    import random

    rnd = random.Random(7)
    async with open_cluster(4, sync_interval=4) as c:
        results = []
        with trio.fail_after(120):
            for i in range(40):
                c.client.send_first_request = rnd.random() < 0.7
                results.append(await c.client.add(rnd.randrange(4), f"q{i}", max_tokens=rnd.randint(1, 12)))
                await trio.sleep(rnd.choice([0.0, 0.001, 0.01, 0.05]))
            for res in results:
                await res.done.wait()
            await c.wait_idle()
        assert all(res.finish_reason == "length" for res in results)
        assert len({forwards(c, r) for r in range(4)}) == 1


@pytest.mark.trio
@pytest.mark.parametrize("interval", [1, 4])
async def test_new_prefills_join_running_decodes_only_on_every_kth_wave_step(autojump_clock, interval):
    async with open_cluster(2, prefill_schedule_interval=interval, sync_interval=64) as c:
        batches: list[tuple[int, int, int]] = []  # (wave step, prefill tokens, decode seqs) of rank 0's forwards
        executor = c.ranks[0].core.executor
        execute = executor.execute

        def recording(batch):
            batches.append((c.ls(0).step_counter, batch.num_prefill_tokens, batch.num_decode_seqs))
            return execute(batch)

        executor.execute = recording
        with trio.fail_after(30):
            results = [await c.client.add(0, "long", max_tokens=120)]
            for i in range(8):
                await trio.sleep(0.0031 * (i + 1))
                results.append(await c.client.add(0, f"short-{i}", max_tokens=3))
            for res in results:
                await res.done.wait()
        assert all(res.finish_reason == "length" for res in results)
        mixed = [step for step, prefill, decode in batches if prefill and decode]
        assert mixed
        if interval == 4:
            assert all(step % 4 == 0 for step in mixed)
        else:
            assert any(step % 4 != 0 for step in mixed)  # without the cadence prefills join at any step


@pytest.mark.trio
async def test_ranks_finishing_on_the_same_step_pause_on_it_through_the_drain_horizon(autojump_clock):
    async with open_cluster(2, sync_interval=32) as c:
        with trio.fail_after(30):
            results = [await c.client.add(r, f"same-{r}", max_tokens=45) for r in range(2)]
            for res in results:
                await res.done.wait()
            await c.wait_idle()
        assert [c.ranks[r].state.steps for r in range(2)] in ([45, 45], [45, 46], [46, 45])
        # Step 33's sync carried horizon 12 (or 13): the next sync is the last real step, no dummy forward after it.
        assert [c.ranks[r].state.dummy_steps for r in range(2)] in ([0, 0], [0, 1], [1, 0])
        assert c.ls(0).num_syncs <= 4
