"""The `vllm` balancer against the spec's worked examples (dp-deployment §7.5, routing-bench §2.5), hints, and
the baseline policies."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncdp.dp.balance import (
    POLICIES,
    LoadBalancer,
    RequestView,
    Snapshot,
    VllmPolicy,
    make_policy,
    parse_rank,
    spec_loop_pick,
)
from asyncdp.errors import ConfigError, InvalidRequestError, UnavailableError


def balancer_with(counts, *, client_count=1, client_index=0, policy="vllm"):
    lb = LoadBalancer(list(range(len(counts))), client_index, client_count, policy)
    lb.on_snapshot(counts)
    return lb


def lb_rows(lb):
    s = lb.state
    return [[w, r, kv] for w, r, kv in zip(s.waiting, s.running, s.kv, strict=True)]


# ---------------------------------------------------------------- T1-T10


def test_t1_picks_least_loaded_then_bumps_waiting_and_rotates_start():
    lb = balancer_with([[2, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert lb.select("a") == 1
    assert lb_rows(lb)[1] == [1, 0, 0]
    assert lb.state.start == 1


def test_t2_snapshot_backlog_outweighs_inflight_floor():
    assert balancer_with([[5, 10, 0], [0, 0, 0]]).select("a") == 1


def test_t3_kv_pressure_amplifies_waiting():
    assert balancer_with([[5, 10, 1.0], [0, 20, 0.2]]).select("a") == 1


def test_t4_no_kv_penalty_below_half_usage():
    assert balancer_with([[5, 10, 0.2], [0, 20, 0.2]]).select("a") == 0


def test_t5_no_kv_penalty_without_waiting_requests():
    assert balancer_with([[0, 10, 1.0], [1, 9, 0.9]]).select("a") == 0


def test_t6_inflight_floor_survives_a_zero_snapshot():
    lb = LoadBalancer([0, 1, 2, 3])
    picks = [lb.select(f"a{i}") for i in range(4)]
    lb.on_snapshot([[0, 0, 0.0]] * 4)
    picks += [lb.select(f"b{i}") for i in range(4)]
    assert picks == [0, 1, 2, 3, 0, 1, 2, 3]
    assert lb.inflight == [2, 2, 2, 2]


def test_t7_bump_is_client_count_sized():
    lb = LoadBalancer([0, 1], client_index=0, client_count=2)
    assert [lb.select(f"r{i}") for i in range(4)] == [0, 1, 0, 1]
    assert lb_rows(lb) == [[4, 0, 0.0], [4, 0, 0.0]]
    assert lb.inflight == [2, 2]


def test_t8_scan_start_depends_on_client_index():
    lb = LoadBalancer([0, 1, 2, 3], client_index=1, client_count=2)
    assert lb.state.start == 2
    assert lb.select("a") == 2


def test_t9_hint_bypasses_scoring_but_counts_inflight():
    lb = LoadBalancer([0, 1])
    before = lb_rows(lb)
    assert lb.select("a", rank_hint=1) == 1
    assert lb_rows(lb) == before
    assert lb.state.start == 0
    assert lb.inflight == [0, 1]
    assert lb.decisions == {"score": 0, "hint": 1}


def test_t10_finish_releases_inflight_and_owner():
    lb = LoadBalancer([0, 1])
    lb.select("a", rank_hint=1)
    assert lb.on_finish("a") == 1
    assert lb.inflight == [0, 0]
    assert lb.owner("a") is None and lb.num_inflight == 0
    assert lb.on_finish("a") is None  # unknown ids are dropped silently


# ---------------------------------------------------------------- routing-bench §2.5 on the bare policy


def run_policy(counts, n_requests=1, *, snapshot_after=None):
    policy = VllmPolicy()
    state = policy.init(len(counts), 0, 1, None)
    policy.on_snapshot(state, Snapshot.from_counts(counts))
    rng = random.Random(0)
    picks = []
    for k in range(n_requests):
        if snapshot_after is not None and k == snapshot_after:
            policy.on_snapshot(state, Snapshot.from_counts([[0, 0, 0.0]] * len(counts)))
        req = RequestView(f"r{k}", (1, 2, 3))
        decision = policy.select(req, None, state, 0, rng)
        policy.on_dispatch(state, req, decision, 0)
        picks.append(decision.dp_rank)
    return picks, state


@pytest.mark.parametrize(("counts", "expected"), [
    ([[2, 1, 0], [0, 0, 0], [1, 0, 0]], 1),
    ([[5, 10, 0], [0, 0, 0]], 1),
    ([[5, 10, 1.0], [0, 20, 0.2]], 1),
    ([[5, 10, 0.2], [0, 20, 0.2]], 0),
])
def test_routing_bench_examples_1_to_4(counts, expected):
    picks, state = run_policy(counts)
    assert picks == [expected]
    assert state.waiting[expected] == counts[expected][0] + 1


def test_routing_bench_example_5_inflight_after_zero_snapshot():
    _, state = run_policy([[0, 0, 0.0]] * 4, 8, snapshot_after=4)
    assert state.inflight == [2, 2, 2, 2]


def test_select_is_pure():
    policy = VllmPolicy()
    state = policy.init(3, 0, 1, None)
    before = repr(state)
    policy.select(RequestView("a", ()), None, state, 0, random.Random(0))
    assert repr(state) == before


def test_tie_goes_to_first_scanned_from_rotating_start():
    # Ranks 0 and 2 tie; with start at 1 the scan meets 2 before 0.
    lb = balancer_with([[0, 0, 0], [3, 0, 0], [0, 0, 0]])
    lb.state.start = 1
    assert lb.select("a") == 2


# ---------------------------------------------------------------- hints (§7.6, E1-E3)


def test_hybrid_hint_is_local_index_and_global_form_is_translated():
    lb = LoadBalancer([4, 5, 6, 7])
    assert lb.select("a", rank_hint=1) == 5
    assert lb.select("b", global_rank_hint="7") == 7
    assert lb.select("c", rank_hint="2", global_rank_hint=6) == 6


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rank_hint": "x"}, "data_parallel_rank must be an integer (got 'x')."),
    ({"rank_hint": 1.5}, "data_parallel_rank must be an integer (got 1.5)."),
    ({"rank_hint": True}, "data_parallel_rank must be an integer (got True)."),
    ({"rank_hint": 4}, "data_parallel_rank 4 is out of range [0, 4)."),
    ({"rank_hint": -1}, "data_parallel_rank -1 is out of range [0, 4)."),
    ({"global_rank_hint": 2}, "data_parallel_global_rank 2 is not served by this endpoint (ranks 4..7)."),
])
def test_bad_hints_raise_spec_messages(kwargs, message):
    lb = LoadBalancer([4, 5, 6, 7])
    with pytest.raises(InvalidRequestError) as err:
        lb.select("a", **kwargs)
    assert str(err.value) == message
    assert lb.num_inflight == 0


def test_conflicting_hint_forms_are_rejected():
    lb = LoadBalancer([4, 5])
    with pytest.raises(InvalidRequestError, match="name different ranks"):
        lb.select("a", rank_hint=0, global_rank_hint=5)


def test_parse_rank_hint_accepts_header_strings():
    assert parse_rank(" 3 ") == 3
    assert parse_rank(-2) == -2


# ---------------------------------------------------------------- façade bookkeeping


def test_dead_rank_is_excluded_and_its_requests_reported():
    lb = LoadBalancer([0, 1, 2])
    assert [lb.select(f"r{i}") for i in range(3)] == [0, 1, 2]
    assert lb.mark_dead(1) == ["r1"]
    picks = {lb.select(f"s{i}") for i in range(6)}
    assert picks == {0, 2}
    with pytest.raises(UnavailableError):
        lb.select("h", rank_hint=1)
    assert lb.group_by_owner(["r0", "r1", "r2", "zzz"]) == {0: ["r0"], 2: ["r2"]}


def test_all_dead_raises_unavailable():
    lb = LoadBalancer([3])
    lb.mark_dead(3)
    with pytest.raises(UnavailableError):
        lb.select("a")


@pytest.mark.parametrize("policy", ["vllm", "asyncdp", "sglang_cache_aware", "session_hash"])
def test_a_draining_rank_gets_no_new_request_while_its_own_finish(policy):
    lb = LoadBalancer([0, 1, 2], policy=policy)
    owners = {lb.select(f"r{i}", list(range(100 * i, 100 * i + 40)), routing_key=f"k{i}") for i in range(9)}
    assert 1 in owners
    before = lb.inflight_of(1)
    assert lb.mark_draining(1) and lb.is_draining(1) and not lb.mark_draining(1)
    picks = [lb.select(f"s{i}", list(range(5000 + 100 * i, 5000 + 100 * i + 40)), routing_key=f"k{i}")
             for i in range(12)]
    assert set(picks) <= {0, 2} and lb.inflight_of(1) == before  # its own requests stay counted there
    assert lb.select("pinned", [1, 2, 3], rank_hint=1) == 1  # a hint still reaches it (and its refusal)
    for rid in [r for r in (f"r{i}" for i in range(9)) if lb.owner(r) == 1]:
        assert lb.on_finish(rid) == 1
    assert lb.mark_dead(1) == ["pinned"] and lb.dead_ranks == [1]  # its link closes once it is done


@pytest.mark.parametrize("policy", ["vllm", "asyncdp", "round_robin", "power_of_two", "sglang_cache_aware",
                                    "session_hash"])
def test_a_dead_rank_marked_alive_gets_requests_again(policy):
    """A restarted dense node brings its ranks back (spec §13): the balancer used to exclude a dead rank for good."""
    lb = LoadBalancer([0, 1, 2], policy=policy)
    assert not lb.mark_alive(1)  # alive already: nothing changes
    lb.mark_dead(1)
    picks = {lb.select(f"d{i}", list(range(100 * i, 100 * i + 40)), routing_key=f"k{i}") for i in range(12)}
    assert 1 not in picks
    assert lb.mark_alive(1) and lb.dead_ranks == [] and not lb.mark_alive(7)
    assert lb.select("pinned", [1, 2, 3], rank_hint=1) == 1  # a hint reaches it again
    picks = {lb.select(f"a{i}", list(range(9000 + 100 * i, 9000 + 100 * i + 40)), routing_key=f"n{i}")
             for i in range(30)}
    assert 1 in picks, picks


def test_a_stopped_rank_marked_alive_leaves_the_draining_set():
    lb = LoadBalancer([0, 1])
    assert lb.mark_draining(1)
    lb.mark_dead(1)
    assert lb.mark_alive(1) and not lb.is_draining(1)
    assert {lb.select(f"r{i}") for i in range(4)} == {0, 1}


def test_the_last_rank_that_is_not_draining_is_never_excluded():
    lb = LoadBalancer([0, 1])
    assert lb.mark_draining(0)
    assert not lb.mark_draining(1) and not lb.is_draining(1)  # it refuses new requests itself, saying why
    assert {lb.select(f"r{i}") for i in range(4)} == {1}
    assert not lb.mark_draining(7)  # not one of this client's ranks


@pytest.mark.parametrize("policy", ["vllm", "asyncdp", "round_robin", "session_hash"])
def test_when_the_last_live_rank_dies_a_draining_one_takes_requests_again_to_refuse_them_itself(policy):
    """Rank 1 drains, then rank 0 dies: a request used to meet "no data-parallel rank is alive" from the policy,
    though rank 1 is alive and can say why it refuses (it is shutting down)."""
    lb = LoadBalancer([0, 1, 2], policy=policy)
    assert lb.mark_draining(1) and lb.mark_draining(2)
    lb.mark_dead(0)
    assert lb.is_draining(2) and not lb.is_draining(1)  # the lowest of them is back in selection
    assert {lb.select(f"r{i}", list(range(100 * i, 100 * i + 40)), routing_key=f"k{i}") for i in range(4)} == {1}
    lb.mark_dead(1)  # then it is gone too: the other draining rank takes its place
    assert lb.select("last", [1, 2, 3]) == 2 and lb.dead_ranks == [0, 1]


def test_a_draining_rank_stays_excluded_when_the_engines_params_reinitialise_the_policy():
    lb = LoadBalancer([0, 1, 2], policy="asyncdp")
    assert lb.mark_draining(2)
    assert lb.set_engine_params({"kv_blocks_per_rank": 1000, "block_size_tokens": 16})
    assert 2 not in {lb.select(f"r{i}", list(range(100 * i, 100 * i + 40))) for i in range(9)}


def test_snapshot_is_sliced_to_managed_range():
    lb = LoadBalancer([2, 3], policy="vllm")
    lb.on_snapshot([[9, 9, 0.0], [9, 9, 0.0], [5, 0, 0.0], [1, 0, 0.0]])
    assert lb_rows(lb) == [[5, 0, 0.0], [1, 0, 0.0]]
    assert lb.select("a") == 3
    lb.on_snapshot(None)  # wave-only snapshot keeps the counts
    assert lb.state.waiting == [5, 2]


def test_duplicate_request_id_is_rejected():
    lb = LoadBalancer([0, 1])
    lb.select("a")
    with pytest.raises(InvalidRequestError):
        lb.select("a")


def test_idle_after_every_request_finishes():
    lb = LoadBalancer([0, 1, 2, 3], policy="vllm")
    ids = [f"r{i}" for i in range(50)]
    for rid in ids:
        lb.select(rid)
    for rid in reversed(ids):
        lb.on_finish(rid)
    assert lb.inflight == [0, 0, 0, 0] and lb.num_inflight == 0
    assert lb.state.inflight == [0, 0, 0, 0]


# ---------------------------------------------------------------- legacy and baselines


def test_legacy_ties_always_go_to_fixed_start_after_snapshots():
    # vllm-project/vllm#47420: a snapshot between each pair wipes the bumps; rank 0 wins every tie.
    lb = LoadBalancer([0, 1], policy="vllm_legacy")
    picks = []
    for k in range(5):
        lb.on_snapshot([[0, 0, 0.0], [0, 0, 0.0]])
        picks.append(lb.select(f"r{k}"))
    assert picks == [0, 0, 0, 0, 0]
    lb2 = LoadBalancer([0, 1], policy="vllm")
    picks2 = []
    for k in range(4):
        lb2.on_snapshot([[0, 0, 0.0], [0, 0, 0.0]])
        picks2.append(lb2.select(f"r{k}"))
    assert picks2 == [0, 1, 0, 1]


def test_legacy_no_initial_counts_sends_everything_to_first_rank_until_snapshot():
    lb = LoadBalancer([0, 1, 2], policy="vllm_legacy@no_initial_counts")
    assert [lb.select(f"r{i}") for i in range(3)] == [0, 0, 0]
    lb.on_snapshot([[1, 0, 0.0], [0, 0, 0.0], [0, 0, 0.0]])
    assert lb.select("x") == 1


def test_round_robin_cycles_and_staggered_preset_offsets():
    assert [LoadBalancer([0, 1, 2], policy="round_robin").select(f"r{i}") for i in range(1)] == [0]
    lb = LoadBalancer([0, 1, 2], policy="round_robin")
    assert [lb.select(f"r{i}") for i in range(5)] == [0, 1, 2, 0, 1]
    lb = LoadBalancer([0, 1, 2, 3], client_index=1, client_count=2, policy="round_robin@staggered")
    assert lb.select("a") == 2


def test_random_is_seeded_by_the_given_rng():
    a = [LoadBalancer(list(range(8)), policy="random", seed=7).select("a") for _ in range(3)]
    assert len(set(a)) == 1
    lb = LoadBalancer(list(range(8)), policy="random", seed=1)
    assert len({lb.select(f"r{i}") for i in range(40)}) > 4


def test_power_of_two_prefers_lower_inflight():
    lb = LoadBalancer([0, 1], policy="power_of_two", seed=3)
    lb.select("a", rank_hint=0)
    lb.select("b", rank_hint=0)
    assert lb.select("c") == 1


def test_power_of_two_queue_metric_reads_snapshot():
    lb = LoadBalancer([0, 1], policy="power_of_two@queue", seed=5)
    lb.on_snapshot([[0, 0, 0.0], [7, 0, 0.0]])
    assert {lb.select(f"r{i}") for i in range(5)} == {0}


def test_unknown_policy_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        make_policy("fastest")
    for name in POLICIES:
        assert name in str(err.value)
    with pytest.raises(ConfigError):
        make_policy("vllm@nope")


# ---------------------------------------------------------------- the fast path equals the spec's loop


loads = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.sampled_from([0.0, 0.3, 0.5, 0.75, 1.0])),
                 min_size=4, max_size=4)
ops = st.lists(st.one_of(
    st.tuples(st.just("select"), st.none()),
    st.tuples(st.just("hint"), st.integers(0, 3)),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("snapshot"), loads),
    st.tuples(st.just("dead"), st.integers(0, 3)),
), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(1, 3), st.data())
def test_incremental_scores_decide_like_the_spec_loop(operations, client_count, data):
    client_index = data.draw(st.integers(0, client_count - 1))
    lb = LoadBalancer([0, 1, 2, 3], client_index, client_count)
    issued: list[str] = []
    for k, (op, arg) in enumerate(operations):
        if op == "select":
            expected = spec_loop_pick(lb.state)
            if expected is None:
                with pytest.raises(UnavailableError):
                    lb.select(f"r{k}")
            else:
                assert lb.select(f"r{k}") == expected
                issued.append(f"r{k}")
        elif op == "hint" and arg not in lb.state.excluded:
            lb.select(f"r{k}", rank_hint=arg)
            issued.append(f"r{k}")
        elif op == "finish" and issued:
            lb.on_finish(issued.pop(arg % len(issued)))
        elif op == "snapshot":
            lb.on_snapshot([list(x) for x in arg])
        elif op == "dead":
            lb.mark_dead(arg)
    assert lb.inflight == lb.state.inflight


def test_the_lb_policy_flag_knows_exactly_the_base_names_make_policy_builds() -> None:
    from asyncdp.config.flags import LB_POLICIES
    from asyncdp.dp.balance import make_policy, policy_names

    assert sorted(LB_POLICIES) == sorted({n.partition("@")[0] for n in policy_names()})
    for name in policy_names():
        assert make_policy(name).name.partition("@")[0] == name.partition("@")[0]


def test_an_unknown_policy_preset_is_a_config_error_naming_the_valid_ones() -> None:
    from asyncdp.dp.balance import make_policy

    with pytest.raises(ConfigError, match="unknown load-balancing policy 'dynamo_kv@nope'.*sglang_cache_aware"):
        make_policy("dynamo_kv@nope")


def test_a_routing_key_reaches_the_policy_and_session_hash_keeps_each_key_on_one_rank() -> None:
    # session_hash maps a key to its rank on the ring whatever the load; without the key it falls back to the rank
    # that got the fewest requests, which spreads a conversation's turns.
    lb = LoadBalancer(list(range(8)), policy="session_hash")
    keyed = {key: {lb.select(f"{key}-{turn}", [1, 2, 3], routing_key=key) for turn in range(6)}
             for key in ("alice", "bob", "carol", "dave")}
    assert all(len(ranks) == 1 for ranks in keyed.values()), keyed
    unkeyed = {lb.select(f"anon-{turn}", [1, 2, 3]) for turn in range(6)}
    assert len(unkeyed) == 6
