"""Every peer policy: ``select`` never mutates its state, decisions are deterministic for a seed, hints bypass
the policy, dead ranks are never chosen (routing-bench §1.2, §2.0)."""

from __future__ import annotations

import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncdp.dp.peers import PEER_POLICIES, KvEvent
from asyncdp.dp.peers.hashing import block_hashes
from asyncdp.dp.policy import RankLoad, RequestView, Snapshot
from asyncdp.errors import UnavailableError

NAMES = sorted(PEER_POLICIES)
DP = 4


def make_request(k: int, group: int, turn: int, key: bool, hint: int | None, t_us: int) -> RequestView:
    shared = [100 + group * 997 + i for i in range(24 + 8 * turn)]
    own = [50_000 + k * 31 + i for i in range(k % 9)]
    return RequestView(f"q{k}", tuple(shared + own), 8, f"s{group}" if key else None, hint, t_us)


# one op per step: (kind, a, b) with kind 0 request, 1 first token, 2 tokens, 3 finish, 4 snapshot,
# 5 kv event, 6 timer, 7 rank dead
OPS = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 50), st.integers(0, 3)), min_size=1, max_size=40)


def drive(name: str, ops, seed: int, check_purity: bool) -> list[int]:
    policy = PEER_POLICIES[name]()
    state = policy.init(DP, 0, 1, {"block_size_tokens": 16})
    rng = random.Random(seed)
    snap: Snapshot | None = None
    inflight: list[tuple[str, int, RequestView]] = []
    picks: list[int] = []
    now, k, dead = 0, 0, set()
    for kind, a, b in ops:
        now += 1000 * (a + 1)
        if kind == 0 or kind == 7 and len(dead) >= DP - 1:
            hint = b if a % 11 == 0 and b not in dead else None
            r = make_request(k, a % 3, b, a % 2 == 0, hint, now)
            k += 1
            before = pickle.dumps(state)
            rng_before = rng.getstate()
            d = policy.select(r, snap, state, now, rng)
            if check_purity:
                assert pickle.dumps(state) == before, f"{name}.select mutated its state"
                assert rng.getstate() == rng_before or not d.hinted
            if hint is not None:
                assert d.dp_rank == hint and d.hinted
            assert d.dp_rank not in dead or d.hinted
            policy.on_dispatch(state, r, d, now)
            inflight.append((r.req_id, d.dp_rank, r))
            picks.append(d.dp_rank)
        elif kind in (1, 2, 3) and inflight:
            rid, rank, r = inflight[a % len(inflight)]
            if kind == 1:
                policy.on_first_token(state, rid, rank, now)
            elif kind == 2 and policy.needs_tokens:
                policy.on_tokens(state, rid, rank, b + 1, now)
            elif kind == 3:
                policy.on_finish(state, rid, rank, now)
                inflight.remove((rid, rank, r))
        elif kind == 4:
            snap = Snapshot(tuple(RankLoad(waiting=(a + i) % 5, running=(b + i) % 3, kv_usage=((a * i) % 10) / 10,
                                           pending_prefill_tokens=a * i, running_tokens=b * i,
                                           waiting_uncached_tokens=a, gen_tput_tok_s=100.0 * b,
                                           sampled_at_us=now) for i in range(DP)), seq=a, delivered_at_us=now)
            policy.on_snapshot(state, snap)
        elif kind == 5 and inflight:
            _, rank, r = inflight[a % len(inflight)]
            hs = tuple(block_hashes(r.tokens, 16))
            policy.on_kv_event(state, KvEvent(rank, "stored" if b else "removed", hs))
        elif kind == 6:
            policy.on_timer(state, now)
        elif kind == 7:
            victim = a % DP
            dead.add(victim)
            policy.on_rank_dead(state, victim)
    return picks


@pytest.mark.parametrize("name", NAMES)
@given(ops=OPS, seed=st.integers(0, 2 ** 32))
@settings(max_examples=25, deadline=None)
def test_select_is_pure_and_never_picks_a_dead_rank(name, ops, seed):
    drive(name, ops, seed, check_purity=True)


@pytest.mark.parametrize("name", NAMES)
def test_the_same_seed_gives_the_same_decisions(name):
    ops = [(random.Random(i).randrange(7), i * 7 % 51, i % 4) for i in range(120)]
    first = drive(name, ops, 42, check_purity=False)
    assert first == drive(name, ops, 42, check_purity=False)
    assert len(first) > 10


@pytest.mark.parametrize("name", NAMES)
def test_no_rank_left_is_unavailable(name):
    policy = PEER_POLICIES[name]()
    state = policy.init(2, 0, 1, None)
    policy.on_rank_dead(state, 0)
    policy.on_rank_dead(state, 1)
    with pytest.raises(UnavailableError):
        policy.select(make_request(0, 0, 0, True, None, 0), None, state, 0, random.Random(0))


def test_every_registered_name_builds_a_policy_with_that_name():
    for name, factory in PEER_POLICIES.items():
        assert factory().name == name
        assert factory() is not factory()
