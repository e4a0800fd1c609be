"""``num_cached_tokens`` (``RequestOutput``, engine and offline) is the prefix-cache hit of a request's first
scheduling, as vLLM's scheduler records it (``if request.num_cached_tokens < 0``): a recompute after a preemption or
a failed forward changes nothing, and with ``n > 1`` the offline result reports the hit of the prompt when the
request was first scheduled (its first sample's), not a sibling's hit on the blocks its first sample computed."""

from __future__ import annotations

import pytest
from engine_testing import encode, scripted_core
from test_engine_failed_step import ForwardFailed, fail_next_forward
from test_engine_kv_consistency import make_core

from asyncdp.engine.core import EngineCore
from asyncdp.llm import LLM
from asyncdp.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)


def reported(core: EngineCore) -> dict[str, set[int]]:
    """Step until idle; per request, every num_cached_tokens its outputs carried."""
    out: dict[str, set[int]] = {}
    for _ in range(200):
        if not core.has_unfinished():
            return out
        for o in core.step().outputs:
            out.setdefault(o.request_id, set()).add(o.num_cached_tokens)
    raise AssertionError("requests left unfinished")


def test_a_preempted_request_reports_the_hit_of_its_first_scheduling_not_the_recomputes() -> None:
    core, executor = scripted_core({}, num_kv_blocks=9, block_size=4, max_model_len=32)  # 8 usable blocks
    core.add_request("p", encode("shared!!"), SamplingParams(max_tokens=1))
    reported(core)  # two blocks of "shared!!" cached
    core.add_request("a", encode("shared!!-a0"), PARAMS)
    core.add_request("b", encode("other...-b0"), PARAMS)
    got = reported(core)
    assert core.scheduler.num_preemptions == 1
    # "b" was admitted with no hit and recomputed from its own first block (still cached): 0, then 4 tokens.
    admissions = [(c.request_id, c.start_pos) for batch in executor.batches for c in batch.chunks
                  if c.request_id == "b" and c.start_pos < len(c.prompt_token_ids)]
    assert admissions == [("b", 0), ("b", 8)]
    assert got == {"a": {8}, "b": {0}}


def test_a_request_recomputed_after_a_failed_forward_reports_the_hit_of_its_first_scheduling() -> None:
    core, _ = scripted_core({}, block_size=4)
    core.add_request("a", encode("twelve bytes"), PARAMS)
    core.add_request("twin", encode("twelve bytes"), PARAMS)  # hits the 8 tokens "a" publishes in that step
    fail_next_forward(core)
    with pytest.raises(ForwardFailed):
        core.step()
    core.abort_requests(["a"])  # so the twin's recompute hits nothing (a's blocks were never written)
    got = reported(core)
    assert got["twin"] == {8}
    assert core.block_manager.prefix_cache_hits == 8  # counted once, at its first scheduling


def test_parallel_samples_report_the_prompts_hit_when_the_request_was_first_scheduled() -> None:
    prompt = list(b"a prompt of twenty-two")  # 5 full blocks of 4 can be hits (the last token is computed)
    for n in (2, 3, 4):
        llm = LLM.from_engine_core(make_core(block_size=4))
        cold = llm.generate([prompt], SamplingParams(n=n, max_tokens=3))[0]
        assert len(cold.outputs) == n
        # Nothing was cached when it arrived; samples 1.. hit the blocks sample 0 computed (20 tokens), which
        # before the fix the result reported as the prompt's hit.
        assert cold.num_cached_tokens == 0, n
        warm = llm.generate([prompt], SamplingParams(n=n, max_tokens=3))[0]
        assert warm.num_cached_tokens == 20, n


def test_one_sample_reports_its_hit() -> None:
    llm = LLM.from_engine_core(make_core(block_size=4))
    prompt = list(b"a prompt of twenty-two")
    assert [llm.generate([prompt], SamplingParams(max_tokens=3))[0].num_cached_tokens for _ in range(2)] == [0, 20]
