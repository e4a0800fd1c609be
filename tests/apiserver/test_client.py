"""The DP client against hand-driven engine links (no engine processes): startup robustness and utility calls."""

import re

import anyio
import pytest
import trio.testing

from asyncdp import messages as m
from asyncdp.apiserver.client import ClientConfig, DPClient
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


# ---------------------------------------------------------------- admission and slot release (issue #12)

from collections.abc import AsyncIterator  # noqa: E402
from contextlib import aclosing, asynccontextmanager  # noqa: E402

from asyncdp import errors  # noqa: E402
from asyncdp.apiserver.client import ABORT_ACK_TIMEOUT_S  # noqa: E402
from asyncdp.sampling_params import SamplingParams  # noqa: E402


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


# ---------------------------------------------------------------- gauges and the coordinator link (issue #12)

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from asyncdp.api.metrics import Metrics  # noqa: E402


def _sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


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
async def test_the_coordinator_is_followed_again_after_it_dropped_the_client(autojump_clock, monkeypatch):
    """A client the coordinator dropped (missed heartbeats while its event loop was blocked) reconnects and
    subscribes again; meanwhile the snapshot age grows at scrape time and the state says ``reconnecting``."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics(model_name="m", multiproc_dir=None)
    # A heartbeat timeout past the 23 s of silence below: this test is about a dropped link, not a silent one.
    client = DPClient(_config(managed_ranks=(0, 1), dp_size=2, heartbeat_timeout_s=60.0), tokenizer=None,
                      metrics=metrics)
    coordinator_ends: list[MemoryLink] = []
    connected = anyio.Event()

    async def connect() -> MemoryLink:
        nonlocal connected
        ours, theirs = memory_link_pair()
        coordinator_ends.append(theirs)
        connected.set()
        return ours

    snapshot = m.StatsSnapshot(counts=[[0, 0, 0], [0, 0, 0]], wave=0, running=False, seq=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.follow_coordinator, connect)
        await connected.wait()
        assert isinstance(await coordinator_ends[0].receive(), m.Subscribe)
        await coordinator_ends[0].send(snapshot)
        await anyio.sleep(23)
        info = client.server_info()["coordinator"]
        assert info["state"] == "alive"
        assert info["snapshot_age_s"] == pytest.approx(23, abs=0.01)
        assert _sample(metrics, "asyncdp:dp_coordinator_snapshot_age_seconds") == pytest.approx(23, abs=0.01)
        connected = anyio.Event()
        await coordinator_ends[0].aclose()  # the coordinator drops this client
        await anyio.sleep(0.1)
        assert client.server_info()["coordinator"]["state"] == "reconnecting"
        assert _sample(metrics, "asyncdp:dp_coordinator_up") == 0
        assert _sample(metrics, "asyncdp:dp_coordinator_snapshot_age_seconds") == pytest.approx(23.1, abs=0.01)
        await connected.wait()
        sub = await coordinator_ends[1].receive()
        assert isinstance(sub, m.Subscribe) and sub.client_id == 0
        await coordinator_ends[1].send(snapshot)
        await anyio.sleep(0.1)
        assert client.server_info()["coordinator"]["state"] == "alive"
        assert _sample(metrics, "asyncdp:dp_coordinator_up") == 1
        assert _sample(metrics, "asyncdp:dp_coordinator_snapshot_age_seconds") == pytest.approx(0.1, abs=0.01)
        client.begin_shutdown()
        tg.cancel_scope.cancel()
    for end in coordinator_ends:
        await end.aclose()


@pytest.mark.trio
async def test_a_coordinator_that_refuses_reconnection_is_dead_until_it_answers_again(autojump_clock):
    # The fake coordinator never sends a frame: a heartbeat timeout past this test's 20 s keeps it "alive".
    client = DPClient(_config(managed_ranks=(0, 1), dp_size=2, heartbeat_timeout_s=60.0), tokenizer=None)
    coordinator_ends: list[MemoryLink] = []
    refuse = True
    attempts = 0

    async def connect() -> MemoryLink:
        nonlocal attempts
        attempts += 1
        if attempts > 1 and refuse:
            raise ConnectionRefusedError("nobody listens")  # the coordinator process is gone
        ours, theirs = memory_link_pair()
        coordinator_ends.append(theirs)
        return ours

    async with anyio.create_task_group() as tg:
        tg.start_soon(client.follow_coordinator, connect)
        await anyio.sleep(0.1)
        assert client.coordinator_state == "alive"
        await coordinator_ends[0].aclose()
        await anyio.sleep(5)
        assert client.coordinator_state == "dead"
        refuse = False
        await anyio.sleep(15)  # the next attempt, after the capped backoff
        assert client.coordinator_state == "alive" and len(coordinator_ends) == 2
        client.begin_shutdown()
        tg.cancel_scope.cancel()
    for end in coordinator_ends:
        await end.aclose()


@pytest.mark.trio
async def test_a_coordinator_silent_past_the_heartbeat_timeout_is_dead_and_the_client_routes_on_inflight(
        autojump_clock, monkeypatch):
    """The link stays open but nothing arrives (a frozen coordinator process, a lost host): after
    ``heartbeat_timeout_s`` the coordinator is dead in ``/server_info`` and ``/metrics``, its last loads are not
    kept frozen, and the client connects and subscribes again."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics(model_name="m", multiproc_dir=None)
    client = DPClient(_config(managed_ranks=(0, 1), dp_size=2, heartbeat_timeout_s=5.0), tokenizer=None,
                      metrics=metrics)
    coordinator_ends: list[MemoryLink] = []
    reconnected = anyio.Event()

    async def connect() -> MemoryLink:
        ours, theirs = memory_link_pair()
        coordinator_ends.append(theirs)
        if len(coordinator_ends) == 2:
            reconnected.set()
        return ours

    async with anyio.create_task_group() as tg:
        tg.start_soon(client.follow_coordinator, connect)
        await anyio.sleep(0.1)
        assert isinstance(await coordinator_ends[0].receive(), m.Subscribe)
        # Rank 0 is loaded: while this snapshot is believed, every request goes to rank 1.
        await coordinator_ends[0].send(m.StatsSnapshot(counts=[[40, 0, 0], [0, 0, 0]], wave=0, running=False, seq=1))
        await anyio.sleep(4.8)  # silent, but not for the timeout yet
        assert client.server_info()["coordinator"]["state"] == "alive"
        assert _sample(metrics, "asyncdp:dp_coordinator_up") == 1
        await anyio.sleep(0.3)  # 5.1 s of silence: dead (the reconnection waits for its backoff)
        assert client.server_info()["coordinator"]["state"] == "dead"
        assert _sample(metrics, "asyncdp:dp_coordinator_up") == 0
        picks = {client.lb.select(f"r{i}") for i in range(3)}
        assert picks == {0, 1}  # on in-flight counts: rank 0's stale 40 waiting no longer counts
        with anyio.fail_after(5):
            await reconnected.wait()
        assert isinstance(await coordinator_ends[1].receive(), m.Subscribe)
        client.begin_shutdown()
        tg.cancel_scope.cancel()
    for end in coordinator_ends:
        await end.aclose()


# ---------------------------------------------------------------- every wait on an engine has a deadline (issue 7)


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
    ``lingering``: the lost engine's link is still open when the new one arrives (a lost host, not yet timed
    out); it counts as dead at once, and its late end does not take the new link's rank down."""
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
