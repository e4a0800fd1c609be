"""Sim executor: cost model, deterministic request-id-independent tokens, EOS avoidance."""

from __future__ import annotations

import pytest
from engine_testing import EOS_ID, VOCAB_SIZE, encode, run_to_completion, sim_core

from asyncdp.config.flags import EngineConfig, SimCostProfile
from asyncdp.engine.executor import ModelBatch, ScheduledChunk
from asyncdp.engine.sim_executor import DEFAULT_SIM_KV_BLOCKS, SimExecutor
from asyncdp.sampling_params import SamplingParams


def chunk(rid, tokens, start, sample=True):
    return ScheduledChunk(rid, tokens, start, [1], sample, SamplingParams(), 0)


def test_step_cost_follows_the_linear_model_and_is_not_slept():
    cfg = EngineConfig(executor="sim", sim_cost=SimCostProfile(2.0, 0.5, 0.25, 0.001))
    ex = SimExecutor(cfg, 100, max_model_len=64)
    batch = ModelBatch([chunk("a", [1] * 10, 0), chunk("b", [3], 20)],
                       num_prefill_tokens=10, num_decode_seqs=1, num_kv_tokens=31)
    res = ex.execute(batch)
    assert res.extra["sim_step_s"] == pytest.approx((2.0 + 5.0 + 0.25 + 0.031) / 1e3)
    assert ex.last_step_s == res.extra["sim_step_s"]
    ex.execute_dummy()
    assert ex.last_step_s == pytest.approx(0.002)


def test_tokens_depend_on_content_not_on_request_id_and_skip_non_sampling_chunks():
    ex = SimExecutor(EngineConfig(executor="sim"), 100, max_model_len=64)
    res = ex.execute(ModelBatch([chunk("a", [5, 6], 0), chunk("b", [5, 6], 0), chunk("c", [5], 0, False)]))
    assert res.sampled[0] == res.sampled[1] and res.sampled[2] is None
    assert ex.num_kv_blocks == DEFAULT_SIM_KV_BLOCKS


def test_avoided_token_ids_are_never_sampled():
    ex = SimExecutor(EngineConfig(executor="sim"), 3, max_model_len=64, avoid_token_ids={0, 1})
    out = ex.execute(ModelBatch([chunk(str(i), [i], i) for i in range(50)]))
    assert set(out.sampled) == {2}


def test_identical_prompts_under_different_ids_and_batches_generate_identical_tokens():
    core = sim_core(max_num_batched_tokens=7)
    core.add_request("x", encode("same prompt"), SamplingParams(max_tokens=6))
    core.add_request("other", encode("different one"), SamplingParams(max_tokens=6))
    core.add_request("y", encode("same prompt"), SamplingParams(max_tokens=6))
    res = run_to_completion(core)
    assert res["x"]["tokens"] == res["y"]["tokens"] and EOS_ID not in res["x"]["tokens"]
    assert all(0 <= t < VOCAB_SIZE for t in res["x"]["tokens"])


def test_a_constrained_request_refused_by_the_sim_executor_names_the_request_parameter():
    # http-api.md: a 400's param names the field; it said "structured", which no request has.
    from asyncdp.errors import InvalidRequestError
    from asyncdp.sampling_params import StructuredOutputs

    core = sim_core()
    params = SamplingParams(max_tokens=2, structured=StructuredOutputs(regex="a+", param="guided_regex"))
    with pytest.raises(InvalidRequestError, match="--executor sim") as raised:
        core.add_request("r", encode("ab"), params)
    assert raised.value.field == "guided_regex"


def test_the_sim_executor_samples_only_allowed_ids_and_never_a_bad_word():
    core = sim_core()
    allowed = [ord(c) for c in "abc"] + [EOS_ID]  # EOS allowed but avoided while anything else is
    core.add_request("allowed", encode("prompt"), SamplingParams(max_tokens=40, allowed_token_ids=allowed))
    core.add_request("bad", encode("prompt"), SamplingParams(max_tokens=40, allowed_token_ids=allowed,
                                                             bad_words=["ab", "c"]))  # tokenized by the core
    core.add_request("free", encode("prompt"), SamplingParams(max_tokens=40, bad_words=["e"]))
    res = run_to_completion(core)
    assert len(res["allowed"]["tokens"]) == 40 and set(res["allowed"]["tokens"]) == set(allowed[:3])
    bad = bytes(res["bad"]["tokens"]).decode()
    assert len(bad) == 40 and set(bad) <= {"a", "b"} and "ab" not in bad
    assert ord("e") not in res["free"]["tokens"] and len(set(res["free"]["tokens"])) > 10
