"""``--scheduling-policy priority`` end to end, through the official ``openai`` client (``extra_body``) against
``asyncdp serve builtin:tiny-dense --max-num-seqs 1``: requests queued while the engine is paused (``keep``: nothing
is scheduled) are served, once it resumes, by priority then arrival, so the one submitted last with the best
(lowest) priority streams its first token before the two queued ahead of it. The default policy refuses a priority
with vLLM's 400."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import httpx
import openai
import pytest

from tests.e2e.conftest import Server, serve
from tests.e2e.metrics_text import per_engine, read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MODEL = "builtin:tiny-dense"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve(tmp_path_factory.mktemp("priority"), "--scheduling-policy", "priority", "--max-num-seqs", "1") as srv:
        yield srv


async def waiting(base_url: str) -> float:
    return sum(per_engine(await read_metrics(base_url), "vllm:num_requests_waiting").values())


async def test_a_later_request_of_better_priority_is_served_first(server: Server) -> None:
    firsts: list[str] = []  # the order in which the requests streamed their first token

    async def stream(client: openai.AsyncOpenAI, name: str, priority: int) -> None:
        chunks = await client.completions.create(
            model=MODEL, prompt=f"Request {name}", max_tokens=8, stream=True,
            extra_body={"priority": priority, "ignore_eos": True})
        async for chunk in chunks:
            if chunk.choices and chunk.choices[0].text and name not in firsts:
                firsts.append(name)

    with anyio.fail_after(60):
        async with server.openai() as client, httpx.AsyncClient(base_url=server.base_url) as http:
            assert (await http.post("/pause", params={"mode": "keep"})).status_code == 200
            async with anyio.create_task_group() as tg:
                for queued, (name, priority) in enumerate((("low-1", 5), ("low-2", 5), ("high", -1)), start=1):
                    tg.start_soon(stream, client, name, priority)
                    while True:  # queued at the rank (the gauge says so) before the next one arrives
                        if await waiting(server.base_url) >= queued:
                            break
                        await anyio.sleep(0.02)
                assert (await http.post("/resume")).status_code == 200
    assert firsts == ["high", "low-1", "low-2"]


async def test_the_default_policy_refuses_a_priority_with_vllms_400(tmp_path_factory: pytest.TempPathFactory) -> None:
    with serve(tmp_path_factory.mktemp("fcfs")) as fcfs:
        async with fcfs.openai() as client:
            with pytest.raises(openai.BadRequestError) as err:
                await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                    extra_body={"priority": 1})
            ok = await client.completions.create(model=MODEL, prompt="hi", max_tokens=1, extra_body={"priority": 0})
    assert err.value.status_code == 400
    assert err.value.body["param"] == "priority"  # type: ignore[index]
    assert err.value.body["message"] == "Got priority 1 but Priority scheduling is not enabled."  # type: ignore[index]
    assert ok.choices[0].finish_reason == "length"
