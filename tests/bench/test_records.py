import msgspec
import pytest

from asyncdp.bench.arrivals import Closed, Ladder, Poisson, RelativeLadder, Trace
from asyncdp.bench.records import (
    Record,
    Workload,
    answer_segment_id,
    check_records,
    decode_workload,
    encode_workload,
    read_workload,
    resolve,
    write_workload,
)
from asyncdp.errors import ConfigError


def _record(req_id: int, t: float | None = 0.0, after: int | None = None, length: int = 20) -> Record:
    return Record(req_id=req_id, t_arrival_ms=t, client=0, turn=0, after_req=after, think_ms=0.0,
                  segments=(("sys", 16), (f"q/{req_id}", length - 16)), input_length=length, output_length=4,
                  group="g")


def _workload(arrival=None, records=None) -> Workload:
    return Workload(name="t", scale="quick", seed=3, arrival=arrival or Poisson(rate_rps=2.0),
                    records=tuple(records or [_record(0, 10.0), _record(1, 30.0)]), ideal_hit_rate=0.25,
                    dp_size=4, options={"z": 1, "a": [1, 2]})


def test_workload_jsonl_round_trip_gives_the_same_workload_and_bytes(tmp_path):
    w = _workload()
    path = tmp_path / "w.jsonl"
    write_workload(w, path)
    back = read_workload(path)
    assert back == w
    assert encode_workload(back) == path.read_bytes()
    header, *lines = path.read_bytes().splitlines()
    assert list(msgspec.json.decode(header)) == ["workload"]
    assert len(lines) == 2 and b'"input_length":20' in lines[0]


def test_decode_names_the_line_of_a_bad_record():
    data = encode_workload(_workload()).replace(b'"input_length":20,', b'"input_length":"x",', 1)
    with pytest.raises(ConfigError, match=r"w\.jsonl:2: bad request record"):
        decode_workload(data, "w.jsonl")


def test_decode_rejects_a_file_without_header():
    with pytest.raises(ConfigError, match="not a workload header"):
        decode_workload(b'{"req_id": 0}\n', "x")
    with pytest.raises(ConfigError, match="empty workload file"):
        decode_workload(b"\n\n", "x")


@pytest.mark.parametrize(("records", "message"), [
    ([_record(1)], "req_id is 1, expected its index 0"),
    ([_record(0), _record(1, None, after=1)], "after_req 1 does not name an earlier record"),
    ([msgspec.structs.replace(_record(0), input_length=21)], "do not add up"),
])
def test_check_records_rejects_broken_invariants(records, message):
    with pytest.raises(ConfigError, match=message):
        check_records(tuple(records))


def test_answer_segment_id_is_per_request():
    assert answer_segment_id(3) != answer_segment_id(4)


def test_resolve_divides_open_loop_times_by_rate_scale_and_only_once():
    w = resolve(_workload(), rate_scale=2.0)
    assert [r.t_arrival_ms for r in w.records] == [5.0, 15.0]
    assert w.arrival == Poisson(rate_rps=4.0) and w.resolved
    with pytest.raises(ConfigError, match="resolve it once"):
        resolve(w, 2.0)


def test_resolve_places_a_relative_ladder_at_r_sat():
    ladder = RelativeLadder(fractions=(0.5, 1.0), requests_per_rung=(1, 1))
    with pytest.raises(ConfigError, match="measured R_sat"):
        resolve(_workload(ladder))
    w = resolve(_workload(ladder), rate_scale=1.0, r_sat_rps=10.0)
    assert [r.t_arrival_ms for r in w.records] == [1.0, 3.0]
    assert w.arrival == Ladder(rungs=((5.0, 0.2), (10.0, 0.1)), requests_per_rung=(1, 1))


def test_resolve_keeps_closed_loop_and_replays_a_trace_at_its_speed():
    closed = resolve(_workload(Closed(concurrency=2), [_record(0, None), _record(1, None, after=0)]), 3.0)
    assert [r.t_arrival_ms for r in closed.records] == [None, None]
    trace = resolve(_workload(Trace(speed=0.8)))
    assert [r.t_arrival_ms for r in trace.records] == [12.5, 37.5]
