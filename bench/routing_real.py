"""Routing policies on the real engine, side by side in one run (issue 10 item 6).

For each policy (``--policies``, default ``asyncdp,vllm,round_robin``) this launches a fresh
``asyncdp serve builtin:tiny-dense -dp 2 --lb-policy POLICY`` (torch executor on CPU, one API server, one torch
thread per engine) and replays the same shared-prefix workload over HTTP with ``bench/http_replay.py``: W1 (SGLang's
generated shared prefix) scaled down to tiny-dense, ``--groups`` system prompts of ``--system-len`` tokens, each
shared by ``--prompts`` questions, Poisson arrivals at ``--rate`` requests/s. Every policy gets the same records, the
same send times and a cold server.

The KV cache per rank (``--kv-blocks``, blocks of 16) is set so that one rank cannot hold every system prompt
while half of them fit: a policy that spreads each group over both ranks keeps evicting, one that keeps groups
together does not. That is what a real cluster's cache pressure looks like, at a size this machine can run.

Per policy it reports the prefix-cache hit rate (the server's ``vllm:prefix_cache_{hits,queries}`` counters
differenced around the run), TTFT mean and p99, e2e p99, output throughput and the busiest rank's share of
requests (from ``vllm:request_success``), then the same as ratios to ``vllm``. Progress goes to stderr; ``--json
OUT`` writes everything. No figure is asserted: the 2-core machine this runs on is shared, so read ratios, not
absolute times.

    PYTHONPATH=$PWD .venv/bin/python bench/routing_real.py [--policies asyncdp,vllm,round_robin] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import anyio
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from asyncdp.bench.materialise import ideal_hit_rate  # noqa: E402
from asyncdp.bench.records import Workload, resolve  # noqa: E402
from asyncdp.bench.workloads import build  # noqa: E402
from bench.http_replay import (  # noqa: E402
    MODEL,
    Replay,
    fit_to_model,
    progress_printer,
    ratios,
    replay,
    server_flags,
    table,
)
from bench.serving import asyncdp_serve  # noqa: E402

KEYS = ("prefix_hit_rate", "ttft_mean_s", "ttft_p99_s", "e2e_p99_s", "throughput_tok_s", "max_mean_load_ratio")
FMT = {"prefix_hit_rate": ".3f", "ttft_mean_s": ".4f", "ttft_p99_s": ".4f", "e2e_p99_s": ".4f",
       "throughput_tok_s": ".1f", "max_mean_load_ratio": ".2f"}
ENGINE_FLAGS = ("--torch-threads", "1")


def shared_prefix_workload(args: argparse.Namespace) -> Workload:
    """W1 at tiny-dense's size: the same generator as ``asyncdp bench routing --workload w1``, its knobs scaled."""
    options = {"groups": args.groups, "prompts_per_group": args.prompts, "system_len": args.system_len,
               "question_len": args.question_len, "output_len": args.output_len, "arrival": "poisson",
               "rate_rps": args.rate, "dp": 2}
    workload = build("w1", "quick", args.seed, options)
    workload = fit_to_model(workload)
    return resolve(msgspec.structs.replace(workload, kv_blocks_per_rank=args.kv_blocks))


def run_policy(policy: str, workload: Workload, args: argparse.Namespace) -> Replay:
    flags = [*server_flags(workload, args.kv_blocks), *ENGINE_FLAGS, "--lb-policy", policy]
    with ExitStack() as stack:
        log = stack.enter_context(open(args.log_dir / f"serve-{policy}.log", "wb")) if args.log_dir else None
        print(f"[{policy}] starting asyncdp serve {MODEL} {' '.join(flags)}", file=sys.stderr, flush=True)
        base_url, _pid = stack.enter_context(asyncdp_serve(MODEL, *flags, log=log, timeout_s=args.startup_timeout))
        print(f"[{policy}] ready at {base_url}; replaying {len(workload.records)} requests",
              file=sys.stderr, flush=True)
        return anyio.run(lambda: replay(base_url, workload, concurrency=args.concurrency,
                                        deadline_s=args.deadline, progress=progress_printer(policy)))
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", default="asyncdp,vllm,round_robin")
    ap.add_argument("--groups", type=int, default=8, help="system prompts (W1's G)")
    ap.add_argument("--prompts", type=int, default=8, help="questions per system prompt (W1's P)")
    ap.add_argument("--system-len", type=int, default=768)
    ap.add_argument("--question-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--rate", type=float, default=8.0, help="Poisson arrival rate, requests/s")
    ap.add_argument("--kv-blocks", type=int, default=320, help="KV blocks (of 16 tokens) per rank")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=64, help="most requests outstanding at the client")
    ap.add_argument("--deadline", type=float, default=120.0, help="seconds allowed per policy's replay")
    ap.add_argument("--startup-timeout", type=float, default=180.0)
    ap.add_argument("--log-dir", type=Path, default=None, help="keep each server's output here")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if args.log_dir:
        args.log_dir.mkdir(parents=True, exist_ok=True)

    workload = shared_prefix_workload(args)
    total_in = sum(r.input_length for r in workload.records)
    print(f"workload: W1 G={args.groups} P={args.prompts} S={args.system_len} Q={args.question_len} "
          f"O={args.output_len}, {len(workload.records)} requests, {total_in} prompt tokens, Poisson "
          f"{args.rate:g} rps, ideal hit rate {ideal_hit_rate(workload.records):.3f}; "
          f"dp 2, {args.kv_blocks} KV blocks/rank", flush=True)
    results: dict[str, dict[str, float]] = {}
    started = time.monotonic()
    for i, policy in enumerate(policies, 1):
        print(f"[{i}/{len(policies)}] {policy}", file=sys.stderr, flush=True)
        rep = run_policy(policy, workload, args)
        results[policy] = rep.metrics()
        m = results[policy]
        print(f"[{policy}] done in {rep.wall_s:.1f} s: {m['completed']:.0f} completed, {m['failed']:.0f} failed, "
              f"hit rate {m['prefix_hit_rate']:.3f}, TTFT mean {m['ttft_mean_s']:.4f} s", file=sys.stderr,
              flush=True)
    print(f"\nper policy ({time.monotonic() - started:.0f} s in all):")
    print(table(results, (*KEYS, "completed", "failed"), {**FMT, "completed": ".0f", "failed": ".0f"}, "policy"))
    rel: dict[str, dict[str, float]] = {}
    if "vllm" in results:
        rel = ratios(results, "vllm", KEYS)
        print("\nratio to vllm (hit rate and throughput: higher is better; the rest: lower is better):")
        print(table(rel, KEYS, {k: ".2f" for k in KEYS}, "policy"))
    failed = sum(int(m["failed"]) for m in results.values())
    if failed:
        print(f"\nWARNING: {failed} requests failed; the figures cover completed requests only.")
    if args.json:
        args.json.write_text(json.dumps({"workload": {"name": "w1", "options": workload.options,
                                                      "requests": len(workload.records),
                                                      "ideal_hit_rate": ideal_hit_rate(workload.records),
                                                      "kv_blocks_per_rank": args.kv_blocks},
                                         "policies": results, "ratio_to_vllm": rel}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
