"""``asyncdp route`` in front of a real ``asyncdp serve builtin:tiny-dense`` endpoint that is killed (SIGKILL to
every process of its tree: its connections are closed by the kernel) while a stream of events runs through the
router. The client must not see a stream cut off: it gets an error event in OpenAI's shape (code 502, naming the
endpoint) and ``data: [DONE]``, as ``asyncdp serve`` ends a stream that fails, and the ``openai`` client raises
:class:`openai.APIError` from that event instead of :class:`openai.APIConnectionError`.

The endpoint runs the simulated executor (40 ms a step), so the stream still runs when the endpoint is killed.
Before the fix the stream ended without its end and the client raised APIConnectionError. What a client gets when
the cut is inside an event, or the response is not a stream of events, is checked in-process
(tests/router/test_endpoint_dies_mid_answer.py): those stay cut off.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import openai
import pytest

from tests.e2e.conftest import MODEL, Server
from tests.e2e.external_lb import single_rank_endpoints
from tests.router.upstream import routed

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

SIM = ("--executor", "sim", "--sim-cost", "40,0,0,0")  # 40 ms a step, whatever the machine's load
TOKENS = 100  # 4 s a stream: still running when its endpoint is killed
BOUND_S = 40.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the test's client; the router's backend is the test's parameter


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[Server]:
    with single_rank_endpoints(tmp_path, 1, *SIM) as servers:
        yield servers[0]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
async def test_a_stream_whose_endpoint_is_killed_ends_with_an_error_event(
        endpoint: Server, tmp_path: Path, backend: str) -> None:
    async with (routed(tmp_path / "router.log", endpoint.base_url, args=("--backend", backend)) as router,
                openai.AsyncOpenAI(base_url=f"{router.base_url}/v1", api_key="x", max_retries=0) as client):
        with anyio.fail_after(BOUND_S):
            stream = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=TOKENS,
                                                     stream=True, extra_body={"ignore_eos": True})
            chunks = stream.__aiter__()
            await chunks.__anext__()  # the stream started
            endpoint.kill_all()
            received = 1
            with pytest.raises(openai.APIError) as info:
                async for _ in chunks:
                    received += 1
        assert received < TOKENS
        assert not isinstance(info.value, openai.APIConnectionError), info.value  # an event, not a cut
        body = info.value.body
        assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}, body
        assert body["code"] == 502 and body["type"] == "BadGateway", body
        assert f"the endpoint {endpoint.base_url} failed mid-answer" in info.value.message
        assert await anyio.to_thread.run_sync(router.stop) == 0
    log = router.log()
    assert f"endpoint {endpoint.base_url} failed while answering" in log and "Traceback" not in log
