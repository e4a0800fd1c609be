"""``llmd_weighted``: the llm-d inference scheduler's weighted scorers (routing-bench §2.8).

Theory of operation. Each live rank gets ``score = Σ w_k·s_k`` with every scorer in [0, 1], higher is better:

- queue: ``1`` if all fresh ranks wait equally, else ``(maxQ - q_i)/(maxQ - minQ)`` over the snapshot's
  ``waiting`` of the fresh ranks;
- kv_util: ``1 - kv_usage``;
- prefix (approximate, the default arm): walk the prompt's first ``max_prefix_blocks`` block hashes (64 chars,
  16 tokens at 4 chars/token; 256 chars with ``@block64``) in order, stop at the first hash no live rank holds,
  and credit each walked hash to every rank holding it; ``match_i / len(H)``. The index is a per-rank LRU of
  ``lru_capacity_per_rank`` blocks (the rank's KV block count with ``auto_tune``), filled at dispatch;
- precise_prefix (``@precise``): the longest run of leading 16-token blocks the rank holds per KV events or as a
  speculative entry written at dispatch (2 s TTL), over the prompt's blocks.

A rank is *stale* when its snapshot sample is older than ``staleness_threshold_ms`` (params, default 2000): it
scores 0 on queue and kv [ours]. With no snapshot at all every rank is stale. The sample time is
``sampled_at_us``, or the snapshot's ``delivered_at_us`` when the producer left it 0. The picker takes the
maximum score, ties uniformly at random (``rng.choice`` over the tied ranks in index order). The optional
``prefix_affinity_filter`` keeps ranks with ``s_prefix >= 0.8`` unless none qualifies or a 1 % draw skips it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from asyncdp.dp.peers.block_index import BlockIndex
from asyncdp.dp.peers.events import KvEvent, KvEventIndex
from asyncdp.dp.peers.hashing import block_hashes, render_text
from asyncdp.dp.policy import ChoosingPolicy, Decision, RequestView, Snapshot

SPECULATIVE_TTL_US = 2_000_000
_EPS = 1e-12


@dataclass(slots=True)
class LlmdState:
    n: int
    index: BlockIndex  # approximate prefix index (characters)
    events: KvEventIndex  # precise: what the engines report
    speculative: BlockIndex  # precise: dispatch-time entries with a TTL
    block_size: int = 16  # engine block size in tokens (precise)
    staleness_us: int = 2_000_000
    snap: Snapshot | None = None
    excluded: set[int] = field(default_factory=set)


class LlmdWeightedPolicy(ChoosingPolicy):
    name = "llmd_weighted"

    def __init__(self, *, queue: float = 2.0, kv_util: float = 2.0, prefix: float = 3.0,
                 precise_prefix: float = 0.0, block_tokens: int = 16, max_prefix_blocks: int = 256,
                 lru_capacity_per_rank: int = 31_250, auto_tune: bool = False,
                 prefix_affinity_filter: bool = False) -> None:
        self.w_queue, self.w_kv, self.w_prefix, self.w_precise = queue, kv_util, prefix, precise_prefix
        self.block_chars = block_tokens * 4
        self.max_prefix_blocks = max_prefix_blocks
        self.capacity = lru_capacity_per_rank
        self.auto_tune = auto_tune
        self.affinity_filter = prefix_affinity_filter

    def init(self, dp_size: int, router_index: int = 0, num_routers: int = 1,
             params: dict[str, Any] | None = None) -> LlmdState:
        p = params or {}
        cap = int(p.get("kv_blocks_per_rank", self.capacity)) if self.auto_tune else self.capacity
        return LlmdState(dp_size, BlockIndex.empty(dp_size, cap), KvEventIndex.empty(dp_size),
                         BlockIndex.empty(dp_size, 1 << 30, SPECULATIVE_TTL_US),
                         int(p.get("block_size_tokens", 16)),
                         int(float(p.get("staleness_threshold_ms", 2000)) * 1000))

    # ------------------------------------------------------------ scorers

    def fresh(self, state: LlmdState, i: int, now_us: int) -> bool:
        snap = state.snap
        if snap is None:
            return False
        t = snap.loads[i].sampled_at_us or snap.delivered_at_us
        return now_us - t <= state.staleness_us

    def scores(self, req: RequestView, state: LlmdState, alive: list[int], now_us: int) -> dict[int, float]:
        score = dict.fromkeys(alive, 0.0)
        fresh = [i for i in alive if self.fresh(state, i, now_us)]
        if fresh and (self.w_queue or self.w_kv):
            assert state.snap is not None
            loads = state.snap.loads
            qs = [loads[i].waiting for i in fresh]
            lo_q, hi_q = min(qs), max(qs)
            for i in fresh:
                sq = 1.0 if hi_q == lo_q else (hi_q - loads[i].waiting) / (hi_q - lo_q)
                score[i] += self.w_queue * sq + self.w_kv * (1.0 - loads[i].kv_usage)
        if self.w_prefix:
            for i, s in self.prefix_scores(req, state, alive).items():
                score[i] += self.w_prefix * s
        if self.w_precise:
            hashes = block_hashes(req.tokens, state.block_size, parent_hash=req.root_hash)
            if hashes:
                for i in alive:
                    run = 0
                    for h in hashes:
                        if h not in state.events.held[i] and not state.speculative.holds(i, h, now_us):
                            break
                        run += 1
                    score[i] += self.w_precise * run / len(hashes)
        return score

    def prompt_hashes(self, req: RequestView) -> list[int]:
        head = req.tokens[:self.max_prefix_blocks * self.block_chars // 4]  # render only what is hashed
        return block_hashes(render_text(head), self.block_chars, self.max_prefix_blocks, req.root_hash)

    def prefix_scores(self, req: RequestView, state: LlmdState, alive: list[int]) -> dict[int, float]:
        hashes = self.prompt_hashes(req)
        match = dict.fromkeys(alive, 0)
        for h in hashes:
            holders = [i for i in alive if state.index.holds(i, h)]
            if not holders:
                break
            for i in holders:
                match[i] += 1
        return {i: (m / len(hashes) if hashes else 0.0) for i, m in match.items()}

    # ------------------------------------------------------------ decision

    def choose(self, req: RequestView, snap: Snapshot | None, state: LlmdState, alive: list[int],
               now_us: int, rng: random.Random) -> int:
        candidates = alive
        if self.affinity_filter:
            sp = self.prefix_scores(req, state, alive)
            sticky = [i for i in alive if sp[i] >= 0.80]
            if sticky and rng.random() >= 0.01:
                candidates = sticky
        score = self.scores(req, state, candidates, now_us)
        best = max(score.values())
        tied = [i for i in candidates if score[i] >= best - _EPS]
        return tied[0] if len(tied) == 1 else rng.choice(tied)

    # ------------------------------------------------------------ hooks

    def on_dispatch(self, state: LlmdState, req: RequestView, decision: Decision, now_us: int) -> None:
        r = decision.dp_rank
        if self.w_prefix:
            state.index.insert(r, self.prompt_hashes(req), now_us)
        if self.w_precise:
            hashes = block_hashes(req.tokens, state.block_size, parent_hash=req.root_hash)
            state.speculative.insert(r, hashes, now_us)

    def on_snapshot(self, state: LlmdState, snap: Snapshot) -> None:
        state.snap = snap

    def on_kv_event(self, state: LlmdState, ev: Any) -> None:
        if isinstance(ev, KvEvent):
            state.events.apply(ev)

    def on_rank_dead(self, state: LlmdState, dp_rank: int) -> None:
        state.excluded.add(dp_rank)
        self.on_cache_reset(state, dp_rank)

    def on_cache_reset(self, state: LlmdState, dp_rank: int) -> None:
        state.index.drop_rank(dp_rank)
        state.speculative.drop_rank(dp_rank)
        state.events.apply(KvEvent(dp_rank, "cleared"))
