"""The router's pure scoring (asyncdp.router.score): which endpoints are usable and in what order they are tried."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncdp.router.score import EndpointLoad, candidates, checked_load, score

STALE_S = 1.0


def rank(**fields: Any) -> dict[str, Any]:
    return {"dp_rank": 0, "up": True, "waiting": 0, "running": 0, "inflight": 0, "kv_cache_usage": 0.0,
            "prefill_tokens": 0, **fields}


def endpoint(*ranks: dict[str, Any], seq: int = 1, now_s: float = 10.0, url: str = "http://e:1") -> EndpointLoad:
    ep = EndpointLoad(url)
    ep.observe({"seq": seq, "api_process_rank": 0, "ranks": list(ranks)}, now_s)
    return ep


def test_an_idle_endpoint_scores_zero_and_queued_requests_count_one_each():
    assert score(endpoint(rank()), 10.0, STALE_S) == 0.0
    assert score(endpoint(rank(waiting=2, running=3)), 10.0, STALE_S) == 5.0


def test_inflight_counts_when_the_rank_has_not_published_it_yet():
    assert score(endpoint(rank(waiting=1, running=1, inflight=6)), 10.0, STALE_S) == 6.0
    assert score(endpoint(rank(waiting=4, running=4, inflight=6)), 10.0, STALE_S) == 8.0


def test_prompt_tokens_still_to_compute_weigh_one_request_per_512():
    assert score(endpoint(rank(prefill_tokens=1024)), 10.0, STALE_S) == 2.0


def test_kv_pressure_adds_nothing_up_to_80_percent_and_ten_requests_at_100():
    assert score(endpoint(rank(kv_cache_usage=0.8)), 10.0, STALE_S) == 0.0
    assert score(endpoint(rank(kv_cache_usage=1.0)), 10.0, STALE_S) == pytest.approx(10.0)


def test_the_ranks_that_are_up_are_summed_and_a_down_rank_is_ignored():
    ep = endpoint(rank(running=2), rank(dp_rank=1, running=3), rank(dp_rank=2, up=False, running=100))
    assert score(ep, 10.0, STALE_S) == 5.0


def test_an_endpoint_with_no_rank_up_or_no_answer_or_a_stale_one_is_not_used():
    assert score(endpoint(rank(up=False)), 10.0, STALE_S) is None
    assert score(EndpointLoad("http://e:1"), 10.0, STALE_S) is None
    assert score(endpoint(rank(), now_s=10.0), 11.0, STALE_S) == 0.0
    assert score(endpoint(rank(), now_s=10.0), 11.001, STALE_S) is None


def test_requests_sent_count_until_the_endpoints_seq_changes():
    ep = endpoint(rank(), seq=5)
    ep.request_started()
    ep.request_started()
    assert score(ep, 10.0, STALE_S) == 2.0
    ep.observe({"seq": 5, "ranks": [rank()]}, 10.05)  # nothing changed there: they are not in its numbers yet
    assert score(ep, 10.05, STALE_S) == 2.0
    ep.observe({"seq": 6, "ranks": [rank(running=2)]}, 10.1)  # new numbers include them
    assert score(ep, 10.1, STALE_S) == 2.0
    assert ep.num_inflight == 2


def test_a_seq_from_another_api_process_behind_the_port_counts_as_a_change():
    ep = endpoint(rank(), seq=5)
    ep.request_started()
    ep.observe({"seq": 5, "api_process_rank": 1, "ranks": [rank()]}, 10.05)
    assert ep.sent_since_seq == 0


def test_a_failed_poll_or_a_refused_connection_takes_the_endpoint_out_until_it_answers():
    ep = endpoint(rank())
    ep.observe_failure("refused")
    assert score(ep, 10.0, STALE_S) is None and ep.last_error == "refused"
    ep.observe({"seq": 2, "ranks": [rank()]}, 10.0)
    assert score(ep, 10.0, STALE_S) == 0.0 and ep.last_error is None
    ep.mark_down("ConnectError")
    assert score(ep, 10.0, STALE_S) is None


def test_candidates_are_ordered_by_score_then_fewest_in_flight_then_index():
    busy, idle_a, idle_b, down = (endpoint(rank(running=3)), endpoint(rank()), endpoint(rank()),
                                  endpoint(rank(up=False)))
    assert candidates([busy, idle_a, idle_b, down], 10.0, STALE_S) == [1, 2, 0]
    idle_a.num_inflight = 1  # same score (its seq moved past the request), more of ours in flight
    assert candidates([busy, idle_a, idle_b, down], 10.0, STALE_S) == [2, 1, 0]


def test_sending_to_the_best_endpoint_spreads_a_burst_across_equal_endpoints():
    eps = [endpoint(rank(), url=f"http://e:{i}") for i in range(1, 4)]
    for _ in range(6):
        eps[candidates(eps, 10.0, STALE_S)[0]].request_started()
    assert [ep.sent_since_seq for ep in eps] == [2, 2, 2]


def test_a_load_answer_of_the_contract_is_kept_and_anything_else_is_refused():
    good = {"seq": 4, "ranks": [rank()]}
    assert checked_load(good) is good
    assert checked_load({"seq": 4, "ranks": [{k: v for k, v in rank().items() if k != "prefill_tokens"}]})
    for bad in ({"seq": 1}, [1, 2], None, {"seq": "1", "ranks": []}, {"seq": 1, "ranks": {}},
                {"seq": 1, "ranks": [rank(up="yes")]}, {"seq": 1, "ranks": [rank(waiting="3")]},
                {"seq": 1, "ranks": [rank(running=True)]}, {"seq": 1, "ranks": [rank(prefill_tokens=None)]},
                {"seq": 1, "ranks": [{k: v for k, v in rank().items() if k != "inflight"}]}):
        with pytest.raises(ValueError):
            checked_load(bad)


rank_loads = st.fixed_dictionaries({
    "dp_rank": st.just(0), "up": st.booleans(), "waiting": st.integers(0, 50), "running": st.integers(0, 50),
    "inflight": st.integers(0, 100), "kv_cache_usage": st.floats(0.0, 1.0), "prefill_tokens": st.integers(0, 10_000)})
endpoint_states = st.tuples(st.lists(rank_loads, min_size=1, max_size=3), st.integers(0, 5), st.integers(0, 5),
                            st.floats(0.0, 2.0))


def build(states: list[tuple[list[dict[str, Any]], int, int, float]]) -> list[EndpointLoad]:
    eps = []
    for i, (ranks, sent, inflight, age_s) in enumerate(states):
        ep = endpoint(*ranks, now_s=10.0 - age_s, url=f"http://e:{i + 1}")
        ep.sent_since_seq, ep.num_inflight = sent, inflight
        eps.append(ep)
    return eps


@given(st.lists(endpoint_states, min_size=1, max_size=6))
def test_candidates_are_exactly_the_usable_endpoints_in_score_order(states):
    eps = build(states)
    order = candidates(eps, 10.0, STALE_S)
    usable = [i for i, ep in enumerate(eps) if score(ep, 10.0, STALE_S) is not None]
    assert sorted(order) == usable
    scores = [score(eps[i], 10.0, STALE_S) for i in order]
    assert scores == sorted(scores)  # type: ignore[type-var]
    for i in usable:
        ep = eps[i]
        fresh = 10.0 - ep.polled_at_s <= STALE_S and any(r["up"] for r in ep.load["ranks"])  # type: ignore[index]
        assert fresh


@given(st.lists(endpoint_states, min_size=2, max_size=6), st.data())
def test_one_more_request_sent_never_moves_an_endpoint_ahead(states, data):
    eps = build(states)
    before = candidates(eps, 10.0, STALE_S)
    if not before:
        return
    i = data.draw(st.sampled_from(before))
    eps[i].request_started()
    after = candidates(eps, 10.0, STALE_S)
    assert after.index(i) >= before.index(i)
