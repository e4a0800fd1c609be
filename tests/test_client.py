"""The DP client against hand-driven engine links (no engine processes): startup robustness and utility calls."""

import anyio
import pytest

from asyncdp import messages as m
from asyncdp.client import ClientConfig, DPClient
from asyncdp.errors import UnavailableError
from asyncdp.transport import memory_link_pair
from asyncdp.transport.links import MemoryLink


def _config(**changes) -> ClientConfig:
    base = dict(client_index=0, client_count=1, managed_ranks=(0,), dp_size=1, model_name="m", max_model_len=64)
    base.update(changes)
    return ClientConfig(**base)


def _ready(rank: int = 0) -> m.EngineReady:
    return m.EngineReady(dp_rank=rank, max_model_len=64, num_kv_blocks=8, block_size=16,
                         coordinator_client_addr=None)


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
async def test_a_utility_call_no_rank_answers_fails_with_503_after_its_deadline(autojump_clock):
    client = DPClient(_config(utility_timeout_s=30.0), tokenizer=None)
    client_end, engine_end = memory_link_pair()
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.attach_engine, client_end)
        await engine_end.send(_ready())
        await client.wait_engines_ready()
        start = anyio.current_time()
        with pytest.raises(UnavailableError, match="pause did not complete"):
            await client.call_utility("pause", mode="keep")  # the engine reads the call and never answers
        assert anyio.current_time() - start == pytest.approx(30.0)
        assert isinstance(await engine_end.receive(), m.UtilityCall)
        tg.cancel_scope.cancel()
    await engine_end.aclose()


@pytest.mark.trio
@pytest.mark.parametrize(("error_type", "expected"), [("invalid_request", "InvalidRequestError"),
                                                      ("unavailable", "ShuttingDownError")])
async def test_a_request_the_engine_refuses_raises_instead_of_answering_empty(autojump_clock, error_type, expected):
    from asyncdp import errors
    from asyncdp.sampling_params import SamplingParams

    client = DPClient(_config(), tokenizer=None)
    client_end, engine_end = memory_link_pair()
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.attach_engine, client_end)
        await engine_end.send(_ready())
        await client.wait_engines_ready()

        async def engine() -> None:
            add = await engine_end.receive()
            assert isinstance(add, m.AddRequest)
            out = m.RequestOutput(request_id=add.request_id, finished=True, finish_reason="abort",
                                  error_type=error_type, error="no thanks")
            await engine_end.send(m.EngineOutputs(dp_rank=0, outputs=[out], finished_request_ids=[add.request_id],
                                                  scheduler_stats=None, timestamp=0.0))

        tg.start_soon(engine)
        with pytest.raises(getattr(errors, expected), match="no thanks"):
            async for _ in client.generate("r1", [1, 2, 3], SamplingParams(max_tokens=2)):
                pass
        assert client.num_inflight == 0 and client.inflight_of(0) == 0
        tg.cancel_scope.cancel()
    await engine_end.aclose()
