"""Ctrl-C in ``LLM.generate`` that lands in the scheduler (not in the forward), on the real tiny model: the next
``generate`` on the same object returns the tokens a fresh ``LLM`` returns (tests/engine/test_engine_interrupted_step.py
checks every injection point with a fake model that reads its KV cache back)."""

import random

import pytest

from asyncdp import LLM, SamplingParams
from asyncdp.engine.block_manager import BlockManager

CONFIG = {"num_kv_blocks": 17, "block_size": 16, "max_model_len": 256}  # 16 usable blocks: it preempts
PARAMS = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _prompts() -> list[list[int]]:
    rng = random.Random(1)
    shared = [65 + i % 26 for i in range(40)]  # a shared prefix of two full blocks and more
    return [shared + [rng.randint(32, 126) for _ in range(rng.randint(5, 30))] for _ in range(6)]


@pytest.mark.parametrize("nth", [1, 3])
def test_generate_after_ctrl_c_in_the_scheduler_matches_a_fresh_llm(monkeypatch, nth):
    prompts = _prompts()
    with LLM("builtin:tiny-dense", **CONFIG) as fresh:
        expected = [r.outputs[0].token_ids for r in fresh.generate(prompts, PARAMS)]
    real = BlockManager.allocate
    calls = 0

    def allocate(self, *args, **kwargs):  # Ctrl-C right after the nth allocation (its blocks are published)
        nonlocal calls
        calls += 1
        ok = real(self, *args, **kwargs)
        if calls == nth:
            raise KeyboardInterrupt
        return ok

    with LLM("builtin:tiny-dense", **CONFIG) as llm:
        monkeypatch.setattr(BlockManager, "allocate", allocate)
        with pytest.raises(KeyboardInterrupt):
            llm.generate(prompts, PARAMS)
        monkeypatch.undo()
        # Before the fix the blocks of the interrupted step stayed published with no KV written: later prompts
        # took them as prefix-cache hits and generated other tokens.
        assert [r.outputs[0].token_ids for r in llm.generate(prompts, PARAMS)] == expected
        bm = llm.llm_engine.block_manager
        assert bm.num_free_blocks == bm.num_usable_blocks and not llm.llm_engine.has_unfinished()
