import json
import math

import pytest

from asyncdp.bench.arrivals import Trace
from asyncdp.bench.materialise import Materialiser, ideal_hit_rate
from asyncdp.bench.trace import encode_trace, parse_trace, read_trace, write_trace
from asyncdp.bench.workloads import build
from asyncdp.errors import ConfigError

GOOD = [
    {"timestamp": 1000, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
    {"timestamp": 1500, "input_length": 700, "output_length": 5, "hash_ids": [0, 3], "extra": "ignored"},
    {"timestamp": 1500.5, "input_length": 512, "output_length": 1, "hash_ids": [4]},
]


def _lines(rows) -> bytes:
    return b"".join((row if isinstance(row, str) else json.dumps(row)).encode() + b"\n" for row in rows)


def test_read_trace_materialises_blocks_by_id_with_times_from_the_first_request(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(_lines([GOOD[0], "", "   ", *GOOD[1:]]))
    w = read_trace(path, seed=5)
    assert [r.t_arrival_ms for r in w.records] == [0.0, 500.0, 500.5]
    assert w.records[0].segments == (("m/0", 512), ("m/1", 512), ("m/2", 76))
    assert w.records[1].segments == (("m/0", 512), ("m/3", 188))
    assert w.arrival == Trace(speed=1.0) and w.seed == 5 and w.name == "trace:t.jsonl"
    mat = Materialiser(5)
    a, b = mat.prompt(w.records[0]), mat.prompt(w.records[1])
    assert a[:512] == b[:512] and a[512:700] != b[512:700]
    assert w.ideal_hit_rate == pytest.approx(512 / (1100 + 700 + 512), abs=1e-6)


def test_a_truncated_last_block_is_a_prefix_of_the_whole_block():
    records = parse_trace(_lines([
        {"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [7, 8]},
        {"timestamp": 1, "input_length": 1024, "output_length": 1, "hash_ids": [7, 8]},
    ]))
    mat = Materialiser(0)
    assert mat.prompt(records[1])[:600] == mat.prompt(records[0])


def test_block_size_sets_how_many_ids_a_row_needs():
    row = {"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [1, 2, 3, 4]}
    assert parse_trace(_lines([row]), block_size=32)[0].segments[-1] == ("m/4", 4)
    with pytest.raises(ConfigError, match="too many hash_ids"):
        parse_trace(_lines([row]))


BAD = [
    ('{"timestamp": 0, "input_length"', "not JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ({"timestamp": 2000, "input_length": 10, "output_length": 1}, "missing field 'hash_ids'"),
    ({"input_length": 10, "output_length": 1, "hash_ids": [1]}, "missing field 'timestamp'"),
    ({"timestamp": "soon", "input_length": 10, "output_length": 1, "hash_ids": [1]}, "'timestamp' must be a number"),
    ({"timestamp": 2000, "input_length": "10", "output_length": 1, "hash_ids": [1]},
     "'input_length' must be an integer"),
    ({"timestamp": 2000, "input_length": 10, "output_length": True, "hash_ids": [1]},
     "'output_length' must be an integer"),
    ({"timestamp": 2000, "input_length": 10, "output_length": 1, "hash_ids": [1.5]}, "'hash_ids' must be a list"),
    ({"timestamp": 2000, "input_length": 10, "output_length": 1, "hash_ids": "1"}, "'hash_ids' must be a list"),
    ({"timestamp": 2000, "input_length": -5, "output_length": 1, "hash_ids": []}, "'input_length' must be >= 1"),
    ({"timestamp": 2000, "input_length": 10, "output_length": 0, "hash_ids": [1]}, "'output_length' must be >= 1"),
    ({"timestamp": 2000, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]},
     "too few hash_ids: 2 for input_length 1025, expected 3"),
    ({"timestamp": 2000, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}, "too many hash_ids"),
    ({"timestamp": 999, "input_length": 10, "output_length": 1, "hash_ids": [1]},
     r"timestamp 999 goes backwards \(line 1 has 1000\)"),
    # an OverflowError traceback before
    ({"timestamp": 1e308, "input_length": 10, "output_length": 1, "hash_ids": [1]},
     r"timestamp 1e\+308 is .* hours after the first request's \(1000 ms\); the simulator stops a run after 48 "
     "virtual hours"),
    # a mistyped line: the simulator stepped through virtual hours for minutes, then called it a stall
    ({"timestamp": 1e12, "input_length": 10, "output_length": 1, "hash_ids": [1]},
     r"is 2.778e\+05 hours after the first request's"),
    # accepted, 4 GB of answer tokens, then cut short at the engine's max_model_len
    ({"timestamp": 2000, "input_length": 10, "output_length": 100_000_000, "hash_ids": [1]},
     r"input_length 10 \+ output_length 100000000 tokens exceed the simulated engine's max_model_len 65536"),
    ({"timestamp": 2000, "input_length": 65_536, "output_length": 1, "hash_ids": list(range(128))},
     "exceed the simulated engine's max_model_len 65536"),
]


@pytest.mark.parametrize(("line", "message"), BAD)
def test_a_bad_line_is_a_config_error_naming_the_file_and_the_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(_lines([GOOD[0], "", line, GOOD[1]]))
    with pytest.raises(ConfigError, match=message) as caught:
        read_trace(path)
    assert str(caught.value).startswith(f"{path}:3: ")


def test_an_empty_or_missing_trace_is_a_config_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"\n\n")
    with pytest.raises(ConfigError, match="has no requests"):
        read_trace(path)
    with pytest.raises(ConfigError, match="cannot read trace"):
        read_trace(tmp_path / "missing.jsonl")


def test_a_trace_round_trips_byte_for_byte(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(_lines([{**GOOD[0], "timestamp": 0}, *GOOD[1:2]]))
    out = tmp_path / "out.jsonl"
    write_trace(read_trace(source), out)
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]},
        {"timestamp": 1500, "input_length": 700, "output_length": 5, "hash_ids": [0, 3]}]
    assert encode_trace(read_trace(out)) == out.read_bytes()


def test_a_generated_w10_exports_its_own_ids_and_replays_the_same_tokens(tmp_path):
    w = build("w10", "quick", 1, {"replay": "schedule"})
    path = tmp_path / "w10.jsonl"
    write_trace(w, path)
    back = read_trace(path, seed=w.seed)
    first = w.records[0].t_arrival_ms
    assert len(back.records) == len(w.records)
    for a, b in zip(w.records, back.records, strict=True):
        assert (a.hash_ids, a.segments, a.input_length, a.output_length) == (
            b.hash_ids, b.segments, b.input_length, b.output_length)
        assert b.t_arrival_ms == round(a.t_arrival_ms - first)
    assert back.ideal_hit_rate == pytest.approx(w.ideal_hit_rate, abs=1e-6)


def test_exported_ids_are_equal_exactly_where_prefixes_are(tmp_path):
    w = build("w1", "quick", 1)  # S=1024: two whole 512-blocks of system prompt per group
    path = tmp_path / "w1.jsonl"
    write_trace(w, path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(len(row["hash_ids"]) == math.ceil(row["input_length"] / 512) for row in rows)
    heads: dict[str, tuple[int, ...]] = {}
    for r, row in zip(w.records, rows, strict=True):
        assert tuple(row["hash_ids"][:2]) == heads.setdefault(r.group, tuple(row["hash_ids"][:2]))
    assert len(set(heads.values())) == 16
    assert len({row["hash_ids"][2] for row in rows}) == len(rows)
    assert ideal_hit_rate(read_trace(path).records) == pytest.approx(w.ideal_hit_rate, abs=1e-6)


def test_closed_loop_records_are_exported_at_predecessor_plus_think_time(tmp_path):
    w = build("w10", "quick", 2)  # sessions: later turns wait for the previous answer
    stamps = [json.loads(line)["timestamp"] for line in encode_trace(w).decode().splitlines()]
    assert stamps == sorted(stamps) and stamps[0] == 0
    schedule = build("w10", "quick", 2, {"replay": "schedule"})
    fixed = [json.loads(line)["timestamp"] for line in encode_trace(schedule).decode().splitlines()]
    assert len(fixed) == len(stamps) and all(abs(a - b) <= 1 for a, b in zip(stamps, fixed, strict=True))


def test_a_timestamp_at_the_simulators_limit_and_a_request_that_just_fits_are_accepted():
    records = parse_trace(_lines([
        {"timestamp": 5, "input_length": 65_535, "output_length": 1, "hash_ids": list(range(128))},
        {"timestamp": 5 + 48 * 3600 * 1000, "input_length": 10, "output_length": 1, "hash_ids": [1]},
    ]))
    assert records[1].t_arrival_ms == 48 * 3600 * 1000
    with pytest.raises(ConfigError, match=r"max_model_len 32 \(a profile\)"):
        parse_trace(_lines([GOOD[2]]), max_model_len=32, why="a profile")


def test_the_command_bounds_a_trace_by_the_profiles_kv_cache_and_its_replay_by_the_simulators_limit(tmp_path,
                                                                                                      capsys):
    from asyncdp.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_bytes(_lines(GOOD))
    profile = tmp_path / "small.json"
    profile.write_text(json.dumps({"a_ms": 6, "b_ms_per_token": 0.04, "c_ms_per_seq": 0.03, "d_ms_per_kv_token": 0,
                                   "kv_blocks": 65, "max_num_seqs": 4, "max_num_batched_tokens": 8192}))
    assert main(["bench", "routing", "--trace", str(trace), "--policies", "vllm", "--jobs", "0",
                 "--profile", str(profile)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"asyncdp: error: {trace}:1: input_length 1100 + output_length 10 tokens exceed the "
                          "simulated engine's max_model_len 1024 (what profile small's KV cache holds: kv_blocks 65 ")
    assert main(["bench", "routing", "--trace", str(trace), "--policies", "vllm", "--jobs", "0",
                 "--rate-scale", "1e-6"]) == 2  # 0.5 s stretched a million times: 139 virtual hours
    err = capsys.readouterr().err
    assert err == ("asyncdp: error: trace:t.jsonl: --rate-scale 1e-06 would send its last request about 139 virtual "
                   "hours after its first; the simulator stops a run after 48 virtual hours (raise it).\n")
    # W4's dispatcher: 128 records at 1 req/s at the slowest, a million times slower (ran for over 5 minutes)
    assert main(["bench", "routing", "--workload", "w4", "--policies", "vllm", "--jobs", "0",
                 "--rate-scale", "1e-6"]) == 2
    assert "w4: --rate-scale 1e-06 would send its last request about 3.556e+04 virtual hours" in capsys.readouterr().err
