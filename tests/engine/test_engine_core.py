"""EngineCore: finish reasons, stop handling, aborts, pause, prefix-cache equivalence, input validation."""

from __future__ import annotations

import pytest
from engine_testing import EOS_ID, encode, run_to_completion, scripted_core, sim_core

from asyncdp.errors import InvalidRequestError, InvalidSamplingParams, PromptTooLongError
from asyncdp.sampling_params import SamplingParams


def test_max_tokens_finishes_with_length():
    core = sim_core()
    core.add_request("a", encode("hello"), SamplingParams(max_tokens=5))
    res = run_to_completion(core)["a"]
    assert len(res["tokens"]) == 5 and res["finish_reason"] == "length" and res["stop_reason"] is None


def test_eos_finishes_with_stop_and_its_text_is_not_included():
    core, _ = scripted_core({"a": encode("ok") + [EOS_ID] + encode("never")})
    core.add_request("a", encode("q"), SamplingParams(max_tokens=20))
    res = run_to_completion(core)["a"]
    assert res["tokens"] == encode("ok") + [EOS_ID]
    assert (res["finish_reason"], res["stop_reason"], res["text"]) == ("stop", None, "ok")


def test_ignore_eos_runs_past_eos():
    core, _ = scripted_core({"a": [EOS_ID] * 4})
    core.add_request("a", encode("q"), SamplingParams(max_tokens=4, ignore_eos=True))
    assert run_to_completion(core)["a"]["finish_reason"] == "length"


def test_stop_token_id_is_reported_as_the_stop_reason():
    core, _ = scripted_core({"a": encode("xyz")})
    core.add_request("a", encode("q"), SamplingParams(max_tokens=9, stop_token_ids=(ord("y"),)))
    res = run_to_completion(core)["a"]
    assert (res["tokens"], res["stop_reason"], res["text"]) == (encode("xy"), ord("y"), "x")


def test_include_stop_str_in_output_keeps_the_stop_tokens_text_as_vllm_does():
    core, _ = scripted_core({"a": encode("xyz")})
    core.add_request("a", encode("q"), SamplingParams(max_tokens=9, stop_token_ids=(ord("y"),),
                                                      include_stop_str_in_output=True))
    res = run_to_completion(core)["a"]
    assert (res["tokens"], res["finish_reason"], res["stop_reason"], res["text"]) == (encode("xy"), "stop", ord("y"),
                                                                                     "xy")


def test_min_tokens_prevents_finishing_on_eos_or_stop_string_early():
    core, _ = scripted_core({"a": [EOS_ID] + encode("ab") + [EOS_ID]})
    core.add_request("a", encode("q"), SamplingParams(max_tokens=9, min_tokens=2, stop=("a",)))
    res = run_to_completion(core)["a"]
    # EOS at 1 is ignored (below min_tokens); "a" at output 2 meets min_tokens and stops
    assert res["finish_reason"] == "stop" and res["stop_reason"] == "a" and len(res["tokens"]) == 2


def test_stop_string_truncates_text_and_names_the_string():
    core, _ = scripted_core({"a": encode("one. two. three")})
    core.add_request("a", encode("q"), SamplingParams(max_tokens=30, stop=(". t",)))
    res = run_to_completion(core)["a"]
    assert (res["text"], res["finish_reason"], res["stop_reason"]) == ("one", "stop", ". t")


def test_reaching_max_model_len_finishes_with_length():
    core = sim_core(max_model_len=12)
    core.add_request("a", encode("0123456789"), SamplingParams(max_tokens=None))
    res = run_to_completion(core)["a"]
    assert len(res["tokens"]) == 2 and res["finish_reason"] == "length"


def test_abort_of_waiting_and_running_requests_is_reported_in_the_next_step():
    core = sim_core(max_num_seqs=1)
    core.add_request("run", encode("aaaa"), SamplingParams(max_tokens=50))
    core.add_request("wait", encode("bbbb"), SamplingParams(max_tokens=50))
    core.step()
    core.abort_requests(["run", "wait", "nope"])
    step = core.step()
    assert sorted(step.finished_request_ids) == ["run", "wait"] and not step.executed
    assert {o.request_id: o.finish_reason for o in step.outputs} == {"run": "abort", "wait": "abort"}
    assert not core.has_unfinished() and core.stats().kv_cache_usage == 0.0


def test_request_aborted_during_the_forward_gets_no_more_tokens():
    core = sim_core()
    core.add_request("a", encode("aaaa"), SamplingParams(max_tokens=50))
    real_execute = core.executor.execute

    def execute_then_abort(batch):
        core.abort_requests(["a"])  # as the I/O task would, while the step runs
        return real_execute(batch)

    core.executor.execute = execute_then_abort  # type: ignore[method-assign]
    step = core.step()
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in step.outputs] == [("a", [], "abort")]


def test_pause_abort_aborts_all_and_resume_serves_new_requests():
    core = sim_core()
    core.add_request("a", encode("aaaa"), SamplingParams(max_tokens=50))
    core.step()
    core.pause("abort")
    assert core.is_paused() and core.num_unfinished_for_sync() == 0
    assert core.has_unfinished()  # the abort output is still to be reported
    step = core.step()
    assert [(o.request_id, o.finish_reason) for o in step.outputs] == [("a", "abort")]
    assert step.finished_request_ids == ["a"] and not core.has_unfinished()
    core.add_request("b", encode("bbbb"), SamplingParams(max_tokens=3))
    assert not core.step().executed and core.num_unfinished_for_sync() == 0
    core.resume()
    assert run_to_completion(core)["b"]["finish_reason"] == "length"


def test_pause_keep_freezes_a_request_that_then_completes_after_resume():
    core = sim_core()
    core.add_request("a", encode("aaaa"), SamplingParams(max_tokens=4))
    core.step()
    core.pause("keep")
    assert not core.step().executed and core.has_unfinished() and not core.has_steppable_work()
    core.resume()
    res = run_to_completion(core)["a"]
    assert len(res["tokens"]) == 3 and res["finish_reason"] == "length"


def test_outputs_are_identical_with_prefix_caching_on_and_off():
    shared = encode("The same long system prompt for everyone. ") * 2
    params = SamplingParams(max_tokens=12)

    def run(enable):
        core = sim_core(enable_prefix_caching=enable, block_size=4, max_num_batched_tokens=48)
        for i in range(6):
            core.add_request(f"r{i}", shared + encode(f"user {i}"), params)
        res = run_to_completion(core)
        return {k: (v["tokens"], v["text"]) for k, v in res.items()}, core.stats()

    on, on_stats = run(True)
    off, off_stats = run(False)
    assert on == off
    assert on_stats.prefix_cache_hits > 0 and off_stats.prefix_cache_hits == 0


def test_first_output_reports_the_prefix_cache_hit():
    core = sim_core(block_size=4)
    core.add_request("a", encode("abcdefghij"), SamplingParams(max_tokens=2))
    run_to_completion(core)
    core.add_request("b", encode("abcdefghij"), SamplingParams(max_tokens=2))
    out = core.step().outputs[0]
    assert (out.num_prompt_tokens, out.num_cached_tokens) == (10, 8)


def test_empty_prompt_is_rejected_as_an_invalid_request_not_a_too_long_one():
    with pytest.raises(InvalidRequestError, match="at least one token") as err:
        sim_core().add_request("a", [], SamplingParams())
    assert not isinstance(err.value, PromptTooLongError) and err.value.field == "prompt"


def test_prompt_too_long_names_max_model_len():
    core = sim_core(max_model_len=16)
    with pytest.raises(PromptTooLongError, match=r"max_model_len \(16\)"):
        core.add_request("a", [1] * 16, SamplingParams())


def test_duplicate_request_id_is_rejected_naming_the_field():
    core = sim_core()
    core.add_request("a", [1, 2], SamplingParams())
    with pytest.raises(InvalidRequestError) as err:
        core.add_request("a", [1, 2], SamplingParams())
    assert err.value.field == "request_id"


def test_invalid_sampling_params_raise_naming_the_field():
    with pytest.raises(InvalidSamplingParams) as err:
        sim_core().add_request("a", [1, 2], SamplingParams(top_p=0.0))
    assert err.value.field == "top_p"


def test_out_of_vocabulary_prompt_token_is_rejected():
    with pytest.raises(InvalidRequestError, match="prompt token ids"):
        sim_core().add_request("a", [1, 10_000], SamplingParams())


def test_stats_report_queues_usage_and_steps():
    core = sim_core(max_num_seqs=1)
    core.add_request("a", encode("aaaa"), SamplingParams(max_tokens=5))
    core.add_request("b", encode("bbbb"), SamplingParams(max_tokens=5))
    core.step()
    st = core.stats()
    assert (st.num_running, st.num_waiting, st.step) == (1, 1, 1) and st.kv_cache_usage > 0


def test_sim_step_cost_is_reported_not_slept():
    from asyncdp.config.flags import SimCostProfile
    core = sim_core(sim_cost=SimCostProfile(a_ms=5.0, b_ms_per_token=1.0, c_ms_per_seq=0.0,
                                            d_ms_per_kv_token=0.0))
    core.add_request("a", encode("abcd"), SamplingParams(max_tokens=2))
    step = core.step()
    assert step.extra["sim_step_s"] == pytest.approx(0.009)  # 5 + 4 prefill tokens * 1 ms
    assert core.executor.last_step_s == pytest.approx(0.009)


def test_the_sim_e_term_prices_prefill_attention_by_token_pairs_and_leaves_decode_steps_alone():
    from asyncdp.config.flags import SimCostProfile
    core = sim_core(sim_cost=SimCostProfile(a_ms=5.0, b_ms_per_token=0.0, c_ms_per_seq=0.0, d_ms_per_kv_token=0.0,
                                            e_ms_per_token_pair=0.5))
    core.add_request("a", encode("abcd"), SamplingParams(max_tokens=2))
    assert core.step().extra["sim_step_s"] == pytest.approx(0.009)  # 5 + 0.5·4·(0 + 4/2) ms
    assert core.step().extra["sim_step_s"] == pytest.approx(0.005)  # a decode step: no prefill pairs
    assert SimCostProfile.parse("1,2,3,4,5").e_ms_per_token_pair == 5.0


def test_every_chunk_has_blocks_for_its_positions_and_no_two_chunks_write_one_block():
    shared = encode("shared prefix of the batch ") * 2
    core, ex = scripted_core({}, num_kv_blocks=1 + 19, block_size=4, max_num_batched_tokens=32)
    for i in range(8):
        core.add_request(f"r{i}", shared + encode("x" * i), SamplingParams(max_tokens=10, ignore_eos=True))
    run_to_completion(core)
    assert core.stats().num_preemptions > 0 and core.stats().prefix_cache_hits > 0
    for batch in ex.batches:
        written: set[int] = set()
        for c in batch.chunks:
            end = c.start_pos + len(c.token_ids)
            table = c.block_table[: -(-end // 4)]  # the live list may have grown since; check this step's part
            assert len(table) * 4 >= end and 0 not in table
            mine = {table[p // 4] for p in range(c.start_pos, end)}
            assert not (mine & written)
            written |= mine


def test_stop_strings_without_a_tokenizer_are_rejected_naming_the_field():
    with pytest.raises(InvalidRequestError) as err:
        sim_core(tokenizer=None).add_request("a", [1, 2], SamplingParams(stop=("x",)))
    assert err.value.field == "stop"
