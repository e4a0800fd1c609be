"""End to end: external load balancing, one ``asyncdp serve`` per MoE rank (spec §11.2, §12, §13; issue 9).

Two rank servers of ``builtin:tiny-moe`` (``-dp 2 --data-parallel-rank r -dpa 127.0.0.1 -dpp RPC``) form one MoE
group on loopback; rank 0 hosts the handshake listener and the wave-only coordinator. A module-scoped group per
``--api-server-count`` (1 and 2) serves every test here: /server_info, traffic on each rank only, streamed and
non-streamed parity, rank hints, the group's waves, and GET /load. The servers are launched by
:mod:`tests.e2e.external_lb`; the tests that end a group start their own (``test_external_lb_rank_loss.py``).
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from tests.e2e.conftest import ROOT, Server, free_port
from tests.e2e.external_lb import MOE, _get_json, api_count, external_group
from tests.e2e.metrics_text import per_engine, read_metrics, successes

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


@pytest.fixture(scope="module", params=[1, 2], ids=["1api", "2api"])
def group(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    with external_group(tmp_path_factory.mktemp(f"ext{request.param}"), request.param) as servers:
        yield servers


# ---------------------------------------------------------------------------------------------------------------
# /server_info, traffic, parity, hints


async def test_each_rank_server_describes_itself_as_external_with_its_rank(group: list[Server]) -> None:
    count = api_count(group)
    for rank, server in enumerate(group):
        seen_api_ranks = set()
        for _ in range(4 * count):  # fresh connections: with 2 API servers both answer sooner or later
            info = await _get_json(server.base_url, "/server_info")
            assert info["mode"] == "external"
            assert info["dp_size"] == 2 and info["dp_size_local"] == 1 and info["dp_start_rank"] == rank
            assert [(r["dp_rank"], r["local_index"]) for r in info["managed_ranks"]] == [(rank, 0)]
            assert info["api_process_count"] == count
            assert 0 <= info["api_process_rank"] < count
            assert info["wave"] is not None
            # processes: every asyncdp process of this node it knows (on loopback rank 0 also knows rank 1's
            # engine from the handshake), its own rank's engine among them
            assert rank in [p["rank"] for p in info["processes"] if p["role"] == "engine"]
            seen_api_ranks.add(info["api_process_rank"])
        assert seen_api_ranks <= set(range(count))


async def test_25_concurrent_completions_twice_per_server_all_succeed_on_its_rank_only(group: list[Server]) -> None:
    for rank, server in enumerate(group):
        before = await successes(server.base_url)
        async with server.openai(timeout=60.0) as client:
            for round_ in range(2):
                texts: list[str] = []

                async def one(prompt: str, texts: list[str] = texts) -> None:
                    c = await client.completions.create(model=MOE, prompt=prompt, max_tokens=8,
                                                        extra_body={"ignore_eos": True})
                    assert c.usage is not None and c.usage.completion_tokens == 8
                    texts.append(c.choices[0].text)

                with anyio.fail_after(90):
                    async with anyio.create_task_group() as tg:
                        for i in range(25):
                            tg.start_soon(one, f"rank {rank} round {round_} request {i}")
                assert len(texts) == 25
        after = await successes(server.base_url)
        assert set(after) == {str(rank)}, after  # this server's /metrics shows only its own engine
        assert after[str(rank)] - before.get(str(rank), 0.0) == 50


async def test_streamed_text_equals_non_streamed_text_for_greedy_prompts(group: list[Server]) -> None:
    prompts = ["The expert says", "Mixture of experts", "abc"]
    for server in group:
        async with server.openai(timeout=60.0) as client:
            for prompt in prompts:
                params: dict[str, Any] = dict(model=MOE, prompt=prompt, max_tokens=12, temperature=0.0,
                                              extra_body={"ignore_eos": True})
                plain = (await client.completions.create(**params)).choices[0].text
                streamed = []
                async for chunk in await client.completions.create(stream=True, **params):
                    if chunk.choices:
                        streamed.append(chunk.choices[0].text)
                assert "".join(streamed) == plain and plain


async def test_a_rank_hint_naming_the_other_rank_is_a_400_that_names_the_served_rank(group: list[Server]) -> None:
    async with httpx.AsyncClient(base_url=group[0].base_url, timeout=30.0) as http:
        r = await http.post("/v1/completions", headers={"X-data-parallel-rank": "1"},
                            json={"model": MOE, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 400, r.text
        assert "serves only data-parallel rank 0" in r.json()["error"]["message"]
        ok = await http.post("/v1/completions", headers={"X-data-parallel-rank": "0"},
                             json={"model": MOE, "prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200, ok.text
    async with httpx.AsyncClient(base_url=group[1].base_url, timeout=30.0) as http:
        # rank 1's server: local index 0, or the global form naming rank 1; the global form of rank 0 is refused
        for headers in ({"X-data-parallel-rank": "0"}, {"X-data-parallel-global-rank": "1"}):
            ok = await http.post("/v1/completions", headers=headers, json={"model": MOE, "prompt": "hi",
                                                                           "max_tokens": 2})
            assert ok.status_code == 200, (headers, ok.text)
        r = await http.post("/v1/completions", headers={"X-data-parallel-global-rank": "0"},
                            json={"model": MOE, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 400 and "is not served by this endpoint" in r.json()["error"]["message"], r.text


# ---------------------------------------------------------------------------------------------------------------
# waves


async def _wait_group_paused(servers: list[Server], timeout_s: float = 15.0) -> None:
    with anyio.fail_after(timeout_s):
        while True:
            running = [per_engine(await read_metrics(s.base_url), "asyncdp:dp_running") for s in servers]
            if all(r and not any(r.values()) for r in running):
                return
            await anyio.sleep(0.1)


async def test_all_ranks_pause_after_traffic_and_a_request_to_one_server_wakes_the_group(
        group: list[Server]) -> None:
    await _wait_group_paused(group)
    text = await read_metrics(group[1].base_url)
    dummies_before = per_engine(text, "asyncdp:dp_dummy_steps_total").get("1", 0.0)
    waves_before = per_engine(text, "asyncdp:dp_waves_completed_total").get("1", 0.0)
    async with httpx.AsyncClient(base_url=group[0].base_url, timeout=30.0) as http:
        r = await http.post("/v1/completions", json={"model": MOE, "prompt": "wake up", "max_tokens": 6,
                                                     "ignore_eos": True})
        assert r.status_code == 200, r.text
    # Rank 1 had no request of its own, yet it joined the wave: dummy steps, then the wave completes there too.
    with anyio.fail_after(15.0):
        while True:
            text = await read_metrics(group[1].base_url)
            dummies = per_engine(text, "asyncdp:dp_dummy_steps_total").get("1", 0.0)
            waves = per_engine(text, "asyncdp:dp_waves_completed_total").get("1", 0.0)
            if dummies > dummies_before and waves > waves_before:
                break
            await anyio.sleep(0.1)
    await _wait_group_paused(group)


# ---------------------------------------------------------------------------------------------------------------
# GET /load


LOAD_KEYS = {"seq", "age_s", "mode", "dp_size", "api_process_rank", "api_process_count", "wave", "coordinator",
             "ranks"}
RANK_KEYS = {"dp_rank", "local_index", "up", "waiting", "running", "kv_cache_usage", "prefill_tokens", "cache_fill",
             "prefix_cache_queries",
             "prefix_cache_hits", "inflight", "wave", "wave_running", "age_s"}


def check_load(load: dict[str, Any], *, rank: int, dp_size: int, api_servers: int, mode: str = "external") -> None:
    """The telemetry contract of ``GET /load`` for an endpoint that manages exactly rank ``rank``."""
    assert set(load) >= LOAD_KEYS, load
    assert isinstance(load["seq"], int) and load["seq"] >= 0
    assert load["age_s"] is None or (isinstance(load["age_s"], (int, float)) and load["age_s"] >= 0)
    assert load["mode"] == mode and load["dp_size"] == dp_size
    assert load["api_process_count"] == api_servers and 0 <= load["api_process_rank"] < api_servers
    assert set(load["wave"]) == {"current", "running"} and isinstance(load["wave"]["running"], bool)
    if load["coordinator"] is not None:  # external rank servers may get no coordinator snapshots
        assert isinstance(load["coordinator"]["seq"], int) and load["coordinator"]["age_s"] >= 0
    (one,) = load["ranks"]
    assert set(one) >= RANK_KEYS, one
    assert one["dp_rank"] == rank and one["local_index"] == 0 and one["up"] is True
    for key in ("waiting", "running", "prefill_tokens", "inflight", "prefix_cache_queries", "prefix_cache_hits"):
        assert isinstance(one[key], int) and one[key] >= 0, (key, one)
    assert one["prefix_cache_hits"] <= one["prefix_cache_queries"]
    assert 0.0 <= one["kv_cache_usage"] <= 1.0 and 0.0 <= one["cache_fill"] <= 1.0
    assert isinstance(one["wave"], int) and isinstance(one["wave_running"], bool)
    assert one["age_s"] is None or one["age_s"] >= 0


async def test_load_answers_the_telemetry_contract_on_every_rank_server(group: list[Server]) -> None:
    for rank, server in enumerate(group):
        for _ in range(2 * api_count(group)):
            check_load(await _get_json(server.base_url, "/load"), rank=rank, dp_size=2,
                       api_servers=api_count(group))


async def test_load_seq_increases_over_polls_and_200_polls_are_cheap(group: list[Server]) -> None:
    server = group[0]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10.0) as http:
        # seq is per API process (each has its own view; with several, connections land on any of them): it
        # must be monotonic for each process, and grow for the one that sees the traffic's stats.
        seqs: dict[int, list[int]] = {}

        async def poll() -> None:
            doc = (await http.get("/load")).json()
            seqs.setdefault(doc["api_process_rank"], []).append(doc["seq"])

        await poll()
        with anyio.fail_after(30.0):
            async with anyio.create_task_group() as tg:  # traffic: the rank's stats arrive and bump seq
                tg.start_soon(functools.partial(http.post, "/v1/completions", timeout=30.0, json={
                    "model": MOE, "prompt": "load me", "max_tokens": 20, "ignore_eos": True}))
                while not any(s[-1] > s[0] for s in seqs.values()):
                    await anyio.sleep(0.05)
                    await poll()
        assert all(s == sorted(s) for s in seqs.values()), seqs
        t0 = time.perf_counter()
        for _ in range(200):
            r = await http.get("/load")
            assert r.status_code == 200
        took = time.perf_counter() - t0
    print(f"\n/load: 200 sequential polls over one connection took {took * 1000:.0f} ms "
          f"({took * 5:.2f} ms each, --api-server-count {api_count(group)})")


async def test_the_example_router_sends_requests_through_the_least_loaded_rank(group: list[Server]) -> None:
    """The router of docs/howto/external-lb.md serves every request through the live endpoints, and an endpoint
    that is down from the start (nothing listens on its port) is skipped, not waited for."""
    script = ROOT / "docs" / "howto" / "external_lb_router.py"
    down = f"http://127.0.0.1:{free_port()}"
    cmd = [sys.executable, str(script), down, *(s.base_url for s in group), "--model", MOE, "--requests", "6",
           "--max-tokens", "4", "--timeout-s", "60"]
    done = await anyio.run_process(cmd, check=False, cwd=ROOT)
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    served = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(served) == 6 and all(s["status"] == 200 for s in served), out
    assert {s["backend"] for s in served} <= {s.base_url for s in group}
    doc = (ROOT / "docs" / "howto" / "external-lb.md").read_text()
    sample = re.search(r'^# (\{"request": 0.*\})$', doc, re.M)
    assert sample is not None, "external-lb.md no longer shows the router's output: update this test"
    assert all(list(s) == list(json.loads(sample.group(1))) for s in served), out  # the doc's keys, in order
