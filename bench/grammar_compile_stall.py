"""How long a large JSON schema's grammar compilation stalls the other requests of its rank.

``asyncdp serve MODEL`` (one rank, so every request shares it) from this tree and, with ``--baseline DIR`` (a
checkout whose rank compiled each grammar on its busy loop under the step limiter: ``git archive 1707dc0 | tar -x
-C DIR``), from that one, alternately per round. Per trial: a plain completion streams ``--plain-tokens`` tokens;
after its ``--lead-chunks``-th chunk a ``guided_json`` request with a schema of ``--tools`` objects (names salted
per trial, so no compiled grammar is reused) is sent. Reported per tree, medians over the trials: the plain
stream's longest gap between two chunks from that send on (what the compilation cost it), its mean gap before the
send (a step), the plain request's whole time and the constrained one's latency. A first constrained request per
server waits for the grammar library's warm-up before the trials.

    python bench/grammar_compile_stall.py --baseline /tmp/asyncdp-before --tools 200 --trials 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from bench.serving import asyncdp_serve, baseline_trees, check_output, positive_int, run_cli  # noqa: E402


def schema(tools: int, salt: str) -> dict[str, Any]:
    args = {f"arg{j}": {"type": ["string", "integer", "boolean"]} for j in range(6)}
    return {"type": "object", "properties": {f"{salt}_tool{i}": {"type": "object", "properties": args,
                                                                  "required": ["arg0"]} for i in range(tools)}}


def _constrained(client: httpx.Client, model: str, tools: int, salt: str) -> float:
    t0 = time.perf_counter()
    client.post("/v1/completions", json={"model": model, "prompt": "JSON:", "max_tokens": 8, "temperature": 0,
                                         "guided_json": schema(tools, salt)}).raise_for_status()
    return time.perf_counter() - t0


def trial(client: httpx.Client, pool: ThreadPoolExecutor, model: str, args: argparse.Namespace, salt: str,
          ) -> dict[str, float]:
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": args.plain_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    stamps: list[float] = []
    sent_at = None
    constrained = None
    t0 = time.perf_counter()
    with client.stream("POST", "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            stamps.append(time.perf_counter())
            if len(stamps) == args.lead_chunks:
                sent_at = time.perf_counter()
                constrained = pool.submit(_constrained, client, model, args.tools, salt)
    plain_s = time.perf_counter() - t0
    if constrained is None or sent_at is None:
        raise RuntimeError(f"the plain stream ended after {len(stamps)} chunks, before --lead-chunks")
    constrained_s = constrained.result()
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    lead = gaps[:args.lead_chunks - 1]
    after = [b - max(a, sent_at) for a, b in zip(stamps, stamps[1:], strict=False) if b > sent_at]
    return {"stall_s": max(after, default=0.0), "step_s": statistics.mean(lead) if lead else float("nan"),
            "plain_s": plain_s, "constrained_s": constrained_s}


def serve_trials(tree: Path, args: argparse.Namespace, round_: int) -> list[dict[str, float]]:
    with tempfile.TemporaryFile() as log, asyncdp_serve(args.model, "--torch-threads", "1", log=log,
                                                        env={"OMP_NUM_THREADS": "1"}, timeout_s=240, tree=tree) as (
            base, _pid), httpx.Client(base_url=base, timeout=120) as client, ThreadPoolExecutor(1) as pool:
        _constrained(client, args.model, 2, "warm")  # waits for the grammar library's warm-up
        return [trial(client, pool, args.model, args, f"r{round_}t{i}") for i in range(args.trials)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m")
    parser.add_argument("--tools", type=positive_int, default=200, help="objects in the constrained schema")
    parser.add_argument("--trials", type=positive_int, default=5, help="trials per server")
    parser.add_argument("--rounds", type=positive_int, default=1, help="servers per tree, alternating")
    parser.add_argument("--plain-tokens", type=positive_int, default=64)
    parser.add_argument("--lead-chunks", type=positive_int, default=8)
    parser.add_argument("--baseline", type=Path, default=None, help="a checkout that compiles on the busy loop")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "grammar_compile_stall.json")
    args = parser.parse_args()
    if args.lead_chunks >= args.plain_tokens:
        parser.error("--lead-chunks must be below --plain-tokens")
    check_output(parser, "--json", args.json)
    trees = baseline_trees(parser, args.baseline)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        for name, tree in trees.items():
            runs[name] += serve_trials(tree, args, round_)
            print(name, runs[name][-args.trials:], flush=True)
    keys = ("stall_s", "step_s", "plain_s", "constrained_s")
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in runs.items()}
    print(f"\n{args.model}, one rank, a {args.tools}-object guided_json beside a {args.plain_tokens}-token stream; "
          f"medians of {args.trials * args.rounds} trials")
    print(f"{'tree':<10} {'plain stall s':>14} {'plain step s':>13} {'plain total s':>14} {'json_schema s':>14}")
    for name, med in medians.items():
        print(f"{name:<10} {med['stall_s']:>14.3f} {med['step_s']:>13.4f} {med['plain_s']:>14.3f} "
              f"{med['constrained_s']:>14.3f}")
    if "baseline" in medians:
        ratio = medians["this tree"]["stall_s"] / medians["baseline"]["stall_s"]
        print(f"plain stall, this tree / baseline: {ratio:.3f}")
    args.json.write_text(json.dumps({"model": args.model, "tools": args.tools, "baseline": str(args.baseline),
                                     "runs": runs, "medians": medians}, indent=2))
    return 0


if __name__ == "__main__":
    run_cli(main)
