"""A forward that fails (the executor raises, or Ctrl-C lands in it) computes no KV: the core must not publish
what it never wrote, nor count its requests' tokens as computed (scripted executor, no torch)."""

from __future__ import annotations

import pytest
from engine_testing import encode, scripted_core

from asyncdp.engine.core import EngineCore
from asyncdp.engine.executor import ModelBatch, StepResult
from asyncdp.engine.scheduler import Scheduler
from asyncdp.sampling_params import SamplingParams

PROMPT = encode("twelve bytes")  # 3 full blocks of 4: a later twin could hit 2 of them
PARAMS = SamplingParams(temperature=0.0, max_tokens=3)


class ForwardFailed(Exception):
    pass


def fail_next_forward(core: EngineCore) -> None:
    """The executor's next ``execute`` raises before computing anything; later ones run normally."""
    executor = core.executor
    real = executor.execute

    def execute(batch: ModelBatch) -> StepResult:
        executor.execute = real  # type: ignore[method-assign]
        raise ForwardFailed

    executor.execute = execute  # type: ignore[method-assign]


def run(core: EngineCore) -> dict[str, tuple[list[int], int, str | None]]:
    """Step until nothing is left; per request: tokens, first output's num_cached_tokens, finish_reason."""
    out: dict[str, tuple[list[int], int, str | None]] = {}
    for _ in range(100):
        if not core.has_unfinished():
            return out
        for o in core.step().outputs:
            tokens, cached, _ = out.get(o.request_id, ([], o.num_cached_tokens, None))
            out[o.request_id] = (tokens + o.new_token_ids, cached, o.finish_reason)
    raise AssertionError(f"requests left unfinished: {core.scheduler.requests}")


def test_blocks_of_a_failed_forward_are_no_prefix_cache_hit_for_a_later_request() -> None:
    core, _ = scripted_core({"b": [66, 67, 68]}, block_size=4)
    core.add_request("a", PROMPT, PARAMS)
    fail_next_forward(core)
    with pytest.raises(ForwardFailed):
        core.step()
    core.abort_requests(["a"])  # what the offline LLM does when generate() is interrupted
    core.step()
    core.add_request("b", PROMPT, PARAMS)
    # Before the fix "b" took "a"'s two full blocks as a hit (8 cached tokens): KV that no forward ever wrote.
    assert run(core)["b"] == ([66, 67, 68], 0, "length")


def test_requests_of_a_failed_forward_are_recomputed_from_their_first_token_when_stepping_goes_on() -> None:
    core, executor = scripted_core({"a": [65, 66, 67], "twin": [70, 71, 72]}, block_size=4)
    core.add_request("a", PROMPT, PARAMS)
    core.add_request("twin", PROMPT, PARAMS)  # hits "a"'s blocks, published by the very step that fails
    fail_next_forward(core)
    with pytest.raises(ForwardFailed):
        core.step()
    assert run(core) == {"a": ([65, 66, 67], 0, "length"), "twin": ([70, 71, 72], 8, "length")}
    # The first forward that ran computed "a" from position 0; the twin's hit is "a"'s recomputed blocks.
    assert [(c.request_id, c.start_pos, len(c.token_ids)) for c in executor.batches[0].chunks] == [
        ("a", 0, len(PROMPT)), ("twin", 8, len(PROMPT) - 8)]


def test_unschedule_keeps_the_waiting_order_and_the_blocks_computed_before_the_failed_step() -> None:
    core, _ = scripted_core({}, block_size=4, max_num_batched_tokens=8)
    core.add_request("a", PROMPT, PARAMS)
    core.add_request("b", encode("another prompt"), PARAMS)
    core.step()  # "a"'s first 8 tokens (2 full blocks), nothing of "b"
    fail_next_forward(core)
    with pytest.raises(ForwardFailed):
        core.step()  # "a"'s last 4 tokens (its third block) and "b"'s first 4
    scheduler: Scheduler = core.scheduler
    assert [r.request_id for r in scheduler.waiting] == ["a", "b"] and not scheduler.running
    cached = [core.block_manager.cached_block_id(h) is not None for h in scheduler.requests["a"].block_hashes]
    assert cached == [True, True, False]  # computed by the first step: still a valid hit


def test_aborts_applied_by_a_step_whose_forward_fails_are_reported_by_the_next_step() -> None:
    core, _ = scripted_core({}, block_size=4)
    core.add_request("a", PROMPT, PARAMS)
    core.add_request("b", encode("another prompt"), PARAMS)
    core.step()
    core.abort_requests(["a"])  # applied at the start of the step whose forward fails
    fail_next_forward(core)
    with pytest.raises(ForwardFailed):
        core.step()
    step = core.step()
    assert [(o.request_id, o.finish_reason) for o in step.outputs if o.finished] == [("a", "abort")]
    assert step.finished_request_ids == ["a"]


class MasksFail:
    """Grammar matchers whose allowed-token masks fail (the core computes them just before the forward)."""

    matchers = {"a": None}

    def token_masks(self, chunks: object) -> None:
        raise ForwardFailed

    def discard(self, request_id: str) -> None:
        pass


def test_a_step_that_fails_before_its_forward_publishes_nothing_either() -> None:
    core, _ = scripted_core({"b": [66, 67, 68]}, block_size=4)
    core.add_request("a", PROMPT, PARAMS)
    core._grammars = MasksFail()  # type: ignore[assignment]
    with pytest.raises(ForwardFailed):
        core.step()
    core._grammars = None
    core.abort_requests(["a"])
    core.add_request("b", PROMPT, PARAMS)
    assert run(core)["b"] == ([66, 67, 68], 0, "length")
