import subprocess
import sys

import pytest

from asyncdp.bench.materialise import (
    Materialiser,
    SegmentCache,
    answer_tokens,
    hashes,
    ideal_hit_rate,
    ideal_hit_rate_by,
    ideal_hits,
    ideal_hits_tokens,
    prompt_tokens,
    segment_tokens,
)
from asyncdp.bench.records import Record, answer_segment_id
from asyncdp.bench.workloads import build
from asyncdp.engine.block_manager import compute_block_hashes


def _rec(req_id, segments, output=4):
    return Record(req_id=req_id, t_arrival_ms=0.0, client=0, turn=0, after_req=None, think_ms=0.0,
                  segments=tuple(segments), input_length=sum(n for _, n in segments), output_length=output,
                  group="g")


def test_segment_tokens_are_a_prefix_stream_over_the_vocabulary():
    long = segment_tokens(7, "sys/1", 2000)
    assert segment_tokens(7, "sys/1", 300) == long[:300]
    assert all(0 <= t < 32_000 for t in long)
    assert len(set(long)) > 1900
    assert segment_tokens(8, "sys/1", 300) != long[:300]
    assert segment_tokens(7, "sys/2", 300) != long[:300]


def test_segment_tokens_do_not_depend_on_the_process_hash_salt():
    code = "from asyncdp.bench.materialise import segment_tokens; print(segment_tokens(1, 'a/b', 8))"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": salt, "PYTHONPATH": "."}).stdout for salt in ("1", "2")}
    assert outs == {f"{segment_tokens(1, 'a/b', 8)}\n"}


def test_prompt_is_its_segments_concatenated_and_answer_its_answer_segment():
    r = _rec(5, [("a", 10), ("b", 3)], output=6)
    assert prompt_tokens(r, 1) == segment_tokens(1, "a", 10) + segment_tokens(1, "b", 3)
    assert answer_tokens(r, 1) == segment_tokens(1, answer_segment_id(5), 6)
    mat = Materialiser(1)
    assert mat.prompt(_rec(0, [("a", 4)])) == segment_tokens(1, "a", 4)
    assert mat.prompt(r) == prompt_tokens(r, 1)  # a longer draw of a cached segment


def test_hashes_are_the_engine_block_hashes_of_full_blocks_only():
    seq = segment_tokens(1, "x", 50)
    assert hashes(seq, 16) == compute_block_hashes(seq, 16)
    assert len(hashes(seq, 16)) == 3
    assert hashes(seq[:48], 16) == hashes(seq, 16)
    assert hashes(seq[:32], 16) == hashes(seq, 16)[:2]


def test_ideal_hits_count_whole_cached_blocks_capped_before_the_last_token():
    records = [
        _rec(0, [("sys", 40), ("q0", 10)]),
        _rec(1, [("sys", 40), ("q1", 10)]),  # shares 40 tokens: 2 whole blocks
        _rec(2, [("sys", 40), ("q1", 10)]),  # identical prompt of 50: hit capped at floor(49/16)*16 = 48
        _rec(3, [("sys", 32)]),  # fully cached prompt of 32: cap floor(31/16)*16 = 16
    ]
    assert ideal_hits(records) == [0, 32, 48, 16]
    assert ideal_hit_rate(records) == pytest.approx(96 / 182)


def test_ideal_hits_include_the_previous_answer_but_not_its_last_token():
    first = _rec(0, [("q", 32)], output=17)  # cached: 32 + 16 answer tokens (the 17th has no KV)
    follow = _rec(1, [("q", 32), (answer_segment_id(0), 17), ("q2", 40)])
    assert ideal_hits([first, follow]) == [0, 48]


def test_segment_cache_does_not_match_a_segment_after_a_different_length():
    cache = SegmentCache()
    cache.insert([("a", 10), ("b", 20)], 30)
    assert cache.match([("a", 10), ("b", 5)]) == 15
    assert cache.match([("a", 12), ("b", 20)]) == 10
    assert cache.match([("a", 8), ("b", 20)]) == 8
    assert cache.match([("c", 8)]) == 0


@pytest.mark.parametrize(("spec", "count"), [
    ("w1", 128), ("w2", 150), ("w3@ray_scaling", 150), ("w4", 128), ("w5", 64), ("w6", 150), ("w10", 50)])
def test_ideal_hits_on_segments_equal_those_on_tokens_and_block_hashes(spec, count):
    w = build(spec, "quick", 2)
    records = w.records[:count]
    assert ideal_hits(records) == ideal_hits_tokens(records, w.seed)


def test_ideal_hit_rate_by_round_of_the_multi_turn_chat():
    w = build("w4", "quick", 1)
    by_round = ideal_hit_rate_by(w.records, lambda r: r.turn)
    assert list(by_round) == [0, 1, 2, 3]
    assert by_round[0] == 0.0
    assert by_round[1] == pytest.approx(((256 + 32 - 1) // 16 * 16) / (256 + 32 + 256))  # answer less its last token
    assert by_round[1] < by_round[2] < by_round[3]
