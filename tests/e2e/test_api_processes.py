"""End to end: several API-server processes on one node (issue #12, items 15 and 16).

Each API process listens on its own ``SO_REUSEPORT`` socket, so fresh connections spread over them; admission
is node-wide (``--max-queued-requests K`` is a pool of ``K x count`` slots), so a burst that lands on one
process uses its siblings' free slots; a process whose event loop stops (SIGSTOP here) makes every sibling's
``/health`` 503 until it runs again.

The burst, the spread and the stopped-process tests share one deployment (``two_api``): none of them depends on
what another left behind (the burst reads its slots back to zero, the spread only reads ``/server_info``, and the
stopped process is resumed and healthy again before its test ends).
"""

from __future__ import annotations

import functools
import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e.conftest import MODEL, Server, serve
from tests.e2e.metrics_text import per_engine, read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


@pytest.fixture(scope="module")
def two_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """dp=2 behind two API processes admitting 8 requests each (a node-wide pool of 16)."""
    with serve(tmp_path_factory.mktemp("two-api"), "-dp", "2", "--api-server-count", "2",
               "--max-queued-requests", "8") as server:
        yield server


async def _server_info_fresh_connection(base_url: str) -> dict:
    async with httpx.AsyncClient(base_url=base_url, timeout=10.0) as http:
        return (await http.get("/server_info")).json()


async def test_16_concurrent_requests_against_two_api_servers_capped_at_8_get_no_429(two_api: Server) -> None:
    server = two_api
    statuses: list[int] = []
    body = {"model": MODEL, "prompt": "burst", "max_tokens": 48, "temperature": 0.0, "ignore_eos": True}
    # One connection pool: the burst arrives over few connections, so it lands mostly on one process.
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60.0,
                                 limits=httpx.Limits(max_connections=16)) as http:

        async def one() -> None:
            statuses.append((await http.post("/v1/completions", json=body)).status_code)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for _ in range(16):
                    tg.start_soon(one)
    assert statuses == [200] * 16, statuses
    info = await _server_info_fresh_connection(server.base_url)
    assert [p["inflight"] for p in info["api_processes"]] == [0, 0]  # every slot came back


async def test_fresh_connections_are_spread_across_the_api_servers(two_api: Server) -> None:
    server = two_api
    seen: set[int] = set()
    with anyio.fail_after(60):
        while len(seen) < 2:  # one shared accept queue would answer every connection from one process
            seen.add((await _server_info_fresh_connection(server.base_url))["api_process_rank"])
    assert seen == {0, 1}


async def test_a_stopped_api_process_turns_its_siblings_health_503_until_it_resumes(two_api: Server) -> None:
    server = two_api
    info = await _server_info_fresh_connection(server.base_url)
    pids = {p["client_index"]: p["pid"] for p in info["processes"] if p["role"] == "api_server"}
    stopped = pids[1]
    os.kill(stopped, signal.SIGSTOP)
    try:
        statuses: list[int] = []
        with anyio.fail_after(60):
            # A connection the kernel hands to the stopped process hangs: short timeouts, retry until a
            # sibling answers 503 (its heartbeat reader sees the stopped one's heartbeat age).
            while 503 not in statuses:
                try:
                    async with httpx.AsyncClient(base_url=server.base_url, timeout=1.0) as http:
                        statuses.append((await http.get("/health")).status_code)
                except httpx.TimeoutException:
                    pass
    finally:
        os.kill(stopped, signal.SIGCONT)
    with anyio.fail_after(60):
        while True:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=5.0) as http:
                if (await http.get("/health")).status_code == 200:
                    break
            await anyio.sleep(0.2)
    info = await _server_info_fresh_connection(server.base_url)
    assert not any(p["stuck"] for p in info["api_processes"]), info["api_processes"]


async def test_the_inflight_gauge_is_the_sum_over_the_api_processes(tmp_path: Path) -> None:
    from tests.e2e.metrics_text import per_engine, read_metrics

    with serve(tmp_path, "-dp", "2", "--api-server-count", "2", "--max-model-len", "2048") as server:
        body = {"model": MODEL, "prompt": "hold", "max_tokens": 1900, "ignore_eos": True}

        async def one() -> None:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=120.0) as http:  # its own connection
                await http.post("/v1/completions", json=body)

        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                for _ in range(12):  # enough fresh connections that both processes hold some
                    tg.start_soon(one)
                while True:
                    table = (await _server_info_fresh_connection(server.base_url))["api_processes"]
                    if all(p["inflight"] for p in table) and sum(p["inflight"] for p in table) == 12:
                        break
                    await anyio.sleep(0.05)
                # Both processes hold requests now; the gauge on any process's page is their sum.
                inflight = per_engine(await read_metrics(server.base_url), "asyncdp:dp_inflight_requests")
                table = (await _server_info_fresh_connection(server.base_url))["api_processes"]
                assert sum(inflight.values()) == sum(p["inflight"] for p in table) == 12, (inflight, table)
                tg.cancel_scope.cancel()


async def _process_client(base_url: str, rank: int) -> httpx.AsyncClient:
    """An HTTP client whose one keep-alive connection is served by API process ``rank`` (fresh connections until
    the kernel hands one to it)."""
    with anyio.fail_after(60):
        while True:
            http = httpx.AsyncClient(base_url=base_url, timeout=60.0, limits=httpx.Limits(max_connections=1))
            if (await http.get("/server_info")).json()["api_process_rank"] == rank:
                return http
            await http.aclose()


async def _complete(base_url: str, rank: int, body: dict) -> None:
    http = await _process_client(base_url, rank)
    try:
        r = await http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
    finally:
        await http.aclose()


async def test_api_servers_running_asyncdp_agree_on_a_prefix_another_one_placed(tmp_path: Path) -> None:
    """Each API server routes on its own state, so a system prompt one of them placed is unknown to the other;
    through the coordinator's prefix directory the other one sends it to the same rank, where it hits the cache."""
    groups, system, question = 8, 128, 16  # tokens; whole 16-token blocks
    vocab = 250  # builtin:tiny-dense has 259 token ids

    def tokens(seed: int, n: int) -> list[int]:
        rng = random.Random(seed)
        return [rng.randrange(3, vocab) for _ in range(n)]

    prompts = [[tokens(g, system) + tokens(1000 + 10 * g + k, question) for k in range(2)] for g in range(groups)]
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2", "--lb-policy", "asyncdp") as server:
        second = await _process_client(server.base_url, 1)
        try:

            async def hits() -> float:
                return sum(per_engine(await read_metrics(server.base_url), "vllm:prefix_cache_hits_total").values())

            body = {"model": MODEL, "max_tokens": 2, "temperature": 0.0, "ignore_eos": True}
            with anyio.fail_after(120):
                # API server 0 places every system prompt in one burst, balancing them over the ranks by its own
                # in-flight work (an idle API server would break ties by a hash of the prompt instead)
                async with anyio.create_task_group() as tg:
                    for g in range(groups):
                        tg.start_soon(_complete, server.base_url, 0, {**body, "max_tokens": 32,
                                                                      "prompt": prompts[g][0]})
                before = await hits()
                for g in range(groups):  # API server 1 has never sent them anywhere
                    r = await second.post("/v1/completions", json={**body, "prompt": prompts[g][1]})
                    assert r.status_code == 200, r.text
                after = await hits()
                directed = per_engine(await read_metrics(server.base_url), "asyncdp:dp_lb_decisions_total",
                                      reason="directory")
        finally:
            await second.aclose()
    # every second request found its whole system prompt cached on the rank the first one went to
    assert after - before == groups * system
    # every request of both phases was a prefix its API server had not placed: the coordinator named each rank
    assert sum(directed.values()) == 2 * groups


async def test_a_conversation_whose_history_another_api_server_placed_finds_it_through_the_directory(
        tmp_path: Path) -> None:
    """Both API servers sent the system prompt to both ranks. API server 0 places a user's first turn (a history of
    33 blocks after the system prompt) on some rank; API server 1, which never saw the history and has its own
    requests running on that rank, still sends the second turn there: it claims the run after the system prompt
    (a deep claim), and the directory names the rank that holds it."""
    vocab, block = 250, 16

    def tokens(seed: int, n: int) -> list[int]:
        rng = random.Random(seed)
        return [rng.randrange(3, vocab) for _ in range(n)]

    system, history = tokens(1, 3 * block), tokens(2, 33 * block)
    turn1 = system + history + tokens(3, 8)
    turn2 = turn1 + tokens(4, 24)
    body = {"model": MODEL, "max_tokens": 2, "temperature": 0.0, "ignore_eos": True}
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2", "--lb-policy", "asyncdp",
               "--max-model-len", "1024") as server:
        first, second = await _process_client(server.base_url, 0), await _process_client(server.base_url, 1)
        try:
            async def metric(name: str, **labels: str) -> dict[str, float]:
                return per_engine(await read_metrics(server.base_url), name, **labels)

            with anyio.fail_after(120):
                for k, http in enumerate((first, second)):
                    for rank in (0, 1):
                        r = await http.post("/v1/completions", json={**body, "prompt": system + tokens(10 + 2 * k + rank, 8)},
                                            headers={"X-data-parallel-rank": str(rank)})
                        assert r.status_code == 200, r.text
                before = await metric("vllm:prompt_tokens_total")
                assert (await first.post("/v1/completions", json={**body, "prompt": turn1})).status_code == 200
                grown = {e: v - before.get(e, 0.0) for e, v in (await metric("vllm:prompt_tokens_total")).items()}
                holder = max(grown, key=grown.__getitem__)  # the rank that computed the first turn
                busy_clients = [await _process_client(server.base_url, 1) for _ in range(3)]
                async with anyio.create_task_group() as tg:
                    busy = {**body, "prompt": tokens(50, 8), "max_tokens": 400}
                    for http in busy_clients:  # API server 1's own requests keep the holder busier in its view
                        tg.start_soon(functools.partial(http.post, "/v1/completions", json=busy,
                                                        headers={"X-data-parallel-rank": holder}))
                    while True:  # until API server 1 counts them on the holder (its view of the ranks' load)
                        ranks = (await second.get("/server_info")).json()["managed_ranks"]
                        if next(r["inflight"] for r in ranks if str(r["dp_rank"]) == holder) >= len(busy_clients):
                            break
                        await anyio.sleep(0.02)
                    hits = await metric("vllm:prefix_cache_hits_total")
                    directed = sum((await metric("asyncdp:dp_lb_decisions_total", reason="directory")).values())
                    r = await second.post("/v1/completions", json={**body, "prompt": turn2})
                    assert r.status_code == 200, r.text
                    hits_after = await metric("vllm:prefix_cache_hits_total")
                    directed_after = sum((await metric("asyncdp:dp_lb_decisions_total",
                                                       reason="directory")).values())
                for http in busy_clients:
                    await http.aclose()
        finally:
            await first.aclose()
            await second.aclose()
    # the second turn found the system prompt and the whole history cached where the first turn went
    assert hits_after.get(holder, 0.0) - hits.get(holder, 0.0) >= len(system) + len(history)
    assert directed_after == directed + 1


async def test_a_frozen_coordinator_costs_a_new_prefix_at_most_the_claim_timeout(tmp_path: Path) -> None:
    """With the coordinator stopped (SIGSTOP: its links stay open, nothing answers), every request whose prefix
    an API server has not placed still completes: its claim gives up after 50 ms and the policy routes alone."""
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2", "--lb-policy", "asyncdp") as server:
        info = await _server_info_fresh_connection(server.base_url)
        coordinator = next(p["pid"] for p in info["processes"] if p["role"] == "coordinator")

        async def directed() -> float:
            text = await read_metrics(server.base_url)
            return sum(per_engine(text, "asyncdp:dp_lb_decisions_total", reason="directory").values())

        async with server.openai() as client:
            await client.completions.create(model=MODEL, prompt=[7] * 64, max_tokens=2)  # warm both paths up
            before = await directed()
            os.kill(coordinator, signal.SIGSTOP)
            try:
                with anyio.fail_after(60):
                    for i in range(8):
                        t0 = anyio.current_time()
                        r = await client.completions.create(model=MODEL, prompt=[10 + i] * 64, max_tokens=2)
                        assert r.choices[0].finish_reason in ("length", "stop")
                        assert anyio.current_time() - t0 < 2.0  # the claim's 50 ms, not a hang
                assert await directed() == before  # no answer came: every one of them was routed alone
            finally:
                os.kill(coordinator, signal.SIGCONT)
