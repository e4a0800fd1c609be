"""`aibrix_prefix` (routing-bench §2.10) and `session_hash` (§2.11) conformance."""

from __future__ import annotations

import pytest

from asyncdp.dp.peers import PEER_POLICIES
from asyncdp.dp.peers.aibrix import AibrixPrefixPolicy
from asyncdp.dp.peers.session import QPS_WINDOW_US, STICKY_IDLE_US, SessionHashPolicy
from asyncdp.errors import ConfigError
from tests.dp.peers.helpers import Router, req

DOC = list(range(1000, 1064))  # 256 chars: two 128-char blocks


def _h(tokens):
    from asyncdp.dp.peers.hashing import block_hashes
    return block_hashes(req(tokens).text, 128)


@pytest.mark.parametrize(("factor", "expected"), [(2.0, {0}), (1.0, {1, 2})])
def test_aibrix_worked_example_4_1_1(factor, expected):
    picks = set()
    for seed in range(20):
        p = AibrixPrefixPolicy(stddev_factor=factor)
        r = Router(p, 3, seed=seed)
        r.state.index.insert(0, _h(DOC))
        r.state.run = [4, 1, 1]
        assert p.match_percent(req(DOC), r.state, [0, 1, 2]) == {0: 100.0, 1: 0.0, 2: 0.0}
        picks.add(r.route(req(DOC)))
    assert picks == expected  # mu = 2, sigma = 1.414: limit 4.83 with factor 2, 3.41 with factor 1


def test_aibrix_imbalance_goes_to_the_least_running_regardless_of_the_cache():
    p = AibrixPrefixPolicy()
    r = Router(p, 3)
    r.state.index.insert(0, _h(DOC))
    r.state.run = [17, 1, 0]
    assert r.route(req(DOC)) == 2
    r.state.index.drop_rank(2)  # that dispatch inserted the prompt for rank 2
    r.state.run = [16, 1, 0]
    assert r.route(req(DOC)) == 0  # 16 is not > 16, and 16 <= mu + 2 sigma = 20.3


def test_aibrix_candidates_in_order_of_match_then_run_then_index():
    p = AibrixPrefixPolicy()
    r = Router(p, 3)
    hs = _h(DOC)
    r.state.index.insert(0, hs[:1])
    r.state.index.insert(1, hs)
    r.state.index.insert(2, hs)
    r.state.run = [0, 2, 1]
    assert p.match_percent(req(DOC), r.state, [0, 1, 2]) == {0: 50.0, 1: 100.0, 2: 100.0}
    assert r.route(req(DOC)) == 2


def test_aibrix_dispatch_inserts_and_counts_running_until_finish():
    p = AibrixPrefixPolicy()
    r = Router(p, 2)
    a = req(DOC)
    k = r.route(a)
    assert r.state.run[k] == 1 and r.state.index.prefix_run(k, _h(DOC)) == 2
    p.on_finish(r.state, a.req_id, k, 1)
    assert r.state.run == [0, 0]
    assert r.route(req(DOC)) == k


def test_aibrix_code_defaults_preset():
    p = PEER_POLICIES["aibrix_prefix@code_defaults"]()
    assert isinstance(p, AibrixPrefixPolicy) and (p.abs_count, p.factor) == (8, 1.0)
    d = PEER_POLICIES["aibrix_prefix"]()
    assert isinstance(d, AibrixPrefixPolicy) and (d.abs_count, d.factor, d.block_chars) == (16, 2.0, 128)


# ---------------------------------------------------------------- session_hash


def test_session_hash_maps_a_key_to_its_ring_rank_every_time():
    r = Router(SessionHashPolicy(), 4)
    ranks = [r.route(req([1], key=f"user{i % 10}")) for i in range(100)]
    assert all(ranks[i] == ranks[i % 10] for i in range(100))
    assert ranks[:8] == [r.state.ring.lookup(f"user{i}") for i in range(8)]


def test_session_hash_a_dead_rank_moves_only_its_keys():
    p = SessionHashPolicy()
    r = Router(p, 4)
    before = {k: r.route(req([1], key=f"c{k}")) for k in range(200)}
    p.on_rank_dead(r.state, 2)
    after = {k: r.route(req([1], key=f"c{k}")) for k in range(200)}
    assert {k for k in before if before[k] != after[k]} == {k for k in before if before[k] == 2}


def test_session_hash_fallback_is_lowest_qps_over_60s_with_lowest_index_ties():
    p = SessionHashPolicy()
    r = Router(p, 3)
    assert [r.route(req([1]), now_us=t) for t in (0, 1, 2, 3)] == [0, 1, 2, 0]
    k = r.route(req([1], key="k"), now_us=4)  # keyed requests count too
    assert r.route(req([1]), now_us=5) == (1 if k != 1 else 2)
    # at 60 s + 3 us only the dispatches at 4 and 5 us are still within the window
    assert r.route(req([1]), now_us=QPS_WINDOW_US + 3) == min({0, 1, 2} - {k, 1 if k != 1 else 2})


def test_session_hash_random_fallback_uses_the_rng():
    picks = {Router(SessionHashPolicy(fallback="random"), 4, seed=s).route(req([1])) for s in range(30)}
    assert len(picks) > 1
    with pytest.raises(ConfigError):
        SessionHashPolicy(fallback="nearest")


def test_sticky_least_loaded_sends_new_keys_to_the_fewest_active_keys_and_sticks():
    p = PEER_POLICIES["session_hash@sticky_least_loaded"]()
    assert isinstance(p, SessionHashPolicy)
    r = Router(p, 3)
    first = [r.route(req([1], key=f"k{i}"), now_us=i) for i in range(6)]
    assert sorted(first) == [0, 0, 1, 1, 2, 2]
    assert [r.route(req([1], key=f"k{i}"), now_us=10 + i) for i in range(6)] == first
    assert r.state.active_keys == [2, 2, 2]


def test_sticky_keys_expire_after_two_idle_hours():
    p = SessionHashPolicy(sticky_least_loaded=True)
    r = Router(p, 2)
    a = r.route(req([1], key="a"), now_us=0)
    r.route(req([1], key="b"), now_us=1)
    p.on_timer(r.state, STICKY_IDLE_US + 1)
    assert r.state.sticky == {"b": (1 - a, 1)} and r.state.active_keys[a] == 0


def test_sticky_least_loaded_breaks_ties_by_the_highest_rendezvous_hash():
    from asyncdp.dp.peers.hashing import stable_hash64
    for key in ("alpha", "beta", "gamma", "delta"):
        r = Router(SessionHashPolicy(sticky_least_loaded=True), 5)
        assert r.route(req([1], key=key)) == max(range(5), key=lambda i: stable_hash64(f"{key}/{i}"))
