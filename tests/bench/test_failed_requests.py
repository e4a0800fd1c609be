"""A run whose requests failed says so: metrics that no request measured are null in the JSON and ``-`` in the
tables, never 0 (which read as the best TTFT of the table), a ``!!`` line names the run, how many failed and the
first error, stderr warns, and a candidate with nothing completed fails the gates."""

from __future__ import annotations

import json

from asyncdp.bench import metrics, report
from asyncdp.bench.simulate import RequestEvent, RunLog
from asyncdp.cli import main

TINY = ["--workload", "w1", "--dp", "2", "--option", "groups=2", "--option", "prompts_per_group=4",
        "--option", "system_len=128", "--option", "question_len=16", "--option", "output_len=4", "--jobs", "0"]
#: room for 48 tokens a sequence (3 usable blocks of 16): every prompt of TINY (145 tokens) is refused by the engine
SMALL = {"a_ms": 6.0, "b_ms_per_token": 0.04, "c_ms_per_seq": 0.03, "d_ms_per_kv_token": 4e-5, "kv_blocks": 4,
         "max_num_seqs": 4, "max_num_batched_tokens": 8192}


def _failed(req_id: int) -> RequestEvent:
    return RequestEvent(req_id=req_id, router=0, rank=0, t_send_s=float(req_id), prompt_tokens=10, measured=True,
                        error="PromptTooLongError: too long")


def _not_json(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


def test_metrics_no_request_measured_are_none_not_zero():
    log = RunLog(dp_size=2, events=[_failed(0), _failed(1)])
    got = metrics.reported(log)
    assert got["ttft_mean_s"] is None and got["ttft_p99_s"] is None and got["tpot_mean_s"] is None
    assert got["throughput_tok_s"] is None and got["prefix_hit_rate"] is None
    assert got["goodput_rps"] == 0.0 and got["slo_attainment"] == 0.0  # measured, none met the SLO: truly 0
    assert got["preemptions"] == 0.0
    assert metrics.compute(log)["ttft_mean_s"] == 0.0  # compute() keeps its numbers for the scripts that use it
    assert metrics.reported(RunLog(dp_size=2))["goodput_rps"] is None
    assert metrics.first_error(log) == "PromptTooLongError: too long"


def test_a_policy_whose_requests_all_failed_is_not_the_best_baseline():
    good = {"workload": "w6", "policy": "round_robin", "seed": 1, "counts": {"failed": 0},
            "metrics": dict.fromkeys(metrics.METRIC_KEYS, 0.5)}
    bad = {**good, "policy": "random", "counts": {"failed": 8, "sent": 8, "completed": 0}, "first_error": "X: y",
           "metrics": {**good["metrics"], "ttft_mean_s": None, "prefix_hit_rate": None}}
    mine = {**good, "policy": "asyncdp", "metrics": {**good["metrics"], "ttft_mean_s": 0.51}}
    rows = dict((g, v) for g, v, _ in report.gates([good, bad, mine]))
    assert rows["G2"] == "PASS"  # against round_robin's 0.5, not random's missing TTFT read as 0
    table = report.tables([good, bad, mine])
    assert "!! random seed 1: 8 of 8 requests failed (X: y); no request completed" in table
    mine_failed = {**bad, "policy": "asyncdp"}
    verdicts = {g: (v, d) for g, v, d in report.gates([good, mine_failed])}
    assert verdicts["G2"] == ("FAIL", "w6: no measured request of asyncdp completed")


def test_the_command_reports_failed_requests_instead_of_a_ttft_of_zero(tmp_path, capsys):
    profile = tmp_path / "small.json"
    profile.write_text(json.dumps(SMALL))
    out, csv_out = tmp_path / "r.json", tmp_path / "r.csv"
    assert main(["bench", "routing", *TINY, "--policies", "vllm,asyncdp", "--profile", str(profile),
                 "--json", str(out), "--csv", str(csv_out)]) == 0
    captured = capsys.readouterr()
    doc = json.loads(out.read_text(), parse_constant=_not_json)
    for run in doc["runs"]:
        assert run["counts"]["failed"] == 8 and run["counts"]["completed"] == 0
        assert run["metrics"]["ttft_mean_s"] is None and run["metrics"]["ttft_p99_s"] is None
        assert "exceeds max_model_len (48)" in run["first_error"]
    table = captured.out.split("-- w1: ratio")[0]
    vllm_row = next(line for line in table.splitlines() if line.startswith("vllm "))
    assert vllm_row.split()[1:7] == ["-"] * 6  # the TTFT, TPOT and e2e columns: not 0
    assert "!! vllm seed 1: 8 of 8 requests failed (InvalidRequestError" in captured.out
    assert "G2: FAIL  w1: no measured request of asyncdp completed" in captured.out
    assert "asyncdp bench: warning: requests failed in 2 of 2 runs" in captured.err
    assert csv_out.read_text().splitlines()[1].startswith("w1,vllm,1,2,,,,,,,,0.0,0.0,")
