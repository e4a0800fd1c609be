"""The drain horizon a MoE rank contributes to its group's sync all-reduce (asyncdp.engine.lockstep_loop)."""

from __future__ import annotations

from asyncdp.engine.block_manager import BlockManager
from asyncdp.engine.executor import StepResult
from asyncdp.engine.lockstep_loop import forwards_to_drain
from asyncdp.engine.request import Request, RequestStatus
from asyncdp.engine.scheduler import Scheduler
from asyncdp.sampling_params import SamplingParams


def make(max_num_batched_tokens=16) -> Scheduler:
    bm = BlockManager(64, 4, reserve_scratch_block=True)
    return Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=max_num_batched_tokens)


def add(s: Scheduler, rid: str, prompt: int, max_tokens: int) -> Request:
    r = Request(rid, [100 * ord(rid[0]) + i for i in range(prompt)], SamplingParams(), arrival_time=0.0,
                max_tokens=max_tokens)
    s.add(r)
    return r


def step(s: Scheduler) -> None:
    """One forward; requests that reached max_tokens finish, as the engine core does."""
    batch = s.schedule()
    for _, req, _ in s.update(batch, StepResult([7 if c.sample else None for c in batch.chunks])):
        if req.num_output_tokens >= req.max_tokens:
            s.finish(req, RequestStatus.FINISHED_LENGTH)


def test_idle_scheduler_has_horizon_zero():
    assert forwards_to_drain(make()) == 0


def test_horizon_is_the_longest_request_counting_extra_prefill_chunks():
    s = make(max_num_batched_tokens=16)
    add(s, "a", 4, 10)
    add(s, "b", 40, 3)  # 3 chunks of 16: two extra forwards before its first token
    assert forwards_to_drain(s) == 10
    add(s, "c", 40, 9)
    assert forwards_to_drain(s) == 2 + 9


def test_horizon_counts_down_with_each_forward_and_matches_the_real_drain():
    s = make(max_num_batched_tokens=64)
    add(s, "a", 4, 6)
    add(s, "b", 4, 3)
    steps = 0
    while s.has_unfinished():
        assert forwards_to_drain(s) == 6 - steps
        step(s)
        steps += 1
    assert steps == 6 and forwards_to_drain(s) == 0


def test_paused_all_drains_nothing_and_paused_new_only_counts_running():
    s = make()
    add(s, "a", 4, 5)
    step(s)
    add(s, "b", 4, 50)
    s.pause("wait")
    assert forwards_to_drain(s) == 4
    s.pause("keep")
    assert forwards_to_drain(s) == 0
