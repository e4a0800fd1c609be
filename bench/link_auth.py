"""What authenticating the links costs: per link, and on a deployment's startup.

* ``links``: in this process, ``--links`` links opened and used once (connect, the deployment secret's handshake
  when there is one, accept, one frame there and back) over a Unix socket and over TCP on 127.0.0.1, with a secret
  and without, in alternating rounds: the median time per link and the difference.
* ``startup``: ``asyncdp serve builtin:tiny-dense -dp 2`` (torch executor, one thread per engine) started
  ``--startups`` times (``--executor sim``: without loading the model) from this tree and, with ``--baseline DIR`` (a checkout of the tree before link
  authentication: ``git archive d69dbb0 asyncdp | tar -x -C DIR``), as many times from that one, alternately: the
  time from the command to ``/health`` 200 and the launcher's own "startup took" figure. A ``-dp 2`` deployment
  opens 10 links (each engine: the handshake, the coordinator, two API servers; each API server: the coordinator).

It prints a table and writes JSON.

    python bench/link_auth.py --links 2000 --startups 5 --baseline /tmp/asyncdp-before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from asyncdp.bench.metrics import percentile  # noqa: E402
from bench.serving import (  # noqa: E402
    baseline_trees,
    check_output,
    measure_startup,
    non_negative_int,
    positive_int,
    run_cli,
)

MODEL = "builtin:tiny-dense"
ROUNDS = 4
SECRET = os.urandom(32)


async def _links_once(kind: str, secret: bytes | None, n: int, directory: str) -> list[float]:
    from asyncdp import messages as m
    from asyncdp.transport import StreamLink, connect, listen, serve_links

    async def echo(link: StreamLink) -> None:
        async for msg in link:
            await link.send(msg)

    listener, addr = await listen(kind, directory=directory, host="127.0.0.1")
    took: list[float] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: serve_links(listener, echo, secret=secret))
        beat = m.Heartbeat(sender="bench", seq=1)
        for _ in range(n):
            t0 = time.perf_counter()
            link = await connect(addr, secret=secret)
            await link.send(beat)
            await link.receive()
            took.append(time.perf_counter() - t0)
            await link.aclose()
        tg.cancel_scope.cancel()
    return took


async def measure_links(n: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="adp-bench-") as directory:
        for _ in range(ROUNDS):
            for kind in ("unix", "tcp"):
                for name, secret in (("plain", None), ("secret", SECRET)):
                    samples.setdefault(f"{kind}/{name}", []).extend(
                        await _links_once(kind, secret, max(1, n // ROUNDS), directory))
    return {key: {"p50_us": statistics.median(v) * 1e6, "p90_us": percentile(v, 0.9) * 1e6}
            for key, v in samples.items()}


def startup_figures(trees: dict[str, Path], n: int, executor: str) -> dict[str, dict[str, Any]]:
    """``-dp 2`` started ``n`` times from each tree: seconds to /health 200 and the launcher's "startup took"."""
    runs = measure_startup(trees, n, MODEL, "-dp", "2", "--max-model-len", "512", "--executor", executor)
    return {name: {"ready_s": [round(r, 2) for r, _ in v], "startup_took_s": [t for _, t in v],
                   "ready_median_s": statistics.median(r for r, _ in v),
                   "took_median_s": statistics.median(t for _, t in v)} for name, v in runs.items()}


def print_tables(links: dict[str, dict[str, float]], startup: dict[str, dict[str, Any]]) -> None:
    print(f"{'link set-up and one frame there and back':<44} {'p50 µs':>9} {'p90 µs':>9}")
    for key, r in links.items():
        print(f"{key:<44} {r['p50_us']:>9.0f} {r['p90_us']:>9.0f}")
    for kind in ("unix", "tcp"):
        extra = links[f"{kind}/secret"]["p50_us"] - links[f"{kind}/plain"]["p50_us"]
        print(f"{kind}: the handshake adds {extra:.0f} µs per link (p50): {10 * extra / 1000:.2f} ms for -dp 2's 10 links")
    if startup:
        print(f"\n{'-dp 2 startup':<12} {'to /health 200 (s), each run':<44} {'median':>7} {'startup took, median':>21}")
        for name, run in startup.items():
            print(f"{name:<12} {', '.join(f'{x:.2f}' for x in run['ready_s']):<44} {run['ready_median_s']:>7.2f} "
                  f"{run['took_median_s']:>21.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", type=positive_int, default=2000, help="links per side and transport")
    parser.add_argument("--startups", type=non_negative_int, default=3, help="startups per tree (0: none)")
    parser.add_argument("--baseline", type=Path, default=None, help="a checkout without link authentication")
    parser.add_argument("--executor", choices=("torch", "sim"), default="torch",
                        help="the engines' executor: sim skips loading the model, a shorter, steadier startup")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "link_auth.json")
    args = parser.parse_args()
    check_output(parser, "--json", args.json)
    trees = baseline_trees(parser, args.baseline)
    links = anyio.run(measure_links, args.links)
    startup = startup_figures(trees, args.startups, args.executor) if args.startups else {}
    print_tables(links, startup)
    args.json.write_text(json.dumps({"links": links, "startup": startup, "baseline": str(args.baseline),
                                     "executor": args.executor}, indent=2))
    return 0


if __name__ == "__main__":
    run_cli(main)
