"""A minimal load-aware router for asyncdp rank endpoints (external LB), reading ``GET /load``.

It polls every endpoint's ``/load`` every 50 ms and sends each request to the endpoint whose rank has the lowest
``waiting + running``, plus the requests this router sent there since that endpoint's ``seq`` last changed, plus the rank's
prompt tokens still to compute in units of ``PREFILL_TOKENS_PER_REQUEST`` (a rank prefilling a 50 000-token document
is busier than its one request says), plus a penalty for KV-cache pressure. Endpoints whose rank is down, or that
do not answer ``/load`` (at the start too), are skipped until they answer (the data's
``age_s`` is not a liveness signal: an idle rank publishes nothing, so its age grows). See
``docs/howto/external-lb.md`` for the telemetry contract.

    python docs/howto/external_lb_router.py http://127.0.0.1:8000 http://127.0.0.1:8001 \\
        --model builtin:tiny-moe --requests 20

Prints one JSON line per request (``{"backend": ..., "status": ..., "score": ...}``, with ``"error"`` instead of a
status when the connection failed: a rank server that died mid-request) and exits 0 when every request succeeded. To turn it into a proxy, call :meth:`Router.pick` from your HTTP server's request handler.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

POLL_INTERVAL_S = 0.05
STALE_AFTER_S = 1.0  # an endpoint whose last /load answer is older than this is not used
KV_SOFT_LIMIT = 0.8  # above this KV-cache usage a rank is penalised ...
KV_WEIGHT = 50.0  # ... by up to 10 extra requests at 100 % usage
PREFILL_TOKENS_PER_REQUEST = 512  # prompt tokens still to compute that weigh as much as one more request


@dataclass
class Endpoint:
    url: str
    load: dict[str, Any] | None = None  # the last /load answer
    polled_at: float = 0.0  # anyio.current_time() of that answer
    sent_since_poll: int = 0  # requests sent here since that answer (not yet in its numbers)
    tried: bool = False  # polled at least once, answered or not

    def score(self, now: float) -> float | None:
        """Lower is better; None when the endpoint must not be used."""
        if self.load is None or now - self.polled_at > STALE_AFTER_S:
            return None
        ranks = [r for r in self.load["ranks"] if r["up"]]
        if not ranks:
            return None
        best = None
        for r in ranks:  # an external endpoint manages one rank; an internal-LB endpoint balances its own
            queued = max(r["waiting"] + r["running"], r["inflight"])
            prefill = r.get("prefill_tokens", 0) / PREFILL_TOKENS_PER_REQUEST  # absent from older servers
            kv = KV_WEIGHT * max(0.0, r["kv_cache_usage"] - KV_SOFT_LIMIT)
            s = queued + prefill + kv
            best = s if best is None else min(best, s)
        assert best is not None
        return best + self.sent_since_poll


def checked_load(load: Any) -> dict[str, Any]:
    """``load`` if it has the fields :meth:`Endpoint.score` reads (the telemetry contract), else ValueError: an
    endpoint that answers ``/load`` with something else (not an asyncdp rank server) is skipped, not a crash."""
    try:
        ok = isinstance(load["seq"], int) and all(
            isinstance(r["up"], bool) and all(isinstance(r[k], int | float) and not isinstance(r[k], bool)
                                              for k in ("waiting", "running", "inflight", "kv_cache_usage"))
            for r in load["ranks"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not an asyncdp /load answer: {exc!r}") from None
    if not ok:
        raise ValueError("not an asyncdp /load answer")
    return load


@dataclass
class Router:
    endpoints: list[Endpoint]
    seq: dict[str, int] = field(default_factory=dict)
    polled: anyio.Event = field(default_factory=anyio.Event)  # set (and replaced) after every poll answer

    async def poll_forever(self, http: httpx.AsyncClient) -> None:
        async def poll(ep: Endpoint) -> None:
            while True:
                try:
                    r = await http.get(f"{ep.url}/load", timeout=0.5)
                    r.raise_for_status()
                    load = checked_load(r.json())
                    if load["seq"] != self.seq.get(ep.url):  # fresh numbers include what we sent before
                        ep.sent_since_poll = 0
                    self.seq[ep.url] = load["seq"]
                    ep.load, ep.polled_at = load, anyio.current_time()
                except (httpx.HTTPError, ValueError):
                    ep.load = None  # unreachable, unhealthy or not an asyncdp /load: out until it answers again
                ep.tried = True
                self.polled.set()
                self.polled = anyio.Event()
                await anyio.sleep(POLL_INTERVAL_S)

        async with anyio.create_task_group() as tg:
            for ep in self.endpoints:
                tg.start_soon(poll, ep)

    async def wait_pick(self) -> tuple[Endpoint, float]:
        """The best endpoint, waiting for the next poll answer while none is usable."""
        while (choice := self.pick()) is None:
            await self.polled.wait()
        return choice

    async def wait_first_round(self) -> None:
        """Until every endpoint was polled once, answered or not: the first picks then see every endpoint that is
        up, and one that is down does not hold the others back."""
        while not all(ep.tried for ep in self.endpoints):
            await self.polled.wait()

    def pick(self) -> tuple[Endpoint, float] | None:
        now = anyio.current_time()
        scored = [(s, i) for i, ep in enumerate(self.endpoints) if (s := ep.score(now)) is not None]
        if not scored:
            return None
        score, i = min(scored)
        ep = self.endpoints[i]
        ep.sent_since_poll += 1
        return ep, score


async def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("endpoints", nargs="+", help="base URLs of the rank servers, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--timeout-s", type=float, default=120.0, help="bound on the whole run")
    args = p.parse_args(argv)
    for flag, value in (("--requests", args.requests), ("--concurrency", args.concurrency),
                        ("--max-tokens", args.max_tokens), ("--timeout-s", args.timeout_s)):
        if not value > 0:
            p.error(f"{flag} must be > 0 (got {value})")

    router = Router([Endpoint(url.rstrip("/")) for url in args.endpoints])
    failures = 0
    limiter = anyio.Semaphore(args.concurrency)
    try:
        async with httpx.AsyncClient(timeout=60.0) as http:
            with anyio.fail_after(args.timeout_s):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(router.poll_forever, http)
                    await router.wait_first_round()

                    async def one(i: int) -> None:
                        nonlocal failures
                        async with limiter:
                            ep, score = await router.wait_pick()
                            line: dict[str, Any] = {"request": i, "backend": ep.url, "score": score}
                            try:
                                r = await http.post(f"{ep.url}/v1/completions", json={
                                    "model": args.model, "prompt": f"routed request {i}",
                                    "max_tokens": args.max_tokens})
                                line["status"] = r.status_code
                            except httpx.HTTPError as exc:  # the rank server went away mid-request
                                line["error"] = f"{type(exc).__name__}: {exc}"
                        failures += line.get("status") != 200
                        print(json.dumps(line), flush=True)

                    async with anyio.create_task_group() as requests:
                        for i in range(args.requests):
                            requests.start_soon(one, i)
                    tg.cancel_scope.cancel()  # stop polling
    except TimeoutError:
        up = [ep.url for ep in router.endpoints if ep.load is not None]
        print(f"external_lb_router: the run did not finish within --timeout-s {args.timeout_s:g} s "
              f"(endpoints answering /load: {', '.join(up) or 'none'})", file=sys.stderr)
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[1:]))
