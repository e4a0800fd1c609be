"""The other routers' unseen work (``asyncdp@fill``, opt-in): what R - 1 other API servers sent since the last
snapshot, which no snapshot shows yet (routing-policy.md, "Several routers").

Each router keeps its own send rate (``AsyncdpState.send_rate``: uncached prompt tokens plus decode weights, each
request counted at most ``UNSEEN_REQUEST_TOKENS``, folded in at every snapshot by :func:`fold_rate`); the others'
unseen work is ``R - 1`` times that rate over the snapshot's age (``AsyncdpState.unseen``). The policy pours it over
the cheapest ranks (:func:`water_level`, :func:`raised`): the ranks under the level tie, and the request's key picks
among them by the share of the pour each took (:func:`.ties.pick_among`). Pure arithmetic, no state of its own."""

from __future__ import annotations

import math
from collections.abc import Sequence

UNSEEN_FILL = 0.0  # [ours] the policy's default share of the estimate poured (asyncdp@fill: 1)
UNSEEN_REQUEST_TOKENS = 512.0  # [ours] one request's most in the send rate: a long prompt lands on one rank, not spread
SEND_RATE_TAU_US = 2_000_000  # [ours] the send rate is averaged over about this long (fold_rate)
UNSEEN_MAX_AGE_US = 1_000_000  # [ours] the others' unseen work grows with the snapshot's age up to this
_INF = float("inf")


def fold_rate(rate: float, sent: float, period_us: int) -> float:
    """``rate`` (per microsecond) with ``sent`` over the last ``period_us`` folded in: an exponential average over
    about ``SEND_RATE_TAU_US``, whatever the snapshots' spacing."""
    return rate + (sent / period_us - rate) * (1.0 - math.exp(-period_us / SEND_RATE_TAU_US))


def water_level(values: Sequence[float], amount: float) -> float:
    """The level ``L`` at which ``amount`` poured over the lowest of the finite ``values`` fills them:
    ``sum(max(0, L - v)) == amount``. The lowest value for ``amount`` 0; ``inf`` when no value is finite."""
    finite = sorted(values)
    while finite and finite[-1] == _INF:
        finite.pop()
    if not finite:
        return _INF
    over_all = (amount + sum(finite)) / len(finite)
    if over_all >= finite[-1]:  # over every rank: the common case at a snapshot's age, one pass in C
        return over_all
    total = 0.0
    for k in range(1, len(finite)):  # the first k lowest fill up to level <= the next one: k < len(finite) here
        total += finite[k - 1]
        if (level := (amount + total) / k) <= finite[k]:
            return level
    return over_all


def raised(costs: list[float], base: list[float], level: float) -> list[float]:
    """``costs`` with each rank whose ``base`` is below ``level`` raised by the difference (what pouring the unseen
    work over the cheapest ranks does to them); ``base`` itself rises to exactly ``level``, so the ranks it levels
    tie."""
    if costs is base:
        return [level if b < level else b for b in base]
    return [c + (level - b) if b < level else c for c, b in zip(costs, base, strict=True)]
