"""The DP client's request latencies start when the request reaches it, before it asks the coordinator where to
route: the time spent on that question is part of what the caller waits for, so it is part of TTFT and e2e."""

from __future__ import annotations

import types

import anyio
import pytest

import asyncdp.apiserver.client as client_module
import asyncdp.apiserver.engine_events as engine_events_module
from asyncdp import messages as m
from asyncdp.api.metrics import Metrics
from asyncdp.apiserver.client import DPClient
from asyncdp.sampling_params import SamplingParams
from asyncdp.transport import memory_link_pair
from tests.apiserver.client_links import _config, _first_add, _outputs, _ready, _sample

pytestmark = pytest.mark.anyio


class FakeClock:
    """Stands in for the ``time`` module of the client: a monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


async def test_the_wait_for_the_coordinators_directory_counts_in_ttft_and_e2e(monkeypatch) -> None:
    clock = FakeClock()
    fake_time = types.SimpleNamespace(monotonic=clock.monotonic, time=clock.time)
    monkeypatch.setattr(client_module, "time", fake_time)
    monkeypatch.setattr(engine_events_module, "time", fake_time)
    metrics = Metrics(model_name="m", multiproc_dir=None)
    client = DPClient(_config(), tokenizer=None, metrics=metrics)

    async def slow_directory(*args: object, **kwargs: object) -> None:
        clock.now += 5.0  # the coordinator took 5 s to say it does not know the prefix
        return None

    monkeypatch.setattr(client.coordinator, "direct", slow_directory)
    client_end, engine_end = memory_link_pair()
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.attach_engine, client_end)
        await engine_end.send(_ready())
        await client.wait_engines_ready()

        async def answer() -> None:
            add = await _first_add(engine_end)
            clock.now += 1.0
            await engine_end.send(_outputs(m.RequestOutput(request_id=add.request_id, new_token_ids=[1],
                                                           finished=True, finish_reason="length")))

        tg.start_soon(answer)
        async for _ in client.generate("r", [1, 2, 3], SamplingParams(max_tokens=1)):
            pass
        tg.cancel_scope.cancel()
    await engine_end.aclose()
    assert _sample(metrics, "vllm:time_to_first_token_seconds_sum", engine="0") == 6.0
    assert _sample(metrics, "vllm:e2e_request_latency_seconds_sum", engine="0") == 6.0
