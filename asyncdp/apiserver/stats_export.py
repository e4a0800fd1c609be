"""What the DP client exports to ``/metrics`` from the engines' outputs: per-rank gauges, token counts and
per-token latencies as tokens arrive, and request metrics for the requests their engine finished.

Gauges are set as of the engine's timestamp on the message (several API processes apply a rank's reports in no
agreed order: the newest by the rank's clock must win); counters arrive as deltas since the rank last attached
stats to any client (see ``SchedulerStats``), so adding them here keeps the sum over API processes exact. Plain
functions over a :class:`asyncdp.api.metrics.Metrics`; the client calls them and owns nothing else here.
"""

from __future__ import annotations

from typing import Any

from asyncdp import messages as m
from asyncdp.apiserver.request_stream import RequestStream


def export_scheduler_stats(metrics: Any, rank: int, s: m.SchedulerStats, is_moe: bool, at: float) -> None:
    """``at``: the engine's timestamp on the message that carried ``s``."""
    metrics.set_engine_state(rank, s.num_running, s.num_waiting, s.kv_cache_usage, at=at)
    metrics.add_engine_counters(rank, preemptions=s.num_preemptions, prefix_cache_queries=s.prefix_cache_queries,
                                prefix_cache_hits=s.prefix_cache_hits)
    if is_moe:
        metrics.set_wave(rank, s.wave, s.wave_running, at=at)
        if s.num_dummy_steps:
            metrics.add_dummy_steps(rank, s.num_dummy_steps)
        if s.waves_completed:
            metrics.inc_waves_completed(rank, s.waves_completed)


def observe_tokens(metrics: Any, rank: int, requests: dict[str, RequestStream], msg: m.EngineOutputs,
                   now: float) -> None:
    """Count the frame's tokens as they arrive (before :func:`apply_outputs` posts it): a request's prompt and
    its time to first token with its first token, then one inter-token gap per token. Every request counts,
    whether it later finishes, fails or is abandoned: these are the tokens the engine computed and delivered. A
    frame with outputs is one engine step's share for this client: its tokens are one ``iteration_tokens``."""
    prompt = generated = 0
    for out in msg.outputs:
        n = len(out.new_token_ids)
        req = requests.get(out.request_id) if n else None
        if req is None:
            continue
        generated += n
        if req.first_token_at is None:
            prompt += req.num_prompt_tokens
            metrics.record_first_token(rank, now - req.arrival)
        elif req.last_token_at is not None:
            metrics.record_token_gaps(rank, (now - req.last_token_at) / n, n)
    if prompt or generated:
        metrics.add_tokens(rank, prompt, generated)
    if msg.outputs:
        metrics.record_iteration_tokens(rank, prompt + generated)


def record_finished(metrics: Any, rank: int, req: RequestStream, now: float) -> None:
    """Count a request its engine finished for its caller, as vLLM counts the requests whose last output reaches
    its output processor: with an answer, or with ``error`` (a grammar that failed mid-generation, which vLLM
    counts under its ``FinishReason.ERROR``; the caller gets a 400); not one refused at admission or abandoned
    (``req.error`` with another reason), nor one whose caller left (``client_abort``). The last sequence of a
    prompt to finish also observes its group (vLLM's parent request: ``n`` and the longest output)."""
    if req.client_abort or (req.error is not None and req.finish_reason != "error"):
        return
    first, last = req.first_token_at, req.last_token_at
    decode_s = 0.0 if first is None or last is None else last - first
    # Prefill: the time to first token less the rank's queue time (the links' transit included, a few ms at most).
    prefill_s = None if first is None or req.queue_s is None else max(0.0, first - req.arrival - req.queue_s)
    metrics.record_request_finished(rank, req.finish_reason or "abort", now - req.arrival, req.queue_s,
                                    prompt_tokens=req.num_prompt_tokens, generation_tokens=req.num_generated,
                                    decode_s=decode_s, prefill_s=prefill_s, max_tokens=req.max_tokens)
    group = req.group
    if group is None:
        metrics.record_sequence_group(rank, 1, req.num_generated)
    elif group.finish(req.num_generated):
        metrics.record_sequence_group(rank, group.n, group.max_generation_tokens)


def refresh_coordinator_gauges(metrics: Any, coordinator_state: str, snapshot_age_s: float | None) -> None:
    """At scrape time: the snapshot's real age (it keeps growing once the coordinator is gone) and whether the
    coordinator is followed (``asyncdp:dp_coordinator_up``: 1 only while ``alive``)."""
    if coordinator_state == "none":
        return
    if snapshot_age_s is not None:
        metrics.set_snapshot_age(snapshot_age_s)
    metrics.set_coordinator_up(coordinator_state == "alive")
