"""The DP client's admission and slot release (issue #12), against hand-driven engine links (no engine
processes): admission is refused whole or reserves slots, every way a request ends gives its slot back, and a
request the engine refuses, abandons or fails mid-generation raises an error naming the cause."""


from contextlib import aclosing

import anyio
import pytest

from asyncdp import errors
from asyncdp import messages as m
from asyncdp.apiserver.client import ABORT_ACK_TIMEOUT_S, DPClient
from asyncdp.sampling_params import SamplingParams
from asyncdp.transport import memory_link_pair
from tests.apiserver.client_links import _client_with_engine, _config, _first_add, _outputs, _ready


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


@pytest.mark.trio
async def test_admitting_more_sequences_than_free_slots_is_refused_whole_and_reserves_nothing(autojump_clock):
    async with _client_with_engine(max_queued_requests=8) as (client, _):
        with pytest.raises(errors.InvalidRequestError, match="--max-queued-requests 8"):
            client.admit(9)  # more than ever fits, even idle: a 400, not a 429 that a client would retry
        assert client.num_inflight == 0
        first = client.admit(5)
        with pytest.raises(errors.QueueFullError):
            client.admit(4)  # 5 + 4 > 8: refused whole, the 5 stay as they were
        assert client.num_inflight == 5
        first.release()
        first.release()  # idempotent
        assert client.num_inflight == 0
        client.admit(8).release()
        assert client.num_inflight == 0


@pytest.mark.trio
async def test_admission_while_the_ranks_are_still_starting_is_unavailable(autojump_clock):
    client = DPClient(_config(), tokenizer=None)
    with pytest.raises(errors.UnavailableError, match="starting"):
        client.admit(1)
    assert client.num_inflight == 0


@pytest.mark.trio
async def test_a_request_generated_with_an_admission_takes_its_reserved_slot_and_gives_it_back(autojump_clock):
    async with _client_with_engine(max_queued_requests=2) as (client, engine_end):
        admission = client.admit(2)

        async def engine() -> None:
            add = await _first_add(engine_end)
            assert client.num_inflight == 2  # one taken, one still reserved: the count did not grow
            await engine_end.send(_outputs(m.RequestOutput(request_id=add.request_id, new_token_ids=[7],
                                                           finished=True, finish_reason="length")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(engine)
            outs = [o async for o in client.generate("r1", [1, 2], SamplingParams(max_tokens=1),
                                                     admission=admission)]
        assert outs[-1].finish_reason == "length"
        assert client.num_inflight == 1
        admission.release()
        assert client.num_inflight == 0 and client.inflight_of(0) == 0


@pytest.mark.trio
async def test_a_request_the_message_encoder_refuses_is_a_400_and_releases_its_slot(autojump_clock):
    async with _client_with_engine(max_queued_requests=3) as (client, _):
        for i in range(4):  # more than the cap: a leaked slot would turn the last ones into 429s
            with pytest.raises(errors.InvalidRequestError, match="cannot be encoded"):
                async for _ in client.generate(f"r{i}", [2**65], SamplingParams(max_tokens=1)):
                    pass
            assert client.num_inflight == 0 and client.inflight_of(0) == 0


@pytest.mark.trio
async def test_an_engine_that_never_answers_an_abort_gives_the_slot_back_after_a_deadline(autojump_clock):
    async with _client_with_engine() as (client, engine_end):
        async def engine() -> None:
            add = await _first_add(engine_end)
            await engine_end.send(_outputs(m.RequestOutput(request_id=add.request_id, new_token_ids=[7])))
            async for _ in engine_end:  # reads the abort, never answers it
                pass

        async with anyio.create_task_group() as tg:
            tg.start_soon(engine)
            start = anyio.current_time()
            async with aclosing(client.generate("r1", [1, 2], SamplingParams(max_tokens=100))) as gen:
                async for _ in gen:
                    break  # the caller leaves early: the generator aborts the request
            assert client.num_inflight == 0 and client.inflight_of(0) == 0
            assert anyio.current_time() - start == pytest.approx(ABORT_ACK_TIMEOUT_S)
            tg.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_rank_that_dies_after_the_generator_was_closed_releases_the_slot(autojump_clock):
    async with _client_with_engine() as (client, engine_end):
        async def engine() -> None:
            add = await _first_add(engine_end)
            await engine_end.send(_outputs(m.RequestOutput(request_id=add.request_id, new_token_ids=[7])))
            assert isinstance(await engine_end.receive(), m.AbortRequests)
            await engine_end.send(m.EngineDead(dp_rank=0, reason="boom"))  # dies instead of answering

        async with anyio.create_task_group() as tg:
            tg.start_soon(engine)
            start = anyio.current_time()
            async with aclosing(client.generate("r1", [1, 2], SamplingParams(max_tokens=100))) as gen:
                async for _ in gen:
                    break
            assert client.num_inflight == 0 and client.inflight_of(0) == 0
            assert anyio.current_time() - start < ABORT_ACK_TIMEOUT_S  # released by the death, not the deadline


@pytest.mark.trio
@pytest.mark.parametrize("how", ["abort_all", "engine_abort"])
async def test_a_request_the_server_abandons_at_shutdown_is_an_error_naming_the_cause(autojump_clock, how):
    async with _client_with_engine() as (client, engine_end):
        async def engine() -> None:
            add = await _first_add(engine_end)
            await engine_end.send(_outputs(m.RequestOutput(request_id=add.request_id, new_token_ids=[7])))
            await anyio.sleep(1)  # the caller has the first delta
            client.begin_shutdown("the deployment is being torn down (engine rank 1 exited)")
            if how == "abort_all":
                await client.abort_all("the deployment is being torn down (engine rank 1 exited) with "
                                       "--shutdown-timeout 0")
            else:  # the rank's own drain deadline aborted it
                await engine_end.send(_outputs(m.RequestOutput(request_id=add.request_id, finished=True,
                                                               finish_reason="abort")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(engine)
            outs = []
            with pytest.raises(errors.ShuttingDownError, match="abandoned.*engine rank 1 exited"):
                async for out in client.generate("r1", [1, 2], SamplingParams(max_tokens=100)):
                    outs.append(out)
            assert [o.finish_reason for o in outs] == [None]  # never a normal end with reason "abort"
            assert client.num_inflight == 0 and client.inflight_of(0) == 0


@pytest.mark.trio
async def test_an_abort_outside_shutdown_still_ends_the_request_normally(autojump_clock):
    """``POST /pause?mode=abort``: the engines abort every request; that stays a normal end with ``abort``."""
    async with _client_with_engine() as (client, engine_end):
        async def engine() -> None:
            add = await _first_add(engine_end)
            await engine_end.send(_outputs(m.RequestOutput(request_id=add.request_id, finished=True,
                                                           finish_reason="abort")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(engine)
            outs = [o async for o in client.generate("r1", [1, 2], SamplingParams(max_tokens=100))]
        assert outs[-1].finish_reason == "abort"
        assert client.num_inflight == 0


@pytest.mark.trio
@pytest.mark.parametrize("shutting_down", [False, True])
async def test_a_request_a_rank_abandons_on_its_own_is_a_503_naming_the_rank(autojump_clock, shutting_down):
    """The rank stopped by itself (its node's launcher died, a signal to it alone): its drain deadline's abort is
    marked ``abandoned``; this client, not shutting down, answers 503 with the rank's reason, never a 200 cut
    short. While the client shuts down too, its own reason wins (as for a bare abort)."""
    async with _client_with_engine() as (client, engine_end):
        async def engine() -> None:
            add = await _first_add(engine_end)
            await engine_end.send(_outputs(m.RequestOutput(request_id=add.request_id, new_token_ids=[7])))
            await anyio.sleep(1)
            if shutting_down:
                client.begin_shutdown("the deployment is stopping")
            await engine_end.send(_outputs(m.RequestOutput(
                request_id=add.request_id, finished=True, finish_reason="abort", error_type="abandoned",
                error="engine rank 0 stopped before the request finished")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(engine)
            outs = []
            match = "abandoned: the deployment is stopping" if shutting_down else "engine rank 0 stopped"
            with pytest.raises(errors.ShuttingDownError, match=match):
                async for out in client.generate("r1", [1, 2], SamplingParams(max_tokens=100)):
                    outs.append(out)
            assert [o.finish_reason for o in outs] == [None]
            assert client.num_inflight == 0


@pytest.mark.trio
async def test_a_request_whose_grammar_fails_mid_generation_raises_a_400_naming_the_field(autojump_clock):
    """The engine ends a request whose grammar failed with ``finish_reason="error"`` and an ``invalid_request``
    error naming the field: the tokens before it were yielded, then the request raises (a 400 naming the
    field, or an error event when streaming), never a normal end; the slot is released without an abort."""
    async with _client_with_engine() as (client, engine_end):
        async def engine() -> None:
            add = await _first_add(engine_end)
            await engine_end.send(_outputs(m.RequestOutput(request_id=add.request_id, new_token_ids=[7])))
            await engine_end.send(_outputs(m.RequestOutput(
                request_id=add.request_id, new_token_ids=[8], finished=True, finish_reason="error",
                error_type="invalid_request", error="structured.regex failed during generation",
                error_field="structured.regex")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(engine)
            outs = []
            with pytest.raises(errors.InvalidRequestError, match="failed during generation") as err:
                async for out in client.generate("r1", [1, 2], SamplingParams(max_tokens=100)):
                    outs.append(out)
            assert err.value.field == "structured.regex"
            assert [o.new_token_ids for o in outs] == [[7]]
            assert client.num_inflight == 0
