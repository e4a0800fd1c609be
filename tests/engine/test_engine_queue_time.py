"""EngineCore reports each request's queue time (``vllm:request_queue_time_seconds``) on its first output: the time
between this rank queuing it and first scheduling it, on the rank's own clock."""

from __future__ import annotations

from engine_testing import EOS_ID, VOCAB_SIZE, encode, make_byte_tokenizer

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.core import EngineCore
from asyncdp.engine.sim_executor import SimExecutor
from asyncdp.messages import RequestOutput
from asyncdp.sampling_params import SamplingParams


class StepClock:
    """A clock that reads whatever the test set it to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def core_with(clock: StepClock, **config: object) -> EngineCore:
    cfg = EngineConfig(executor="sim", **config).validate()  # type: ignore[arg-type]
    executor = SimExecutor(cfg, VOCAB_SIZE, max_model_len=512, avoid_token_ids={EOS_ID})
    return EngineCore(cfg, executor, make_byte_tokenizer(), eos_token_ids={EOS_ID}, clock=clock)


def outputs_until_idle(core: EngineCore, clock: StepClock, tick_s: float) -> dict[str, list[RequestOutput]]:
    got: dict[str, list[RequestOutput]] = {}
    for _ in range(100):
        if not core.has_unfinished():
            return got
        for out in core.step().outputs:
            got.setdefault(out.request_id, []).append(out)
        clock.now += tick_s
    raise AssertionError("the engine did not finish")


def test_queue_time_is_the_wait_for_a_free_slot_and_rides_on_the_first_output_only() -> None:
    clock = StepClock()
    core = core_with(clock, max_num_seqs=1)
    # The API server's arrival time is another process's clock: the queue time must not depend on it.
    core.add_request("a", encode("first"), SamplingParams(max_tokens=3), arrival_time=5.0)
    core.add_request("b", encode("second"), SamplingParams(max_tokens=2), arrival_time=5.0)
    got = outputs_until_idle(core, clock, tick_s=1.0)
    assert got["a"][0].queue_time_s == 0.0  # scheduled at the first step
    assert got["b"][0].queue_time_s == 3.0  # waited for "a"'s 3 steps
    assert all(o.queue_time_s is None for o in got["a"][1:] + got["b"][1:])


def test_abort_carries_no_queue_time_for_a_request_never_scheduled_nor_one_already_reported() -> None:
    clock = StepClock()
    core = core_with(clock, max_num_seqs=1)
    core.add_request("a", encode("first"), SamplingParams(max_tokens=50))
    core.add_request("b", encode("second"), SamplingParams(max_tokens=50))
    clock.now += 2.0
    core.step()
    core.pause("abort")
    outs = {o.request_id: o for o in core.step().outputs}
    assert outs["b"].finish_reason == "abort" and outs["b"].queue_time_s is None  # never scheduled
    assert outs["a"].queue_time_s is None  # its queue time went out with its first token
