"""``sglang_cache_aware``: SGLang's / SMG's cache-aware router (routing-bench §2.7).

Theory of operation. The router keeps a radix tree of the prompts it sent (:mod:`~asyncdp.dp.peers.radix`, in
characters by default), its own in-flight count per rank (``load``) and a processed count. A decision is:

1. ``lo = argmin (load, processed, i)``; if the loads are imbalanced (``max - load[lo] > abs_thr`` and
   ``max > rel_thr * load[lo]``, or a KV trigger fires when those are on), go to ``lo``;
2. otherwise match the prompt in the tree; above ``cache_threshold`` of its units, go to the owner of the node
   reached (the most recent one, the lowest rank on a tie [ours]);
3. otherwise the miss policy: ``lo`` (HEAD), or the rank with the smallest tree (``miss_policy=smallest_tree``,
   the legacy rule that causes the miss death-spiral of sgl-project/sglang#14305).

Every dispatch inserts the prompt for the chosen rank, whichever branch chose it. The eviction timer trims each
owner to ``max_tree_size`` units. ``load_guard_at`` says when a request starts counting in ``load``:
``dispatch`` (HEAD), ``first_token`` (before sgl-project/sglang#27547) or ``never`` (the gRPC path before
sgl-project/sglang#15473). Those two knobs reproduce pre-fix code, which also broke load ties by index rather
than by the processed count (smg-project/smg#1714), so they imply ``processed_tiebreak=False`` unless it is
given [ours]. ``events=True`` (``@events``) reads exact 16-token-block overlap from KV events and picks the max
of (overlap, -load, -cached blocks), the lowest rank on a full tie, ``lo`` without any overlap; the imbalance
guard still applies first [ours: the spec leaves its order open].
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from asyncdp.dp.peers.events import KvEvent, KvEventIndex
from asyncdp.dp.peers.hashing import block_hashes, units
from asyncdp.dp.peers.radix import RadixTree
from asyncdp.dp.policy import ChoosingPolicy, Decision, RequestView, Snapshot
from asyncdp.errors import ConfigError

GUARDS = ("dispatch", "first_token", "never")
MISS_POLICIES = ("min_load", "smallest_tree")


@dataclass(slots=True)
class SglangState:
    n: int
    tree: RadixTree
    load: list[int]
    processed: list[int]
    events: KvEventIndex
    block_size: int = 16
    rank_of: dict[str, int] = field(default_factory=dict)  # in-flight request -> rank
    counted: set[str] = field(default_factory=set)  # requests currently counted in load
    kv: list[float] | None = None
    excluded: set[int] = field(default_factory=set)


class SglangCacheAwarePolicy(ChoosingPolicy):
    name = "sglang_cache_aware"

    def __init__(self, *, cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                 balance_rel_threshold: float = 1.5, eviction_interval_s: float = 60.0,
                 max_tree_size: int = 2 ** 26, tree_unit: str = "chars", miss_policy: str = "min_load",
                 overload_token_usage_threshold: float = 1.0, balance_token_usage_threshold: float = 1.0,
                 load_guard_at: str = "dispatch", processed_tiebreak: bool | None = None,
                 events: bool = False) -> None:
        if load_guard_at not in GUARDS:
            raise ConfigError(f"load_guard_at must be one of {', '.join(GUARDS)} (got {load_guard_at!r}).")
        if miss_policy not in MISS_POLICIES:
            raise ConfigError(f"miss_policy must be one of {', '.join(MISS_POLICIES)} (got {miss_policy!r}).")
        self.cache_threshold = cache_threshold
        self.abs_thr = balance_abs_threshold
        self.rel_thr = balance_rel_threshold
        self.max_tree_size = max_tree_size
        self.tree_unit = tree_unit
        self.miss_policy = miss_policy
        self.overload_thr = overload_token_usage_threshold
        self.spread_thr = balance_token_usage_threshold
        self.kv_triggers = overload_token_usage_threshold < 1.0 or balance_token_usage_threshold < 1.0
        self.load_guard_at = load_guard_at
        self.processed_tiebreak = (load_guard_at == "dispatch") if processed_tiebreak is None \
            else processed_tiebreak
        self.events = events
        self.timer_period_us = int(eviction_interval_s * 1e6)

    def init(self, dp_size: int, router_index: int = 0, num_routers: int = 1,
             params: dict[str, Any] | None = None) -> SglangState:
        bs = int((params or {}).get("block_size_tokens", 16))
        return SglangState(dp_size, RadixTree.empty(dp_size), [0] * dp_size, [0] * dp_size,
                           KvEventIndex.empty(dp_size), bs)

    # ------------------------------------------------------------ decision

    def lowest_load(self, state: SglangState, alive: list[int]) -> int:
        if self.processed_tiebreak:
            return min(alive, key=lambda i: (state.load[i], state.processed[i], i))
        return min(alive, key=lambda i: (state.load[i], i))

    def imbalanced(self, state: SglangState, alive: list[int], lo: int) -> bool:
        top = max(state.load[i] for i in alive)
        imb = top - state.load[lo] > self.abs_thr and top > self.rel_thr * state.load[lo]
        if self.kv_triggers and state.kv is not None:
            kv = [state.kv[i] for i in alive]
            imb = imb or max(kv) > self.overload_thr or max(kv) - min(kv) > self.spread_thr
        return imb

    def choose(self, req: RequestView, snap: Snapshot | None, state: SglangState, alive: list[int],
               now_us: int, rng: random.Random) -> int:
        lo = self.lowest_load(state, alive)
        if self.imbalanced(state, alive, lo):
            return lo
        if self.events:
            return self._events_pick(req, state, alive, lo)
        seq = units(req, self.tree_unit)
        if seq:
            matched, node = state.tree.match(seq)
            if matched / len(seq) > self.cache_threshold:
                owner = state.tree.recent_owner(node, state.excluded)
                if owner is not None:
                    return owner
        if self.miss_policy == "smallest_tree":
            return min(alive, key=lambda i: (state.tree.tree_units[i], i))
        return lo

    def _events_pick(self, req: RequestView, state: SglangState, alive: list[int], lo: int) -> int:
        hashes = block_hashes(req.tokens, state.block_size, parent_hash=req.root_hash)
        ov = {i: state.events.overlap(i, hashes) for i in alive}
        if not any(ov.values()):
            return lo
        return max(alive, key=lambda i: (ov[i], -state.load[i], -state.events.size(i), -i))

    # ------------------------------------------------------------ hooks

    def on_dispatch(self, state: SglangState, req: RequestView, decision: Decision, now_us: int) -> None:
        r = decision.dp_rank
        seq = units(req, self.tree_unit)
        if seq:
            state.tree.insert(seq, r, now_us)
        state.processed[r] += 1
        state.rank_of[req.req_id] = r
        if self.load_guard_at == "dispatch":
            state.load[r] += 1
            state.counted.add(req.req_id)

    def on_first_token(self, state: SglangState, req_id: str, dp_rank: int, now_us: int) -> None:
        if self.load_guard_at == "first_token" and req_id in state.rank_of and req_id not in state.counted:
            state.load[dp_rank] += 1
            state.counted.add(req_id)

    def on_finish(self, state: SglangState, req_id: str, dp_rank: int, now_us: int) -> None:
        state.rank_of.pop(req_id, None)
        if req_id in state.counted:
            state.counted.discard(req_id)
            state.load[dp_rank] = max(0, state.load[dp_rank] - 1)

    def on_snapshot(self, state: SglangState, snap: Snapshot) -> None:
        if self.kv_triggers:
            state.kv = [x.kv_usage for x in snap.loads]

    def on_kv_event(self, state: SglangState, ev: Any) -> None:
        if isinstance(ev, KvEvent):
            state.events.apply(ev)

    def on_timer(self, state: SglangState, now_us: int) -> None:
        state.tree.evict(self.max_tree_size)

    def on_rank_dead(self, state: SglangState, dp_rank: int) -> None:
        state.excluded.add(dp_rank)
        self.on_cache_reset(state, dp_rank)

    def on_cache_reset(self, state: SglangState, dp_rank: int) -> None:
        state.tree.remove_owner(dp_rank)
        state.events.apply(KvEvent(dp_rank, "cleared"))
