"""The routing benchmark's simulator and metrics: exact metrics on a hand-made log, determinism per seed, every
request of a shared-prefix workload completing under two policies, and answers emitted so that a multi-turn
history hits the cache (spec routing-bench §1.2, §4.0, §6)."""

from __future__ import annotations

import pytest

from asyncdp.bench import metrics
from asyncdp.bench.profiles import load_profile
from asyncdp.bench.records import resolve
from asyncdp.bench.simulate import ClusterSpec, RequestEvent, RunLog, simulate
from asyncdp.bench.workloads import build

SPEC = ClusterSpec(dp_size=2, profile=load_profile("gpu_8b"))
TINY_W1 = {"groups": 4, "prompts_per_group": 4, "system_len": 256, "question_len": 32, "output_len": 8}


def ev(req_id, rank, send, first, last, out, prompt=100, cached=0, measured=True, error=None):
    return RequestEvent(req_id=req_id, router=0, rank=rank, t_send_s=send, prompt_tokens=prompt, measured=measured,
                        t_first_s=first, t_last_s=last, output_tokens=out, cached_tokens=cached, error=error)


def test_metrics_of_a_hand_made_log_are_exact():
    log = RunLog(dp_size=2, preemptions=3, events=[
        ev(0, 0, 0.0, 1.0, 2.0, 11, cached=50),   # ttft 1, tpot 0.1 -> meets the SLO
        ev(1, 0, 1.0, 4.0, 5.0, 11, cached=30),   # ttft 3 -> misses
        ev(2, 1, 2.0, 2.5, 10.0, 6),              # tpot 1.5 -> misses
        ev(3, 1, 3.0, 3.5, 3.5, 1, cached=20),    # one token: TTFT only -> meets
        ev(4, 1, 0.5, 0.6, 0.7, 2, measured=False),          # warm-up: left out
        ev(5, 0, 0.0, None, None, 0, error="EngineDeadError"),  # failed: left out
    ])
    got = metrics.compute(log)
    assert got == pytest.approx({
        "ttft_mean_s": (1 + 3 + 0.5 + 0.5) / 4, "ttft_p50_s": 0.5, "ttft_p90_s": 3.0, "ttft_p99_s": 3.0,
        "tpot_mean_s": (0.1 + 0.1 + 1.5) / 3, "e2e_p99_s": 8.0,
        "goodput_rps": 2 / 3.0, "slo_attainment": 2 / 5, "throughput_tok_s": 29 / 10.0, "prefix_hit_rate": 100 / 400,
        "max_mean_load_ratio": 1.0, "preemptions": 3.0})
    assert set(got) == set(metrics.METRIC_KEYS)
    assert metrics.summary(log) == {"sent": 6, "measured": 5, "completed": 5, "failed": 1, "unsent": 0}


def test_goodput_is_per_second_of_the_arrivals_whatever_the_drain():
    # four requests sent one a second, all within the SLO; a fifth, a second later, also meets it but decodes for
    # 100 s. Goodput is per second of the measure window (the sends): the slow answer does not cut it, while the
    # throughput, per second of serving, counts the drain
    quick = [ev(i, i % 2, float(i), i + 0.5, i + 1.0, 11) for i in range(4)]
    slow = ev(4, 0, 4.0, 4.5, 104.0, 1001)  # TPOT 0.0995 s: within the SLO
    before = metrics.compute(RunLog(dp_size=2, events=quick))
    after = metrics.compute(RunLog(dp_size=2, events=[*quick, slow]))
    assert before["slo_attainment"] == after["slo_attainment"] == 1.0
    assert before["goodput_rps"] == pytest.approx(4 / 3.0) and after["goodput_rps"] == pytest.approx(5 / 4.0)
    assert before["throughput_tok_s"] == pytest.approx(44 / 4.0)
    assert after["throughput_tok_s"] == pytest.approx(1045 / 104.0)
    # a miss counts in the window but not in the goodput: the same sends, one answer too slow to start
    late = ev(4, 0, 4.0, 7.0, 8.0, 11)
    assert metrics.compute(RunLog(dp_size=2, events=[*quick, late]))["goodput_rps"] == pytest.approx(4 / 4.0)
    # warm-up sends are outside the measure window
    warm = ev(9, 1, -50.0, -49.5, -49.0, 11, measured=False)
    assert metrics.compute(RunLog(dp_size=2, events=[warm, *quick]))["goodput_rps"] == pytest.approx(4 / 3.0)
    # one of a rung's requests never finished (the run ended): it counts against the attainment
    unfinished = ev(5, 1, 4.0, 4.5, None, 3)
    assert metrics.compute(RunLog(dp_size=2, events=[*quick, unfinished]))["slo_attainment"] == 4 / 5
    assert metrics.compute(RunLog(dp_size=2, events=[*quick, unfinished]), only={0, 1, 5})["slo_attainment"] == 2 / 3


def test_goodput_of_a_burst_is_per_second_of_serving_it():
    # every request sent at the same instant: the sends span no time, so the window is the serving one
    burst = [ev(i, i % 2, 0.0, 0.5 * (i + 1), 0.5 * (i + 1) + 1.0, 11) for i in range(4)]
    assert metrics.compute(RunLog(dp_size=2, events=burst))["goodput_rps"] == pytest.approx(4 / 3.0)


def test_load_ratio_counts_requests_per_rank_over_the_mean_of_every_rank():
    log = RunLog(dp_size=4, events=[ev(i, 0, 0.0, 1.0, 1.0, 1) for i in range(3)] + [ev(3, 1, 0.0, 1.0, 1.0, 1)])
    assert metrics.compute(log)["max_mean_load_ratio"] == 3 / 1.0


def test_same_seed_gives_the_same_event_log_and_metrics():
    workload = resolve(build("w1", "quick", 7, TINY_W1))
    first = simulate(workload, "random", 7, SPEC)
    second = simulate(workload, "random", 7, SPEC)
    assert first == second
    assert metrics.compute(first) == metrics.compute(second)


@pytest.fixture
def trio_own_tie_break(monkeypatch):
    """trio's own timer tie-break (by address) meanwhile, not the suite's (tests/conftest.py)."""
    import trio

    deadlines = trio._core._run.Deadlines
    monkeypatch.setattr(deadlines, "add", getattr(deadlines.add, "__wrapped__", deadlines.add))


def test_a_run_does_not_depend_on_the_heap_it_runs_in(trio_own_tie_break):
    """Timers due at the same virtual instant wake in the order they were set, not by the address of their cancel
    scopes (trio's own tie-break, in force here): without that, this run of vllm on W9 read three different mean
    TTFTs (0.02440, 0.02485, 0.02499 s) after allocating 0, 700 and 5 000 objects first."""
    workload = resolve(build("w9", "quick", 1, {"clients": 16, "duration_s": 10}))
    spec = ClusterSpec(workload.dp_size, load_profile("gpu_8b"))
    logs = []
    for shift in (0, 700, 5000):
        ballast = [object() for _ in range(shift)]
        del ballast[::2]  # holes in the heap: the run's objects land in them
        logs.append(simulate(workload, "vllm", 1, spec))
    assert logs[0].events and logs[0] == logs[1] == logs[2]


def test_the_policy_draws_from_the_runs_seed_and_each_router_from_its_own_stream():
    """routing-bench §1.2: the policy's stream is ``policy/{router}`` of the run's seed, so ``random`` decides
    differently under another seed on the same workload, and two routers do not draw the same sequence."""
    workload = resolve(build("w1", "quick", 7, TINY_W1))
    ranks = {seed: [e.rank for e in simulate(workload, "random", seed, SPEC).events] for seed in (7, 8)}
    assert ranks[7] != ranks[8]
    steady = {seed: [e.rank for e in simulate(workload, "round_robin", seed, SPEC).events] for seed in (7, 8)}
    assert steady[7] == steady[8]  # a policy that draws nothing: the seed changes no decision here
    two = simulate(workload, "random", 7, ClusterSpec(dp_size=4, profile=SPEC.profile, routers=2))
    by_router = [[e.rank for e in two.events if e.router == r] for r in (0, 1)]
    n = min(map(len, by_router))
    assert n >= 8 and by_router[0][:n] != by_router[1][:n]


@pytest.mark.parametrize("policy", ["round_robin", "vllm"])
def test_every_request_of_a_shared_prefix_workload_completes_with_its_full_output(policy):
    workload = resolve(build("w1", "quick", 1, TINY_W1))
    log = simulate(workload, policy, 1, SPEC)
    assert [e.req_id for e in log.events] == list(range(len(workload.records)))
    assert all(e.error is None for e in log.events)
    assert [e.output_tokens for e in log.events] == [r.output_length for r in workload.records]
    assert {e.rank for e in log.events} == {0, 1}
    assert metrics.compute(log)["prefix_hit_rate"] > 0  # the shared system prompt hit on its rank


def test_one_rank_serves_a_multi_turn_workload_at_its_ideal_hit_rate():
    # Each turn quotes the previous answer: the hit reaches into it only if the executor emitted the answer
    # segment (token_source), as the ideal hit rate assumes.
    workload = resolve(build("w4", "quick", 3, {"clients": 4, "rounds": 3, "request_len": 64, "output_len": 32}))
    log = simulate(workload, "round_robin", 3, ClusterSpec(dp_size=1, profile=load_profile("gpu_8b")))
    assert all(e.error is None for e in log.events)
    assert metrics.compute(log)["prefix_hit_rate"] == pytest.approx(workload.ideal_hit_rate, abs=1e-6)


def test_the_workloads_routing_key_reaches_the_policy_so_session_hash_keeps_each_client_on_one_rank():
    # W4's routing key is the client id (spec C4): session_hash puts every turn of a client on the key's rank.
    workload = resolve(build("w4", "quick", 3, {"clients": 8, "rounds": 3, "request_len": 64, "output_len": 8}))
    log = simulate(workload, "session_hash", 3, ClusterSpec(dp_size=4, profile=load_profile("gpu_8b")))
    keys = {r.req_id: r.routing_key for r in workload.records}
    ranks: dict[str, set[int]] = {}
    for e in log.events:
        ranks.setdefault(keys[e.req_id], set()).add(e.rank)
    assert len(ranks) == 8 and all(len(r) == 1 for r in ranks.values()), ranks
    assert len(set().union(*ranks.values())) > 1  # the keys spread over the ranks


@pytest.mark.parametrize("assign", ["index", "key"])
def test_routers_get_requests_by_index_or_each_session_on_the_router_its_key_hashes_to(assign):
    # C5: by index, request i reaches router i mod R, so a client's turns cross the routers; by key, every turn of
    # a client reaches one router (an upstream balancer with session affinity), and the clients spread over them.
    workload = resolve(build("w4", "quick", 3, {"clients": 7, "rounds": 3, "request_len": 64, "output_len": 8}))
    log = simulate(workload, "round_robin", 3, ClusterSpec(dp_size=2, profile=load_profile("gpu_8b"), routers=4,
                                                         router_assign=assign))
    keys = {r.req_id: r.routing_key for r in workload.records}
    routers: dict[str, set[int]] = {}
    for e in log.events:
        routers.setdefault(keys[e.req_id], set()).add(e.router)
    assert len(routers) == 7 and len(log.events) == len(workload.records)
    if assign == "index":
        assert all(e.router == e.req_id % 4 for e in log.events)
        assert any(len(r) > 1 for r in routers.values())
    else:
        assert all(len(r) == 1 for r in routers.values()), routers
        assert len(set().union(*routers.values())) > 1


def test_a_keys_router_is_the_same_in_every_process_and_keyless_requests_go_by_index():
    import subprocess
    import sys

    from asyncdp.bench.arrivals import router_of

    keys = [f"client-{i}" for i in range(64)]
    here = [router_of(0, k, 4, "key") for k in keys]
    assert set(here) == {0, 1, 2, 3}  # a digest, spread over the routers
    # Python's hash() of a str changes with each process (PYTHONHASHSEED); the key's router must not.
    code = ("from asyncdp.bench.arrivals import router_of; "
            f"print([router_of(0, k, 4, 'key') for k in {keys!r}])")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "12345", "PATH": ""})
    assert other.stdout.strip() == repr(here)
    assert [router_of(i, None, 4, "key") for i in range(6)] == [0, 1, 2, 3, 0, 1]
    assert router_of(5, "client-1", 1, "key") == 0
    assert router_of(5, "client-1", 4, "index") == 1


def test_an_unknown_router_assignment_is_refused():
    from asyncdp.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown router assignment 'session'"):
        ClusterSpec(dp_size=2, profile=load_profile("gpu_8b"), router_assign="session")


def test_sim_executor_emits_the_token_source_tokens_and_falls_back_where_it_gives_none():
    from asyncdp.config.flags import EngineConfig
    from asyncdp.engine.executor import ModelBatch, ScheduledChunk
    from asyncdp.engine.sim_executor import SimExecutor
    from asyncdp.sampling_params import SamplingParams

    answers = {"a": [7, 8]}
    given = SimExecutor(EngineConfig(executor="sim"), 100, max_model_len=64,
                        token_source=lambda rid, i: answers[rid][i] if rid in answers and i < 2 else None)
    plain = SimExecutor(EngineConfig(executor="sim"), 100, max_model_len=64)

    def batch(rid: str, n_out: int) -> ModelBatch:
        return ModelBatch([ScheduledChunk(request_id=rid, token_ids=[5], start_pos=3, block_table=[0], sample=True,
                                          sampling_params=SamplingParams(max_tokens=4), num_output_tokens=n_out)])

    assert given.execute(batch("a", 1)).sampled == [8]
    assert given.execute(batch("a", 2)).sampled == plain.execute(batch("a", 2)).sampled  # past the answer
    assert given.execute(batch("b", 0)).sampled == plain.execute(batch("b", 0)).sampled  # unknown request


def test_r_sat_counts_completions_in_the_second_half_of_the_saturated_part_only():
    from asyncdp.bench.simulate import measure_r_sat

    def fake_run(workload, policy, seed, spec, *, closed_concurrency):
        assert (policy, closed_concurrency) == ("round_robin", 64 * spec.dp_size)
        # sends until t=9; completions at 1..10 (one a second) then a drain tail at 20 and 40
        events = [ev(i, 0, float(i), float(i) + 0.5, float(i + 1), 2) for i in range(10)]
        events += [ev(10, 0, 0.0, 1.0, 20.0, 2), ev(11, 0, 0.0, 1.0, 40.0, 2)]
        return RunLog(dp_size=spec.dp_size, events=events)

    workload = build("w1", "quick", 1, TINY_W1)
    # the window is [4.5, 9]: completions at 5, 6, 7, 8, 9 -> 5 / 4.5 s
    assert measure_r_sat(workload, SPEC, 1, run=fake_run) == pytest.approx(5 / 4.5)


def test_a_dispatch_whose_ready_queue_empties_while_the_run_drains_still_sends_every_turn(monkeypatch):
    # One slot and a 5 s think time: the dispatcher waits on an empty ready queue while the drain loop polls.
    # Both used to wait on one event that each replaced, so the dispatcher missed the next turn and the run hung
    # to the deadline (W4 at full scale did, at 16 req/s).
    monkeypatch.setattr("asyncdp.bench.simulate.DEADLINE_S", 600.0)
    workload = resolve(build("w4", "quick", 1, {"clients": 2, "rounds": 3, "request_len": 64, "output_len": 8,
                                               "think_s": 5, "max_parallel": 1}))
    log = simulate(workload, "asyncdp", 1, SPEC)
    assert len(log.events) == len(workload.records) == 6 and log.unsent == 0
    assert all(e.error is None and e.output_tokens == 8 for e in log.events)
    by_id = {e.req_id: e for e in log.events}
    for rec in workload.records:  # every later turn waited out its think time after the previous answer
        if rec.after_req is not None:
            assert by_id[rec.req_id].t_send_s >= by_id[rec.after_req].t_last_s + 5.0 - 1e-6


def test_a_run_that_cannot_finish_fails_with_a_message_naming_it(monkeypatch, capsys):
    import anyio

    from asyncdp.bench import simulate as sim
    from asyncdp.cli import main
    from asyncdp.errors import SimulationStalled

    async def never(self):
        await anyio.sleep_forever()

    monkeypatch.setattr(sim, "DEADLINE_S", 60.0)
    monkeypatch.setattr(sim._Driver, "run", never)
    workload = resolve(build("w1", "quick", 1, TINY_W1))
    with pytest.raises(SimulationStalled, match=r"w1 under 'vllm' \(seed 1\) did not finish within 0.0167 virtual hours \(0 of 16 records sent"):
        simulate(workload, "vllm", 1, SPEC)
    # --jobs 0: the run in this process, where the patches above apply (a run in its own process is the real one)
    assert main(["bench", "routing", "--workload", "w1", "--policies", "vllm", "--dp", "2", "--jobs", "0",
                 *(f"--option={k}={v}" for k, v in TINY_W1.items())]) == 1
    err = capsys.readouterr().err
    assert "asyncdp bench: error: the simulated run of w1 under 'vllm' (seed 1) did not finish" in err
    assert "Traceback" not in err


def _prefills_per_group(workload, log) -> float:
    group = {r.req_id: r.group for r in workload.records}
    ranks: dict[object, set[int]] = {}
    for e in log.events:
        ranks.setdefault(group[e.req_id], set()).add(e.rank)
    return sum(len(v) for v in ranks.values()) / len(ranks)


def test_four_routers_agree_on_new_prefixes_through_the_coordinators_directory():
    # W1's burst with 4 API servers: every request is routed at the same instant, so no snapshot can tell one
    # router what another did. Through the coordinator's prefix directory each group's system prompt lands on one
    # rank, as with one router; without it (asyncdp@local) each router places each group on its own.
    workload = resolve(build("w1", "quick", 1, {**TINY_W1, "groups": 8, "prompts_per_group": 8}))
    spec = ClusterSpec(dp_size=4, profile=load_profile("gpu_8b"), routers=4)
    one = simulate(workload, "asyncdp", 1, ClusterSpec(dp_size=4, profile=load_profile("gpu_8b")))
    four = simulate(workload, "asyncdp", 1, spec)
    alone = simulate(workload, "asyncdp@local", 1, spec)
    assert _prefills_per_group(workload, one) == 1.0
    assert _prefills_per_group(workload, four) == 1.0
    assert _prefills_per_group(workload, alone) > 1.5
    assert metrics.compute(four)["prefix_hit_rate"] == pytest.approx(metrics.compute(one)["prefix_hit_rate"])
    assert {e.router for e in four.events} == {0, 1, 2, 3}


def _first_rank_counts(workload, log) -> list[int]:
    """Per rank: how many of the workload's groups had their first request sent there."""
    group = {r.req_id: r.group for r in workload.records}
    first: dict[str, int] = {}
    for e in sorted(log.events, key=lambda e: (e.t_send_s, e.req_id)):
        first.setdefault(group[e.req_id], e.rank)
    return [sum(1 for r in first.values() if r == i) for i in range(log.dp_size)]


@pytest.mark.parametrize("seed", [1, 3])
def test_four_routers_spread_equal_prefix_groups_as_evenly_as_one(seed):
    # W2's equal groups (20 at the quick scale, on 4 ranks): the spread rule puts each new group on the rank with
    # the fewest. Each API server sees a quarter of the groups, so its own count is uneven; the coordinator's
    # directory counts everyone's (PrefixClaim.candidates), and the groups end 5 to a rank as with one router.
    workload = resolve(build("w2", "quick", seed, {"groups": 20}), 1.0, 10.0)
    spec = ClusterSpec(dp_size=4, profile=load_profile("gpu_8b"), routers=4)
    assert _first_rank_counts(workload, simulate(workload, "asyncdp", seed, spec)) == [5, 5, 5, 5]


def _shorts_behind_anothers_long(log, long_tokens: int) -> int:
    """Short requests sent to a rank while another router's long prompt there had not produced its first token."""
    ev = [e for e in log.events if e.t_first_s is not None]
    longs = [e for e in ev if e.prompt_tokens >= long_tokens]
    return sum(1 for e in ev if e.prompt_tokens < long_tokens
               for x in longs if x.rank == e.rank and x.router != e.router and x.t_send_s <= e.t_send_s < x.t_first_s)


def test_other_routers_keep_short_requests_off_a_rank_another_just_gave_a_long_prompt(monkeypatch):
    # W8 (quick: 2 % of the prompts 16 000 tokens long) with 4 API servers: a long prompt is a new prefix, claimed
    # through the coordinator, which tells the other API servers at once (PrefixPlaced); until a snapshot shows it
    # they would still see the rank as free and send it short requests that wait behind its prefill.
    workload = resolve(build("w8", "quick", 1, {"num_requests": 300}), 1.0, 60.0)
    spec = ClusterSpec(dp_size=4, profile=load_profile("gpu_8b"), routers=4)
    told = simulate(workload, "asyncdp", 1, spec)
    monkeypatch.setattr("asyncdp.coordinator.claims.LONG_PLACEMENT_TOKENS", 1 << 30)  # never told
    untold = simulate(workload, "asyncdp", 1, spec)
    assert _shorts_behind_anothers_long(told, 10_000) == 0
    assert _shorts_behind_anothers_long(untold, 10_000) > 0


def test_a_relative_ladder_must_be_resolved_before_it_runs_in_open_loop():
    """Unresolved, a relative ladder's send times are in units of R_sat (1 req/s): run as they are they would be
    wrong by R_sat's factor without a word. Closed loop (the R_sat measurement) ignores send times."""
    from asyncdp.errors import ConfigError

    workload = build("w2", "quick", 1, {"groups": 2, "users": 2, "requests_per_rung": 2})
    with pytest.raises(ConfigError, match=r"w2: a relative ladder's send times .*records\.resolve\(workload"):
        simulate(workload, "vllm", 1, SPEC)
    assert len(simulate(workload, "round_robin", 1, SPEC, closed_concurrency=4).events) == len(workload.records)
    resolved = resolve(workload, 1.0, 50.0)
    assert len(simulate(resolved, "vllm", 1, SPEC).events) == len(workload.records)
