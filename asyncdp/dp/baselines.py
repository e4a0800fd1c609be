"""Simple baseline policies (routing-bench §2.2-2.4): ``round_robin``, ``random``, ``power_of_two``.

Pure decisions in ``select``; local state (the counter, in-flight counts, the last snapshot) changes in the hooks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from asyncdp.dp.policy import (
    ChoosingPolicy,
    Decision,
    Policy,
    RequestView,
    Snapshot,
    alive_indices,
    hinted_decision,
)
from asyncdp.errors import ConfigError, UnavailableError


@dataclass(slots=True)
class SimpleState:
    n: int
    next: int = 0
    inflight: list[int] = field(default_factory=list)
    loads: Snapshot | None = None
    excluded: set[int] = field(default_factory=set)


class RoundRobinPolicy(Policy):
    """``rank = next % dp_size``; ``next += 1`` at dispatch. ``@staggered`` starts replica j at j*N//R."""

    name = "round_robin"

    def __init__(self, *, staggered: bool = False) -> None:
        self.staggered = staggered

    def init(self, dp_size: int, router_index: int = 0, num_routers: int = 1,
             params: dict[str, Any] | None = None) -> SimpleState:
        start = (dp_size * router_index) // num_routers if self.staggered else 0
        return SimpleState(dp_size, start, [0] * dp_size)

    def select(self, req: RequestView, snap: Snapshot | None, state: SimpleState, now_us: int,
               rng: random.Random) -> Decision:
        hinted = hinted_decision(req)
        if hinted is not None:
            return hinted
        for k in range(state.n):
            i = (state.next + k) % state.n
            if i not in state.excluded:
                return Decision(i)
        raise UnavailableError("no data-parallel rank is alive")

    def on_dispatch(self, state: SimpleState, req: RequestView, decision: Decision, now_us: int) -> None:
        if not decision.hinted:
            state.next = (decision.dp_rank + 1) % state.n  # skipping dead ranks keeps the order
        state.inflight[decision.dp_rank] += 1

    def on_finish(self, state: SimpleState, req_id: str, dp_rank: int, now_us: int) -> None:
        state.inflight[dp_rank] = max(0, state.inflight[dp_rank] - 1)


class RandomPolicy(RoundRobinPolicy):
    """``rank = rng.randrange(dp_size)`` (re-drawn among live ranks when some are dead)."""

    name = "random"

    def select(self, req: RequestView, snap: Snapshot | None, state: SimpleState, now_us: int,
               rng: random.Random) -> Decision:
        hinted = hinted_decision(req)
        if hinted is not None:
            return hinted
        if not state.excluded:
            return Decision(rng.randrange(state.n))
        return Decision(rng.choice(alive_indices(state)))

    def on_dispatch(self, state: SimpleState, req: RequestView, decision: Decision, now_us: int) -> None:
        state.inflight[decision.dp_rank] += 1


class PowerOfTwoPolicy(ChoosingPolicy, RandomPolicy):
    """Two distinct ranks by ``rng.sample``; the lower ``metric`` wins, the first drawn on a tie."""

    name = "power_of_two"
    METRICS = ("inflight", "queue", "load", "kv")

    def __init__(self, *, metric: str = "inflight") -> None:
        if metric not in self.METRICS:
            raise ConfigError(f"power_of_two metric must be one of {', '.join(self.METRICS)} (got {metric!r}).")
        super().__init__()
        self.metric = metric

    def choose(self, req: RequestView, snap: Snapshot | None, state: SimpleState, alive: list[int],
               now_us: int, rng: random.Random) -> int:
        if len(alive) == 1:
            return alive[0]
        i, j = rng.sample(alive, 2)
        return j if self._metric(state, j) < self._metric(state, i) else i

    def _metric(self, state: SimpleState, i: int) -> float:
        loads = state.loads
        if self.metric == "inflight" or loads is None:
            return state.inflight[i]
        x = loads.loads[i]
        if self.metric == "queue":
            return x.waiting
        if self.metric == "load":
            return x.waiting + x.running
        return x.kv_usage

    def on_snapshot(self, state: SimpleState, snap: Snapshot) -> None:
        state.loads = snap


