"""``asyncdp bench calibrate``: the fit recovers known coefficients, R² and the largest relative error follow
their definitions, the sweep plan keeps to the engine's limits and says why it skips, the profile file
round-trips through ``load_profile``, bad arguments are clear errors, and one ``--quick`` run on the real engine
writes a usable profile."""

from __future__ import annotations

import itertools
import json
import math
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from asyncdp.bench.calibrate import profile_document, sim_kv_blocks
from asyncdp.bench.fit import StepWork, fit, least_squares, max_relative_error, r_squared
from asyncdp.bench.profiles import load_profile
from asyncdp.bench.sweep import FULL, Capacity, Grid, Measured, Point, Skipped, batch_work, plan
from asyncdp.cli import main
from asyncdp.engine.executor import ModelBatch, ScheduledChunk
from asyncdp.sampling_params import SamplingParams
from tests.bench.procs import read_until, reap, wait_busy

TRUE = {"a": 6.0, "b": 0.04, "c": 0.03, "d": 4e-5, "e": 1e-6}
ROOT = Path(__file__).resolve().parents[2]


def _measured(kind: str, p: int, d: int, ms: float) -> Measured:
    """A measured point of ``kind`` (P prefill tokens or D decodes at context 32), ``ms`` long."""
    point = Point(kind, p, d, 32 if d else 0, (p,) if p else (31,) * d)  # type: ignore[arg-type]
    return Measured(point, StepWork(p, d, p or 33 * d), ms, (ms,))


def sweep_work() -> list[StepWork]:
    """Prefill-only and decode-only steps like the real sweep's."""
    prefill = [StepWork(p, 0, p, p * p / 2) for p in (256, 512, 1024, 2048, 4096, 8192)]
    decode = [StepWork(0, d, d * c) for d, c in itertools.product((1, 4, 16, 64, 256), (512, 2048, 8192))]
    return prefill + decode


def model_ms(w: StepWork, coef: dict[str, float]) -> float:
    return coef["a"] + coef["b"] * w.P + coef["c"] * w.D + coef["d"] * w.K + coef.get("e", 0.0) * w.E


def test_fit_recovers_known_coefficients_from_exact_points():
    points = sweep_work()
    result = fit(points, [model_ms(w, {**TRUE, "e": 0.0}) for w in points])
    for term in "abcd":
        assert result.coefficients[term] == pytest.approx(TRUE[term], rel=1e-6)
    assert result.clamped == ()
    assert result.r2 == pytest.approx(1.0, abs=1e-12)
    assert result.max_rel_error < 1e-9


def test_fit_with_e_recovers_the_prefill_attention_term_too():
    points = sweep_work()
    result = fit(points, [model_ms(w, TRUE) for w in points], with_e=True)
    for term in "abcde":
        assert result.coefficients[term] == pytest.approx(TRUE[term], rel=1e-6)
    without_e = fit(points, [model_ms(w, TRUE) for w in points])
    assert "e" not in without_e.coefficients and without_e.max_rel_error > 0.01


def test_a_negative_coefficient_is_clamped_to_zero_and_the_others_refitted_without_it():
    points = sweep_work()
    truth = {**TRUE, "d": -1e-6, "e": 0.0}  # more KV would make a step cheaper: not a valid profile
    measured = [model_ms(w, truth) for w in points]
    unconstrained = least_squares([w.row("abcd") for w in points], measured)
    assert unconstrained[3] is not None and unconstrained[3] < 0
    result = fit(points, measured)
    assert result.coefficients["d"] == 0.0 and result.clamped == ("d",)
    refit = least_squares([w.row("abc") for w in points], measured)
    assert [result.coefficients[t] for t in "abc"] == pytest.approx(refit, rel=1e-9)
    assert all(v >= 0 for v in result.coefficients.values())


def test_a_term_without_information_gets_zero():
    points = [StepWork(p, 0, p) for p in (100, 200, 400)]  # prefill only: no D, and K is P
    result = fit(points, [2.0 + 0.5 * w.P for w in points])
    assert result.coefficients["a"] == pytest.approx(2.0)
    assert result.coefficients["b"] + result.coefficients["d"] == pytest.approx(0.5)
    assert result.coefficients["c"] == 0.0 and "c" in result.clamped


def test_r2_and_max_relative_error_follow_their_definitions():
    measured, predicted = [1.0, 2.0, 3.0, 4.0], [1.1, 1.9, 3.2, 4.0]
    assert r_squared(measured, predicted) == pytest.approx(1 - 0.06 / 5.0)
    assert max_relative_error(measured, predicted) == pytest.approx(0.1)
    result = fit([StepWork(0, 1, 10), StepWork(0, 2, 20), StepWork(0, 4, 40)], [1.0, 2.5, 3.0])
    assert result.r2 == pytest.approx(r_squared([1.0, 2.5, 3.0], result.predicted_ms))
    assert result.max_rel_error == pytest.approx(max_relative_error([1.0, 2.5, 3.0], result.predicted_ms))


def test_fit_refuses_non_positive_times_and_mismatched_lengths():
    with pytest.raises(ValueError, match="positive"):
        fit([StepWork(1, 0, 1)], [0.0])
    with pytest.raises(ValueError, match="points"):
        fit([StepWork(1, 0, 1)], [1.0, 2.0])


CAP = Capacity(max_model_len=2048, usable_kv_blocks=32768, block_size=16, max_num_seqs=256,
               max_num_batched_tokens=2048)


def test_plan_keeps_to_the_engine_limits_and_says_why_it_skips():
    points, skipped = plan(FULL, CAP, repeats=5)
    reasons = {s.label: s.reason for s in skipped}
    prefill = {p.P: p for p in points if p.kind == "prefill"}
    assert sorted(prefill) == [256, 512, 1024, 2048]
    assert prefill[2048].prompt_lens == (1024, 1024)  # a prompt must stay below max_model_len
    assert "max_num_batched_tokens 2048" in reasons["prefill P=4096"]
    assert "max_num_seqs 256" in reasons["decode D=1024 ctx=512"]
    decode = {(p.D, p.context): p for p in points if p.kind == "decode"}
    clamped = [p for p in decode.values() if p.note]
    assert {p.D for p in clamped} == {1, 4, 16, 64, 256}
    for p in clamped:  # the first context beyond max_model_len is measured at the largest that fits
        assert 1024 < p.context < 2048 and "clamped from 2048" in p.note
        assert p.prompt_lens == (p.context - 1,) * p.D
    assert "max_model_len 2048" in reasons["decode D=1 ctx=4096"]
    for p in points:  # the KV of every sequence through its timed steps fits
        assert sum(math.ceil((n + 1 + 5) / 16) for n in p.prompt_lens) <= CAP.usable_kv_blocks


def test_plan_skips_points_that_need_more_kv_blocks_than_the_engine_has():
    small = Capacity(max_model_len=4096, usable_kv_blocks=100, block_size=16, max_num_seqs=64,
                     max_num_batched_tokens=4096)
    points, skipped = plan(Grid((256, 2048), (1, 16), (512,)), small, repeats=3)
    assert [p.label for p in points] == ["prefill P=256", "decode D=1 ctx=512"]
    reasons = {s.label: s.reason for s in skipped}
    assert "KV blocks" in reasons["prefill P=2048"] and "KV blocks" in reasons["decode D=16 ctx=512"]


def test_batch_work_counts_prefill_token_pairs_but_not_decodes():
    params = SamplingParams()

    def chunk(start: int, n: int, prompt_len: int) -> ScheduledChunk:
        return ScheduledChunk("r", [7] * n, start, [], True, params, 0, prompt_token_ids=[7] * prompt_len)

    batch = ModelBatch([chunk(0, 10, 10), chunk(16, 4, 20), chunk(30, 1, 30)], num_prefill_tokens=14,
                       num_decode_seqs=1, num_kv_tokens=10 + 20 + 31)
    assert batch_work(batch) == StepWork(14, 1, 61, 10 * 5 + 4 * (16 + 2))


def test_profile_file_round_trips_through_load_profile(tmp_path):
    points = [StepWork(256, 0, 256), StepWork(0, 4, 2048), StepWork(0, 16, 8192)]
    result = fit(points, [model_ms(w, TRUE) for w in points])
    measured = [Measured(Point("prefill", 256, 0, 0, (256,)), points[0], 16.3, (16.3,)),
                Measured(Point("decode", 0, 4, 512, (511,) * 4), points[1], 6.2, (6.2,)),
                Measured(Point("decode", 0, 16, 512, (511,) * 16), points[2], 6.8, (6.8,))]
    facts = {"model": "builtin:tiny-dense", "device": "cpu", "device_name": "x", "dtype": "float32", "tp": 1,
             "threads": 1, "engine_commit": "abc", "date": "2026-12-01T00:00:00+00:00"}
    doc = profile_document("cpu_test", facts, CAP, result, measured, [Skipped("prefill P=4096", "too big")],
                           repeats=3, quick=True)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    profile = load_profile(str(path))
    assert profile.name == "cpu_test"
    assert (profile.a_ms, profile.b_ms_per_token, profile.c_ms_per_seq, profile.d_ms_per_kv_token) == (
        result.coefficients["a"], result.coefficients["b"], result.coefficients["c"], result.coefficients["d"])
    assert (profile.max_num_seqs, profile.max_num_batched_tokens) == (256, 2048)
    assert profile.kv_blocks == sim_kv_blocks(CAP) == 32768 + 1
    assert "16 tokens" in doc["kv_blocks_note"]
    assert [p["predicted_ms"] for p in doc["points"]] == [round(v, 4) for v in result.predicted_ms]
    assert doc["skipped"] == [{"point": "prefill P=4096", "reason": "too big"}]


def test_kv_blocks_convert_an_engine_block_size_to_the_simulators():
    cap = Capacity(2048, usable_kv_blocks=1000, block_size=64, max_num_seqs=8, max_num_batched_tokens=512)
    assert sim_kv_blocks(cap) == 1000 * 64 // 16 + 1


@pytest.mark.parametrize(("argv", "message"), [
    (["--threads", "0"], "--threads must be >= 1"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--max-num-seqs", "0"], "--max-num-seqs must be >= 1"),
    (["--device", "tpu"], "--device must be one of"),
    (["--output", "/nonexistent-dir/p.json"], "does not exist"),
])
def test_bad_arguments_exit_2_with_a_message_naming_the_flag(argv, message, capsys):
    assert main(["bench", "calibrate", "--quick", *argv]) == 2
    assert message in capsys.readouterr().err


def test_an_unknown_model_is_a_clear_error(tmp_path, capsys):
    assert main(["bench", "calibrate", "--quick", "--model", str(tmp_path / "missing"),
                 "--output", str(tmp_path / "p.json")]) == 2
    assert "missing" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_quick_run_on_the_real_engine_writes_a_profile_bench_routing_reads(tmp_path, capsys):
    out = tmp_path / "cal.json"
    assert main(["bench", "calibrate", "--quick", "--threads", "1", "--output", str(out)]) == 0
    doc = json.loads(out.read_text())
    profile = load_profile(str(out))
    assert profile.name == "cpu_tiny_dense" and profile.max_num_seqs == 256
    for key in ("model", "device", "dtype", "tp", "engine_commit", "date", "r2", "max_rel_error"):
        assert key in doc, key
    assert doc["model"] == "builtin:tiny-dense" and doc["dtype"] == "float32" and doc["threads"] == 1
    kinds = [p["kind"] for p in doc["points"]]
    assert kinds.count("prefill") == 3 and kinds.count("decode") == 4
    for p in doc["points"]:  # K is what the scheduler counted: a prefill's context is its prompt
        assert p["measured_ms"] > 0
        if p["kind"] == "prefill":
            assert p["K"] == p["P"] and p["D"] == 0
        else:
            assert p["P"] == 0 and p["K"] >= p["D"] * p["context"]
    printed = capsys.readouterr().out
    assert "R²" in printed and str(out) in printed


def test_a_profile_fitted_with_e_loads_with_its_e_term(tmp_path):
    points = [StepWork(256, 0, 256, 256 * 128), StepWork(1024, 0, 1024, 1024 * 512), StepWork(0, 4, 2048),
              StepWork(0, 4, 8192), StepWork(0, 16, 8192), StepWork(2048, 0, 2048, 2048 * 1024)]
    result = fit(points, [model_ms(w, TRUE) for w in points], with_e=True)
    measured = [Measured(Point("prefill", w.P, 0, 0, (w.P,)) if w.P else Point("decode", 0, w.D, 512, (511,) * w.D),
                         w, model_ms(w, TRUE), (model_ms(w, TRUE),)) for w in points]
    doc = profile_document("cpu_e", {"model": "m"}, CAP, result, measured, [], repeats=1, quick=False)
    assert doc["e_ms_per_token_pair"] == pytest.approx(TRUE["e"], rel=1e-6)
    assert doc["fit"]["model"].endswith("+ e*E")
    path = tmp_path / "e.json"
    path.write_text(json.dumps(doc))
    loaded = load_profile(str(path))
    assert loaded.b_ms_per_token == pytest.approx(TRUE["b"], rel=1e-6)
    assert loaded.cost().e_ms_per_token_pair == pytest.approx(TRUE["e"], rel=1e-6)


def test_a_relative_fit_minimises_relative_errors_and_the_default_minimises_ms():
    points = sweep_work()
    noise = [1.0 + 0.3 * math.sin(7 * i) for i in range(len(points))]  # deterministic, up to ±30 %
    measured = [model_ms(w, {**TRUE, "e": 0.0}) * k for w, k in zip(points, noise, strict=True)]
    in_ms, relative = fit(points, measured), fit(points, measured, relative=True)
    assert in_ms.clamped == () and relative.clamped == ()

    def squared(result, weight):
        return sum(((p - y) / weight(y)) ** 2 for p, y in zip(result.predicted_ms, measured, strict=True))

    assert squared(relative, lambda y: y) < squared(in_ms, lambda y: y)
    assert squared(in_ms, lambda y: 1.0) < squared(relative, lambda y: 1.0)
    exact = [model_ms(w, {**TRUE, "e": 0.0}) for w in points]
    assert fit(points, exact, relative=True).coefficients["a"] == pytest.approx(TRUE["a"], rel=1e-6)


def test_refit_of_a_written_profile_reproduces_its_fit_and_can_change_the_weights(tmp_path, capsys):
    points = sweep_work()
    noise = [1.0 + 0.2 * math.cos(5 * i) for i in range(len(points))]
    times = [model_ms(w, TRUE) * k for w, k in zip(points, noise, strict=True)]
    result = fit(points, times)
    measured = [Measured(Point("prefill", w.P, 0, 0, (w.P,)) if w.P else Point("decode", 0, w.D, w.K // w.D, ()),
                         w, t, (t,)) for w, t in zip(points, times, strict=True)]
    source = tmp_path / "run.json"
    source.write_text(json.dumps(profile_document("cpu_x", {"model": "m", "device": "cpu"}, CAP, result, measured,
                                                  [], repeats=3, quick=False)))
    again, relative = tmp_path / "again.json", tmp_path / "relative.json"
    assert main(["bench", "calibrate", "--refit", str(source), "--output", str(again)]) == 0
    assert main(["bench", "calibrate", "--refit", str(source), "--relative", "--output", str(relative)]) == 0
    first, second = load_profile(str(source)), load_profile(str(again))
    for key in ("a_ms", "b_ms_per_token", "c_ms_per_seq", "d_ms_per_kv_token"):  # the file rounds times to 0.1 µs
        assert getattr(second, key) == pytest.approx(getattr(first, key), rel=1e-3), key
    assert second.kv_blocks == first.kv_blocks and second.name == "cpu_x"
    doc = json.loads(relative.read_text())
    assert doc["fit"]["weights"] == "relative" and doc["refit_of"] == str(source)
    assert doc["a_ms"] != pytest.approx(first.a_ms, rel=1e-3)
    assert "refit of" in capsys.readouterr().out


def test_refit_of_a_file_that_is_not_a_calibration_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "a_ms": 1.0}))
    assert main(["bench", "calibrate", "--refit", str(bad), "--output", str(tmp_path / "o.json")]) == 2
    assert "not a profile file written by bench calibrate" in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals to a child process")
@pytest.mark.parametrize(("sig", "status", "what"), [(signal.SIGINT, 130, "interrupted"),
                                                      (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_a_signal_stops_the_sweep_with_one_line_and_no_profile(tmp_path, sig, status, what):
    # Ctrl-C was a KeyboardInterrupt traceback
    out = tmp_path / "p.json"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a foreground shell starts it
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "asyncdp", "bench", "calibrate", "--quick", "--threads", "1", "--repeats", "1000",
             "--max-num-seqs", "2", "--output", str(out)],  # D=4 skipped: said before the sweep
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert proc.stderr is not None
        head = read_until(proc.stderr.fileno(), b"skipped decode", 60)  # said once the engine is built
        assert b"skipped decode" in head, head.decode(errors="replace")
        assert wait_busy(proc, 0.3, 60), "the sweep did not get going"  # in it (many seconds with 1000 repeats)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == status
        err = (head + proc.stderr.read()).decode()
        assert f"asyncdp bench calibrate: {what}: stopped the sweep; no profile written" in err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert not out.exists() and not list(tmp_path.iterdir())
    finally:
        reap(proc)


@pytest.mark.parametrize(("argv", "kind"), [
    (["--max-model-len", "8"], "decode"),  # was a profile with c = d = 0 and exit 0: decoding modelled as free
    (["--max-num-batched-tokens", "16"], "prefill"),
])
def test_a_sweep_without_a_decode_or_prefill_point_writes_no_profile(tmp_path, capsys, argv, kind):
    out = tmp_path / "p.json"
    assert main(["bench", "calibrate", "--quick", "--threads", "1", "--output", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert f"asyncdp: error: no {kind} point of the sweep fits this engine" in err
    assert "modelled as free); no profile written" in err and not out.exists()


def test_a_refit_of_a_file_without_decode_points_is_refused(tmp_path, capsys):
    measured = [_measured("prefill", p, 0, 0.1 * p + 1) for p in (32, 64, 128)]
    doc = profile_document("x", {"model": "m"}, CAP, fit([m.work for m in measured], [m.ms for m in measured]),
                           measured, [], repeats=1, quick=True)
    source = tmp_path / "old.json"
    source.write_text(json.dumps(doc))
    out = tmp_path / "new.json"
    assert main(["bench", "calibrate", "--refit", str(source), "--output", str(out)]) == 2
    assert "no decode point of the sweep was measured in --refit" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(("output", "message"), [
    ("/sys/kernel/p.json", "--output /sys/kernel/p.json: cannot write in the folder /sys/kernel"),
    ("{tmp}/file/p.json", "--output {tmp}/file/p.json: {tmp}/file is a file, not a folder."),
    ("{tmp}", "--output {tmp}: is a folder; give a file name."),
])
def test_an_unwritable_output_is_refused_before_the_engine_is_built(tmp_path, capsys, output, message):
    # /sys/kernel was a PermissionError traceback after the whole sweep, its measurements lost
    if output.startswith("/sys") and not Path("/sys/kernel").is_dir():
        pytest.skip("needs /sys/kernel, where nothing can be created")
    (tmp_path / "file").write_text("")
    assert main(["bench", "calibrate", "--quick", "--output", output.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"asyncdp: error: {message.format(tmp=tmp_path)}") and err.count("\n") == 1


def test_a_failed_write_of_the_profile_is_one_line_and_exit_1_with_the_profile_kept(tmp_path, capsys, monkeypatch):
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    measured = [_measured("prefill", p, 0, 0.1 * p + 1) for p in (32, 64)] + [
        _measured("decode", 0, d, 1 + 0.05 * d) for d in (1, 4)]
    doc = profile_document("x", {"model": "m"}, CAP, fit([m.work for m in measured], [m.ms for m in measured]),
                           measured, [], repeats=1, quick=True)
    source = tmp_path / "old.json"
    source.write_text(json.dumps(doc))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the profile is kept
    assert main(["bench", "calibrate", "--refit", str(source), "--output", "/dev/full"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("asyncdp bench calibrate: error: cannot write --output /dev/full: No space left on device;"
                          f" the profile is in {tmp_path}/asyncdp-bench-") and err.count("\n") == 1
    kept = Path(err.split("the profile is in ")[1].strip())
    assert json.loads(kept.read_text())["refit_of"] == str(source)
