"""``asyncdp bench routing`` labels a workload by what ran: the generator's name and the preset given
(``w8@pure_long``), in the tables, the gate lines, the progress, the JSON runs and the header's per-workload keys; a
ladder's rung or a rate of W4's sweep follows it after another ``@`` (``w8@pure_long@0.7rsat``, ``w4@pressure@8rps``).
The label was the generator's name alone: ``w8`` and ``w8@pure_long`` read the same everywhere but in the header's
``workloads``, and a reader comparing two JSON files could not tell them apart."""

from __future__ import annotations

import json

import pytest

from asyncdp.bench.report import family, split_rung
from asyncdp.cli import main

TINY_W8 = ["--option", "num_requests=20", "--option", "long_len=2000", "--dp", "2", "--r-sat", "5", "--jobs", "0"]


@pytest.mark.parametrize("given", [["--workload", "w8@pure_long"],
                                   ["--workload", "w8", "--option", "preset=pure_long"]])
def test_a_preset_is_part_of_the_label_in_tables_gates_progress_and_json(tmp_path, capsys, given):
    out = tmp_path / "r.json"
    assert main(["bench", "routing", *given, *TINY_W8, "--policies", "vllm,round_robin", "--candidate",
                 "round_robin", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    for label in ("w8@pure_long", "w8@pure_long@0.7rsat"):
        assert f"== {label} with num_requests=20, long_len=2000 (mean over seeds" in printed, printed  # not preset=
        assert f"-- {label}: ratio to vllm" in printed
        assert f"{label}: goodput " in printed  # G4's detail names the entry
    assert "== w8 " not in printed and "w8@0.7rsat" not in printed
    assert "latest: w8@pure_long round_robin seed 1" in captured.err
    doc = json.loads(out.read_text())
    assert [(r["workload"], r["policy"]) for r in doc["runs"]] == [
        ("w8@pure_long", "vllm"), ("w8@pure_long@0.7rsat", "vllm"),
        ("w8@pure_long", "round_robin"), ("w8@pure_long@0.7rsat", "round_robin")]
    for r in doc["runs"]:  # the run format is kept
        assert {"workload", "policy", "seed", "dp", "metrics"} <= set(r) and r["seed"] == 1 and r["dp"] == 2
    header = doc["header"]
    assert header["r_sat"] == {"w8@pure_long/1": 5.0} and list(header["workload_hashes"]) == ["w8@pure_long/1"]


def test_the_same_workload_without_a_preset_keeps_the_generator_name(tmp_path):
    out = tmp_path / "r.json"
    assert main(["bench", "routing", "--workload", "w8", *TINY_W8, "--policies", "round_robin",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["workload"] for r in doc["runs"]] == ["w8", "w8@0.7rsat"]
    assert list(doc["header"]["r_sat"]) == ["w8/1"]


def test_a_preset_rate_sweep_labels_each_rate_after_the_preset(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["bench", "routing", "--workload", "w4@pressure", "--dp", "2", "--option", "clients=8",
                 "--option", "rounds=2", "--option", "request_len=64", "--option", "output_len=4",
                 "--policies", "vllm", "--jobs", "0", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    labels = [r["workload"] for r in json.loads(out.read_text())["runs"]]
    assert labels == ["w4@pressure@8rps", "w4@pressure@4rps", "w4@pressure@2rps", "w4@pressure@1rps"]
    assert "== w4@pressure@8rps " in printed and "== w4@8rps" not in printed


def test_the_options_given_are_in_the_table_title_and_the_header_not_the_label(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["bench", "routing", "--workload", "w8@pure_long", *TINY_W8, "--policies", "round_robin",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "== w8@pure_long with num_requests=20, long_len=2000 (mean over seeds; times in s)" in printed
    doc = json.loads(out.read_text())
    assert doc["header"]["options"] == {"num_requests": "20", "long_len": "2000"}
    assert doc["runs"][0]["workload"] == "w8@pure_long"


@pytest.mark.parametrize(("label", "workload", "rung"), [
    ("w1", "w1", ""), ("w2@0.85rsat", "w2", "0.85rsat"), ("w4@16rps", "w4", "16rps"),
    ("w8@pure_long", "w8@pure_long", ""), ("w8@32k_in_1_out", "w8@32k_in_1_out", ""),
    ("w8@pure_long@0.7rsat", "w8@pure_long", "0.7rsat"), ("w4@pressure@8rps", "w4@pressure", "8rps"),
    ("w2@1e+03rps", "w2", "1e+03rps"),
])
def test_a_label_splits_into_its_workload_and_rung_and_its_family_is_the_generator(label, workload, rung):
    assert split_rung(label) == (workload, rung)
    assert family(label) == label.partition("@")[0]


def test_two_presets_of_one_generator_run_side_by_side_as_each_alone(tmp_path, capsys):
    # (they were refused while both read "w3"; before that, averaged together in one table as if two seeds)
    def runs(workloads: str) -> dict[tuple[str, str], dict]:
        out = tmp_path / f"{workloads}.json"
        assert main(["bench", "routing", "--workload", workloads, "--scale", "quick", "--policies", "vllm,asyncdp",
                     "--seeds", "1", "--jobs", "0", "--json", str(out)]) == 0
        doc = json.loads(out.read_text())
        return {(r["workload"], r["policy"]): r["metrics"] for r in doc["runs"]} | {
            ("hashes", workloads): doc["header"]["workload_hashes"]}

    both = runs("w3,w3@ray_scaling")
    alone = runs("w3") | runs("w3@ray_scaling")
    assert both.pop(("hashes", "w3,w3@ray_scaling")) == alone.pop(("hashes", "w3")) | alone.pop(
        ("hashes", "w3@ray_scaling"))
    assert set(both) == {(w, p) for w in ("w3", "w3@ray_scaling") for p in ("vllm", "asyncdp")}
    assert both == alone
    printed = capsys.readouterr().out
    assert "== w3 (mean over seeds" in printed and "== w3@ray_scaling (mean over seeds" in printed
