"""DPClient exports the scheduler stats a rank attaches to its outputs as Prometheus metrics (asyncdp.apiserver.client)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from asyncdp import messages as m
from asyncdp.api.metrics import Metrics
from asyncdp.apiserver.client import ClientConfig, DPClient


def samples(metrics: Metrics) -> dict[tuple[str, str], float]:
    """(sample name, engine label) -> value."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if "engine" in s.labels:
                out[(s.name, s.labels["engine"])] = s.value
    return out


def client(*, is_moe: bool) -> DPClient:
    cfg = ClientConfig(client_index=0, client_count=1, managed_ranks=(0, 1), dp_size=2, model_name="m",
                       max_model_len=64, is_moe=is_moe)
    return DPClient(cfg, None, metrics=Metrics(model_name="m", multiproc_dir=None))


def outputs(rank: int, **stats: int | bool) -> m.EngineOutputs:
    return m.EngineOutputs(dp_rank=rank, outputs=[], finished_request_ids=[],
                           scheduler_stats=m.SchedulerStats(**stats), timestamp=0.0)


def test_counter_deltas_add_up_per_rank_and_gauges_follow_the_latest_stats():
    c = client(is_moe=True)
    c._events.on_outputs(outputs(0, num_running=3, num_preemptions=1, prefix_cache_queries=64, prefix_cache_hits=32,
                          wave=4, wave_running=True, num_dummy_steps=5))
    c._events.on_outputs(outputs(0, num_running=1, num_preemptions=2, prefix_cache_queries=16, wave=5, wave_running=False,
                          num_dummy_steps=2, waves_completed=1))
    c._events.on_outputs(outputs(1, num_dummy_steps=7, waves_completed=1, wave=5))
    got = samples(c.metrics)
    assert got[("vllm:num_preemptions_total", "0")] == 3
    assert got[("vllm:prefix_cache_queries_total", "0")] == 80
    assert got[("vllm:prefix_cache_hits_total", "0")] == 32
    assert got[("vllm:num_requests_running", "0")] == 1
    assert got[("asyncdp:dp_wave", "0")] == 5 and got[("asyncdp:dp_running", "0")] == 0
    assert got[("asyncdp:dp_dummy_steps_total", "0")] == 7
    assert got[("asyncdp:dp_waves_completed_total", "0")] == 1
    assert got[("asyncdp:dp_dummy_steps_total", "1")] == 7
    assert got[("asyncdp:dp_waves_completed_total", "1")] == 1


def test_dense_client_exports_engine_counters_but_no_wave_state():
    c = client(is_moe=False)
    c._events.on_outputs(outputs(1, num_preemptions=2, prefix_cache_hits=8, prefix_cache_queries=8))
    got = samples(c.metrics)
    assert got[("vllm:num_preemptions_total", "1")] == 2
    assert got[("vllm:prefix_cache_hits_total", "1")] == 8
    assert ("asyncdp:dp_wave", "1") not in got
