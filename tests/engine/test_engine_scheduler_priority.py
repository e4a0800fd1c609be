"""``--scheduling-policy priority`` (vLLM's): the waiting queue by (priority, arrival), the preemption victim the
lowest-priority, latest-arriving running request, preempted requests keeping their place; fcfs unchanged."""

from __future__ import annotations

import pytest
from engine_testing import scripted_core

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.block_manager import BlockManager
from asyncdp.engine.executor import StepResult
from asyncdp.engine.request import Request, RequestStatus
from asyncdp.engine.scheduler import Scheduler
from asyncdp.errors import ConfigError, InvalidRequestError
from asyncdp.sampling_params import SamplingParams


def make(policy: str, num_blocks: int = 64, max_num_seqs: int = 8) -> Scheduler:
    bm = BlockManager(num_blocks, 4, reserve_scratch_block=True)
    return Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=64, policy=policy)


def add(s: Scheduler, rid: str, n: int, priority: int = 0, arrival: float = 0.0) -> Request:
    base = 1000 * ord(rid[0])  # distinct prompts: no prefix hits
    r = Request(rid, [base + i for i in range(n)], SamplingParams(priority=priority), arrival_time=arrival,
                max_tokens=100)
    s.add(r)
    return r


def step(s: Scheduler) -> list[str]:
    batch = s.schedule()
    s.update(batch, StepResult([7 if c.sample else None for c in batch.chunks]))
    return [c.request_id for c in batch.chunks]


def queue(s: Scheduler) -> list[str]:
    return [r.request_id for r in s.waiting]


ARRIVALS = [("x", 1, 0.0), ("y", 0, 2.0), ("z", 0, 1.0), ("w", 1, 0.0), ("v", -3, 5.0)]


def test_priority_admits_by_priority_then_arrival_then_queue_order() -> None:
    s = make("priority")
    for rid, priority, arrival in ARRIVALS:
        add(s, rid, 3, priority, arrival)
    assert queue(s) == ["v", "z", "y", "x", "w"] and s.num_waiting == 5
    assert step(s) == ["v", "z", "y", "x", "w"]


def test_fcfs_admits_in_queue_order_whatever_the_arrival() -> None:
    s = make("fcfs")
    for rid, _, arrival in ARRIVALS:
        add(s, rid, 3, 0, arrival)
    assert step(s) == ["x", "y", "z", "w", "v"]


def test_priority_with_max_num_seqs_1_serves_a_later_higher_priority_request_next() -> None:
    s = make("priority", max_num_seqs=1)
    add(s, "a", 3, priority=0, arrival=0.0)
    assert step(s) == ["a"]
    add(s, "l", 3, priority=5, arrival=1.0)
    add(s, "m", 3, priority=5, arrival=2.0)
    add(s, "h", 3, priority=-1, arrival=3.0)
    assert step(s) == ["a"] and queue(s) == ["h", "l", "m"]


def full(policy: str, first: str, second: str) -> Scheduler:
    """``first`` admitted in one step, ``second`` in the next (each request ``rid:priority:size``, arriving in that
    order), filling the 6 usable blocks of 4 tokens."""
    s = make(policy, num_blocks=1 + 6)
    arrival = 0.0
    for group in (first, second):
        for spec in group.split():
            rid, priority, size = spec.split(":")
            add(s, rid, int(size), int(priority), arrival)
            arrival += 1
        step(s)
    assert s.num_running == 3 and s.block_manager.num_free_blocks == 0
    return s


# a needs a third block in the third step; v (priority 2, admitted before c) does not.
VICTIM_AFTER = ("a:0:7 v:2:6", "c:1:8")


def test_block_shortage_preempts_the_lowest_priority_running_request_not_the_last_admitted() -> None:
    s = full("priority", *VICTIM_AFTER)
    v = s.requests["v"]
    assert [r.request_id for r in s.running] == ["a", "v", "c"]
    assert step(s) == ["a", "c"]  # v (priority 2) goes; c (admitted last) stays
    assert v.status == RequestStatus.PREEMPTED and queue(s) == ["v"] and s.num_running == 2
    assert v.num_computed_tokens == 0 and v.block_ids == [] and s.num_preemptions == 1


def test_fcfs_still_preempts_the_last_admitted() -> None:
    s = full("fcfs", *VICTIM_AFTER)
    assert step(s) == ["a", "v"] and queue(s) == ["c"]


def test_equal_priorities_preempt_the_latest_arrival() -> None:
    s = full("priority", "a:1:7 v:1:6", "c:1:8")
    assert step(s) == ["a", "v"] and queue(s) == ["c"]


def test_a_victim_scheduled_earlier_in_the_step_gives_its_chunk_and_budget_back() -> None:
    # a (priority 2) and c decode within their second block; b needs a third: the victim is a, already scheduled.
    s = full("priority", "a:2:6", "b:0:8 c:1:6")
    a = s.requests["a"]
    assert [r.request_id for r in s.running] == ["a", "b", "c"]
    batch = s.schedule()
    assert [c.request_id for c in batch.chunks] == ["b", "c"]
    assert (batch.num_prefill_tokens, batch.num_decode_seqs, batch.num_kv_tokens) == (0, 2, 9 + 7)
    assert a.status == RequestStatus.PREEMPTED and a.num_computed_tokens == 0 and queue(s) == ["a"]
    assert [(idx, r.request_id) for idx, r, _ in s.update(batch, StepResult([7, 7]))] == [(0, "b"), (1, "c")]
    # Its second block, filled by the withdrawn chunk (published when scheduled), was never written: it left the
    # prefix cache, so a owes all but its first block again.
    assert a.num_tokens == 8 and s.prefill_tokens == 4
    longer = Request("z", [*a.all_token_ids, 99], SamplingParams(), arrival_time=9.0, max_tokens=4)
    assert len(s.block_manager.find_cached_prefix(longer)) == 1


def test_fcfs_in_the_same_shortage_preempts_the_last_admitted() -> None:
    s = full("fcfs", "a:2:6", "b:0:8 c:1:6")
    assert step(s) == ["a", "b"] and queue(s) == ["c"]


def test_a_preempted_request_keeps_its_priority_and_arrival_in_the_queue() -> None:
    s = full("priority", *VICTIM_AFTER)
    step(s)  # v preempted (priority 2, arrival 1)
    add(s, "d", 3, priority=1, arrival=9.0)  # better priority, later arrival: ahead of v
    add(s, "e", 3, priority=2, arrival=9.0)  # v's priority, later arrival: behind v
    add(s, "f", 3, priority=3, arrival=0.5)
    assert queue(s) == ["d", "v", "e", "f"]
    assert [r.request_id for r in s.preempted_waiting()] == ["v"]


def test_paused_new_admits_only_preempted_requests_under_priority() -> None:
    s = full("priority", *VICTIM_AFTER)
    step(s)  # v preempted
    add(s, "d", 3, priority=-5, arrival=9.0)  # the best waiting request, but new
    s.pause("wait")
    assert s.has_steppable_work() and s.num_unfinished_for_sync() == 3  # a, c running and v preempted
    s.abort(["a", "c"])
    assert not s.running and s.has_steppable_work()
    assert step(s) == ["v"] and queue(s) == ["d"]
    s.abort(["v"])
    assert not s.has_steppable_work() and s.num_unfinished_for_sync() == 0
    s.resume()
    assert step(s) == ["d"]


def test_abort_of_a_waiting_request_leaves_the_others_in_order() -> None:
    s = make("priority")
    for rid, priority, arrival in ARRIVALS:
        add(s, rid, 3, priority, arrival)
    assert [r.request_id for r in s.abort(["y", "v", "unknown"])] == ["y", "v"]
    assert queue(s) == ["z", "x", "w"] and s.num_waiting == 3
    assert step(s) == ["z", "x", "w"]


def test_engine_core_serves_a_later_higher_priority_request_first_when_saturated() -> None:
    core, _ = scripted_core({}, scheduling_policy="priority", max_num_seqs=1)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    core.add_request("busy", [1, 2, 3], params, arrival_time=0.0)
    core.step()
    for rid, priority, arrival in (("low1", 5, 1.0), ("low2", 5, 2.0), ("high", -1, 3.0)):
        core.add_request(rid, [4, 5, 6], SamplingParams(max_tokens=3, ignore_eos=True, priority=priority),
                         arrival_time=arrival)
    firsts: list[str] = []
    while core.has_unfinished():
        for out in core.step().outputs:
            if out.new_token_ids and out.request_id not in firsts:
                firsts.append(out.request_id)
    assert firsts == ["busy", "high", "low1", "low2"]


def test_engine_core_refuses_a_priority_under_fcfs_as_vllm() -> None:
    core, _ = scripted_core({})
    with pytest.raises(InvalidRequestError, match="Got priority 1 but Priority scheduling is not enabled.") as err:
        core.add_request("r", [1, 2], SamplingParams(priority=1))
    assert err.value.field == "priority" and not core.has_unfinished()
    core.add_request("ok", [1, 2], SamplingParams(priority=0))


def test_scheduling_policy_is_a_checked_choice() -> None:
    assert EngineConfig().scheduling_policy == "fcfs"
    with pytest.raises(ConfigError, match=r"--scheduling-policy must be one of fcfs, priority \(got 'lifo'\)"):
        EngineConfig(scheduling_policy="lifo").validate()


def test_priority_must_be_a_64_bit_integer() -> None:
    with pytest.raises(InvalidRequestError, match="priority"):
        SamplingParams(priority=2**63).validate()
    with pytest.raises(InvalidRequestError, match="priority"):
        SamplingParams(priority=1.5).validate()  # type: ignore[arg-type]
    assert SamplingParams(priority=-(2**63)).validate().priority == -(2**63)
