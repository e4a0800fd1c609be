"""The dense rank loop (spec §8.1): pause/resume answered when idle, no spinning while frozen, shutdown and
teardown; MoE with dp = 1 runs the same loop. One EngineRank over in-memory links, in virtual time."""

from __future__ import annotations

import functools
from contextlib import asynccontextmanager
from itertools import pairwise

import anyio
import pytest
import trio

from asyncdp import messages as m
from asyncdp.config.flags import EngineConfig
from asyncdp.engine.core import EngineCore
from asyncdp.engine.rank import EngineRank, RankConfig
from asyncdp.engine.sim_executor import SimExecutor
from asyncdp.errors import RankTornDown
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing import FakeRankClient as FakeClient
from asyncdp.testing import sim_rank_core as sim_core
from asyncdp.testing.rank_cluster import RANK_SIM_COST
from asyncdp.transport import memory_link_pair


@asynccontextmanager
async def open_rank(*, with_coordinator: bool = False, core=None, **cfg):
    client = FakeClient(1)
    core = sim_core() if core is None else core
    coord, coord_end = memory_link_pair(name="coordinator") if with_coordinator else (None, None)
    rank = EngineRank(RankConfig(dp_rank=0, dp_size=1, engine=core.config, **cfg), core,
                      {0: client.engine_ends[0]}, coord_end, inline_step=True)
    outcome: list[BaseException | None] = []
    ended = trio.Event()

    async def run_rank() -> None:
        try:
            await rank.run()
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            outcome.append(exc)
        ended.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(client.run, follow_coordinator=False))
            nursery.start_soon(run_rank)
            yield rank, client, coord, outcome, ended
            nursery.cancel_scope.cancel()
    finally:
        for link in [*client.links.values(), *client.engine_ends.values(), client.coord, client.coord_end,
                     *([coord, coord_end] if coord is not None and coord_end is not None else [])]:
            await link.aclose()


@pytest.mark.trio
async def test_pause_wait_answers_only_once_running_requests_finished(autojump_clock):
    async with open_rank() as (rank, client, _, _, _):
        with trio.fail_after(30):
            res = await client.add(0, "r", max_tokens=20)
            await trio.sleep(0.005)
            result = await client.call(0, "pause", mode="wait")
            assert result.ok and res.done.is_set() and len(res.tokens) == 20
            queued = await client.add(0, "q", max_tokens=3)
            await trio.sleep(1.0)
            assert not queued.done.is_set()
            assert (await client.call(0, "is_paused")).value is True
            assert (await client.call(0, "resume")).ok
            await queued.done.wait()


@pytest.mark.trio
async def test_pause_keep_freezes_requests_without_stepping_and_resume_continues_them(autojump_clock):
    async with open_rank() as (rank, client, _, _, _):
        with trio.fail_after(30):
            res = await client.add(0, "r", max_tokens=30)
            while len(res.tokens) < 3:
                await client.stats_arrived.wait()
            assert (await client.call(0, "pause", mode="keep")).ok
            steps = rank.state.steps
            await trio.sleep(5.0)  # a loop that spun on frozen requests would never let virtual time pass
            assert rank.state.steps == steps and not res.done.is_set()
            assert (await client.call(0, "resume")).ok
            await res.done.wait()
        assert len(res.tokens) == 30 and rank.state.dummy_steps == 0


@pytest.mark.trio
async def test_resume_before_a_pause_completes_fails_the_pending_pause(autojump_clock):
    async with open_rank() as (rank, client, _, _, _):
        with trio.fail_after(30):
            res = await client.add(0, "r", max_tokens=50)
            await trio.sleep(0.005)
            pending = await client.call_nowait(0, "pause", mode="wait")
            assert (await client.call(0, "resume")).ok
            failed = await client.wait_utility(pending)
            assert not failed.ok and "resumed before the pause completed" in failed.error
            assert failed.error_kind == m.PAUSE_ERROR  # the API server answers that pause with 409, not 500
            await res.done.wait()


@pytest.mark.trio
async def test_moe_with_dp_1_runs_the_plain_loop_without_dummy_steps(autojump_clock):
    async with open_rank(is_moe=True) as (rank, client, _, _, _):
        assert rank.lockstep is None
        with trio.fail_after(30):
            res = await client.add(0, "r", max_tokens=5)
            await res.done.wait()
        assert rank.state.dummy_steps == 0 and rank.state.steps == 5


@pytest.mark.trio
async def test_teardown_from_the_coordinator_ends_a_dense_rank_with_rank_torn_down(autojump_clock):
    async with open_rank(with_coordinator=True) as (rank, client, coord, outcome, ended):
        await client.add(0, "r", max_tokens=10_000)
        await trio.sleep(0.1)
        with trio.fail_after(1):
            await coord.send(m.Teardown(reason="test", dead_rank=None))
            await ended.wait()
        assert isinstance(outcome[0], RankTornDown)
        assert client.dead[0] == "rank 0: torn down (teardown from the coordinator: test)"  # EngineDead names it


@pytest.mark.trio
async def test_dense_rank_keeps_serving_after_losing_the_coordinator(autojump_clock):
    async with open_rank(with_coordinator=True) as (rank, client, coord, outcome, ended):
        with trio.fail_after(30):
            assert isinstance(await coord.receive(), m.RankStats | m.Heartbeat)
            await coord.aclose()
            await trio.sleep(0.1)
            res = await client.add(0, "r", max_tokens=5)
            await res.done.wait()
        assert not ended.is_set() and rank.coordinator is None


async def long_prefill_reports() -> list[m.RankStats]:
    """The ``RankStats`` a rank sends while it computes a 290-token prompt 64 tokens a step (one request, three
    output tokens, 512 KV blocks of 16 tokens)."""
    reports: list[m.RankStats] = []

    async def listen(coord) -> None:
        while True:
            msg = await coord.receive()
            if isinstance(msg, m.RankStats):
                reports.append(msg)

    cfg = EngineConfig(executor="sim", sim_cost=RANK_SIM_COST, num_kv_blocks=512, block_size=16,
                       max_num_batched_tokens=64).validate()
    core = EngineCore(cfg, SimExecutor(cfg, 300, max_model_len=1024, avoid_token_ids={299}), None,
                      eos_token_ids={299})
    async with open_rank(with_coordinator=True, core=core) as (rank, client, coord, _, _), \
            trio.open_nursery() as nursery:
        nursery.start_soon(listen, coord)
        with trio.fail_after(30):
            res = await client.add(0, "r", max_tokens=3, prompt_len=290)
            await res.done.wait()
            await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    return reports


@pytest.mark.trio
async def test_the_coordinator_hears_each_chunk_of_a_long_prefill(autojump_clock):
    """The counts stay (0 waiting, 1 running) while a 290-token prompt is computed 64 tokens a step; the rank still
    reports each chunk, as the prompt tokens it still owes."""
    reports = [(r.num_waiting, r.num_running, r.prefill_tokens) for r in await long_prefill_reports()]
    owed = [p for _, _, p in reports]
    assert owed[owed.index(290):][:6] == [290, 226, 162, 98, 34, 0]
    assert {(w, r) for w, r, p in reports if p in (226, 162, 98)} == {(0, 1)}


@pytest.mark.trio
async def test_a_report_of_prompt_tokens_alone_repeats_the_kv_usage_last_reported(autojump_clock):
    """Each 64-token chunk fills 4 of 512 blocks (0.0078 of the KV). A report sent for the prompt tokens alone
    carries the KV usage of the report before it, so the coordinator sees no change of the counts and publishes no
    snapshot for it; the usage moves in reports only by the 0.01 rule, measured from the last usage reported."""
    reports = await long_prefill_reports()
    pairs = list(pairwise(reports))
    chunk_only = [(a, b) for a, b in pairs
                  if (a.num_waiting, a.num_running) == (b.num_waiting, b.num_running)
                  and a.prefill_tokens != b.prefill_tokens]
    assert chunk_only  # the chunks of the prompt
    for a, b in chunk_only:
        assert b.kv_cache_usage == a.kv_cache_usage or abs(b.kv_cache_usage - a.kv_cache_usage) >= 0.01, (a, b)
    assert any(b.kv_cache_usage == a.kv_cache_usage for a, b in chunk_only)  # at least one chunk moved it < 0.01


@pytest.mark.trio
async def test_the_coordinator_hears_the_cache_fill_grow_and_stay_after_the_request(autojump_clock):
    """The 290-token prompt and its answer fill 18 of 512 blocks (0.035), reported at each 1 % (a report for the
    fill alone repeats the KV usage last reported, as one for the prompt tokens does), and still fill them when the
    request is over: its blocks stay cached, though none is in use."""
    reports = await long_prefill_reports()
    fills = [r.cache_fill for r in reports]
    assert fills == sorted(fills) and fills[-1] == pytest.approx(18 / 512, abs=1 / 512)
    assert reports[-1].kv_cache_usage == 0.0 and reports[-1].num_running == 0
    for a, b in pairwise(reports):
        if (a.num_waiting, a.num_running, a.prefill_tokens) == (b.num_waiting, b.num_running, b.prefill_tokens):
            assert abs(b.cache_fill - a.cache_fill) >= 0.01 and b.kv_cache_usage == a.kv_cache_usage, (a, b)


@pytest.mark.trio
async def test_shutdown_aborts_frozen_requests_at_the_drain_deadline(autojump_clock):
    async with open_rank(shutdown_timeout_s=5.0) as (rank, client, _, outcome, ended):
        res = await client.add(0, "r", max_tokens=10_000)
        await trio.sleep(0.01)
        assert (await client.call(0, "pause", mode="keep")).ok
        start = trio.current_time()
        rank.request_shutdown()
        with trio.fail_after(30):
            await ended.wait()
        assert trio.current_time() - start == pytest.approx(5.0, abs=0.01)
        assert res.finish_reason == "abort" and outcome == [None]


@pytest.mark.trio
async def test_a_stopping_rank_tells_its_clients_at_once_so_they_route_around_it(autojump_clock):
    """``RankDraining`` goes out when the drain starts, not when it ends: the clients send new requests to the other
    ranks meanwhile. A second stop request sends nothing more."""
    async with open_rank(shutdown_timeout_s=5.0) as (rank, client, _, _, ended):
        long = await client.add(0, "long", max_tokens=10_000)
        await trio.sleep(0.01)
        start = trio.current_time()
        rank.request_shutdown()
        rank.request_shutdown()
        with trio.fail_after(30):
            await ended.wait()
        assert list(client.draining) == [0] and client.draining[0] - start < 0.01
        assert long.finished_at is not None and client.draining[0] < long.finished_at  # told while it drained


@pytest.mark.trio
async def test_a_request_abandoned_at_the_drain_deadline_says_so_and_names_the_rank(autojump_clock):
    """The rank alone stops (a signal, its launcher's death): its clients are not shutting down, so a bare
    ``abort`` would read as a normal end; the output says the rank abandoned it. One that finished before the
    deadline is a normal end, unmarked."""
    async with open_rank(shutdown_timeout_s=0.5) as (rank, client, _, outcome, ended):
        short = await client.add(0, "short", max_tokens=3)
        long = await client.add(0, "long", max_tokens=10_000)
        await trio.sleep(0.01)
        rank.request_shutdown()
        with trio.fail_after(30):
            await ended.wait()
        assert (short.finish_reason, short.error_type) == ("length", None)
        assert (long.finish_reason, long.error_type) == ("abort", "abandoned") and outcome == [None]
        assert "engine rank 0" in (long.error or "") and "drain deadline" in (long.error or "")
        assert rank.state.drain_expired  # what marked it


@pytest.mark.trio
async def test_utility_calls_fail_while_shutting_down(autojump_clock):
    async with open_rank(shutdown_timeout_s=5.0) as (rank, client, _, _, _):
        await client.add(0, "r", max_tokens=10_000)
        await trio.sleep(0.01)
        rank.request_shutdown()
        result = await client.call(0, "ping")
        assert not result.ok and result.error == "server shutting down"


@pytest.mark.anyio
async def test_steps_run_on_the_execution_thread(anyio_backend):
    client = FakeClient(1)
    core = sim_core()
    rank = EngineRank(RankConfig(dp_rank=0, dp_size=1, engine=core.config), core, {0: client.engine_ends[0]}, None)
    outputs: list[m.RequestOutput] = []
    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(rank.run)
                await client.links[0].send(m.AddRequest(
                    request_id="r", client_index=0, wave=0, prompt_token_ids=[1, 2, 3],
                    sampling_params=SamplingParams(max_tokens=4, ignore_eos=True),
                    arrival_time=0.0))
                while not (outputs and outputs[-1].finished):
                    msg = await client.links[0].receive()
                    if isinstance(msg, m.EngineOutputs):
                        outputs += msg.outputs
                rank.request_shutdown()
    finally:
        for link in [*client.links.values(), *client.engine_ends.values(), client.coord, client.coord_end]:
            await link.aclose()
    assert sum(len(o.new_token_ids) for o in outputs) == 4 and rank.state.steps == 4


@pytest.mark.trio
async def test_requests_of_a_client_whose_link_closed_are_aborted_not_run_to_the_end(autojump_clock):
    async with open_rank() as (rank, client, _, _, _):
        with trio.fail_after(30):
            await client.add(0, "orphan", max_tokens=10_000)
            await trio.sleep(0.05)
            assert rank.core.has_unfinished()
            await client.links[0].aclose()  # the API server went away
            await trio.sleep(0.5)
            assert not rank.core.has_unfinished()
            assert "orphan" not in rank.state.owners


@pytest.mark.trio
async def test_an_unknown_inbox_item_is_a_protocol_error_and_a_stray_link_message_only_a_warning(
        autojump_clock, caplog):
    from asyncdp.engine.rank_links import ClientMessage
    from asyncdp.errors import ProtocolError

    client = FakeClient(1)
    rank = EngineRank(RankConfig(dp_rank=0, dp_size=1, engine=sim_core().config), sim_core(),
                      {0: client.engine_ends[0]}, None, inline_step=True)
    try:
        with pytest.raises(ProtocolError, match="unknown inbox item"):
            await rank._handle(("client", m.AbortRequests(request_ids=["r"]), 0))  # the old positional shape
        await rank._handle(ClientMessage(0, m.Goodbye(dp_rank=3)))  # a link message a client may not send
        assert any("dropping unexpected Goodbye" in r.getMessage() for r in caplog.records)
    finally:
        rank.close()
        for link in [*client.links.values(), *client.engine_ends.values(), client.coord, client.coord_end]:
            await link.aclose()


@pytest.mark.trio
async def test_a_dense_rank_stopped_in_order_says_goodbye_to_the_coordinator(autojump_clock):
    """Once drained, the rank's last word to the coordinator is ``Goodbye``: its departure is no loss there."""
    async with open_rank(with_coordinator=True, shutdown_timeout_s=5.0) as (rank, client, coord, outcome, ended):
        done = await client.add(0, "r", max_tokens=3)
        await done.done.wait()
        rank.request_shutdown()
        with trio.fail_after(30):
            await ended.wait()
        said = []
        with trio.move_on_after(1):
            while True:
                said.append(await coord.receive())
    assert outcome == [None]
    assert [type(msg).__name__ for msg in said if not isinstance(msg, m.RankStats | m.Heartbeat)] == ["Goodbye"]
