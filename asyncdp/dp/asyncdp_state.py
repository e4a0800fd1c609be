"""One router's state under asyncdp's policy (:mod:`.asyncdp_policy`): the per-rank cost ledger and its upkeep.

The policy's hooks change the counters (``pending``, ``decoding``, the snapshot's ``others`` and ``kv``) and then
call :meth:`AsyncdpState.update` for the rank they touched; ``update`` recomputes that rank's ``base`` cost and
in-flight ``load`` from the :class:`CostWeights`, and keeps what ``select`` reads instead of scanning every rank:
the minimum of ``base``, its first rank, how many ranks share it (O(1) per change but when the last rank at the
minimum leaves it, then one C-level rescan), and the hot-spot bound on ``load`` (H3). A snapshot or a new decay
weight changes every rank: :meth:`update_all` recomputes them all and rescans once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from asyncdp.dp.owner_index import OwnerIndex
from asyncdp.dp.policy import Decision

KV_HIGH = 0.9
REFRESH_US = 50_000  # the snapshot terms are re-weighed by their age at most this often (H5)
REPLICA_SLACK = 1.0  # [ours] in-flight requests past the mean before a hot prefix gets another holder (H3)
_INF = float("inf")


@dataclass(frozen=True, slots=True)
class CostWeights:
    """The policy's knobs that price a rank (module docstring of :mod:`.asyncdp_policy`)."""

    decode_tokens: float
    kv_penalty_tokens: float
    memory_tokens: float
    hot_ratio: float
    hot_slack: float
    replica_headroom: float = 0.0  # 0: no deliberate replicas


@dataclass(slots=True)
class Routed:
    """One request this router sent, until it finishes."""

    rank: int
    prefill: int  # tokens counted in pending[rank] until the first token
    decoding: bool = False


@dataclass(slots=True)
class PrefixRates:
    """How often this router's recent requests began with each first block (H3's "hotter than one rank"): a count
    per first-block hash that every dispatch multiplies by ``1 - 1/window``, so ``count/window`` is the share of
    about the last ``window`` requests. Entries that decayed below half a request are dropped when the dict grows
    past ``4·window``: it stays bounded by the prefixes that are actually recent."""

    window: float = 256.0
    seq: int = 0  # dispatches counted
    counts: dict[int, tuple[float, int]] = field(default_factory=dict)  # hash -> (count, seq when last bumped)

    def bump(self, h: int) -> None:
        self.seq += 1
        decay = 1.0 - 1.0 / self.window
        old = self.counts.get(h)
        self.counts[h] = (1.0 if old is None else old[0] * decay ** (self.seq - old[1]) + 1.0, self.seq)
        if len(self.counts) > 4 * self.window:
            seq = self.seq
            for k in [k for k, (c, at) in self.counts.items() if c * decay ** (seq - at) < 0.5]:
                del self.counts[k]

    def share(self, h: int) -> float:
        """The fraction of about the last ``window`` requests that began with ``h``."""
        entry = self.counts.get(h)
        if entry is None:
            return 0.0
        return entry[0] * (1.0 - 1.0 / self.window) ** (self.seq - entry[1]) / self.window


@dataclass(slots=True)
class AsyncdpState:
    n: int
    num_routers: int
    block_size: int
    stale_us: float
    weights: CostWeights
    base: list[float]
    pending: list[int]
    pending_reqs: list[int]
    decoding: list[int]
    others_tok: list[float]
    others_cnt: list[int]
    kv: list[float]
    load: list[float]  # estimated in-flight requests (mine + others, weighted), for the hot-spot bound
    local: list[float]  # base = local + weight·remote (see _terms)
    remote: list[float]
    memory: list[float]  # the memory term of local: holders of a prompt's whole run are compared without it
    hbase: list[float]  # base - memory, what those holders compare
    index: OwnerIndex
    rates: PrefixRates
    load_total: float = 0.0  # sum(load), kept by update (recomputed on every snapshot: no drift)
    cap: float = 0.0  # the hot-spot bound on load (H3), kept with load_total
    mean_load: float = 0.0  # load_total over the live ranks, kept with cap
    spill: set[int] = field(default_factory=set)  # first blocks whose next request makes a replica (mark_spill)
    shared: list[float] = field(default_factory=list)  # the other routers' new-prefix tokens: set_shared()
    # min(base), its first index, how many ranks share it: kept by update, so select reads them
    best: float = 0.0
    pick: int = 0
    ties: int = 0
    decisions: tuple[Decision, ...] = ()
    reqs: dict[str, Routed] = field(default_factory=dict)
    excluded: set[int] = field(default_factory=set)
    weight: float = 0.0  # the snapshot terms' weight (decays with age)
    snap_at_us: int | None = None
    clock_us: int = 0  # the latest time any hook saw (snapshots carry none in production)
    refreshed_at_us: int = 0
    refresh_due_us: float = _INF  # refreshed_at_us + REFRESH_US once a snapshot came
    avg_prefill: float = 0.0  # EMA of the uncached tokens per request this router sent

    @classmethod
    def empty(cls, n: int, num_routers: int, block_size: int, stale_us: float, weights: CostWeights,
              capacity_blocks: int) -> AsyncdpState:
        state = cls(n, num_routers, block_size, stale_us, weights, [0.0] * n, [0] * n, [0] * n, [0] * n,
                    [0.0] * n, [0] * n, [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n,
                    OwnerIndex.empty(n, capacity_blocks), PrefixRates(), shared=[0.0] * n,
                    decisions=tuple(Decision(i) for i in range(n)))
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
        memory = w.memory_tokens * self.index.size(i) / self.index.capacity if w.memory_tokens else 0.0
        self.memory[i] = memory
        local = self.pending[i] + w.decode_tokens * self.decoding[i] + memory + self.shared[i]
        return local, self.others_tok[i] + kv_pen

    def costs_at(self, weight: float) -> list[float]:
        """Every rank's base cost with the snapshot terms at another ``weight`` (one pass, no method calls)."""
        return [lo + weight * re for lo, re in zip(self.local, self.remote, strict=True)]

    def snapshot_weight(self, now_us: int) -> float:
        """The snapshot terms' weight: 1 when fresh, linearly down to 0 at the staleness threshold (H5)."""
        if self.snap_at_us is None:
            return 0.0
        return max(0.0, 1.0 - max(0, now_us - self.snap_at_us) / self.stale_us)

    def _set(self, i: int) -> None:
        """Recompute rank i's base cost and load (the minimum and the bound are the caller's)."""
        lo, re = self._terms(i)
        self.local[i], self.remote[i] = lo, re
        self.base[i] = lo + self.weight * re
        self.hbase[i] = self.base[i] - self.memory[i]
        load = 0.0 if i in self.excluded else (
            self.pending_reqs[i] + self.decoding[i] + self.weight * self.others_cnt[i])
        self.load_total += load - self.load[i]
        self.load[i] = load

    def set_cap(self) -> None:
        mean = self.mean_load = self.load_total / (self.n - len(self.excluded) or 1)
        w = self.weights
        self.cap = max(w.hot_ratio * mean, mean + w.hot_slack)

    def rescan(self) -> None:
        base = self.base
        best = self.best = min(base)
        self.pick, self.ties = base.index(best), base.count(best)

    def update(self, i: int) -> None:
        """Rank i changed: recompute its cost, and keep the minimum, its first index and its ties (mostly O(1))."""
        old = self.base[i]
        self._set(i)
        self.set_cap()
        new = self.base[i]
        if new == old:
            return
        best = self.best
        if new < best:
            self.best, self.pick, self.ties = new, i, 1
        elif new == best:
            self.ties += 1
            if i < self.pick:
                self.pick = i
        elif old == best:  # rank i left the minimum
            self.ties -= 1
            if self.ties == 0:
                self.rescan()
            elif self.pick == i:
                self.pick = self.base.index(best)

    def mark_spill(self, first: int, rank: int) -> None:
        """After a dispatch to ``rank`` of a prompt starting with block ``first``: mark the prefix for a replica
        (H3), so that its next request goes to the cheapest rank by load instead of a holder, when it began more
        than ``1/(alive·headroom)`` of the recent requests (:class:`PrefixRates`), fewer ranks than
        ``share·alive·headroom`` hold it, and the rank it went to is now past the mean in-flight count by
        ``REPLICA_SLACK``; unmark it otherwise. The hooks decide, so that ``select`` pays one set lookup (G7)."""
        scale = (self.n - len(self.excluded)) * self.weights.replica_headroom  # share -> holders wanted
        want = self.rates.share(first) * scale
        if want > 1.0 and self.index.owners.get(first, 0).bit_count() < want \
                and self.load[rank] > self.mean_load + REPLICA_SLACK:
            self.spill.add(first)
            if len(self.spill) > 2 * scale + 8:  # marks of prefixes gone cold
                self.spill = {h for h in self.spill if self.rates.share(h) * scale > 1.0}
        else:
            self.spill.discard(first)

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

    def update_all(self, *, resum: bool) -> None:
        """Every rank changed (a snapshot, a new weight): recompute all, then the minimum once."""
        for i in range(self.n):
            self._set(i)
        if resum:
            self.load_total = sum(self.load)  # the running sum's rounding does not outlive a snapshot
        self.set_cap()
        self.rescan()

    def tick(self, now_us: int) -> None:
        """Advance the clock; every REFRESH_US re-weigh the snapshot terms by their age (H5)."""
        if now_us > self.clock_us:
            self.clock_us = now_us
        if now_us < self.refresh_due_us:
            return
        self.refreshed_at_us = now_us
        self.refresh_due_us = now_us + REFRESH_US
        weight = self.snapshot_weight(now_us)
        if weight != self.weight:
            self.weight = weight
            self.update_all(resum=False)

    def mark_dead(self, dp_rank: int) -> None:
        """A rank died: it costs infinity, carries no load, and its part of the index is forgotten."""
        self.excluded.add(dp_rank)
        self.base[dp_rank] = self.local[dp_rank] = self.hbase[dp_rank] = _INF
        self.remote[dp_rank] = 0.0
        self.load_total -= self.load[dp_rank]
        self.load[dp_rank] = 0.0
        self.index.drop_rank(dp_rank)
        self.set_cap()
        self.rescan()
