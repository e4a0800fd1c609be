"""In Prometheus multiprocess mode the per-request metrics are written through ``asyncdp.api.metric_values``'s
writers (the value's slot in the mmapped file, without prometheus_client's per-call lock and process-id check:
29.5 -> 12 µs per request). The files they leave are read exactly as those prometheus_client's own calls leave:
the same requests recorded both ways render the same page, a fork included (the child's writes go to its own
file, as prometheus_client does it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]

WRITER = """
import os, sys
from asyncdp.api import metric_values
if sys.argv[1] == "plain":  # the reference: prometheus_client's own calls
    metric_values.fast_value = lambda value: value
    metric_values.FastCounter.of = staticmethod(lambda child: child)
    metric_values.FastGauge.of = staticmethod(lambda child: child)
from asyncdp.api.metrics import Metrics

m = Metrics(model_name="m")
m.init_engine(0)

def request(i):
    m.inc_lb_decision(0, "score")
    m.set_inflight(0, 1 + i % 3)
    m.record_first_token(0, 0.001 * i)
    m.add_tokens(0, 5 + i, 1)
    m.record_iteration_tokens(0, 6 + i)
    m.record_token_gaps(0, 0.02 * i, 2)
    m.add_tokens(0, 0, 2)
    m.record_request_finished(0, ("stop", "length", "error")[i % 3], 0.01 * i, 0.0001 * i, prompt_tokens=5 + i,
                              generation_tokens=3, decode_s=0.04, prefill_s=0.002, max_tokens=8 + i)
    m.record_sequence_group(0, 1 + i % 2, 3)
    m.set_engine_state(0, i, 1, 0.5, at=1000.0 + i)
    m.add_engine_counters(0, preemptions=i % 2, prefix_cache_queries=8, prefix_cache_hits=i)

for i in range(20):
    request(i)
fast = type(m._s(0).e2e_request_latency._sum).__name__ == "MmapValue"
assert fast == (sys.argv[1] == "fast"), "the writers in use are not the ones under test"
pid = os.fork()
if pid == 0:
    request(100)
    os._exit(0)
os.waitpid(pid, 0)
request(200)
"""


def render(multiproc_dir: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the node's page, by name and labels (the page lists the families in file order)."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(multiproc_dir))
    page = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(page) for s in family.samples}


def write(mode: str, multiproc_dir: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    multiproc_dir.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", WRITER, mode], env=env, check=True, timeout=120)
    return render(multiproc_dir)


def test_the_fast_writers_leave_what_prometheus_clients_calls_leave(tmp_path: Path) -> None:
    fast, plain = write("fast", tmp_path / "fast"), write("plain", tmp_path / "plain")
    assert fast == plain
    engine = (("engine", "0"), ("model_name", "m"))
    assert fast[("vllm:request_success_total", (("engine", "0"), ("finished_reason", "stop"), ("model_name", "m")))] \
        == 7  # requests 0, 3, ..., 18 (100 and 200 end with "length" and "error")
    assert fast[("vllm:prompt_tokens_total", engine)] == sum(range(5, 25)) + 105 + 205
    assert len(list((tmp_path / "fast").iterdir())) == len(list((tmp_path / "plain").iterdir()))
