import math
import statistics
from collections import Counter

import pytest

from asyncdp.bench.arrivals import Burst, Closed, Dispatch, Ladder, RelativeLadder, Trace
from asyncdp.bench.materialise import Materialiser, ideal_hits
from asyncdp.bench.records import (
    BLOCK_SIZE,
    answer_segment_id,
    decode_workload,
    encode_workload,
    read_workload,
    write_workload,
)
from asyncdp.bench.workloads import WORKLOADS, build
from asyncdp.errors import ConfigError

QUICK = ["w1", "w2", "w3", "w3@ray_scaling", "w4", "w4@pressure", "w5", "w6", "w7", "w8", "w8@pure_long",
         "w8@32k_in_1_out", "w9", "w9@onoff", "w10", "w10@conversation"]


def test_registry_has_the_ten_workloads():
    assert list(WORKLOADS) == [f"w{i}" for i in range(1, 11)]


@pytest.mark.parametrize("spec", QUICK)
def test_same_seed_gives_the_same_bytes_and_another_seed_other_bytes(spec):
    first = encode_workload(build(spec, "quick", 1))
    assert encode_workload(build(spec, "quick", 1)) == first
    assert encode_workload(build(spec, "quick", 2)) != first


@pytest.mark.parametrize("spec", QUICK)
def test_quick_scale_stays_small_and_consistent(spec):
    w = build(spec, "quick", 1)
    assert w.dp_size == 4 and w.scale == "quick"
    assert 0.0 <= w.ideal_hit_rate < 1.0
    limit = 11_000 if spec == "w9" else 600  # W9: closed-loop chains long enough for 60 s
    assert 50 <= len(w.records) <= limit
    assert all(r.input_length <= 65_536 for r in w.records)


def test_w1_groups_share_exactly_their_system_prompt():
    w = build("w1", "quick", 1)
    assert len(w.records) == 16 * 8 and isinstance(w.arrival, Burst)
    assert {r.input_length for r in w.records} == {1024 + 1 + 64} and {r.output_length for r in w.records} == {32}
    mat = Materialiser(w.seed)
    by_group: dict[str, list[list[int]]] = {}
    for r in w.records:
        by_group.setdefault(r.group, []).append(mat.prompt(r))
    assert len(by_group) == 16
    systems = set()
    for prompts in by_group.values():
        assert len({tuple(p[:1024]) for p in prompts}) == 1
        assert len({tuple(p[1025:]) for p in prompts}) == len(prompts)
        systems.add(tuple(prompts[0][:16]))
    assert len(systems) == 16
    assert w.ideal_hit_rate == pytest.approx(7 * 1024 / (8 * 1089), abs=1e-6)


def test_w1_full_ideal_hit_rate_is_the_spec_figure():
    w = build("w1", "full", 1)
    assert len(w.records) == 1024 and w.dp_size == 8
    assert w.ideal_hit_rate == pytest.approx(0.882, abs=0.0005)


def test_w1_options_shuffle_zipf_key_and_ranges():
    ordered = build("w1", "quick", 1, {"ordered": True})
    assert [r.group for r in ordered.records[:8]] == ["g0"] * 8
    assert [r.group for r in build("w1", "quick", 1).records[:8]] != ["g0"] * 8
    zipf = build("w1", "quick", 1, {"zipf_alpha": 1.2})
    top = Counter(r.group for r in zipf.records).most_common(1)[0][1]
    assert len(zipf.records) == 128 and top > 128 / 16 * 2
    keyed = build("w1", "quick", 1, {"send_routing_key": "true"})
    assert all(r.routing_key == f"w1-1_{r.group[1:]}" for r in keyed.records)
    ranged = build("w1", "quick", 1, {"range_ratio": 0.5})
    assert min(r.output_length for r in ranged.records) >= 16 and len({r.input_length for r in ranged.records}) > 10
    ladder = build("w1", "quick", 1, {"arrival": "ladder"})
    assert isinstance(ladder.arrival, RelativeLadder) and sum(ladder.arrival.requests_per_rung) == 128


def test_w2_draws_prompts_from_groups_with_a_73_percent_working_set():
    w = build("w2", "quick", 1)
    assert len(w.records) == 600 and isinstance(w.arrival, RelativeLadder) and len(w.arrival.fractions) == 3
    assert {r.input_length for r in w.records} == {720} and {r.output_length for r in w.records} == {100}
    assert all(r.segments[0] == (f"w2/ctx/{r.group[1:]}", 600) for r in w.records)
    working_set = 20 * (600 + 5 * 120)
    assert working_set / (w.dp_size * w.kv_blocks_per_rank * BLOCK_SIZE) == pytest.approx(0.73, abs=0.01)


def test_w2_full_runs_the_qps_stages_after_a_warm_up():
    w = build("w2", "full", 1)
    assert isinstance(w.arrival, Ladder) and w.arrival.rungs[0] == (15.0, 50.0) and len(w.arrival.rungs) == 17
    assert w.warmup_ms == 50_000.0 and w.kv_blocks_per_rank == 19_208
    groups = len({r.group for r in w.records})
    assert groups == 150 and {r.input_length for r in w.records} == {7200}
    assert groups * (6000 + 5 * 1200) / (w.dp_size * w.kv_blocks_per_rank * BLOCK_SIZE) == pytest.approx(0.73, abs=0.01)
    assert len(w.records) == pytest.approx(750 + 30 * sum((3, 10, 15, 20, 22, 25, 30, 35, 40, 43, 46, 49, 52, 55,
                                                            57, 60)), rel=0.03)


def test_w3_prefixes_repeat_with_unique_suffixes_and_ray_scaling_grows_with_dp():
    w = build("w3", "quick", 1)
    counts = Counter(r.segments[0] for r in w.records)
    assert len(counts) == 10 and set(counts.values()) == {20}
    assert len({r.segments[1] for r in w.records}) == 200
    ray = build("w3@ray_scaling", "quick", 1, {"dp": 16})
    assert ray.dp_size == 16 and len(ray.records) == 16 * 16 * 8 and ray.kv_blocks_per_rank == 2048
    assert {r.input_length for r in ray.records} == {640}


def test_w4_each_round_extends_the_previous_prompt_and_answer():
    w = build("w4", "quick", 1)
    assert len(w.records) == 32 * 4 and isinstance(w.arrival, Dispatch) and w.arrival.max_parallel == 16
    mat = Materialiser(w.seed)
    for r in w.records:
        assert r.routing_key == f"client{r.client}"
        if r.turn == 0:
            assert r.after_req is None and r.input_length == 256
            continue
        prev = w.records[r.after_req]
        assert (prev.client, prev.turn) == (r.client, r.turn - 1)
        assert r.t_arrival_ms is None
        assert mat.prompt(r)[:prev.input_length + 32] == mat.prompt(prev) + mat.answer(prev)
        assert r.input_length == prev.input_length + 32 + 256


def test_w4_full_ideal_hit_rate_is_about_69_percent_and_pressure_cuts_kv():
    w = build("w4", "full", 1)
    assert len(w.records) == 256 * 5 and w.sweep_rates_rps[0] == 16.0 and w.sweep_rates_rps[-1] == 1.0
    assert w.ideal_hit_rate == pytest.approx(0.69, abs=0.01)
    pressure = build("w4@pressure", "full", 1)
    working_set_blocks = 256 * 5 * (512 + 64) / BLOCK_SIZE
    assert working_set_blocks / (8 * pressure.kv_blocks_per_rank) == pytest.approx(1.5, rel=0.01)


def test_w4_rounds_hit_their_history_in_the_ideal_cache():
    w = build("w4", "quick", 1)
    for r, hit in zip(w.records, ideal_hits(w.records), strict=True):
        expected = 0 if r.turn == 0 else (r.input_length - 256 - 1) // BLOCK_SIZE * BLOCK_SIZE
        assert hit == expected


def test_w5_users_join_in_turn_and_grow_their_conversation():
    w = build("w5", "quick", 1)
    assert len(w.records) == 16 * 4 and isinstance(w.arrival, Trace)
    times = [r.t_arrival_ms for r in w.records]
    assert times == sorted(times)
    gap_ms = 16 / 2.0 * 1000.0
    firsts = {r.client: r for r in w.records if r.turn == 0}
    assert [firsts[u].t_arrival_ms for u in range(3)] == [0.0, gap_ms * 3 / 16, 2 * gap_ms * 3 / 16]
    for r in w.records:
        assert r.segments[0] == ("w5/system", 256) and r.segments[1] == (f"w5/history/{r.client}", 1024)
        assert r.routing_key == f"user{r.client}"
        if r.turn:
            prev = w.records[r.after_req]
            assert r.segments[:len(prev.segments)] == prev.segments
            assert r.segments[len(prev.segments)] == (answer_segment_id(prev.req_id), 32)
            assert r.t_arrival_ms == pytest.approx(prev.t_arrival_ms + gap_ms)


def test_w6_lengths_follow_the_clipped_lognormals_behind_a_shared_template():
    w = build("w6", "full", 1)
    assert len(w.records) == 10_000
    ins = [r.input_length for r in w.records]
    outs = [r.output_length for r in w.records]
    assert min(ins) >= 33 and max(ins) <= 8192 and min(outs) >= 4 and max(outs) <= 2048
    assert statistics.median(ins) == pytest.approx(256, rel=0.08)
    assert statistics.median(outs) == pytest.approx(192, rel=0.08)
    assert all(r.segments[0] == ("w6/template", 32) for r in w.records)
    assert len({r.segments[1][0] for r in w.records}) == 10_000


def test_w7_documents_follow_rho_and_zipf():
    w = build("w7", "quick", 1)
    n_docs = round(0.73 * 4 * 2048 * 16 / 5000)
    docs = Counter(r.group for r in w.records)
    assert len(docs) <= n_docs and w.notes == f"{n_docs} documents"
    assert docs.most_common(1)[0][1] / len(w.records) > 0.15
    assert all(2000 + 50 <= r.input_length <= 8000 + 200 and 64 <= r.output_length <= 256 for r in w.records)
    assert build("w7", "quick", 1, {"rho": 1.5}).notes == f"{round(1.5 * 4 * 2048 * 16 / 5000)} documents"
    full = build("w7", "full", 1)
    assert full.notes == "131 documents" and full.kv_blocks_per_rank == 28_000
    top_share = Counter(r.group for r in full.records).most_common(1)[0][1] / len(full.records)
    assert top_share == pytest.approx(0.18, abs=0.03)


def test_w8_mixes_a_few_long_single_token_prompts_into_short_traffic():
    w = build("w8", "quick", 1)
    long = [r for r in w.records if r.group == "long"]
    assert all(r.input_length == 16_000 and r.output_length == 1 for r in long)
    assert len(long) == 10 and len(w.records) == 500
    assert w.max_model_len == 65_536 and isinstance(w.arrival, RelativeLadder) and w.arrival.fractions == (0.7,)
    assert build("w8", "full", 1).records and max(r.input_length for r in build("w8", "full", 1).records) == 55_000
    assert {r.input_length for r in build("w8@32k_in_1_out", "quick", 1).records} == {16_000}
    pure = build("w8@pure_long", "quick", 1).records
    assert all(r.group == "long" and 1000 <= r.input_length <= 16_000 for r in pure)


def test_w9_clients_resend_after_each_answer_with_equal_lengths():
    w = build("w9", "quick", 1)
    assert isinstance(w.arrival, Closed) and w.arrival.concurrency == 64 and w.duration_s == 60.0
    assert {(r.input_length, r.output_length) for r in w.records} == {(128, 128)}
    per_client = Counter(r.client for r in w.records)
    assert len(per_client) == 64 and set(per_client.values()) == {math.ceil(60 / (128 * 0.003))}
    for r in w.records:
        assert r.t_arrival_ms is None
        if r.turn:
            assert (w.records[r.after_req].client, w.records[r.after_req].turn) == (r.client, r.turn - 1)
    assert w.ideal_hit_rate == 0.0


def test_w9_onoff_sends_bursts_within_100_ms_every_30_s():
    w = build("w9@onoff", "quick", 1)
    starts = Counter(int(r.t_arrival_ms // 30_000) for r in w.records)
    assert starts == {0: 100, 1: 100}
    assert all(r.t_arrival_ms % 30_000 < 100 for r in w.records)


def test_w10_sessions_grow_or_restart_their_id_chains():
    w = build("w10", "quick", 1)
    assert len(w.records) == 500
    previous = {}
    restarts = extensions = 0
    for r in w.records:
        assert len(r.hash_ids) == math.ceil(r.input_length / 512)
        assert [length for _, length in r.segments[:-1]] == [512] * (len(r.segments) - 1)
        if r.turn:
            prev = w.records[r.after_req]
            assert prev.client == r.client and r.t_arrival_ms is None and r.think_ms > 0
            if r.hash_ids[:len(prev.hash_ids)] == prev.hash_ids:
                extensions += 1
                assert max(r.hash_ids[len(prev.hash_ids):]) > max(prev.hash_ids)
            else:
                restarts += 1
        previous[r.client] = r
    assert restarts > extensions > 0
    assert all(2 <= r.output_length <= 32 for r in w.records)


@pytest.mark.parametrize(("preset", "target"), [("toolagent", 0.59), ("conversation", 0.40)])
def test_w10_quick_presets_land_near_their_reuse_target(preset, target):
    rates = [build(f"w10@{preset}", "quick", seed).ideal_hit_rate for seed in (1, 2, 3)]
    assert statistics.mean(rates) == pytest.approx(target, abs=0.04)


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "target"), [("toolagent", 0.59), ("conversation", 0.40)])
def test_w10_full_presets_meet_their_reuse_target(preset, target):
    for seed in (1, 2, 3):
        assert build(f"w10@{preset}", "full", seed).ideal_hit_rate == pytest.approx(target, abs=0.02)


def test_w10_schedule_replay_fixes_every_timestamp():
    w = build("w10", "quick", 1, {"replay": "schedule"})
    times = [r.t_arrival_ms for r in w.records]
    assert None not in times and times == sorted(times)
    assert all(r.after_req is None for r in w.records)


def test_w2_full_stages_option_runs_the_warm_up_and_the_chosen_stages_only():
    w = build("w2", "full", 1, {"stages": "20,22,25"})
    assert isinstance(w.arrival, Ladder)
    assert w.arrival.rungs == ((15.0, 50.0), (20.0, 30.0), (22.0, 30.0), (25.0, 30.0))
    assert len(w.records) == pytest.approx(750 + 30 * (20 + 22 + 25), rel=0.05)
    assert w.options["stages"] == [20.0, 22.0, 25.0]
    # the warm-up and the stages draw from the same streams as the whole sweep: its first stage is the same
    whole = build("w2", "full", 1)
    warm = [r for r in whole.records if r.t_arrival_ms is not None and r.t_arrival_ms < 50_000.0]
    assert [r.segments for r in w.records[:len(warm)]] == [r.segments for r in warm]


@pytest.mark.parametrize(("spec", "scale", "options", "message"), [
    ("w11", "quick", {}, "unknown workload"),
    ("w1", "huge", {}, "no scale 'huge'"),
    ("w4", "dp32", {}, "no scale 'dp32'"),
    ("w1", "quick", {"grups": 3}, "unknown option.*grups"),
    ("w1", "quick", {"groups": "many"}, "groups='many' is not a valid int"),
    ("w1", "quick", {"arrival": "trickle"}, "arrival='trickle' must be one of"),
    ("w3@nope", "quick", {}, "preset='nope'"),
    ("w3@ray_scaling", "quick", {"preset": "default"}, "preset given twice"),
    ("w2", "full", {"stages": "20,0"}, "stages='20,0' is not a valid"),
    ("w2", "full", {"stages": "fast"}, "stages='fast' is not a valid"),
    ("w2", "quick", {"stages": "20"}, "option stages does nothing here"),
])
def test_bad_workload_arguments_are_config_errors(spec, scale, options, message):
    with pytest.raises(ConfigError, match=message):
        build(spec, scale, 1, options)


def test_scale_out_presets_run_at_dp32():
    assert build("w1", "dp32", 1).dp_size == 32 and len(build("w1", "dp32", 1).records) == 256 * 16
    assert build("w3@ray_scaling", "dp32", 1).dp_size == 32


@pytest.mark.parametrize("spec", ["w1", "w2", "w4", "w5", "w9", "w9@onoff", "w10"])
def test_every_arrival_kind_survives_the_workload_file(spec, tmp_path):
    w = build(spec, "quick", 1)
    write_workload(w, tmp_path / "w.jsonl")
    assert read_workload(tmp_path / "w.jsonl") == w


def test_the_w2_stage_ladder_survives_the_workload_file():
    w = build("w2", "full", 1, {"stage_s": 2.0})
    assert decode_workload(encode_workload(w)) == w
