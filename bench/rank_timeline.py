"""Per-rank engine state over one simulated run, policy beside policy: which rank runs out of KV, and when.

A mean TTFT that fails at one rung often comes from one rank. This benchmark runs one workload under each policy
through the routing simulator (``asyncdp bench routing``'s cluster, the same seed and records), reading every
rank's scheduler each ``--every`` virtual seconds through ``simulate``'s probe, and prints per policy:

- a timeline from ``--from`` to ``--to`` seconds, one line per ``--print-every`` seconds, one column per rank:
  ``running/waiting KV-usage`` (KV usage: blocks held by requests over the usable blocks);
- per rank: the requests it served in the last rung and their mean TTFT, the first time its KV usage reached
  ``--full`` (0.99; ``-``: never), its first preemption and its preemptions over the run.

Adding the probe adds one task to the run, so a probed run can order same-instant events differently from the
unprobed run of ``asyncdp bench routing``; the preemption totals printed here can be compared with that run's.

Usage: python bench/rank_timeline.py --workload w2 --option stages=3,10,15,20,22,25,30 --seed 2 \\
           --policies asyncdp,ray_prefix --from 170 --to 310
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from asyncdp.bench.arrivals import RelativeLadder  # noqa: E402
from asyncdp.bench.command import parse_options  # noqa: E402
from asyncdp.bench.profiles import load_profile  # noqa: E402
from asyncdp.bench.records import resolve  # noqa: E402
from asyncdp.bench.simulate import ClusterSpec, RunLog, measure_r_sat, simulate  # noqa: E402
from asyncdp.bench.workloads import build  # noqa: E402
from asyncdp.errors import ConfigError  # noqa: E402
from asyncdp.testing.cluster import SimCluster  # noqa: E402
from bench.serving import policy_list, positive_float, positive_int  # noqa: E402

Sample = tuple[float, list[tuple[int, int, float, int]]]  # (t, per rank: running, waiting, KV usage, preemptions)


def run_probed(workload: Any, policy: str, seed: int, spec: ClusterSpec, every_s: float) -> tuple[RunLog, list[Sample]]:
    samples: list[Sample] = []

    def probe(t: float, cluster: SimCluster) -> None:
        row = []
        for rank in cluster.ranks:
            s = rank.core.scheduler
            row.append((s.num_running, s.num_waiting, s.block_manager.usage, s.num_preemptions))
        samples.append((t, row))

    log = simulate(workload, policy, seed, spec, probe=probe, probe_every_s=every_s)
    return log, samples


def per_rank_summary(log: RunLog, samples: list[Sample], full: float) -> list[dict[str, Any]]:
    """Per rank: the last rung's requests and mean TTFT, when its KV first reached ``full``, its first
    preemption and its preemption count (from the samples: the count at the last one)."""
    measured = [e for e in log.events if e.measured and e.t_first_s is not None]
    last = max((e.turn for e in measured), default=0)
    out = []
    for i in range(log.dp_size):
        ttfts = [e.t_first_s - e.t_send_s for e in measured if e.rank == i and e.turn == last
                 and e.t_first_s is not None]
        first_full = next((t for t, row in samples if row[i][2] >= full), math.nan)
        first_preempt = next((t for t, row in samples if row[i][3] > 0), math.nan)
        out.append({"rank": i, "last_rung_requests": len(ttfts),
                    "last_rung_ttft_mean_s": statistics.fmean(ttfts) if ttfts else math.nan,
                    "kv_full_at_s": first_full, "first_preemption_at_s": first_preempt,
                    "preemptions": samples[-1][1][i][3] if samples else 0})
    return out


def _s(seconds: float, digits: int) -> str:
    return "-" if math.isnan(seconds) else f"{seconds:.{digits}f} s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="w2")
    ap.add_argument("--scale", default="full", choices=("quick", "full", "dp32"))
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policies", type=policy_list, default="asyncdp,ray_prefix")
    ap.add_argument("--profile", default="gpu_8b")
    ap.add_argument("--routers", type=positive_int, default=1,
                    help="API-server routers, each with its own policy state")
    ap.add_argument("--telemetry", default="vllm_coord")
    ap.add_argument("--every", type=positive_float, default=1.0, help="sampling period, virtual seconds")
    ap.add_argument("--print-every", type=positive_float, default=3.0)
    ap.add_argument("--from", dest="t_from", type=float, default=0.0)
    ap.add_argument("--to", dest="t_to", type=float, default=math.inf)
    ap.add_argument("--full", type=float, default=0.99, help="KV usage read as full")
    ns = ap.parse_args(argv)
    try:  # the workload, profile and cluster before any run: a bad one is a usage error (exit 2), not a traceback
        workload = build(ns.workload, ns.scale, ns.seed, parse_options(ns.option))
        spec = ClusterSpec(workload.dp_size, load_profile(ns.profile), routers=ns.routers, telemetry=ns.telemetry)
    except ConfigError as exc:
        ap.error(str(exc))
    r_sat = measure_r_sat(workload, spec, ns.seed) if isinstance(workload.arrival, RelativeLadder) else None
    workload = resolve(workload, 1.0, r_sat)
    for policy in ns.policies:
        print(f"[{policy}] {workload.name} {ns.scale} seed {ns.seed}, dp {spec.dp_size}, R = {spec.routers}: running",
              file=sys.stderr)
        log, samples = run_probed(workload, policy, ns.seed, spec, ns.every)
        print(f"\n{policy}: running/waiting KV usage per rank, t = {ns.t_from:g}..{ns.t_to:g} s")
        print("    t  " + "".join(f"{'rank ' + str(i):>14}" for i in range(spec.dp_size)))
        step = max(1, round(ns.print_every / ns.every))
        shown = [s for s in samples if ns.t_from <= s[0] <= ns.t_to]
        for t, row in shown[::step]:
            print(f"{t:5.0f}  " + "".join(f"{f'{r}/{w} {u:.2f}':>14}" for r, w, u, _ in row))
        print(f"\n{policy}: per rank (preemptions over the run: {log.preemptions})")
        print("rank  last-rung requests  last-rung TTFT mean  KV full at  first preemption  preemptions")
        for d in per_rank_summary(log, samples, ns.full):
            print(f"{d['rank']:4d}  {d['last_rung_requests']:18d}  {_s(d['last_rung_ttft_mean_s'], 4):>19}"
                  f"  {_s(d['kv_full_at_s'], 0):>10}  {_s(d['first_preemption_at_s'], 0):>16}  {d['preemptions']:11d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
