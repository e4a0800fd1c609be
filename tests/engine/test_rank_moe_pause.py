"""Two-phase pause of MoE ranks (spec §8.6) and its forced interleavings, in virtual time."""

from __future__ import annotations

import pytest
import trio

from asyncdp import messages as m
from asyncdp.testing import open_rank_cluster as open_cluster


async def pause_all(c, mode: str = "keep") -> None:
    ids = [await c.client.call_nowait(r, "pause", mode=mode) for r in range(c.n)]
    for call_id in ids:
        res = await c.client.wait_utility(call_id)
        assert res.ok, res.error


async def resume_all(c) -> None:
    ids = [await c.client.call_nowait(r, "resume") for r in range(c.n)]
    for call_id in ids:
        res = await c.client.wait_utility(call_id)
        assert res.ok, res.error


@pytest.mark.trio
async def test_pause_abort_during_generation_aborts_requests_and_resume_serves_again(autojump_clock):
    async with open_cluster(2, sync_interval=8) as c:
        with trio.fail_after(30):
            running = [await c.client.add(r, f"long-{r}", max_tokens=500) for r in range(2)]
            await trio.sleep(0.05)
            await pause_all(c, "abort")
            for res in running:
                await res.done.wait()
                assert res.finish_reason == "abort"
            for r in range(2):
                assert (await c.client.call(r, "is_paused")).value is True
                assert not c.ls(r).engines_running and c.ls(r).ignore_start_wave
            await resume_all(c)
            after = await c.client.add(1, "after", max_tokens=4)
            await after.done.wait()
        assert after.finish_reason == "length"


@pytest.mark.trio
async def test_pause_wait_answers_only_after_running_requests_finish(autojump_clock):
    async with open_cluster(2, sync_interval=4) as c:
        with trio.fail_after(30):
            res = await c.client.add(0, "r", max_tokens=30)
            await trio.sleep(0.01)
            ids = [await c.client.call_nowait(r, "pause", mode="wait") for r in range(2)]
            queued = await c.client.add(1, "queued", max_tokens=2)  # arrives paused: held until resume
            for call_id in ids:
                assert (await c.client.wait_utility(call_id)).ok
            assert res.done.is_set() and res.finish_reason == "length" and len(res.tokens) == 30
            await trio.sleep(1.0)
            assert not queued.done.is_set()
            await resume_all(c)
            await queued.done.wait()
        assert queued.finish_reason == "length"


@pytest.mark.trio
async def test_pause_keep_freezes_a_request_and_it_continues_after_resume(autojump_clock):
    async with open_cluster(2, sync_interval=4) as c:
        with trio.fail_after(30):
            res = await c.client.add(0, "r", max_tokens=20)
            while len(res.tokens) < 3:
                await c.client.stats_arrived.wait()
            await pause_all(c, "keep")
            frozen_at = len(res.tokens)
            dummies = [c.ranks[r].state.dummy_steps for r in range(2)]
            await trio.sleep(2.0)
            assert len(res.tokens) == frozen_at < 20
            assert [c.ranks[r].state.dummy_steps for r in range(2)] == dummies  # a paused group does not step
            await resume_all(c)
            await res.done.wait()
        assert len(res.tokens) == 20


@pytest.mark.trio
async def test_resume_fails_while_a_pause_is_in_progress_and_is_a_noop_when_not_paused(autojump_clock):
    async with open_cluster(2) as c:
        with trio.fail_after(30):
            assert (await c.client.call(0, "resume")).ok  # not paused: no-op
            pending = await c.client.call_nowait(0, "pause", mode="keep")
            await trio.sleep(0.5)
            failed = await c.client.call(0, "resume")
            assert not failed.ok and failed.error == "resume called while a pause is still in progress"
            assert failed.error_kind == m.PAUSE_ERROR  # the API server answers it with 409, not 500
            assert c.ranks[1].state.dummy_steps > 0  # the partial pause keeps the group stepping
            assert (await c.client.call(1, "pause", mode="keep")).ok
            assert (await c.client.wait_utility(pending)).ok
            await resume_all(c)
            res = await c.client.add(0, "r", max_tokens=3)
            await res.done.wait()


@pytest.mark.trio
async def test_pause_requests_seconds_apart_and_requests_in_between_do_not_deadlock(autojump_clock):
    """Acceptance (c): pause(keep) to rank 0, two requests, pause(keep) to rank 1 three seconds later."""
    async with open_cluster(2) as c:
        with trio.fail_after(30):
            first = await c.client.call_nowait(0, "pause", mode="keep")
            reqs = [await c.client.add(r, f"r{r}", max_tokens=8) for r in range(2)]
            await trio.sleep(3.0)
            assert not c.client.utility.get(first)  # no consensus yet
            assert c.ranks[0].state.dummy_steps > 100  # rank 0 kept the collectives going for 3 s
            assert (await c.client.call(1, "pause", mode="keep")).ok
            assert (await c.client.wait_utility(first)).ok
            assert not reqs[0].done.is_set()  # queued on paused rank 0
            assert reqs[1].done.is_set()  # rank 1 was not paused yet: served while rank 0 dummy-stepped
            await resume_all(c)
            for res in reqs:
                await res.done.wait()
        assert all(len(res.tokens) == 8 for res in reqs)


@pytest.mark.trio
async def test_stale_start_wave_while_paused_is_ignored_and_the_group_serves_after_resume(autojump_clock):
    async with open_cluster(2) as c:
        with trio.fail_after(30):
            await pause_all(c)
            dummies = [c.ranks[r].state.dummy_steps for r in range(2)]
            waves = [c.ls(r).current_wave for r in range(2)]
            # A client with a stale wave asks to start the group: the coordinator wakes everybody.
            await c.client.coord.send(m.FirstRequest(exclude_rank=0, wave=0))
            await trio.sleep(1.0)
            assert c.client.wave_running  # the coordinator believes the group runs ...
            assert [c.ranks[r].state.dummy_steps for r in range(2)] == dummies  # ... but paused ranks ignore it
            assert [c.ls(r).current_wave for r in range(2)] == waves
            assert not any(c.ls(r).engines_running for r in range(2))
            await resume_all(c)
            res = await c.client.add(1, "after", max_tokens=5)  # the client may still believe the wave runs
            await res.done.wait()
            await c.wait_idle()
        assert res.finish_reason == "length"


@pytest.mark.trio
async def test_resume_barrier_on_one_rank_while_a_request_is_forced_onto_the_other(autojump_clock):
    """Acceptance (d): all paused; resume on rank 0 only; a request pinned to rank 1 (its StartWave is stale
    for paused rank 1); resume on rank 1 five seconds later: everything completes."""
    async with open_cluster(2) as c:
        with trio.fail_after(30):
            await pause_all(c)
            barrier = await c.client.call_nowait(0, "resume")
            await trio.sleep(0.1)
            res = await c.client.add(1, "pinned", max_tokens=6)
            await trio.sleep(5.0)
            assert barrier not in c.client.utility  # rank 0 waits in the barrier for rank 1
            assert not res.done.is_set()
            assert (await c.client.call(1, "resume")).ok
            assert (await c.client.wait_utility(barrier)).ok
            await res.done.wait()
            await c.wait_idle()
        assert res.finish_reason == "length" and len(res.tokens) == 6
        assert c.ls(0).current_wave == c.ls(1).current_wave


@pytest.mark.trio
async def test_pause_on_an_already_paused_group_answers_at_once(autojump_clock):
    async with open_cluster(2) as c:
        with trio.fail_after(30):
            await pause_all(c, "keep")
            calls_before = [g.num_calls for g in c.groups]
            assert (await c.client.call(0, "pause", mode="abort")).ok
            assert [g.num_calls for g in c.groups] == calls_before  # no collective needed
            assert (await c.client.call(0, "pause", mode="bogus")).ok is False
