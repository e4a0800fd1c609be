"""Engine gauges across API processes (Prometheus multiprocess mode): the newest report by the rank's clock wins.

A rank attaches its state to one API process's messages at a time, and each API process applies what it gets
when its event loop gets round to it. A process that applies an older report after another applied a newer one
must not win: before, the gauges took the wall time of the write, and a busy process left an idle rank showing
requests running until its next report. Each writer below is its own process (its own files in the directory),
run one after the other, so the later writer also writes later in wall time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
T = 1_700_000_000.0  # an engine's wall clock

# argv: [client_index, then steps: "R:<engine time>:<running>:<waiting>:<wave>:<wave running>" (a report),
#        "D" (the rank died), "I" (the rank became ready)]
WRITER = textwrap.dedent("""
    import sys
    import anyio
    from asyncdp import messages as m
    from asyncdp.api.metrics import Metrics
    from asyncdp.apiserver.client import ClientConfig, DPClient

    async def main():
        cfg = ClientConfig(client_index=int(sys.argv[1]), client_count=2, managed_ranks=(0,), dp_size=2,
                           model_name="m", max_model_len=64, is_moe=True)
        c = DPClient(cfg, None, metrics=Metrics(model_name="m"))
        for step in sys.argv[2:]:
            if step == "D":
                c._events.on_dead(0, "its link closed")
            elif step == "I":
                c.metrics.init_engine(0, is_moe=True)
            else:
                _, at, running, waiting, wave, wave_running = step.split(":")
                c._events.on_outputs(m.EngineOutputs(
                    dp_rank=0, outputs=[], finished_request_ids=[], timestamp=float(at),
                    scheduler_stats=m.SchedulerStats(num_running=int(running), num_waiting=int(waiting),
                                                     kv_cache_usage=int(running) / 100, wave=int(wave),
                                                     wave_running=wave_running == "1")))

    anyio.run(main)
""")
RENDERER = "from asyncdp.api.metrics import Metrics; print(Metrics(model_name='m').render().decode())"


def run(code: str, *args: str, multiproc_dir: Path) -> str:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def gauges(multiproc_dir: Path) -> dict[str, float]:
    """Engine 0's state gauges as one scrape shows them."""
    out = {}
    for family in text_string_to_metric_families(run(RENDERER, multiproc_dir=multiproc_dir)):
        for s in family.samples:
            if s.labels.get("engine") == "0" and s.name in (
                    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                    "asyncdp:dp_wave", "asyncdp:dp_running"):
                out[s.name] = s.value
    return out


def report(at: float, running: int, waiting: int = 0, wave: int = 0, wave_running: bool = False) -> str:
    return f"R:{at}:{running}:{waiting}:{wave}:{int(wave_running)}"


def test_a_stale_report_applied_late_by_another_api_process_does_not_win(tmp_path: Path) -> None:
    # API process 0 got the rank's newest report (its queue emptied, the wave ended) and applied it first; process
    # 1 applies an older one (mid-load) only now, its event loop having been busy.
    run(WRITER, "0", report(T + 1.0, running=0, waiting=0, wave=3), multiproc_dir=tmp_path)
    run(WRITER, "1", report(T, running=14, waiting=2, wave=2, wave_running=True), multiproc_dir=tmp_path)
    assert gauges(tmp_path) == {"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0,
                                "vllm:kv_cache_usage_perc": 0, "asyncdp:dp_wave": 3, "asyncdp:dp_running": 0}


def test_the_newest_report_wins_whichever_process_applies_it(tmp_path: Path) -> None:
    run(WRITER, "0", report(T, running=3), report(T + 2.0, running=5), multiproc_dir=tmp_path)
    run(WRITER, "1", report(T + 1.0, running=4), multiproc_dir=tmp_path)
    assert gauges(tmp_path)["vllm:num_requests_running"] == 5
    run(WRITER, "1", report(T + 3.0, running=1), multiproc_dir=tmp_path)
    assert gauges(tmp_path)["vllm:num_requests_running"] == 1


def test_a_dead_rank_reads_zero_and_a_late_ready_does_not_hide_a_report(tmp_path: Path) -> None:
    run(WRITER, "0", report(T + 5.0, running=7, wave=4, wave_running=True), "D", multiproc_dir=tmp_path)
    run(WRITER, "1", report(T, running=2), "D", multiproc_dir=tmp_path)
    assert gauges(tmp_path) == {"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0,
                                "vllm:kv_cache_usage_perc": 0, "asyncdp:dp_wave": 0, "asyncdp:dp_running": 0}
    # the rank comes back: its reports win over the zeros, and an API process that sees it ready later does not
    # zero what the rank reported
    run(WRITER, "0", "I", report(T + 60.0, running=3, wave=1, wave_running=True), multiproc_dir=tmp_path)
    run(WRITER, "1", "I", multiproc_dir=tmp_path)
    assert gauges(tmp_path)["vllm:num_requests_running"] == 3
    assert gauges(tmp_path)["asyncdp:dp_running"] == 1
