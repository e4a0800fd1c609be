"""``GET /load``: the compact per-rank load document for external routers (the telemetry contract).

Theory of operation
-------------------
A router in front of asyncdp endpoints (hybrid nodes, external rank servers, a multi-port supervisor's children)
needs the load each endpoint's ranks carry, cheaply and often (every 50 ms). :class:`LoadView` keeps, per
managed rank, the newest of two sources and when it arrived:

* the coordinator's ``StatsSnapshot`` (``[waiting, running, kv_cache_usage]`` of every rank and their prompt
  tokens still to compute, the same numbers the balancer reads; absent in external mode, where engines send no
  ``RankStats``; and, MoE, the group's wave and whether it runs, which every rank of the lockstep group shares);
* the engine's own ``SchedulerStats``, attached to its outputs (waiting, running, KV usage, prompt tokens still to
  compute, the prefix-cache counters, the rank's wave and whether it steps). The counters arrive as deltas and are summed here, so with
  several API processes on a node each one reports the share its own outputs carried.

A rank attaches its stats to one API process's messages at a time, and a wave's end reaches only one of them that
way (the rank has no output left to carry it): the coordinator's snapshot, which every API process follows,
brings the wave's end to the others, so no ``/load`` keeps a finished wave running.

Every update bumps ``seq`` (monotonic for the life of the API process), so a poller sees at once whether anything
changed; ``age_s`` is the age of the newest data. :meth:`LoadView.document` builds the JSON from the state with
no I/O (``now`` comes in), cheap enough to serve at any poll rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncdp import messages as m
from asyncdp.apiserver.client_config import ClientConfig


@dataclass
class _RankLoad:
    waiting: int = 0
    running: int = 0
    kv_cache_usage: float = 0.0
    prefill_tokens: int = 0
    cache_fill: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    wave: int = 0
    wave_running: bool = False
    updated_at: float | None = None


@dataclass
class LoadView:
    managed_ranks: tuple[int, ...]
    is_moe: bool = False  # the snapshots' wave applies to every rank (lockstep); dense ranks have none
    seq: int = 0
    coordinator_seq: int | None = None
    coordinator_at: float | None = None
    ranks: dict[int, _RankLoad] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ranks = {r: _RankLoad() for r in self.managed_ranks}

    def on_snapshot(self, snap: m.StatsSnapshot, now: float) -> None:
        """A coordinator snapshot: the managed ranks' counts (all N ranks come, in global order) and, MoE, the
        group's wave."""
        self.seq += 1
        self.coordinator_seq = snap.seq
        self.coordinator_at = now
        if self.is_moe:
            for load in self.ranks.values():
                load.wave, load.wave_running = snap.wave, snap.running
        if snap.counts is None:
            return
        for rank, load in self.ranks.items():
            if rank < len(snap.counts):
                load.waiting, load.running, load.kv_cache_usage = (int(snap.counts[rank][0]),
                                                                   int(snap.counts[rank][1]),
                                                                   float(snap.counts[rank][2]))
                if snap.prefill_tokens is not None and rank < len(snap.prefill_tokens):
                    load.prefill_tokens = int(snap.prefill_tokens[rank])
                if snap.cache_fill is not None and rank < len(snap.cache_fill):
                    load.cache_fill = float(snap.cache_fill[rank])
                load.updated_at = now

    def on_scheduler_stats(self, rank: int, stats: m.SchedulerStats, now: float) -> None:
        """One engine step's stats, as the rank attached them to this client's outputs."""
        load = self.ranks.get(rank)
        if load is None:
            return
        self.seq += 1
        load.waiting, load.running, load.kv_cache_usage = stats.num_waiting, stats.num_running, stats.kv_cache_usage
        load.prefill_tokens = stats.prefill_tokens
        load.cache_fill = stats.cache_fill
        load.prefix_cache_queries += stats.prefix_cache_queries
        load.prefix_cache_hits += stats.prefix_cache_hits
        load.wave, load.wave_running = stats.wave, stats.wave_running
        load.updated_at = now

    def document(self, cfg: ClientConfig, engine_states: dict[int, tuple[bool, float]], *, now: float, wave: int,
                 wave_running: bool, inflight_of: Callable[[int], int]) -> dict[str, Any]:
        """The JSON; ``engine_states``: per rank that sent EngineReady, (alive, last heard)."""
        newest = max((t for t in [self.coordinator_at, *(r.updated_at for r in self.ranks.values())]
                      if t is not None), default=None)
        ranks = []
        for index, rank in enumerate(self.managed_ranks):
            load = self.ranks[rank]
            ranks.append({
                "dp_rank": rank, "local_index": index, "up": engine_states.get(rank, (False, 0.0))[0], "waiting": load.waiting,
                "running": load.running, "kv_cache_usage": round(load.kv_cache_usage, 4),
                "prefill_tokens": load.prefill_tokens, "cache_fill": round(load.cache_fill, 4),
                "prefix_cache_queries": load.prefix_cache_queries, "prefix_cache_hits": load.prefix_cache_hits,
                "inflight": inflight_of(rank), "wave": load.wave, "wave_running": load.wave_running,
                "age_s": None if load.updated_at is None else round(now - load.updated_at, 3)})
        return {
            "seq": self.seq,
            "age_s": None if newest is None else round(now - newest, 3),
            "mode": cfg.mode, "dp_size": cfg.dp_size, "api_process_rank": cfg.client_index,
            "api_process_count": cfg.client_count,
            "wave": {"current": wave, "running": wave_running} if cfg.is_moe else None,
            "coordinator": None if self.coordinator_seq is None else {
                "seq": self.coordinator_seq,
                "age_s": None if self.coordinator_at is None else round(now - self.coordinator_at, 3)},
            "ranks": ranks,
        }
