"""Cost profile files (``bench routing --profile FILE``): a value the simulator cannot run is a usage error at load,
naming the field and the file, before any run."""

from __future__ import annotations

import json

import pytest

from asyncdp.bench.profiles import PROFILES, load_profile
from asyncdp.cli import main
from asyncdp.errors import ConfigError

GOOD = {"a_ms": 6.0, "b_ms_per_token": 0.04, "c_ms_per_seq": 0.03, "d_ms_per_kv_token": 4e-5, "kv_blocks": 28_000,
        "max_num_seqs": 1024, "max_num_batched_tokens": 8192}


def _write(tmp_path, text):
    path = tmp_path / "profile.json"
    path.write_text(text)
    return path


def test_a_good_profile_file_loads():
    assert load_profile("gpu_8b") is PROFILES["gpu_8b"]


@pytest.mark.parametrize(("field", "raw"), [
    ("a_ms", "NaN"), ("b_ms_per_token", "Infinity"), ("c_ms_per_seq", "1e309"), ("d_ms_per_kv_token", "-1e309"),
    ("e_ms_per_token_pair", "NaN"), ("a_ms", "-1"), ("a_ms", '"6"'), ("a_ms", "true"),
])
def test_a_non_finite_negative_or_non_numeric_coefficient_is_refused_naming_field_and_file(tmp_path, field, raw):
    # NaN was accepted: every simulated step then failed (ValueError: cannot convert float NaN to integer), the
    # table read TTFT 0 (the best) and the exit was 0.
    text = json.dumps({**GOOD, field: 0.0}).replace(f'"{field}": 0.0', f'"{field}": {raw}')
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=rf"{path}: cost profile field '{field}' must be"):
        load_profile(str(path))


@pytest.mark.parametrize(("field", "value", "least"), [
    ("max_num_seqs", 0, 1), ("kv_blocks", 0, 2), ("kv_blocks", 1, 2), ("max_num_batched_tokens", 0, 1),
    ("max_num_seqs", 2.5, 1), ("kv_blocks", True, 2), ("max_num_seqs", "8", 1), ("kv_blocks", 1e309, 2),
])
def test_a_capacity_the_engine_cannot_have_is_refused_at_load(tmp_path, field, value, least):
    # max_num_seqs 0 or kv_blocks 0 were refused only once the runs had started, by the engine, naming a flag the
    # user never gave (--max-num-seqs must be >= 1); 1e309 (infinity) was an OverflowError traceback.
    text = json.dumps({**GOOD, field: value}).replace("Infinity", "1e309")
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=rf"{path}: cost profile field '{field}' must be an integer >= {least}"):
        load_profile(str(path))


def test_a_whole_float_capacity_is_read_as_an_integer(tmp_path):
    path = _write(tmp_path, json.dumps({**GOOD, "max_num_seqs": 64.0}))
    assert load_profile(str(path)).max_num_seqs == 64


def test_the_command_refuses_a_bad_profile_with_one_line_before_any_run(tmp_path, capsys):
    path = _write(tmp_path, json.dumps(GOOD).replace('"a_ms": 6.0', '"a_ms": NaN'))
    assert main(["bench", "routing", "--workload", "w1", "--policies", "vllm", "--jobs", "0",
                 "--profile", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"asyncdp: error: {path}: cost profile field 'a_ms' must be a finite number >= 0, got nan.\n"
    path = _write(tmp_path, json.dumps({**GOOD, "max_num_seqs": 0}))
    assert main(["bench", "routing", "--workload", "w1", "--policies", "vllm", "--jobs", "0",
                 "--profile", str(path)]) == 2
    err = capsys.readouterr().err
    assert "max_num_seqs" in err and str(path) in err and "--max-num-seqs" not in err and "runs" not in err
