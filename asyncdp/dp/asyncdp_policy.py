"""``asyncdp``: asyncdp's own routing policy (routing-bench §3, hints H1-H8), a pure policy of :mod:`.policy`.

Theory of operation
-------------------
One cost per rank, in prefill-token units (H1)::

    cost[i] = base[i] + prompt_len - CREDIT_WEIGHT·credit[i]
    base[i] = pending[i] + DECODE_TOKENS·decoding[i] + memory[i] + w·(others[i] + kv_penalty[i])

- ``pending[i]``: the uncached prompt tokens this router sent to rank i that have not produced their first
  token (each request's ``prompt_len - predicted hit``, added at dispatch, removed at its first token or
  finish); ``decoding[i]``: this router's requests on rank i past their first token. Both are exact local
  counters, so a snapshot never overwrites them (H4: the 6/4 tie bias of vLLM came from overwriting bumps).
- ``others[i]``: the work of *other* routers (and of hinted clients) that the snapshot shows and this router
  did not send: ``max(0, waiting - my pending requests)·avg_prefill + max(0, running - my decoding)·
  DECODE_TOKENS``, from the last snapshot, reconciled against this router's own counts at delivery. ``w``
  decays linearly with the snapshot's age, to 0 at ``staleness_ms`` (H5): stale telemetry falls back on local
  counters, and a missing report never reads as "idle" because local counters stay.
- ``kv_penalty[i]``: ``KV_PENALTY_TOKENS·(kv_usage - 0.9)/0.1`` (weighted by ``w``) when a rank's referenced
  KV is above 90 %: a new request there waits for memory or triggers preemption.
- ``memory[i]``: ``MEMORY_TOKENS·(index blocks of rank i)/kv_blocks_per_rank``: a soft preference for the rank
  with the emptier cache, so new prefixes spread by memory (H8) and a rank's working set is not evicted by
  prefixes that fit elsewhere; small next to a real load difference, so a miss still goes to the cheapest rank
  (H2).
- ``credit[i]``: the predicted prefix-cache hit, from the router's own history (H8): an approximate index of
  the block hashes it sent to each rank (the engine's chained 16-token block hash), each rank's set bounded by
  ``kv_blocks_per_rank`` in an LRU whose roots are refreshed last (so, as in the engine, tails are evicted
  first and every rank's set stays prefix-closed). Capped at ``prompt_len - 1`` (the last token is computed),
  and counted ``CREDIT_WEIGHT`` (2) times: a hit saves work for the whole cluster and keeps the prefix warm for the
  requests after it, not only this request's TTFT.

Hot-spot bound (H3): a rank's credit counts only while its estimated in-flight count (mine + others) is at most
``max(HOT_RATIO·mean, mean + HOT_SLACK)``; past it the request is priced as a miss there, so a prefix hotter than
one rank can serve is replicated on the cheapest other rank instead of queueing. Misses go to the cheapest rank
by load (H2), never to "the smallest tree".

Ties (H6, H7): among equal costs the deeper match wins, then the first rank in a scan that starts at a stable
hash of the request's key (its ``routing_key``, else its 4th block hash, else its tokens) — the same key lands
on the same rank (affinity across turns and across routers), different keys spread over tied ranks, so R
routers deciding from one snapshot do not herd onto one rank.

Decision cost (G7). ``base`` is kept current by the hooks (one rank changes per dispatch, first token or
finish; all of them on a snapshot, or when the decay weight is 50 ms old), and so is the sum of the in-flight
estimates the hot-spot bound needs, so ``select`` is one C-level ``min``/``index``/``count`` over ``base`` (the
tie scan runs only on a tie), then the deepest run of the prompt's blocks any rank holds (two lookups when it is
the run the last prompt with the same first block matched, else a binary search), then the holders of the first
block: those holding the whole run first (their credit is known), then the others, pruned by the best credit
they could still have. The prompt's block hashes are computed once (memoised for ``on_dispatch``).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncdp.dp.peers.hashing import block_hashes, stable_hash64
from asyncdp.dp.policy import Decision, Policy, RequestView, Snapshot
from asyncdp.errors import ConfigError, UnavailableError

DECODE_TOKENS = 16.0  # [ours] a decoding request's weight, in prefill tokens
KV_HIGH = 0.9
KV_PENALTY_TOKENS = 4096.0
CREDIT_WEIGHT = 2.0  # [ours] a hit saves cluster work and keeps the cache warm: worth twice its tokens
MEMORY_TOKENS = 4096.0  # [ours] a full index costs this much: new prefixes go where memory is free (H8)
HOT_RATIO = 2.0
HOT_SLACK = 8.0
STALENESS_MS = 2000.0
REFRESH_US = 50_000
DEFAULT_BLOCK = 16
DEFAULT_INDEX_BLOCKS = 28_000  # the gpu_8b profile's KV blocks per rank; params override it
TIE_KEY_BLOCK = 4
_INF = float("inf")


@dataclass(slots=True)
class _Req:
    rank: int
    prefill: int  # tokens counted in pending[rank] until the first token
    decoding: bool = False


@dataclass(slots=True)
class AsyncdpState:
    n: int
    num_routers: int
    block_size: int
    capacity: int
    stale_us: float
    base: list[float]
    pending: list[int]
    pending_reqs: list[int]
    decoding: list[int]
    others_tok: list[float]
    others_cnt: list[int]
    kv: list[float]
    load: list[float]  # estimated in-flight requests (mine + others, weighted), for the hot-spot bound
    load_total: float = 0.0  # sum(load), kept by _update (recomputed on every snapshot: no drift)
    owners: dict[int, int] = field(default_factory=dict)  # block hash -> bitmask of ranks holding it
    # first block hash -> the deepest run any rank held when a prompt starting with it was last scored: a
    # guess, checked with two lookups before use (prompts that share a first block usually share the run)
    depth_memo: dict[int, int] = field(default_factory=dict)
    lru: list[OrderedDict[int, None]] = field(default_factory=list)
    decisions: tuple[Decision, ...] = ()
    reqs: dict[str, _Req] = field(default_factory=dict)
    excluded: set[int] = field(default_factory=set)
    weight: float = 0.0  # the snapshot terms' weight (decays with age)
    snap_at_us: int | None = None
    clock_us: int = 0  # the latest time any hook saw (snapshots carry none in production)
    refreshed_at_us: int = 0
    avg_prefill: float = 0.0  # EMA of the uncached tokens per request this router sent


class AsyncdpPolicy(Policy):
    """asyncdp's own policy: one token cost, prefix- and KV-aware, hot-spot bounded (module docstring)."""

    name = "asyncdp"

    def __init__(self, *, decode_tokens: float = DECODE_TOKENS, hot_ratio: float = HOT_RATIO,
                 hot_slack: float = HOT_SLACK, kv_penalty_tokens: float = KV_PENALTY_TOKENS,
                 credit_weight: float = CREDIT_WEIGHT, memory_tokens: float = MEMORY_TOKENS,
                 prefix: bool = True) -> None:
        if hot_ratio < 1 or hot_slack < 0 or decode_tokens < 0:
            raise ConfigError("asyncdp policy: hot_ratio must be >= 1, hot_slack and decode_tokens >= 0.")
        self.decode_tokens = decode_tokens
        self.hot_ratio = hot_ratio
        self.hot_slack = hot_slack
        self.kv_penalty = kv_penalty_tokens
        self.credit_weight = credit_weight
        self.memory_tokens = memory_tokens
        self.prefix = prefix

    def init(self, dp_size: int, router_index: int = 0, num_routers: int = 1,
             params: dict[str, Any] | None = None) -> AsyncdpState:
        if dp_size < 1 or not 0 <= router_index < num_routers:
            raise ConfigError(f"bad router layout: dp_size={dp_size}, router {router_index} of {num_routers}")
        p = params or {}
        n = dp_size
        return AsyncdpState(
            n, num_routers, int(p.get("block_size_tokens", DEFAULT_BLOCK)),
            int(p.get("kv_blocks_per_rank", DEFAULT_INDEX_BLOCKS)),
            float(p.get("staleness_threshold_ms", STALENESS_MS)) * 1000.0,
            [0.0] * n, [0] * n, [0] * n, [0] * n, [0.0] * n, [0] * n, [0.0] * n, [0.0] * n,
            lru=[OrderedDict() for _ in range(n)], decisions=tuple(Decision(i) for i in range(n)))

    # ------------------------------------------------------------ the index

    @staticmethod
    def match(state: AsyncdpState, rank: int, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` rank holds (binary search: every rank's set is prefix-closed)."""
        owners, bit = state.owners, 1 << rank
        if not owners.get(hashes[0], 0) & bit:
            return 0
        lo, hi = 1, len(hashes)  # hashes[:lo] held; hashes[hi:] not known held
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if owners.get(hashes[mid - 1], 0) & bit:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _insert(self, state: AsyncdpState, rank: int, hashes: Sequence[int]) -> None:
        lru, owners, bit = state.lru[rank], state.owners, 1 << rank
        for h in reversed(hashes):  # the root last: most recent, so evicted last
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                owners[h] = owners.get(h, 0) | bit
        while len(lru) > state.capacity:
            h, _ = lru.popitem(last=False)
            left = owners.get(h, 0) & ~bit
            if left:
                owners[h] = left
            else:
                owners.pop(h, None)
                state.depth_memo.pop(h, None)  # the memo stays bounded by the index

    # ------------------------------------------------------------ decision

    def select(self, req: RequestView, snap: Snapshot | None, state: AsyncdpState, now_us: int,
               rng: random.Random) -> Decision:
        if req.rank_hint is not None:  # a hinted request bypasses the policy (hinted_decision, inlined)
            return Decision(req.rank_hint, hinted=True)
        base, n = state.base, state.n
        if state.snap_at_us is not None and now_us - state.refreshed_at_us >= REFRESH_US:
            weight = _weight(state, now_us)
            if weight != state.weight:  # no hook ran for a while: decay the snapshot terms here (H5)
                base = [self._base(state, i, weight) for i in range(n)]
        best = min(base)
        if best == _INF:
            raise UnavailableError("no data-parallel rank is alive")
        hashes = prompt_hashes(req, state.block_size) if self.prefix else ()
        start = -1  # the tie scan's first rank, computed only when a tie needs it
        pick = base.index(best)
        if base.count(best) > 1:  # a tie: the first minimum at or after a stable hash of the key (H6)
            start = _tie_key(req, hashes) % n
            if pick < start:
                tail = base[start:]
                if best in tail:
                    pick = start + tail.index(best)
        decisions = state.decisions  # one immutable Decision per rank, made once
        if not hashes:
            return decisions[pick]
        get = state.owners.get
        held = get(hashes[0], 0)
        if not held:
            return decisions[pick]
        plen, bs, weight = len(req.tokens), state.block_size, self.credit_weight
        # The deepest block any rank holds bounds every credit: ranks that cannot win even with it are skipped.
        nh = len(hashes)
        lo = state.depth_memo.get(hashes[0], 0)  # the run the last prompt with this first block matched
        if not (0 < lo <= nh and get(hashes[lo - 1], 0) and (lo == nh or not get(hashes[lo], 0))):
            lo, hi = 1, nh  # not the same depth: a binary search (the union of prefix-closed sets is one)
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if get(hashes[mid - 1], 0):
                    lo = mid
                else:
                    hi = mid - 1
            state.depth_memo[hashes[0]] = lo
        top_credit = lo * bs if lo * bs < plen else plen - 1
        bound = weight * top_credit - plen  # a holder with base - bound above the pick's cost cannot win
        deepest = get(hashes[lo - 1], 0)  # these ranks hold the whole matched run: credit top_credit
        pick_cost, pick_credit = best + plen, 0
        cap = -1.0
        load = state.load
        # The ranks holding the whole run first: they need no search of their own and usually win, so the
        # pruning above skips most of the others (the winner is the minimum whatever the order).
        rest = held & ~deepest
        held &= deepest
        while held or rest:
            if not held:  # the others lack block lo: their credit is at most lo - 1 blocks
                held, rest = rest, 0
                bound = weight * min((lo - 1) * bs, plen - 1) - plen
            low = held & -held
            held ^= low
            r = low.bit_length() - 1
            b = base[r]
            if b - bound > pick_cost:
                continue  # cannot win even with the deepest credit
            if cap < 0:  # the hot-spot bound on a rank's estimated in-flight requests (H3), once
                mean = state.load_total / (n - len(state.excluded) or 1)
                cap = max(self.hot_ratio * mean, mean + self.hot_slack)
            if load[r] > cap:
                continue
            if deepest & low:
                credit = top_credit
            else:  # this rank's own match: a binary search below the deepest run (its set is prefix-closed)
                lo2, hi2 = 1, lo
                while lo2 < hi2:
                    mid = (lo2 + hi2 + 1) >> 1
                    if get(hashes[mid - 1], 0) & low:
                        lo2 = mid
                    else:
                        hi2 = mid - 1
                credit = lo2 * bs if lo2 * bs < plen else plen - 1
            cost = b + plen - weight * credit
            if cost > pick_cost or (cost == pick_cost and credit < pick_credit):
                continue
            if cost == pick_cost and credit == pick_credit:  # a full tie: the scan order from the key decides
                if start < 0:
                    start = _tie_key(req, hashes) % n
                if (r - start) % n >= (pick - start) % n:
                    continue
            pick, pick_cost, pick_credit = r, cost, credit
        return decisions[pick]

    # ------------------------------------------------------------ hooks

    def _base(self, state: AsyncdpState, i: int, weight: float) -> float:
        if i in state.excluded:
            return _INF
        kv_pen = 0.0
        kv = state.kv[i]
        if kv > KV_HIGH:
            kv_pen = self.kv_penalty * (kv - KV_HIGH) / (1.0 - KV_HIGH)
        memory = self.memory_tokens * len(state.lru[i]) / state.capacity if self.memory_tokens else 0.0
        return (state.pending[i] + self.decode_tokens * state.decoding[i] + memory
                + weight * (state.others_tok[i] + kv_pen))

    def _update(self, state: AsyncdpState, i: int) -> None:
        state.base[i] = self._base(state, i, state.weight)
        load = 0.0 if i in state.excluded else (
            state.pending_reqs[i] + state.decoding[i] + state.weight * state.others_cnt[i])
        state.load_total += load - state.load[i]
        state.load[i] = load

    def _tick(self, state: AsyncdpState, now_us: int) -> None:
        """Advance the clock; every REFRESH_US re-weigh the snapshot terms by their age (H5)."""
        if now_us > state.clock_us:
            state.clock_us = now_us
        if state.snap_at_us is None or now_us - state.refreshed_at_us < REFRESH_US:
            return
        state.refreshed_at_us = now_us
        weight = _weight(state, now_us)
        if weight != state.weight:
            state.weight = weight
            for i in range(state.n):
                self._update(state, i)

    def on_dispatch(self, state: AsyncdpState, req: RequestView, decision: Decision, now_us: int) -> None:
        self._tick(state, now_us)
        r = decision.dp_rank
        hashes = prompt_hashes(req, state.block_size) if self.prefix else ()
        credit = 0
        if hashes:
            credit = min(self.match(state, r, hashes) * state.block_size, req.prompt_len - 1)
            self._insert(state, r, hashes)
        prefill = max(0, req.prompt_len - credit)
        state.avg_prefill += (prefill - state.avg_prefill) / 16.0
        old = state.reqs.get(req.req_id)
        if old is not None:  # a reused id: forget the old one first
            self.on_finish(state, req.req_id, old.rank, now_us)
        state.reqs[req.req_id] = _Req(r, prefill)
        state.pending[r] += prefill
        state.pending_reqs[r] += 1
        self._update(state, r)

    def on_first_token(self, state: AsyncdpState, req_id: str, dp_rank: int, now_us: int) -> None:
        self._tick(state, now_us)
        f = state.reqs.get(req_id)
        if f is None or f.decoding:
            return
        f.decoding = True
        state.pending[f.rank] -= f.prefill
        state.pending_reqs[f.rank] -= 1
        state.decoding[f.rank] += 1
        self._update(state, f.rank)

    def on_finish(self, state: AsyncdpState, req_id: str, dp_rank: int, now_us: int) -> None:
        self._tick(state, now_us)
        f = state.reqs.pop(req_id, None)
        if f is None:
            return
        if f.decoding:
            state.decoding[f.rank] -= 1
        else:
            state.pending[f.rank] -= f.prefill
            state.pending_reqs[f.rank] -= 1
        self._update(state, f.rank)

    def on_snapshot(self, state: AsyncdpState, snap: Snapshot) -> None:
        if len(snap.loads) != state.n:
            raise ValueError(f"snapshot has {len(snap.loads)} ranks, expected {state.n}")
        for i, x in enumerate(snap.loads):
            ow = max(0, x.waiting - state.pending_reqs[i])
            orun = max(0, x.running - state.decoding[i])
            state.others_cnt[i] = ow + orun
            state.others_tok[i] = ow * state.avg_prefill + orun * self.decode_tokens
            state.kv[i] = x.kv_usage
        at = snap.delivered_at_us or state.clock_us
        state.snap_at_us = at
        state.refreshed_at_us = at
        state.weight = 1.0
        for i in range(state.n):
            self._update(state, i)
        state.load_total = sum(state.load)  # the running sum's rounding does not outlive a snapshot

    def on_rank_dead(self, state: AsyncdpState, dp_rank: int) -> None:
        state.excluded.add(dp_rank)
        state.base[dp_rank] = _INF
        state.load_total -= state.load[dp_rank]
        state.load[dp_rank] = 0.0
        lru, bit = state.lru[dp_rank], 1 << dp_rank
        for h in lru:
            left = state.owners.get(h, 0) & ~bit
            if left:
                state.owners[h] = left
            else:
                state.owners.pop(h, None)
                state.depth_memo.pop(h, None)
        lru.clear()


def _weight(state: AsyncdpState, now_us: int) -> float:
    """The snapshot terms' weight: 1 when fresh, linearly down to 0 at the staleness threshold (H5)."""
    if state.snap_at_us is None:
        return 0.0
    return max(0.0, 1.0 - max(0, now_us - state.snap_at_us) / state.stale_us)


_memo: list[Any] = [None, 0, ()]  # (request, block size, hashes): the last prompt hashed


def prompt_hashes(req: RequestView, block_size: int) -> tuple[int, ...]:
    """The prompt's chained block hashes, computed once per request: ``select`` and ``on_dispatch`` get the same
    :class:`RequestView` object, so a one-entry memo by identity serves the second call (a cache of a pure
    function; it never changes a result). This is the "hashing" of G7, timed apart from the selection."""
    if _memo[0] is req and _memo[1] == block_size:
        return _memo[2]
    hashes = tuple(block_hashes(req.tokens, block_size))
    _memo[0], _memo[1], _memo[2] = req, block_size, hashes
    return hashes


def _tie_key(req: RequestView, hashes: Sequence[int]) -> int:
    """A stable per-request key for ties (H6): the routing key, else the 4th block hash, else the tokens."""
    if req.routing_key is not None:
        return stable_hash64(req.routing_key)
    if hashes:
        return hashes[min(len(hashes), TIE_KEY_BLOCK) - 1]
    return hash(tuple(req.tokens)) & 0xFFFF_FFFF_FFFF_FFFF  # ints and tuples of ints hash without a salt
