"""The node table (shared memory between a node's API processes): pure decisions, the mapping, and the DP
client's node-wide admission and health on top of it."""

import os

import anyio
import pytest

from asyncdp import messages as m
from asyncdp.apiserver.client import ClientConfig, DPClient
from asyncdp.apiserver.node_table import (
    STUCK_AFTER_S,
    NodeTable,
    Slot,
    monotonic_ms,
    node_admits,
    stuck_siblings,
)
from asyncdp.errors import QueueFullError
from asyncdp.sampling_params import SamplingParams
from asyncdp.transport import memory_link_pair


def test_the_pool_is_the_per_process_limit_times_the_process_count():
    assert node_admits(own_inflight=8, sibling_inflight=0, num_sequences=8, per_process_limit=8, num_processes=2)
    assert not node_admits(8, 0, 9, 8, 2)
    assert not node_admits(0, 16, 1, 8, 2)


def test_only_siblings_in_use_with_an_old_heartbeat_are_stuck():
    now = 100_000
    old = now - int(STUCK_AFTER_S * 1000) - 1
    slots = [Slot(0, 10, 0, old), Slot(1, 11, 0, now), Slot(2, 12, 0, old), Slot(3, 0, 0, 0)]
    assert stuck_siblings(slots, own_index=0, now_ms=now) == [2]  # itself and the unused slot never count


def test_a_slot_written_through_one_mapping_is_read_through_another():
    table, fd = NodeTable.create(2)
    try:
        other = NodeTable(fd, 2)  # what an API child maps from the inherited descriptor
        table.register(1, 4242)
        table.set_inflight(1, 7)
        assert other.sibling_inflight(0) == 7 and other.sibling_inflight(1) == 0
        assert other.slots()[1].pid == 4242
        table.clear(1)
        assert other.sibling_inflight(0) == 0
        other.close()
    finally:
        table.close()
        os.close(fd)


async def _drive(awaitable) -> None:
    await awaitable


def _client(table: NodeTable, index: int, **changes) -> DPClient:
    cfg = ClientConfig(client_index=index, client_count=table.num_processes, managed_ranks=(0,), dp_size=1,
                       model_name="m", max_model_len=64, **changes)
    return DPClient(cfg, tokenizer=None, node_table=table)


@pytest.mark.trio
async def test_a_burst_on_one_api_process_uses_its_siblings_free_slots_and_no_more(autojump_clock):
    table, fd = NodeTable.create(2)
    client = _client(table, 0, max_queued_requests=8)
    client_end, engine_end = memory_link_pair()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.attach_engine, client_end)
            await engine_end.send(m.EngineReady(dp_rank=0, max_model_len=64, num_kv_blocks=8, block_size=16,
                                                coordinator_client_addr=None))
            await client.wait_engines_ready()
            burst = client.admit(16)  # more than this process's 8: the idle sibling's 8 are free
            assert table.slots()[0].inflight == 16
            burst.release()
            gen = client.generate("r1", [1, 2], SamplingParams(max_tokens=1))
            next_out = gen.__anext__()
            async with anyio.create_task_group() as inner:
                inner.start_soon(_drive, next_out)
                assert isinstance(await engine_end.receive(), m.AddRequest)
                assert table.slots()[0].inflight == 1  # a request in flight is published, not only reservations
                inner.cancel_scope.cancel()
            await gen.aclose()
            table.register(1, os.getpid())
            table.set_inflight(1, 6)  # the sibling is busy with 6
            with pytest.raises(QueueFullError, match="on this node"):
                client.admit(11)
            client.admit(10).release()
            assert table.slots()[0].inflight == 0
            tg.cancel_scope.cancel()
    finally:
        await engine_end.aclose()
        table.close()
        os.close(fd)


@pytest.mark.trio
async def test_health_fails_while_a_sibling_api_process_is_stuck_and_recovers_when_it_beats_again():
    table, fd = NodeTable.create(2)
    client = _client(table, 0)
    client_end, engine_end = memory_link_pair()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.attach_engine, client_end)
            await engine_end.send(m.EngineReady(dp_rank=0, max_model_len=64, num_kv_blocks=8, block_size=16,
                                                coordinator_client_addr=None))
            await client.wait_engines_ready()
            table.register(1, os.getpid())
            assert client.is_healthy()
            table._write(1, "heartbeat_ms", monotonic_ms() - int(STUCK_AFTER_S * 1000) - 100)  # it stopped
            assert not client.is_healthy()
            problem = client.health_problem()  # /health's 503 names the stuck process, not the healthy engines
            assert problem is not None and "API server 1" in problem and "engine" not in problem
            assert client.server_info()["api_processes"][1]["stuck"] is True
            table.beat(1)
            assert client.is_healthy() and client.health_problem() is None
            tg.cancel_scope.cancel()
    finally:
        await engine_end.aclose()
        table.close()
        os.close(fd)
