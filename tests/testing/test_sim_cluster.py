"""The simulation harness: a coordinator, two sim-executor ranks and two DP clients in one trio run, in virtual
time (trio ``MockClock(autojump_threshold=0)`` through pytest-trio's ``autojump_clock`` fixture).

Placement of a single request can depend on trio's scheduling order (two clients racing at one instant), so the
tests assert bounds and invariants, never exact placements.
"""

from __future__ import annotations

from contextlib import aclosing, asynccontextmanager

import anyio
import pytest
import trio

from asyncdp.config.flags import EngineConfig
from asyncdp.errors import EngineDeadError
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing import InjectedFault, SimRequest, open_sim_cluster, stream_rng

PUBLISH_S = 0.1
HEARTBEAT_PUBLISH_S = 5.0
EPS = 1e-6
DEADLINE_S = 120.0  # virtual seconds: a request that never ends fails the test instead of hanging it


@asynccontextmanager
async def sim_cluster(*args, deadline_s: float = DEADLINE_S, **kwargs):
    with trio.fail_after(deadline_s):
        async with open_sim_cluster(*args, **kwargs) as cluster:
            yield cluster


def workload(n: int, *, num_clients: int = 2, seed: int = 0, max_tokens: tuple[int, int] = (8, 48),
             spacing_s: float = 0.0) -> list[SimRequest]:
    """``n`` requests from the seeded ``workload`` stream, dealt to the clients round-robin."""
    rng = stream_rng(seed, "workload")
    out = []
    for i in range(n):
        prompt = [rng.randrange(1, 30_000) for _ in range(rng.randrange(16, 160))]
        params = SamplingParams(max_tokens=rng.randrange(*max_tokens), ignore_eos=True)
        out.append(SimRequest(i % num_clients, prompt, params, delay_s=i * spacing_s))
    return out


def tokens_of(outs) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


@pytest.mark.trio
async def test_concurrent_requests_spread_over_every_rank_and_inflight_returns_to_zero(autojump_clock):
    total = 200
    reqs = workload(total)
    async with sim_cluster(2, 2) as cluster:
        results = await cluster.complete_all(reqs)
        finished = cluster.finished_counts()
        assert sum(finished) == total
        assert all(n > total // (cluster.dp_size + 1) for n in finished), finished
        for req, (rid, outs) in zip(reqs, results.items(), strict=True):
            assert not isinstance(outs, Exception), (rid, outs)
            assert outs[-1].finished and outs[-1].finish_reason == "length"
            assert len(tokens_of(outs)) == req.params.max_tokens
        assert cluster.inflight_counts() == [0, 0]
        assert all(c.lb.inflight == [0, 0] for c in cluster.clients)
        await cluster.wait_idle()
        assert cluster.kv_usage() == [0.0, 0.0]
        assert trio.current_time() > 0.1  # the cost model made time pass


@pytest.mark.trio
async def test_snapshots_come_at_most_every_100ms_under_load_and_every_5s_when_idle(autojump_clock):
    async with sim_cluster(2, 2) as cluster:
        start = trio.current_time()
        await cluster.complete_all(workload(200, spacing_s=0.01))
        load_end = trio.current_time()
        await trio.sleep(21.0)
        end = trio.current_time()
        for per_client in cluster.snapshots:
            times = [t for t, _ in per_client[1:]]  # after the welcome snapshot
            gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
            assert gaps and min(gaps) >= PUBLISH_S - EPS, min(gaps)
            busy = [t for t in times if start + PUBLISH_S < t <= load_end]
            busy_gaps = [b - a for a, b in zip(busy, busy[1:], strict=False)]
            assert len(busy) >= (load_end - start) / (2 * PUBLISH_S)
            assert max(busy_gaps) <= 1.5 * PUBLISH_S, max(busy_gaps)
            idle = [t for t in times if t > load_end + PUBLISH_S + EPS]
            idle_gaps = [b - a for a, b in zip(idle, idle[1:], strict=False)]
            assert len(idle) >= int((end - load_end) // HEARTBEAT_PUBLISH_S) - 1
            assert all(abs(g - HEARTBEAT_PUBLISH_S) < EPS for g in idle_gaps), idle_gaps
            last = per_client[-1][1]
            assert last.counts is not None and all(w == 0 and r == 0 for w, r, _ in last.counts)


@pytest.mark.trio
async def test_killed_rank_fails_its_inflight_requests_and_later_requests_go_to_the_survivor(autojump_clock):
    params = SamplingParams(max_tokens=400, ignore_eos=True)  # long enough to be running at the kill
    first = [SimRequest(i % 2, [7, i + 1, 9, 11], params) for i in range(40)]
    async with sim_cluster(2, 2) as cluster:
        results = {}

        async def run_first() -> None:
            results.update(await cluster.complete_all(first))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_first)
            await trio.sleep(0.5)
            assert all(r.core.has_unfinished() for r in cluster.ranks)
            await cluster.kill_rank(1)
        on_dead = [rid for rid in results if cluster.routed[rid] == 1]
        on_live = [rid for rid in results if cluster.routed[rid] == 0]
        assert on_dead and on_live
        assert all(isinstance(results[rid], EngineDeadError) for rid in on_dead)
        assert all(len(tokens_of(results[rid])) == 400 for rid in on_live)

        dead_finished = cluster.finished_counts()[1]
        later = await cluster.complete_all(workload(30))
        assert all(not isinstance(v, Exception) for v in later.values())
        assert {cluster.routed[rid] for rid in later} == {0}
        assert cluster.finished_counts()[1] == dead_finished
        assert all(c.lb.dead_ranks == [1] for c in cluster.clients)
        assert cluster.inflight_counts() == [0, 0]


@pytest.mark.trio
async def test_crashed_rank_announces_engine_dead_to_clients_with_its_reason(autojump_clock):
    params = SamplingParams(max_tokens=400, ignore_eos=True)
    async with sim_cluster(2, 2) as cluster:
        results = {}

        async def run() -> None:
            results.update(await cluster.complete_all(
                [SimRequest(i % 2, [3, i + 1], params) for i in range(20)]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await trio.sleep(0.2)
            await cluster.crash_rank(0, "simulated GPU fault")
        assert isinstance(cluster.rank_errors[0], InjectedFault)
        assert 1 not in cluster.rank_errors
        dead = [v for rid, v in results.items() if cluster.routed[rid] == 0]
        assert dead and all(isinstance(v, EngineDeadError) and "simulated GPU fault" in str(v) for v in dead)
        assert all(not isinstance(v, Exception) for rid, v in results.items() if cluster.routed[rid] == 1)
        assert cluster.inflight_counts() == [0, 0]


@pytest.mark.trio
async def test_leaving_the_generator_early_aborts_the_request_and_frees_its_kv_blocks(autojump_clock):
    prompt = list(range(1, 200))
    async with sim_cluster(2, 1) as cluster:
        client = cluster.clients[0]
        usage_while_running = None
        received = 0
        async with aclosing(client.generate("long", prompt, SamplingParams(max_tokens=2000, ignore_eos=True))) as gen:
            async for out in gen:
                received += len(out.new_token_ids)
                if received >= 3:
                    usage_while_running = cluster.kv_usage()[cluster.routed["long"]]
                    break
        assert usage_while_running is not None and usage_while_running > 0
        await cluster.wait_idle()
        rank = cluster.routed["long"]
        assert cluster.kv_usage() == [0.0, 0.0]
        assert cluster.finished_counts()[rank] == 1
        assert cluster.ranks[rank].core.executor.num_steps < 100  # stopped long before max_tokens
        assert cluster.inflight_counts() == [0]


@pytest.mark.trio
async def test_without_a_coordinator_clients_balance_on_inflight_counts(autojump_clock):
    async with sim_cluster(2, 2, with_coordinator=False) as cluster:
        assert cluster.coordinator is None
        results = await cluster.complete_all(workload(60))
        assert all(not isinstance(v, Exception) for v in results.values())
        assert all(n > 60 // 3 for n in cluster.finished_counts())
        assert cluster.snapshots == [[], []]


@pytest.mark.trio
async def test_tokens_depend_only_on_the_seeded_workload_not_on_placement(autojump_clock):
    runs = []
    for codec in (False, True):  # the second run also round-trips every message through the wire codec
        async with sim_cluster(2, 2, codec=codec) as cluster:
            results = await cluster.complete_all(workload(30, seed=7))
            runs.append({rid: tokens_of(outs) for rid, outs in results.items()})
    assert runs[0] == runs[1]
    assert len(runs[0]) == 30


@pytest.mark.trio
async def test_requests_due_at_one_instant_are_routed_in_submission_order_every_run(autojump_clock):
    runs = []
    for _ in range(3):  # trio shuffles the run order of ready tasks differently in every run
        async with sim_cluster(2, 2) as cluster:
            start = trio.current_time()
            await cluster.complete_all(workload(100, seed=3))
            runs.append((dict(cluster.routed), cluster.finished_counts(), round(trio.current_time() - start, 6)))
    assert runs[0] == runs[1] == runs[2]
    assert set(runs[0][0].values()) == {0, 1}


@pytest.mark.anyio
async def test_cluster_runs_in_real_time_on_both_backends_with_a_zero_cost_profile(anyio_backend):
    zero_cost = EngineConfig(executor="sim", num_kv_blocks=1024)  # no modelled step time: nothing to wait
    with anyio.fail_after(30):
        async with open_sim_cluster(2, 2, engine_config=zero_cost) as cluster:
            results = await cluster.complete_all(workload(20, max_tokens=(4, 12)))
            assert all(not isinstance(v, Exception) for v in results.values())
            assert sum(cluster.finished_counts()) == 20 and min(cluster.finished_counts()) > 0
            assert cluster.inflight_counts() == [0, 0]


@pytest.mark.slow
@pytest.mark.trio
async def test_soak_thousands_of_requests_over_hours_of_virtual_time(autojump_clock):
    total = 4000
    rng = stream_rng(1, "arrivals")
    reqs, t = [], 0.0
    for r in workload(total, seed=1, max_tokens=(16, 128)):
        t += rng.expovariate(1 / 2.5)  # ~2.5 s between arrivals: about 2.8 hours in all
        reqs.append(SimRequest(r.client_index, r.prompt_token_ids, r.params, delay_s=t))
    async with sim_cluster(2, 2, deadline_s=6 * 3600) as cluster:
        results = await cluster.complete_all(reqs)
        assert trio.current_time() > 2 * 3600
        assert all(not isinstance(v, Exception) for v in results.values())
        assert sum(cluster.finished_counts()) == total
        assert all(n > total // 3 for n in cluster.finished_counts())
        await cluster.wait_idle()
        assert cluster.kv_usage() == [0.0, 0.0]
        assert cluster.inflight_counts() == [0, 0]
        assert cluster.coordinator is not None and not cluster.coordinator.done.is_set()


@pytest.mark.trio
async def test_leaving_the_cluster_with_requests_in_flight_tears_down_cleanly(autojump_clock):
    params = SamplingParams(max_tokens=1000, ignore_eos=True)
    async with sim_cluster(2, 2) as cluster, trio.open_nursery() as nursery:
        nursery.start_soon(cluster.complete_all, [SimRequest(i % 2, [5, i + 1], params) for i in range(10)])
        await trio.sleep(0.3)
        assert sum(cluster.finished_counts()) < 10  # nothing ran to max_tokens; ranks still hold work
        nursery.cancel_scope.cancel()  # cancels the requests mid-stream: their generators abort them
    # Leaving the context with work on the ranks raised nothing and left no stream open (warnings are errors).
    assert not any(c.is_healthy() for c in cluster.clients)


@pytest.mark.trio
async def test_a_peer_policy_hears_first_tokens_from_the_client_and_its_predicted_prefill_drains(autojump_clock):
    """dynamo_kv adds each request's uncached prefill at dispatch and removes it at the first token: the DP
    client must deliver first tokens, or the prediction only grows while requests run."""
    from asyncdp.dp.peers import DynamoKvPolicy

    seen: list[list[int]] = []

    class Watching(DynamoKvPolicy):
        def on_first_token(self, state, req_id, dp_rank, now_us):
            super().on_first_token(state, req_id, dp_rank, now_us)
            seen.append(list(state.pending))

    async with sim_cluster(2, 1, lb_policy="dynamo_kv") as cluster:
        client = cluster.clients[0]
        client.lb._policy = Watching()
        client.lb._state = client.lb._policy.init(2, 0, 1, None)
        reqs = workload(12, num_clients=1, max_tokens=(24, 32))
        results = await cluster.complete_all(reqs)
        assert all(not isinstance(outs, Exception) for outs in results.values())
        assert len(seen) == len(reqs)  # one first token per request
        assert client.lb.state.pending == [0, 0]
