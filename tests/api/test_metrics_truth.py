"""What the DP client counts in ``/metrics`` for each way a request can end, against what really happened.

vLLM's semantics: ``vllm:request_success_total`` and the per-request histograms (e2e latency, queue time) count
requests their engine finished: with an answer, or failed mid-generation (``finished_reason="error"``); a request
refused at admission, or one whose caller left, is not counted. Token counters and the per-token histograms (TTFT, inter-token latency) count the work as it is
delivered, so a request that never finishes still shows the tokens it got and a long one shows up before its end.

The streams need an event loop (their events are anyio's), hence async tests that await nothing.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncdp import messages as m
from asyncdp.api.metrics import Metrics
from asyncdp.apiserver.client import ClientConfig, DPClient
from asyncdp.apiserver.request_stream import RequestStream


def samples(metrics: Metrics) -> dict[tuple[str, str, str], float]:
    """(sample name, engine, finished_reason or "") -> value."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if "engine" in s.labels:
                out[(s.name, s.labels["engine"], s.labels.get("finished_reason", ""))] = s.value
    return out


def value(metrics: Metrics, name: str, engine: str = "0", reason: str = "") -> float:
    return samples(metrics).get((name, engine, reason), 0.0)


def successes(metrics: Metrics) -> float:
    return sum(v for (name, _, _), v in samples(metrics).items() if name == "vllm:request_success_total")


def client() -> DPClient:
    cfg = ClientConfig(client_index=0, client_count=1, managed_ranks=(0, 1), dp_size=2, model_name="m",
                       max_model_len=64, is_moe=False)
    return DPClient(cfg, None, metrics=Metrics(model_name="m", multiproc_dir=None))


def start(c: DPClient, rid: str, num_prompt_tokens: int = 5) -> RequestStream:
    req = c._requests[rid] = RequestStream(rid, arrival=0.0, num_prompt_tokens=num_prompt_tokens)
    return req


def frame(*outs: m.RequestOutput, rank: int = 0) -> m.EngineOutputs:
    return m.EngineOutputs(dp_rank=rank, outputs=list(outs), finished_request_ids=[o.request_id for o in outs
                                                                                   if o.finished],
                           scheduler_stats=None, timestamp=0.0)


@pytest.mark.anyio
async def test_request_the_engine_refused_is_not_counted_as_a_success() -> None:
    c = client()
    start(c, "r")
    c._events.on_outputs(frame(m.RequestOutput(request_id="r", finished=True, finish_reason="abort",
                                               error_type="invalid_request", error="bad")))
    assert successes(c.metrics) == 0
    assert value(c.metrics, "vllm:e2e_request_latency_seconds_count") == 0
    assert value(c.metrics, "vllm:prompt_tokens_total") == 0  # nothing was computed


@pytest.mark.anyio
async def test_request_failed_mid_generation_counts_under_error_with_its_tokens() -> None:
    c = client()
    start(c, "r", num_prompt_tokens=7)
    c._events.on_outputs(frame(m.RequestOutput(request_id="r", new_token_ids=[1, 2])))
    c._events.on_outputs(frame(m.RequestOutput(request_id="r", new_token_ids=[3], finished=True,
                                               finish_reason="error", error_type="invalid_request", error="grammar")))
    assert successes(c.metrics) == value(c.metrics, "vllm:request_success_total", reason="error") == 1  # as vLLM
    assert value(c.metrics, "vllm:prompt_tokens_total") == 7
    assert value(c.metrics, "vllm:generation_tokens_total") == 3


@pytest.mark.anyio
async def test_request_whose_caller_left_is_not_a_success_but_its_tokens_count() -> None:
    c = client()
    req = start(c, "r", num_prompt_tokens=4)
    c._events.on_outputs(frame(m.RequestOutput(request_id="r", new_token_ids=[1])))
    c._events.on_outputs(frame(m.RequestOutput(request_id="r", new_token_ids=[2])))
    req.client_abort = True  # the generator's finally: the caller disconnected, the engine confirms the abort
    c._events.on_outputs(frame(m.RequestOutput(request_id="r", finished=True, finish_reason="abort")))
    assert successes(c.metrics) == 0
    assert value(c.metrics, "vllm:e2e_request_latency_seconds_count") == 0
    assert value(c.metrics, "vllm:prompt_tokens_total") == 4
    assert value(c.metrics, "vllm:generation_tokens_total") == 2
    assert value(c.metrics, "vllm:time_to_first_token_seconds_count") == 1
    assert value(c.metrics, "vllm:inter_token_latency_seconds_count") == 1


@pytest.mark.anyio
async def test_request_the_operator_aborted_counts_as_finished_with_reason_abort() -> None:
    c = client()
    start(c, "r")
    c._events.on_outputs(frame(m.RequestOutput(request_id="r", new_token_ids=[1, 2])))
    c._events.on_outputs(frame(m.RequestOutput(request_id="r", finished=True, finish_reason="abort")))
    assert value(c.metrics, "vllm:request_success_total", reason="abort") == 1
    assert value(c.metrics, "vllm:e2e_request_latency_seconds_count") == 1


@pytest.mark.anyio
async def test_tokens_are_counted_as_they_arrive_not_when_the_request_ends() -> None:
    c = client()
    start(c, "r", num_prompt_tokens=6)
    c._events.on_outputs(frame(m.RequestOutput(request_id="r", new_token_ids=[1])))
    c._events.on_outputs(frame(m.RequestOutput(request_id="r", new_token_ids=[2, 3])))
    assert value(c.metrics, "vllm:prompt_tokens_total") == 6
    assert value(c.metrics, "vllm:generation_tokens_total") == 3
    assert value(c.metrics, "vllm:time_to_first_token_seconds_count") == 1
    assert value(c.metrics, "vllm:inter_token_latency_seconds_count") == 2  # one gap per token after the first
    assert successes(c.metrics) == 0  # still running


@pytest.mark.anyio
async def test_finished_request_counts_once_with_its_reason_and_latencies() -> None:
    c = client()
    start(c, "r", num_prompt_tokens=3)
    c._events.on_outputs(frame(m.RequestOutput(request_id="r", new_token_ids=[1], queue_time_s=0.25)))
    c._events.on_outputs(frame(m.RequestOutput(request_id="r", new_token_ids=[2], finished=True,
                                               finish_reason="length"), rank=0))
    assert value(c.metrics, "vllm:request_success_total", reason="length") == 1
    assert value(c.metrics, "vllm:prompt_tokens_total") == 3
    assert value(c.metrics, "vllm:generation_tokens_total") == 2
    assert value(c.metrics, "vllm:e2e_request_latency_seconds_count") == 1
    assert value(c.metrics, "vllm:request_queue_time_seconds_count") == 1
    assert value(c.metrics, "vllm:request_queue_time_seconds_sum") == 0.25
    # the request's sizes and its decode phase, as vLLM observes them per finished request
    assert value(c.metrics, "vllm:request_prompt_tokens_sum") == 3
    assert value(c.metrics, "vllm:request_generation_tokens_sum") == 2
    assert value(c.metrics, "vllm:request_decode_time_seconds_count") == 1
    assert value(c.metrics, "vllm:request_time_per_output_token_seconds_count") == 1
    assert value(c.metrics, "vllm:request_prefill_time_seconds_count") == 1
    assert value(c.metrics, "vllm:request_inference_time_seconds_count") == 1
    # two tokens, one gap: the mean time per output token is the decode time
    assert value(c.metrics, "vllm:request_time_per_output_token_seconds_sum") == \
        value(c.metrics, "vllm:request_decode_time_seconds_sum")


def test_a_ready_engine_has_every_series_at_zero_before_its_first_request() -> None:
    metrics = Metrics(model_name="m", multiproc_dir=None)
    metrics.init_engine(1)
    got = samples(metrics)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_count",
                 "vllm:request_prompt_tokens_count", "vllm:request_generation_tokens_count",
                 "vllm:request_time_per_output_token_seconds_count", "vllm:request_decode_time_seconds_count",
                 "vllm:request_prefill_time_seconds_count", "vllm:request_inference_time_seconds_count",
                 "asyncdp:dp_inflight_requests"):
        assert got[(name, "1", "")] == 0, name
    for reason in ("stop", "length", "abort"):
        assert got[("vllm:request_success_total", "1", reason)] == 0


@pytest.mark.anyio
async def test_a_dense_rank_that_dies_zeroes_its_gauges_without_growing_moe_wave_series() -> None:
    c = client()
    c._events.on_outputs(m.EngineOutputs(dp_rank=1, outputs=[], finished_request_ids=[], timestamp=0.0,
                                         scheduler_stats=m.SchedulerStats(num_running=2, kv_cache_usage=0.5)))
    c._events.on_dead(1, "its link closed")
    got = samples(c.metrics)
    assert got[("vllm:num_requests_running", "1", "")] == 0
    assert got[("vllm:kv_cache_usage_perc", "1", "")] == 0
    assert got[("asyncdp:dp_engine_up", "1", "")] == 0
    assert not any(name in ("asyncdp:dp_wave", "asyncdp:dp_running") for name, _, _ in got)


def test_a_ready_moe_engine_has_its_wave_series_at_zero_and_a_dense_one_none() -> None:
    moe, dense = Metrics(model_name="moe", multiproc_dir=None), Metrics(model_name="dense", multiproc_dir=None)
    moe.init_engine(0, is_moe=True)
    dense.init_engine(0)
    wave_series = ("asyncdp:dp_wave", "asyncdp:dp_running", "asyncdp:dp_waves_completed_total",
                   "asyncdp:dp_dummy_steps_total")
    got = samples(moe)
    assert all(got[(name, "0", "")] == 0 for name in wave_series)
    assert not any(name in wave_series for name, _, _ in samples(dense))
