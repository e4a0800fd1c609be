"""The routing benchmark's report (spec routing-bench §6, gates of §3): tables, ratios to ``vllm``, gates, JSON.

A *run* is one (workload, policy, seed) as a plain dict: ``workload`` (its label), ``policy``, ``seed``, ``dp``,
``metrics`` (:data:`~asyncdp.bench.metrics.METRIC_KEYS`) and ``counts``. A label is the generator's name, then the
preset given (:func:`asyncdp.bench.workloads.label`), then, for an entry of one rung of a ladder or one rate of
W4's sweep, the rung: ``w1``, ``w8@pure_long``, ``w2@0.85rsat``, ``w4@pressure@8rps``. A rung is a number and
``rsat`` or ``rps`` and no preset is, so :func:`split_rung` tells the two apart; :func:`family` is the generator.
The tables show, per workload, the mean over seeds of each metric per policy (± the spread, max − min, when there
are several seeds), then each metric as a ratio to ``vllm``'s; their title also names the ``--option`` pairs the
workloads were built with (in the JSON, the header's ``options``). A metric that no request measured (null in the
JSON: every measured request failed, :func:`~asyncdp.bench.metrics.reported`) reads ``-``, and a line starting
``!!`` under the table names each run whose requests failed, how many and the first error (:func:`failures`).

Gates, for the candidate policy (``asyncdp`` unless told otherwise), where the run has the data; otherwise the
gate reads ``n/a`` with the reason:

- G1: on W1, W2, W4 and W5, p99 TTFT ≤ 0.5 × ``vllm``'s (at the reference rung ``@0.7rsat`` where the run
  has rungs; other rung entries are skipped);
- G2: on every workload, mean TTFT ≤ 1.05 × the best other policy's;
- G3: on every workload, prefix hit rate ≥ 0.9 × the best other policy's;
- G4: on every workload, goodput ≥ 0.98 × ``vllm``'s;
- G5: no §8 pathology detector fires on the candidate (:mod:`~asyncdp.bench.pathology`);
- G6: goodput with ``vllm_coord`` telemetry ≥ 0.95 × with ``oracle``, and with R=4 routers ≥ 0.95 × with R=1,
  per workload (the ``robustness`` runs of ``--robustness``; :func:`g6`);
- G7: decision time (``--decision-time``; :func:`~asyncdp.bench.decision_time.g7`).

A policy without a metric (no request measured it) is left out of the comparisons; a candidate without one fails
the gates on that workload. With several seeds the gates judge the seeds' means. :func:`g2_per_seed` also makes G2's comparison one seed at a
time, for the candidate and for each baseline against the best of the other policies: how often the best of
several policies beats a given one by 5 % on one seed is the noise that a single seed's verdict carries.

A ladder's rungs come as their own entries (``w2@0.85rsat``), so G2-G4 see every rung. Information classes
(§3): G2 and G3 compare with the best baseline of the candidate's class (approximate prefix, from the router's
own history) or a lower one (load-only), so the precise policies (:data:`PRECISE`, which read KV events) are
left out of those two; they still appear in the tables. Other presets of the candidate are not baselines.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from asyncdp.bench.metrics import LOWER_IS_BETTER, METRIC_KEYS, mean

REFERENCE_POLICY = "vllm"
#: the precise class of §3 (KV events); G2/G3 leave them out for an approximate-class candidate
PRECISE = ("dynamo_kv", "sglang_cache_aware@events", "llmd_weighted@precise")
G2_RATIO = 1.05  # the candidate's mean TTFT over the best baseline's, at most (G2; g2_per_seed counts past it)
G6_RATIO = 0.95
G1_WORKLOADS = ("w1", "w2", "w4", "w5")
_SHORT = {"ttft_mean_s": "ttft_mean", "ttft_p50_s": "ttft_p50", "ttft_p90_s": "ttft_p90", "ttft_p99_s": "ttft_p99",
          "tpot_mean_s": "tpot_mean", "e2e_p99_s": "e2e_p99", "goodput_rps": "goodput", "slo_attainment": "slo",
          "throughput_tok_s": "tok/s",
          "prefix_hit_rate": "hit", "max_mean_load_ratio": "max/mean", "preemptions": "preempt"}


_RUNG = re.compile(r"@([0-9][0-9.e+-]*(?:rsat|rps))$")  # (module docstring)


def family(workload_label: str) -> str:
    """The generator of an entry: ``w4@pressure@8rps`` -> ``w4``."""
    return workload_label.partition("@")[0]


def split_rung(workload_label: str) -> tuple[str, str]:
    """An entry's workload label and its rung (``""`` for a whole run): ``w4@pressure@8rps`` -> ``("w4@pressure",
    "8rps")``, ``w8@pure_long`` -> ``("w8@pure_long", "")``."""
    rung = _RUNG.search(workload_label)
    return (workload_label, "") if rung is None else (workload_label[:rung.start()], rung.group(1))


def aggregate(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, tuple[float, float]]]]:
    """workload -> policy -> metric -> (mean over seeds, spread = max - min), in first-seen order. A metric that is
    None (no request measured it: :func:`~asyncdp.bench.metrics.reported`) is left out of the mean; one that no
    seed has is absent, so that a run whose requests all failed never reads as the best."""
    values: dict[str, dict[str, dict[str, list[float]]]] = {}
    for run in runs:
        per_metric = values.setdefault(run["workload"], {}).setdefault(run["policy"], {})
        for key in METRIC_KEYS:
            if run["metrics"].get(key) is not None:
                per_metric.setdefault(key, []).append(float(run["metrics"][key]))
    return {w: {p: {k: (mean(v), max(v) - min(v)) for k, v in ms.items()} for p, ms in ps.items()}
            for w, ps in values.items()}


def failures(runs: Sequence[dict[str, Any]], workload: str) -> list[str]:
    """One line per run of ``workload`` (whole-run entries) whose requests failed: how many, and the first error."""
    out = []
    for run in runs:
        counts = run.get("counts", {})
        if run["workload"] == workload and counts.get("failed"):
            done = counts.get("completed", 0)
            what = (f"the metrics cover the {done} that completed" if done else
                    "no request completed: its metrics read -")
            out.append(f"!! {run['policy']} seed {run['seed']}: {counts['failed']} of {counts.get('sent', '?')} "
                       f"requests failed ({run.get('first_error', 'no error text')}); {what}")
    return out


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.4g}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(  # noqa: E731
        zip(cells, widths, strict=True)))
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def tables(runs: Sequence[dict[str, Any]], options: dict[str, str] | None = None) -> str:
    """Per workload: the metrics table (policy × metric) and the ratio-to-vllm table; the title names ``options``
    (``--option``: the label has the preset)."""
    out: list[str] = []
    given = ", ".join(f"{k}={v}" for k, v in (options or {}).items() if k != "preset")
    built = f" with {given}" if given else ""
    header = ["policy", *(_SHORT[k] for k in METRIC_KEYS)]
    for workload, by_policy in aggregate(runs).items():
        rows = []
        for policy, ms in by_policy.items():
            rows.append([policy, *(_fmt(ms[k][0]) + (f"±{_fmt(ms[k][1])}" if ms[k][1] else "") if k in ms else "-"
                                   for k in METRIC_KEYS)])
        failed = failures(runs, workload)
        out.append(f"== {workload}{built} (mean over seeds; times in s)\n{_table(header, rows)}" +
                   "".join(f"\n{line}" for line in failed))
        ref = by_policy.get(REFERENCE_POLICY)
        if ref is None:
            out.append(f"(no ratio-to-{REFERENCE_POLICY} table: {REFERENCE_POLICY} not in the run)")
            continue
        ratio_rows = []
        for policy, ms in by_policy.items():
            cells = [policy]
            for k in METRIC_KEYS:
                base = ref[k][0] if k in ref else 0.0
                cells.append(_fmt(ms[k][0] / base) if base and k in ms else "-")
            ratio_rows.append(cells)
        out.append(f"-- {workload}: ratio to {REFERENCE_POLICY} (lower is better for "
                   f"{', '.join(_SHORT[k] for k in METRIC_KEYS if LOWER_IS_BETTER[k])})\n"
                   f"{_table(header, ratio_rows)}")
    return "\n\n".join(out)


def gates(runs: Sequence[dict[str, Any]], candidate: str = "asyncdp") -> list[tuple[str, str, str]]:
    """``(gate, PASS | FAIL | n/a, detail)`` for G1-G4 (module docstring)."""
    agg = aggregate(runs)
    if not any(candidate in ps for ps in agg.values()):
        why = f"policy {candidate!r} not in the run"
        return [(g, "n/a", why) for g in ("G1", "G2", "G3", "G4")]
    results: dict[str, list[tuple[bool, str]]] = {g: [] for g in ("G1", "G2", "G3", "G4")}
    floors: dict[str, float] = {}  # workload -> the highest TTFT floor p99 of its entries (metrics.ttft_floors)
    for e in runs:
        floors[e["workload"]] = max(floors.get(e["workload"], 0.0), e.get("ttft_floor_p99_s", 0.0))
    for workload, ps in agg.items():
        if candidate not in ps:
            continue
        # A metric a policy lacks had no measured request (all failed): the candidate then fails the check; a
        # baseline without it is left out of the comparison.
        mine = {k: v[0] for k, v in ps[candidate].items()}
        if "ttft_mean_s" not in mine:  # every measured request of the candidate failed: no gate passes on that
            for gate in results if family(workload) in G1_WORKLOADS else ("G2", "G3", "G4"):
                results[gate].append((False, f"{workload}: no measured request of {candidate} completed"))
            continue
        ref = {k: v[0] for k, v in ps[REFERENCE_POLICY].items()} if REFERENCE_POLICY in ps else None
        others = {p: {k: v[0] for k, v in ms.items()} for p, ms in ps.items() if is_baseline(p, candidate)}
        if ref is not None and candidate != REFERENCE_POLICY:
            rung = split_rung(workload)[1]
            if (family(workload) in G1_WORKLOADS and (not rung.endswith("rsat") or rung == "0.7rsat")
                    and "ttft_p99_s" in ref):
                lim = 0.5 * ref["ttft_p99_s"]
                detail = f"{workload}: p99 {_got(mine, 'ttft_p99_s', ' s')} vs limit {lim:.4g}"
                if floors.get(workload, 0.0) > lim:
                    detail += (f" (under the workload's TTFT floor p99 {floors[workload]:.4g} s: its cold prompts' "
                               "own prefill, which no routing removes)")
                results["G1"].append((mine.get("ttft_p99_s", math.inf) <= lim, detail))
            if "goodput_rps" in ref:
                lim = 0.98 * ref["goodput_rps"]
                results["G4"].append((mine.get("goodput_rps", -math.inf) >= lim,
                                      f"{workload}: goodput {_got(mine, 'goodput_rps')} vs limit {lim:.4g}"))
        ttfts = [o["ttft_mean_s"] for o in others.values() if "ttft_mean_s" in o]
        if ttfts:
            lim = G2_RATIO * min(ttfts)
            results["G2"].append((mine.get("ttft_mean_s", math.inf) <= lim,
                                  f"{workload}: mean {_got(mine, 'ttft_mean_s', ' s')} vs limit {lim:.4g}"))
        hits = [o["prefix_hit_rate"] for o in others.values() if "prefix_hit_rate" in o]
        if hits:
            lim = 0.9 * max(hits)
            results["G3"].append((mine.get("prefix_hit_rate", -math.inf) >= lim,
                                  f"{workload}: hit {_got(mine, 'prefix_hit_rate')} vs limit {lim:.4g}"))
    out = []
    for gate, checks in results.items():
        if not checks:
            out.append((gate, "n/a", "no workload in the run has the data"))
            continue
        failed = [d for ok, d in checks if not ok]
        out.append((gate, "FAIL" if failed else "PASS", "; ".join(failed or [d for _, d in checks])))
    return out


def _got(values: dict[str, float], key: str, unit: str = "") -> str:
    return f"{values[key]:.4g}{unit}" if key in values else "- (no request measured it)"


def g2_per_seed(runs: Sequence[dict[str, Any]], candidate: str = "asyncdp") -> dict[str, Any] | None:
    """With several seeds: G2's comparison made per (workload entry, seed), informational (module docstring).
    For the candidate against the best baseline, and for each baseline against the best of the others, the
    candidate included: ``{"candidate", "entries", "over": {policy: entries over 1.05 x}, "worst": {policy:
    [ratio, "workload seed N"]}}``; ``None`` with one seed, or without the candidate and a baseline."""
    by_entry: dict[tuple[str, int], dict[str, float]] = {}
    for run in runs:
        if run["metrics"].get("ttft_mean_s") is None:  # no request measured it: not compared
            continue
        if run["policy"] == candidate or is_baseline(run["policy"], candidate):
            by_entry.setdefault((run["workload"], run["seed"]), {})[run["policy"]] = run["metrics"]["ttft_mean_s"]
    cells = {key: ps for key, ps in by_entry.items() if candidate in ps and len(ps) > 1}
    if len({seed for _, seed in cells}) < 2:
        return None
    over: dict[str, int] = {}
    worst: dict[str, list[Any]] = {}
    for (workload, seed), ps in cells.items():
        for policy, ttft in ps.items():
            best = min(v for p, v in ps.items() if p != policy)
            ratio = ttft / best if best > 0 else 1.0
            over[policy] = over.get(policy, 0) + (ratio > G2_RATIO)
            if ratio > worst.get(policy, [0.0])[0]:
                worst[policy] = [ratio, f"{workload} seed {seed}"]
    return {"candidate": candidate, "entries": len(cells), "over": over, "worst": worst}


def g2_per_seed_text(per_seed: dict[str, Any]) -> str:
    """The line ``bench routing`` prints for :func:`g2_per_seed`'s result."""
    candidate, over = per_seed["candidate"], per_seed["over"]
    ratio, where = per_seed["worst"][candidate]
    others = sorted((p for p in over if p != candidate), key=lambda p: (over[p], p))
    return (f"G2 per seed (informational; the gate judges the seeds' means): {candidate} over {G2_RATIO} x the best "
            f"baseline in {over[candidate]} of {per_seed['entries']} workload-seeds (worst {ratio:.3f} x, {where}); "
            f"each baseline over {G2_RATIO} x the best of the others: " + ", ".join(f"{p} {over[p]}" for p in others))


def is_baseline(policy: str, candidate: str) -> bool:
    """Whether ``policy`` counts as a baseline of G2/G3 for ``candidate`` (module docstring)."""
    if policy == candidate or policy.partition("@")[0] == candidate.partition("@")[0]:
        return False
    return policy not in PRECISE and not policy.startswith("dynamo_kv@") or policy == "dynamo_kv@approx"


def g6(runs: Sequence[dict[str, Any]], robust: Sequence[dict[str, Any]], candidate: str
       ) -> tuple[str, str, str]:
    """G6 from the ``robustness`` runs: each variant's goodput against the candidate's own reference run."""
    if not robust:
        return ("G6", "n/a", "no robustness runs (run with --robustness)")
    ref = {w: ms["goodput_rps"][0] for w, ps in aggregate(runs).items() for p, ms in ps.items()
           if p == candidate and "goodput_rps" in ms}
    checks: list[tuple[bool, str]] = []
    for variant in sorted({r["variant"] for r in robust}):
        agg = aggregate([r for r in robust if r["variant"] == variant and r["policy"] == candidate])
        for w, ps in agg.items():
            if w not in ref or "goodput_rps" not in ps[candidate]:
                continue
            got = ps[candidate]["goodput_rps"][0]
            if variant == "oracle":  # the default telemetry against the oracle
                ok, text = ref[w] >= G6_RATIO * got, f"{w}: vllm_coord {ref[w]:.4g} vs oracle {got:.4g}"
            else:  # R routers against one
                ok, text = got >= G6_RATIO * ref[w], f"{w}: {variant} {got:.4g} vs R=1 {ref[w]:.4g}"
            checks.append((ok, text))
    if not checks:
        return ("G6", "n/a", "no robustness run matches a reference run")
    failed = [t for ok, t in checks if not ok]
    return ("G6", "FAIL" if failed else "PASS", "; ".join(failed or [t for _, t in checks]))


def gates_text(rows: Sequence[tuple[str, str, str]]) -> str:
    return "\n".join(f"{gate}: {verdict}  {detail}" for gate, verdict, detail in rows)


def to_json(runs: Sequence[dict[str, Any]], header: dict[str, Any], gate_rows: Sequence[tuple[str, str, str]],
            robust: Sequence[dict[str, Any]] = (), decision_time: Sequence[dict[str, Any]] = (),
            per_seed: dict[str, Any] | None = None) -> str:
    """The JSON document: ``{"header", "runs", "gates"}`` (plus ``robustness``, ``g2_per_seed`` with several seeds
    and, wall clock and so not deterministic, ``decision_time`` when measured), keys sorted, so a seed gives the
    same bytes."""
    doc: dict[str, Any] = {"header": header, "runs": list(runs),
                           "gates": [{"gate": g, "verdict": v, "detail": d} for g, v, d in gate_rows]}
    if per_seed is not None:
        doc["g2_per_seed"] = per_seed
    if robust:
        doc["robustness"] = list(robust)
    if decision_time:
        doc["decision_time"] = list(decision_time)
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"
