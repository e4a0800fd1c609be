"""The files of ``asyncdp bench routing --plots DIR`` and ``--csv FILE`` (spec routing-bench §6, "Report").

Everything is drawn from what one run already computed (the runs' entries, their event logs, the resolved
workloads of the plan, the decision timings): nothing is simulated again. PNGs, ``<w>`` being the workload
label made safe for a file name (``w4@16rps`` -> ``w4_16rps``, ``w8@pure_long`` -> ``w8_pure_long``):

- ``ttft_cdf_<w>.png``: the TTFT CDF per policy, log x-axis, over the measured requests of every seed pooled;
- ``load_heatmap_<w>.png``: per-rank load over time, a rank × time heatmap of outstanding requests (sent,
  last token not yet seen: ``waiting + running`` as the client sees it; 1 s virtual samples, the hot-spot
  detector's of :mod:`~asyncdp.bench.pathology`, finer for a run too short for 40 of them), one panel each
  for ``vllm``, the best baseline (lowest mean TTFT other than ``vllm`` and the candidate's family) and the
  candidate, on one colour scale, first seed;
- ``hit_rate_vs_rung_<w>.png`` and ``goodput_vs_rate_<w>.png``, for a ladder (its rungs) or a rate sweep (W4's
  rates): per policy, the prefix hit rate per rung and the goodput against the offered rate (the rung's rate
  in the resolved arrival ladder, or the sweep's dispatch rate), mean over seeds;
- ``decision_time.png``: the candidate's ``select`` p50 and p99 (µs) against dp_size, when ``--decision-time``
  ran.

matplotlib (the ``bench`` extra) is imported inside :func:`write_plots` only, and draws on the Agg canvas (no
pyplot, no global backend state); without it a message says so and no plot is written. The data functions
(:func:`outstanding_samples`, :func:`heatmap_policies`, :func:`load_points`) are pure and tested on their own.

The CSV (:func:`write_csv`) has one row per JSON run entry (then the robustness entries, with their
``variant``): ``workload, policy, seed, dp, variant``, every metric of
:data:`~asyncdp.bench.metrics.METRIC_KEYS` and ``ttft_floor_p99_s`` (empty where the entry has none, or where the
JSON's value is null), the values the JSON holds.
"""

from __future__ import annotations

import csv
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from asyncdp.bench.arrivals import Dispatch, Ladder, rung_indices
from asyncdp.bench.files import write
from asyncdp.bench.metrics import METRIC_KEYS, mean
from asyncdp.bench.pathology import SAMPLE_S, completed, outstanding_samples
from asyncdp.bench.report import REFERENCE_POLICY, aggregate, split_rung
from asyncdp.bench.simulate import RunLog

CSV_FIELDS = ("workload", "policy", "seed", "dp", "variant", *METRIC_KEYS, "ttft_floor_p99_s")
#: an entry of ``bench routing``'s plan: (seed, label, resolved workload, cluster spec, rung label -> req_ids)
Plan = tuple[int, str, Any, Any, Mapping[str, set[int]]]
LogKey = tuple[str, str, int]  # (workload label, policy, seed)
MIN_HEATMAP_SAMPLES = 40
#: one line style per policy in turn, so policies that coincide stay visible under each other
_STYLES = ("-", "--", "-.", ":")
#: colours for the policies other than the candidate and vllm (which get their own, drawn thicker)
_PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:gray",
            "tab:olive", "tab:cyan", "navy", "darkgoldenrod", "teal", "indigo", "salmon", "yellowgreen")


def _style(policy: str, n: int, candidate: str) -> dict[str, Any]:
    """Line style of ``policy`` (the n-th drawn): the candidate thick black on top, vllm thick red, the others
    thin, each its own colour and dash, so that 17 policies stay apart and the two that matter stand out."""
    if policy == candidate:
        return {"color": "black", "linewidth": 2.4, "zorder": 5, "linestyle": "-"}
    if policy == REFERENCE_POLICY:
        return {"color": "tab:red", "linewidth": 2.0, "zorder": 4, "linestyle": "-"}
    return {"color": _PALETTE[n % len(_PALETTE)], "linewidth": 1.0, "alpha": 0.85,
            "linestyle": _STYLES[n % len(_STYLES)]}


def heatmap_period_s(logs: Iterable[RunLog], min_samples: int = MIN_HEATMAP_SAMPLES) -> float:
    """The heatmap's sample period: the detector's :data:`~asyncdp.bench.pathology.SAMPLE_S`, or, for runs too
    short for ``min_samples`` of them (a quick-scale burst is over in under a second), a finer round 1-2-5
    value."""
    spans = [max(e.t_last_s or 0.0 for e in done) - min(e.t_send_s for e in done)
             for done in map(completed, logs) if done]
    span = max(spans, default=0.0)
    if span >= min_samples * SAMPLE_S or span <= 0:
        return SAMPLE_S
    wanted = span / min_samples
    steps = [m * 10.0 ** k for k in range(-6, 1) for m in (1, 2, 5)]
    return max((p for p in steps if p <= wanted), default=steps[0])


def _family(policy: str) -> str:
    return policy.partition("@")[0]


def heatmap_policies(runs: Sequence[dict[str, Any]], label: str, candidate: str) -> list[tuple[str, str]]:
    """``(policy, role)`` for the heatmap of workload ``label``: ``vllm``, the best baseline (lowest mean TTFT
    over seeds of the whole-run entries, leaving out ``vllm`` and the candidate with its presets) and the
    candidate, those that ran, without repeats."""
    per_policy = aggregate([r for r in runs if r["workload"] == label]).get(label, {})
    others = [p for p in per_policy if p != REFERENCE_POLICY and _family(p) != _family(candidate)]
    others = [p for p in others if "ttft_mean_s" in per_policy[p]]  # (absent: every request failed)
    best = min(others, key=lambda p: per_policy[p]["ttft_mean_s"][0]) if others else None
    out: list[tuple[str, str]] = []
    for policy, role in ((REFERENCE_POLICY, "reference"), (best, "best baseline"), (candidate, "candidate")):
        if policy is not None and policy in per_policy and all(policy != p for p, _ in out):
            out.append((policy, role))
    return out


def load_points(plans: Iterable[Plan]) -> dict[str, list[tuple[str, float]]]:
    """For each ladder workload and each rate sweep (by workload label, preset included): ``(entry label, offered
    req/s)`` per rung or sweep rate, by increasing rate, the rate averaged over seeds (a relative ladder's
    R_sat is measured per seed). An entry label is a ``workload`` of the JSON runs. A rung whose requests all
    arrive in the warm-up (W2's first stage at full scale) measures nothing and is left out."""
    rates: dict[str, dict[str, list[float]]] = {}
    for _seed, label, workload, _spec, rungs in plans:
        arrival = workload.arrival
        if rungs and isinstance(arrival, Ladder):
            index = rung_indices(arrival, [r.t_arrival_ms for r in workload.records])
            assert index is not None
            for name, ids in rungs.items():
                if any((workload.records[i].t_arrival_ms or 0.0) >= workload.warmup_ms for i in ids):
                    rate = arrival.rungs[index[min(ids)]][0]
                    rates.setdefault(label, {}).setdefault(f"{label}@{name}", []).append(rate)
        elif workload.sweep_rates_rps and isinstance(arrival, Dispatch):
            rates.setdefault(split_rung(label)[0], {}).setdefault(label, []).append(arrival.rate_rps)
    return {base: sorted(((entry, mean(values)) for entry, values in points.items()), key=lambda p: p[1])
            for base, points in rates.items()}


def write_csv(path: Path, runs: Sequence[dict[str, Any]], robust: Sequence[dict[str, Any]] = ()) -> None:
    """The run entries as CSV (module docstring); floats as Python writes them, so they read back equal."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(CSV_FIELDS)
        for entry in [*runs, *robust]:
            writer.writerow([entry["workload"], entry["policy"], entry["seed"], entry["dp"],
                             entry.get("variant", ""), *(entry["metrics"][k] for k in METRIC_KEYS),
                             entry.get("ttft_floor_p99_s", "")])


def file_stem(label: str) -> str:
    """A workload label as a file-name part: anything but letters, digits, ``.``, ``-`` becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9.-]", "_", label)


def write_plots(directory: Path, runs: Sequence[dict[str, Any]], logs: Mapping[LogKey, RunLog],
                plans: Iterable[Plan] = (), timing: Sequence[dict[str, Any]] = (),
                candidate: str = "asyncdp") -> list[Path]:
    """Draw every plot of the module docstring that the run has data for into ``directory``; the paths written
    (none, with a message on stderr, without matplotlib)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print("asyncdp bench: --plots needs matplotlib, which is not installed "
              "(pip install 'asyncdp[bench]'); no plots written.", file=sys.stderr)
        return []
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def new(width: float = 7.0, height: float = 4.5) -> Any:
        return Figure(figsize=(width, height), layout="constrained")

    def save(fig: Any, name: str) -> None:  # whole or not at all: a Ctrl-C or a full disk leaves no half a PNG
        FigureCanvasAgg(fig)
        write("--plots", directory / name, lambda path: fig.savefig(path, dpi=100, format="png"))
        written.append(directory / name)

    for label in dict.fromkeys(label for label, _, _ in logs):
        save(_ttft_cdf(new(), label, logs, candidate), f"ttft_cdf_{file_stem(label)}.png")
        chosen = heatmap_policies(runs, label, candidate)
        fig = new(9.0, 1.2 + 1.6 * len(chosen))
        if chosen and _heatmap(fig, label, chosen, logs):
            save(fig, f"load_heatmap_{file_stem(label)}.png")
    for base, points in load_points(plans).items():
        agg = aggregate([r for r in runs if r["workload"] in dict(points)])
        if agg:
            stem = file_stem(base)
            save(_against_load(new(), base, points, agg, "prefix_hit_rate", candidate), f"hit_rate_vs_rung_{stem}.png")
            save(_against_load(new(), base, points, agg, "goodput_rps", candidate), f"goodput_vs_rate_{stem}.png")
    mine = sorted((r for r in timing if r["policy"] == candidate), key=lambda r: r["dp"])
    if mine:
        save(_decision_time(new(), mine), "decision_time.png")
    return written


def _ttft_cdf(fig: Any, label: str, logs: Mapping[LogKey, RunLog], candidate: str) -> Any:
    ax = fig.subplots()
    pooled: dict[str, list[float]] = {}
    seeds: set[int] = set()
    for (name, policy, seed), log in logs.items():
        if name != label:
            continue
        seeds.add(seed)
        pooled.setdefault(policy, []).extend(e.t_first_s - e.t_send_s for e in log.events
                                             if e.measured and e.error is None and e.t_first_s is not None
                                             and e.t_first_s > e.t_send_s)
    for n, (policy, values) in enumerate(pooled.items()):
        if values:
            values.sort()
            ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=policy,
                    **_style(policy, n, candidate))
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s, virtual)")
    ax.set_ylabel("fraction of measured requests")
    ax.set_ylim(0, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    which = f"seed {min(seeds)}" if len(seeds) == 1 else f"seeds {', '.join(map(str, sorted(seeds)))} pooled"
    ax.set_title(f"{label}: TTFT CDF per policy ({which})")
    ax.legend(fontsize="small")
    return fig


def _heatmap(fig: Any, label: str, chosen: Sequence[tuple[str, str]], logs: Mapping[LogKey, RunLog]) -> bool:
    """One rank × time panel per chosen policy, first seed (the first run), one colour scale; False if nothing
    completed."""
    panels = []
    firsts = [(policy, role, next(k for k in logs if k[:2] == (label, policy))) for policy, role in chosen]
    period = heatmap_period_s([logs[key] for *_, key in firsts])
    for policy, role, key in firsts:
        samples = outstanding_samples(logs[key], period)
        if samples.times_s:
            panels.append((policy, role, key[2], samples))
    if not panels:
        return False
    vmax = max(1, max(max(row) for *_, s in panels for row in s.per_rank))
    axes = fig.subplots(len(panels), 1, squeeze=False, sharex=True)[:, 0]
    image = None
    for ax, (policy, role, seed, s) in zip(axes, panels, strict=True):
        extent = (s.times_s[0], s.times_s[-1] + period, -0.5, len(s.per_rank) - 0.5)
        image = ax.imshow(s.per_rank, aspect="auto", origin="lower", interpolation="nearest", cmap="viridis",
                          vmin=0, vmax=vmax, extent=extent)
        ax.set_ylabel("dp_rank")
        ax.set_title(f"{policy} ({role}), seed {seed}", fontsize="medium")
    axes[-1].set_xlabel(f"virtual time (s), samples every {period:.3g} s")
    fig.colorbar(image, ax=list(axes), label="outstanding requests (waiting+running, client view)")
    fig.suptitle(f"{label}: per-rank load over time")
    return True


def _against_load(fig: Any, base: str, points: Sequence[tuple[str, float]],
                  agg: Mapping[str, Mapping[str, Mapping[str, tuple[float, float]]]], metric: str,
                  candidate: str) -> Any:
    """Per policy, ``metric`` (mean over seeds) per rung (hit rate) or against the offered rate (goodput)."""
    ax = fig.subplots()
    policies = list(dict.fromkeys(p for entry, _ in points for p in agg.get(entry, {})))
    names = [entry[len(base) + 1:] for entry, _ in points]
    for n, policy in enumerate(policies):
        xs, ys = [], []
        for k, (entry, rate) in enumerate(points):
            if metric in agg.get(entry, {}).get(policy, {}):
                xs.append(rate if metric == "goodput_rps" else k)
                ys.append(agg[entry][policy][metric][0])
        ax.plot(xs, ys, marker="o", markersize=4, label=policy, **_style(policy, n, candidate))
    if metric == "goodput_rps":
        rates = sorted(rate for _, rate in points)
        ax.plot(rates, rates, linestyle=":", color="grey", label="offered")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel("goodput (req/s meeting the SLO)")
        ax.set_title(f"{base}: goodput against offered rate")
    else:
        ticks = [n if n.endswith("rps") else f"{n}\n{rate:.3g} req/s" for n, (_, rate) in zip(names, points,
                                                                                             strict=True)]
        ax.set_xticks(range(len(points)), ticks)
        ax.set_xlabel("rung")
        ax.set_ylabel("prefix hit rate")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{base}: prefix hit rate per rung")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def _decision_time(fig: Any, rows: Sequence[dict[str, Any]]) -> Any:
    ax = fig.subplots()
    dps = [r["dp"] for r in rows]
    ax.plot(dps, [r["select"]["p50_us"] for r in rows], marker="o", label="select p50")
    ax.plot(dps, [r["select"]["p99_us"] for r in rows], marker="s", linestyle="--", label="select p99")
    from asyncdp.bench.decision_time import TARGET_DP, TARGET_US

    ax.axhline(TARGET_US, color="grey", linestyle=":", label=f"G7: p50 < {TARGET_US:g} µs at dp {TARGET_DP}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(dps, [str(d) for d in dps])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("dp_size")
    ax.set_ylabel("decision time (µs)")
    ax.set_title(f"{rows[0]['policy']}: routing decision time against dp_size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    return fig
