"""A rank's observable state, and the reports it makes from it: outputs to their owners, stats to the clients
(as deltas) and load to the coordinator (spec §8.1).

Theory of operation. :class:`RankState` is what tests and ``/server_info`` read of a rank. :class:`RankReports`
turns a step's outputs and the core's statistics into messages: each ``EngineOutputs`` goes only to the client
that owns its requests (``RankState.owners``, filled by ``AddRequest``, emptied as requests finish) through
:meth:`~asyncdp.engine.rank_links.RankLinks.post_nowait`; the scheduler stats ride on exactly one client message
per step, with the cumulative counters as deltas since the previous attached stats, so the deltas partition the
totals and API processes can sum them; when the queue changed and no output carried it (requests queued while
paused, a prompt still prefilling), ``refresh_client_stats`` sends them alone to the first client whose link is not cut.
``load_report`` says which ``RankStats`` the coordinator needs: only when
(running, waiting) or the prompt tokens still to compute changed, KV usage moved by at least
:data:`KV_USAGE_PUBLISH_DELTA`, or the prefix cache's fill by :data:`CACHE_FILL_PUBLISH_DELTA`; MoE ranks stamp the
wave step and wave from the lockstep state.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from asyncdp import messages as m

if TYPE_CHECKING:
    from asyncdp.dp.lockstep import Lockstep
    from asyncdp.engine.core import EngineCore
    from asyncdp.engine.rank_links import RankLinks

log = logging.getLogger("asyncdp.engine.rank")  # the role's one log name

KV_USAGE_PUBLISH_DELTA = 0.01
CACHE_FILL_PUBLISH_DELTA = 0.01  # the cache fills slowly: a report at each 1 % (a few hundred blocks) is plenty


@dataclass
class RankState:
    """Observable state of a rank, for tests and /server_info."""

    steps: int = 0
    dummy_steps: int = 0
    waves_completed: int = 0
    shutting_down: bool = False
    dead_reason: str | None = None
    last_stats: tuple[int, int, float, int, float] | None = None
    # The cumulative counters as of the last stats attached to a client message: attached stats carry deltas.
    attached_counters: tuple[int, ...] = (0, 0, 0, 0, 0)
    # (running, waiting, KV usage) of the last stats attached to a client message: what the clients' gauges show.
    attached_gauges: tuple[int, int, float] = (0, 0, 0.0)
    owners: dict[str, int] = field(default_factory=dict)
    # The drain deadline passed and the rank aborted what it still had: each such ``abort`` goes out as an error
    # (``error_type="abandoned"``), so a client that is not shutting down itself answers 503 naming the rank,
    # never a 200 cut short. (Nothing is admitted while shutting down, so every later abort is one of those.)
    drain_expired: bool = False
    # Why this rank abandons every request from now on (its drain deadline passed, or its MoE group ended): each
    # ``abort`` it reports without an error of its own goes out as ``abandoned`` with this reason.
    abandon_reason: str | None = None
    # Admitted requests whose client has seen nothing yet (no output dispatched): an ended MoE group refuses them.
    unanswered: set[str] = field(default_factory=set)


class RankReports:
    def __init__(self, dp_rank: int, core: EngineCore, state: RankState, links: RankLinks,
                 lockstep: Lockstep | None) -> None:
        self.dp_rank = dp_rank
        self.core = core
        self.state = state
        self.links = links
        self.lockstep = lockstep  # MoE with dp > 1: the wave fields come from here

    def scheduler_stats(self) -> m.SchedulerStats:
        stats = self.core.stats()
        ls = self.lockstep
        if ls is None:
            return stats
        return msgspec.structs.replace(
            stats, step=ls.step_counter, wave=ls.current_wave, wave_running=ls.engines_running,
            num_dummy_steps=self.state.dummy_steps, waves_completed=self.state.waves_completed)

    def attach_stats(self) -> m.SchedulerStats:
        """Stats for one client message: the counters are deltas since the previous attached stats."""
        s = self.scheduler_stats()
        now = (s.prefix_cache_queries, s.prefix_cache_hits, s.num_preemptions, s.num_dummy_steps, s.waves_completed)
        q, h, p, d, w = (a - b for a, b in zip(now, self.state.attached_counters, strict=True))
        self.state.attached_counters = now
        self.state.attached_gauges = (s.num_running, s.num_waiting, s.kv_cache_usage)
        return msgspec.structs.replace(s, prefix_cache_queries=q, prefix_cache_hits=h, num_preemptions=p,
                                       num_dummy_steps=d, waves_completed=w)

    def dispatch_outputs(self, outputs: list[m.RequestOutput]) -> None:
        """One ``EngineOutputs`` per owning client; the first of them carries the attached stats."""
        per_client: dict[int, tuple[list[m.RequestOutput], list[str]]] = {}
        owners = self.state.owners
        unanswered = self.state.unanswered
        for out in outputs:
            ci = owners.get(out.request_id)
            if ci is None:
                continue
            unanswered.discard(out.request_id)
            outs, finished = per_client.setdefault(ci, ([], []))
            if out.finished:
                finished.append(out.request_id)
                del owners[out.request_id]
                reason = self.state.abandon_reason
                if reason is not None and out.finish_reason == "abort" and out.error_type is None:
                    out = msgspec.structs.replace(out, error_type="abandoned", error=reason)
            outs.append(out)
        if not per_client:
            return
        stats = self.attach_stats()
        stats_to = next(iter(per_client))
        now = time.time()
        for ci, (outs, finished) in per_client.items():
            self.links.post_nowait(ci, m.EngineOutputs(
                dp_rank=self.dp_rank, outputs=outs, finished_request_ids=finished,
                scheduler_stats=stats if ci == stats_to else None, timestamp=now))

    def reject(self, msg: m.AddRequest, reason: str, error_type: str, *, field: str | None = None) -> None:
        """A request this rank refused at admission: one finished ``abort`` carrying the error, to its client."""
        self.refuse(msg.request_id, msg.client_index, reason, error_type, field=field)

    def refuse(self, request_id: str, client_index: int, reason: str, error_type: str, *,
               field: str | None = None) -> None:
        """Refuse a request its client has seen nothing of (at admission, or as its MoE group ended)."""
        log.info("rank %d: rejecting %s: %s", self.dp_rank, request_id, reason)
        self.links.post_nowait(client_index, m.EngineOutputs(
            dp_rank=self.dp_rank,
            outputs=[m.RequestOutput(request_id=request_id, finished=True, finish_reason="abort",
                                     error_type=error_type, error=reason, error_field=field)],
            finished_request_ids=[request_id], scheduler_stats=None, timestamp=time.time()))

    def send_stats_to_client(self) -> None:
        """``scheduler_stats`` alone, to the first client whose link is not cut: after wave transitions, and when
        the queue changed with no output to carry it. Nothing is taken (no counter delta) when no client is left."""
        client_index = self.links.live_stats_client()
        if client_index is None:
            return
        self.links.post_nowait(client_index, m.EngineOutputs(
            dp_rank=self.dp_rank, outputs=[], finished_request_ids=[],
            scheduler_stats=self.attach_stats(), timestamp=time.time()))

    def refresh_client_stats(self, s: m.SchedulerStats) -> None:
        """Stats alone to a live client when the clients' gauges went stale: running or waiting changed, or KV
        usage moved by :data:`KV_USAGE_PUBLISH_DELTA`, since the last attached stats, and no output carried the
        change (requests queued while paused, a long prompt still prefilling, aborts of queued requests)."""
        running, waiting, kv = self.state.attached_gauges
        if (s.num_running, s.num_waiting) != (running, waiting) or abs(s.kv_cache_usage - kv) >= KV_USAGE_PUBLISH_DELTA:
            self.send_stats_to_client()

    def load_report(self, s: m.SchedulerStats | None = None) -> m.RankStats | None:
        """The ``RankStats`` the coordinator needs now (``s``: the stats just read, if any), or None when the load
        did not change enough."""
        s = self.scheduler_stats() if s is None else s
        kv = s.kv_cache_usage
        last = self.state.last_stats
        fill = s.cache_fill
        if last is not None and last[0] == s.num_running and last[1] == s.num_waiting and abs(
            last[2] - kv
        ) < KV_USAGE_PUBLISH_DELTA:
            fill_moved = abs(last[4] - fill) >= CACHE_FILL_PUBLISH_DELTA
            if last[3] == s.prefill_tokens and not fill_moved:
                return None
            # Only the prompt tokens or the cache's fill moved: the report repeats the KV usage last reported, so
            # that the coordinator sees no change of the counts (its publish schedule stays theirs) and the 0.01
            # rule still measures from the last reported usage; likewise the fill's.
            kv = last[2]
            if not fill_moved:
                fill = last[4]
        self.state.last_stats = (s.num_running, s.num_waiting, kv, s.prefill_tokens, fill)
        return m.RankStats(dp_rank=self.dp_rank, num_waiting=s.num_waiting, num_running=s.num_running,
                           kv_cache_usage=kv, step=s.step, wave=s.wave, prefill_tokens=s.prefill_tokens,
                           cache_fill=fill)
