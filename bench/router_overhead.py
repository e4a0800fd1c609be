"""Router overhead: what ``asyncdp route`` adds to a request, against the same endpoint called directly.

One endpoint, ``asyncdp serve builtin:tiny-dense --executor sim --sim-cost 0,0,0,0`` (the model costs nothing, so
the HTTP path is what is timed), and one ``asyncdp route`` in front of it, each in its own process on 127.0.0.1.
This process then measures, for each side (``direct`` and ``router``), in alternating rounds so both see the same
machine load:
  * ``seq``: non-streamed completions (``max_tokens`` 1) one at a time: latency p50 / p99;
  * ``stream``: streamed completions (``max_tokens`` 8) one at a time: time to the first event p50, and to the end;
  * ``conc``: ``--concurrency`` non-streamed completions at a time: requests/s.
It prints a table with the router's ratio to direct, and writes JSON. On a small machine the router, the endpoint
and this load generator share the cores: requests/s at concurrency measures the CPU the router takes as well. The
router's own CPU time per request (user + system, from ``/proc/PID/stat`` over its rounds, so its polls in that time
count too) is ``cpu_us_per_req``. ``--baseline-checkout DIR`` adds a side ``baseline``: a second router, run from
another checkout of asyncdp (before a change, say), in front of the same endpoint and measured in the same
alternating rounds, so the two routers are compared under the same load.

    python bench/router_overhead.py --requests 300 --concurrency 16
    python bench/router_overhead.py --requests 400 --baseline-checkout ../asyncdp-main
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from bench.serving import (  # noqa: E402
    ServerStartError,
    asyncdp_serve,
    check_output,
    positive_int,
    run_cli,
    tree_cpu_s,
)

MODEL = "builtin:tiny-dense"
ROUNDS = 4


@contextmanager
def asyncdp_route(endpoint: str, timeout_s: float = 60.0, checkout: Path = ROOT) -> Iterator[tuple[str, int]]:
    """``asyncdp route`` (from ``checkout``) in front of ``endpoint`` on a free port; yields its base URL and pid,
    stops it (SIGTERM) after."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-m", "asyncdp", "route", "--endpoint", endpoint, "--host",
                                 "127.0.0.1", "--port", "0"], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(checkout)},
                                cwd=checkout, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            while (m := re.search(rb"routing on (http://\S+) ", _read(log))) is None:
                try:
                    code = proc.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    if time.monotonic() > deadline:
                        raise ServerStartError(f"asyncdp route did not start in {timeout_s:g} s") from None
                else:
                    raise ServerStartError(f"asyncdp route exited with {code}: {_read(log)[-2000:].decode()}")
            yield m.group(1).decode(), proc.pid
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _read(log: Any) -> bytes:
    log.seek(0)
    return bytes(log.read())


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _sequential(http: httpx.AsyncClient, base: str, n: int, out: dict[str, list[float]]) -> None:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 1}
    for _ in range(n):
        t0 = time.perf_counter()
        r = await http.post(f"{base}/v1/completions", json=body)
        r.raise_for_status()
        out["seq_ms"].append((time.perf_counter() - t0) * 1e3)
    stream_body = {**body, "max_tokens": 8, "stream": True, "ignore_eos": True}
    for _ in range(max(1, n // 2)):
        t0 = time.perf_counter()
        first = None
        async with http.stream("POST", f"{base}/v1/completions", json=stream_body) as r:
            r.raise_for_status()
            async for _chunk in r.aiter_raw():
                first = first if first is not None else time.perf_counter()
        end = time.perf_counter()
        out["first_event_ms"].append(((first or end) - t0) * 1e3)
        out["stream_ms"].append((end - t0) * 1e3)


async def _concurrent(http: httpx.AsyncClient, base: str, n: int, concurrency: int) -> float:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 1}
    limiter = anyio.Semaphore(concurrency)

    async def one() -> None:
        async with limiter:
            (await http.post(f"{base}/v1/completions", json=body)).raise_for_status()

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(one)
    return n / (time.perf_counter() - t0)


async def measure(sides: dict[str, str], requests: int, concurrency: int,
                  pids: dict[str, int] | None = None) -> dict[str, dict[str, float]]:
    """Each side's figures; ``pids``: the router process of each router side, whose CPU time is measured."""
    pids = pids or {}
    samples: dict[str, dict[str, list[float]]] = {side: {"seq_ms": [], "first_event_ms": [], "stream_ms": [], "rps": []} for side in sides}
    cpu = dict.fromkeys(sides, 0.0)
    served = dict.fromkeys(sides, 0)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60.0, limits=limits) as http:
        for base in sides.values():  # warm-up: connections, first-request paths
            await _sequential(http, base, 10, {k: [] for k in ("seq_ms", "first_event_ms", "stream_ms")})
        per_round = max(1, requests // ROUNDS)
        for _ in range(ROUNDS):
            for side, base in sides.items():
                out = samples[side]
                cpu[side] -= tree_cpu_s(pids.get(side)) or 0.0
                await _sequential(http, base, per_round, out)
                out["rps"].append(await _concurrent(http, base, per_round * 2, concurrency))
                cpu[side] += tree_cpu_s(pids.get(side)) or 0.0
                served[side] += per_round + max(1, per_round // 2) + per_round * 2
    return {side: {"seq_p50_ms": statistics.median(s["seq_ms"]), "seq_p99_ms": _pct(s["seq_ms"], 0.99),
                   "first_event_p50_ms": statistics.median(s["first_event_ms"]),
                   "stream_p50_ms": statistics.median(s["stream_ms"]),
                   "conc_rps": statistics.median(s["rps"]),
                   "cpu_us_per_req": cpu[side] / served[side] * 1e6} for side, s in samples.items()}


def print_table(results: dict[str, dict[str, float]], concurrency: int) -> None:
    keys = ["seq_p50_ms", "seq_p99_ms", "first_event_p50_ms", "stream_p50_ms", "conc_rps", "cpu_us_per_req"]
    print(f"{'side':<8} " + " ".join(f"{k:>19}" for k in keys[:4]) + f" {'req/s @' + str(concurrency):>19}"
          f" {'router cpu us/req':>19}")
    for side, r in results.items():
        print(f"{side:<8} " + " ".join(f"{r[k]:>19.2f}" for k in keys))
    d, rt = results["direct"], results["router"]
    print(f"{'ratio':<8} " + " ".join(f"{rt[k] / d[k]:>19.2f}" for k in keys[:-1]))
    if (base := results.get("baseline")) is not None:
        print(f"{'/base':<8} " + " ".join(f"{rt[k] / base[k]:>19.2f}" for k in keys))
    print(f"added latency, one request at a time: p50 {rt['seq_p50_ms'] - d['seq_p50_ms']:+.2f} ms, first event "
          f"{rt['first_event_p50_ms'] - d['first_event_p50_ms']:+.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=positive_int, default=200, help="sequential requests per side")
    parser.add_argument("--concurrency", type=positive_int, default=16)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "router_overhead.json")
    parser.add_argument("--baseline-checkout", type=Path, default=None, metavar="DIR",
                        help="also measure a router run from this checkout of asyncdp (side 'baseline')")
    args = parser.parse_args()
    check_output(parser, "--json", args.json)  # before the servers, not after the runs
    if args.baseline_checkout is not None and not (args.baseline_checkout / "asyncdp" / "__init__.py").is_file():
        parser.error(f"--baseline-checkout: {args.baseline_checkout} is not a checkout of asyncdp (no "
                     "asyncdp/__init__.py)")
    with contextlib.ExitStack() as stack:
        endpoint, _pid = stack.enter_context(asyncdp_serve(MODEL, "--executor", "sim", "--sim-cost", "0,0,0,0"))
        router, router_pid = stack.enter_context(asyncdp_route(endpoint))
        sides, pids = {"direct": endpoint, "router": router}, {"router": router_pid}
        if args.baseline_checkout is not None:
            sides["baseline"], pids["baseline"] = stack.enter_context(
                asyncdp_route(endpoint, checkout=args.baseline_checkout.resolve()))
        results = anyio.run(measure, sides, args.requests, args.concurrency, pids)
    print_table(results, args.concurrency)
    baseline = None if args.baseline_checkout is None else str(args.baseline_checkout.resolve())
    args.json.write_text(json.dumps({"requests": args.requests, "concurrency": args.concurrency,
                                     "baseline_checkout": baseline, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    run_cli(main)
