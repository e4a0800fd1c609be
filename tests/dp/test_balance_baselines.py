"""The baseline policies behind the LoadBalancer (vllm_legacy, round_robin, random, power_of_two,
session_hash) and the policy names: the --lb-policy flag knows exactly what make_policy builds, and an unknown
name or preset is a ConfigError naming the valid ones."""

from __future__ import annotations

import pytest

from asyncdp.dp.balance import POLICIES, LoadBalancer, make_policy
from asyncdp.errors import ConfigError


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
