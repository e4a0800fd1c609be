"""``asyncdp route`` sends requests to the endpoint its telemetry says is idle, end to end: two real
``asyncdp serve builtin:tiny-dense`` endpoints (the simulated executor, 40 ms a step, so a request's length does
not depend on how busy the machine is), the first one loaded by long streams sent to it directly, then short
requests through a real router, on each backend.

Why the test cannot pass by chance. The loaded endpoint is the FIRST ``--endpoint``, and its streams were not
sent through the router: the router's own counts (its requests in flight, ``sent_since_seq``) are equal for both,
and its tie-break (the order of ``--endpoint``) picks the loaded one. Only the endpoints' ``GET /load`` says which
is busy. ``N`` short requests go through the router one after the other; each must reach the idle endpoint, as
its ``/metrics`` shows (``vllm:request_success_total`` of the idle one up by exactly ``N``, of the loaded one not
at all, while its streams still run: checked on its ``/load`` after the last request). A router that ignored the
telemetry would send every request to the loaded endpoint (the tie-break) or half of them (round robin: exactly
N/2); one that picked at random would send all ``N`` to the idle one with probability 2**-N = 2**-20 < 1e-6.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, Server
from tests.e2e.external_lb import single_rank_endpoints
from tests.e2e.metrics_text import successes
from tests.router.upstream import routed

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

SIM = ("--executor", "sim", "--sim-cost", "40,0,0,0")  # 40 ms a step, whatever the machine's load
NUM_LOADING = 8  # long streams on the loaded endpoint: a score of 8 requests' worth there
LOADING_TOKENS = 480  # 480 steps of 40 ms: each stream lasts over 19 s, the test's requests a few seconds
N = 20  # requests through the router; by chance all on the idle endpoint: 2**-20
NO_EOS = {"ignore_eos": True}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the test's client; the router's backend is the test's parameter


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    with single_rank_endpoints(tmp_path_factory.mktemp("route-prefers-idle"), 2, *SIM) as servers:
        yield servers


async def queued(http: httpx.AsyncClient, server: Server) -> int:
    """Requests waiting or running on ``server``'s one rank, by its ``GET /load``."""
    rank = (await http.get(f"{server.base_url}/load")).json()["ranks"][0]
    return int(rank["waiting"] + rank["running"])


async def wait_queued(http: httpx.AsyncClient, server: Server, want: int) -> None:
    """Until ``server`` has ``want`` requests waiting or running (polling a real process; the caller's deadline
    bounds it)."""
    while await queued(http, server) != want:  # noqa: ASYNC110 - another process
        await anyio.sleep(0.05)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
async def test_requests_go_to_the_endpoint_whose_load_says_it_is_idle(
        endpoints: list[Server], tmp_path: Path, backend: str) -> None:
    loaded, idle = endpoints
    async with (httpx.AsyncClient(timeout=10) as http,
                openai.AsyncOpenAI(base_url=f"{loaded.base_url}/v1", api_key="x", max_retries=0) as direct,
                anyio.create_task_group() as load_tg):
        with anyio.fail_after(30):  # the previous backend's streams, aborted, are gone
            await wait_queued(http, loaded, 0)
            await wait_queued(http, idle, 0)

        async def long_stream(i: int) -> None:
            stream = await direct.completions.create(model=MODEL, prompt=f"load {i}", max_tokens=LOADING_TOKENS,
                                                     stream=True, extra_body=NO_EOS)
            async for _ in stream:
                pass

        for i in range(NUM_LOADING):
            load_tg.start_soon(long_stream, i)
        with anyio.fail_after(30):
            await wait_queued(http, loaded, NUM_LOADING)
        before = [sum((await successes(s.base_url)).values()) for s in (loaded, idle)]

        # The loaded endpoint first: ties go to it.
        async with routed(tmp_path / "router.log", loaded.base_url, idle.base_url,
                          args=("--backend", backend)) as router:
            with anyio.fail_after(60):
                async with openai.AsyncOpenAI(base_url=f"{router.base_url}/v1", api_key="x",
                                              max_retries=0) as client:
                    for i in range(N):
                        done = await client.completions.create(model=MODEL, prompt=f"routed {i}", max_tokens=2,
                                                               extra_body=NO_EOS)
                        assert done.usage is not None and done.usage.completion_tokens == 2
            still_loaded = await queued(http, loaded)
            after = [sum((await successes(s.base_url)).values()) for s in (loaded, idle)]
            assert await anyio.to_thread.run_sync(router.stop) == 0
        load_tg.cancel_scope.cancel()  # the streams end: the loaded endpoint aborts them
    assert still_loaded == NUM_LOADING, "the loading streams ended before the routed requests did: no evidence"
    assert (after[0] - before[0], after[1] - before[1]) == (0, N), (before, after, router.log()[-3000:])
    assert f"backend {backend}" in router.log() and "Traceback" not in router.log()
