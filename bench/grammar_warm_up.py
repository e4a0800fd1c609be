"""What the grammar library's warm-up costs a deployment's startup and its first requests.

``asyncdp serve MODEL -dp 2`` (torch executor, one thread per engine) started ``--startups`` times from this tree
and, with ``--baseline DIR`` (a checkout of the tree whose ranks built the grammar library's tokenizer before they
reported ready: ``git archive fadf0a2 | tar -x -C DIR``), as many times from that one, alternately. Per startup:
each rank's "ready in" figure and the seconds from its "KV cache" line (model built) to its "ready" line (the
warm-up, when it came before ready, then the wait for the other rank and the links), the launcher's "startup took", the time from the command to ``/health`` 200, and,
sent together the moment ``/health`` answers, one plain and one ``json_schema`` chat request (8 tokens at most):
their latencies, which include the wait for (and the GIL held by) a warm-up still running.

    python bench/grammar_warm_up.py --model builtin:smollm2-135m --startups 4 --baseline /tmp/asyncdp-before
"""

from __future__ import annotations

import argparse
import json
import re
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

from bench.serving import asyncdp_serve, baseline_trees, check_output, positive_int, run_cli, startup_took  # noqa: E402

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["answer"], "additionalProperties": False}


def _chat(client: httpx.Client, model: str, structured: bool) -> float:
    body: dict[str, Any] = {"model": model, "max_tokens": 8, "temperature": 0,
                            "messages": [{"role": "user", "content": "Is Paris in France?"}]}
    if structured:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "yes_no", "schema": SCHEMA}}
    t0 = time.perf_counter()
    client.post("/v1/chat/completions", json=body).raise_for_status()
    return time.perf_counter() - t0


def _seconds(hms: str) -> float:
    h, m, sec = hms.split(":")
    return int(h) * 3600 + int(m) * 60 + float(sec)


def start_once(tree: Path, model: str) -> dict[str, Any]:
    with tempfile.TemporaryFile() as log:
        t0 = time.perf_counter()
        with asyncdp_serve(model, "-dp", "2", "--torch-threads", "1", log=log, env={"OMP_NUM_THREADS": "1"},
                           timeout_s=240, tree=tree, poll_s=0.05) as (base, _pid):
            health_s = time.perf_counter() - t0
            with httpx.Client(base_url=base, timeout=120) as client, ThreadPoolExecutor(2) as pool:
                plain = pool.submit(_chat, client, model, False)
                structured = pool.submit(_chat, client, model, True)
                first = {"plain_s": plain.result(), "structured_s": structured.result()}
        took_s = startup_took(log)
        log.seek(0)
        text = log.read().decode(errors="replace")
    ranks = [float(x) for x in re.findall(r"rank \d+ ready in ([0-9.]+) s", text)]
    stamps = {(what, rank): _seconds(hms) for hms, rank, what in
              re.findall(r"INFO (\d\d:\d\d:[0-9.]+) .*?rank (\d+)(: KV cache| ready in)", text)}
    tail = [round(stamps[(" ready in", r)] - stamps[(": KV cache", r)], 3) for w, r in stamps if w == " ready in"]
    return {"health_s": round(health_s, 2), "startup_took_s": took_s,
            "rank_ready_s": ranks, "model_loaded_to_ready_s": tail, **{k: round(v, 3) for k, v in first.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m")
    parser.add_argument("--startups", type=positive_int, default=3, help="startups per tree")
    parser.add_argument("--baseline", type=Path, default=None, help="a checkout that warms up before ready")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "grammar_warm_up.json")
    args = parser.parse_args()
    check_output(parser, "--json", args.json)
    trees = baseline_trees(parser, args.baseline)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for _ in range(args.startups):
        for name, tree in trees.items():
            runs[name].append(start_once(tree, args.model))
            print(name, runs[name][-1], flush=True)
    print(f"\n{args.model}, -dp 2, medians of {args.startups} startups")
    print(f"{'tree':<10} {'rank ready s':>13} {'loaded->ready s':>16} {'startup took s':>15} {'/health s':>10} {'plain s':>8} "
          f"{'json_schema s':>14}")
    for name, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("startup_took_s", "health_s", "plain_s",
                                                                 "structured_s")}
        ready = statistics.median(x for r in rs for x in r["rank_ready_s"])
        tail = statistics.median(x for r in rs for x in r["model_loaded_to_ready_s"])
        print(f"{name:<10} {ready:>13.2f} {tail:>16.3f} {med['startup_took_s']:>15.2f} {med['health_s']:>10.2f} "
              f"{med['plain_s']:>8.3f} {med['structured_s']:>14.3f}")
    args.json.write_text(json.dumps({"model": args.model, "baseline": str(args.baseline), "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    run_cli(main)
