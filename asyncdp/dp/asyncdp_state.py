"""One router's state under asyncdp's policy (:mod:`.asyncdp_policy`): the per-rank cost ledger and its upkeep.

The policy's hooks change the counters (``pending``, ``decoding``, the snapshot's ``others`` and ``kv``) and then
call :meth:`AsyncdpState.update` for the rank they touched; ``update`` recomputes that rank's ``base`` cost and
in-flight ``load`` from the :class:`CostWeights`, and keeps what ``select`` reads instead of scanning every rank:
the minimum of ``base``, its first rank, how many ranks share it (O(1) per change but when the last rank at the
minimum leaves it, then one C-level rescan), the same for ``mbase`` (the costs a prompt no rank holds compares: the
load part weighted by each rank's phase, :meth:`AsyncdpState.phase`), and the hot-spot bound on ``load`` (H3). A
snapshot, a new decay weight or a new phase epoch changes every rank: :meth:`update_all` recomputes them all and
rescans once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from asyncdp.dp.asyncdp_records import CostWeights, Routed
from asyncdp.dp.deep_claims import DeepClaims
from asyncdp.dp.owner_index import OwnerIndex, common_run
from asyncdp.dp.phase_weights import PhaseWeights
from asyncdp.dp.policy import Decision
from asyncdp.dp.prefix_rates import PrefixRates
from asyncdp.dp.stalls import Stalls
from asyncdp.dp.ties import argmin, moved_min
from asyncdp.dp.unseen import UNSEEN_MAX_AGE_US, CostOrder, fold_rate

KV_HIGH = 0.9
REFRESH_US = 50_000  # the snapshot terms are re-weighed by their age at most this often (H5)
REPLICA_SLACK = 1.0  # [ours] in-flight requests past the mean before a hot prefix gets another holder (H3)
_INF = float("inf")

__all__ = ["KV_HIGH", "REFRESH_US", "AsyncdpState", "CostWeights", "Routed"]


def miss_cost(base: float, hbase: float, phase: float, extra: float, mirror: float) -> float:
    """What a prompt no rank holds compares on a rank (``mbase``): its ``base`` cost, the decodes weighed by their
    context (``extra``), the load weighted by the rank's ``phase`` (:meth:`PhaseWeights.phase`) and the other routers'
    new prompts this router mirrors there, weighted the same; infinite for a dead rank."""
    if hbase == _INF:
        return base
    return base + extra + phase * hbase + mirror * (1.0 + phase)


@dataclass(slots=True)
class AsyncdpState(PhaseWeights):
    n: int
    num_routers: int
    block_size: int
    stale_us: float
    weights: CostWeights
    base: list[float]
    pending: list[int]
    pending_reqs: list[int]
    decoding: list[int]
    dec_tokens: list[float]  # the decoding requests' weights, in prefill tokens (AsyncdpPolicy.decode_weight)
    extra: list[float]  # dec_tokens - decode_tokens·decoding: in hbase and mbase, not in base
    others_tok: list[float]
    others_cnt: list[int]
    kv: list[float]
    load: list[float]  # estimated in-flight requests (mine + others, weighted), for the hot-spot bound
    local: list[float]  # base = local + weight·remote (see _terms)
    remote: list[float]
    memory: list[float]  # the memory term of local: holders of a prompt's whole run are compared without it
    hbase: list[float]  # base - memory + extra, what those holders compare
    mbase: list[float]  # base + extra + phase·hbase + the mirror, what a prompt no rank holds compares (phase())
    index: OwnerIndex
    rates: PrefixRates
    load_total: float = 0.0  # sum(load), kept by update (recomputed on every snapshot: no drift)
    cap: float = 0.0  # the hot-spot bound on load (H3), kept with load_total
    mean_load: float = 0.0  # load_total over the live ranks, kept with cap
    spill: set[int] = field(default_factory=set)  # first blocks whose next request makes a replica (mark_spill)
    # first block of a prefix wanting replicas -> (the last prompt's hashes, the run it shared with the prompt
    # before, the shorter of the last two such runs: how deep the prefix itself goes, ``replica_depth``)
    runs: dict[int, tuple[tuple[int, ...], int, int]] = field(default_factory=dict)
    hot: set[int] = field(default_factory=set)  # first blocks the hot-spot bound holds for (mark_hot)
    hot_seq: int = -(1 << 62)  # rates.seq at the last dispatch of a hot prefix (mark_hot, hot_recently)
    shared: list[float] = field(default_factory=list)  # the other routers' new-prefix tokens: set_shared()
    mirror: list[float] = field(default_factory=list)  # the others' new prompts this router assumes (mirror_new)
    # with several routers: each rank's prefix cache fill as its snapshot reported it (``_terms``, the memory term)
    fill: list[float] = field(default_factory=list)
    # min(base), its first index, how many ranks share it: kept by update, so select reads them
    best: float = 0.0
    pick: int = 0
    ties: int = 0
    mbest: float = 0.0  # the same for mbase
    mpick: int = 0
    mties: int = 0
    epoch: int = 0  # the phase rotation's epoch: clock_us // phase_period_us
    phases: list[float] = field(default_factory=list)  # phase(i) for the current epoch
    new_share: float = 0.0  # EMA of the share of dispatched prompts no rank held (note_new)
    phase_scale: float = 0.0  # the share of phase_spread in force (note_new); the spread rule only at 0
    resend_credit: int = 0  # completions not matched to a dispatch yet (PhaseWeights.note_resend)
    last_finish_us: int = -1  # the hooks' clock at the last completion, -1 before the first
    resend_share: float = 1.0  # EMA of the share of dispatches that could be resends (note_resend)
    decisions: tuple[Decision, ...] = ()
    reqs: dict[str, Routed] = field(default_factory=dict)
    excluded: set[int] = field(default_factory=set)
    weight: float = 0.0  # the snapshot terms' weight (decays with age)
    snap_at_us: int | None = None
    clock_us: int = 0  # the latest time any hook saw (snapshots carry none in production)
    refreshed_at_us: int = 0
    refresh_due_us: float = _INF  # refreshed_at_us + REFRESH_US once a snapshot came
    avg_prefill: float = 0.0  # EMA of the uncached tokens per request this router sent
    avg_decode: float = 0.0  # EMA of the decode weights of the requests this router sent (from decode_tokens)
    stalls: Stalls = field(default_factory=lambda: Stalls(0.0, 0, 0))  # the stall term (:mod:`.stalls`)
    deep: DeepClaims = field(default_factory=DeepClaims)  # claims of runs after a prefix this router placed
    sent_tok: float = 0.0  # prefill tokens and decode weights this router sent since the last snapshot (:mod:`.unseen`)
    send_rate: float = 0.0  # their rate per microsecond, averaged over a few seconds (note_period)
    order: CostOrder | None = None  # with several routers: base and mbase in ascending order (the pour's level)

    @classmethod
    def empty(cls, n: int, num_routers: int, block_size: int, stale_us: float, weights: CostWeights,
              capacity_blocks: int) -> AsyncdpState:
        state = cls(n, num_routers, block_size, stale_us, weights, [0.0] * n, [0] * n, [0] * n, [0] * n,
                    [0.0] * n, [0.0] * n, [0.0] * n, [0] * n, [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n,
                    [0.0] * n, [0.0] * n, [0.0] * n, OwnerIndex.empty(n, capacity_blocks), PrefixRates(),
                    shared=[0.0] * n, mirror=[0.0] * n, fill=[0.0] * n, decisions=tuple(Decision(i) for i in range(n)),
                    avg_decode=weights.decode_tokens,
                    stalls=Stalls(weights.stall_tokens_per_s, weights.stall_grace_us, n))
        state.phases = [state.phase(i) for i in range(n)]
        if num_routers > 1:
            state.order = CostOrder((), ())  # filled by rescan
        state.set_cap()
        state.rescan()
        return state

    @property
    def capacity(self) -> int:
        return self.index.capacity

    @property
    def owners(self) -> dict[int, int]:
        return self.index.owners

    @property
    def lru(self) -> list[OrderedDict[int, None]]:
        return self.index.lru

    def _terms(self, i: int) -> tuple[float, float]:
        """Rank i's cost split at the snapshot weight: ``base[i] = local + weight·remote``, where ``local`` is this
        router's own pending and decoding work, the memory term and the other routers' new prefixes the directory
        counted (``shared``; infinite for a dead rank), ``remote`` the snapshot's other routers' work and the KV
        penalty. Records the memory term in ``memory``."""
        if i in self.excluded:
            return _INF, 0.0
        w = self.weights
        kv_pen = 0.0
        kv = self.kv[i]
        if kv > KV_HIGH:
            kv_pen = w.kv_penalty_tokens * (kv - KV_HIGH) / (1.0 - KV_HIGH)
        # How full the rank's cache is: this router's index of what it sent there, or with several routers the
        # rank's own report when that says more (where each API server keeps its own conversations, as behind
        # keep-alive connections or a session-affine balancer, each index holds a part of the rank's content)
        memory = w.memory_tokens * max(self.index.size(i) / self.index.capacity, self.fill[i]) \
            if w.memory_tokens else 0.0
        self.memory[i] = memory
        local = self.pending[i] + w.decode_tokens * self.decoding[i] + memory + self.shared[i] + self.stalls.terms[i]
        return local, self.others_tok[i] + kv_pen

    def costs_at(self, weight: float) -> list[float]:
        """Every rank's base cost with the snapshot terms at another ``weight`` (one pass, no method calls)."""
        return [lo + weight * re for lo, re in zip(self.local, self.remote, strict=True)]

    def mcosts(self, base: Sequence[float], hbase: Sequence[float]) -> list[float]:
        """The miss costs for the given base costs (a decayed copy of them, see ``select``): :func:`miss_cost` per
        rank, written out here because this runs in ``select`` and a call per rank raised its p99 at 64 ranks by
        about 1.5 µs (a test checks that the two agree)."""
        return [b if h == _INF else b + x + p * h + m * (1.0 + p)
                for b, h, p, x, m in zip(base, hbase, self.phases, self.extra, self.mirror, strict=True)]

    def snapshot_weight(self, now_us: int) -> float:
        """The snapshot terms' weight: 1 when fresh, linearly down to 0 at the staleness threshold (H5)."""
        if self.snap_at_us is None:
            return 0.0
        return max(0.0, 1.0 - max(0, now_us - self.snap_at_us) / self.stale_us)

    def _set(self, i: int) -> None:
        """Recompute rank i's base cost and load (the minimum and the bound are the caller's)."""
        lo, re = self._terms(i)
        self.local[i], self.remote[i] = lo, re
        b = self.base[i] = lo + self.weight * re
        x = self.extra[i] = 0.0 if i in self.excluded else (
            self.dec_tokens[i] - self.weights.decode_tokens * self.decoding[i])
        h = self.hbase[i] = b - self.memory[i] + x
        self.mbase[i] = miss_cost(b, h, self.phases[i], x, self.mirror[i])
        load = 0.0 if i in self.excluded else (
            self.pending_reqs[i] + self.decoding[i] + self.weight * self.others_cnt[i])
        self.load_total += load - self.load[i]
        self.load[i] = load

    def set_cap(self) -> None:
        mean = self.mean_load = self.load_total / (self.n - len(self.excluded) or 1)
        w = self.weights
        self.cap = max(w.hot_ratio * mean, mean + w.hot_slack)

    def rescan(self) -> None:
        self.best, self.pick, self.ties = argmin(self.base)
        self.mbest, self.mpick, self.mties = argmin(self.mbase)
        if self.order is not None:
            self.order.reset(self.base, self.mbase)

    def decayed_costs(self, now_us: int) -> tuple[list[float], list[float], list[float]] | None:
        """``(base, hbase, mbase)`` with the snapshot terms decayed to ``now_us`` (H5), on copies, when no hook ran
        for a while and the weight moved; None when the kept costs stand."""
        if now_us < self.refresh_due_us or (decayed := self.snapshot_weight(now_us)) == self.weight:
            return None
        base = self.costs_at(decayed)
        hbase = [b - m + x for b, m, x in zip(base, self.memory, self.extra, strict=True)]
        return base, hbase, self.mcosts(base, hbase)

    def update(self, i: int) -> None:
        """Rank i changed: recompute its cost, and keep the minimum, its first index and its ties (mostly O(1))."""
        old, mold = self.base[i], self.mbase[i]
        self._set(i)
        self.set_cap()
        new, mnew = self.base[i], self.mbase[i]
        if new != old:
            self.best, self.pick, self.ties = moved_min(self.base, self.best, self.pick, self.ties, i, old, new)
        if mnew != mold:
            self.mbest, self.mpick, self.mties = moved_min(self.mbase, self.mbest, self.mpick, self.mties, i, mold,
                                                        mnew)
        if self.order is not None:
            self.order.move(i, old, new, mold, mnew)

    def mark_spill(self, first: int, rank: int, hashes: tuple[int, ...]) -> None:
        """After a dispatch to ``rank`` of a prompt with block hashes ``hashes``: mark the prefix starting with
        block ``first`` for a replica (H3), so that its next request goes to the cheapest rank by load instead of a
        holder, when it began more than ``1/(alive·headroom)`` of the recent requests
        (:class:`~.prefix_rates.PrefixRates`), fewer ranks than ``share·alive·headroom`` hold it, and the rank it
        went to is now past the mean in-flight count by ``REPLICA_SLACK``; unmark it otherwise. The hooks decide,
        so that ``select`` pays one set lookup (G7). While the prefix wants replicas, ``runs`` keeps how deep it
        goes: the blocks its recent prompts have in common (it also tells a new conversation, asyncdp_policy)."""
        scale = (self.n - len(self.excluded)) * self.weights.replica_headroom  # share -> holders wanted
        want = self.rates.share(first) * scale
        if want > 1.0:
            last = self.runs.get(first)
            if last is None:
                self.runs[first] = (hashes, -1, -1)
            else:
                run = common_run(last[0], hashes)
                self.runs[first] = (hashes, run, run if last[1] < 0 else min(run, last[1]))
            if len(self.runs) > 2 * scale + 8:  # prefixes gone cold
                self.runs = {h: v for h, v in self.runs.items() if self.rates.share(h) * scale > 1.0}
        else:
            self.runs.pop(first, None)
        if want > 1.0 and self.index.owners.get(first, 0).bit_count() < want \
                and self.load[rank] > self.mean_load + REPLICA_SLACK:
            self.spill.add(first)
            if len(self.spill) > 2 * scale + 8:  # marks of prefixes gone cold
                self.spill = {h for h in self.spill if self.rates.share(h) * scale > 1.0}
        else:
            self.spill.discard(first)

    def replica_depth(self, first: int) -> int:
        """How many blocks the prefix starting with ``first`` goes deep (the shorter of the runs its last three
        prompts had in common), -1 while unknown. A replica copies a prompt's whole matched run: one deeper than the
        prefix carries a user's own history along (a conversation after a shared system prompt), which no other
        request reads, and pays a whole prefill for it."""
        last = self.runs.get(first)
        return -1 if last is None else last[2]

    def mark_hot(self, first: int) -> None:
        """After a dispatch of a prompt starting with block ``first``: the hot-spot bound (H3) holds for the prefix
        while it began at least ``hot_share`` of a live rank's share of the recent requests
        (:class:`~.prefix_rates.PrefixRates`). A colder prefix cannot make its holders hot: moving one of its hits
        off a holder that is busy for other reasons (the end of a burst draining unevenly) pays a whole prefill and
        a replica and relieves nothing. Its hits stay on their holders by cost. The hooks decide, so ``select``
        pays one set lookup (G7)."""
        alive = self.n - len(self.excluded)
        if self.rates.share(first) * alive >= self.weights.hot_share:
            self.hot.add(first)
            self.hot_seq = self.rates.seq
            if len(self.hot) > 2 * alive / self.weights.hot_share + 8:  # marks of prefixes gone cold
                self.hot = {h for h in self.hot if self.rates.share(h) * alive >= self.weights.hot_share}
        else:
            self.hot.discard(first)

    def hot_recently(self) -> bool:
        """Whether one of about the last ``rates.window`` dispatches began with a hot prefix (:meth:`mark_hot`).
        The set ``hot`` keeps a prefix that went cold until it is sent again; this forgets it within a window."""
        return self.rates.seq - self.hot_seq < self.rates.window

    def note_period(self, at_us: int) -> None:
        """A snapshot delivered at ``at_us``: fold what this router sent since the last one into ``send_rate``
        (:func:`.unseen.fold_rate`) and start again."""
        if self.snap_at_us is not None and at_us > self.snap_at_us:
            self.send_rate = fold_rate(self.send_rate, self.sent_tok, at_us - self.snap_at_us)
        self.sent_tok = 0.0

    def unseen(self, now_us: int) -> float:
        """With several routers: the work, in prefill tokens, that the others sent since the last snapshot and no
        snapshot shows yet, estimated as ``R - 1`` times this router's own send rate over the snapshot's age (at
        most ``UNSEEN_MAX_AGE_US``): API servers behind one port get about equal shares of the traffic. 0 with one
        router or before the first snapshot."""
        if self.num_routers < 2 or self.snap_at_us is None:
            return 0.0
        age = now_us - self.snap_at_us  # (compared, not clamped with min and max: select calls this; G7)
        if age > UNSEEN_MAX_AGE_US:
            age = UNSEEN_MAX_AGE_US
        return (self.num_routers - 1) * self.send_rate * age if age > 0 else 0.0

    def set_shared(self, others: Sequence[float]) -> None:
        """Several routers: the other routers' new-prefix prompt tokens per rank, as the coordinator's prefix
        directory last counted them (decayed over half a second). Until a snapshot shows the others' work, this
        router's view is its own share of the traffic only; in a burst a router that happened to place more new
        prefixes on one rank than on another would see that rank as busy and spread its later requests of those
        prefixes, while the directory balanced the placements over everyone's. ``shared`` is part of each rank's
        local cost until the next snapshot, which clears it (that snapshot counts the same work)."""
        if len(others) != self.n:
            raise ValueError(f"the directory counted {len(others)} ranks, this router has {self.n}")
        self.shared = list(others)
        self.update_all(resum=False)

    def add_shared(self, i: int, tokens: float) -> None:
        """Another router placed a long new prefix on rank i (``PrefixPlaced``): its tokens join ``shared`` there,
        which the next snapshot clears, or the next directory answer replaces with counts that include them."""
        if i not in self.excluded:
            self.shared[i] += tokens
            self.update(i)

    def update_all(self, *, resum: bool) -> None:
        """Every rank changed (a snapshot, a new weight): recompute all, then the minimum once."""
        for i in range(self.n):
            self._set(i)
        if resum:
            self.load_total = sum(self.load)  # the running sum's rounding does not outlive a snapshot
        self.set_cap()
        self.rescan()

    def tick(self, now_us: int) -> None:
        """Advance the clock; every REFRESH_US re-weigh the snapshot terms by their age (H5) and the stall terms."""
        if now_us > self.clock_us:
            self.clock_us = now_us
        if self.weights.stall_tokens_per_s and now_us >= self.stalls.due_us:
            self.stalls.due_us = now_us + REFRESH_US
            if self.stalls.refresh(now_us, self.excluded):
                self.update_all(resum=False)
        self.rotate_phases(now_us)
        if now_us < self.refresh_due_us:
            return
        self.refreshed_at_us = now_us
        self.refresh_due_us = now_us + REFRESH_US
        weight = self.snapshot_weight(now_us)
        stale_mirror = self.snap_at_us is not None and now_us - self.snap_at_us > UNSEEN_MAX_AGE_US \
            and any(self.mirror)
        if stale_mirror:  # no snapshot for a while: what this router sent since the last one is its own history
            self.mirror = [0.0] * self.n
        if weight != self.weight or stale_mirror:
            self.weight = weight
            self.update_all(resum=False)

    def start_decoding(self, f: Routed) -> None:
        """Request ``f`` produced its first token: its prefill leaves ``pending``, its weight joins ``dec_tokens``."""
        f.decoding = True
        r = f.rank
        self.pending[r] -= f.prefill
        self.pending_reqs[r] -= 1
        self.decoding[r] += 1
        self.dec_tokens[r] += f.weight
        if self.stalls.stalled and self.stalls.refresh(self.clock_us, self.excluded):  # it may have been the one
            self.update_all(resum=False)
        else:
            self.update(r)

    def forget(self, f: Routed) -> None:
        """Request ``f`` finished (or its id was reused): its work leaves the rank's counters."""
        r = f.rank
        if f.decoding:
            self.decoding[r] -= 1
            # the weights' float sum goes back to exactly 0 with the last decoding request: no drift over a run
            self.dec_tokens[r] = self.dec_tokens[r] - f.weight if self.decoding[r] else 0.0
        else:
            f.gone = True
            self.pending[r] -= f.prefill
            self.pending_reqs[r] -= 1
            if self.stalls.stalled and self.stalls.refresh(self.clock_us, self.excluded):
                self.update_all(resum=False)
                return
        self.update(r)

    def mark_dead(self, dp_rank: int) -> None:
        """A rank died: it costs infinity, carries no load, and its part of the index is forgotten."""
        self.excluded.add(dp_rank)
        self.base[dp_rank] = self.local[dp_rank] = self.hbase[dp_rank] = self.mbase[dp_rank] = _INF
        self.remote[dp_rank] = 0.0
        self.load_total -= self.load[dp_rank]
        self.load[dp_rank] = 0.0
        self.index.drop_rank(dp_rank)
        self.set_cap()
        self.rescan()

    def mark_alive(self, dp_rank: int) -> None:
        """A dead rank serves again (its node was restarted): its costs and load are computed as for any rank,
        with an empty part of the index (what it held died with it)."""
        self.excluded.discard(dp_rank)
        self._set(dp_rank)
        self.set_cap()
        self.rescan()
