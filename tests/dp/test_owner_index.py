"""asyncdp's approximate prefix index (asyncdp/dp/owner_index.py) and what the policy's ledger
(asyncdp/dp/asyncdp_state.py) keeps for ``select``: the cost's minimum, its first rank and its ties must always
equal a full scan of ``base``, and the split cost must rebuild ``base`` exactly."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncdp.dp.asyncdp_policy import AsyncdpPolicy, prompt_hashes
from asyncdp.dp.owner_index import OwnerIndex, ranks_of
from asyncdp.dp.policy import RankLoad, RequestView, Snapshot


def test_ranks_of_lists_the_set_bits_in_ascending_order():
    assert ranks_of(0) == ()
    assert ranks_of(0b1) == (0,)
    assert ranks_of(0b1010_0110) == (1, 2, 5, 7)
    assert ranks_of(1 << 255) == (255,)
    assert ranks_of(0b1010_0110) is ranks_of(0b1010_0110)  # memoised


def test_insert_match_and_eviction_keep_each_rank_prefix_closed():
    idx = OwnerIndex.empty(2, capacity=5)
    a, b = [11, 12, 13, 14], [21, 22, 23]
    idx.insert(0, a)
    assert idx.match(0, a) == 4 and idx.match(1, a) == 0
    assert idx.match(0, [11, 12, 99]) == 2
    idx.insert(0, b)  # 7 blocks > 5: a's two tail blocks go first, its root stays
    assert idx.size(0) == 5
    assert idx.match(0, a) == 2 and idx.match(0, b) == 3
    assert idx.owners[11] == 0b01
    idx.insert(1, a)
    assert idx.owners[11] == 0b11 and idx.owners[14] == 0b10
    idx.depth_memo[11] = 2
    idx.drop_rank(0)
    assert idx.size(0) == 0 and idx.owners[11] == 0b10 and 21 not in idx.owners
    idx.drop_rank(1)
    assert idx.owners == {} and idx.depth_memo == {}  # the memo goes with its block


def test_each_rank_counts_the_prefixes_it_holds_until_their_first_block_is_evicted():
    idx = OwnerIndex.empty(2, capacity=5)
    idx.insert(0, [11, 12])
    idx.insert(0, [11, 12, 13])  # the same prefix, longer: still one
    idx.insert(1, [11, 12])  # a second holder counts it too
    assert [len(r) for r in idx.roots] == [1, 1]
    idx.insert(0, [21, 22])
    assert [len(r) for r in idx.roots] == [2, 1]
    idx.insert(0, [31, 32, 33])  # 8 blocks > 5: 11's tail goes, then 11 itself (refreshed before 21)
    assert idx.match(0, [11]) == 0 and idx.match(0, [21, 22]) == 2
    assert [len(r) for r in idx.roots] == [2, 1] and 11 in idx.roots[1]  # rank 1 still holds it
    idx.drop_rank(1)
    assert [len(r) for r in idx.roots] == [2, 0] and 11 not in idx.roots[1]  # gone with the rank
    idx.drop_rank(0)
    assert idx.roots == [set(), set()]


def _req(k: int, group: int, hint: int | None) -> RequestView:
    system = tuple(range(group * 1000, group * 1000 + 48))  # 3 blocks shared per group
    return RequestView(f"q{k}", (*system, *range(50_000 + k * 20, 50_000 + k * 20 + 20)), rank_hint=hint)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 9), seed=st.integers(0, 10_000), steps=st.integers(1, 120))
def test_the_minimum_kept_by_the_hooks_equals_a_full_scan(n: int, seed: int, steps: int) -> None:
    rng = random.Random(seed)
    p = AsyncdpPolicy(memory_tokens=rng.choice([0.0, 4096.0]))
    s = p.init(n, params={"kv_blocks_per_rank": rng.choice([4, 64, 4096])})
    live: list[tuple[str, int, bool]] = []
    now = 0
    for k in range(steps):
        now += rng.choice([0, 1_000, 60_000])
        op = rng.random()
        if op < 0.5 or not live:
            req = _req(k, rng.randrange(4), rng.randrange(n) if rng.random() < 0.2 else None)
            d = p.select(req, None, s, now, rng)
            p.on_dispatch(s, req, d, now)
            live.append((req.req_id, d.dp_rank, False))
        elif op < 0.7:
            i = rng.randrange(len(live))
            rid, rank, started = live[i]
            p.on_first_token(s, rid, rank, now)
            live[i] = (rid, rank, True)
        elif op < 0.9:
            rid, rank, _ = live.pop(rng.randrange(len(live)))
            p.on_finish(s, rid, rank, now)
        elif op < 0.97:
            p.on_snapshot(s, Snapshot(tuple(RankLoad(rng.randrange(4), rng.randrange(4), rng.random())
                                            for _ in range(n)), delivered_at_us=now))
        elif len(s.excluded) < n - 1:
            p.on_rank_dead(s, rng.randrange(n))
        best = min(s.base)
        assert (s.best, s.pick, s.ties) == (best, s.base.index(best), s.base.count(best))
        assert s.costs_at(s.weight) == s.base  # what select recomputes when the weight decays between hooks
        mean = s.load_total / (n - len(s.excluded))
        assert s.cap == max(p.hot_ratio * mean, mean + p.hot_slack)
        assert s.mean_load == mean
        for r in set(range(n)) - s.excluded:  # the holders' costs: base without the memory term, kept by the hooks
            assert s.memory[r] == p.memory_tokens * s.index.size(r) / s.index.capacity
        assert s.hbase == [b - m for b, m in zip(s.base, s.memory, strict=True)]


def test_select_scores_a_rank_holding_only_part_of_the_run_by_its_own_match():
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(3)
    shared = tuple(range(1000, 1064))  # 4 blocks
    deep = RequestView("deep", (*shared, *range(2000, 2032)), rank_hint=0)  # 6 blocks on rank 0
    short = RequestView("short", shared[:32], rank_hint=1)  # 2 blocks on rank 1
    for r in (deep, short):
        p.on_dispatch(s, r, p.select(r, None, s, 0, random.Random(0)), 0)
        p.on_finish(s, r.req_id, r.rank_hint or 0, 0)
    for rid, rank, n in (("busy", 0, 200), ("some", 1, 10)):  # pending tokens: rank 0 200, rank 1 10, rank 2 0
        r = RequestView(rid, tuple(range(9000 + rank * 500, 9000 + rank * 500 + n)), rank_hint=rank)
        p.on_dispatch(s, r, p.select(r, None, s, 0, random.Random(0)), 0)
    q = RequestView("q", (*shared, *range(3000, 3016)))
    assert s.index.match(1, prompt_hashes(q, 16)) == 2 and s.index.match(0, prompt_hashes(q, 16)) == 4
    # rank 0: 200 + 80 - 2·64 = 152; rank 1: 10 + 80 - 2·32 = 26; rank 2, the cheapest by load: 80 (a miss)
    assert p.select(q, None, s, 0, random.Random(0)).dp_rank == 1


def test_holders_tied_on_cost_go_to_the_first_in_the_key_scan_order():
    from asyncdp.dp.peers.hashing import stable_hash64

    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(4)
    shared = tuple(range(1000, 1064))
    for rank in (1, 3):
        r = RequestView(f"warm{rank}", (*shared, *range(2000 + rank * 16, 2016 + rank * 16)), rank_hint=rank)
        p.on_dispatch(s, r, p.select(r, None, s, 0, random.Random(0)), 0)
        p.on_finish(s, r.req_id, rank, 0)
    seen = set()
    for k in range(16):
        key = f"user-{k}"
        start = stable_hash64(key) % 4
        expected = next(r for r in ((start + i) % 4 for i in range(4)) if r in (1, 3))
        q = RequestView(f"q{k}", (*shared, *range(5000, 5016)), routing_key=key)
        assert p.select(q, None, s, 0, random.Random(0)).dp_rank == expected
        seen.add(expected)
    assert seen == {1, 3}  # different keys spread over the tied holders


def test_chain_hashes_are_equal_exactly_for_equal_prefixes_and_ignore_a_partial_tail():
    from asyncdp.dp.owner_index import chain_hashes

    a = tuple(range(100, 150))  # 3 full blocks of 16 + 2 tokens
    b = (*a[:32], 7, *a[33:])  # differs in block 2 only
    ha, hb = chain_hashes(a, 16), chain_hashes(b, 16)
    assert len(ha) == 3 and ha[:2] == hb[:2] and ha[2] != hb[2]
    assert chain_hashes(list(a), 16) == ha  # a list hashes as the tuple does
    assert chain_hashes(a[:47], 16) == ha[:2] and chain_hashes(a[:15], 16) == ()
    assert chain_hashes(a[16:], 16)[0] != ha[1]  # chained: the same block after another prefix differs
    # no per-process salt: another interpreter computes the same values
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "from asyncdp.dp.owner_index import chain_hashes; "
                          "print(chain_hashes(tuple(range(100, 150)), 16))"], capture_output=True, text=True,
                         check=True, timeout=60, env={"PYTHONHASHSEED": "12345", "PATH": ""}).stdout
    assert out.strip() == str(ha)
