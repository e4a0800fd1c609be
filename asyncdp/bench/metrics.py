"""The metrics of spec routing-bench §6, computed from a run's per-request event log only (C7).

Over the *measured* requests (sent at or after the workload's warm-up) that completed without error:

- TTFT = first-token time − send time (mean, p50, p90, p99); e2e = last-token time − send time (p99);
- TPOT = (e2e − TTFT) / (output tokens − 1), mean over requests with ≥ 2 output tokens;
- goodput = requests meeting the SLO (TTFT ≤ 2 s and TPOT ≤ 100 ms; TTFT only for 1-token outputs) per second
  of the measure window: the span of the measured requests' sends (§6 measures the requests that *arrive* within
  it). So goodput is the offered rate times the SLO attainment, and a rung where every request met the SLO has
  its offered rate as goodput, however long its last answer decodes after the rung's last arrival. Requests all
  sent at once (a burst) have no span: their window is the serving one, below;
- throughput = output tokens per second of the serving window, from the first measured send to the last measured
  token: the rate the cluster worked at, drain included;
- SLO attainment = the share of the measured requests that met the SLO (a failed or unfinished one did not);
- prefix hit rate = Σ cached prompt tokens at first admission / Σ prompt tokens;
- max/mean load ratio = the busiest rank's measured request count over the mean over all ranks;
- preemptions: the ranks' own counter over the whole run;
- the TTFT floor (:func:`ttft_floors`, reported as ``ttft_floor_p99_s`` beside the metrics): per request, the TTFT it
  would have alone on an idle rank with the ideal cache (one rank, infinite cache): the prefill of the tokens no
  cache can hold, in ``max_num_batched_tokens`` chunks, by the cost profile. No policy goes below it, so a gate
  limit under it cannot be met by routing.

On a ladder, each rung is also measured on its own (:func:`rung_request_ids`: the rung's requests after 10 %
warm-up). Percentiles are the nearest-rank kind on the sorted values (``ceil(q·n)``-th), so they are values that occurred
and exact on small logs. Empty sets give 0.0 in :func:`compute`; :func:`reported`, what ``bench routing`` writes,
gives None (JSON null, ``-`` in the tables) instead for a metric no request measured: a run whose requests all failed
once read a TTFT of 0, the best of the table.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from asyncdp.bench.materialise import ideal_hits
from asyncdp.bench.profiles import Profile
from asyncdp.bench.records import Record
from asyncdp.bench.simulate import RequestEvent, RunLog

SLO_TTFT_S = 2.0
SLO_TPOT_S = 0.100
METRIC_KEYS = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s", "e2e_p99_s", "goodput_rps",
               "slo_attainment", "throughput_tok_s", "prefix_hit_rate", "max_mean_load_ratio", "preemptions")
#: for each metric, whether lower is better (latencies, load ratio, preemptions)
LOWER_IS_BETTER = {k: k not in ("goodput_rps", "slo_attainment", "throughput_tok_s", "prefix_hit_rate")
                   for k in METRIC_KEYS}


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` in [0, 1] of ``values``."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def tpot(ev: RequestEvent) -> float | None:
    if ev.output_tokens < 2 or ev.t_first_s is None or ev.t_last_s is None:
        return None
    return (ev.t_last_s - ev.t_first_s) / (ev.output_tokens - 1)


def meets_slo(ev: RequestEvent) -> bool:
    assert ev.t_first_s is not None
    if ev.t_first_s - ev.t_send_s > SLO_TTFT_S:
        return False
    per_token = tpot(ev)
    return per_token is None or per_token <= SLO_TPOT_S


def compute(log: RunLog, only: Collection[int] | None = None) -> dict[str, float]:
    """Every key of :data:`METRIC_KEYS` for ``log`` (see the module docstring); ``only``: just those req_ids
    (one ladder rung). Preemptions are the whole run's either way."""
    measured = [e for e in log.events if e.measured and (only is None or e.req_id in only)]
    done = [e for e in measured if e.error is None and e.t_first_s is not None and e.t_last_s is not None]
    ttft = [e.t_first_s - e.t_send_s for e in done if e.t_first_s is not None]
    e2e = [e.t_last_s - e.t_send_s for e in done if e.t_last_s is not None]
    tpots = [t for t in (tpot(e) for e in done) if t is not None]
    serving = 0.0
    if done:
        serving = max(e.t_last_s or 0.0 for e in done) - min(e.t_send_s for e in done)
    sends = [e.t_send_s for e in measured]
    window = max(sends) - min(sends) if sends else 0.0
    if window <= 0.0:
        window = serving
    prompt = sum(e.prompt_tokens for e in done)
    per_rank = [0] * log.dp_size
    for e in done:
        if 0 <= e.rank < log.dp_size:
            per_rank[e.rank] += 1
    load_mean = mean(per_rank)
    met = sum(1 for e in done if meets_slo(e))
    return {
        "ttft_mean_s": mean(ttft), "ttft_p50_s": percentile(ttft, 0.5), "ttft_p90_s": percentile(ttft, 0.9),
        "ttft_p99_s": percentile(ttft, 0.99), "tpot_mean_s": mean(tpots), "e2e_p99_s": percentile(e2e, 0.99),
        "goodput_rps": met / window if window > 0 else 0.0,
        "slo_attainment": met / len(measured) if measured else 0.0,
        "throughput_tok_s": sum(e.output_tokens for e in done) / serving if serving > 0 else 0.0,
        "prefix_hit_rate": sum(e.cached_tokens for e in done) / prompt if prompt else 0.0,
        "max_mean_load_ratio": max(per_rank) / load_mean if load_mean > 0 else 0.0,
        "preemptions": float(log.preemptions),
    }


#: the metrics that need a measured request to have completed (the others: one to have been measured; preemptions
#: always count)
_NEED_COMPLETED = frozenset(METRIC_KEYS) - {"goodput_rps", "slo_attainment", "preemptions"}


def reported(log: RunLog, only: Collection[int] | None = None) -> dict[str, float | None]:
    """:func:`compute`, with None for each metric that no request measured: those of :data:`_NEED_COMPLETED`
    when no measured request completed (every one failed, say), goodput and SLO attainment when no request was
    measured. A failed request still counts against the SLO, so with measured requests that all failed those
    two read 0, truly."""
    values: dict[str, float | None] = dict(compute(log, only))
    measured = [e for e in log.events if e.measured and (only is None or e.req_id in only)]
    if not any(e.error is None and e.t_first_s is not None and e.t_last_s is not None for e in measured):
        values.update(dict.fromkeys(_NEED_COMPLETED))
    if not measured:
        values.update(goodput_rps=None, slo_attainment=None)
    return values


def first_error(log: RunLog) -> str | None:
    """The error of the first failed request (by req_id), for the report; None when none failed."""
    return next((e.error for e in sorted(log.events, key=lambda e: e.req_id) if e.error is not None), None)


def rung_request_ids(rungs: Sequence[int], warmup_fraction: float = 0.1) -> dict[int, set[int]]:
    """Per ladder rung, the req_ids measured in it (§4.0): the rung's requests (``rungs[i]`` is record i's rung)
    less the first ``warmup_fraction`` of them."""
    members: dict[int, list[int]] = {}
    for req_id, rung in enumerate(rungs):
        members.setdefault(rung, []).append(req_id)
    return {rung: set(ids[int(len(ids) * warmup_fraction):]) for rung, ids in sorted(members.items())}


def summary(log: RunLog) -> dict[str, int]:
    """Counts that say whether the metrics cover the run: requests sent, measured, completed, failed, unsent."""
    return {"sent": len(log.events), "measured": sum(1 for e in log.events if e.measured),
            "completed": sum(1 for e in log.events if e.error is None and e.t_last_s is not None),
            "failed": sum(1 for e in log.events if e.error is not None), "unsent": log.unsent}


def ttft_floors(records: Sequence[Record], profile: Profile, block_size: int) -> dict[int, float]:
    """req_id -> the request's TTFT floor in seconds (module docstring): ``steps·a + b·uncached + d·prompt``
    with ``steps = ceil(uncached / max_num_batched_tokens)`` (at least one), uncached = prompt − ideal hit."""
    out: dict[int, float] = {}
    for rec, hit in zip(records, ideal_hits(records, block_size), strict=True):
        uncached = max(1, rec.input_length - hit)
        steps = max(1, math.ceil(uncached / profile.max_num_batched_tokens))
        ms = steps * profile.a_ms + profile.b_ms_per_token * uncached + profile.d_ms_per_kv_token * rec.input_length
        out[rec.req_id] = ms / 1000.0
    return out


def floor_p99(log: RunLog, floors: dict[int, float], only: Collection[int] | None = None) -> float:
    """p99 of :func:`ttft_floors` over the requests :func:`compute` measures (same selection)."""
    return percentile([floors[e.req_id] for e in log.events if e.measured and e.error is None
                       and e.t_first_s is not None and e.t_last_s is not None and e.req_id in floors
                       and (only is None or e.req_id in only)], 0.99)
