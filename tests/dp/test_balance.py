"""The `vllm` balancer against the spec's worked examples (dp-deployment §7.5, routing-bench §2.5), and its
incremental scores against the spec's loop. Hints, the façade's bookkeeping and the baseline policies have
their own modules (tests/dp/test_balance_*.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncdp.dp.balance import LoadBalancer, RequestView, Snapshot, VllmPolicy, spec_loop_pick
from asyncdp.errors import UnavailableError
from tests.dp.balancers import balancer_with, lb_rows

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
