"""The optional baselines of routing-bench §2.12: ``vllm_token``, ``smg_least_load``, ``smg_prefix_hash``,
``prodstack_prefixaware``, ``prodstack_loadaware`` and ``ray_prefix``.

Each is a small rule over the router's in-flight counts (``inflight``, +1 at dispatch, -1 at finish), the last
snapshot, and for the prefix ones an index of what this router sent. Ties go to the lowest index unless a rule
says otherwise. Choices the spec leaves open, all [ours]: ``vllm_token`` scans from a start that rotates per
dispatch, as current ``vllm`` does; ``ray_prefix``'s queue length is this router's in-flight count and its tree
is per router (a shared tree needs shared state, which R replicas of a pure policy do not have);
``prodstack_loadaware`` matches in 128-character chunks like ``prodstack_prefixaware``.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from asyncdp.dp.peers.block_index import BlockIndex
from asyncdp.dp.peers.hashing import block_hashes, render_text, units
from asyncdp.dp.peers.radix import RadixTree
from asyncdp.dp.peers.ring import HashRing
from asyncdp.dp.peers.session import QPS_WINDOW_US
from asyncdp.dp.policy import ChoosingPolicy, Decision, RequestView, Snapshot

_NO_EVICTION = 1 << 62


@dataclass(slots=True)
class PeerState:
    """Shared by the optional baselines; each uses the fields it needs."""

    n: int
    client_count: int = 1
    start: int = 0
    inflight: list[int] = field(default_factory=list)
    snap: Snapshot | None = None
    waiting_tokens: list[int] = field(default_factory=list)  # vllm_token: snapshot copy plus bumps
    sent_tokens: list[int] = field(default_factory=list)  # smg_least_load: prompt tokens since the last report
    index: BlockIndex | None = None
    tree: RadixTree | None = None
    ring: HashRing | None = None
    recent: deque[tuple[int, int]] = field(default_factory=deque)
    excluded: set[int] = field(default_factory=set)


class _InflightPolicy(ChoosingPolicy):
    def init(self, dp_size: int, router_index: int = 0, num_routers: int = 1,
             params: dict[str, Any] | None = None) -> PeerState:
        return PeerState(dp_size, num_routers, (dp_size * router_index) // num_routers, [0] * dp_size,
                         waiting_tokens=[0] * dp_size, sent_tokens=[0] * dp_size)

    def on_dispatch(self, state: PeerState, req: RequestView, decision: Decision, now_us: int) -> None:
        state.inflight[decision.dp_rank] += 1

    def on_finish(self, state: PeerState, req_id: str, dp_rank: int, now_us: int) -> None:
        state.inflight[dp_rank] = max(0, state.inflight[dp_rank] - 1)

    def on_cache_reset(self, state: PeerState, dp_rank: int) -> None:
        if state.index is not None:  # the prefix-aware ones' view of what they sent
            state.index.drop_rank(dp_rank)
        if state.tree is not None:
            state.tree.remove_owner(dp_rank)

    def on_snapshot(self, state: PeerState, snap: Snapshot) -> None:
        state.snap = snap


class VllmTokenPolicy(_InflightPolicy):
    """``waiting_tokens*4 + running_tokens``; the bump adds ``prompt_len*C``; snapshots replace the copy."""

    name = "vllm_token"

    def choose(self, req: RequestView, snap: Snapshot | None, state: PeerState, alive_ranks: list[int],
               now_us: int, rng: random.Random) -> int:
        alive = set(alive_ranks)
        running = [x.running_tokens for x in state.snap.loads] if state.snap else [0] * state.n
        best, pick = float("inf"), -1
        for k in range(state.n):
            i = (state.start + k) % state.n
            s = 4 * state.waiting_tokens[i] + running[i]
            if i in alive and s < best:
                best, pick = s, i
        return pick

    def on_dispatch(self, state: PeerState, req: RequestView, decision: Decision, now_us: int) -> None:
        super().on_dispatch(state, req, decision, now_us)
        if not decision.hinted:
            state.waiting_tokens[decision.dp_rank] += req.prompt_len * state.client_count
            state.start = (state.start + 1) % state.n

    def on_snapshot(self, state: PeerState, snap: Snapshot) -> None:
        state.snap = snap
        state.waiting_tokens = [x.pending_prefill_tokens for x in snap.loads]


class SmgLeastLoadPolicy(_InflightPolicy):
    """``argmin (queued + sent)/tput + λ·k/(1-k)``; join-shortest-queue on in-flight before any report."""

    name = "smg_least_load"

    def __init__(self, *, lam_s: float = 0.15, default_tput_tok_s: float = 2000.0) -> None:
        self.lam_s, self.default_tput = lam_s, default_tput_tok_s

    def choose(self, req: RequestView, snap: Snapshot | None, state: PeerState, alive: list[int],
               now_us: int, rng: random.Random) -> int:
        if state.snap is None:
            return min(alive, key=lambda i: (state.inflight[i], i))
        loads = state.snap.loads

        def cost(i: int) -> float:
            x = loads[i]
            k = min(max(x.kv_usage, 0.0), 0.99)
            tput = x.gen_tput_tok_s or self.default_tput
            return (x.waiting_uncached_tokens + state.sent_tokens[i]) / tput + self.lam_s * k / (1 - k)
        return min(alive, key=lambda i: (cost(i), i))

    def on_dispatch(self, state: PeerState, req: RequestView, decision: Decision, now_us: int) -> None:
        super().on_dispatch(state, req, decision, now_us)
        state.sent_tokens[decision.dp_rank] += req.prompt_len

    def on_snapshot(self, state: PeerState, snap: Snapshot) -> None:
        state.snap = snap
        state.sent_tokens = [0] * state.n


class SmgPrefixHashPolicy(_InflightPolicy):
    """The first ``prefix_tokens`` tokens on a ring; above ``avg·load_factor`` in-flight, the least loaded."""

    name = "smg_prefix_hash"

    def __init__(self, *, prefix_tokens: int = 256, load_factor: float = 1.25) -> None:
        self.prefix_tokens, self.load_factor = prefix_tokens, load_factor

    def init(self, dp_size: int, router_index: int = 0, num_routers: int = 1,
             params: dict[str, Any] | None = None) -> PeerState:
        state = super().init(dp_size, router_index, num_routers, params)
        state.ring = HashRing.build(dp_size)
        return state

    def choose(self, req: RequestView, snap: Snapshot | None, state: PeerState, alive: list[int],
               now_us: int, rng: random.Random) -> int:
        assert state.ring is not None
        key = ",".join(map(str, req.tokens[:self.prefix_tokens]))
        if req.cache_salt is not None:  # a salted prompt hits no other salt's blocks: its own place on the ring
            key = f"{req.root_hash}/{key}"
        r = state.ring.lookup(key, state.excluded)
        avg = sum(state.inflight[i] for i in alive) / len(alive)
        if state.inflight[r] > avg * self.load_factor:
            return min(alive, key=lambda i: (state.inflight[i], i))
        return r


def _lowest_qps(state: PeerState, alive: list[int], now_us: int) -> int:
    counts = [0] * state.n
    for t, r in state.recent:
        if now_us - t < QPS_WINDOW_US:
            counts[r] += 1
    return min(alive, key=lambda i: (counts[i], i))


class ProdstackPrefixAwarePolicy(_InflightPolicy):
    """Longest match over 128-character chunks, random among the ranks that reach it; else lowest QPS."""

    name = "prodstack_prefixaware"
    chunk_chars = 128

    def init(self, dp_size: int, router_index: int = 0, num_routers: int = 1,
             params: dict[str, Any] | None = None) -> PeerState:
        state = super().init(dp_size, router_index, num_routers, params)
        state.index = BlockIndex.empty(dp_size, _NO_EVICTION)
        return state

    def runs(self, req: RequestView, state: PeerState, alive: list[int]) -> tuple[dict[int, int], int]:
        assert state.index is not None
        hashes = block_hashes(render_text(req.tokens), self.chunk_chars, parent_hash=req.root_hash)
        return {i: state.index.prefix_run(i, hashes) for i in alive}, len(hashes)

    def choose(self, req: RequestView, snap: Snapshot | None, state: PeerState, alive: list[int],
               now_us: int, rng: random.Random) -> int:
        run, _ = self.runs(req, state, alive)
        best = max(run.values())
        if best == 0:
            return _lowest_qps(state, alive, now_us)
        return rng.choice([i for i in alive if run[i] == best])

    def on_dispatch(self, state: PeerState, req: RequestView, decision: Decision, now_us: int) -> None:
        super().on_dispatch(state, req, decision, now_us)
        assert state.index is not None
        hashes = block_hashes(render_text(req.tokens), self.chunk_chars, parent_hash=req.root_hash)
        state.index.insert(decision.dp_rank, hashes, now_us)
        state.recent.append((now_us, decision.dp_rank))
        while state.recent and now_us - state.recent[0][0] >= QPS_WINDOW_US:
            state.recent.popleft()


class ProdstackLoadAwarePolicy(ProdstackPrefixAwarePolicy):
    """``argmax matched/prompt - β·(load - mean)/max(1, mean)`` on in-flight counts; the lowest index on a tie."""

    name = "prodstack_loadaware"

    def __init__(self, *, beta: float = 1.0) -> None:
        self.beta = beta

    def choose(self, req: RequestView, snap: Snapshot | None, state: PeerState, alive: list[int],
               now_us: int, rng: random.Random) -> int:
        run, total = self.runs(req, state, alive)
        mean = sum(state.inflight[i] for i in alive) / len(alive)

        def score(i: int) -> float:
            frac = run[i] / total if total else 0.0
            return frac - self.beta * (state.inflight[i] - mean) / max(1.0, mean)
        return min(alive, key=lambda i: (-score(i), i))


class RayPrefixPolicy(_InflightPolicy):
    """Ray's ``PrefixCacheAffinityRouter``: best-matching ranks at a match rate >= 0.1, else the ranks with the
    smallest trees; then the shortest queue. ``imbalance_threshold`` (inf; 10 in older Ray) short-circuits to
    the shortest queue."""

    name = "ray_prefix"

    def __init__(self, *, match_rate_threshold: float = 0.1, imbalance_threshold: float = float("inf")) -> None:
        self.threshold, self.imbalance = match_rate_threshold, imbalance_threshold

    def init(self, dp_size: int, router_index: int = 0, num_routers: int = 1,
             params: dict[str, Any] | None = None) -> PeerState:
        state = super().init(dp_size, router_index, num_routers, params)
        state.tree = RadixTree.empty(dp_size)
        return state

    def choose(self, req: RequestView, snap: Snapshot | None, state: PeerState, alive: list[int],
               now_us: int, rng: random.Random) -> int:
        q = state.inflight
        if max(q[i] for i in alive) - min(q[i] for i in alive) > self.imbalance:
            return min(alive, key=lambda i: (q[i], i))
        assert state.tree is not None
        text = units(req, "chars")
        cands = alive
        if text:
            matched, node = state.tree.match(text)
            owners = [i for i in alive if i in node.owners]
            if matched / len(text) >= self.threshold and owners:
                cands = owners
            else:
                small = min(state.tree.tree_units[i] for i in alive)
                cands = [i for i in alive if state.tree.tree_units[i] == small]
        return min(cands, key=lambda i: (q[i], i))

    def on_dispatch(self, state: PeerState, req: RequestView, decision: Decision, now_us: int) -> None:
        super().on_dispatch(state, req, decision, now_us)
        assert state.tree is not None
        if req.tokens:
            state.tree.insert(units(req, "chars"), decision.dp_rank, now_us)
