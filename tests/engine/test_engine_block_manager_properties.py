"""Hypothesis: under any sequence of admit / grow / free, the block manager's books stay consistent."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncdp.engine.block_manager import BlockManager
from asyncdp.engine.request import Request
from asyncdp.sampling_params import SamplingParams

ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "grow", "free"]),
        st.integers(0, 5),  # which request slot
        st.lists(st.integers(0, 2), min_size=1, max_size=20),  # prompt (small alphabet: shared prefixes)
        st.integers(1, 9),  # tokens to add
    ),
    max_size=60,
)


def check_invariants(bm: BlockManager, live: dict[int, Request]) -> None:
    expected = [0] * bm.num_blocks
    for r in live.values():
        for bid in r.block_ids:
            expected[bid] += 1
        assert len(r.block_ids) * bm.block_size >= r.num_computed_tokens
    free = set(bm.free_block_ids())
    for bid in range(bm.num_blocks):
        assert bm.ref_count(bid) >= 0
        assert bm.ref_count(bid) == expected[bid]
        assert not (bid in free and bm.ref_count(bid) > 0), "block both free and referenced"
        if bid != bm.scratch_block_id:
            assert bid in free or bm.ref_count(bid) > 0, "block leaked"
    assert bm.scratch_block_id not in free and bm.ref_count(0) == 0
    for bid in range(bm.num_blocks):  # a hashed block is findable under its hash
        h = bm.block_hash(bid)
        if h is not None:
            assert bm.cached_block_id(h) == bid
    assert 0.0 <= bm.usage <= 1.0


@settings(max_examples=150, deadline=None)
@given(ops=ops, block_size=st.sampled_from([1, 2, 4]))
def test_refcounts_and_free_queue_stay_consistent(ops, block_size):
    bm = BlockManager(12, block_size, reserve_scratch_block=True)
    live: dict[int, Request] = {}
    counter = 0
    for op, slot, prompt, n in ops:
        r = live.get(slot)
        if op == "admit" and r is None:
            counter += 1
            r = Request(str(counter), prompt, SamplingParams(), arrival_time=0.0, max_tokens=16)
            prefix = bm.find_cached_prefix(r)
            start = len(prefix) * block_size
            assert start < r.num_tokens
            take = min(n, r.num_tokens - start)
            if bm.allocate(r, take, prefix):
                r.num_computed_tokens = start + take
                live[slot] = r
            else:
                assert r.block_ids == []
        elif op == "grow" and r is not None:
            for _ in range(n):  # decode-like growth: extend tokens when the prompt is computed
                if r.num_computed_tokens == r.num_tokens:
                    r.append_output_token(n % 3)
            take = min(n, r.num_tokens - r.num_computed_tokens)
            before = list(r.block_ids)
            if bm.allocate(r, take):
                r.num_computed_tokens += take
            else:
                assert r.block_ids == before
        elif op == "free" and r is not None:
            bm.free(r)
            del live[slot]
        check_invariants(bm, live)
