"""The TTFT floor (asyncdp/bench/metrics.py ``ttft_floors``) and its use in gate G1's verdict text."""

from __future__ import annotations

import pytest

from asyncdp.bench.metrics import METRIC_KEYS, ttft_floors
from asyncdp.bench.profiles import Profile
from asyncdp.bench.records import Record
from asyncdp.bench.report import gates

PROFILE = Profile("t", a_ms=5.0, b_ms_per_token=0.1, c_ms_per_seq=0.0, d_ms_per_kv_token=0.01, kv_blocks=100,
                  max_num_seqs=8, max_num_batched_tokens=256)


def _rec(req_id: int, *segments: tuple[str, int]) -> Record:
    return Record(req_id=req_id, t_arrival_ms=0.0, client=0, turn=0, after_req=None, think_ms=0.0,
                  segments=segments, input_length=sum(n for _, n in segments), output_length=4, group="g")


def test_a_cold_prompt_pays_its_whole_prefill_in_chunks_and_a_repeated_prefix_only_its_new_tokens():
    floors = ttft_floors([_rec(0, ("sys", 320), ("q0", 80)), _rec(1, ("sys", 320), ("q1", 80))], PROFILE, 16)
    # request 0: 400 uncached tokens = 2 chunks of <= 256: 2·5 + 0.1·400 + 0.01·400 = 54 ms
    assert floors[0] == pytest.approx(0.054)
    # request 1: the ideal cache holds the 320-token system segment: 80 uncached, 1 step: 5 + 8 + 4 = 17 ms
    assert floors[1] == pytest.approx(0.017)


def _run(workload: str, policy: str, floor: float, **metrics: float) -> dict:
    return {"workload": workload, "policy": policy, "seed": 1, "dp": 8, "ttft_floor_p99_s": floor,
            "metrics": {**dict.fromkeys(METRIC_KEYS, 1.0), **metrics}}


def test_g1_says_when_its_limit_is_under_the_workloads_ttft_floor_and_still_fails():
    runs = [_run("w5", "vllm", 0.3, ttft_p99_s=0.4), _run("w5", "asyncdp", 0.3, ttft_p99_s=0.3)]
    verdict, detail = {g: (v, d) for g, v, d in gates(runs)}["G1"]
    assert verdict == "FAIL"  # 0.3 > 0.5 · 0.4: the gate is not relaxed
    assert "under the workload's TTFT floor p99 0.3 s" in detail
    runs = [_run("w5", "vllm", 0.1, ttft_p99_s=0.4), _run("w5", "asyncdp", 0.1, ttft_p99_s=0.3)]
    assert "floor" not in {g: d for g, _, d in gates(runs)}["G1"]
