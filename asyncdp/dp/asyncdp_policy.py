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
- Long contexts (``decode_ref_tokens=4096``; ``asyncdp@flat_decode`` turns it off): a decode step reads every
  running sequence's KV, so a sequence with a 16 k context slows its rank's steps several times as much as one
  with 1 k. Where the choice moves no cached prefix (among the ranks holding a prompt's whole matched run when
  it is at least half the prompt, and for a prompt no rank holds), each decoding request weighs
  ``DECODE_TOKENS·prompt_len/decode_ref_tokens`` for a prompt longer than ``decode_ref_tokens``, at most
  ``DECODE_MAX_SCALE`` (4) times ``DECODE_TOKENS`` (``extra[i]`` over ``base``,
  :meth:`AsyncdpPolicy.decode_weight`). A hit is weighed against the cheapest other rank with the flat weight:
  past capacity every rank decodes long contexts, and pricing them up there sends hits off their holders into
  a spiral of misses (W2). With it G5 passes on W7 at full scale on three seeds, where the flat weight does not.
  Since the snapshot reconciliation below, W2 keeps its hits past capacity under it (over three seeds a wash
  against the flat weight), and no other workload moves by more than a few per cent (docs/benchmarks.md).
- ``others[i]``: the work of *other* routers (and of hinted clients) that the snapshot shows and this router
  did not send: ``other = max(0, waiting + running - my pending requests - my decoding)`` requests, of which
  ``min(other, max(0, waiting - my pending requests))`` are priced ``avg_prefill`` and the rest ``avg_decode``
  (the averages of this router's own requests), from the last snapshot, reconciled against this router's own
  counts at delivery. The totals are reconciled before the split: a request of this router the engine
  preempted is decoding here and waiting there, and is not another router's work. ``w`` decays linearly with
  the snapshot's age, to 0 at ``staleness_ms`` (H5): stale telemetry falls back on local counters, and a
  missing report never reads as "idle" because local counters stay.
- ``kv_penalty[i]``: ``KV_PENALTY_TOKENS·(kv_usage - 0.9)/0.1`` (weighted by ``w``) when a rank's referenced
  KV is above 90 %: a new request there waits for memory or triggers preemption.
- ``memory[i]``: ``MEMORY_TOKENS·(index blocks of rank i)/kv_blocks_per_rank``: a soft preference for the rank
  with the emptier cache, so new prefixes spread by memory (H8) and a rank's working set is not evicted by
  prefixes that fit elsewhere; small next to a real load difference, so a miss still goes to the cheapest rank
  (H2). It steers new content only: the ranks holding a prompt's whole matched run, when that run is at least
  half the prompt, compare by load without it (the run is cached on all of them).
- ``credit[i]``: the predicted prefix-cache hit, from the router's own history (H8): an approximate index of
  the block hashes it sent to each rank (a chained hash of each 16-token block), each rank's set bounded by
  ``kv_blocks_per_rank`` in an LRU whose roots are refreshed last (so, as in the engine, tails are evicted
  first and every rank's set stays prefix-closed). Capped at ``prompt_len - 1`` (the last token is computed),
  and counted ``CREDIT_WEIGHT`` (2) times: a hit saves work for the whole cluster and keeps the prefix warm for the
  requests after it, not only this request's TTFT.

Hot-spot bound (H3): a rank's credit counts only while its estimated in-flight count (mine + others) is at most
``max(HOT_RATIO·mean, mean + HOT_SLACK)``; past it the request is priced as a miss there, so a prefix hotter than
one rank can serve is replicated on the cheapest other rank instead of queueing; it holds for a prefix hot enough to
make its holders hot (:meth:`~.asyncdp_state.AsyncdpState.mark_hot`). Before that bound, a prefix is replicated
deliberately when it is hot by demand: the router counts, per first block, a share of its recent
requests that decays over about 256 dispatches (:class:`~.asyncdp_state.PrefixRates`). When a dispatch finds that
share times the live ranks times ``REPLICA_HEADROOM`` (2) above the number of ranks holding the prefix, and the
rank it went to past the mean in-flight count by ``REPLICA_SLACK`` (1), it marks the prefix; the next request with
it goes to the cheapest rank by load if that rank's index has room for the prompt without evicting (H8), and that
rank pays one prefill and becomes a holder; only a prompt that is mostly the hot prefix (its run at least half
of it) and whose run is the hot prefix itself (every holder of the first block holds the whole run) moves so.
W7's top document (18 % of the requests at dp 8) ends on three ranks; a W1 group (1/64 of them) never
replicates; W5's system prompt (every request) is not replicated through its users' histories. Misses go to the
cheapest rank by load (H2), never to "the smallest tree".

Phase weights (new prompts). A prompt no rank holds (not even its first block) goes to the cheapest rank by load,
but each rank's load (``base - memory``) is weighed by ``1 + phase``: the phases run from ``-PHASE_SPREAD`` to
``+PHASE_SPREAD`` (0.1) in equal steps over the ranks and rotate by one rank every ``PHASE_PERIOD_S`` (5 s) of the
hooks' clock. Equally loaded ranks step in step, and closed-loop clients with equal lengths (guidellm's
concurrency mode, W9) resend in bursts that keep them so (W9 at full scale: mean TTFT 3.3 x ``random``'s); loads a
few per cent apart let the clients drift out of step (:meth:`~.asyncdp_state.AsyncdpState.phase`). The weights
apply only where most recent prompts were new to every rank (in full from 90 %, not at all up to 50 %:
``AsyncdpState.note_new``): where a new prompt is the first of a group (W1's bursts, W3, sessions), its rank is
where its followers go, so it keeps the balance. Prompts that some rank holds compare by load unweighted.
``asyncdp@no_phase`` turns the weights off.

Stall term (opt-in, ``asyncdp@stall``): the age of this router's oldest request still waiting for its first token
on a rank, past a grace of ``STALL_GRACE_S`` (1 s), priced in tokens and added to the rank's local cost, so that a
hit leaves a rank that queues for memory or hangs while it still reports (:mod:`.stalls`).

Spread (opt-in, ``asyncdp@spread``, ``@spread512``): a prompt no rank holds goes to the rank holding the fewest
prefixes among those within one prefill (at most ``spread_tokens``) of the cheapest (:mod:`.spread`).

Ties (H6, H7): among equal costs the deeper match wins, then the first rank in a scan that starts at a stable
hash of the request's key (its ``routing_key``, else its 4th block hash, else its tokens) — the same key lands
on the same rank (affinity across turns and across routers), different keys spread over tied ranks, so R
routers deciding from one snapshot do not herd onto one rank (:mod:`.ties`).

Several routers (H7, shared state). Each router knows only where it sent each prefix, and until a snapshot shows
the others' work its view of the loads is its own share of the traffic. With other routers, a prompt whose first
block this router never placed is claimed through the coordinator's prefix directory
(:mod:`.prefix_directory`, :meth:`AsyncdpPolicy.claim_hashes`): the answer sends the request to the rank the first
claimant chose (or this router's own pick, unless the directory saw that rank get decidedly more of the recent new
prefixes), records the blocks that claimant shared in this router's index, and hands over the other routers'
recent new-prefix tokens per rank, which count in each rank's local cost until the next snapshot
(:meth:`AsyncdpPolicy.on_prefix_owner`, :meth:`~.asyncdp_state.AsyncdpState.set_shared`). W1's burst at R = 4 then
places each group once, as R = 1 does. One router never claims.

Decision cost (G7). The hooks keep everything ``select`` needs that does not depend on the request (the costs,
their minima, first ranks and ties, the hot-spot bound: :mod:`.asyncdp_state`), so ``select`` is a few lookups:
the tie scan only on a tie, the deepest run of the prompt's blocks any rank holds (two lookups when it is the run
the last prompt with the same first block matched, else a binary search: :mod:`.owner_index`), the ranks holding
that whole run (their credit is known), and those holding part of it, pruned by the best credit they could still
get. The prompt's block hashes are computed once (memoised for ``on_dispatch``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from asyncdp.dp.asyncdp_state import REFRESH_US, AsyncdpState, CostWeights, Routed, argmin
from asyncdp.dp.owner_index import RANK_TUPLES, prompt_hashes, ranks_of
from asyncdp.dp.policy import Decision, Policy, RequestView, Snapshot
from asyncdp.dp.prefix_directory import MAX_CLAIM_BLOCKS
from asyncdp.dp.spread import fewest_prefixes
from asyncdp.dp.ties import tie_key, tie_scan
from asyncdp.errors import ConfigError, UnavailableError

__all__ = ["REFRESH_US", "AsyncdpPolicy", "AsyncdpState", "prompt_hashes"]

DECODE_TOKENS = 16.0  # [ours] a decoding request's weight, in prefill tokens
KV_PENALTY_TOKENS = 4096.0
CREDIT_WEIGHT = 2.0  # [ours] a hit saves cluster work and keeps the cache warm: worth twice its tokens
MEMORY_TOKENS = 4096.0  # [ours] a full index costs this much: new prefixes go where memory is free (H8)
HOT_RATIO = 2.0
HOT_SLACK = 8.0
STALENESS_MS = 2000.0
DEFAULT_BLOCK = 16
DEFAULT_INDEX_BLOCKS = 28_000  # the gpu_8b profile's KV blocks per rank; params override it
REPLICA_HEADROOM = 2.0  # [ours] a prefix's holders should carry at most half a rank's share of requests each
HOT_SHARE = 0.25  # [ours] the hot-spot bound holds for a prefix that began 1/4 of a rank's share of recent requests
PHASE_SPREAD = 0.1  # [ours] a new prompt weighs the ranks' loads by 1 - 0.1 .. 1 + 0.1 (AsyncdpState.phase)
PHASE_PERIOD_S = 5.0  # [ours] the weights rotate by one rank this often
DECODE_REF_TOKENS = 4096.0  # [ours] a decoding request with a longer prompt weighs more (decode_weight) ...
DECODE_MAX_SCALE = 4.0  # [ours] ... up to this many times decode_tokens
STALL_GRACE_S = 1.0  # [ours] asyncdp@stall: a request waiting longer than this for its first token stalls its rank
_INF = float("inf")


class AsyncdpPolicy(Policy):
    """asyncdp's own policy: one token cost, prefix- and KV-aware, hot-spot bounded (module docstring)."""

    name = "asyncdp"

    def __init__(self, *, decode_tokens: float = DECODE_TOKENS, hot_ratio: float = HOT_RATIO,
                 hot_slack: float = HOT_SLACK, kv_penalty_tokens: float = KV_PENALTY_TOKENS,
                 credit_weight: float = CREDIT_WEIGHT, memory_tokens: float = MEMORY_TOKENS,
                 replica_headroom: float = REPLICA_HEADROOM, phase_spread: float = PHASE_SPREAD,
                 phase_period_s: float = PHASE_PERIOD_S, decode_ref_tokens: float = DECODE_REF_TOKENS,
                 hot_share: float = HOT_SHARE, stall_tokens_per_s: float = 0.0,
                 stall_grace_s: float = STALL_GRACE_S, prefix: bool = True, directory: bool = True,
                 spread: bool = False, spread_tokens: float = _INF) -> None:
        if hot_ratio < 1 or min(hot_slack, decode_tokens, replica_headroom, decode_ref_tokens, hot_share,
                                stall_tokens_per_s, stall_grace_s, spread_tokens) < 0:
            raise ConfigError("asyncdp policy: hot_ratio must be >= 1, hot_slack, decode_tokens, "
                              "replica_headroom, decode_ref_tokens, hot_share, stall_tokens_per_s, "
                              "stall_grace_s and spread_tokens >= 0.")
        if not 0 <= phase_spread < 1 or phase_period_s <= 0:
            raise ConfigError("asyncdp policy: phase_spread must be in [0, 1) and phase_period_s > 0.")
        self.decode_tokens = decode_tokens
        self.hot_ratio = hot_ratio
        self.hot_slack = hot_slack
        self.kv_penalty = kv_penalty_tokens
        self.credit_weight = credit_weight
        self.memory_tokens = memory_tokens
        self.replica_headroom = replica_headroom  # 0: no deliberate replicas
        self.phase_spread = phase_spread  # 0: a new prompt compares loads unweighted
        self.phase_period_us = max(1, round(phase_period_s * 1e6))
        self.decode_ref_tokens = decode_ref_tokens  # 0: every decoding request weighs decode_tokens
        self.hot_share = hot_share  # 0: the hot-spot bound holds for every prefix
        self.stall_tokens_per_s = stall_tokens_per_s
        self.stall_grace_us = round(stall_grace_s * 1e6)
        self.prefix = prefix
        self.spread, self.spread_tokens = spread, spread_tokens  # asyncdp@spread: fewest prefixes near the cheapest
        self.directory = directory  # False (asyncdp@local): never ask the coordinator's prefix directory

    def init(self, dp_size: int, router_index: int = 0, num_routers: int = 1,
             params: dict[str, Any] | None = None) -> AsyncdpState:
        if dp_size < 1 or not 0 <= router_index < num_routers:
            raise ConfigError(f"bad router layout: dp_size={dp_size}, router {router_index} of {num_routers}")
        p = params or {}
        weights = CostWeights(self.decode_tokens, self.kv_penalty, self.memory_tokens, self.hot_ratio,
                              self.hot_slack, self.replica_headroom, self.phase_spread, self.phase_period_us,
                              self.hot_share, self.stall_tokens_per_s, self.stall_grace_us)
        return AsyncdpState.empty(dp_size, num_routers, int(p.get("block_size_tokens", DEFAULT_BLOCK)),
                                  float(p.get("staleness_threshold_ms", STALENESS_MS)) * 1000.0, weights,
                                  int(p.get("kv_blocks_per_rank", DEFAULT_INDEX_BLOCKS)))

    @staticmethod
    def match(state: AsyncdpState, rank: int, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` rank holds in this router's index."""
        return state.index.match(rank, hashes)

    # ------------------------------------------------------------ decision

    def select(self, req: RequestView, snap: Snapshot | None, state: AsyncdpState, now_us: int,
               rng: random.Random) -> Decision:
        if req.rank_hint is not None:  # a hinted request bypasses the policy (hinted_decision, inlined)
            return Decision(req.rank_hint, hinted=True)
        base, hbase, mbase = state.base, state.hbase, None
        if now_us >= state.refresh_due_us and (decayed := state.snapshot_weight(now_us)) != state.weight:
            base = state.costs_at(decayed)  # no hook ran for a while: decay the snapshot terms here (H5), on a copy
            hbase = [b - m + x for b, m, x in zip(base, state.memory, state.extra, strict=True)]
            mbase = state.mcosts(base, hbase)
            best, pick, ties = argmin(base)
        else:
            best, pick, ties = state.best, state.pick, state.ties
        if best == _INF:
            raise UnavailableError("no data-parallel rank is alive")
        hashes = prompt_hashes(req, state.block_size) if self.prefix else ()
        decisions = state.decisions  # one immutable Decision per rank, made once
        index = state.index
        if not hashes or not index.owners.get(hashes[0], 0):
            # No rank holds the prompt: the cheapest by load, its load weighed by the rank's phase (state.phase)
            if mbase is None:
                mbase, mbest, mpick, mties = state.mbase, state.mbest, state.mpick, state.mties
            else:
                mbest, mpick, mties = argmin(mbase)
            if mties > 1:
                mpick = tie_scan(mbase, mbest, mpick, tie_key(req, hashes) % state.n)
            if self.spread and hashes and state.phase_scale < 1.0:
                mpick = fewest_prefixes(index.roots, mbase, mbest, mpick, min(len(req.tokens), self.spread_tokens),
                                        tie_key(req, hashes) % state.n)
            return decisions[mpick]
        start = -1  # the tie scan's first rank, computed only when a tie needs it
        if ties > 1:  # a tie: the first minimum at or after a stable hash of the key (H6)
            start = tie_key(req, hashes) % state.n
            pick = tie_scan(base, best, pick, start)
        get = index.owners.get
        held = get(hashes[0], 0)
        plen, bs, weight = len(req.tokens), state.block_size, self.credit_weight
        # The deepest run of blocks any rank holds bounds every credit: ranks that cannot win with it are skipped.
        nh = len(hashes)
        lo = index.depth_memo.get(hashes[0], 0)  # the run the last prompt with this first block matched
        deepest = get(hashes[lo - 1], 0) if 0 < lo <= nh else 0
        if not deepest or (lo < nh and get(hashes[lo], 0)):
            lo = index.deepest_run(hashes)  # not the same depth: search, and remember it
            index.depth_memo[hashes[0]] = lo
            deepest = get(hashes[lo - 1], 0)  # these ranks hold the whole matched run: credit top_credit
        top_credit = lo * bs if lo * bs < plen else plen - 1
        wc = weight * top_credit
        pick_cost, pick_credit = best + plen, 0
        load = state.load
        # the hot-spot bound (H3), for a prefix hot enough to make its holders hot (AsyncdpState.mark_hot)
        cap = state.cap if not self.hot_share or hashes[0] in state.hot else _INF
        full = held & deepest
        by_load = 2 * top_credit >= plen
        if state.spill and by_load and hashes[0] in state.spill and full == held and not (full >> pick) & 1 \
                and index.size(pick) + nh <= index.capacity:
            # a prefix hotter than its holders can serve: a deliberate replica (H3), of a run that is the hot
            # prefix itself (a user's history after a shared system prompt is the user's alone: not moved)
            return decisions[pick]
        # The ranks holding the whole run share one credit, so the cheapest of them under the hot-spot bound (H3)
        # is their best; it is then weighed against the cheapest rank by load. When the run is most of the prompt,
        # memory does not decide among them (it is cached on all of them, and little is added): they compare by
        # load only (hbase = base - memory + extra: the decodes weighed by their context). Their common credit is
        # added after the loop, and the extra taken off again: the hit is weighed flat against the cheapest rank.
        costs = hbase if by_load else base
        rmin, cmin, n = -1, _INF, state.n
        for r in RANK_TUPLES.get(full) or ranks_of(full):
            cost = costs[r]
            if cost <= cmin and load[r] <= cap:
                if cost == cmin:  # equal: the scan order from the key decides (H6)
                    if start < 0:
                        start = tie_key(req, hashes) % n
                    if (r - start) % n >= (rmin - start) % n:
                        continue
                rmin, cmin = r, cost
        if rmin >= 0:
            cmin += (plen - wc + state.memory[rmin] - state.extra[rmin]) if by_load else (plen - wc)
            if cmin < pick_cost or (cmin == pick_cost and top_credit > 0) or ((full >> pick) & 1 and load[pick] <= cap):
                # (the last: the cheapest rank is a holder itself, so the holders' choice by load stands)
                pick, pick_cost, pick_credit = rmin, cmin, top_credit
            elif cmin == pick_cost:  # no credit either way (a one-token prompt): the scan order decides
                if start < 0:
                    start = tie_key(req, hashes) % n
                if (rmin - start) % n < (pick - start) % n:
                    pick = rmin
        if held != full:
            pick = self._partial_holders(req, hashes, state, base, held ^ full, lo, pick, pick_cost, pick_credit,
                                         start, cap)
        return decisions[pick]

    def _partial_holders(self, req: RequestView, hashes: Sequence[int], state: AsyncdpState, base: list[float],
                         rest: int, lo: int, pick: int, pick_cost: float, pick_credit: int, start: int,
                         cap: float) -> int:
        """The ranks holding the first block but not the whole run of ``lo`` blocks: each one's own match below
        ``lo``, pruned by the most they could still get."""
        plen, bs, weight, n = len(req.tokens), state.block_size, self.credit_weight, state.n
        bound = weight * min((lo - 1) * bs, plen - 1) - plen
        load = state.load
        for r in ranks_of(rest):
            b = base[r]
            if b - bound > pick_cost or load[r] > cap:
                continue
            lo2 = state.index.match(r, hashes[:lo])
            credit = lo2 * bs if lo2 * bs < plen else plen - 1
            cost = b + plen - weight * credit
            if cost > pick_cost or (cost == pick_cost and credit < pick_credit):
                continue
            if cost == pick_cost and credit == pick_credit:
                if start < 0:
                    start = tie_key(req, hashes) % n
                if (r - start) % n >= (pick - start) % n:
                    continue
            pick, pick_cost, pick_credit = r, cost, credit
        return pick

    def decode_weight(self, prompt_len: int) -> float:
        """A decoding request's weight in prefill tokens: ``decode_tokens``, times ``prompt_len /
        decode_ref_tokens`` for a prompt longer than ``decode_ref_tokens``, at most ``DECODE_MAX_SCALE`` times."""
        if not self.decode_ref_tokens or prompt_len <= self.decode_ref_tokens:
            return self.decode_tokens
        return self.decode_tokens * min(DECODE_MAX_SCALE, prompt_len / self.decode_ref_tokens)

    # ------------------------------------------------------------ hooks

    def on_dispatch(self, state: AsyncdpState, req: RequestView, decision: Decision, now_us: int) -> None:
        state.tick(now_us)
        r = decision.dp_rank
        hashes = prompt_hashes(req, state.block_size) if self.prefix else ()
        credit = 0
        if state.weights.phase_spread:
            state.note_new(not hashes or not state.index.owners.get(hashes[0], 0))
        if hashes:
            credit = min(state.index.match(r, hashes) * state.block_size, req.prompt_len - 1)
            state.index.insert(r, hashes)
            state.rates.bump(hashes[0])
            if self.hot_share:
                state.mark_hot(hashes[0])
        prefill = max(0, req.prompt_len - credit)
        state.avg_prefill += (prefill - state.avg_prefill) / 16.0
        old = state.reqs.pop(req.req_id, None)
        if old is not None:  # a reused id: forget the old one first
            state.forget(old)
        weight = self.decode_weight(req.prompt_len)
        state.avg_decode += (weight - state.avg_decode) / 16.0
        routed = state.reqs[req.req_id] = Routed(r, prefill, weight=weight, sent_us=now_us)
        if state.weights.stall_tokens_per_s:
            state.stalls.sent(routed)
        state.pending[r] += prefill
        state.pending_reqs[r] += 1
        state.update(r)
        if hashes and state.weights.replica_headroom:
            state.mark_spill(hashes[0], r)

    def on_first_token(self, state: AsyncdpState, req_id: str, dp_rank: int, now_us: int) -> None:
        state.tick(now_us)
        f = state.reqs.get(req_id)
        if f is not None and not f.decoding:
            state.start_decoding(f)

    def on_finish(self, state: AsyncdpState, req_id: str, dp_rank: int, now_us: int) -> None:
        state.tick(now_us)
        f = state.reqs.pop(req_id, None)
        if f is not None:
            state.forget(f)

    def on_snapshot(self, state: AsyncdpState, snap: Snapshot) -> None:
        if len(snap.loads) != state.n:
            raise ValueError(f"snapshot has {len(snap.loads)} ranks, expected {state.n}")
        for i, x in enumerate(snap.loads):
            # The other routers' requests: the rank's total less this router's, then split. Clipping waiting and
            # running apart would count this router's preempted requests (decoding here, waiting there) as other
            # work: a preemption storm would read as a queue of strangers and push hits off their holders.
            mine_w = state.pending_reqs[i]
            other = max(0, x.waiting + x.running - mine_w - state.decoding[i])
            ow = min(other, max(0, x.waiting - mine_w))
            state.others_cnt[i] = other
            state.others_tok[i] = ow * state.avg_prefill + (other - ow) * state.avg_decode
            state.kv[i] = x.kv_usage
        at = snap.delivered_at_us or state.clock_us
        state.snap_at_us = at
        state.refreshed_at_us = at
        state.refresh_due_us = at + REFRESH_US
        state.weight = 1.0
        state.shared = [0.0] * state.n  # the snapshot shows the other routers' work now
        state.update_all(resum=True)

    def on_rank_dead(self, state: AsyncdpState, dp_rank: int) -> None:
        state.mark_dead(dp_rank)

    # ------------------------------------------------------------ several routers (H7: shared state)

    def claim_hashes(self, state: AsyncdpState, req: RequestView) -> Sequence[int]:
        """A prompt whose first block this router never placed is claimed through the coordinator when there are
        other routers: one of them may be placing it right now (:mod:`asyncdp.dp.prefix_directory`)."""
        if state.num_routers < 2 or not self.directory or not self.prefix or req.rank_hint is not None:
            return ()
        hashes = prompt_hashes(req, state.block_size)
        if not hashes or state.index.owners.get(hashes[0], 0):
            return ()
        return hashes[:MAX_CLAIM_BLOCKS]

    def on_prefix_owner(self, state: AsyncdpState, dp_rank: int | None, hashes: Sequence[int], matched: int,
                        others: Sequence[float]) -> None:
        """Record what another router placed on ``dp_rank`` (the directory's match) in this router's index, and
        the other routers' recent new-prefix tokens per rank (:meth:`AsyncdpState.set_shared`)."""
        if matched and dp_rank is not None and dp_rank not in state.excluded:
            state.index.insert(dp_rank, hashes[:matched])
        state.set_shared(others)

