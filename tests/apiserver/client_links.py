"""What the DP client's tests (tests/apiserver/test_client_*.py) share: a client config, an engine's
EngineReady, a ready client with one hand-driven engine link, the engine's outputs and the first AddRequest it
reads, and one sample of the client's Prometheus metrics."""


from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from prometheus_client.parser import text_string_to_metric_families

from asyncdp import messages as m
from asyncdp.api.metrics import Metrics
from asyncdp.apiserver.client import ClientConfig, DPClient
from asyncdp.transport import memory_link_pair
from asyncdp.transport.links import MemoryLink


def _config(**changes) -> ClientConfig:
    base = dict(client_index=0, client_count=1, managed_ranks=(0,), dp_size=1, model_name="m", max_model_len=64)
    base.update(changes)
    return ClientConfig(**base)


def _ready(rank: int = 0) -> m.EngineReady:
    return m.EngineReady(dp_rank=rank, max_model_len=64, num_kv_blocks=8, block_size=16,
                         coordinator_client_addr=None)


@asynccontextmanager
async def _client_with_engine(**changes) -> AsyncIterator[tuple[DPClient, MemoryLink]]:
    """A ready client with one hand-driven engine link (rank 0)."""
    client = DPClient(_config(**changes), tokenizer=None)
    client_end, engine_end = memory_link_pair()
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.attach_engine, client_end)
        await engine_end.send(_ready())
        await client.wait_engines_ready()
        yield client, engine_end
        tg.cancel_scope.cancel()
    await engine_end.aclose()


def _outputs(*outs: m.RequestOutput) -> m.EngineOutputs:
    return m.EngineOutputs(dp_rank=0, outputs=list(outs), scheduler_stats=None, timestamp=0.0,
                           finished_request_ids=[o.request_id for o in outs if o.finished])


async def _first_add(engine_end: MemoryLink) -> m.AddRequest:
    while not isinstance(msg := await engine_end.receive(), m.AddRequest):
        pass
    return msg


def _sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None
