"""``pause("wait")`` (spec dp-deployment §8.6) with a request that KV pressure preempted before the pause: it was
in flight (it had streamed tokens), so it keeps stepping, and the pause completes only once it finished; a request
never scheduled stays queued like a new one. Scripted and sim executors, no torch."""

from __future__ import annotations

import functools

import pytest
import trio
from engine_testing import encode, scripted_core

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.core import EngineCore
from asyncdp.engine.lockstep_loop import forwards_to_drain
from asyncdp.engine.rank import EngineRank, RankConfig
from asyncdp.engine.request import Request, RequestStatus
from asyncdp.engine.sim_executor import SimExecutor
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing import FakeRankClient, open_rank_cluster
from asyncdp.testing.rank_cluster import EOS, RANK_SIM_COST, VOCAB

PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def squeezed_core() -> EngineCore:
    """6 usable blocks of 4 tokens; each request grows from 9 to 21 tokens (6 blocks), so they preempt."""
    core, _ = scripted_core({}, num_kv_blocks=7, block_size=4, max_model_len=24)
    for i in range(3):
        core.add_request(f"r{i}", encode(f"prompt-{i}!"), PARAMS)
    for _ in range(50):
        if core.scheduler.num_preemptions:
            return core
        core.step()
    raise AssertionError("no preemption happened")


def step_while_steppable(core: EngineCore) -> dict[str, str]:
    """What a dense rank does after ``pause``: step until nothing is steppable; the finish reasons seen."""
    finished: dict[str, str] = {}
    for _ in range(200):
        if not core.has_steppable_work():
            return finished
        for out in core.step().outputs:
            if out.finished:
                finished[out.request_id] = out.finish_reason or ""
    raise AssertionError("the paused core never became idle")


def test_a_preempted_request_finishes_before_a_pause_wait_completes() -> None:
    core = squeezed_core()
    preempted = [r for r in core.scheduler.waiting if r.status == RequestStatus.PREEMPTED]
    assert preempted and preempted[0].output_token_ids  # it had streamed tokens: it is in flight
    never_scheduled = [r.request_id for r in core.scheduler.waiting if r.status == RequestStatus.WAITING]
    core.pause("wait")
    # Counted as work that keeps a MoE wave running, as a running request is.
    assert core.num_unfinished_for_sync() == len(core.scheduler.running) + len(preempted)
    assert forwards_to_drain(core.scheduler) >= PARAMS.max_tokens - len(preempted[0].output_token_ids)
    finished = step_while_steppable(core)
    # Before the fix the core went idle with the preempted request still waiting: the pause answered while it,
    # half-streamed, was stranded until /resume.
    assert {r.request_id for r in preempted} <= finished.keys()
    assert set(finished.values()) == {"length"}
    assert [r.request_id for r in core.scheduler.requests.values()] == never_scheduled  # queued, as a new one
    assert core.num_unfinished_for_sync() == 0
    core.resume()
    assert step_while_steppable(core) == dict.fromkeys(never_scheduled, "length")
    assert not core.has_unfinished()


def test_a_new_request_queued_behind_a_preempted_one_is_not_admitted_while_paused() -> None:
    core = squeezed_core()
    core.pause("wait")
    core.add_request("late", encode("late one"), PARAMS)
    step_while_steppable(core)
    late = core.scheduler.requests["late"]
    assert late.status == RequestStatus.WAITING and late.num_cached_tokens < 0  # never scheduled
    assert list(core.scheduler.requests) == ["r2", "late"]  # r2 was never scheduled either


def test_pause_keep_freezes_a_preempted_request_too() -> None:
    core = squeezed_core()
    core.pause("keep")
    assert not core.has_steppable_work() and core.num_unfinished_for_sync() == 0
    assert forwards_to_drain(core.scheduler) == 0


@pytest.mark.trio
async def test_a_dense_rank_answers_pause_wait_once_the_preempted_request_finished(autojump_clock) -> None:
    """The same through a rank's utility call (what ``POST /pause?mode=wait`` sends), in virtual time."""
    cfg = EngineConfig(executor="sim", sim_cost=RANK_SIM_COST, num_kv_blocks=7, block_size=16,
                       enable_prefix_caching=False).validate()
    core = EngineCore(cfg, SimExecutor(cfg, VOCAB, max_model_len=96, avoid_token_ids={EOS}), None,
                      eos_token_ids={EOS})
    preempted_once = trio.Event()
    preempt = core.scheduler._preempt

    def note_preemption(req: Request) -> None:  # steps run inline, on the event loop's thread
        preempt(req)
        preempted_once.set()

    core.scheduler._preempt = note_preemption  # type: ignore[method-assign]
    client = FakeRankClient(1)
    rank = EngineRank(RankConfig(dp_rank=0, dp_size=1, engine=cfg), core, {0: client.engine_ends[0]}, None,
                      inline_step=True)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(client.run, follow_coordinator=False))
            nursery.start_soon(rank.run)
            with trio.fail_after(60):
                results = [await client.add(0, f"r{i}", max_tokens=60, prompt_len=20) for i in range(3)]
                await preempted_once.wait()
                preempted = [r.request_id for r in core.scheduler.waiting if r.status == RequestStatus.PREEMPTED]
                assert preempted
                assert (await client.call(0, "pause", mode="wait")).ok
                # Before the fix the pause answered with these still waiting, half-streamed, until /resume.
                assert [(len(client.results[rid].tokens), client.results[rid].finish_reason) for rid in preempted] \
                    == [(60, "length")] * len(preempted)
                assert (await client.call(0, "resume")).ok
                for res in results:
                    await res.done.wait()
            nursery.cancel_scope.cancel()
    finally:
        for link in [*client.links.values(), *client.engine_ends.values(), client.coord, client.coord_end]:
            await link.aclose()


@pytest.mark.trio
async def test_moe_ranks_answer_pause_wait_once_the_preempted_requests_finished(autojump_clock) -> None:
    """Two MoE ranks in lockstep: the preempted requests count as work for the sync (spec §8.6)."""
    async with open_rank_cluster(2, sync_interval=4) as c:
        scheduler = c.ranks[0].core.scheduler
        preempted_once = trio.Event()
        preempt = scheduler._preempt

        def note_preemption(req: Request) -> None:
            preempt(req)
            preempted_once.set()

        scheduler._preempt = note_preemption  # type: ignore[method-assign]
        with trio.fail_after(120):
            # 511 usable blocks of 16 tokens hold 8 176 tokens: nine requests growing to 1 008 tokens preempt.
            results = [await c.client.add(0, f"r{i}", max_tokens=1000) for i in range(9)]
            await preempted_once.wait()
            assert any(r.status == RequestStatus.PREEMPTED for r in scheduler.waiting)
            ids = [await c.client.call_nowait(r, "pause", mode="wait") for r in range(2)]
            for call_id in ids:
                assert (await c.client.wait_utility(call_id)).ok
            assert [(len(r.tokens), r.finish_reason) for r in results] == [(1000, "length")] * 9
            resumes = [await c.client.call_nowait(r, "resume") for r in range(2)]
            for call_id in resumes:
                assert (await c.client.wait_utility(call_id)).ok
