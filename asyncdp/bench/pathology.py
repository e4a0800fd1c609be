"""The §8 pathology detectors of spec routing-bench, computed from a run's event log only (C7), and gate G5.

Each detector is a signal with a threshold; the pathology *shows* when the signal is above it. Every detector
runs on every policy, on the workload families of its §8 row (:data:`DETECTORS`: ``families``), over the
measured requests that completed:

- ``hotspot``: the time average, over 1 s virtual samples while at least 2·dp requests are in flight, of the busiest rank's
  outstanding requests (sent, last token not yet seen: ``waiting + running`` as the client sees it) over the
  mean; threshold 2 (rows "stale metrics herd", "prefix hot-spotting", "several routers herd");
- ``miss_share``: the share of cache misses (requests whose cached prompt tokens are under half the prompt) that
  landed on the rank with the most misses, with at least 4·dp misses and dp ≥ 3; threshold 0.5 (rows "miss
  death-spiral", "no load guards");
- ``request_skew``: per-rank requests, max / mean; threshold 2 ("miss death-spiral", "all long prefills go to the
  first worker");
- ``token_skew``: per-rank prompt tokens, max / mean, counted only while requests are balanced (request max/mean
  ≤ 1.2, else 0); threshold 1.5 ("request-count balance ignores tokens");
- ``sticky_loss``: 1 − hit rate / ideal hit rate (the workload's one-rank infinite-cache hit); threshold 0.5
  ("tie rotation or random ties break prefix stickiness");
- ``late_collapse``: 1 − (hit rate over rounds ≥ 4) / (hit rate of round 2) (rounds numbered from 1); threshold
  0.5 ("late-round hit collapse", sgl-project/sglang#32195);
- ``cold_start``: the share of the opening burst (requests sent at the first instant, at least 2·dp of them) on
  one rank; threshold 0.5 ("cold start sends everything to rank 0").

Not detected here: the 6/4 tie split on DP=2 and the index-versus-engine disagreement (tests reproduce the first;
the simulator delivers no KV events for the second) and the long-generation drift (it needs the 1 h W6 variant).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asyncdp.bench.simulate import RequestEvent, RunLog

SAMPLE_S = 1.0
MISS_FRACTION = 0.5


@dataclass(frozen=True, slots=True)
class Detector:
    name: str
    threshold: float
    families: tuple[str, ...]
    row: str


DETECTORS = (
    Detector("hotspot", 2.0, ("w1", "w2", "w6", "w7", "w9"), "hot-spotting / herding"),
    Detector("miss_share", 0.5, ("w1", "w6"), "miss death-spiral / no load guards"),
    Detector("request_skew", 2.0, ("w1", "w6", "w8"), "requests piled on one rank"),
    Detector("token_skew", 1.5, ("w8",), "request-count balance ignores tokens"),
    Detector("sticky_loss", 0.5, ("w4", "w5"), "ties break prefix stickiness"),
    Detector("late_collapse", 0.5, ("w4",), "late-round hit collapse"),
    Detector("cold_start", 0.5, ("w9",), "cold start sends the first burst to one rank"),
)


def completed(log: RunLog) -> list[RequestEvent]:
    """The requests the detectors (and the load samples) count: measured, completed without error, on a rank."""
    return [e for e in log.events if e.measured and e.error is None and e.t_first_s is not None
            and e.t_last_s is not None and 0 <= e.rank < log.dp_size]


@dataclass(frozen=True, slots=True)
class LoadSamples:
    """Outstanding requests per rank at each sample: ``per_rank[rank][k]`` at ``times_s[k]``."""

    times_s: tuple[float, ...]
    per_rank: tuple[tuple[int, ...], ...]


def outstanding_samples(log: RunLog, period_s: float = SAMPLE_S) -> LoadSamples:
    """Every ``period_s`` of virtual time from the first send to the last token, each rank's outstanding
    requests (sent at or before the sample, last token after it) among the measured requests that completed.
    At the default period these are the samples the hot-spot detector averages (it keeps those with ≥ 2·dp in
    flight); the heatmaps of :mod:`~asyncdp.bench.plots` draw them."""
    edges: list[tuple[float, int, int]] = []
    for e in completed(log):
        assert e.t_last_s is not None
        edges += [(e.t_send_s, 1, e.rank), (e.t_last_s, -1, e.rank)]
    if not edges:
        return LoadSamples((), tuple(() for _ in range(log.dp_size)))
    edges.sort(key=lambda x: (x[0], x[1]))
    t_end = edges[-1][0]
    out = [0] * log.dp_size
    times: list[float] = []
    rows: list[list[int]] = [[] for _ in range(log.dp_size)]
    k, t = 0, edges[0][0]
    while t <= t_end:
        while k < len(edges) and edges[k][0] <= t:
            out[edges[k][2]] += edges[k][1]
            k += 1
        times.append(t)
        for rank, count in enumerate(out):
            rows[rank].append(count)
        t += period_s  # accumulated, as the detector does, so the samples are the same instants
    return LoadSamples(tuple(times), tuple(tuple(r) for r in rows))


def _ratio(values: Sequence[float]) -> float:
    m = sum(values) / len(values) if values else 0.0
    return max(values) / m if m > 0 else 0.0


def hotspot(log: RunLog) -> float:
    samples = outstanding_samples(log)
    ratios = []
    for counts in zip(*samples.per_rank, strict=True):
        if sum(counts) >= 2 * log.dp_size:  # below that a rank cannot be "hot": 1 request on 4 ranks reads 4
            ratios.append(_ratio(counts))
    return sum(ratios) / len(ratios) if ratios else 0.0


def signals(log: RunLog, ideal_hit_rate: float = 0.0) -> dict[str, float]:
    """Every detector's signal for one run (module docstring), rounded for stable JSON."""
    done = completed(log)
    n = log.dp_size
    reqs = [0] * n
    toks = [0] * n
    misses = [0] * n
    for e in done:
        reqs[e.rank] += 1
        toks[e.rank] += e.prompt_tokens
        if e.cached_tokens < MISS_FRACTION * e.prompt_tokens:
            misses[e.rank] += 1
    req_ratio = _ratio(reqs)
    miss_share = max(misses) / sum(misses) if n >= 3 and sum(misses) >= 4 * n else 0.0
    prompt = sum(e.prompt_tokens for e in done)
    hit = sum(e.cached_tokens for e in done) / prompt if prompt else 0.0
    sticky = 1.0 - hit / ideal_hit_rate if ideal_hit_rate > 0 else 0.0
    late = 0.0
    by_round: dict[int, list[int]] = {}
    for e in done:
        c = by_round.setdefault(e.turn + 1, [0, 0])
        c[0] += e.cached_tokens
        c[1] += e.prompt_tokens
    r2 = by_round.get(2)
    late_c = [sum(by_round[k][i] for k in by_round if k >= 4) for i in (0, 1)]
    if r2 and r2[0] > 0 and late_c[1] > 0:
        late = 1.0 - (late_c[0] / late_c[1]) / (r2[0] / r2[1])
    cold = 0.0
    if done:
        first = min(e.t_send_s for e in log.events)
        burst = [0] * n
        for e in log.events:
            if e.t_send_s == first and 0 <= e.rank < n:
                burst[e.rank] += 1
        if sum(burst) >= 2 * n:
            cold = max(burst) / sum(burst)
    values = {"hotspot": hotspot(log), "miss_share": miss_share, "request_skew": req_ratio,
              "token_skew": _ratio(toks) if req_ratio <= 1.2 else 0.0, "sticky_loss": max(0.0, sticky),
              "late_collapse": max(0.0, late), "cold_start": cold}
    return {k: round(v, 6) for k, v in values.items()}


def findings(run: dict[str, Any]) -> list[tuple[Detector, float]]:
    """The detectors that apply to a run's workload family and fire, with their signal."""
    family = run["workload"].partition("@")[0]
    sig = run.get("detectors") or {}
    return [(d, sig[d.name]) for d in DETECTORS
            if family in d.families and d.name in sig and sig[d.name] > d.threshold]


def g5(runs: Sequence[dict[str, Any]], candidate: str) -> tuple[str, str, str]:
    """G5: no §8 pathology under the candidate (each detector of its workloads below threshold)."""
    mine = [r for r in runs if r["policy"] == candidate and "detectors" in r]
    if not mine:
        return ("G5", "n/a", f"no detector data for {candidate!r}")
    fired = [f"{r['workload']}/seed {r['seed']}: {d.name} {v:.3g} > {d.threshold:g} ({d.row})"
             for r in mine for d, v in findings(r)]
    checked = sum(1 for r in mine for d in DETECTORS if r["workload"].partition("@")[0] in d.families)
    if fired:
        return ("G5", "FAIL", "; ".join(fired))
    return ("G5", "PASS", f"{checked} detector checks on {len(mine)} runs, none fired")


def table(runs: Sequence[dict[str, Any]]) -> str:
    """Per policy, the detectors that fired on some run (the baselines' pathologies, reproduced)."""
    lines = ["-- §8 pathology detectors (signal > threshold)"]
    by_policy: dict[str, list[str]] = {}
    for r in runs:
        if "detectors" not in r:
            continue
        hits = by_policy.setdefault(r["policy"], [])
        hits += [f"{r['workload']}:{d.name}={v:.3g}" for d, v in findings(r)]
    for policy, hits in by_policy.items():
        lines.append(f"{policy:<24} {', '.join(hits) if hits else 'none'}")
    return "\n".join(lines)
