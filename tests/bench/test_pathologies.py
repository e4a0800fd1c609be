"""The §8 pathologies of spec routing-bench, reproduced on small quick-scale scenarios for the baselines that
have them, and absent under asyncdp's own policy (the detectors of asyncdp/bench/pathology.py, gate G5)."""

from __future__ import annotations

import pytest

from asyncdp.bench.pathology import DETECTORS, findings, g5, signals
from asyncdp.bench.profiles import load_profile
from asyncdp.bench.records import resolve
from asyncdp.bench.simulate import ClusterSpec, RequestEvent, RunLog, simulate
from asyncdp.bench.workloads import build

THRESHOLD = {d.name: d.threshold for d in DETECTORS}


def run_signals(workload: str, policy: str, options: dict[str, object], r_sat: float | None = None
                ) -> dict[str, float]:
    w = resolve(build(workload, "quick", 1, options), 1.0, r_sat)
    log = simulate(w, policy, 1, ClusterSpec(w.dp_size, load_profile("gpu_8b")))
    return signals(log, w.ideal_hit_rate)


W9_SMALL = {"clients": 16, "length": 64, "duration_s": 2.0, "requests_per_client": 2}


def test_without_load_guards_the_first_burst_goes_to_rank_0_but_asyncdp_spreads_it():
    # sgl-project/sglang#15473 (every load reads 0, the first worker wins). vllm_legacy@no_initial_counts does
    # not reproduce the cold start here: the coordinator's first snapshot reaches the clients before the burst.
    unguarded = run_signals("w9", "sglang_cache_aware@guard_never", W9_SMALL)
    assert unguarded["cold_start"] == 1.0
    assert run_signals("w9", "asyncdp", W9_SMALL)["cold_start"] <= THRESHOLD["cold_start"]


W8_SMALL = {"num_requests": 120, "long_fraction": 0.05, "long_len": 8000}
W8_R_SAT = 40.0


def test_request_count_balance_ignores_tokens_under_vllm_but_not_under_asyncdp():
    vllm = run_signals("w8", "vllm", W8_SMALL, W8_R_SAT)
    assert vllm["token_skew"] > THRESHOLD["token_skew"]
    assert run_signals("w8", "asyncdp", W8_SMALL, W8_R_SAT)["token_skew"] <= THRESHOLD["token_skew"]


W4_SMALL = {"clients": 8, "rounds": 4, "request_len": 64, "output_len": 8, "max_parallel": 4}


def test_tie_rotation_breaks_multi_turn_stickiness_but_asyncdp_keeps_it():
    assert run_signals("w4", "vllm", W4_SMALL)["sticky_loss"] > THRESHOLD["sticky_loss"]
    assert run_signals("w4", "asyncdp", W4_SMALL)["sticky_loss"] <= THRESHOLD["sticky_loss"]


W1_SMALL = {"groups": 12, "prompts_per_group": 6, "system_len": 256, "question_len": 32, "output_len": 8}


def test_without_load_guards_shared_prefixes_pile_onto_one_rank_but_asyncdp_bounds_it():
    piled = run_signals("w1", "sglang_cache_aware@guard_never", W1_SMALL)
    assert piled["request_skew"] > THRESHOLD["request_skew"]
    mine = run_signals("w1", "asyncdp", W1_SMALL)
    assert mine["request_skew"] <= THRESHOLD["request_skew"]
    assert mine["miss_share"] <= THRESHOLD["miss_share"]


def ev(req_id: int, rank: int, t_send: float, t_last: float, prompt: int = 100, cached: int = 0,
       turn: int = 0) -> RequestEvent:
    return RequestEvent(req_id, 0, rank, t_send, prompt, True, t_send + 0.01, t_last, 2, cached, turn=turn)


def test_the_hotspot_signal_is_the_time_averaged_busiest_rank_over_the_mean():
    log = RunLog(2, [ev(0, 0, 0.0, 5.0), ev(1, 0, 0.0, 5.0), ev(2, 0, 0.0, 5.0), ev(3, 1, 0.0, 5.0),
                     ev(4, 1, 2.5, 4.5)])
    # samples at 0..4 s: [3,1] three times (ratio 1.5) then [3,2] twice (ratio 1.2); at 5 s nothing is left
    assert signals(log)["hotspot"] == pytest.approx((3 * 1.5 + 2 * 1.2) / 5)


def test_g5_fails_when_a_detector_of_the_workload_fires_and_names_it():
    run = {"workload": "w9", "policy": "asyncdp", "seed": 1, "detectors": {"cold_start": 0.9}}
    assert [d.name for d, _ in findings(run)] == ["cold_start"]
    gate, verdict, detail = g5([run], "asyncdp")
    assert (gate, verdict) == ("G5", "FAIL") and "cold_start" in detail
    ok = {**run, "detectors": {"cold_start": 0.25}}
    assert g5([ok], "asyncdp")[1] == "PASS"
    assert g5([{**run, "workload": "w1"}], "asyncdp")[1] == "PASS"  # cold_start is W9's detector only
