"""``asyncdp bench routing``: replay workloads through the simulated cluster once per (policy, seed), then
print the tables, the ratios to ``vllm`` and the gates, and write JSON (spec routing-bench §6).

Flow: for each seed, each workload is built (``--workload``, or read from a Mooncake ``--trace``), its send
times fixed once (:func:`~asyncdp.bench.records.resolve` with ``--rate-scale`` and, for a relative ladder,
R_sat: ``--r-sat`` or measured with ``round_robin`` in closed loop), and every policy replays that same
workload (C1) on a fresh cluster (C6). Every run happens in a process of its own, ``--jobs`` at a time
(:mod:`~asyncdp.bench.runner`: a run's result then depends on its own arguments only); the results are read in
plan order. The JSON holds no wall-clock value, so the same arguments give the same bytes; wall times go to stderr
with the progress.

This module only parses and orchestrates: :mod:`~asyncdp.bench.simulate` runs, :mod:`~asyncdp.bench.metrics`
measures, :mod:`~asyncdp.bench.report` formats. It imports them lazily so ``asyncdp --help`` stays cheap.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import replace
from hashlib import blake2b
from pathlib import Path
from typing import Any

from asyncdp.bench.guards import (
    check_flags,
    check_outputs,
    check_span,
    check_workloads,
    csv_items,
    stop_on_signals,
)
from asyncdp.errors import ConfigError, SimulationStalled

BASE_POLICIES = ("vllm", "round_robin", "random", "power_of_two", "vllm_legacy")
TRACE_BLOCK = 512
DEFAULT_SCALE = "quick"  # --scale and --trace-block-size default to None, to tell "given" from not


def known_policies() -> list[str]:
    """The default ``--policies``: the five base ones, then every other policy make_policy knows (the peers'
    included, each with its defaults: presets are named explicitly)."""
    from asyncdp.dp.balance import POLICIES
    from asyncdp.dp.peers import PEER_POLICIES

    names = [*POLICIES, *(p for p in PEER_POLICIES if "@" not in p)]
    return [*BASE_POLICIES, *(p for p in names if p not in BASE_POLICIES)]


def add_bench_parser(sub: Any) -> None:
    """Register ``bench routing`` and ``bench calibrate`` on the top-level subparsers ``sub``."""
    from asyncdp.bench.arrivals import ROUTER_ASSIGN
    from asyncdp.bench.calibrate import add_calibrate_parser

    bench = sub.add_parser("bench", help="benchmarks (routing policies on a simulated cluster, calibration)")
    bsub = bench.add_subparsers(dest="bench_command", metavar="ACTION", required=True)
    p = bsub.add_parser("routing", allow_abbrev=False,
                        help="compare load-balancing policies on a simulated cluster in virtual time")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--workload", help="generator name[@preset] (w1..w10), comma-separated for several")
    src.add_argument("--trace", help="a Mooncake-format trace file (JSONL) to replay")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a workload generator option (repeatable), e.g. groups=4")
    p.add_argument("--scale", default=None, choices=("quick", "full", "dp32"), help=f"workload scale (default: {DEFAULT_SCALE})")
    p.add_argument("--trace-block-size", type=int, default=None,
                   help=f"tokens per trace hash id (default: {TRACE_BLOCK})")
    p.add_argument("--export-trace", help="write the (first seed's) workload as a Mooncake trace and go on")
    p.add_argument("--dp", type=int, default=None, help="ranks (default: the workload's)")
    p.add_argument("--policies", help="comma-separated policy names (default: every known policy)")
    p.add_argument("--list-policies", action="store_true", help="print the known policy names and exit")
    p.add_argument("--profile", default="gpu_8b", help="cost profile name or profile file")
    p.add_argument("--seeds", default="1", help="comma-separated seeds")
    p.add_argument("--routers", type=int, default=1, help="router replicas (DP clients)")
    p.add_argument("--router-assign", default="index", choices=ROUTER_ASSIGN,
                   help="how requests reach the routers: index (request i to router i mod R) or key (by a hash "
                   "of the request's routing key, as behind a session-affine balancer; keyless ones by index)")
    p.add_argument("--lockstep", action="store_true", help="MoE lockstep ranks (waves)")
    p.add_argument("--telemetry", default="vllm_coord", help="telemetry preset (vllm_coord, oracle, "
                   "periodic_1s, periodic_10s, none)")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply every arrival rate")
    p.add_argument("--r-sat", type=float, default=None, help="R_sat in req/s for relative ladders "
                   "(default: measured)")
    p.add_argument("--candidate", default="asyncdp", help="the policy the gates judge")
    p.add_argument("--robustness", action="store_true", help="also run the candidate with oracle telemetry "
                   "and with 4 routers (gate G6)")
    p.add_argument("--decision-time", action="store_true", help="also time the candidate's decisions at dp "
                   "8, 64 and 256, as one of --routers API servers (gate G7; wall clock, kept apart in the JSON)")
    p.add_argument("--jobs", type=int, default=None, help="simulated runs at a time, each in its own process "
                   "(default: one per core; 0: all in this process, one after another)")
    p.add_argument("--json", help="write the JSON result here")
    p.add_argument("--csv", help="write the per-(workload, policy, seed) metrics here as CSV")
    p.add_argument("--plots", help="write the PNG plots (TTFT CDFs, load heatmaps, ...: docs/reference/cli.md) "
                                   "into this directory (needs matplotlib)")
    add_calibrate_parser(bsub)


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in csv_items(text)]
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers (got {text!r}).") from None
    twice = [seed for k, seed in enumerate(seeds) if seed in seeds[:k]]
    if twice:  # (01 and 1 too)
        raise ConfigError(f"--seeds lists {twice[0]} twice (got {text!r}); give each seed once.")
    return seeds


def parse_options(items: Iterable[str]) -> dict[str, str]:
    """``--option KEY=VALUE`` items as a dict (the workload generator checks the values); a key given twice is an
    error (the first value was silently dropped)."""
    options: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--option must be KEY=VALUE (got {item!r}).")
        if key in options:
            raise ConfigError(f"--option {key} is given twice ({key}={options[key]} and {key}={value.strip()}); "
                              "give it once.")
        options[key] = value.strip()
    return options


def _workloads(ns: argparse.Namespace, seed: int, profile: Any) -> Iterator[tuple[str, Any]]:
    """``(label, workload)`` for ``seed``: the label names it in the report (:func:`asyncdp.bench.workloads.label`)."""
    from asyncdp.bench.records import BLOCK_SIZE, DEFAULT_MAX_MODEL_LEN
    from asyncdp.bench.trace import read_trace
    from asyncdp.bench.workloads import build, label

    if ns.trace:
        # a trace's request must fit one sequence of the simulated engine: its max_model_len, or less where the
        # profile's KV cache (less the scratch block) holds less
        limit, why = DEFAULT_MAX_MODEL_LEN, "the simulator's default"
        if (profile.kv_blocks - 1) * BLOCK_SIZE < limit:
            limit = (profile.kv_blocks - 1) * BLOCK_SIZE
            why = (f"what profile {profile.name}'s KV cache holds: kv_blocks {profile.kv_blocks} less the scratch "
                   f"block, of {BLOCK_SIZE} tokens")
        trace = read_trace(ns.trace, ns.trace_block_size or TRACE_BLOCK, seed=seed, dp_size=ns.dp or 8,
                           max_model_len=limit, why=why)
        yield trace.name, trace
        return
    options = parse_options(ns.option)
    for name in csv_items(ns.workload or ""):
        workload = build(name, ns.scale or DEFAULT_SCALE, seed, options)
        if not workload.records:  # (groups=0 and the like): an all-zero table would read as a result
            raise ConfigError(f"{name}: these options give no requests ({', '.join(ns.option or ()) or 'none'}).")
        yield label(name, options), workload


def run(ns: argparse.Namespace) -> int:
    """Run ``bench routing`` (or ``bench calibrate``) for parsed arguments ``ns``; returns the exit code."""
    if ns.bench_command == "calibrate":
        from asyncdp.bench.calibrate import run as run_calibrate

        return run_calibrate(ns)
    if ns.list_policies:
        print("\n".join(known_policies()))
        return 0
    if not ns.workload and not ns.trace:
        raise ConfigError("bench routing needs --workload NAME or --trace FILE.")
    check_flags(ns)
    check_outputs(ns)  # before the runs: a long benchmark must not end in an unwritable path
    with stop_on_signals():  # the runs, and the report and files after them: 143 or 130, no half-written file
        return _routing(ns)


def _routing(ns: argparse.Namespace) -> int:
    """``bench routing`` once its flags and output paths are checked: the runs, the report, the files."""
    from asyncdp.bench import pathology, report
    from asyncdp.bench.arrivals import RelativeLadder
    from asyncdp.bench.files import WriteFailed
    from asyncdp.bench.metrics import ttft_floors
    from asyncdp.bench.outputs import export_trace, write_outputs
    from asyncdp.bench.profiles import load_profile, profile_hash
    from asyncdp.bench.progress import Progress
    from asyncdp.bench.records import encode_workload, resolve
    from asyncdp.bench.runner import Runner, default_jobs
    from asyncdp.bench.simulate import ClusterSpec, expand_sweep, measure_r_sat
    from asyncdp.dp.balance import make_policy

    policies = known_policies() if ns.policies is None else csv_items(ns.policies)
    for name in (*policies, ns.candidate):
        make_policy(name)  # an unknown name fails here, before any run
    profile = load_profile(ns.profile)
    seeds = _seeds(ns.seeds)
    jobs_at_once = default_jobs() if ns.jobs is None else ns.jobs
    plans: list[tuple[int, str, Any, Any, dict[str, set[int]]]] = []  # (seed, label, workload, spec, rungs)
    hashes: dict[str, str] = {}
    r_sats: dict[str, float] = {}  # workload/seed -> the R_sat its relative ladder ran at (given or measured)
    runs: list[dict[str, Any]] = []
    robust: list[dict[str, Any]] = []
    logs: dict[tuple[str, str, int], Any] = {}
    workloads = [(seed, *lw) for seed in seeds for lw in _workloads(ns, seed, profile)]  # all checked before any run
    check_workloads(ns, [(name, w) for _, name, w in workloads])
    with Runner(jobs_at_once) as runner:
        for seed, name, workload in workloads:  # name: the workload's label, preset included
            spec = ClusterSpec(ns.dp or workload.dp_size, profile, routers=ns.routers, lockstep=ns.lockstep,
                               telemetry=ns.telemetry, router_assign=ns.router_assign)
            r_sat = ns.r_sat
            if isinstance(workload.arrival, RelativeLadder):
                if r_sat is None:
                    print(f"asyncdp bench: {name} seed {seed}: measuring R_sat (round_robin in closed loop)",
                          file=sys.stderr, flush=True)
                    r_sat = measure_r_sat(workload, spec, seed, run=runner.run)
                    print(f"asyncdp bench: {name} seed {seed}: R_sat = {r_sat:.4g} req/s (measured)", file=sys.stderr)
                r_sats[f"{name}/{seed}"] = r_sat
            check_span(name, workload, ns, r_sat)
            resolved = resolve(workload, ns.rate_scale, r_sat)
            if ns.export_trace and seed == seeds[0]:
                try:
                    export_trace(ns.export_trace, name, resolved, spec.dp_size, ns.trace_block_size or TRACE_BLOCK)
                except WriteFailed as exc:  # before the runs: nothing is lost
                    print(f"asyncdp bench: error: {exc}", file=sys.stderr)
                    return 1
            hashes[f"{name}/{seed}"] = blake2b(encode_workload(resolved), digest_size=8).hexdigest()
            rungs = _rungs(workload, resolved)
            plans.extend((seed, label, w, spec, rungs) for label, w in expand_sweep(resolved, name))
        # Every run at once (``--jobs`` at a time, each in its own process); the results are read in plan order.
        jobs: list[tuple[Future[Any], str, str, int, Any, Any, dict[str, set[int]], str | None]] = []
        total = len(plans) * (len(policies) + (2 if ns.robustness else 0))
        started = time.monotonic()
        progress: Progress | None = None
        if not jobs_at_once:  # each submit runs its run to the end: said before the first
            print(f"asyncdp bench: {total} runs, one after another in this process", file=sys.stderr, flush=True)
            progress = Progress(total, prefix="asyncdp bench", unit="run")

        def submit(workload: Any, policy: str, seed: int, spec: Any, label: str, rungs: dict[str, set[int]],
                   variant: str | None = None) -> None:
            jobs.append((runner.submit(workload, policy, seed, spec), label, policy, seed, workload, spec, rungs,
                         variant))
            if progress is not None:  # (--jobs 0: the run is over)
                progress.advance(f"{_run_name(jobs[-1])} (done at {time.monotonic() - started:.1f} s)")

        try:
            for seed, label, workload, spec, rungs in plans:
                for policy in policies:
                    submit(workload, policy, seed, spec, label, rungs)
            if ns.robustness:
                for seed, label, workload, spec, rungs in plans:
                    for variant, vspec in (("oracle", replace(spec, telemetry="oracle")),
                                           ("R4", replace(spec, routers=4))):
                        submit(workload, ns.candidate, seed, vspec, label, rungs, variant)
            if jobs_at_once:  # the runs are under way (the first ``--jobs`` of them in their workers)
                print(f"asyncdp bench: {total} runs, {jobs_at_once} at a time", file=sys.stderr, flush=True)
                progress = Progress(total, prefix="asyncdp bench", unit="run")
            names = {id(job[0]): _run_name(job) for job in jobs}
            try:
                for done in runner.completed(job[0] for job in jobs):
                    if jobs_at_once and progress is not None:
                        progress.advance(f"{names[id(done)]} (done at {time.monotonic() - started:.1f} s)")
            except SimulationStalled as exc:
                if progress is not None:
                    progress.close()
                runner.stop()  # the other runs' results would be thrown away
                print(f"asyncdp bench: error: {exc}", file=sys.stderr)
                return 1
        finally:
            if progress is not None:
                progress.close()
    floors: dict[int, dict[int, float]] = {}  # per workload (by identity): req_id -> TTFT floor
    for future, label, policy, seed, workload, spec, rungs, robust_variant in jobs:
        log = future.result()
        if robust_variant is not None:
            robust.extend({**e, "variant": robust_variant}
                          for e in _entries(label, policy, seed, spec, workload, log, rungs))
            continue
        logs[(label, policy, seed)] = log
        if id(workload) not in floors:
            floors[id(workload)] = ttft_floors(workload.records, spec.profile, workload.block_size)
        runs.extend(_entries(label, policy, seed, spec, workload, log, rungs, floors[id(workload)]))
        runs[-1 - len(rungs)]["detectors"] = pathology.signals(log, workload.ideal_hit_rate)
    timing = []
    if ns.decision_time:
        from asyncdp.bench.decision_time import DP_SIZES, measure

        measure(ns.candidate, DP_SIZES[0], decisions=1000, routers=ns.routers)  # a warm-up, discarded: right after the simulations
        # the first size once read 10-20x slow; with --routers R, as one of R API servers
        timing = [measure(ns.candidate, n, routers=ns.routers) for n in DP_SIZES]
    gate_rows = [*report.gates(runs, ns.candidate), pathology.g5(runs, ns.candidate),
                 report.g6(runs, robust, ns.candidate)]
    if ns.decision_time:
        from asyncdp.bench.decision_time import g7

        gate_rows.append(g7(timing, ns.candidate))
    else:
        gate_rows.append(("G7", "n/a", "decision time not measured (run with --decision-time)"))
    print(report.tables(runs, parse_options(ns.option)))
    print()
    print(pathology.table(runs))
    print()
    print(report.gates_text(gate_rows))
    per_seed = report.g2_per_seed(runs, ns.candidate)
    if per_seed is not None:
        print(report.g2_per_seed_text(per_seed))
    failed = [r for r in [*runs, *robust] if r["counts"].get("failed")]
    if failed:  # the tables say which (the !! lines); said here too, where a script's log keeps it
        print(f"asyncdp bench: warning: requests failed in {len(failed)} of "
              f"{sum('failed' in r['counts'] for r in [*runs, *robust])} runs (see the !! lines under the tables)",
              file=sys.stderr)
    header = {"seeds": seeds, "workload_hashes": hashes, "r_sat": r_sats, "scale": ns.scale or DEFAULT_SCALE, "profile": profile.name,
              "profile_hash": profile_hash(profile), "telemetry": ns.telemetry, "routers": ns.routers,
              "router_assign": ns.router_assign, "lockstep": ns.lockstep, "rate_scale": ns.rate_scale, "policies": policies,
              "python": platform.python_version(), "trio": _trio_version(),
              # what was run, as given: a run's "workload" label has the preset, not the other options
              "workloads": csv_items(ns.workload or ""), "trace": ns.trace, "options": parse_options(ns.option)}

    def plots() -> list[Path]:
        from asyncdp.bench.plots import write_plots  # (only with --plots: matplotlib)

        return write_plots(Path(ns.plots), runs, logs, plans, timing, ns.candidate)

    return write_outputs(ns, report.to_json(runs, header, gate_rows, robust, timing, per_seed), runs, robust, plots)


def _run_name(job: tuple[Any, ...]) -> str:
    """How the progress names a job of :func:`_routing`: workload, policy, robustness variant, seed."""
    return f"{job[1]} {job[2]}{' ' + job[7] if job[7] else ''} seed {job[3]}"


def _entries(label: str, policy: str, seed: int, spec: Any, workload: Any, log: Any,
             rungs: dict[str, set[int]], floors: dict[int, float] | None = None) -> list[dict[str, Any]]:
    """The JSON entries of one run: the whole run, then one per ladder rung; with ``floors`` (req_id -> TTFT
    floor), each carries ``ttft_floor_p99_s`` over its requests."""
    from asyncdp.bench import metrics

    def floor(ids: set[int] | None) -> dict[str, float]:
        return {} if floors is None else {"ttft_floor_p99_s": round(metrics.floor_p99(log, floors, ids), 9)}

    def values(ids: set[int] | None) -> dict[str, float | None]:  # None: no request measured it (JSON null)
        return {k: None if v is None else round(v, 9) for k, v in metrics.reported(log, ids).items()}

    error = metrics.first_error(log)  # with counts.failed, what the report says of a run whose requests failed
    base = {"workload": label, "policy": policy, "seed": seed, "dp": spec.dp_size,
            "ideal_hit_rate": workload.ideal_hit_rate}
    whole = {**base, **floor(None), "counts": metrics.summary(log),
             **({"first_error": error} if error is not None else {}), "metrics": values(None)}
    return [whole, *({**base, "workload": f"{label}@{rung_label}", **floor(ids), "counts": {"requests": len(ids)},
                      "metrics": values(ids)}
                     for rung_label, ids in rungs.items())]


def _rungs(workload: Any, resolved: Any) -> dict[str, set[int]]:
    """Rung label -> measured req_ids, for a ladder (``0.7rsat`` for a relative one, ``15rps`` for an absolute
    one); empty otherwise. A rung sent wholly before the warm-up ends (W2's 15 QPS warm-up stage) is not measured
    and has no entry: its label would name a stage that is not one (and could shadow a real stage of the same
    rate)."""
    from asyncdp.bench.arrivals import RelativeLadder, rung_indices
    from asyncdp.bench.metrics import rung_request_ids

    indices = rung_indices(resolved.arrival, [r.t_arrival_ms for r in resolved.records])
    if indices is None:
        return {}
    if isinstance(workload.arrival, RelativeLadder):
        names = [f"{f:g}rsat" for f in workload.arrival.fractions]
    else:
        names = [f"{rate:g}rps" for rate, _ in resolved.arrival.rungs]
    sent_ms = [r.t_arrival_ms for r in resolved.records]  # record i is req_id i (rung_request_ids)
    warm = resolved.warmup_ms
    return {names[k]: ids for k, ids in rung_request_ids(indices).items()
            if not warm or any((sent_ms[i] or 0.0) >= warm for i in ids)}


def _trio_version() -> str:
    import trio

    return str(trio.__version__)
