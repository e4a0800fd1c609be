"""Every wait of the DP client on an engine has a deadline (issue 7), hand-driven in virtual time: a utility
call no rank answers fails with 503 after its deadline, a closed rank link fails requests and utility calls at
once, a link that stays full fails a request after the send deadline, and a failed utility call raises by its
error kind."""



import anyio
import pytest

from asyncdp import errors
from asyncdp import messages as m
from asyncdp.apiserver.client import DPClient
from asyncdp.errors import UnavailableError
from asyncdp.sampling_params import SamplingParams
from asyncdp.transport import memory_link_pair
from tests.apiserver.client_links import _client_with_engine, _config, _first_add, _ready


@pytest.mark.trio
async def test_a_utility_call_no_rank_answers_fails_with_503_after_its_deadline(autojump_clock):
    # an engine that stays connected and never answers (it sends no heartbeat either: the liveness rule must not
    # end the call first)
    client = DPClient(_config(utility_timeout_s=30.0, heartbeat_timeout_s=60.0), tokenizer=None)
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
async def test_a_request_in_flight_fails_at_once_when_its_ranks_link_closes(autojump_clock):
    async with _client_with_engine() as (client, engine_end):
        async def engine() -> None:
            await _first_add(engine_end)
            await engine_end.aclose()  # the rank's process is gone: EOF on the client's side

        async with anyio.create_task_group() as tg:
            tg.start_soon(engine)
            start = anyio.current_time()
            with pytest.raises(errors.EngineDeadError, match="engine rank 0 died: its link closed"):
                async for _ in client.generate("r1", [1, 2], SamplingParams(max_tokens=100)):
                    pass
            assert anyio.current_time() - start == 0
            assert client.num_inflight == 0 and client.inflight_of(0) == 0


@pytest.mark.trio
@pytest.mark.parametrize(("error_kind", "raised", "status"), [(m.PAUSE_ERROR, "PauseError", 409),
                                                              (None, "AsyncDPError", 500)])
async def test_a_failed_utility_call_raises_by_its_error_kind(autojump_clock, error_kind, raised, status):
    """A pause that a resume overtook fails on the rank with ``error_kind`` "pause": the client raises PauseError,
    which the API answers with 409 (the caller's conflict); any other failure stays an internal error."""
    from asyncdp import errors
    from asyncdp.api.errors import status_and_body

    async with _client_with_engine() as (client, engine_end):
        async def engine() -> None:
            call = await engine_end.receive()
            assert isinstance(call, m.UtilityCall) and call.method == "pause"
            await engine_end.send(m.UtilityResult(call_id=call.call_id, ok=False,
                                                  error="resumed before the pause completed", error_kind=error_kind))

        async with anyio.create_task_group() as tg:
            tg.start_soon(engine)
            with pytest.raises(errors.AsyncDPError, match="pause failed: resumed before the pause completed") as e:
                await client.call_utility("pause", mode="wait")
    assert type(e.value).__name__ == raised
    assert status_and_body(e.value)[0] == status


@pytest.mark.trio
async def test_a_utility_call_fails_at_once_when_a_ranks_link_closes_instead_of_waiting_for_its_deadline(
        autojump_clock):
    async with _client_with_engine(utility_timeout_s=600.0) as (client, engine_end):
        async def engine() -> None:
            assert isinstance(await engine_end.receive(), m.UtilityCall)
            await engine_end.aclose()  # dies without answering

        async with anyio.create_task_group() as tg:
            tg.start_soon(engine)
            start = anyio.current_time()
            with pytest.raises(errors.EngineDeadError, match="engine rank 0 died during utility call 'pause'"):
                await client.call_utility("pause", mode="keep")
            assert anyio.current_time() - start == 0


@pytest.mark.trio
async def test_a_request_whose_ranks_link_stays_full_fails_after_the_send_deadline_naming_the_rank(autojump_clock):
    from asyncdp.apiserver.engine_links import ENGINE_SEND_TIMEOUT_S

    client = DPClient(_config(heartbeat_timeout_s=60.0), tokenizer=None)
    client_end, engine_end = memory_link_pair(max_buffer=0)  # the engine never reads: every send blocks
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.attach_engine, client_end)
        await engine_end.send(_ready())
        await client.wait_engines_ready()
        start = anyio.current_time()
        with pytest.raises(errors.EngineTimeoutError, match="engine rank 0 did not take AddRequest within 30 s"):
            async for _ in client.generate("r1", [1, 2], SamplingParams(max_tokens=4)):
                pass
        assert anyio.current_time() - start == pytest.approx(ENGINE_SEND_TIMEOUT_S)
        assert client.num_inflight == 0 and client.inflight_of(0) == 0
        tg.cancel_scope.cancel()
    await engine_end.aclose()
