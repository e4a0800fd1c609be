"""``asyncdp route`` in front of two real ``asyncdp serve builtin:tiny-dense`` endpoints, one of which freezes
(SIGSTOP to its API server and its engine: they stop, their TCP connections stay open, as on a host that stops
answering) while a request is in flight there. The request must end within seconds instead of waiting for the endpoint:

* not answered yet (a whole completion): it is abandoned there (the connection closed, so the endpoint aborts it
  once it runs again: it is not generated twice to the end) and sent once to the other endpoint, which answers;
* a stream that started: it ends with an error event in OpenAI's shape and ``data: [DONE]``;
* no other endpoint: a 503 in OpenAI's error shape that names the frozen endpoint.

The endpoints run the simulated executor (40 ms a step), so a request's length does not depend on how busy the
machine is; every freeze ends (SIGCONT) before its test does, and the next test starts once the router uses both
endpoints again. Each test is bounded by ``fail_after``: before the fix, the request waited for the frozen endpoint
until the bound failed the test.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, Server, descendants
from tests.e2e.external_lb import single_rank_endpoints
from tests.e2e.metrics_text import successes
from tests.router.route_process import RouterProcess
from tests.router.upstream import routed

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

SIM = ("--executor", "sim", "--sim-cost", "40,0,0,0")  # 40 ms a step, whatever the machine's load
TOKENS = 50  # 2 s a request: still running when its endpoint is stopped (within ~0.1 s), quick on the other one
NO_EOS = {"ignore_eos": True}
BOUND_S = 40.0  # each test's whole exchange; a request that waits for its frozen endpoint waits past it
BACKENDS = ["asyncio", "trio"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the test's client; the router's backend is the test's parameter


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    with single_rank_endpoints(tmp_path_factory.mktemp("route-frozen"), 2, *SIM) as servers:
        yield servers


@contextmanager
def freezer() -> Iterator[list[int]]:
    """A list of the processes the test SIGSTOPped (:func:`freeze`); each is sent SIGCONT on the way out, in
    order (the API server before its engine, so the engine hears of the requests the API server aborts)."""
    frozen: list[int] = []
    try:
        yield frozen
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def freeze(frozen: list[int], server: Server) -> None:
    """Stop the endpoint: its API server and its engine (which leads a session of its own, so it is found in the
    process tree, not by process group). A stopped engine generates nothing more for the request abandoned."""
    pids = [server.process.pid, *descendants(server.process.pid)]
    frozen.extend(pids)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)


async def queued(http: httpx.AsyncClient, server: Server) -> int:
    rank = (await http.get(f"{server.base_url}/load")).json()["ranks"][0]
    return int(rank["waiting"] + rank["running"])


async def running_on(http: httpx.AsyncClient, servers: list[Server]) -> Server:
    """The endpoint where the test's one request runs (polling real processes; the caller's deadline bounds it)."""
    while True:
        for server in servers:
            if await queued(http, server):
                return server
        await anyio.sleep(0.02)


async def wait_idle(http: httpx.AsyncClient, server: Server) -> None:
    while await queued(http, server):  # noqa: ASYNC110 - another process
        await anyio.sleep(0.05)


async def wait_usable(http: httpx.AsyncClient, router: RouterProcess, n: int) -> None:
    while (await http.get(f"{router.base_url}/health")).json()["num_usable"] != n:  # noqa: ASYNC110
        await anyio.sleep(0.05)


@asynccontextmanager
async def clients(router: RouterProcess) -> AsyncIterator[tuple[httpx.AsyncClient, openai.AsyncOpenAI]]:
    async with (httpx.AsyncClient(timeout=10) as http,
                openai.AsyncOpenAI(base_url=f"{router.base_url}/v1", api_key="x", max_retries=0) as client):
        yield http, client


async def count_successes(server: Server) -> float:
    return sum((await successes(server.base_url)).values())


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_request_its_frozen_endpoint_did_not_answer_is_answered_by_the_other(
        endpoints: list[Server], tmp_path: Path, backend: str) -> None:
    async with (routed(tmp_path / "router.log", *(s.base_url for s in endpoints),
                       args=("--backend", backend)) as router, clients(router) as (http, client)):
        before = [await count_successes(s) for s in endpoints]
        answers: list[openai.types.Completion] = []

        async def complete() -> None:
            answers.append(await client.completions.create(model=MODEL, prompt="Once upon a time",
                                                           max_tokens=TOKENS, extra_body=NO_EOS))

        with freezer() as frozen, anyio.fail_after(BOUND_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(complete)
                stopped = await running_on(http, endpoints)
                freeze(frozen, stopped)
        other = next(s for s in endpoints if s is not stopped)
        assert answers[0].usage is not None and answers[0].usage.completion_tokens == TOKENS
        with anyio.fail_after(BOUND_S):  # resumed: it sees the connection closed, and aborts its copy
            await wait_idle(http, stopped)
            await wait_usable(http, router, 2)
        after = {s.port: await count_successes(s) - b for s, b in zip(endpoints, before, strict=True)}
        assert after == {stopped.port: 0, other.port: 1}, (after, router.log()[-3000:])
        assert await anyio.to_thread.run_sync(router.stop) == 0
    log = router.log()
    assert f"{stopped.base_url} stopped answering" in log and "sending the request to the next endpoint" in log
    assert "Traceback" not in log


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_stream_whose_endpoint_freezes_ends_with_an_error_event(
        endpoints: list[Server], tmp_path: Path, backend: str) -> None:
    async with (routed(tmp_path / "router.log", *(s.base_url for s in endpoints),
                       args=("--backend", backend)) as router, clients(router) as (http, client)):
        with freezer() as frozen, anyio.fail_after(BOUND_S):
            stream = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=TOKENS,
                                                     stream=True, extra_body=NO_EOS)
            chunks = stream.__aiter__()
            await chunks.__anext__()  # the stream started: it can no longer go to another endpoint
            stopped = await running_on(http, endpoints)
            freeze(frozen, stopped)
            received = 1
            with pytest.raises(openai.APIError) as info:
                async for _ in chunks:
                    received += 1
        assert received < TOKENS
        assert not isinstance(info.value, openai.APIConnectionError)  # an event, not a response cut off
        assert isinstance(info.value.body, dict) and info.value.body["code"] == 504, info.value.body
        assert f"the endpoint {stopped.base_url} stopped answering" in info.value.message
        with anyio.fail_after(BOUND_S):
            await wait_idle(http, stopped)
            await wait_usable(http, router, 2)
        assert await anyio.to_thread.run_sync(router.stop) == 0
    assert "Traceback" not in router.log()


async def test_with_no_other_endpoint_the_request_gets_a_503_in_openai_shape(
        endpoints: list[Server], tmp_path: Path) -> None:
    only = endpoints[0]
    async with routed(tmp_path / "router.log", only.base_url) as router, clients(router) as (http, client):
        failures: list[openai.APIStatusError] = []

        async def complete() -> None:
            with pytest.raises(openai.APIStatusError) as info:
                await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=TOKENS,
                                                extra_body=NO_EOS)
            failures.append(info.value)

        with freezer() as frozen, anyio.fail_after(BOUND_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(complete)
                freeze(frozen, await running_on(http, [only]))
        error = failures[0]
        assert error.status_code == 503 and isinstance(error.body, dict), error
        assert set(error.body) == {"message", "type", "param", "code"} and error.body["code"] == 503
        assert error.body["message"].startswith("no endpoint can take the request")
        assert f"{only.base_url} stopped answering" in error.body["message"]
        with anyio.fail_after(BOUND_S):
            await wait_idle(http, only)
            await wait_usable(http, router, 1)
        assert await anyio.to_thread.run_sync(router.stop) == 0
    assert "Traceback" not in router.log()
