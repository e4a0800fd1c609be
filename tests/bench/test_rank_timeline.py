"""simulate's probe and bench/rank_timeline.py: each rank's scheduler read at a fixed virtual period, and the
per-rank summary that says which rank ran out of KV and when."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from asyncdp.bench.profiles import load_profile
from asyncdp.bench.records import resolve
from asyncdp.bench.simulate import ClusterSpec, RequestEvent, RunLog, simulate
from asyncdp.bench.workloads import build
from asyncdp.errors import ConfigError
from bench import rank_timeline as rt

ROOT = Path(__file__).resolve().parents[2]
SPEC = ClusterSpec(dp_size=2, profile=load_profile("gpu_8b"))
# W2 at the quick scale (600 + 120 prompt tokens, 100 output: up to 52 blocks of 16 a request) on 2 ranks with 60
# blocks each and 20 requests a second: running requests outgrow the cache and preempt.
W2_SMALL_KV = {"groups": 4, "users": 2}
PROBE_EVERY_S = 0.01  # virtual time


def _small_kv_w2():
    workload = build("w2", "quick", 1, W2_SMALL_KV)
    return resolve(msgspec.structs.replace(workload, kv_blocks_per_rank=60, dp_size=2), 1.0, 20.0)


@pytest.fixture(scope="module")
def probed_run() -> tuple[RunLog, list[rt.Sample]]:
    """One probed run of the small-KV W2 for the two tests that read it (7 s of simulation each time here); neither
    changes it."""
    return rt.run_probed(_small_kv_w2(), "round_robin", 1, SPEC, PROBE_EVERY_S)


def test_the_probe_reads_every_rank_at_each_period_until_the_run_ends(probed_run):
    log, seen = probed_run
    assert seen, "the probe never ran"
    assert [len(row) for _, row in seen] == [2] * len(seen)
    assert [t for t, _ in seen] == pytest.approx([PROBE_EVERY_S * (k + 1) for k in range(len(seen))])
    last_done = max(e.t_last_s for e in log.events if e.t_last_s is not None)
    assert seen[-1][0] <= last_done + PROBE_EVERY_S  # it stops with the run


def test_a_probe_period_that_is_not_positive_is_refused():
    with pytest.raises(ConfigError, match="probe_every_s"):
        simulate(_small_kv_w2(), "round_robin", 1, SPEC, probe=lambda t, c: None, probe_every_s=0.0)


def test_the_summary_of_a_probed_run_counts_every_preemption_on_its_rank(probed_run):
    log, samples = probed_run
    assert log.preemptions > 0, "the set-up must preempt"
    rows = rt.per_rank_summary(log, samples, 0.999)
    assert sum(r["preemptions"] for r in rows) == log.preemptions
    last = max(e.turn for e in log.events if e.measured)
    assert sum(r["last_rung_requests"] for r in rows) == sum(
        1 for e in log.events if e.measured and e.turn == last and e.t_first_s is not None)


def test_the_summary_reads_first_full_kv_first_preemption_and_the_last_rungs_ttft_per_rank():
    def ev(req_id, rank, send, first, turn):
        return RequestEvent(req_id=req_id, router=0, rank=rank, t_send_s=send, prompt_tokens=10, measured=True,
                            t_first_s=first, t_last_s=first, output_tokens=1, turn=turn)

    log = RunLog(dp_size=2, preemptions=3, events=[
        ev(0, 0, 0.0, 0.5, 0), ev(1, 0, 1.0, 1.2, 1), ev(2, 0, 2.0, 2.4, 1), ev(3, 1, 2.0, 2.1, 1)])
    samples = [(1.0, [(1, 0, 0.50, 0), (1, 0, 0.2, 0)]),
               (2.0, [(2, 1, 1.00, 0), (1, 0, 0.3, 0)]),
               (3.0, [(1, 0, 0.90, 3), (0, 0, 0.0, 0)])]
    rows = rt.per_rank_summary(log, samples, 0.999)
    assert rows[0] == {"rank": 0, "last_rung_requests": 2, "last_rung_ttft_mean_s": pytest.approx(0.3),
                       "kv_full_at_s": 2.0, "first_preemption_at_s": 3.0, "preemptions": 3}
    assert rows[1]["last_rung_requests"] == 1 and rows[1]["last_rung_ttft_mean_s"] == pytest.approx(0.1)
    assert math.isnan(rows[1]["kv_full_at_s"]) and math.isnan(rows[1]["first_preemption_at_s"])
    assert rows[1]["preemptions"] == 0


def test_the_script_prints_a_timeline_and_a_summary_per_policy():
    out = subprocess.run([sys.executable, "bench/rank_timeline.py", "--workload", "w1", "--scale", "quick",
                          "--option", "groups=2", "--option", "prompts_per_group=4", "--policies",
                          "round_robin,asyncdp", "--every", "0.5", "--print-every", "0.5"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    for policy in ("round_robin", "asyncdp"):
        assert f"{policy}: running/waiting KV usage per rank" in out
        assert f"{policy}: per rank (preemptions over the run:" in out
    assert "rank 3" in out  # w1 quick is dp 4
