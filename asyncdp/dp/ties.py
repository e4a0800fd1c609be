"""Ties in asyncdp's policy (H6, H7): among ranks at equal cost, the first in a scan that starts at a stable hash
of the request's key, so the same key lands on the same rank (a conversation's turns, across routers) and
different keys spread over the tied ranks (R routers deciding from one snapshot do not herd onto one rank). Also
the minimum the state keeps with its first index and its ties (:func:`argmin`, :func:`moved_min`)."""

from __future__ import annotations

from collections.abc import Sequence

from asyncdp.dp.peers.hashing import stable_hash64
from asyncdp.dp.policy import RequestView

TIE_KEY_BLOCK = 4  # a request without a routing key is keyed by this block's hash (its first 64 tokens at 16)


def tie_scan(costs: list[float], best: float, pick: int, start: int) -> int:
    """Among the ranks at the minimum ``best`` (``pick`` the first of them), the first at or after ``start`` (H6)."""
    if pick < start:
        tail = costs[start:]
        if best in tail:
            return start + tail.index(best)
    return pick


def pick_among(ranks: list[int], key: int, low: Sequence[float] = (), level: float = 0.0) -> int:
    """One of ``ranks`` (in index order) for ``key``: with odds in proportion to ``level - low[r]`` when ``low`` is
    given and some of those are positive, else with equal odds (the ``key mod count``-th).

    Where the other routers' unseen work was poured over the cheapest ranks up to ``level`` (``low`` the costs
    before), ``level - low[r]`` is the share of it rank r took: each router sending its own request with those odds
    spreads the routers' requests together as the pour assumed. Equal odds would send as many to a rank the pour
    barely reached (a slow rank whose queue shows in the snapshot) as to the cheapest. (``tie_scan`` favours the
    first tied rank after a run of untied ones; where a whole band of ranks ties by construction that rank would
    draw several times its share.)"""
    if low and len(ranks) > 1:
        depth = [level - low[r] if low[r] < level else 0.0 for r in ranks]
        if (total := sum(depth)) > 0:
            u = (key & 0xFFFF_FFFF) / 4294967296.0 * total
            for r, d in zip(ranks, depth, strict=True):
                u -= d
                if u < 0:
                    return r
            return ranks[-1]  # rounding
    return ranks[key % len(ranks)]


def tie_key(req: RequestView, hashes: Sequence[int]) -> int:
    """A stable per-request key for ties (H6): the routing key, else the 4th block hash, else the tokens."""
    if req.routing_key is not None:
        return stable_hash64(req.routing_key)
    if hashes:
        return hashes[min(len(hashes), TIE_KEY_BLOCK) - 1]
    return hash(tuple(req.tokens)) & 0xFFFF_FFFF_FFFF_FFFF  # ints and tuples of ints hash without a salt


def argmin(values: list[float]) -> tuple[float, int, int]:
    """The minimum, its first index and how many entries share it."""
    best = min(values)
    return best, values.index(best), values.count(best)


def moved_min(values: list[float], best: float, pick: int, ties: int, i: int, old: float,
              new: float) -> tuple[float, int, int]:
    """``values[i]`` went from ``old`` to ``new``: the minimum, its first index and its ties after it (O(1) but when
    the last entry at the minimum leaves it)."""
    if new < best:
        return new, i, 1
    if new == best:
        return best, min(pick, i), ties + 1
    if old == best:  # entry i left the minimum
        if ties == 1:
            return argmin(values)
        return best, (values.index(best) if pick == i else pick), ties - 1
    return best, pick, ties
