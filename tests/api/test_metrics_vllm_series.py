"""The vLLM series a vLLM dashboard reads beyond the latency histograms: per-step tokens
(``vllm:iteration_tokens_total``), the request parameters (``vllm:request_params_n``,
``vllm:request_params_max_tokens``), the longest output of a prompt's sequences
(``vllm:request_max_num_generation_tokens``) and ``finished_reason="error"``, with vLLM's names, types, buckets and
the requests vLLM counts in them.

The streams need an event loop (their events are anyio's), hence async tests that await nothing.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncdp import messages as m
from asyncdp.api.engine_client import SequenceGroup
from asyncdp.api.metrics import Metrics
from asyncdp.apiserver.client import ClientConfig, DPClient
from asyncdp.apiserver.request_stream import RequestStream


def families(metrics: Metrics) -> dict[str, tuple[str, dict[tuple[str, str, str], float]]]:
    """family name -> (type, {(sample name, engine, le or finished_reason): value})."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        got = {}
        for s in family.samples:
            got[(s.name, s.labels.get("engine", ""), s.labels.get("le", s.labels.get("finished_reason", "")))] = s.value
        out[family.name] = (family.type, got)
    return out


def value(metrics: Metrics, name: str, engine: str = "0", extra: str = "") -> float:
    """One sample: ``extra`` is its ``le`` or ``finished_reason``."""
    for _, got in families(metrics).values():
        if (name, engine, extra) in got:
            return got[(name, engine, extra)]
    return 0.0


def client() -> DPClient:
    cfg = ClientConfig(client_index=0, client_count=1, managed_ranks=(0, 1), dp_size=2, model_name="m",
                       max_model_len=64, is_moe=False)
    return DPClient(cfg, None, metrics=Metrics(model_name="m", multiproc_dir=None))


def start(c: DPClient, rid: str, num_prompt_tokens: int = 5, *, max_tokens: int | None = 8,
          group: SequenceGroup | None = None) -> RequestStream:
    req = c._requests[rid] = RequestStream(rid, arrival=0.0, num_prompt_tokens=num_prompt_tokens,
                                           max_tokens=max_tokens, group=group)
    return req


def frame(*outs: m.RequestOutput, rank: int = 0) -> m.EngineOutputs:
    return m.EngineOutputs(dp_rank=rank, outputs=list(outs), finished_request_ids=[o.request_id for o in outs
                                                                                   if o.finished],
                           scheduler_stats=None, timestamp=0.0)


def test_a_ready_engine_has_the_new_series_at_zero_with_vllms_types_and_buckets() -> None:
    metrics = Metrics(model_name="m", multiproc_dir=None)
    metrics.init_engine(0)
    got = families(metrics)
    one_two_five = [str(float(m * 10**e)) for e in range(3) for m in (1, 2, 5)]  # 1 .. 500, as far as checked
    expected = {
        "vllm:iteration_tokens_total": ["1.0", "8.0", "16.0", "32.0", "64.0", "128.0", "256.0", "512.0", "1024.0",
                                        "2048.0", "4096.0", "8192.0", "16384.0", "+Inf"],
        "vllm:request_params_n": ["1.0", "2.0", "5.0", "10.0", "20.0", "+Inf"],
        "vllm:request_params_max_tokens": one_two_five,
        "vllm:request_max_num_generation_tokens": one_two_five,
    }
    for name, bounds in expected.items():
        kind, samples = got[name]
        assert kind == "histogram", name
        les = [le for (sample, engine, le) in samples if sample == f"{name}_bucket" and engine == "0"]
        if name in ("vllm:iteration_tokens_total", "vllm:request_params_n"):
            assert les == bounds, name
        else:
            assert les[:len(bounds)] == bounds, name
        assert samples[(f"{name}_count", "0", "")] == 0, name
    assert got["vllm:request_success"][1][("vllm:request_success_total", "0", "error")] == 0


@pytest.mark.anyio
async def test_each_frame_with_outputs_is_one_iteration_of_its_prompt_and_generated_tokens() -> None:
    c = client()
    start(c, "a", num_prompt_tokens=7)
    start(c, "b", num_prompt_tokens=3)
    c._events.on_outputs(frame(m.RequestOutput(request_id="a", new_token_ids=[1]),
                               m.RequestOutput(request_id="b", new_token_ids=[1])))  # two first tokens: 7 + 3 + 2
    c._events.on_outputs(frame(m.RequestOutput(request_id="a", new_token_ids=[2])))  # one decode token
    assert value(c.metrics, "vllm:iteration_tokens_total_count") == 2
    assert value(c.metrics, "vllm:iteration_tokens_total_sum") == 12 + 1
    assert value(c.metrics, "vllm:iteration_tokens_total_sum") == \
        value(c.metrics, "vllm:prompt_tokens_total") + value(c.metrics, "vllm:generation_tokens_total")
    c._events.on_outputs(m.EngineOutputs(dp_rank=0, outputs=[], finished_request_ids=[], timestamp=0.0,
                                         scheduler_stats=m.SchedulerStats(num_running=2)))  # stats alone: no step
    assert value(c.metrics, "vllm:iteration_tokens_total_count") == 2


@pytest.mark.anyio
async def test_a_finished_request_observes_its_max_tokens_and_is_a_group_of_one() -> None:
    c = client()
    start(c, "r", max_tokens=8)
    c._events.on_outputs(frame(m.RequestOutput(request_id="r", new_token_ids=[1, 2, 3], finished=True,
                                               finish_reason="stop")))
    assert value(c.metrics, "vllm:request_params_max_tokens_count") == 1
    assert value(c.metrics, "vllm:request_params_max_tokens_sum") == 8
    assert value(c.metrics, "vllm:request_params_n_sum") == 1
    assert value(c.metrics, "vllm:request_max_num_generation_tokens_count") == 1
    assert value(c.metrics, "vllm:request_max_num_generation_tokens_sum") == 3


@pytest.mark.anyio
async def test_a_prompts_sequences_are_observed_once_when_the_last_finishes_with_the_longest_output() -> None:
    c = client()
    group = SequenceGroup(n=2, num_sequences=3)  # best_of=3, n=2: vLLM's n parameter is observed
    for rid in ("s0", "s1", "s2"):
        start(c, rid, group=group)
    c._events.on_outputs(frame(m.RequestOutput(request_id="s0", new_token_ids=[1, 2], finished=True,
                                               finish_reason="stop")))
    c._events.on_outputs(frame(m.RequestOutput(request_id="s1", new_token_ids=[1, 2, 3, 4, 5], finished=True,
                                               finish_reason="length"), rank=1))
    assert value(c.metrics, "vllm:request_params_n_count") == 0  # one sequence still running
    c._events.on_outputs(frame(m.RequestOutput(request_id="s2", new_token_ids=[1], finished=True,
                                               finish_reason="stop")))
    assert value(c.metrics, "vllm:request_params_n_count") == 1
    assert value(c.metrics, "vllm:request_params_n_sum") == 2
    assert value(c.metrics, "vllm:request_max_num_generation_tokens_sum") == 5
    assert value(c.metrics, "vllm:request_params_n_count", engine="1") == 0  # the engine of the last to finish
    assert value(c.metrics, "vllm:request_params_max_tokens_count") + \
        value(c.metrics, "vllm:request_params_max_tokens_count", engine="1") == 3  # one per sequence


@pytest.mark.anyio
async def test_a_request_the_engine_ended_with_error_counts_under_error_but_a_refused_one_not_at_all() -> None:
    c = client()
    start(c, "grammar")
    c._events.on_outputs(frame(m.RequestOutput(request_id="grammar", new_token_ids=[1, 2])))
    c._events.on_outputs(frame(m.RequestOutput(request_id="grammar", new_token_ids=[3], finished=True,
                                               finish_reason="error", error_type="invalid_request", error="grammar")))
    assert value(c.metrics, "vllm:request_success_total", extra="error") == 1
    assert value(c.metrics, "vllm:e2e_request_latency_seconds_count") == 1
    assert value(c.metrics, "vllm:request_generation_tokens_sum") == 3
    start(c, "refused")
    c._events.on_outputs(frame(m.RequestOutput(request_id="refused", finished=True, finish_reason="abort",
                                               error_type="invalid_request", error="bad")))
    assert sum(value(c.metrics, "vllm:request_success_total", extra=r) for r in ("stop", "length", "abort",
                                                                                 "error")) == 1
    assert value(c.metrics, "vllm:e2e_request_latency_seconds_count") == 1
