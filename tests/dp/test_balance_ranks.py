"""The LoadBalancer façade's bookkeeping: dead, draining and revived ranks under every policy, the snapshot
sliced to the managed range, duplicate request ids, and idleness once every request finished."""

from __future__ import annotations

import pytest

from asyncdp.dp.balance import LoadBalancer
from asyncdp.errors import InvalidRequestError, UnavailableError
from tests.dp.balancers import lb_rows


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
