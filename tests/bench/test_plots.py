"""``bench routing --plots`` and ``--csv``: every plot of spec §6 as a valid PNG, the CSV with the JSON's
values, and the pure data functions behind the plots (load samples, heatmap policies, offered rates per rung)."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys

import pytest

from asyncdp.bench import pathology
from asyncdp.bench.arrivals import Ladder
from asyncdp.bench.command import _rungs
from asyncdp.bench.metrics import METRIC_KEYS
from asyncdp.bench.pathology import LoadSamples, outstanding_samples
from asyncdp.bench.plots import heatmap_period_s, heatmap_policies, load_points, write_csv, write_plots
from asyncdp.bench.records import Record, Workload, resolve
from asyncdp.bench.simulate import RequestEvent, RunLog, expand_sweep
from asyncdp.bench.workloads import build
from asyncdp.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: a 3-rung relative ladder (0.5, 0.85, 1.2 × R_sat) of 10 tiny requests a rung on 2 ranks, R_sat given
W2_TINY = {"groups": "2", "users": "2", "requests_per_rung": "10", "context_len": "64", "question_len": "16",
           "output_len": "4"}
W2_ARGS = ["--workload", "w2", "--dp", "2", "--r-sat", "20",
           *(arg for k, v in W2_TINY.items() for arg in ("--option", f"{k}={v}"))]


def assert_png(path):
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    pixels = imread(path)
    height, width = pixels.shape[:2]
    assert 300 <= height <= 2000 and 400 <= width <= 2000, (path, pixels.shape)
    assert pixels.shape[2] in (3, 4)
    assert pixels.min() < pixels.max(), f"{path} is one flat colour"


def ev(req_id, rank, send, last, *, measured=True, error=None):
    return RequestEvent(req_id=req_id, router=0, rank=rank, t_send_s=send, prompt_tokens=10, measured=measured,
                        t_first_s=None if last is None else min(send + 0.1, last), t_last_s=last,
                        output_tokens=2, error=error)


def test_routing_run_with_plots_and_csv_writes_every_plot_as_a_png_and_one_csv_row_per_run(tmp_path, capsys):
    plots, out_csv, out_json = tmp_path / "plots", tmp_path / "runs.csv", tmp_path / "runs.json"
    assert main(["bench", "routing", *W2_ARGS, "--policies", "vllm,round_robin,asyncdp",
                 "--json", str(out_json), "--csv", str(out_csv), "--plots", str(plots)]) == 0
    assert sorted(p.name for p in plots.iterdir()) == [
        "goodput_vs_rate_w2.png", "hit_rate_vs_rung_w2.png", "load_heatmap_w2.png", "ttft_cdf_w2.png"]
    for png in plots.iterdir():
        assert_png(png)
    assert "4 plots written" in capsys.readouterr().err
    runs = json.loads(out_json.read_text())["runs"]
    with out_csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(runs) == 12 and len(rows) == len(runs)  # 3 policies × (whole run + 3 rungs)
    for row, run in zip(rows, runs, strict=True):
        assert (row["workload"], row["policy"], int(row["seed"]), int(row["dp"]), row["variant"]) == (
            run["workload"], run["policy"], run["seed"], run["dp"], "")
        assert {k: float(row[k]) for k in METRIC_KEYS} == run["metrics"]
        assert float(row["ttft_floor_p99_s"]) == run["ttft_floor_p99_s"]


def test_outstanding_samples_count_each_ranks_requests_from_send_to_last_token_every_second():
    log = RunLog(dp_size=2, events=[
        ev(0, 0, 0.0, 2.5), ev(1, 1, 0.5, 1.2), ev(2, 1, 1.5, 3.0), ev(3, 1, 1.6, 2.9),
        ev(4, 0, 0.0, 4.0, measured=False),  # warm-up: not counted, and not stretching the time axis
        ev(5, 0, 0.2, 2.0, error="boom"), ev(6, 1, 0.2, None)])  # failed, unfinished: not counted
    assert outstanding_samples(log) == LoadSamples(times_s=(0.0, 1.0, 2.0, 3.0),
                                                   per_rank=((1, 1, 1, 0), (0, 1, 2, 0)))
    finer = outstanding_samples(log, period_s=0.5)
    assert finer.times_s == (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
    assert finer.per_rank == ((1, 1, 1, 1, 1, 0, 0), (0, 1, 1, 1, 2, 2, 0))


def test_outstanding_samples_of_a_log_without_completed_requests_are_empty():
    log = RunLog(dp_size=3, events=[ev(0, 0, 0.0, None)])
    assert outstanding_samples(log) == LoadSamples((), ((), (), ()))


def test_the_hotspot_detector_averages_busiest_over_mean_of_the_samples_with_2_dp_in_flight():
    rng = random.Random(7)
    dp = 3
    events = []
    for k in range(300):
        send = round(rng.uniform(0, 40), 3)
        events.append(ev(k, rng.choice([0, 0, 1, 2]), send, send + round(rng.uniform(0.1, 6), 3)))
    log = RunLog(dp_size=dp, events=events)
    samples = outstanding_samples(log)
    ratios = []
    for column in zip(*samples.per_rank, strict=True):
        if sum(column) >= 2 * dp:
            ratios.append(max(column) / (sum(column) / dp))
    assert len(ratios) > 30
    assert sum(ratios) / len(ratios) == pytest.approx(pathology.hotspot(log), rel=1e-12)


def test_heatmap_period_is_the_detectors_second_unless_the_run_is_too_short_for_40_samples():
    assert heatmap_period_s([RunLog(2, [ev(0, 0, 0.0, 100.0)])]) == 1.0
    assert heatmap_period_s([RunLog(2, [ev(0, 0, 0.0, 0.9)]), RunLog(2, [ev(0, 1, 0.0, 0.5)])]) == 0.02
    assert heatmap_period_s([RunLog(2, [])]) == 1.0


def run_entry(workload, policy, seed, ttft_mean_s):
    return {"workload": workload, "policy": policy, "seed": seed, "dp": 4,
            "metrics": {k: (ttft_mean_s if k == "ttft_mean_s" else 0.0) for k in METRIC_KEYS}}


def test_heatmap_shows_vllm_the_lowest_mean_ttft_baseline_and_the_candidate():
    runs = [run_entry("w1", "vllm", 1, 1.0), run_entry("w1", "round_robin", 1, 0.5),
            run_entry("w1", "round_robin", 2, 0.7),  # mean 0.6: worse than random's 0.55 despite seed 1
            run_entry("w1", "random", 1, 0.55), run_entry("w1", "asyncdp", 1, 0.1),
            run_entry("w1", "asyncdp@fast", 1, 0.05),  # a preset of the candidate is no baseline
            run_entry("w1@0.5rsat", "power_of_two", 1, 0.01),  # a rung entry, not the whole run
            run_entry("w9", "power_of_two", 1, 0.01)]  # another workload
    assert heatmap_policies(runs, "w1", "asyncdp") == [
        ("vllm", "reference"), ("random", "best baseline"), ("asyncdp", "candidate")]


def test_heatmap_policies_leave_out_those_that_did_not_run_and_repeat_no_policy():
    runs = [run_entry("w1", "vllm", 1, 1.0), run_entry("w1", "round_robin", 1, 0.5)]
    both = [("vllm", "reference"), ("round_robin", "best baseline")]
    assert heatmap_policies(runs, "w1", "asyncdp") == both
    assert heatmap_policies(runs, "w1", "vllm") == both
    assert heatmap_policies(runs, "w2", "asyncdp") == []


def test_load_points_give_each_rung_its_offered_rate_from_the_resolved_ladder_averaged_over_seeds():
    plans = []
    for seed, r_sat in ((1, 20.0), (2, 40.0)):
        resolved = resolve(build("w2", "quick", seed, W2_TINY), 1.0, r_sat)
        plans.append((seed, "w2", resolved, None, _rungs(build("w2", "quick", seed, W2_TINY), resolved)))
    points = load_points(plans)
    assert list(points) == ["w2"]
    assert [label for label, _ in points["w2"]] == ["w2@0.5rsat", "w2@0.85rsat", "w2@1.2rsat"]
    assert [rate for _, rate in points["w2"]] == pytest.approx([15.0, 25.5, 36.0])  # (20 + 40) / 2 × fraction


def test_load_points_leave_out_a_rung_inside_the_warm_up_and_come_by_increasing_rate():
    def rec(i, t_ms):
        return Record(req_id=i, t_arrival_ms=t_ms, client=0, turn=0, after_req=None, think_ms=0.0,
                      segments=(("s", 1),), input_length=1, output_length=1, group="g")

    ladder = Ladder(rungs=((15.0, 50.0), (10.0, 30.0), (3.0, 30.0)))  # a 50 s warm-up stage, then two rungs
    w = Workload(name="wx", scale="quick", seed=1, arrival=ladder, ideal_hit_rate=0.0, dp_size=2, resolved=True,
                 records=(rec(0, 1000.0), rec(1, 2000.0), rec(2, 60_000.0), rec(3, 90_000.0)), warmup_ms=50_000.0)
    rungs = {"15rps": {0, 1}, "10rps": {2}, "3rps": {3}}
    assert load_points([(1, "wx", w, None, rungs)]) == {"wx": [("wx@3rps", 3.0), ("wx@10rps", 10.0)]}


def test_load_points_of_a_rate_sweep_are_its_dispatch_rates_and_a_plain_workload_has_none():
    w4 = build("w4", "quick", 1, {})
    assert w4.sweep_rates_rps
    plans = [(1, label, w, None, {}) for label, w in expand_sweep(resolve(w4))]
    assert load_points(plans) == {"w4": [(f"w4@{r:g}rps", r) for r in sorted(w4.sweep_rates_rps)]}
    w1 = resolve(build("w1", "quick", 1, {}))
    assert load_points([(1, "w1", w1, None, {})]) == {}


def test_decision_time_plot_is_drawn_from_the_candidates_timing_rows(tmp_path):
    def row(policy, dp, p50):
        stats = {"mean_us": p50, "p50_us": p50, "p99_us": 4 * p50}
        return {"policy": policy, "dp": dp, "decisions": 10, "select": stats, "hash": stats, "hooks": stats}

    timing = [row("asyncdp", 256, 9.0), row("asyncdp", 8, 2.0), row("asyncdp", 64, 4.0), row("vllm", 8, 1.0)]
    written = write_plots(tmp_path, [], {}, (), timing, "asyncdp")
    assert written == [tmp_path / "decision_time.png"]
    assert_png(written[0])
    assert write_plots(tmp_path / "none", [], {}, (), timing, "round_robin") == []


def test_plots_without_matplotlib_write_nothing_and_say_how_to_install_it(tmp_path, monkeypatch, capsys):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    log = RunLog(dp_size=2, events=[ev(0, 0, 0.0, 1.0)])
    assert write_plots(tmp_path / "plots", [run_entry("w1", "vllm", 1, 0.1)], {("w1", "vllm", 1): log}) == []
    assert not (tmp_path / "plots").exists()
    err = capsys.readouterr().err
    assert "--plots needs matplotlib" in err and "asyncdp[bench]" in err


def test_csv_has_one_row_per_run_then_per_robustness_entry_with_its_variant(tmp_path):
    runs = [run_entry("w1", "asyncdp", 1, 0.25), run_entry("w1@0.7rsat", "asyncdp", 1, 0.125)]
    robust = [{**run_entry("w1", "asyncdp", 1, 0.5), "variant": "oracle"}]
    write_csv(tmp_path / "m.csv", runs, robust)
    with (tmp_path / "m.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["workload"], r["variant"], float(r["ttft_mean_s"])) for r in rows] == [
        ("w1", "", 0.25), ("w1@0.7rsat", "", 0.125), ("w1", "oracle", 0.5)]
    assert list(rows[0]) == ["workload", "policy", "seed", "dp", "variant", *METRIC_KEYS, "ttft_floor_p99_s"]
    assert rows[0]["ttft_floor_p99_s"] == ""  # these hand-made entries carry no floor


def test_help_and_a_run_without_plots_import_neither_the_plots_module_nor_matplotlib():
    code = (
        "import sys\n"
        "from asyncdp.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "assert main(['bench', 'routing', '--workload', 'w1', '--dp', '2', '--option', 'groups=2', '--option',\n"
        "             'prompts_per_group=2', '--option', 'system_len=64', '--option', 'output_len=2',\n"
        "             '--policies', 'round_robin']) == 0\n"
        "print(sorted(m for m in sys.modules if m == 'asyncdp.bench.plots' or m.startswith('matplotlib')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
