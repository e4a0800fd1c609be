"""A structured-output request queued before its grammar compiled (``add_request(compile_grammar=False)``) waits
unscheduled: counted as waiting, never stepped, no MoE wave work, until ``grammar_compiled`` queues it.

This is the core's half of a rank compiling grammars off its steps (vLLM's WAITING_FOR_FSM): before, a rank's
intake compiled each grammar under the step limiter and only then added the request, so nothing stepped meanwhile.
"""

from __future__ import annotations

import pytest
from engine_testing import encode, run_to_completion, scripted_core

from asyncdp.engine.core import EngineCore
from asyncdp.engine.lockstep_loop import forwards_to_drain
from asyncdp.sampling_params import SamplingParams, StructuredOutputs

pytest.importorskip("llguidance", reason="structured outputs need llguidance")

YES_OR_NO = StructuredOutputs(choice=("yes", "no"))


def masking_core() -> EngineCore:
    core, ex = scripted_core({"json": encode("yes"), "plain": encode("abcd")})
    ex.applies_token_masks = True  # type: ignore[attr-defined]  # (the script already follows the grammar)
    return core


def add_waiting(core: EngineCore, request_id: str = "json") -> None:
    core.add_request(request_id, encode("hi"), SamplingParams(temperature=0.0, max_tokens=8, structured=YES_OR_NO),
                     compile_grammar=False)


def test_a_request_waiting_for_its_grammar_counts_as_waiting_but_is_neither_stepped_nor_wave_work() -> None:
    core = masking_core()
    add_waiting(core)
    assert core.stats().num_waiting == 1 and core.stats().prefill_tokens == 2  # the load reports see it
    assert core.has_unfinished() and not core.has_steppable_work()
    assert core.num_unfinished_for_sync() == 0 and forwards_to_drain(core.scheduler) == 0
    assert not core.step().executed
    assert core.grammar_compiled("json") is False  # not compiled yet: nothing to copy
    core.grammar_matchers().prepare(YES_OR_NO)  # (what a rank does in a worker thread)
    assert core.grammar_compiled("json") is True
    assert core.has_steppable_work() and core.num_unfinished_for_sync() == 1
    res = run_to_completion(core)
    assert (res["json"]["tokens"], res["json"]["finish_reason"]) == (encode("yes"), "stop")


def test_a_plain_request_steps_while_another_waits_for_its_grammar() -> None:
    core = masking_core()
    add_waiting(core)
    core.add_request("plain", encode("hi"), SamplingParams(temperature=0.0, max_tokens=4))
    outputs = []
    while core.has_steppable_work():
        outputs += core.step().outputs
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in outputs] == [
        ("plain", [t], None if i < 3 else "length") for i, t in enumerate(encode("abcd"))]
    assert core.has_unfinished() and core.stats().num_waiting == 1


def test_a_request_aborted_while_waiting_for_its_grammar_is_freed_and_its_grammar_then_ignored() -> None:
    core = masking_core()
    add_waiting(core)
    core.abort_requests(["json"])
    out = core.step()
    assert [(o.request_id, o.finish_reason, o.new_token_ids) for o in out.outputs] == [("json", "abort", [])]
    assert not core.has_unfinished() and core.stats().num_waiting == 0 and core.stats().prefill_tokens == 0
    core.grammar_matchers().prepare(YES_OR_NO)
    assert core.grammar_compiled("json") is None and not core.has_unfinished()


def test_a_grammar_compiled_already_does_not_wait() -> None:
    core = masking_core()
    core.grammar_matchers().prepare(YES_OR_NO)
    add_waiting(core)
    assert core.has_steppable_work() and core.scheduler.grammar_waiting == {}
