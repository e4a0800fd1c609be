"""What the balancer tests (tests/dp/test_balance*.py) share: a LoadBalancer seeded with one snapshot's
counts, and its per-rank rows of waiting, running and KV usage."""

from __future__ import annotations

from asyncdp.dp.balance import LoadBalancer


def balancer_with(counts, *, client_count=1, client_index=0, policy="vllm"):
    lb = LoadBalancer(list(range(len(counts))), client_index, client_count, policy)
    lb.on_snapshot(counts)
    return lb


def lb_rows(lb):
    s = lb.state
    return [[w, r, kv] for w, r, kv in zip(s.waiting, s.running, s.kv, strict=True)]
