"""End to end against dp=2 behind one in-launcher API server: admission limit (429) and engine loss (spec §13,
dense); plus two short-lived deployments: the trio backend, and TLS behind two API processes.

The ``dp2_single_api`` deployment admits one request at a time (``--max-queued-requests 1``). The last test that
uses it SIGKILLs an engine, so it comes after the others; the fixture then still expects an orderly exit 0.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, Server, serve
from tests.e2e.metrics_text import per_engine, read_metrics, successes
from tests.e2e.tls import self_signed_cert

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


async def test_concurrent_requests_over_max_queued_get_429(dp2_single_api: Server) -> None:
    outcomes: list[str] = []
    with anyio.fail_after(60):
        async with dp2_single_api.openai() as client:

            async def one(i: int) -> None:
                try:
                    await client.completions.create(model=MODEL, prompt=f"queue {i}", max_tokens=30,
                                                    extra_body={"ignore_eos": True})
                    outcomes.append("ok")
                except openai.RateLimitError as exc:
                    assert exc.status_code == 429
                    outcomes.append("429")

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(one, i)
    assert len(outcomes) == 8
    assert "ok" in outcomes and "429" in outcomes, outcomes


async def test_killed_engine_is_dead_in_server_info_and_the_survivor_serves(dp2_single_api: Server) -> None:
    """SIGKILL rank 1's engine while a stream runs on it: the stream ends with an error instead of hanging,
    /server_info says ``dead`` within 2 s, /health stays 200, and new requests all succeed on rank 0 (spec §13,
    §12.4, dense). The stream held the only admission slot, so the survivors also show it was released."""
    server = dp2_single_api
    ended: list[str] = []
    async with httpx.AsyncClient(base_url=server.base_url, timeout=5.0) as http, server.openai() as client:
        info = (await http.get("/server_info")).json()
        victim = next(p["pid"] for p in info["processes"] if p["role"] == "engine" and p["rank"] == 1)
        first = anyio.Event()

        async def doomed_stream() -> None:
            stream = await client.completions.create(model=MODEL, prompt="doomed", max_tokens=480, stream=True,
                                                     extra_headers={"X-data-parallel-rank": "1"},
                                                     extra_body={"ignore_eos": True})
            try:
                async for chunk in stream:
                    first.set()
                    if chunk.choices and chunk.choices[0].finish_reason:
                        ended.append(chunk.choices[0].finish_reason)
            except (openai.APIError, httpx.HTTPError) as exc:
                ended.append(type(exc).__name__)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(doomed_stream)
                await first.wait()
                os.kill(victim, signal.SIGKILL)
                with anyio.fail_after(2.0):
                    while True:
                        ranks = (await http.get("/server_info")).json()["managed_ranks"]
                        if [r["state"] for r in ranks] == ["ready", "dead"]:
                            break
                        await anyio.sleep(0.1)
        assert len(ended) == 1 and ended[0] not in ("length", "stop"), ended
        assert (await http.get("/health")).status_code == 200
        text = await read_metrics(server.base_url)
        assert per_engine(text, "asyncdp:dp_engine_up") == {"0": 1.0, "1": 0.0}

    before = await successes(server.base_url)
    n = 10
    with anyio.fail_after(30):
        async with server.openai() as client:
            for i in range(n):  # one at a time: this deployment admits one request at a time
                r = await client.completions.create(model=MODEL, prompt=f"survivor {i}", max_tokens=3)
                assert r.choices[0].finish_reason in ("length", "stop")
    after = await successes(server.base_url)
    assert after.get("0", 0.0) - before.get("0", 0.0) == n
    assert after.get("1", 0.0) == before.get("1", 0.0)


async def test_trio_backend_serves_a_completion_under_every_served_model_name(tmp_path: Path) -> None:
    # --served-model-name takes several names, as vLLM's does: /v1/models lists each, and each one serves.
    with serve(tmp_path, "-dp", "2", "--api-server-count", "1", "--backend", "trio",
               "--served-model-name", MODEL, "org/alias") as server:
        with anyio.fail_after(30):
            async with server.openai() as client:
                r = await client.completions.create(model=MODEL, prompt="Hello from trio", max_tokens=4,
                                                    temperature=0)
                s = await client.completions.create(model=MODEL, prompt="Hello from trio", max_tokens=4,
                                                    stream=True)
                streamed = [c async for c in s]
                models = [m.id async for m in client.models.list()]
                alias = await client.completions.create(model="org/alias", prompt="Hello from trio", max_tokens=4,
                                                        temperature=0)
                card = await client.models.retrieve("org/alias")
        assert r.choices[0].finish_reason in ("length", "stop") and r.usage and r.usage.prompt_tokens > 0
        assert streamed and streamed[-1].choices[0].finish_reason in ("length", "stop")
        assert models == [MODEL, "org/alias"]
        assert alias.model == "org/alias" and alias.choices[0].text == r.choices[0].text and card.id == "org/alias"


async def test_tls_serves_a_completion_through_every_api_process(tmp_path: Path) -> None:
    """--ssl-certfile/--ssl-keyfile with two API processes on the inherited socket: HTTPS answers."""
    key, cert = await self_signed_cert(tmp_path)
    with serve(tmp_path, "-dp", "2", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)) as server:
        assert server.base_url.startswith("https://")
        with anyio.fail_after(30):
            async with server.openai() as client:
                r = await client.completions.create(model=MODEL, prompt="Hello over TLS", max_tokens=3)
        assert r.choices[0].finish_reason in ("length", "stop")


async def test_session_hash_keeps_each_sessions_requests_on_one_rank_across_api_servers(tmp_path: Path) -> None:
    # The routing key reaches the policy from each of its sources (asyncdp.api.routing_key), through either of
    # the two API servers: every request of a session lands on the key's rank.
    with serve(tmp_path, "-dp", "2", "--lb-policy", "session_hash") as server:
        with anyio.fail_after(60):
            async with server.openai() as client:
                sources: list[tuple[str, dict]] = [
                    ("X-Session-ID", {"extra_headers": {"X-Session-ID": "conversation-1"}}),
                    ("user", {"user": "user-2"}),
                    ("prompt_cache_key", {"extra_body": {"prompt_cache_key": "cache-3"}})]
                for source, kwargs in sources:
                    before = await successes(server.base_url)
                    for i in range(6):
                        await client.completions.create(model=MODEL, prompt=f"turn {i}", max_tokens=2, **kwargs)
                    after = await successes(server.base_url)
                    delta = sorted(after.get(e, 0.0) - before.get(e, 0.0) for e in ("0", "1"))
                    assert delta == [0.0, 6.0], (source, delta)
