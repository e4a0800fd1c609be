"""Requests and routing steps shared by the conformance tests of asyncdp's policy (tests/dp/test_asyncdp_*.py).

Prompts are 16-token blocks (the policy's block size)."""

from __future__ import annotations

import random

from asyncdp.dp.asyncdp_policy import AsyncdpPolicy, AsyncdpState
from asyncdp.dp.policy import RankLoad, RequestView, Snapshot

INF = float("inf")

PREFIX = tuple(range(1000, 1064))  # 4 blocks


def prompt(tail: int, key: str | None = None, prefix: tuple[int, ...] = PREFIX) -> RequestView:
    return RequestView(f"r{tail}-{key}", (*prefix, *range(tail * 100, tail * 100 + 16)), routing_key=key)


def route(policy: AsyncdpPolicy, state: AsyncdpState, req: RequestView, now_us: int = 0,
          hint: int | None = None) -> int:
    if hint is not None:
        req = RequestView(req.req_id, req.tokens, req.max_tokens, req.routing_key, hint, req.t_arrival_us)
    d = policy.select(req, None, state, now_us, random.Random(0))
    policy.on_dispatch(state, req, d, now_us)
    return d.dp_rank


def snapshot(*loads: tuple[int, int, float], at_us: int = 0) -> Snapshot:
    return Snapshot(tuple(RankLoad(w, r, kv) for w, r, kv in loads), delivered_at_us=at_us)


def decode_on(p: AsyncdpPolicy, s: AsyncdpState, req: RequestView, rank: int) -> None:
    """Send ``req`` to ``rank`` (a hint) and let it produce its first token: it is decoding there."""
    route(p, s, req, hint=rank)
    p.on_first_token(s, req.req_id, rank, 1)
