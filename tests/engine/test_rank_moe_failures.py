"""MoE rank teardown, engine loss and orderly shutdown (spec §8.7, §8.8, §13), in virtual time."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import trio

from asyncdp.config.flags import SimCostProfile
from asyncdp.dp.liveness import PEER_STOP_GRACE_S
from asyncdp.dp.lockstep import LEAVE_WAIT_S
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


async def torn_down_after_the_grace(c) -> None:
    """Rank 1 left the group in order: rank 0 is torn down once the coordinator's grace has passed (Goodbye ->
    Teardown), naming rank 1, and the coordinator ends in order."""
    with trio.fail_after(PEER_STOP_GRACE_S + 1.0):
        await c.ended[0].wait()
        await c.coordinator_ended.wait()
    assert isinstance(c.outcomes[0], RankTornDown) and "rank 1 shut down" in str(c.outcomes[0])
    assert c.coordinator_outcome == [None]


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


async def steady_traffic(c, rank: int, name: str, outcomes: list, *, start_after_s: float = 0.0,
                         ended: trio.Event | None = None) -> None:
    """Back-to-back requests to ``rank`` until one does not end normally (then ``ended`` is set); several loops
    started apart keep the rank, and so its group, busy without a pause. Records how each one ended."""
    await trio.sleep(start_after_s)
    try:
        for i in range(10_000):
            res = await c.client.add(rank, f"{name}-{i}", max_tokens=100)
            await res.done.wait()
            outcomes.append((res.finish_reason, res.error_type, res.error))
            if res.error_type is not None:
                return
    finally:
        if ended is not None:
            ended.set()



async def _stop_rank_1_under_traffic(c) -> float:
    """Stop rank 1 of a busy group; returns how long it took to leave, in order (Goodbye), within the bound + 1 s."""
    stopped_at = trio.current_time()
    c.ranks[1].request_shutdown()
    with trio.fail_after(LEAVE_WAIT_S + 1.0):
        await c.ended[1].wait()
    assert c.outcomes[1] is None  # an orderly end: Goodbye
    return trio.current_time() - stopped_at

@pytest.mark.trio
async def test_a_rank_stopped_while_its_peer_never_idles_leaves_after_its_bound_and_the_group_ends(autojump_clock):
    # The defect: under steady traffic the group never goes idle, so the stopping rank dummy-stepped until its
    # launcher killed it (5 s). Now it leaves LEAVE_WAIT_S past its drain deadline, at a sync both ranks share.
    async with open_cluster(2) as c, trio.open_nursery() as traffic:
        outcomes: list = []
        loops_ended = [trio.Event() for _ in range(3)]
        for k, ended in enumerate(loops_ended):
            traffic.start_soon(functools.partial(steady_traffic, c, 0, f"t{k}", outcomes, start_after_s=0.05 * k,
                                                 ended=ended))
        await trio.sleep(0.5)
        left_after = await _stop_rank_1_under_traffic(c)
        assert left_after >= LEAVE_WAIT_S, left_after  # rank 0's requests had that long to end first
        assert ("length", None, None) in outcomes  # ...and some did
        assert c.groups[0].num_calls == c.groups[1].num_calls  # the same last collective: nobody blocks in one
        with trio.fail_after(0.1):  # rank 0 abandoned its requests at once, naming why
            for ended in loops_ended:
                await ended.wait()
        abandoned = [o for o in outcomes if o[1] is not None]
        assert all(o[1] == "abandoned" and "engine rank 0" in o[2] and "MoE group ended" in o[2]
                   for o in abandoned), abandoned
        late = await c.client.add(0, "late", max_tokens=4)
        with trio.fail_after(0.1):
            await late.done.wait()
        assert late.error_type == "unavailable" and "MoE group ended" in (late.error or "")
        assert c.ranks[1].state.shutting_down and c.groups[0].num_calls == c.groups[1].num_calls
        await torn_down_after_the_grace(c)


@pytest.mark.trio
async def test_a_busy_group_whose_ranks_are_stopped_a_moment_apart_ends_in_order(autojump_clock):
    stopping = trio.Event()
    async with open_cluster(2, stopping=stopping) as c, trio.open_nursery() as traffic:
        outcomes: list = []
        for k in range(3):
            traffic.start_soon(functools.partial(steady_traffic, c, 0, f"t{k}", outcomes, start_after_s=0.05 * k))
        await trio.sleep(0.5)
        c.ranks[1].request_shutdown()
        with trio.fail_after(LEAVE_WAIT_S + 1.0):
            await c.ended[1].wait()
        stopping.set()  # rank 0's node is stopped too, within the coordinator's grace
        c.ranks[0].request_shutdown()
        with trio.fail_after(1.0):
            await c.wait_ended()
            await c.coordinator_ended.wait()
        assert all(c.outcomes[r] is None for r in range(2)), c.outcomes
        assert c.coordinator_outcome == [None]


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


@pytest.mark.trio
async def test_a_rank_stopped_while_its_group_is_idle_ends_the_group_at_a_shared_collective(autojump_clock):
    # The defect: the stopping rank found the group idle and left without a collective (Goodbye, exit), so a request
    # that reached its peer within the coordinator's grace started a wave whose all-reduce met the departed rank:
    # with gloo a crash ("Connection closed by peer") and a 503 that named it. Now the leave is agreed at a sync.
    async with open_cluster(2) as c:
        warm = await c.client.add(0, "warm", max_tokens=4)
        with trio.fail_after(1.0):
            await warm.done.wait()
            await c.wait_reported_idle()
        c.ranks[1].request_shutdown()
        with trio.fail_after(1.0):
            await c.ended[1].wait()
        assert c.outcomes[1] is None  # an orderly end: Goodbye
        assert c.groups[0].num_calls == c.groups[1].num_calls  # the same last collective: rank 0 cannot start one
        late = await c.client.add(0, "late", max_tokens=4)
        with trio.fail_after(0.1):
            await late.done.wait()
        assert late.error_type == "unavailable", (late.error_type, late.error)
        assert late.error == "engine rank 0 cannot serve: its MoE group ended (a stopping rank left it)"
        assert 0 not in c.client.dead  # no EngineDead: rank 0 did not die
        await torn_down_after_the_grace(c)


@pytest.mark.trio
async def test_a_request_racing_the_idle_leave_is_refused_cleanly(autojump_clock):
    # The request reaches rank 0 while rank 1 is still on its way out of an idle group: whichever comes first,
    # rank 0 never blocks in (or dies in) a collective with a departed rank; the request is refused cleanly.
    async with open_cluster(2) as c:
        c.ranks[1].request_shutdown()
        late = await c.client.add(0, "late", max_tokens=4)
        with trio.fail_after(1.0):
            await late.done.wait()
            await c.ended[1].wait()
        assert c.outcomes[1] is None
        # refused, or admitted and then abandoned at the group's end: either way the clean reason, never a crash
        assert late.error_type in ("unavailable", "abandoned"), late
        assert late.error == "engine rank 0 cannot serve: its MoE group ended (a stopping rank left it)", late
        assert 0 not in c.client.dead
        assert c.groups[0].num_calls == c.groups[1].num_calls


SLOW_STEP = SimCostProfile(a_ms=150.0)  # a loaded machine: 150 ms a step


async def _next_sync(group) -> None:
    """Until ``group``'s member completes its next collective."""
    synced = trio.Event()
    reduce = group.all_reduce

    async def all_reduce(values, op="sum"):
        result = await reduce(values, op)
        synced.set()
        return result

    group.all_reduce = all_reduce
    await synced.wait()
    group.all_reduce = reduce


@pytest.mark.trio
async def test_a_rank_stopped_right_after_a_sync_of_a_slow_busy_group_leaves_one_step_after_its_bound(autojump_clock):
    # The defect: both ranks busy with long requests, the group synced every 32 steps (4.8 s at 150 ms a step), so a
    # rank stopped just after a sync left only at the next one, past its launcher's kill deadline (5 s). Now the
    # group syncs at least every MAX_SYNC_GAP_S and, once a rank stops, every step until it leaves.
    async with open_cluster(2, cost=SLOW_STEP) as c, trio.open_nursery() as traffic:
        outcomes: list = []
        for r in range(2):
            traffic.start_soon(functools.partial(steady_traffic, c, r, f"r{r}", outcomes))
        await trio.sleep(3.0)
        await _next_sync(c.groups[1])  # just after a sync: the worst moment to stop
        left_after = await _stop_rank_1_under_traffic(c)
        assert LEAVE_WAIT_S <= left_after <= LEAVE_WAIT_S + 2 * 0.15, left_after  # the bound, then one step
        assert c.groups[0].num_calls == c.groups[1].num_calls
        traffic.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_rank_of_its_own_launch_whose_peer_left_as_the_head_stopped_exits_1_naming_the_cause(autojump_clock):
    # The defect: rank 0's node (the head, with the coordinator) was stopped; the coordinator's orderly Teardown
    # made rank 1, an external-LB rank server nobody asked to stop, exit 0 as if stopping too (spec §13: 1). Now a
    # rank whose node does not stop with the head ends as torn down (EngineDead naming the cause), and says that a
    # peer's orderly stop did it (peer_stopped: its launcher gives its own signal a grace).
    stopping = trio.Event()
    async with open_cluster(2, stopping=stopping) as c, trio.open_nursery() as traffic:
        c.ranks[1].cfg = dataclasses.replace(c.ranks[1].cfg, stops_with_head=False)
        outcomes: list = []
        ended = trio.Event()
        traffic.start_soon(functools.partial(steady_traffic, c, 1, "t", outcomes, ended=ended))
        await trio.sleep(0.5)
        stopping.set()  # the head's launcher: Stopping to its coordinator, then the signal to its engine
        c.ranks[0].request_shutdown()
        with trio.fail_after(LEAVE_WAIT_S + 1.0):
            await c.wait_ended()
            await ended.wait()
        assert c.outcomes[0] is None
        torn = c.outcomes[1]
        assert isinstance(torn, RankTornDown) and torn.peer_stopped, torn
        assert str(torn) == "rank 1: its MoE group ended (teardown from the coordinator: rank 0 shut down)"
        assert c.client.dead[1] == str(torn)  # EngineDead: the API names the cause, not a closed link
        # The last request started a wave on rank 1 as rank 0 left the idle group at that wave's first sync: its
        # first token was held for that sync, so its client saw nothing and it is refused (it used to be sent, and
        # the request then abandoned: tests/engine/test_rank_moe_leave_race.py), naming the same cause.
        assert outcomes[-1] == ("abort", "unavailable",
                                "engine rank 1 cannot serve: its MoE group ended (a stopping rank left it)")


@pytest.mark.trio
async def test_a_rank_of_its_own_launch_whose_node_is_stopping_takes_its_peers_orderly_leave_for_its_own_stop(
        autojump_clock):
    # The whole deployment stopped at once (every rank server signalled): a launcher signals its engines only after
    # its API servers drained, so the head's engine may leave first. Its launcher's Stopping came at the start of the
    # node's stop (expect_stop): the peer's orderly leave is then this rank's own stop, early (spec §8.7: exit 0, no
    # EngineDead, nothing above INFO), not a teardown.
    stopping = trio.Event()
    async with open_cluster(2, stopping=stopping) as c:
        c.ranks[1].cfg = dataclasses.replace(c.ranks[1].cfg, stops_with_head=False)
        c.ranks[1].expect_stop()
        stopping.set()
        c.ranks[0].request_shutdown()
        with trio.fail_after(LEAVE_WAIT_S + 1.0):
            await c.wait_ended()
        assert c.outcomes == {0: None, 1: None}  # both ended in order
        assert 1 not in c.client.dead  # no EngineDead


@pytest.mark.trio
async def test_a_long_drain_syncs_at_the_normal_cadence_until_its_deadline_then_every_step_until_the_leave(
        autojump_clock):
    # The stopping flag makes the group sync every step (a gloo all-reduce each on CPU). Raised from the stop on, a
    # --shutdown-timeout of minutes cost one all-reduce per step for all of them; it is raised from the drain
    # deadline on, LEAVE_WAIT_S before the leave, which still lands one step after its bound.
    async with open_cluster(2, cost=SLOW_STEP, shutdown_timeout_s=6.0) as c, trio.open_nursery() as traffic:
        outcomes: list = []
        for r in range(2):
            traffic.start_soon(functools.partial(steady_traffic, c, r, f"r{r}", outcomes))
        await trio.sleep(3.0)
        stopped_at = trio.current_time()
        syncs_at_stop = c.groups[1].num_calls
        c.ranks[1].request_shutdown()
        await trio.sleep(5.0)  # within the drain: 5 s of 150 ms steps
        during_drain = c.groups[1].num_calls - syncs_at_stop
        assert during_drain <= 5.0 / 0.5 + 2, during_drain  # at the time cap's cadence, not 33 syncs (every step)
        with trio.fail_after(6.0 - 5.0 + LEAVE_WAIT_S + 1.0):
            await c.ended[1].wait()
        left_after = trio.current_time() - stopped_at
        assert c.outcomes[1] is None
        assert 6.0 + LEAVE_WAIT_S <= left_after <= 6.0 + LEAVE_WAIT_S + 2 * 0.15, left_after
        traffic.cancel_scope.cancel()
