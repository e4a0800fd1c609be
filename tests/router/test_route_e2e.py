"""``asyncdp route`` as a real process in front of two real ``asyncdp serve builtin:tiny-dense`` endpoints (each a
single-rank server started with ``--api-key``), driven by the official ``openai`` client.

The tests share one deployment and run in order: traffic of every kind, spread under concurrency, the API key, a
client that leaves mid-stream, the SIGKILL of one endpoint, then the router's SIGTERM drain (exit 0, nothing left).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, Server
from tests.e2e.external_lb import single_rank_endpoints
from tests.e2e.metrics_text import per_engine, read_metrics, successes
from tests.router.route_process import RouterProcess, route

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

KEY = "router-test-key"
NO_EOS = {"ignore_eos": True}  # the random tiny model may end early otherwise; counts are checked


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Cluster:
    endpoints: list[Server]
    router: RouterProcess

    def openai(self, api_key: str = KEY) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.router.base_url}/v1", api_key=api_key, max_retries=0)


@contextmanager
def two_endpoints(logs: Path) -> Iterator[list[Server]]:
    """Two single-rank servers started together (they load at the same time); each one still running at the end
    is stopped with SIGTERM and must exit 0 with nothing left."""
    with single_rank_endpoints(logs, 2, "--api-key", KEY) as servers:
        yield servers


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("route")
    with (two_endpoints(logs) as (a, b),
          route(logs / "router.log", a.base_url, b.base_url, args=("--shutdown-timeout", "10")) as router):
        yield Cluster([a, b], router)


async def total_successes(cluster: Cluster) -> list[float]:
    return [sum((await successes(ep.base_url)).values()) for ep in cluster.endpoints]


async def test_completions_and_chat_streamed_and_not_go_through_the_router(cluster: Cluster) -> None:
    with anyio.fail_after(30):
        async with cluster.openai() as client:
            done = await client.completions.create(model=MODEL, prompt="Once upon", max_tokens=5,
                                                   extra_body=NO_EOS)
            assert done.choices[0].finish_reason == "length" and done.usage and done.usage.completion_tokens == 5
            chat = await client.chat.completions.create(model=MODEL, max_tokens=4, extra_body=NO_EOS,
                                                        messages=[{"role": "user", "content": "hi"}])
            assert chat.choices[0].message.role == "assistant" and chat.usage and chat.usage.completion_tokens == 4
            stream = await client.completions.create(model=MODEL, prompt="Once upon", max_tokens=6, stream=True,
                                                    extra_body=NO_EOS)
            texts = [c.choices[0].text async for c in stream if c.choices]
            assert len(texts) == 6
            chat_stream = await client.chat.completions.create(
                model=MODEL, max_tokens=5, stream=True, extra_body=NO_EOS,
                messages=[{"role": "user", "content": "hi"}], stream_options={"include_usage": True})
            chunks = [c async for c in chat_stream]
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
            models = await client.models.list()
            assert [m.id for m in models.data] == [MODEL]
        async with httpx.AsyncClient(base_url=cluster.router.base_url, timeout=10) as http:
            r = await http.post("/tokenize", json={"model": MODEL, "prompt": "hello"},
                                headers={"Authorization": f"Bearer {KEY}"})
            assert r.status_code == 200 and r.json()["count"] == len(r.json()["tokens"]) > 0
            health = await http.get("/health")
            assert health.status_code == 200 and health.json()["num_usable"] == 2
            missing = await http.get("/nope")
            assert missing.status_code == 404 and set(missing.json()["error"]) == {"message", "type", "param", "code"}


async def test_concurrent_requests_reach_both_endpoints(cluster: Cluster) -> None:
    before = await total_successes(cluster)
    n = 16
    with anyio.fail_after(40):
        async with cluster.openai() as client, anyio.create_task_group() as tg:
            async def one(i: int) -> None:
                if i % 2:
                    stream = await client.completions.create(model=MODEL, prompt=f"request {i}", max_tokens=24,
                                                             stream=True, extra_body=NO_EOS)
                    assert len([c async for c in stream if c.choices]) == 24
                else:
                    done = await client.completions.create(model=MODEL, prompt=f"request {i}", max_tokens=24,
                                                          extra_body=NO_EOS)
                    assert done.usage is not None and done.usage.completion_tokens == 24

            for i in range(n):
                tg.start_soon(one, i)
    after = await total_successes(cluster)
    delta = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(delta) == n and min(delta) > 0, delta


async def test_the_api_key_passes_through_and_a_request_without_it_is_401(cluster: Cluster) -> None:
    with anyio.fail_after(20):
        async with cluster.openai(api_key="wrong") as client:
            with pytest.raises(openai.AuthenticationError) as info:
                await client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert info.value.status_code == 401
        async with httpx.AsyncClient(base_url=cluster.router.base_url, timeout=10) as http:
            r = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
            assert r.status_code == 401


async def totals(cluster: Cluster) -> tuple[float, float]:
    """(successes, generated tokens) over both endpoints."""
    texts = [await read_metrics(ep.base_url) for ep in cluster.endpoints]
    return (sum(sum(per_engine(t, "vllm:request_success_total").values()) for t in texts),
            sum(sum(per_engine(t, "vllm:generation_tokens_total").values()) for t in texts))


async def wait_aborted(cluster: Cluster, before: tuple[float, float], max_tokens: int) -> None:
    """Until no request runs on either endpoint; then the stream must have ended short of ``max_tokens`` and not
    as a success: its endpoint aborted it (a caller that left is no success, as in vLLM)."""
    with anyio.fail_after(10):
        while True:
            texts = [await read_metrics(ep.base_url) for ep in cluster.endpoints]
            if not any(sum(per_engine(t, "vllm:num_requests_running").values()) for t in texts):
                break
            await anyio.sleep(0.1)
    successes_after, tokens_after = await totals(cluster)
    assert successes_after == before[0] and tokens_after - before[1] < max_tokens, (before, successes_after,
                                                                                    tokens_after)


async def test_a_client_that_leaves_mid_stream_aborts_the_request_on_its_endpoint(cluster: Cluster) -> None:
    before = await totals(cluster)
    with anyio.fail_after(30):
        async with cluster.openai() as client:
            stream = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=480,
                                                     stream=True, extra_body=NO_EOS)
            chunks = 0
            async for _ in stream:
                chunks += 1
                if chunks == 3:
                    break
            await stream.close()
    await wait_aborted(cluster, before, 480)


async def test_sigterm_with_no_drain_time_cuts_the_stream_and_aborts_it_on_its_endpoint(
        cluster: Cluster, tmp_path: Path) -> None:
    """A second router with the default --shutdown-timeout 0: its stream in flight is cancelled at once, which
    closes the upstream request (the endpoint aborts it), and the router still exits 0."""
    before = await totals(cluster)
    with route(tmp_path / "router.log", *(ep.base_url for ep in cluster.endpoints)) as router, anyio.fail_after(30):
        async with openai.AsyncOpenAI(base_url=f"{router.base_url}/v1", api_key=KEY, max_retries=0) as client:
            stream = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=480,
                                                     stream=True, extra_body=NO_EOS)
            chunks = 0
            with pytest.raises(openai.APIError):  # the response ends without its end: an incomplete chunked body
                async for _ in stream:
                    chunks += 1
                    if chunks == 2:
                        router.process.send_signal(signal.SIGTERM)
        assert router.wait_exit() == 0 and "Traceback" not in router.log()
    assert chunks < 480
    await wait_aborted(cluster, before, 480)


async def completions(base_url: str, n: int) -> None:
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=KEY, max_retries=0) as client:
        for i in range(n):
            done = await client.completions.create(model=MODEL, prompt=f"after {i}", max_tokens=3, extra_body=NO_EOS)
            assert done.usage is not None and done.usage.completion_tokens == 3


async def test_after_one_endpoint_is_killed_every_request_succeeds_through_the_other(
        cluster: Cluster, tmp_path: Path) -> None:
    """The module's router polls every 50 ms and may see the death first; a second router that polls every 10 s
    still believes the dead endpoint (index 0, idle) is the best: its first request fails to connect there, and
    goes on to the other."""
    dead, alive = cluster.endpoints
    before = sum((await successes(alive.base_url)).values())
    with route(tmp_path / "slow-router.log", dead.base_url, alive.base_url,
               args=("--poll-interval-s", "10", "--stale-after-s", "60")) as slow:
        dead.kill_all()  # SIGKILL of its whole process tree
        with anyio.fail_after(30):
            await completions(slow.base_url, 3)
            await completions(cluster.router.base_url, 3)
        assert f"endpoint {dead.base_url} marked down: ConnectError" in slow.log()
        assert slow.stop() == 0
    assert sum((await successes(alive.base_url)).values()) == before + 6
    async with httpx.AsyncClient(base_url=cluster.router.base_url, timeout=10) as http:
        with anyio.fail_after(5):
            while True:
                health = (await http.get("/health")).json()
                if health["num_usable"] == 1:
                    break
                await anyio.sleep(0.05)
        assert health["status"] == "ok"


async def test_sigterm_drains_the_stream_in_flight_and_exits_0(cluster: Cluster) -> None:
    with anyio.fail_after(40):
        async with cluster.openai() as client:
            stream = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=200,
                                                     stream=True, extra_body=NO_EOS)
            chunks = []
            async for chunk in stream:
                chunks.append(chunk)
                if len(chunks) == 2:  # in flight: the drain lets it finish
                    cluster.router.process.send_signal(signal.SIGTERM)
        assert sum(1 for c in chunks if c.choices) == 200
        assert chunks[-1].choices[-1].finish_reason == "length"
    assert cluster.router.wait_exit(timeout_s=15) == 0
    log = cluster.router.log()
    assert "received SIGTERM" in log and "router stopped; exit status 0" in log and "Traceback" not in log
