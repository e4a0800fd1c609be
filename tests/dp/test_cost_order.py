"""The kept order of the ranks' costs (``unseen.CostOrder``) that the pour of the other routers' unseen work reads in
O(log n) (G7): checked against the plain definitions over random costs, moves and dead ranks."""

from __future__ import annotations

import math
import random

import pytest

from asyncdp.dp.ties import pick_among
from asyncdp.dp.unseen import CostOrder

INF = math.inf


def plain_level(values: list[float], amount: float) -> float:
    """The level by its definition: raise the lowest finite values one at a time until the amount is used."""
    finite = sorted(v for v in values if v != INF)
    if not finite:
        return INF
    for k in range(1, len(finite) + 1):
        level = (amount + sum(finite[:k])) / k
        if k == len(finite) or level <= finite[k]:
            return level
    raise AssertionError("unreachable")


def in_order(costs: list[float]) -> tuple[list[float], list[int]]:
    """The costs and their ranks, sorted by cost and then by rank."""
    pairs = sorted((c, r) for r, c in enumerate(costs))
    return [c for c, _ in pairs], [r for _, r in pairs]


def random_costs(rng: random.Random, n: int) -> list[float]:
    # a few equal values (idle ranks tie at 0), a dead rank now and then
    return [rng.choice((0.0, 0.0, 16.0, INF)) if rng.random() < 0.2 else rng.uniform(0, 5000) for _ in range(n)]


@pytest.mark.parametrize("n", [1, 2, 8, 64, 256])
def test_the_level_and_the_ranks_under_it_match_the_definition(n):
    rng = random.Random(n)
    for _ in range(200):
        base = random_costs(rng, n)
        amount = rng.choice((1e-3, 1.0, 500.0, 5000.0, 1e6))
        order = CostOrder(base, base)
        level, count = order.level(amount)
        under = order.ranks[:count]
        assert level == pytest.approx(plain_level(base, amount), rel=1e-12)
        if level == INF:
            assert count == 0
            continue
        assert sorted(under) == [i for i, b in enumerate(base) if b < level]
        assert [base[i] for i in under] == sorted(base[i] for i in under)  # cheapest first
        assert sum(level - base[i] for i in under) == pytest.approx(amount, rel=1e-9)  # the whole amount poured


def test_moves_keep_the_order_of_cost_then_rank_and_the_level_its_head():
    rng = random.Random(5)
    base = random_costs(rng, 32)
    mbase = [b * 1.1 for b in base]
    order = CostOrder(base, mbase)
    for step in range(3000):
        if step % 7 == 0:  # a level in between: the head it leaves must follow the moves after it
            amount = rng.choice((1.0, 300.0, 3000.0, 1e5))
            assert order.level(amount)[0] == pytest.approx(plain_level(base, amount), rel=1e-9)
        assert order.head == pytest.approx(sum(order.vals[:order.k]), rel=1e-9, abs=1e-6)
        i = rng.randrange(32)
        new = rng.choice((0.0, 16.0, INF, base[i], rng.uniform(0, 5000)))
        mnew = rng.choice((new, new * 1.1, mbase[i]))
        order.move(i, base[i], new, mbase[i], mnew)
        base[i], mbase[i] = new, mnew
        assert (order.vals, order.ranks) == in_order(base)
        assert (order.mvals, order.mranks) == in_order(mbase)


def test_the_miss_pick_is_the_cheapest_raised_miss_cost_and_its_ties_picked_by_the_pour():
    rng = random.Random(11)
    for trial in range(2000):
        n = rng.choice((2, 4, 8, 64))
        base = random_costs(rng, n)
        if all(b == INF for b in base):
            continue
        # miss costs near the base costs, some equal, so that raised and untouched ranks tie now and then
        mbase = [b if b == INF else b + rng.choice((0.0, 0.0, 8.0, rng.uniform(-50, 50))) for b in base]
        order = CostOrder(base, mbase)
        amount = rng.choice((1.0, 100.0, 2000.0))
        level, count = order.level(amount)
        key = rng.getrandbits(64)
        best, pick = order.miss_pick(mbase, base, count, level, key)
        lifted = [m + (level - b) if b < level else m for m, b in zip(mbase, base, strict=True)]
        assert best == min(lifted)
        tied = [i for i, c in enumerate(lifted) if c == best]
        assert pick == (tied[0] if len(tied) == 1 else pick_among(tied, key, base, level)), trial


def test_the_pour_pick_is_pick_among_the_ranks_under_the_level_in_the_order_of_rank():
    rng = random.Random(8)
    for _ in range(300):
        n = rng.choice((2, 8, 64))
        base = random_costs(rng, n)
        order = CostOrder(base, base)
        level, count = order.level(rng.choice((10.0, 1000.0, 1e5)))
        if not count:
            continue
        under = [i for i, b in enumerate(base) if b < level]
        for key in (0, 0xFFFF_FFFF, *(rng.getrandbits(64) for _ in range(20))):  # the draw's two ends, then any
            assert order.pour_pick(level, count, key, base) == pick_among(under, key, base, level)
