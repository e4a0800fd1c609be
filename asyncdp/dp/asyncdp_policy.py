"""``asyncdp``: asyncdp's own routing policy (routing-bench §3, hints H1-H8), a pure policy of :mod:`.policy`.

Theory of operation (in full, with the reasons for each rule: docs/discussion/routing-policy.md). One cost per
rank in prefill-token units (H1)::

    cost[i] = base[i] + prompt_len - CREDIT_WEIGHT·credit[i]
    base[i] = pending[i] + DECODE_TOKENS·decoding[i] + memory[i] + w·(others[i] + kv_penalty[i])

``pending`` and ``decoding`` are this router's exact counters (a snapshot never overwrites them, H4); decoding
requests with long prompts weigh more where the choice moves no cached prefix; ``others`` is the work the snapshot
shows that this router did not send, weighed by ``w``, which decays with the snapshot's age (H5); ``memory``
steers new content to emptier caches (H8); ``credit`` is the prefix hit predicted from this router's own index of
the block hashes it sent (:mod:`.owner_index`), counted twice. On top of the cost: the hot-spot bound and deliberate
replicas of prefixes hotter than their holders can serve (H3, ``AsyncdpState.mark_hot`` and ``mark_spill``); for a
prompt no rank holds, phase weights where most recent prompts were new (closed-loop clients out of step) and spread
by prefix count where they were not and none recently began with a hot prefix (:mod:`.spread`); a keyed prompt
that is a hot prefix and mostly new content (a new conversation) placed as a new one, by key; the opt-in stall
term (:mod:`.stalls`); ties scanned from a stable hash of the request's key (H6, H7, :mod:`.ties`); with several
routers, the coordinator's prefix directory (:mod:`.prefix_directory`; not while the phase weights hold in full)
and the other routers' work since the snapshot, estimated from this router's own send rate and poured over the
cheapest ranks for a prompt some rank holds (:mod:`.unseen`; ``asyncdp@fill`` for new prompts too). The hooks keep every request-independent term cached
(:mod:`.asyncdp_state`), so ``select`` is a few lookups (G7).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from asyncdp.dp.asyncdp_state import KV_HIGH, REFRESH_US, AsyncdpState, CostWeights, Routed
from asyncdp.dp.owner_index import RANK_TUPLES, prompt_hashes, ranks_of
from asyncdp.dp.policy import Decision, RequestView, Snapshot
from asyncdp.dp.several_routers import SeveralRouters
from asyncdp.dp.spread import fewest_prefixes, ranks_within
from asyncdp.dp.ties import argmin, pick_among, tie_key, tie_scan
from asyncdp.dp.unseen import UNSEEN_FILL, UNSEEN_REQUEST_TOKENS, CostOrder, raised
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
NEAR_SHARE = 16.0  # [ours] a new conversation after a hot prefix: ranks within 1/16 of its new tokens are near
SPREAD_TOKENS = 512.0  # [ours] a new prompt: the fewest prefixes among the ranks this close to the cheapest (spread)
_INF = float("inf")


class AsyncdpPolicy(SeveralRouters):
    """asyncdp's own policy: one token cost, prefix- and KV-aware, hot-spot bounded (docs/discussion/routing-policy.md)."""

    name = "asyncdp"

    def __init__(self, *, decode_tokens: float = DECODE_TOKENS, hot_ratio: float = HOT_RATIO,
                 hot_slack: float = HOT_SLACK, kv_penalty_tokens: float = KV_PENALTY_TOKENS,
                 credit_weight: float = CREDIT_WEIGHT, memory_tokens: float = MEMORY_TOKENS,
                 replica_headroom: float = REPLICA_HEADROOM, phase_spread: float = PHASE_SPREAD,
                 phase_period_s: float = PHASE_PERIOD_S, decode_ref_tokens: float = DECODE_REF_TOKENS,
                 hot_share: float = HOT_SHARE, stall_tokens_per_s: float = 0.0,
                 stall_grace_s: float = STALL_GRACE_S, prefix: bool = True, directory: bool = True,
                 spread: bool = True, spread_tokens: float = SPREAD_TOKENS, spread_gated: bool = True,
                 unseen_fill: float = UNSEEN_FILL, fill_new: bool = False, claim_in_phase: bool = False,
                 prefill_tokens: bool = True, deep_claims: bool = True, mirror: bool = True,
                 hot_new: bool = True) -> None:
        if hot_ratio < 1 or min(hot_slack, decode_tokens, replica_headroom, decode_ref_tokens, hot_share,
                                stall_tokens_per_s, stall_grace_s, spread_tokens, unseen_fill) < 0:
            raise ConfigError("asyncdp policy: hot_ratio must be >= 1, hot_slack, decode_tokens, "
                              "replica_headroom, decode_ref_tokens, hot_share, stall_tokens_per_s, "
                              "stall_grace_s, spread_tokens and unseen_fill >= 0.")
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
        self.spread, self.spread_tokens = spread, spread_tokens  # a new prompt: fewest prefixes near the cheapest
        self.spread_gated = spread_gated  # False (@spread, @spread512): spread wherever the phases are not in full
        self.directory = directory  # False (asyncdp@local): never ask the coordinator's prefix directory
        self.unseen_fill = unseen_fill  # 0 (asyncdp@no_fill): the other routers' unseen work is not estimated
        self.fill_new = fill_new  # True (asyncdp@fill): it is poured for a prompt no rank holds too
        self.claim_in_phase = claim_in_phase  # True (asyncdp@claim_all): claim new prompts while the phases hold too
        self.deep_claims = deep_claims  # False (asyncdp@shallow): claim only prompts whose first block is new
        self.prefill_tokens = prefill_tokens  # False (asyncdp@counts): the others' waiting work from the counts alone
        self.mirror = mirror  # False (asyncdp@no_mirror): the others' unclaimed new prompts are not mirrored
        self.hot_new = hot_new  # False (asyncdp@hot_held): a hot prefix's holders draw the new content after it

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

    # ------------------------------------------------------------ decision

    def select(self, req: RequestView, snap: Snapshot | None, state: AsyncdpState, now_us: int,
               rng: random.Random) -> Decision:
        if req.rank_hint is not None:  # a hinted request bypasses the policy (hinted_decision, inlined)
            return Decision(req.rank_hint, hinted=True)
        base, hbase, mbase = state.base, state.hbase, None
        if now_us >= state.refresh_due_us and (decayed := state.decayed_costs(now_us)) is not None:
            base, hbase, mbase = decayed  # no hook ran for a while: the snapshot terms decayed here (H5), on copies
            best, pick, ties = argmin(base)
        else:
            best, pick, ties = state.best, state.pick, state.ties
        hashes = prompt_hashes(req, state.block_size) if self.prefix else ()
        index = state.index
        new = not hashes or not index.owners.get(hashes[0], 0)  # no rank holds the prompt
        # (the pour is for a prompt some rank holds; asyncdp@fill pours for a new one too)
        filled = (self.fill_new or not new) and bool(self.unseen_fill) and (
            unseen := self.unseen_fill * state.unseen(now_us)) > 0
        level, n_under = -_INF, 0
        if filled:
            # the other routers' work since the snapshot, poured over the cheapest ranks, where they send it (H7);
            # the ranks under the level count at it, and the key picks among them by the share of the pour each
            # took (pour_pick). The kept order of the costs gives the level; decayed copies need an order of theirs.
            # The draw reads every rank under the level (half of them in a busy cluster), and most decisions for a
            # held prompt go to a holder, whose cost does not depend on which rank the draw picks: it is made only
            # where the choice reads it (pick -1 until then; G7).
            order = state.order if mbase is None and state.order is not None else CostOrder(base, mbase or state.mbase)
            best = level = (found := order.level(unseen))[0]
            n_under, ties = found[1], 1  # how many of the cheapest ranks are under the level
            if n_under:
                pick = -1
        if best == _INF:
            raise UnavailableError("no data-parallel rank is alive")
        decisions = state.decisions  # one immutable Decision per rank, made once
        if new:
            # No rank holds the prompt: the cheapest by load, its load weighed by the rank's phase (state.phase)
            spread = self.spread and hashes and self.spread_applies(state)
            if filled:
                mcosts = state.mbase if mbase is None else mbase
                mbest, mpick = order.miss_pick(mcosts, base, n_under, level, tie_key(req, hashes))
                if spread:  # near_cheapest reads every rank's miss cost, raised by the pour
                    mbase = raised(mcosts, base, level)
            else:
                if mbase is None:
                    mbase, mbest, mpick, mties = state.mbase, state.mbest, state.mpick, state.mties
                else:
                    mbest, mpick, mties = argmin(mbase)
                if state.num_routers > 1 and state.phase_scale > 0 and self.phase_spread > 0 and mbest < _INF:
                    # The phases give every router the same preference, and each sees only its own sends until the
                    # next snapshot: where each sends about one request a burst, all of them would send it to the rank
                    # the phases favour. The request's key draws among the ranks within its length of the cheapest.
                    mpick = pick_among(ranks_within(mbase, mbest, len(req.tokens)), tie_key(req, hashes))
                elif mties > 1:
                    mpick = tie_scan(mbase, mbest, mpick, tie_key(req, hashes) % state.n)
            if spread:
                mpick = fewest_prefixes(index.roots, mbase if mbase is not None else state.mbase, mbest, mpick,
                                        self._within(req), tie_key(req, hashes) % state.n)
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
        if 2 * top_credit < plen and self.hot_new and req.routing_key is not None and lo <= state.replica_depth(
                hashes[0]) and (hashes[0] in state.hot or not self.hot_share):
            # A hot prefix (no deeper run held), then mostly new content: a new conversation after a shared system
            # prompt. Its later turns follow it, and the prefix is soon on every rank: the key picks among the ranks
            # near the cheapest, as for a new prompt (W5: the holders drew every new user, 27 to a rank)
            if filled and n_under:  # the pour's draw, by key among the ranks it levelled
                return decisions[order.pour_pick(level, n_under, tie_key(req, hashes), base)]
            mcosts = state.mbase if mbase is None else mbase
            within = min(self.spread_tokens, (plen - top_credit) / NEAR_SHARE)
            return decisions[pick_among(ranks_within(mcosts, min(mcosts), within), tie_key(req, hashes))]
        wc = weight * top_credit
        pick_cost, pick_credit = best + plen, 0
        load = state.load
        # the hot-spot bound (H3), for a prefix hot enough to make its holders hot (AsyncdpState.mark_hot)
        cap = state.cap if not self.hot_share or hashes[0] in state.hot else _INF
        full = held & deepest
        by_load = 2 * top_credit >= plen
        if state.spill and by_load and hashes[0] in state.spill and full == held \
                and lo <= state.replica_depth(hashes[0]):
            if pick < 0:
                pick = order.pour_pick(level, n_under, tie_key(req, hashes), base)
            if not (full >> pick) & 1 and index.size(pick) + nh <= index.capacity:
                # a prefix hotter than its holders can serve: a deliberate replica (H3), of a run that is the hot
                # prefix itself (a user's history after a shared system prompt is the user's alone: not moved,
                # whether other ranks hold the prefix or, its only holder, this one does: replica_depth)
                return decisions[pick]
        # The ranks holding the whole run share one credit, so the cheapest of them under the hot-spot bound (H3)
        # is their best; it is then weighed against the cheapest rank by load. When the run is most of the prompt,
        # memory does not decide among them (it is cached on all of them, and little is added): they compare by
        # load only (hbase = base - memory + extra: the decodes weighed by their context). Their common credit is
        # added after the loop, and the extra taken off again: the hit is weighed flat against the cheapest rank.
        costs = hbase if by_load else base
        rmin, cmin, n = -1, _INF, state.n
        tied: list[int] = []  # with the unseen work: the holders at the minimum, picked from as pick_among does
        for r in RANK_TUPLES.get(full) or ranks_of(full):
            cost = costs[r]
            if (b := base[r]) < level:  # raised by the pour (never without it: level is -inf)
                cost = cost + (level - b) if by_load else level
            if cost <= cmin and load[r] <= cap:
                if cost == cmin and filled:
                    tied.append(r)
                    continue
                if cost == cmin:  # equal: the scan order from the key decides (H6)
                    if start < 0:
                        start = tie_key(req, hashes) % n
                    if (r - start) % n >= (rmin - start) % n:
                        continue
                rmin, cmin = r, cost
                if filled:
                    tied = [r]
        if len(tied) > 1:
            rmin = pick_among(tied, tie_key(req, hashes), base, level)
        if rmin >= 0:
            cmin += (plen - wc + state.memory[rmin] - state.extra[rmin]) if by_load else (plen - wc)
            cheaper = cmin < pick_cost or (cmin == pick_cost and top_credit > 0)
            if not cheaper and pick < 0:  # the test after it reads the rank the pour's draw picks
                pick = order.pour_pick(level, n_under, tie_key(req, hashes), base)
            if cheaper or ((full >> pick) & 1 and load[pick] <= cap):
                # (the last: the cheapest rank is a holder itself, so the holders' choice by load stands)
                pick, pick_cost, pick_credit = rmin, cmin, top_credit
            elif cmin == pick_cost:  # no credit either way (a one-token prompt): the scan order decides
                if start < 0:
                    start = tie_key(req, hashes) % n
                if (rmin - start) % n < (pick - start) % n:
                    pick = rmin
        if pick < 0:  # no holder took it: the pour's draw decides
            pick = order.pour_pick(level, n_under, tie_key(req, hashes), base)
        if held != full:
            pick = self._partial_holders(req, hashes, state, base, level, held ^ full, lo, pick, pick_cost,
                                         pick_credit, start, cap)
        return decisions[pick]

    def _partial_holders(self, req: RequestView, hashes: Sequence[int], state: AsyncdpState, base: list[float],
                         level: float, rest: int, lo: int, pick: int, pick_cost: float, pick_credit: int, start: int,
                         cap: float) -> int:
        """The ranks holding the first block but not the whole run of ``lo`` blocks: each one's own match below
        ``lo``, pruned by the most they could still get (a base cost under the pour's ``level`` counts at it)."""
        plen, bs, weight, n = len(req.tokens), state.block_size, self.credit_weight, state.n
        bound = weight * min((lo - 1) * bs, plen - 1) - plen
        load = state.load
        for r in ranks_of(rest):
            b = max(base[r], level)
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

    def _within(self, req: RequestView) -> float:
        """The spread window for ``req``: its length, or ``spread_tokens`` if fewer."""
        return min(len(req.tokens), self.spread_tokens)

    def spread_applies(self, state: AsyncdpState) -> bool:
        """Whether a prompt no rank holds is placed by prefix count (:mod:`.spread`): while the phase weights are
        off and no recent request began with a hot prefix; ungated (``asyncdp@spread``, ``@spread512``), wherever
        the phase weights are not in full."""
        if not self.spread_gated:
            return state.phase_scale < 1.0
        return not state.phase_scale and not state.hot_recently()

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
        new = not hashes or not state.index.owners.get(hashes[0], 0)
        if state.weights.phase_spread or self.spread:
            state.note_new(new, now_us)
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
        if new and self.mirror:
            state.mirror_new(r, prefill)
        state.sent_tok += min(prefill + weight, UNSEEN_REQUEST_TOKENS)
        state.pending_reqs[r] += 1
        state.update(r)
        if hashes and state.weights.replica_headroom:
            state.mark_spill(hashes[0], r, hashes)

    def on_first_token(self, state: AsyncdpState, req_id: str, dp_rank: int, now_us: int) -> None:
        state.tick(now_us)
        f = state.reqs.get(req_id)
        if f is not None and not f.decoding:
            state.start_decoding(f)

    def on_finish(self, state: AsyncdpState, req_id: str, dp_rank: int, now_us: int) -> None:
        state.tick(now_us)
        f = state.reqs.pop(req_id, None)
        state.note_finish(now_us)
        if f is not None:
            state.forget(f)

    def on_snapshot(self, state: AsyncdpState, snap: Snapshot) -> None:
        if len(snap.loads) != state.n:
            raise ValueError(f"snapshot has {len(snap.loads)} ranks, expected {state.n}")
        tokens = snap.has_prefill_tokens and self.prefill_tokens and state.num_routers > 1
        for i, x in enumerate(snap.loads):
            # The other routers' requests: the rank's total less this router's, then split. Clipping waiting and
            # running apart would count this router's preempted requests (decoding here, waiting there) as other
            # work: a preemption storm would read as a queue of strangers and push hits off their holders.
            mine_w = state.pending_reqs[i]
            other = max(0, x.waiting + x.running - mine_w - state.decoding[i])
            ow = min(other, max(0, x.waiting - mine_w))
            if x.kv_usage > KV_HIGH:
                # A rank out of KV queues for memory: its waiting requests are mostly preempted ones, other routers'
                # too, to be readmitted before anything new. Priced as prefill they push hits off the rank, each a
                # new copy of a prefix that fills the next rank (W2 at R = 4: hit rate 0.87, 12-68 x R = 1's TTFT).
                ow = 0
            state.others_cnt[i] = other
            if tokens:
                # the others' prefill is the rank's prompt tokens still to compute less this router's own: in the
                # counts another router's 50 000-token document is one request, once admitted a decode (W8, R = 4)
                state.others_tok[i] = max(0, x.prefill_tokens - state.pending[i]) + (other - ow) * state.avg_decode
            else:
                state.others_tok[i] = ow * state.avg_prefill + (other - ow) * state.avg_decode
            state.kv[i] = x.kv_usage
            state.fill[i] = x.cache_fill if state.num_routers > 1 else 0.0  # one router: its own index
        at = snap.delivered_at_us or state.clock_us
        state.note_period(at)
        state.snap_at_us = at
        state.refreshed_at_us = at
        state.refresh_due_us = at + REFRESH_US
        state.weight = 1.0
        state.shared = [0.0] * state.n  # the snapshot shows the other routers' work now
        state.mirror = [0.0] * state.n
        state.update_all(resum=True)

    def on_rank_dead(self, state: AsyncdpState, dp_rank: int) -> None:
        state.mark_dead(dp_rank)

    def on_rank_back(self, state: AsyncdpState, dp_rank: int) -> None:
        state.mark_alive(dp_rank)
