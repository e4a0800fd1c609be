"""Routing decision time (spec routing-bench §6, gate G7): wall-clock ns around ``select``, with the hooks and
the prompt hashing timed apart, at several ``dp_size``.

The synthetic stream: shared-prefix prompts (``GROUPS`` groups of a 256-token system prompt + a 64-token
question, so the prefix policies' indexes hold hits), requests finishing (first token, then finish, oldest
first) so in-flight counts stay bounded at 4 per rank, and every 100 decisions a snapshot of the stream's own
in-flight counts (split at random between waiting and running, random KV usage), as a live client sees. Each decision is timed in three parts: ``hash`` (:func:`~asyncdp.dp.asyncdp_policy.prompt_hashes`, only
for a policy that hashes that way; the others hash inside ``select``), ``select`` and ``hooks``
(``on_dispatch``). The clock is ``time.perf_counter_ns`` (its own cost calibrated away; the thread's CPU clock was
tried and is coarser than a decision), so on a busy machine a decision the process was descheduled in reads
long: compare with ``vllm`` timed in the same run. Timings are not deterministic: they
never enter the deterministic JSON.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from asyncdp.dp.asyncdp_policy import AsyncdpPolicy, prompt_hashes
from asyncdp.dp.balance import Policy, RequestView, Snapshot, make_policy

TARGET_US = 5.0
TARGET_DP = 64
DP_SIZES = (8, 64, 256)
GROUPS = 32


def _requests(count: int, rng: random.Random) -> list[RequestView]:
    systems = [[rng.randrange(1, 32_000) for _ in range(256)] for _ in range(GROUPS)]
    return [RequestView(f"r{k}", (*systems[rng.randrange(GROUPS)], *(rng.randrange(1, 32_000) for _ in range(64))),
                        max_tokens=64) for k in range(count)]


def _snapshot(rng: random.Random, inflight: Sequence[int]) -> Snapshot:
    """What the coordinator would report for the stream's own in-flight requests (a random split between
    waiting and running, a random KV usage)."""
    counts = []
    for k in inflight:
        waiting = rng.randint(0, k)
        counts.append([waiting, k - waiting, rng.random()])
    return Snapshot.from_counts(counts)


def _stats(ns: Sequence[int], overhead: int) -> dict[str, float]:
    us = sorted(max(0, s - overhead) / 1000 for s in ns)
    return {"mean_us": statistics.fmean(us), "p50_us": us[len(us) // 2], "p99_us": us[int(len(us) * 0.99)]}


def measure(policy: Policy | str, dp_size: int, decisions: int = 5000, seed: int = 1,
            routers: int = 1) -> dict[str, Any]:
    """Time ``decisions`` decisions of ``policy`` at ``dp_size`` (after a warm-up of a fifth as many), as the first of
    ``routers`` API servers (the others' work shows only in the snapshots)."""
    pol = make_policy(policy) if isinstance(policy, str) else policy
    rng = random.Random(seed)
    state = pol.init(dp_size, 0, routers, {"kv_blocks_per_rank": 4096})
    prng = random.Random(seed + 1)
    warm = decisions // 5
    reqs = _requests(warm + decisions, rng)
    own_hash = isinstance(pol, AsyncdpPolicy)
    live: list[tuple[str, int]] = []
    inflight = [0] * dp_size
    t_hash, t_sel, t_hook = [], [], []
    clock = time.perf_counter_ns
    gc.collect()
    gc.disable()  # a collection pause is not a decision cost
    try:
        for k, req in enumerate(reqs):
            if k % 100 == 0:
                pol.on_snapshot(state, _snapshot(rng, inflight))
            t0 = clock()
            if own_hash:
                prompt_hashes(req, 16)
            t1 = clock()
            d = pol.select(req, None, state, k * 1000, prng)
            t2 = clock()
            pol.on_dispatch(state, req, d, k * 1000)
            t3 = clock()
            if k >= warm:
                t_hash.append(t1 - t0)
                t_sel.append(t2 - t1)
                t_hook.append(t3 - t2)
            live.append((req.req_id, d.dp_rank))
            inflight[d.dp_rank] += 1
            if len(live) > 4 * dp_size:
                rid, rank = live.pop(0)
                inflight[rank] -= 1
                pol.on_first_token(state, rid, rank, k * 1000)
                pol.on_finish(state, rid, rank, k * 1000)
    finally:
        gc.enable()
    overhead = min(clock() - clock() for _ in range(1000))
    return {"policy": pol.name, "dp": dp_size, "routers": routers, "decisions": decisions,
            "select": _stats(t_sel, overhead),
            "hash": _stats(t_hash, overhead), "hooks": _stats(t_hook, overhead)}


def g7(rows: Sequence[dict[str, Any]], candidate: str) -> tuple[str, str, str]:
    """G7: the candidate's ``select`` p50 under 5 µs at 64 ranks (p99 and the other sizes reported)."""
    mine = {r["dp"]: r for r in rows if r["policy"] == candidate}
    if TARGET_DP not in mine:
        return ("G7", "n/a", "decision time not measured (run with --decision-time)")
    detail = "; ".join(f"dp {dp}: select p50 {r['select']['p50_us']:.2f} us, p99 {r['select']['p99_us']:.2f} us, "
                       f"hash p50 {r['hash']['p50_us']:.2f} us, hooks p50 {r['hooks']['p50_us']:.2f} us"
                       for dp, r in sorted(mine.items()))
    ok = mine[TARGET_DP]["select"]["p50_us"] < TARGET_US
    return ("G7", "PASS" if ok else "FAIL", detail)
