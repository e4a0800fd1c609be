"""``asyncdp bench routing`` as a user types it: a flag that would do nothing with the others given, a value listed
twice, two workloads that would share a table, or an oversized profile is one line and exit 2 before any run (never
silently ignored, never a traceback); ``--export-trace`` writes the send times its runs use, so replaying the file
gives the same results; and a plot is written whole or not at all."""

from __future__ import annotations

import json
import re

import pytest

from asyncdp.bench.plots import write_plots
from asyncdp.cli import main

TINY_W1 = ["--workload", "w1", "--option", "groups=2", "--option", "prompts_per_group=2", "--option",
           "system_len=32", "--policies", "vllm", "--jobs", "0"]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 100, "output_length": 4, "hash_ids": [1]}\n')
    return str(path)


@pytest.mark.parametrize(("args", "message"), [
    # each was silently ignored (or, for the duplicates, made the same runs twice, weighing double in the means)
    (["--workload", "w1", "--option", "groups=2", "--option", "groups=3"],
     "--option groups is given twice (groups=2 and groups=3); give it once."),
    (["--trace", "TRACE", "--option", "groups=2"],
     "--option groups=2 does nothing with --trace: a trace has no generator options; leave it out."),
    (["--trace", "TRACE", "--scale", "full"], "--scale full does nothing with --trace"),
    (["--workload", "w1", "--trace-block-size", "64"], "--trace-block-size does nothing without --trace or "
                                                       "--export-trace; leave it out."),
    (["--workload", "w1", "--r-sat", "5"], "--r-sat does nothing here: no workload of this run (w1) is on a "
                                           "relative ladder"),
    (["--trace", "TRACE", "--r-sat", "5"], "--r-sat does nothing here"),
    (["--workload", "w9", "--rate-scale", "2"], "--rate-scale does nothing here: every workload of this run (w9) "
                                                "is a closed loop"),
    (["--workload", "w1,w2", "--export-trace", "EXPORT"], "--export-trace writes one workload"),
    (["--workload", "w1", "--seeds", "1,2,1"], "--seeds lists 1 twice (got '1,2,1'); give each seed once."),
    (["--workload", "w1", "--seeds", "1,01"], "--seeds lists 1 twice"),
    (["--workload", "w1", "--policies", "vllm,random,vllm"], "--policies lists vllm twice"),
    (["--workload", "w1,w1"], "--workload lists w1 twice"),
])
def test_a_flag_that_would_do_nothing_or_repeat_a_run_is_one_line_and_exit_2(args, message, trace, tmp_path, capsys):
    args = [trace if a == "TRACE" else str(tmp_path / "x.jsonl") if a == "EXPORT" else a for a in args]
    policies = [] if "--policies" in args else ["--policies", "vllm"]
    assert main(["bench", "routing", *args, *policies, "--jobs", "0"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"asyncdp: error: {message}"), captured.err
    assert captured.err.count("\n") == 1 and not captured.out
    assert not (tmp_path / "x.jsonl").exists()


def test_a_profile_with_too_many_kv_blocks_is_refused_naming_the_field(tmp_path, capsys):
    # 10**13 blocks was a MemoryError traceback (exit 1) when the first run built its block manager
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"a_ms": 1, "b_ms_per_token": 0.01, "c_ms_per_seq": 0.01, "d_ms_per_kv_token": 0,
                                   "kv_blocks": 10**13, "max_num_seqs": 8, "max_num_batched_tokens": 512}))
    assert main(["bench", "routing", *TINY_W1, "--profile", str(profile)]) == 2
    err = capsys.readouterr().err
    assert err == (f"asyncdp: error: {profile}: cost profile field 'kv_blocks' must be at most 4194304 (about 650 "
                   "MB of simulator memory per rank), got 10000000000000.\n")


def _replay(tmp_path, capsys, workload_args):
    """Run ``workload_args`` with ``--export-trace``, then the replay command its stderr names; the two runs' whole-run
    JSON entries."""
    exported, first, second = tmp_path / "w.jsonl", tmp_path / "a.json", tmp_path / "b.json"
    common = ["--policies", "vllm,round_robin", "--jobs", "0", "--trace-block-size", "16"]
    assert main(["bench", "routing", *workload_args, *common, "--export-trace", str(exported),
                 "--json", str(first)]) == 0
    hint = re.search(r"replay it with (--trace .*)$", capsys.readouterr().err, re.MULTILINE)
    assert hint and hint.group(1) == f"--trace {exported} --dp 2 --trace-block-size 16"
    assert main(["bench", "routing", *hint.group(1).split(), *common[:4], "--json", str(second)]) == 0
    whole = [[r for r in json.loads(path.read_text())["runs"] if "@" not in r["workload"]]
             for path in (first, second)]
    assert [r["policy"] for r in whole[0]] == [r["policy"] for r in whole[1]] == ["vllm", "round_robin"]
    return whole


def test_an_exported_workload_replays_as_a_trace_with_the_same_results(tmp_path, capsys):
    ours, replayed = _replay(tmp_path, capsys, [*TINY_W1[:8], "--dp", "2"])
    for a, b in zip(ours, replayed, strict=True):
        assert a["counts"] == b["counts"] and a["metrics"] == b["metrics"]


def test_an_exported_ladder_replays_at_the_rates_it_ran(tmp_path, capsys):
    # The export wrote the stored send times (a relative ladder's at R_sat = 1 req/s, before --rate-scale), so the
    # replay ran at a thirtieth of the rate. Now it writes the times the runs used (in whole milliseconds, as the
    # Mooncake format has them: hence the tolerance).
    ours, replayed = _replay(tmp_path, capsys, ["--workload", "w6", "--option", "num_requests=40", "--dp", "2",
                                                 "--r-sat", "20", "--rate-scale", "1.5"])
    for a, b in zip(ours, replayed, strict=True):
        assert a["counts"] == b["counts"] and a["counts"]["completed"] == 40
        assert b["metrics"] == pytest.approx(a["metrics"], rel=0.1)


def test_a_plot_interrupted_while_it_is_written_leaves_the_previous_file_and_no_half_png(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    def timing(dp):
        stats = {"mean_us": 2.0, "p50_us": 2.0, "p99_us": 4.0}
        return {"policy": "asyncdp", "dp": dp, "decisions": 10, "select": stats, "hash": stats, "hooks": stats}

    old = tmp_path / "decision_time.png"
    old.write_bytes(b"the previous run's plot")

    def half_then_ctrl_c(self, fname, **kwargs):
        with open(fname, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n half")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", half_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        write_plots(tmp_path, [], {}, (), [timing(8), timing(64)], "asyncdp")
    assert old.read_bytes() == b"the previous run's plot"
    assert [p.name for p in tmp_path.iterdir()] == ["decision_time.png"]  # no temporary file left either
