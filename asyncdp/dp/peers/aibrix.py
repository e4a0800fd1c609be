"""``aibrix_prefix``: the AIBrix gateway's ``prefix-cache`` policy (routing-bench §2.10).

Theory of operation. ``run`` is this router's in-flight count per rank (the gateway's realtime running count).
If ``max(run) - min(run) > imbalance_abs_count`` over the live ranks, the least-running rank wins (ties
uniformly at random). Otherwise the prompt's text is cut into ``block_chars`` blocks with chained hashes and
``m[i]`` is the percentage of leading blocks rank i's LRU index holds. Ranks with ``m > 0`` are tried in order
of (highest m, lowest run, lowest index); the first whose ``run <= μ + stddev_factor·σ`` (population stats over
the live ranks) wins. Failing that, the least-running rank (random ties). Dispatch inserts the prompt's blocks
for the chosen rank and counts it as running until it finishes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from statistics import fmean, pstdev
from typing import Any

from asyncdp.dp.peers.block_index import BlockIndex
from asyncdp.dp.peers.hashing import block_hashes, render_text
from asyncdp.dp.policy import ChoosingPolicy, Decision, RequestView, Snapshot


@dataclass(slots=True)
class AibrixState:
    n: int
    index: BlockIndex
    run: list[int]
    excluded: set[int] = field(default_factory=set)


class AibrixPrefixPolicy(ChoosingPolicy):
    name = "aibrix_prefix"

    def __init__(self, *, block_chars: int = 128, imbalance_abs_count: int = 16, stddev_factor: float = 2.0,
                 index_blocks_per_rank: int = 200_000) -> None:
        self.block_chars = block_chars
        self.abs_count = imbalance_abs_count
        self.factor = stddev_factor
        self.capacity = index_blocks_per_rank

    def init(self, dp_size: int, router_index: int = 0, num_routers: int = 1,
             params: dict[str, Any] | None = None) -> AibrixState:
        return AibrixState(dp_size, BlockIndex.empty(dp_size, self.capacity), [0] * dp_size)

    def match_percent(self, req: RequestView, state: AibrixState, alive: list[int]) -> dict[int, float]:
        hashes = block_hashes(render_text(req.tokens), self.block_chars, parent_hash=req.root_hash)
        if not hashes:
            return dict.fromkeys(alive, 0.0)
        return {i: 100.0 * state.index.prefix_run(i, hashes) / len(hashes) for i in alive}

    def choose(self, req: RequestView, snap: Snapshot | None, state: AibrixState, alive: list[int],
               now_us: int, rng: random.Random) -> int:
        run = state.run
        if max(run[i] for i in alive) - min(run[i] for i in alive) > self.abs_count:
            return self._least_running(state, alive, rng)
        m = self.match_percent(req, state, alive)
        loads = [run[i] for i in alive]
        limit = fmean(loads) + self.factor * pstdev(loads)
        for i in sorted((i for i in alive if m[i] > 0), key=lambda i: (-m[i], run[i], i)):
            if run[i] <= limit:
                return i
        return self._least_running(state, alive, rng)

    @staticmethod
    def _least_running(state: AibrixState, alive: list[int], rng: random.Random) -> int:
        low = min(state.run[i] for i in alive)
        tied = [i for i in alive if state.run[i] == low]
        return tied[0] if len(tied) == 1 else rng.choice(tied)

    def on_dispatch(self, state: AibrixState, req: RequestView, decision: Decision, now_us: int) -> None:
        hashes = block_hashes(render_text(req.tokens), self.block_chars, parent_hash=req.root_hash)
        state.index.insert(decision.dp_rank, hashes, now_us)
        state.run[decision.dp_rank] += 1

    def on_finish(self, state: AibrixState, req_id: str, dp_rank: int, now_us: int) -> None:
        state.run[dp_rank] = max(0, state.run[dp_rank] - 1)

    def on_rank_dead(self, state: AibrixState, dp_rank: int) -> None:
        state.excluded.add(dp_rank)
        self.on_cache_reset(state, dp_rank)

    def on_cache_reset(self, state: AibrixState, dp_rank: int) -> None:
        state.index.drop_rank(dp_rank)
