"""Small drivers for the peer-policy tests: requests, a router loop without a simulator."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

from asyncdp.dp.policy import Policy, RequestView, Snapshot

_ids = iter(range(10 ** 9))


def req(tokens: Sequence[int], *, key: str | None = None, hint: int | None = None, t_us: int = 0,
        rid: str | None = None) -> RequestView:
    return RequestView(rid or f"r{next(_ids)}", tuple(tokens), 16, key, hint, t_us)


def prompt(prefix_id: int, n_prefix: int, suffix_id: int, n_suffix: int) -> list[int]:
    """A prompt of ``n_prefix`` tokens shared by every prompt with the same ``prefix_id``, then its own suffix."""
    return [1000 + prefix_id * 7919 + k for k in range(n_prefix)] + \
           [500_000 + suffix_id * 104_729 + k for k in range(n_suffix)]


class Router:
    """One policy replica: select, then dispatch, as the client does."""

    def __init__(self, policy: Policy, dp_size: int, *, seed: int = 0, params: dict[str, Any] | None = None,
                 router_index: int = 0, num_routers: int = 1) -> None:
        self.policy = policy
        self.state = policy.init(dp_size, router_index, num_routers, params)
        self.rng = random.Random(seed)
        self.snap: Snapshot | None = None

    def route(self, r: RequestView, now_us: int = 0) -> int:
        d = self.policy.select(r, self.snap, self.state, now_us, self.rng)
        self.policy.on_dispatch(self.state, r, d, now_us)
        return d.dp_rank

    def route_all(self, reqs: Iterable[RequestView], now_us: int = 0) -> list[int]:
        return [self.route(r, now_us) for r in reqs]

    def snapshot(self, snap: Snapshot) -> None:
        self.snap = snap
        self.policy.on_snapshot(self.state, snap)
