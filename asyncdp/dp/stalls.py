"""The stall term of asyncdp's policy (opt-in, ``asyncdp@stall``): a rank that stops answering.

Pending tokens price a queued full hit at one token. A rank that has run out of KV at the edge of capacity
preempts, and its waiting requests, full hits or not, queue for memory rather than for compute: the counters read
it as nearly idle while its requests wait seconds (W2 seed 3 at 30 QPS: 11.7 s on the one rank holding 21 of the
150 groups, 0.08 s on the others, and every request of its groups still sent there). So does a rank that hangs
while it still reports. The age of this router's oldest request still waiting for its first token on a rank is
the signal no counter gives: a healthy rank answers a hit within a few steps.

With ``tokens_per_s`` set, rank i's term is that age past ``grace_us`` (the policy's ``STALL_GRACE_S``, 1 s), at
``tokens_per_s`` tokens a second; the policy adds it to the rank's local cost, so a hit leaves its stalled holder
once the stall outweighs its credit, and its prefix gets a second holder. While half the live ranks or more have
such a request, no stall counts: the cluster is overloaded, not one rank, and moving hits would replicate prefixes
onto ranks as backlogged into a spiral of misses. The router's hooks refresh the terms every ``REFRESH_US`` and
when a request on a stalled rank gets its first token, so ``select`` reads them as of the last hook. Off by
default: at the edge of capacity it cuts W2's mean TTFT several times, but past it (35-60 QPS) the hits it moves
cost more than they save (docs/benchmarks.md, "The stall term").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Protocol

_INF = float("inf")


class Sent(Protocol):
    """What the term reads of one request the router sent (``asyncdp_records.Routed``)."""

    rank: int
    sent_us: int
    decoding: bool  # past its first token
    gone: bool  # finished (or its id reused) before its first token


@dataclass(slots=True)
class Stalls:
    """Per rank, the requests still waiting for their first token in dispatch order, and the stall terms."""

    tokens_per_s: float
    grace_us: int
    n: int
    waiting: list[deque[Sent]] = field(default_factory=list)
    terms: list[float] = field(default_factory=list)
    due_us: int = 0  # the next periodic refresh (the hooks' clock)
    stalled: bool = False  # some rank's oldest waiting request is past the grace

    def __post_init__(self) -> None:
        self.waiting = [deque() for _ in range(self.n)]
        self.terms = [0.0] * self.n

    def sent(self, req: Sent) -> None:
        """A dispatch (only when the term is on)."""
        self.waiting[req.rank].append(req)

    def refresh(self, now_us: int, excluded: Container[int]) -> bool:
        """Recompute the terms; True if one changed. Requests past their first token, or gone, leave the queues
        here (lazily: the hooks only flag them)."""
        excess = []
        for i, queue in enumerate(self.waiting):
            while queue and (queue[0].decoding or queue[0].gone):
                queue.popleft()
            age = now_us - queue[0].sent_us if queue else 0
            excess.append(max(0, age - self.grace_us) if i not in excluded else _INF)
        live = sorted(e for e in excess if e != _INF)
        self.stalled = bool(live) and live[-1] > 0
        if not live:
            return False
        if live[len(live) // 2] > 0:  # half the live ranks or more have a request waiting past the grace: the
            terms = [0.0] * self.n  # cluster is overloaded, and moving hits would replicate groups into a spiral
        else:
            terms = [0.0 if e == _INF else e * self.tokens_per_s / 1e6 for e in excess]
        if terms == self.terms:
            return False
        self.terms = terms
        return True
