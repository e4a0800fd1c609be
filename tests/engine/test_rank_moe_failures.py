"""MoE rank teardown, engine loss and orderly shutdown (spec §8.7, §8.8, §13), in virtual time."""

from __future__ import annotations

import pytest
import trio

from asyncdp.errors import EngineDeadError, RankTornDown
from asyncdp.testing import open_rank_cluster as open_cluster


def hang_dummy_steps(rank) -> None:
    """Make the rank's dummy batches take (virtually) forever, as a forward stuck on the device would."""
    executor = rank.core.executor

    def stuck() -> None:
        executor.last_step_s = 1e9

    executor.execute_dummy = stuck


async def crash(c, r: int) -> None:
    """Rank ``r`` dies: its tasks stop and its coordinator link reaches EOF at the coordinator."""
    c.rank_scopes[r].cancel()
    await c.coordinator_links[r].aclose()


@pytest.mark.trio
async def test_engine_link_eof_at_the_coordinator_tears_the_group_down(autojump_clock):
    async with open_cluster(3) as c:
        res = await c.client.add(0, "r", max_tokens=10_000)
        await trio.sleep(0.1)
        with trio.fail_after(1.0):  # far below any collective timeout
            await crash(c, 2)
            for r in (0, 1):
                await c.ended[r].wait()
            await c.coordinator_ended.wait()
        for r in (0, 1):
            assert isinstance(c.outcomes[r], RankTornDown)
            assert "rank 2" in str(c.outcomes[r])
            assert r in c.client.dead  # EngineDead reached the client
        assert isinstance(c.coordinator_outcome[0], EngineDeadError)
        assert not res.done.is_set() or res.finish_reason != "length"


@pytest.mark.trio
async def test_teardown_ends_ranks_blocked_in_a_collective_or_a_stuck_forward(autojump_clock):
    async with open_cluster(3) as c:
        hang_dummy_steps(c.ranks[1])  # rank 1 never reaches the next all-reduce; ranks 0 and 2 wait in it
        await c.client.add(0, "r", max_tokens=10_000)
        await trio.sleep(1.0)
        assert c.groups[0].num_calls > c.groups[1].num_calls  # rank 0 is waiting for rank 1
        with trio.fail_after(1.0):
            await crash(c, 2)
            for r in (0, 1):
                await c.ended[r].wait()
        assert all(isinstance(c.outcomes[r], RankTornDown) for r in (0, 1))


@pytest.mark.trio
async def test_losing_the_coordinator_tears_every_rank_down(autojump_clock):
    async with open_cluster(2) as c:
        await c.client.add(1, "r", max_tokens=10_000)
        await trio.sleep(0.1)
        with trio.fail_after(1.0):
            await c.kill_coordinator()  # both engine links reach EOF
            await c.wait_ended()
        assert all(isinstance(c.outcomes[r], RankTornDown) for r in range(2))
        assert all("coordinator" in str(c.outcomes[r]) for r in range(2))


@pytest.mark.trio
async def test_shutting_down_rank_dummy_steps_until_peers_finish_then_says_goodbye(autojump_clock):
    async with open_cluster(2, sync_interval=8) as c:
        res = await c.client.add(0, "r", max_tokens=50)
        await trio.sleep(0.02)
        c.ranks[1].request_shutdown()
        with trio.fail_after(10):
            await c.ended[1].wait()
        # Rank 1 left only after rank 0's request was done and the group went idle.
        assert res.done.is_set() and res.finish_reason == "length" and len(res.tokens) == 50
        assert c.outcomes[1] is None
        with trio.fail_after(5):
            await c.ended[0].wait()  # Goodbye -> Teardown -> rank 0 was not shutting down: exit 1
            await c.coordinator_ended.wait()
        assert isinstance(c.outcomes[0], RankTornDown)
        assert "rank 1 shut down" in str(c.outcomes[0])
        assert c.coordinator_outcome == [None]  # an orderly departure


@pytest.mark.trio
async def test_a_rank_whose_stop_signal_is_late_leaves_in_order_when_the_deployment_stops(autojump_clock):
    stopping = trio.Event()
    async with open_cluster(2, stopping=stopping) as c:
        stopping.set()  # the launcher told the coordinator first, then signalled the engines
        c.ranks[1].request_shutdown()  # rank 1 got its signal; rank 0's is still in flight
        with trio.fail_after(5):
            await c.wait_ended()
        assert all(c.outcomes[r] is None for r in range(2)), c.outcomes


@pytest.mark.trio
async def test_every_rank_shutting_down_exits_cleanly_and_aborts_in_flight_requests(autojump_clock):
    async with open_cluster(3, shutdown_timeout_s=0.0) as c:
        reqs = [await c.client.add(r, f"r{r}", max_tokens=10_000) for r in range(3)]
        await trio.sleep(0.1)
        for rank in c.ranks:
            rank.request_shutdown()
        with trio.fail_after(5):
            await c.wait_ended()
        assert all(c.outcomes[r] is None for r in range(3))
        assert all(res.finish_reason == "abort" for res in reqs)


@pytest.mark.trio
async def test_draining_rank_finishes_its_requests_before_leaving(autojump_clock):
    async with open_cluster(2, shutdown_timeout_s=30.0) as c:
        res = await c.client.add(1, "r", max_tokens=40)
        await trio.sleep(0.01)
        for rank in c.ranks:
            rank.request_shutdown()
        rejected = await c.client.add(0, "late", max_tokens=4)
        with trio.fail_after(10):
            await c.wait_ended()
        assert res.finish_reason == "length" and len(res.tokens) == 40
        assert rejected.finish_reason == "abort"
        assert all(c.outcomes[r] is None for r in range(2))


@pytest.mark.trio
async def test_a_fatal_error_in_one_ranks_forward_tears_the_group_down(autojump_clock):
    async with open_cluster(3) as c:
        def broken(batch):
            raise RuntimeError("device fault")

        c.ranks[1].core.executor.execute = broken
        res = await c.client.add(1, "r", max_tokens=5)
        with trio.fail_after(2):
            await c.wait_ended()
            await c.coordinator_ended.wait()
        failure = c.outcomes[1]
        assert isinstance(failure, BaseExceptionGroup) and failure.subgroup(RuntimeError) is not None
        assert "device fault" in c.client.dead[1]
        assert all(isinstance(c.outcomes[r], RankTornDown) for r in (0, 2))
        assert isinstance(c.coordinator_outcome[0], EngineDeadError)
        assert not res.done.is_set()
