"""Routing policies on the real engine, side by side in one run (issue 10 item 6).

For each policy (``--policies``, default ``asyncdp,vllm,round_robin``) this launches a fresh
``asyncdp serve builtin:tiny-dense -dp 2 --lb-policy POLICY`` (torch executor on CPU, one API server unless
``--api-servers N``, one torch thread per engine) and replays the same shared-prefix workload over HTTP with ``bench/http_replay.py``. By default
that is W1 (SGLang's generated shared prefix) scaled down to tiny-dense: 8 system prompts of 768 tokens, each
shared by 8 questions of 32 tokens, 16 output tokens, Poisson arrivals at 8 requests/s (``--rate``, ``--options``
and ``--workload`` change it). Every policy gets the same records, the same send times and a cold server.

The KV cache per rank (``--kv-blocks``, blocks of 16 tokens, default 320) is set so that one rank cannot hold
every system prompt while half of them fit: a policy that spreads each group over both ranks keeps evicting, one
that keeps groups together does not. That is what a real cluster's cache pressure looks like, at a size this
machine can run.

Per policy it reports the prefix-cache hit rate (the server's ``vllm:prefix_cache_{hits,queries}`` counters
differenced around the run), TTFT mean and p99, e2e p99, output throughput and the busiest rank's completed
requests over the mean (from ``vllm:request_success``), then the same as ratios to ``vllm``. Progress goes to
stderr; ``--json OUT`` writes everything. No figure is asserted: the 2-core machine this runs on is shared, so read
the ratios, not the absolute times.

With ``--api-servers 2 --policies asyncdp,asyncdp@local,vllm`` it shows the coordinator's prefix directory on the
real engine: the two API servers agree on each new system prompt (``asyncdp``) or place it each on its own
(``asyncdp@local``).

    PYTHONPATH=$PWD .venv/bin/python bench/routing_real.py [--policies asyncdp,vllm,round_robin] [--api-servers N]
                                                          [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from asyncdp.bench.materialise import ideal_hit_rate  # noqa: E402
from asyncdp.bench.records import Workload  # noqa: E402
from bench.http_replay import (  # noqa: E402
    add_workload_args,
    checked_workload,
    describe,
    ratios,
    serve_and_replay,
    table,
)
from bench.serving import policy_list, positive_int, run_cli  # noqa: E402

KEYS = ("prefix_hit_rate", "ttft_mean_s", "ttft_p99_s", "e2e_p99_s", "throughput_tok_s", "max_mean_load_ratio")
FMT = {"prefix_hit_rate": ".3f", "ttft_mean_s": ".4f", "ttft_p99_s": ".4f", "e2e_p99_s": ".4f",
       "throughput_tok_s": ".1f", "max_mean_load_ratio": ".2f", "completed": ".0f", "failed": ".0f"}
ENGINE_FLAGS = ("--torch-threads", "1")


def run(policies: list[str], workload: Workload, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    for i, policy in enumerate(policies, 1):
        print(f"[{i}/{len(policies)}] {policy}", file=sys.stderr, flush=True)
        rep = serve_and_replay(policy, workload, args, [*ENGINE_FLAGS, "--api-server-count", str(args.api_servers)])
        m = results[policy] = rep.metrics()
        print(f"[{policy}] done in {rep.wall_s:.1f} s: {m['completed']:.0f} completed, {m['failed']:.0f} failed, "
              f"hit rate {m['prefix_hit_rate']:.3f}, TTFT mean {m['ttft_mean_s']:.4f} s, load average "
              f"{m['load_1m']:.2f}", file=sys.stderr,
              flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", type=policy_list, default="asyncdp,vllm,round_robin",
                    help="comma-separated load-balancing policies (asyncdp bench routing --list-policies)")
    ap.add_argument("--api-servers", type=positive_int, default=1,
                    help="API-server processes sharing the port (2 with asyncdp,asyncdp@local: the prefix directory)")
    add_workload_args(ap)
    args = ap.parse_args(argv)
    policies: list[str] = args.policies
    workload = checked_workload(ap, args)  # every argument checked before the first server starts
    print(describe(workload), flush=True)
    started = time.monotonic()
    results = run(policies, workload, args)
    print(f"\nper policy ({time.monotonic() - started:.0f} s in all):")
    print(table(results, (*KEYS, "completed", "failed", "load_1m"), {**FMT, "load_1m": ".2f"}, "policy"))
    rel: dict[str, dict[str, float]] = {}
    if "vllm" in results:
        rel = ratios(results, "vllm", KEYS)
        print("\nratio to vllm (hit rate, throughput: higher is better; latencies, load ratio: lower is better):")
        print(table(rel, KEYS, {k: ".2f" for k in KEYS}, "policy"))
    failed = sum(int(m["failed"]) for m in results.values())
    if failed:
        print(f"\nWARNING: {failed} requests failed; the figures cover completed requests only.")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "workload": {"name": workload.name, "options": workload.options, "requests": len(workload.records),
                         "ideal_hit_rate": ideal_hit_rate(workload.records),
                         "kv_blocks_per_rank": workload.kv_blocks_per_rank},
            "policies": results, "ratio_to_vllm": rel}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    run_cli(main)
