"""What the DP client exports to ``/metrics`` from the engines' outputs: per-rank gauges and request metrics.

Gauges are set; counters arrive as deltas since the rank last attached stats to any client (see
``SchedulerStats``), so adding them here keeps the sum over API processes exact. Plain functions over a
:class:`asyncdp.api.metrics.Metrics`; the client calls them and owns nothing else here.
"""

from __future__ import annotations

from typing import Any

from asyncdp import messages as m
from asyncdp.apiserver.request_stream import RequestStream


def export_scheduler_stats(metrics: Any, rank: int, s: m.SchedulerStats, is_moe: bool) -> None:
    metrics.set_engine_state(rank, s.num_running, s.num_waiting, s.kv_cache_usage)
    metrics.add_engine_counters(rank, preemptions=s.num_preemptions, prefix_cache_queries=s.prefix_cache_queries,
                                prefix_cache_hits=s.prefix_cache_hits)
    if is_moe:
        metrics.set_wave(rank, s.wave, s.wave_running)
        if s.num_dummy_steps:
            metrics.add_dummy_steps(rank, s.num_dummy_steps)
        if s.waves_completed:
            metrics.inc_waves_completed(rank, s.waves_completed)


def record_finished(metrics: Any, rank: int, req: RequestStream, msg: m.EngineOutputs, now: float) -> None:
    reason = "abort"
    for out in msg.outputs:
        if out.request_id == req.request_id and out.finish_reason:
            reason = out.finish_reason
    metrics.record_request_finished(
        engine=rank,
        finished_reason=reason,
        prompt_tokens=req.num_prompt_tokens,
        generation_tokens=req.num_generated,
        ttft_s=None if req.first_token_at is None else req.first_token_at - req.arrival,
        itls_s=req.itls_s,
        e2e_s=now - req.arrival,
    )


def refresh_coordinator_gauges(metrics: Any, coordinator_state: str, snapshot_age_s: float | None) -> None:
    """At scrape time: the snapshot's real age (it keeps growing once the coordinator is gone) and whether the
    coordinator is followed (``asyncdp:dp_coordinator_up``: 1 only while ``alive``)."""
    if coordinator_state == "none":
        return
    if snapshot_age_s is not None:
        metrics.set_snapshot_age(snapshot_age_s)
    metrics.set_coordinator_up(coordinator_state == "alive")
