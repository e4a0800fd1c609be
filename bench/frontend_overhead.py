"""Front-end overhead: requests/s and latency of asyncdp's HTTP path against a bare Quart JSON app.

Sides, each served by Hypercorn in its own child process on 127.0.0.1 (port 0, reported on stdout):
  bare          a Quart app whose POST /v1/completions returns a fixed completion JSON (the floor);
  api+fake      asyncdp's ``create_app`` over ``FakeEngineClient`` (tokenization, validation, fan-out,
                response building; no engine);
  asyncdp       ``asyncdp serve --executor sim --sim-cost 0,0,0,0`` with one API server and one engine process
                (the whole path: HTTP, DP client, engine link, scheduler; the model costs nothing).
The load generator (this process) sends ``--requests`` non-streaming completions with at most
``--concurrency`` in flight over loopback (httpx), after a warm-up, and reports requests/s, p50 and p99
latency, and each side's ratio to ``bare``. Prints a table and writes JSON.

On a small machine the load generator shares the cores with the servers, so requests/s also measures how much
CPU the servers leave it. The CPU columns separate the two (Linux, from /proc): ``srv us`` is the CPU time of
the side's server processes (asyncdp: API server and engine together) per request, ``lg us`` the load
generator's own. A side whose ``lg us`` is far above bare's was limited by the load generator, not by itself.

    python bench/frontend_overhead.py --requests 1000 --concurrency 32 --backend asyncio
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from bench.serving import asyncdp_serve, check_output, positive_int, tree_cpu_s  # noqa: E402

BODY = {"model": "fake-model", "prompt": "hello", "max_tokens": 1, "temperature": 0}


@dataclass
class Result:
    side: str
    requests: int
    concurrency: int
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    server_cpu_us: float | None = None  # CPU time of the server's process tree per request
    loadgen_cpu_us: float | None = None  # CPU time of this process per request


# ---------------------------------------------------------------------- server sides (child processes)


def _bare_app(backend: str) -> Any:
    import orjson
    from quart import Quart, Response, request

    app_class: type[Quart] = Quart
    if backend == "trio":
        from quart_trio import QuartTrio

        app_class = QuartTrio
    app = app_class("bare")
    fixed = orjson.dumps({
        "id": "cmpl-0", "object": "text_completion", "created": 0, "model": "fake-model",
        "choices": [{"index": 0, "text": "a", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    })

    @app.post("/v1/completions")
    async def completions() -> Response:
        orjson.loads(await request.get_data())  # read and parse the body, as any real handler must
        return Response(fixed, content_type="application/json")

    return app


def _api_fake_app(backend: str) -> Any:
    from asyncdp.api import create_app
    from asyncdp.testing import FakeEngineClient

    return create_app(FakeEngineClient(), backend=backend)


def _serve_child(side: str, backend: str) -> None:
    """Child-process main: serve one side on port 0 and print 'PORT <n>' once listening."""
    from asyncdp.api import serve_http

    app = _bare_app(backend) if side == "bare" else _api_fake_app(backend)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            host, port = await tg.start(serve_http, app)
            print(f"PORT {port}", flush=True)

    anyio.run(main, backend=backend)


@contextmanager
def child_server(side: str, backend: str) -> Iterator[tuple[str, int]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, __file__, "--serve", side, "--backend", backend],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the child listens (or dies: then the line is empty)
        if not line.startswith("PORT "):
            raise RuntimeError(f"{side} server failed to start (exit {proc.wait(timeout=10)})")
        yield f"http://127.0.0.1:{int(line.split()[1])}", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def asyncdp_server(backend: str, timeout_s: float = 120.0) -> Iterator[tuple[str, int]]:
    """``asyncdp serve`` on the zero-cost sim executor, one engine, one API server, on a free loopback port."""
    with asyncdp_serve("builtin:tiny-dense", "--served-model-name", str(BODY["model"]), "--executor", "sim",
                       "--sim-cost", "0,0,0,0", "--api-server-count", "1", "--backend", backend,
                       "--log-level", "warning", timeout_s=timeout_s) as served:
        yield served


def run_asyncdp_side(requests: int, concurrency: int, backend: str) -> Result | None:
    """The whole serving path: HTTP, tokenization, DP client, engine link, scheduler, sim executor (zero cost)."""
    with asyncdp_server(backend) as (base_url, pid):
        return anyio.run(measure, "asyncdp", base_url, requests, concurrency, pid)


# ---------------------------------------------------------------------- load generator


async def measure(side: str, base_url: str, requests: int, concurrency: int, server_pid: int | None = None) -> Result:
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30.0) as http:
        for _ in range(min(50, requests)):  # warm-up: connections, caches, imports
            await http.post("/v1/completions", json=BODY)

        remaining = requests

        async def worker() -> None:
            nonlocal remaining, errors
            while remaining > 0:
                remaining -= 1
                t0 = time.perf_counter()
                r = await http.post("/v1/completions", json=BODY)
                latencies.append(time.perf_counter() - t0)
                errors += r.status_code != 200

        server_cpu0 = tree_cpu_s(server_pid)
        start, cpu0 = time.perf_counter(), time.process_time()
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)
        elapsed, loadgen_cpu = time.perf_counter() - start, time.process_time() - cpu0
        server_cpu1 = tree_cpu_s(server_pid)
    latencies.sort()
    return Result(side, requests, concurrency, requests / elapsed, 1000 * statistics.median(latencies),
                  1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], errors,
                  None if server_cpu0 is None or server_cpu1 is None else 1e6 * (server_cpu1 - server_cpu0) / requests,
                  1e6 * loadgen_cpu / requests)


def run_child_side(side: str, requests: int, concurrency: int, backend: str) -> Result:
    with child_server(side, backend) as (base_url, pid):
        return anyio.run(measure, side, base_url, requests, concurrency, pid)


def print_table(results: list[Result]) -> None:
    base = results[0]
    print(f"{'side':<10} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'req/s vs bare':>14} "
          f"{'p50 vs bare':>12} {'srv us':>7} {'lg us':>7}")
    for r in results:
        print(f"{r.side:<10} {r.requests_per_s:>9.0f} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f} {r.errors:>6} "
              f"{r.requests_per_s / base.requests_per_s:>14.2f} {r.p50_ms / base.p50_ms:>12.2f} "
              f"{_us(r.server_cpu_us):>7} {_us(r.loadgen_cpu_us):>7}")


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=positive_int, default=500)
    parser.add_argument("--concurrency", type=positive_int, default=16)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "frontend_overhead.json")
    parser.add_argument("--serve", choices=["bare", "api+fake"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve_child(args.serve, args.backend)
        return
    check_output(parser, "--json", args.json)  # before the servers, not after the runs
    results = [run_child_side(side, args.requests, args.concurrency, args.backend) for side in ("bare", "api+fake")]
    asyncdp_result = run_asyncdp_side(args.requests, args.concurrency, args.backend)
    if asyncdp_result is not None:
        results.append(asyncdp_result)
    print_table(results)
    args.json.write_text(json.dumps({"backend": args.backend, "results": [asdict(r) for r in results]}, indent=2))


if __name__ == "__main__":
    main()
