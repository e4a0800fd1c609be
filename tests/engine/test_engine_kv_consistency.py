"""Scheduling never changes what a request's KV cache holds (hypothesis, with a fake executor that reads it).

``KVReadingExecutor`` stands in for a model whose every output depends on its whole context: it writes each
scheduled token id into the cache slot its block table names and samples from a hash of the context it *reads
back* from the cache. A request's tokens therefore equal its tokens alone on a fresh engine exactly when every
step found the right tokens at the right slots: prefix-cache hits on a block boundary, mid-block or covering
the prompt, blocks shared with a twin admitted in the same step, preemption and recompute, chunked prefill,
requests arriving while others run, aborts, and a forward that fails and is stepped past.
"""

from __future__ import annotations

from hashlib import blake2b

import pytest
from engine_testing import EOS_ID, VOCAB_SIZE, make_byte_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.core import EngineCore
from asyncdp.engine.executor import ModelBatch, StepResult
from asyncdp.sampling_params import SamplingParams

MAX_MODEL_LEN = 48


class ForwardFailed(Exception):
    pass


class KVReadingExecutor:
    """Writes token ids to KV slots; samples from the context read back from them (see the docstring)."""

    def __init__(self, num_kv_blocks: int, block_size: int, fail_at_step: int | None = None) -> None:
        self.num_kv_blocks = num_kv_blocks
        self.max_model_len = MAX_MODEL_LEN
        self.vocab_size = VOCAB_SIZE
        self.block_size = block_size
        self.kv: dict[int, int] = {}  # slot -> token id written there
        self.fail_at_step = fail_at_step
        self.num_steps = 0

    def _slot(self, table: list[int], pos: int) -> int:
        block = table[pos // self.block_size]
        assert block != 0, "block 0 is the executor's scratch block"
        return block * self.block_size + pos % self.block_size

    def execute(self, batch: ModelBatch) -> StepResult:
        self.num_steps += 1
        if self.num_steps == self.fail_at_step:
            raise ForwardFailed
        # A real model samples from the hidden state of the chunk's last token: a chunk needs one.
        assert all(c.token_ids for c in batch.chunks), "an empty chunk has nothing to sample from"
        for c in batch.chunks:  # every write of the step before any read, as a layer of the real model does
            for i, token in enumerate(c.token_ids):
                self.kv[self._slot(c.block_table, c.start_pos + i)] = token
        sampled: list[int | None] = []
        for c in batch.chunks:
            if not c.sample:
                sampled.append(None)
                continue
            end = c.start_pos + len(c.token_ids)
            context = [self.kv.get(self._slot(c.block_table, p), -1) for p in range(end)]
            digest = blake2b(repr(context).encode(), digest_size=4).digest()
            sampled.append(int.from_bytes(digest, "little") % 200 + 32)  # printable bytes, never EOS
        return StepResult(sampled)

    def execute_dummy(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def make_core(num_kv_blocks: int = 64, block_size: int = 4, fail_at_step: int | None = None,
              **config: object) -> EngineCore:
    cfg = EngineConfig(executor="sim", block_size=block_size, **config).validate()  # type: ignore[arg-type]
    executor = KVReadingExecutor(num_kv_blocks, block_size, fail_at_step)
    return EngineCore(cfg, executor, make_byte_tokenizer(), eos_token_ids={EOS_ID})


def alone(prompt: list[int], max_tokens: int) -> list[int]:
    core = make_core()
    core.add_request("r", prompt, SamplingParams(max_tokens=max_tokens))
    tokens: list[int] = []
    while core.has_unfinished():
        for out in core.step().outputs:
            tokens += out.new_token_ids
    return tokens


BASE = list(b"a shared system prompt that many requests start with")


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[list[int], int, int, int | None]]:
    """Requests as (prompt, max_tokens, arrival step, abort step or None)."""
    out = []
    for _ in range(draw(st.integers(1, 7))):
        shared = draw(st.integers(0, 30))
        suffix = draw(st.lists(st.integers(32, 126), min_size=0 if shared else 1, max_size=8))
        max_tokens = draw(st.integers(1, 12))
        arrival = draw(st.integers(0, 6))
        abort = draw(st.none() | st.integers(arrival, arrival + 8))
        out.append((BASE[:shared] + suffix, max_tokens, arrival, abort))
    return out


@settings(max_examples=150)
@given(workload=workloads(), block_size=st.sampled_from([1, 2, 4, 8]), spare_blocks=st.integers(0, 40),
       budget=st.integers(1, 40), max_num_seqs=st.integers(1, 6), prefix_caching=st.booleans(),
       fail_at_step=st.none() | st.integers(1, 12))
def test_every_request_gets_its_tokens_alone_whatever_the_schedule(
        workload: list[tuple[list[int], int, int, int | None]], block_size: int, spare_blocks: int,
        budget: int, max_num_seqs: int, prefix_caching: bool, fail_at_step: int | None) -> None:
    num_kv_blocks = -(-MAX_MODEL_LEN // block_size) + 1 + spare_blocks  # one full-length request always fits
    core = make_core(num_kv_blocks, block_size, fail_at_step, max_num_batched_tokens=budget,
                     max_num_seqs=max_num_seqs, enable_prefix_caching=prefix_caching)
    got: dict[str, list[int]] = {}
    finish: dict[str, str | None] = {}
    step = 0
    while step < 400 and (core.has_unfinished() or any(arrival >= step for _, _, arrival, _ in workload)):
        for i, (prompt, max_tokens, arrival, abort) in enumerate(workload):
            if arrival == step:
                core.add_request(str(i), prompt, SamplingParams(max_tokens=max_tokens))
                got[str(i)] = []
            if abort == step and arrival <= step:
                core.abort_requests([str(i)])
        try:
            outputs = core.step().outputs
        except ForwardFailed:
            outputs = []
        for out in outputs:
            got[out.request_id] += out.new_token_ids
            if out.finished:
                finish[out.request_id] = out.finish_reason
        step += 1
    assert not core.has_unfinished()
    for i, (prompt, max_tokens, _, _) in enumerate(workload):
        if finish[str(i)] != "abort":
            assert (got[str(i)], finish[str(i)]) == (alone(prompt, max_tokens), "length")
        else:
            assert got[str(i)] == alone(prompt, max_tokens)[:len(got[str(i)])]  # a prefix of its answer


def test_the_kv_reading_executor_notices_a_wrong_context() -> None:
    """The fake itself: the same prompt with one token changed in the middle samples other tokens."""
    prompt = list(BASE[:20])
    changed = prompt[:9] + [prompt[9] + 1] + prompt[10:]
    assert alone(prompt, 6) != alone(changed, 6)


@pytest.mark.parametrize("prompt_len", [5, 8, 9])
def test_a_twin_admitted_in_the_same_step_reads_the_blocks_its_twin_writes(prompt_len: int) -> None:
    core = make_core()
    for rid in ("a", "b"):
        core.add_request(rid, BASE[:prompt_len], SamplingParams(max_tokens=4))
    out: dict[str, list[int]] = {"a": [], "b": []}
    while core.has_unfinished():
        for o in core.step().outputs:
            out[o.request_id] += o.new_token_ids
    assert out["a"] == out["b"] == alone(BASE[:prompt_len], 4)
