"""``asyncdp bench calibrate`` as a user types it: ``--refit`` with a flag it cannot use is an error (those flags
were silently ignored), an unreadable ``--refit`` file says why in plain words, and an engine with more KV than a
simulated rank may hold gets a profile that ``bench routing --profile`` still reads."""

from __future__ import annotations

import json

import pytest

from asyncdp.bench.calibrate import profile_document
from asyncdp.bench.fit import StepWork, fit
from asyncdp.bench.profiles import load_profile
from asyncdp.bench.records import MAX_KV_BLOCKS
from asyncdp.bench.sweep import Capacity, Measured, Point
from asyncdp.cli import main

CAP = Capacity(max_model_len=2048, usable_kv_blocks=32768, block_size=16, max_num_seqs=256,
               max_num_batched_tokens=2048)


def _profile(cap: Capacity = CAP) -> dict:
    work = [StepWork(256, 0, 256), StepWork(512, 0, 512), StepWork(0, 4, 2048), StepWork(0, 16, 8192)]
    times = [6.0 + 0.04 * w.P + 0.03 * w.D + 4e-5 * w.K for w in work]
    measured = [Measured(Point("prefill", w.P, 0, 0, (w.P,)) if w.P else Point("decode", 0, w.D, w.K // w.D, ()),
                         w, t, (t,)) for w, t in zip(work, times, strict=True)]
    return profile_document("cpu_x", {"model": "m", "device": "cpu", "dtype": "float32"}, cap, fit(work, times),
                            measured, [], repeats=3, quick=False)


@pytest.mark.parametrize("argv", [["--repeats", "3"], ["--quick"], ["--threads", "2"], ["--model", "builtin:tiny-moe"],
                                  ["--max-num-seqs", "8"], ["--num-kv-blocks", "100"], ["--dtype", "float32"]])
def test_refit_with_a_flag_it_cannot_use_is_an_error_naming_it(tmp_path, capsys, argv):
    source, out = tmp_path / "run.json", tmp_path / "out.json"
    source.write_text(json.dumps(_profile()))
    assert main(["bench", "calibrate", "--refit", str(source), *argv, "--output", str(out)]) == 2  # was 0
    err = capsys.readouterr().err
    assert err == (f"asyncdp: error: {argv[0]} does nothing with --refit: a refit fits the points stored in {source} "
                   "again, without running the engine; leave it out.\n")
    assert not out.exists()


@pytest.mark.parametrize(("content", "reason"), [
    (None, "cannot read it (No such file or directory)"),
    (b"\xff\xfe{", "cannot read it ('utf-8' codec can't decode byte 0xff"),
])
def test_an_unreadable_refit_file_says_why(tmp_path, capsys, content, reason):
    source = tmp_path / "run.json"
    if content is not None:
        source.write_bytes(content)
    assert main(["bench", "calibrate", "--refit", str(source), "--output", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"asyncdp: error: --refit {source}: {reason}") and err.count("\n") == 1


def test_an_engine_with_more_kv_than_a_simulated_rank_may_hold_gets_a_capped_profile_routing_reads(tmp_path):
    # A profile of 10**7 blocks was refused by --profile (it was a MemoryError at the first simulated run before that)
    huge = Capacity(max_model_len=2048, usable_kv_blocks=10**7, block_size=16, max_num_seqs=256,
                    max_num_batched_tokens=2048)
    doc = _profile(huge)
    assert doc["kv_blocks"] == MAX_KV_BLOCKS and doc["engine_kv_blocks"] == 10**7
    assert doc["kv_blocks_note"].endswith(f"= {10**7 + 1}, capped at {MAX_KV_BLOCKS}, the most a simulated rank "
                                          "may have")
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    assert load_profile(str(path)).kv_blocks == MAX_KV_BLOCKS
    assert "capped" not in _profile()["kv_blocks_note"]
