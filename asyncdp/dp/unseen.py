"""The other routers' unseen work: what R - 1 other API servers sent since the last snapshot, which no snapshot
shows yet (routing-policy.md, "Several routers"). ``asyncdp`` pours it for a prompt some rank holds (W6's template,
a hit); ``asyncdp@fill`` for new prompts too; ``asyncdp@no_fill`` never.

Each router keeps its own send rate (``AsyncdpState.send_rate``: uncached prompt tokens plus decode weights, each
request counted at most ``UNSEEN_REQUEST_TOKENS``, folded in at every snapshot by :func:`fold_rate`); the others'
unseen work is ``R - 1`` times that rate over the snapshot's age (``AsyncdpState.unseen``). The policy pours it over
the cheapest ranks (:meth:`CostOrder.level`, :func:`raised`): the ranks under the level tie, and the request's key
picks among them by the share of the pour each took (:meth:`CostOrder.pour_pick`, :func:`.ties.pick_among`).

``select`` must stay a few lookups at 64 ranks (G7), so the level is not found by sorting every rank's cost at each
decision: :class:`CostOrder` keeps the ranks in the order of their costs as the hooks change them, and a decision
reads the level in a few steps from where the last one stopped (:meth:`CostOrder.level`). The draw among the ranks
under it and the cheapest rank the pour leaves untouched read the ranks under the level (:meth:`CostOrder.pour_pick`,
:meth:`CostOrder.miss_pick`); the policy draws only where its choice reads the drawn rank."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from asyncdp.dp.ties import pick_among

UNSEEN_FILL = 1.0  # [ours] the share of the estimate poured (asyncdp@no_fill: 0)
UNSEEN_REQUEST_TOKENS = 512.0  # [ours] one request's most in the send rate: a long prompt lands on one rank, not spread
SEND_RATE_TAU_US = 2_000_000  # [ours] the send rate is averaged over about this long (fold_rate)
UNSEEN_MAX_AGE_US = 1_000_000  # [ours] the others' unseen work grows with the snapshot's age up to this
_INF = float("inf")


def fold_rate(rate: float, sent: float, period_us: int) -> float:
    """``rate`` (per microsecond) with ``sent`` over the last ``period_us`` folded in: an exponential average over
    about ``SEND_RATE_TAU_US``, whatever the snapshots' spacing."""
    return rate + (sent / period_us - rate) * (1.0 - math.exp(-period_us / SEND_RATE_TAU_US))


class CostOrder:
    """Each rank's base cost and miss cost, in ascending order of cost and then of rank (``vals``/``ranks``,
    ``mvals``/``mranks``): what the pour reads in O(log n). The state keeps it with several routers (``reset``
    when every rank changed, ``move`` when one did); a decision on decayed copies of the costs builds one of its
    own. ``k`` and ``head`` (the sum of the first ``k`` costs) are where the last :meth:`level` stopped: the next
    one starts there, and a move keeps ``head`` in step, so a level costs the few ranks it moved by. ``finite``
    counts the finite costs (the live ranks)."""

    __slots__ = ("finite", "head", "k", "mranks", "mvals", "ranks", "vals")

    def __init__(self, base: Sequence[float], mbase: Sequence[float]) -> None:
        self.vals: list[float] = []
        self.ranks: list[int] = []
        self.mvals: list[float] = []
        self.mranks: list[int] = []
        self.k, self.head, self.finite = 0, 0.0, 0
        self.reset(base, mbase)

    def reset(self, base: Sequence[float], mbase: Sequence[float]) -> None:
        pairs = sorted(zip(base, range(len(base)), strict=True))
        self.vals, self.ranks = [v for v, _ in pairs], [r for _, r in pairs]
        pairs = sorted(zip(mbase, range(len(mbase)), strict=True))
        self.mvals, self.mranks = [v for v, _ in pairs], [r for _, r in pairs]
        self.finite = bisect_left(self.vals, _INF)
        self.k = min(max(self.k, 1), self.finite)  # the head is an exact sum again after a reset
        self.head = sum(self.vals[:self.k])

    def move(self, i: int, old: float, new: float, mold: float, mnew: float) -> None:
        """Rank ``i``'s base cost went from ``old`` to ``new``, its miss cost from ``mold`` to ``mnew``."""
        if new != old:
            vals, k = self.vals, self.k
            out, into = _move(vals, self.ranks, i, old, new)
            if old == _INF or new == _INF:  # a rank that died or came back: the head is summed again
                self.finite = bisect_left(vals, _INF)
                self.k = min(max(k, 1), self.finite)
                self.head = sum(vals[:self.k])
            elif out < k <= into:  # it left the head: the next rank slid in
                self.head += vals[k - 1] - old
            elif into < k <= out:  # it joined the head: the head's last rank slid out
                self.head += new - vals[k]
            elif into < k:  # it moved within the head
                self.head += new - old
        if mnew != mold:
            _move(self.mvals, self.mranks, i, mold, mnew)

    def level(self, amount: float) -> tuple[float, int]:
        """The level ``L`` at which ``amount`` poured over the lowest finite base costs fills them
        (``sum(max(0, L - v)) == amount``), and how many ranks' costs are under it: the first that many of
        ``ranks``. ``(inf, 0)`` when no cost is finite. The first ``k`` ranks fill up to ``(amount + head) / k`` once
        that is no higher than the next rank's cost: ``k`` walks there from where the last level left it."""
        vals, finite = self.vals, self.finite
        if not finite:
            return _INF, 0
        k, head = self.k, self.head
        if k < 1:
            k, head = 1, vals[0]
        while k < finite and (amount + head) / k > vals[k]:  # more ranks fill
            head += vals[k]
            k += 1
        while k > 1 and (amount + head - vals[k - 1]) / (k - 1) <= vals[k - 1]:  # fewer do
            k -= 1
            head -= vals[k]
        self.k, self.head = k, head
        level = (amount + head) / k
        # the k ranks that fill are all under the level, but where the amount is too small to raise a cost
        return level, (k if vals[k - 1] < level else bisect_left(vals, level, 0, k))

    def pour_pick(self, level: float, count: int, key: int, base: Sequence[float]) -> int:
        """Among the ``count`` cheapest ranks, those under the level (from :meth:`level`), the one ``key`` draws with
        odds in proportion to the share of the pour each took, ``level - base``: :func:`~.ties.pick_among` over them
        in the order of rank, so that a key keeps its rank while the costs move a little (H6), the total taken from
        the kept order."""
        if count < 1:  # nothing under the level (an estimate too small to raise any cost): the cheapest
            return self.ranks[0]
        ranks = sorted(self.ranks[:count])
        u = (key & 0xFFFF_FFFF) / 4294967296.0 * (count * level - sum(self.vals[:count]))
        for r in ranks:
            u -= level - base[r]
            if u < 0:
                return r
        return ranks[-1]  # rounding

    def miss_pick(self, mbase: Sequence[float], base: Sequence[float], count: int, level: float,
                  key: int) -> tuple[float, int]:
        """For a prompt no rank holds: the cheapest miss cost once the pour raised the ``count`` ranks under the
        level (each by ``level - base``), and the rank :func:`~.ties.pick_among` takes for ``key`` among the ranks
        at it. The untouched ranks are read from ``mvals`` only as far as the first one the pour did not reach."""
        under = self.ranks[:count]
        below = set(under)
        lifted = [(mbase[r] + (level - base[r]), r) for r in under]
        mvals, mranks = self.mvals, self.mranks
        j, n = 0, len(mranks)
        while j < n and mranks[j] in below:
            j += 1
        best = min(mvals[j] if j < n else _INF, min(lifted)[0] if lifted else _INF)
        tied = [r for v, r in lifted if v == best]
        while j < n and mvals[j] == best:
            if mranks[j] not in below:
                tied.append(mranks[j])
            j += 1
        if len(tied) == 1:
            return best, tied[0]
        tied.sort()
        return best, pick_among(tied, key, base, level)


def _move(vals: list[float], ranks: list[int], i: int, old: float, new: float) -> tuple[int, int]:
    """Move rank ``i`` from cost ``old`` to ``new`` in a (cost, rank) order kept as two parallel lists; where it was
    and where it went (after the removal)."""
    out = ranks.index(i, bisect_left(vals, old), bisect_right(vals, old))
    del vals[out], ranks[out]
    lo, hi = bisect_left(vals, new), bisect_right(vals, new)
    into = bisect_left(ranks, i, lo, hi)
    vals.insert(into, new)
    ranks.insert(into, i)
    return out, into


def raised(costs: list[float], base: list[float], level: float) -> list[float]:
    """``costs`` with each rank whose ``base`` is below ``level`` raised by the difference (what pouring the unseen
    work over the cheapest ranks does to them); ``base`` itself rises to exactly ``level``, so the ranks it levels
    tie."""
    if costs is base:
        return [level if b < level else b for b in base]
    return [c + (level - b) if b < level else c for c, b in zip(costs, base, strict=True)]
