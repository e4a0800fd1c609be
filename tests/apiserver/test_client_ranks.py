"""The DP client's engine links, hand-driven (no engine processes): a malformed first frame drops only that
link, the policy learns the engines' KV capacity once every rank is ready, a dead rank's gauges are zeroed, a
dead rank that connects again is routed to again, and with every rank gone a request is refused naming the
last rank's end."""

import re

import anyio
import pytest
import trio.testing

from asyncdp import messages as m
from asyncdp.api.metrics import Metrics
from asyncdp.apiserver.client import DPClient
from asyncdp.errors import UnavailableError
from asyncdp.sampling_params import SamplingParams
from asyncdp.transport import memory_link_pair
from asyncdp.transport.links import MemoryLink
from tests.apiserver.client_links import _client_with_engine, _config, _first_add, _ready, _sample


@pytest.mark.trio
async def test_a_malformed_first_frame_drops_that_link_and_the_client_keeps_waiting(autojump_clock):
    client = DPClient(_config(), tokenizer=None)
    garbage_send, garbage_recv = anyio.create_memory_object_stream(4)
    idle_send, idle_recv = anyio.create_memory_object_stream(4)
    bad = MemoryLink(idle_send, garbage_recv, name="bad")
    await garbage_send.send(b"\x81\xa4type\xa7Unknown")
    with anyio.fail_after(5):
        await client.attach_engine(bad)  # returns: the link is dropped, nothing raises
    assert not client.is_healthy()
    client_end, engine_end = memory_link_pair()
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.attach_engine, client_end)
        await engine_end.send(_ready())
        with anyio.fail_after(5):
            await client.wait_engines_ready()
        assert client.is_healthy()
        tg.cancel_scope.cancel()
    for stream in (garbage_send, idle_recv):
        await stream.aclose()
    await engine_end.aclose()


@pytest.mark.trio
async def test_a_dead_ranks_engine_gauges_are_zeroed_instead_of_frozen(autojump_clock, monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics(model_name="m", multiproc_dir=None)
    client = DPClient(_config(managed_ranks=(0, 1), dp_size=2, is_moe=True), tokenizer=None, metrics=metrics)
    ends = [memory_link_pair() for _ in range(2)]
    async with anyio.create_task_group() as tg:
        for rank, (client_end, engine_end) in enumerate(ends):
            tg.start_soon(client.attach_engine, client_end)
            await engine_end.send(_ready(rank))
        await client.wait_engines_ready()
        stats = m.SchedulerStats(num_running=50, num_waiting=3, kv_cache_usage=0.7, wave=4, wave_running=True)
        await ends[1][1].send(m.EngineOutputs(dp_rank=1, outputs=[], finished_request_ids=[], scheduler_stats=stats,
                                              timestamp=0.0))
        await anyio.sleep(0.1)
        assert _sample(metrics, "vllm:num_requests_running", engine="1") == 50
        await ends[1][1].send(m.EngineDead(dp_rank=1, reason="boom"))
        await anyio.sleep(0.1)
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                     "asyncdp:dp_running", "asyncdp:dp_wave", "asyncdp:dp_engine_up"):
            assert _sample(metrics, name, engine="1") == 0, name
        tg.cancel_scope.cancel()
    for _, engine_end in ends:
        await engine_end.aclose()


@pytest.mark.trio
async def test_the_policy_is_told_the_engines_kv_capacity_once_every_managed_rank_is_ready(autojump_clock):
    client = DPClient(_config(managed_ranks=(0, 1), dp_size=2, lb_policy="asyncdp"), tokenizer=None)
    assert client.lb.state.capacity == 28_000  # the policy's default until the engines have said
    ends = [memory_link_pair() for _ in range(2)]
    async with anyio.create_task_group() as tg:
        for rank, (client_end, engine_end) in enumerate(ends):
            tg.start_soon(client.attach_engine, client_end)
            await engine_end.send(m.EngineReady(dp_rank=rank, max_model_len=64, num_kv_blocks=[300, 200][rank],
                                                block_size=32, coordinator_client_addr=None))
        with anyio.fail_after(5):
            await client.wait_engines_ready()
        assert (client.lb.state.capacity, client.lb.state.block_size) == (200, 32)  # the smaller rank's
        tg.cancel_scope.cancel()
    for _, engine_end in ends:
        await engine_end.aclose()


@pytest.mark.trio
async def test_with_every_rank_gone_a_request_is_refused_naming_the_last_ranks_end(autojump_clock):
    """A bare "no rank can serve" leaves the operator to dig through the logs: the refusal says which rank ended
    last and how (an external-LB rank server whose MoE peer was stopped keeps its listener until it exits)."""
    async with _client_with_engine() as (client, engine_end):
        await engine_end.send(m.EngineDead(dp_rank=0, reason="rank 0: its MoE group ended (teardown)"))
        await trio.testing.wait_all_tasks_blocked()  # the link's reader took the EngineDead
        assert not client.is_healthy()
        expected = "no data-parallel rank can serve requests: the last, engine rank 0, ended (rank 0: its MoE group"
        with pytest.raises(UnavailableError, match=re.escape(expected)):
            client.admit(1)
        with pytest.raises(UnavailableError, match=re.escape(expected)):
            await client.call_utility("pause", mode="keep")


async def _served_by(client: DPClient, engine_end: MemoryLink, request_id: str, rank: int) -> None:
    """A request pinned to global ``rank`` reaches ``engine_end`` and finishes there."""
    from asyncdp.api.engine_client import RankHint

    async def engine() -> None:
        add = await _first_add(engine_end)
        await engine_end.send(m.EngineOutputs(dp_rank=rank, outputs=[m.RequestOutput(
            request_id=add.request_id, new_token_ids=[7], finished=True, finish_reason="length")],
            finished_request_ids=[add.request_id], scheduler_stats=None, timestamp=0.0))

    async with anyio.create_task_group() as tg:
        tg.start_soon(engine)
        outs = [o async for o in client.generate(request_id, [1, 2], SamplingParams(max_tokens=1),
                                                 rank_hint=RankHint(global_rank=rank))]
    assert outs[-1].finished


@pytest.mark.trio
@pytest.mark.parametrize("old_link", ["closed", "lingering"])
async def test_a_dead_rank_that_connects_again_is_ready_and_routed_to_again(autojump_clock, monkeypatch, old_link):
    """Dense: a restarted node's engine opens a new link for a rank that died (spec §13). The rank used to stay
    dead in the balancer for good: a request pinned to it got 503 "data_parallel_rank 1 is not available".
    ``lingering``: the lost engine's link is still open, silent, when the new one arrives (a lost host, not yet
    timed out); it counts as dead at once, and its late end does not take the new link's rank down."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics(model_name="m", multiproc_dir=None)
    client = DPClient(_config(managed_ranks=(0, 1), dp_size=2), tokenizer=None, metrics=metrics)
    first = [memory_link_pair() for _ in range(2)]
    again_client, again_engine = memory_link_pair()
    async with anyio.create_task_group() as tg:
        for rank, (client_end, engine_end) in enumerate(first):
            tg.start_soon(client.attach_engine, client_end)
            await engine_end.send(_ready(rank))
        await client.wait_engines_ready()
        if old_link == "closed":
            await first[1][1].aclose()  # the node was lost: EOF on the client's side
            await anyio.sleep(0.1)
            assert client.engine_states()[1][0] is False and client.lb.dead_ranks == [1]
            assert _sample(metrics, "asyncdp:dp_engine_up", engine="1") == 0
        if old_link == "lingering":
            await anyio.sleep(3)  # its host is lost: silent for a while, not yet past the heartbeat timeout
        tg.start_soon(client.attach_engine, again_client)
        await again_engine.send(_ready(1))
        await anyio.sleep(0.1)
        if old_link == "lingering":
            await first[1][1].aclose()
            await anyio.sleep(0.1)
        assert client.engine_states()[1][0] is True and client.lb.dead_ranks == []
        assert [r["state"] for r in client.server_info()["managed_ranks"]] == ["ready", "ready"]
        assert _sample(metrics, "asyncdp:dp_engine_up", engine="1") == 1
        await _served_by(client, again_engine, "pinned", 1)
        tg.cancel_scope.cancel()
    for _, engine_end in first:
        await engine_end.aclose()
    await again_engine.aclose()
