"""``session_hash``: consistent hashing on the routing key (routing-bench §2.11).

Theory of operation. A request with a ``routing_key`` goes to the key's rank on a static ring
(:class:`~asyncdp.dp.peers.ring.HashRing`, 128 points per rank); a dead rank's keys move to the next point
clockwise and no other key moves. A request without a key uses the fallback: ``lowest_qps`` (the rank this router
sent the fewest requests to in the last 60 s, the lowest index on a tie; production-stack) or ``random``.

``@sticky_least_loaded`` (vLLM Router): a key seen for the first time, or idle for more than 2 h, goes to the
rank with the fewest active keys, ties broken by the highest rendezvous hash ``stable_hash64(f"{key}/{rank}")``;
it then sticks there. A key stays active while it has been used within the idle limit; the timer (every 60 s)
forgets idle keys. The end of a conversation is not visible to a policy, so idleness is the only expiry [ours].
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from asyncdp.dp.peers.hashing import stable_hash64
from asyncdp.dp.peers.ring import HashRing
from asyncdp.dp.policy import Decision, Policy, RequestView, Snapshot, alive_indices, hinted_decision
from asyncdp.errors import ConfigError

QPS_WINDOW_US = 60_000_000
STICKY_IDLE_US = 7_200_000_000
FALLBACKS = ("lowest_qps", "random")


@dataclass(slots=True)
class SessionState:
    n: int
    ring: HashRing
    recent: deque[tuple[int, int]] = field(default_factory=deque)  # (t_us, rank) of recent dispatches
    sticky: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (rank, last use us)
    active_keys: list[int] = field(default_factory=list)
    excluded: set[int] = field(default_factory=set)


class SessionHashPolicy(Policy):
    name = "session_hash"

    def __init__(self, *, vnodes: int = 128, fallback: str = "lowest_qps", sticky_least_loaded: bool = False) -> None:
        if fallback not in FALLBACKS:
            raise ConfigError(f"session_hash fallback must be one of {', '.join(FALLBACKS)} (got {fallback!r}).")
        self.vnodes = vnodes
        self.fallback = fallback
        self.sticky = sticky_least_loaded
        self.timer_period_us = 60_000_000 if sticky_least_loaded else None

    def init(self, dp_size: int, router_index: int = 0, num_routers: int = 1,
             params: dict[str, Any] | None = None) -> SessionState:
        return SessionState(dp_size, HashRing.build(dp_size, self.vnodes), active_keys=[0] * dp_size)

    def select(self, req: RequestView, snap: Snapshot | None, state: SessionState, now_us: int,
               rng: random.Random) -> Decision:
        hinted = hinted_decision(req)
        if hinted is not None:
            return hinted
        key = req.routing_key
        if key is None:
            return Decision(self._fallback(state, now_us, rng))
        if not self.sticky:
            return Decision(state.ring.lookup(key, state.excluded))
        held = state.sticky.get(key)
        if held is not None and now_us - held[1] <= STICKY_IDLE_US and held[0] not in state.excluded:
            return Decision(held[0])
        alive = alive_indices(state)
        return Decision(min(alive, key=lambda i: (state.active_keys[i], -stable_hash64(f"{key}/{i}"))))

    def _fallback(self, state: SessionState, now_us: int, rng: random.Random) -> int:
        alive = alive_indices(state)
        if self.fallback == "random":
            return rng.choice(alive)
        counts = [0] * state.n
        for t, r in state.recent:
            if now_us - t < QPS_WINDOW_US:
                counts[r] += 1
        return min(alive, key=lambda i: (counts[i], i))

    def on_dispatch(self, state: SessionState, req: RequestView, decision: Decision, now_us: int) -> None:
        r = decision.dp_rank
        state.recent.append((now_us, r))
        while state.recent and now_us - state.recent[0][0] >= QPS_WINDOW_US:
            state.recent.popleft()
        key = req.routing_key
        if self.sticky and key is not None and not decision.hinted:
            old = state.sticky.get(key)
            if old is not None:
                state.active_keys[old[0]] -= 1
            state.sticky[key] = (r, now_us)
            state.active_keys[r] += 1

    def on_timer(self, state: SessionState, now_us: int) -> None:
        for key in [k for k, (_, t) in state.sticky.items() if now_us - t > STICKY_IDLE_US]:
            r, _ = state.sticky.pop(key)
            state.active_keys[r] -= 1
