"""Multi-node overhead and failure detection, side by side in one run (issue 8).

Three deployments of the same model and rank count on loopback, driven by the same burst of completions:

* ``one node``: ``-dp 4`` (every link a Unix socket);
* ``head + headless``: ``-dp 4 -dpl 2`` on the head and ``-dp 4 -dpl 2 -dpr 2 --headless`` as a second launch
  (the handshake, client, coordinator and rendezvous links of the remote ranks go over TCP);
* ``hybrid``: two launches with ``-dph -dpl 2``, each an endpoint for its own two ranks, the burst split between
  them.

Every endpoint runs one API server, so the comparison is about the links, not the API-process count.

It prints requests/s and mean/p99 latency per deployment and their ratio to ``one node``, then kills the head's
tree of the head + headless deployment and reports how long the headless node took to notice and exit.

Run: ``.venv/bin/python bench/multinode.py [--requests 200] [--concurrency 16] [--max-tokens 16]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.serving import (  # noqa: E402
    ROOT,
    ServerStartError,
    _log_tail,
    check_output,
    descendants,
    exit_on_sigterm,
    free_port,
    positive_int,
    run_cli,
)

MODEL = "builtin:tiny-dense"
BASE = ("--executor", "torch", "--max-model-len", "512", "--torch-threads", "1")


@contextmanager
def launch(*args: str, port: int | None, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    exit_on_sigterm()
    cmd = [sys.executable, "-m", "asyncdp", "serve", MODEL, *BASE, *args]
    if port is not None:  # an endpoint: one API server; a headless node has none
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--api-server-count", "1"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                                start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def wait_healthy(urls: list[str], procs: dict[str, subprocess.Popen[bytes]], log: Path,
                 timeout_s: float = 180.0) -> None:
    """Until every url's ``/health`` answers 200; a launch that exits first, or the timeout, is a ServerStartError
    naming it, with the log's last lines (a bad flag or a taken port shows at once, not after the timeout)."""
    deadline = time.monotonic() + timeout_s
    pending = list(urls)
    while pending:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise ServerStartError(f"the {name} exited with {proc.returncode} before ready{_tail(log)}")
        if time.monotonic() > deadline:
            raise ServerStartError(f"not healthy within {timeout_s:g} s: {pending}{_tail(log)}")
        try:
            if httpx.get(f"{pending[0]}/health", timeout=2.0).status_code == 200:
                pending.pop(0)
                continue
        except httpx.TransportError:
            pass
        time.sleep(0.2)


def _tail(log: Path) -> str:
    """The log's last lines, as a failed start reports them (bench.serving's reader, on the file every launch
    appends to)."""
    with open(log, "rb") as f:
        return _log_tail(f)


async def burst(urls: list[str], n: int, concurrency: int, max_tokens: int) -> tuple[float, list[float]]:
    """``n`` completions spread round-robin over ``urls``; returns (wall seconds, per-request latencies)."""
    sem = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    async with httpx.AsyncClient(timeout=60.0) as http:
        async def one(i: int) -> None:
            async with sem:
                t0 = time.perf_counter()
                r = await http.post(f"{urls[i % len(urls)]}/v1/completions",
                                    json={"model": MODEL, "prompt": f"request {i} of the burst", "max_tokens": max_tokens,
                                          "ignore_eos": True, "temperature": 1.0})
                r.raise_for_status()
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - t0, latencies


def measure(name: str, urls: list[str], args: argparse.Namespace) -> dict[str, float]:
    asyncio.run(burst(urls, min(20, args.requests), args.concurrency, args.max_tokens))  # warm-up
    wall, lat = asyncio.run(burst(urls, args.requests, args.concurrency, args.max_tokens))
    lat.sort()
    row = {"rps": args.requests / wall, "mean_s": statistics.fmean(lat), "p99_s": lat[int(0.99 * (len(lat) - 1))]}
    print(f"  {name:<16} {row['rps']:7.1f} req/s  mean {row['mean_s'] * 1000:7.1f} ms  p99 {row['p99_s'] * 1000:7.1f} ms",
          flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=positive_int, default=200)
    parser.add_argument("--concurrency", type=positive_int, default=16)
    parser.add_argument("--max-tokens", type=positive_int, default=16)
    parser.add_argument("--log", type=Path, default=Path("/tmp/asyncdp-bench-multinode.log"))
    args = parser.parse_args()
    check_output(parser, "--log", args.log)  # before the servers: each appends its output here
    rows: dict[str, dict[str, float]] = {}
    print(f"{args.requests} completions of {args.max_tokens} tokens, concurrency {args.concurrency}, "
          f"{MODEL}, 4 ranks (log: {args.log})", flush=True)

    port = free_port()
    with launch("-dp", "4", port=port, log=args.log) as one:
        wait_healthy([f"http://127.0.0.1:{port}"], {"one-node launch": one}, args.log)
        rows["one node"] = measure("one node", [f"http://127.0.0.1:{port}"], args)

    port, rpc = free_port(), free_port()
    net: tuple[str, ...] = ("-dpa", "127.0.0.1", "-dpp", str(rpc))
    detect_s = None
    with ExitStack() as stack:
        head = stack.enter_context(launch("-dp", "4", "-dpl", "2", *net, port=port, log=args.log))
        node = stack.enter_context(launch("-dp", "4", "-dpl", "2", "-dpr", "2", "--headless", *net, port=None,
                                          log=args.log))
        wait_healthy([f"http://127.0.0.1:{port}"], {"head": head, "headless node": node}, args.log)
        rows["head + headless"] = measure("head + headless", [f"http://127.0.0.1:{port}"], args)
        tree = [head.pid, *descendants(head.pid)]  # its children lead their own sessions: kill each
        t0 = time.monotonic()
        for pid in tree:
            _kill(pid)
        try:
            code: int | str = node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = "nothing (still running: a defect)"
        detect_s = time.monotonic() - t0
        print(f"  head SIGKILLed: the headless node exited with {code} after {detect_s:.2f} s", flush=True)

    p0, p1, rpc = free_port(), free_port(), free_port()
    net = ("-dpa", "127.0.0.1", "-dpp", str(rpc), "-dph")
    with ExitStack() as stack:
        second = stack.enter_context(launch("-dp", "4", "-dpl", "2", "-dpr", "2", *net, port=p1, log=args.log))
        first = stack.enter_context(launch("-dp", "4", "-dpl", "2", "-dpr", "0", *net, port=p0, log=args.log))
        urls = [f"http://127.0.0.1:{p0}", f"http://127.0.0.1:{p1}"]
        wait_healthy(urls, {"first hybrid node": first, "second hybrid node": second}, args.log)
        rows["hybrid"] = measure("hybrid", urls, args)

    base = rows["one node"]
    print("\nratio to one node (req/s, mean latency, p99 latency):")
    for name, row in rows.items():
        print(f"  {name:<16} {row['rps'] / base['rps']:5.2f}  {row['mean_s'] / base['mean_s']:5.2f}  "
              f"{row['p99_s'] / base['p99_s']:5.2f}")
    return 0


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    run_cli(main)
