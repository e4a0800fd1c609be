"""asyncdp.api.metrics: one process with a private registry; several processes aggregated through a directory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from asyncdp.api.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


def test_single_process_counts_requests_and_observes_latencies() -> None:
    m = Metrics(model_name="m", multiproc_dir=None)
    m.add_tokens(3, prompt_tokens=4, generation_tokens=1)
    m.record_first_token(3, 0.02)
    m.record_token_gaps(3, 0.02, 2)
    m.add_tokens(3, prompt_tokens=0, generation_tokens=2)
    m.record_request_finished(3, "stop", e2e_s=0.1, queue_s=0.005)
    m.add_tokens("3", prompt_tokens=2, generation_tokens=0)
    m.record_request_finished("3", "abort", e2e_s=0.5)
    m.inc_lb_decision(3, "hint")
    m.set_wave(3, 7, running=True)
    m.add_dummy_steps(3, 5)
    m.add_engine_counters(3, preemptions=1, prefix_cache_queries=32, prefix_cache_hits=16)
    m.set_snapshot_age(0.25)
    got = samples(m.render().decode())
    e = {"model_name": "m", "engine": "3"}
    assert got[key("vllm:request_success_total", **e, finished_reason="stop")] == 1
    assert got[key("vllm:request_success_total", **e, finished_reason="abort")] == 1
    assert got[key("vllm:prompt_tokens_total", **e)] == 6
    assert got[key("vllm:generation_tokens_total", **e)] == 3
    assert got[key("vllm:time_to_first_token_seconds_count", **e)] == 1
    assert got[key("vllm:inter_token_latency_seconds_count", **e)] == 2
    assert got[key("vllm:e2e_request_latency_seconds_count", **e)] == 2
    assert got[key("vllm:request_queue_time_seconds_count", **e)] == 1
    assert got[key("asyncdp:dp_lb_decisions_total", **e, reason="hint")] == 1
    assert got[key("asyncdp:dp_wave", **e)] == 7 and got[key("asyncdp:dp_running", **e)] == 1
    assert got[key("asyncdp:dp_dummy_steps_total", **e)] == 5
    assert got[key("vllm:prefix_cache_hits_total", **e)] == 16
    assert got[key("asyncdp:dp_coordinator_snapshot_age_seconds", model_name="m")] == 0.25


def test_two_metrics_objects_in_one_process_do_not_collide() -> None:
    a, b = Metrics(model_name="a", multiproc_dir=None), Metrics(model_name="b", multiproc_dir=None)
    a.set_engine_up(0, True)
    b.set_engine_up(0, False)
    assert samples(a.render().decode())[key("asyncdp:dp_engine_up", model_name="a", engine="0")] == 1
    assert samples(b.render().decode())[key("asyncdp:dp_engine_up", model_name="b", engine="0")] == 0


WRITER = textwrap.dedent("""
    import os, sys
    from asyncdp.api.metrics import Metrics
    i = int(sys.argv[1])
    m = Metrics(model_name="m")
    assert m.multiproc_dir == os.environ["PROMETHEUS_MULTIPROC_DIR"]
    m.add_tokens("0", 10, 5)
    m.record_request_finished("0", "stop", 0.5)
    m.set_engine_state("0", running=10 + i, waiting=i, kv_usage=0.5 * i)
    m.set_inflight("0", i + 1)
    print(os.getpid())
""")

RENDERER = textwrap.dedent("""
    import sys
    from asyncdp.api.metrics import Metrics, mark_process_dead
    if len(sys.argv) > 1:
        mark_process_dead(int(sys.argv[1]))
    sys.stdout.write(Metrics(model_name="m").render().decode())
""")


def run_python(code: str, *args: str, multiproc_dir: Path) -> str:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_multiprocess_mode_sums_counters_and_keeps_the_most_recent_gauge(tmp_path: Path) -> None:
    pid0 = run_python(WRITER, "0", multiproc_dir=tmp_path).strip()
    run_python(WRITER, "1", multiproc_dir=tmp_path)
    got = samples(run_python(RENDERER, multiproc_dir=tmp_path))
    e = {"model_name": "m", "engine": "0"}
    assert got[key("vllm:request_success_total", **e, finished_reason="stop")] == 2
    assert got[key("vllm:generation_tokens_total", **e)] == 10
    assert got[key("vllm:e2e_request_latency_seconds_count", **e)] == 2
    assert got[key("vllm:num_requests_running", **e)] == 11  # the later writer's value
    assert got[key("vllm:kv_cache_usage_perc", **e)] == 0.5
    assert got[key("asyncdp:dp_inflight_requests", **e)] == 3  # summed over processes: 1 + 2
    after_exit = samples(run_python(RENDERER, pid0, multiproc_dir=tmp_path))
    assert after_exit[key("asyncdp:dp_inflight_requests", **e)] == 2  # the exited writer no longer counts
