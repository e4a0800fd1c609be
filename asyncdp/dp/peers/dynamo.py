"""``dynamo_kv``: NVIDIA Dynamo's KV router (routing-bench §2.9).

Theory of operation. Per rank the router predicts load from what it dispatched: ``pending_prefill`` tokens
(each request's uncached prompt, cleared at its first token) and ``active`` blocks, the prompt block hashes
of its unfinished requests, reference counted so a prefix shared by several requests counts once, plus
``output_blocks`` (one per ``block_size`` generated tokens, needs ``on_tokens``). The overlap ``ov[i]`` is the
number of leading prompt blocks rank i caches: from KV events by default, from the router's own dispatches in a
120 s TTL index with ``@approx``. Costs, for the block size ``bs`` (params ``block_size_tokens``, default 16):

- default (2025): ``prefill = pending[i]·[count_pending_prefill] + prompt_len - ov·bs``,
  ``decode = |active ∪ prompt_blocks| + output_blocks``, ``cost = w·prefill/bs + decode``;
- ``@2026`` / ``@credit1.5``: ``cost = scale·max(0, prompt_len/bs - credit·ov) + pending/bs + decode``
  [ours: the credit applies to the request's own blocks; the router's earlier pending prefill is added
  outside the max];
- ``@early2025``: ``logit = 2·ov/len(blocks) - kv_usage - waiting_i/max(1, max_j waiting_j)`` with a local
  ``waiting`` copy (replaced by each snapshot, +1 per dispatch, -1 at finish [ours]), argmax with random ties.

With ``temperature == 0`` the lowest cost wins; ties go to the rank with fewer indexed blocks, then uniformly at
random. With ``temperature > 0`` rank i is drawn with ``p ∝ exp(-((cost_i - min)/(max - min))/T)`` (uniform
when all costs are equal). ``busy_threshold`` drops ranks whose snapshot ``kv_usage`` is above it (all of them
kept when every rank is busy [ours]).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from asyncdp.dp.peers.block_index import BlockIndex
from asyncdp.dp.peers.events import KvEvent, KvEventIndex
from asyncdp.dp.peers.hashing import block_hashes
from asyncdp.dp.policy import ChoosingPolicy, Decision, RequestView, Snapshot
from asyncdp.errors import ConfigError

APPROX_TTL_US = 120_000_000
APPROX_MAX_BLOCKS = 2 ** 20
FORMULAS = ("2025", "2026", "early2025")
_EPS = 1e-9


@dataclass(slots=True)
class InFlight:
    rank: int
    prefill_tokens: int
    blocks: tuple[int, ...]
    out_tokens: int = 0
    first_token: bool = False


@dataclass(slots=True)
class DynamoState:
    n: int
    block_size: int
    events: KvEventIndex
    approx: BlockIndex
    pending: list[int]
    active: list[Counter[int]]
    output_blocks: list[int]
    waiting: list[int]
    kv: list[float]
    reqs: dict[str, InFlight] = field(default_factory=dict)
    excluded: set[int] = field(default_factory=set)


class DynamoKvPolicy(ChoosingPolicy):
    name = "dynamo_kv"
    needs_tokens = True

    def __init__(self, *, overlap_score_weight: float = 1.0, temperature: float = 0.0,
                 count_pending_prefill: bool = True, track_output_blocks: bool = True,
                 busy_threshold: float | None = None, approx: bool = False, formula: str = "2025",
                 credit: float = 1.0, prefill_load_scale: float = 1.0) -> None:
        if formula not in FORMULAS:
            raise ConfigError(f"dynamo_kv formula must be one of {', '.join(FORMULAS)} (got {formula!r}).")
        if temperature < 0:
            raise ConfigError(f"dynamo_kv temperature must be >= 0 (got {temperature}).")
        self.w = overlap_score_weight
        self.temperature = temperature
        self.count_pending = count_pending_prefill
        self.track_output = track_output_blocks
        self.busy_threshold = busy_threshold
        self.approx = approx
        self.formula = formula
        self.credit = credit
        self.scale = prefill_load_scale

    def init(self, dp_size: int, router_index: int = 0, num_routers: int = 1,
             params: dict[str, Any] | None = None) -> DynamoState:
        bs = int((params or {}).get("block_size_tokens", 16))
        return DynamoState(dp_size, bs, KvEventIndex.empty(dp_size),
                           BlockIndex.empty(dp_size, APPROX_MAX_BLOCKS, APPROX_TTL_US),
                           [0] * dp_size, [Counter() for _ in range(dp_size)], [0] * dp_size,
                           [0] * dp_size, [0.0] * dp_size)

    # ------------------------------------------------------------ cost

    def overlap(self, state: DynamoState, i: int, blocks: list[int], now_us: int) -> int:
        if self.approx:
            return state.approx.prefix_run(i, blocks, now_us)
        return state.events.overlap(i, blocks)

    def indexed_blocks(self, state: DynamoState, i: int) -> int:
        return state.approx.size(i) if self.approx else state.events.size(i)

    def costs(self, req: RequestView, state: DynamoState, cands: list[int], now_us: int) -> dict[int, float]:
        """Lower is better (``@early2025``'s logit is negated so the same picker applies)."""
        bs = state.block_size
        blocks = block_hashes(req.tokens, bs, parent_hash=req.root_hash)
        unique = set(blocks)
        out: dict[int, float] = {}
        top_wait = max(1, max(state.waiting[i] for i in cands))
        for i in cands:
            ov = self.overlap(state, i, blocks, now_us)
            if self.formula == "early2025":
                frac = ov / len(blocks) if blocks else 0.0
                out[i] = -(2 * frac - state.kv[i] - state.waiting[i] / top_wait)
                continue
            act = state.active[i]
            decode = len(act) + len(unique.difference(act)) + state.output_blocks[i]
            pending = state.pending[i] if self.count_pending else 0
            if self.formula == "2026":
                own = max(0.0, req.prompt_len / bs - self.credit * ov)
                out[i] = self.scale * own + pending / bs + decode
            else:
                out[i] = self.w * (pending + req.prompt_len - ov * bs) / bs + decode
        return out

    # ------------------------------------------------------------ decision

    def choose(self, req: RequestView, snap: Snapshot | None, state: DynamoState, alive: list[int],
               now_us: int, rng: random.Random) -> int:
        cands = alive
        if self.busy_threshold is not None:
            free = [i for i in cands if state.kv[i] <= self.busy_threshold]
            cands = free or cands
        cost = self.costs(req, state, cands, now_us)
        if self.temperature > 0:
            return self._sample(cost, cands, rng)
        best = min(cost.values())
        tied = [i for i in cands if cost[i] <= best + _EPS]
        if len(tied) > 1 and self.formula != "early2025":
            fewest = min(self.indexed_blocks(state, i) for i in tied)
            tied = [i for i in tied if self.indexed_blocks(state, i) == fewest]
        return tied[0] if len(tied) == 1 else rng.choice(tied)

    def _sample(self, cost: dict[int, float], cands: list[int], rng: random.Random) -> int:
        lo, hi = min(cost.values()), max(cost.values())
        if hi - lo <= _EPS:
            return rng.choice(cands)
        weights = [math.exp(-((cost[i] - lo) / (hi - lo)) / self.temperature) for i in cands]
        return rng.choices(cands, weights=weights, k=1)[0]

    # ------------------------------------------------------------ hooks

    def on_dispatch(self, state: DynamoState, req: RequestView, decision: Decision, now_us: int) -> None:
        r = decision.dp_rank
        blocks = block_hashes(req.tokens, state.block_size, parent_hash=req.root_hash)
        ov = self.overlap(state, r, blocks, now_us)
        fresh = tuple(blocks[ov:]) if self.formula == "early2025" else tuple(blocks)
        prefill = max(0, req.prompt_len - ov * state.block_size)
        state.reqs[req.req_id] = InFlight(r, prefill, fresh)
        state.pending[r] += prefill
        state.active[r].update(fresh)
        state.waiting[r] += 1
        if self.approx:
            state.approx.insert(r, blocks, now_us)

    def on_first_token(self, state: DynamoState, req_id: str, dp_rank: int, now_us: int) -> None:
        f = state.reqs.get(req_id)
        if f is not None and not f.first_token:
            f.first_token = True
            state.pending[f.rank] -= f.prefill_tokens

    def on_tokens(self, state: DynamoState, req_id: str, dp_rank: int, n_new: int, now_us: int) -> None:
        f = state.reqs.get(req_id)
        if f is None or not self.track_output:
            return
        before = f.out_tokens // state.block_size
        f.out_tokens += n_new
        state.output_blocks[f.rank] += f.out_tokens // state.block_size - before

    def on_finish(self, state: DynamoState, req_id: str, dp_rank: int, now_us: int) -> None:
        f = state.reqs.pop(req_id, None)
        if f is None:
            return
        if not f.first_token:
            state.pending[f.rank] -= f.prefill_tokens
        state.active[f.rank].subtract(f.blocks)
        state.active[f.rank] = +state.active[f.rank]  # drop zero counts
        state.output_blocks[f.rank] -= f.out_tokens // state.block_size
        state.waiting[f.rank] = max(0, state.waiting[f.rank] - 1)

    def on_snapshot(self, state: DynamoState, snap: Snapshot) -> None:
        state.kv = [x.kv_usage for x in snap.loads]
        state.waiting = [x.waiting for x in snap.loads]

    def on_kv_event(self, state: DynamoState, ev: Any) -> None:
        if isinstance(ev, KvEvent):
            state.events.apply(ev)

    def on_rank_dead(self, state: DynamoState, dp_rank: int) -> None:
        state.excluded.add(dp_rank)

    def on_cache_reset(self, state: DynamoState, dp_rank: int) -> None:
        state.approx.drop_rank(dp_rank)
        state.events.apply(KvEvent(dp_rank, "cleared"))
