"""Sampling through the whole engine on the built-in checkpoints: penalties, logit_bias, per-rank seeds.

The penalised greedy reference is a plain loop over transformers' logits with the penalties applied row by row,
so the engine's batched sampler, the scheduler's token references and the executor's plumbing are all checked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.build import build_engine_core
from asyncdp.engine.core import EngineCore
from asyncdp.llm import LLM
from asyncdp.sampling_params import SamplingParams

PROMPT = [72, 101, 108, 108, 111, 32, 116, 104, 101, 114, 101]
NEW_TOKENS = 24


def engine(path: Path, **changes: object) -> EngineCore:
    config = EngineConfig(model=str(path), device="cpu", block_size=4, num_kv_blocks=80).replace(**changes)
    return build_engine_core(config)


def generate(core: EngineCore, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    llm = LLM.from_engine_core(core)
    return [r.outputs[0].token_ids for r in llm.generate(prompts, params)]


def hf_penalised_greedy(path: Path, prompt: list[int], p: SamplingParams) -> list[int]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path)).eval()
    out: list[int] = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            row = model(torch.tensor([prompt + out])).logits[0, -1].float()
            for t in range(row.shape[0]):
                count = out.count(t)
                if t in prompt or count:
                    row[t] = row[t] / p.repetition_penalty if row[t] > 0 else row[t] * p.repetition_penalty
                row[t] -= p.frequency_penalty * count + p.presence_penalty * (count > 0)
            out.append(int(row.argmax()))
    return out


@pytest.mark.parametrize("penalty", [{"frequency_penalty": 2.0}, {"presence_penalty": 2.0},
                                     {"repetition_penalty": 2.0}])
def test_strong_penalty_changes_greedy_output_as_the_reference_does(dense_path: Path, penalty: dict) -> None:
    plain = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    penalised = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, **penalty)
    core = engine(dense_path)
    unpenalised, = generate(core, [PROMPT], plain)
    # Batched with an unpenalised request: rows without penalties must stay untouched.
    ours, again = generate(core, [PROMPT, PROMPT], penalised), generate(core, [PROMPT], plain)[0]
    assert ours[0] == ours[1] == hf_penalised_greedy(dense_path, PROMPT, penalised)
    assert ours[0] != unpenalised and again == unpenalised


def test_logit_bias_of_100_makes_greedy_output_that_token(dense_path: Path) -> None:
    core = engine(dense_path)
    plain, = generate(core, [PROMPT], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    target = next(t for t in range(33, 120) if t not in plain)
    biased, = generate(core, [PROMPT], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                                                      logit_bias=((target, 100.0),)))
    assert biased == [target] * 8


def test_ranks_of_one_deployment_draw_different_unseeded_samples_and_equal_seeded_ones(dense_path: Path) -> None:
    cores = [build_engine_core(EngineConfig(model=str(dense_path), device="cpu", seed=3), dp_rank=r)
             for r in (0, 1, 1)]
    unseeded = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    seeded = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=99)
    free = [generate(core, [PROMPT], unseeded)[0] for core in cores]
    fixed = [generate(core, [PROMPT], seeded)[0] for core in cores]
    assert free[0] != free[1]  # rank 0 vs rank 1
    assert free[1] == free[2]  # the same rank built twice
    assert fixed[0] == fixed[1] == fixed[2]


@pytest.mark.anyio
async def test_rank_process_builds_its_core_with_its_own_rank_seed(dense_path: Path) -> None:
    from asyncdp import messages as m
    from asyncdp.engine.rank import RankConfig
    from asyncdp.engine.rank_process import _build_core
    from asyncdp.engine.sampler import rank_seed

    init = m.HandshakeInit(clients=[], coordinator=None, dp_group=None, client_count=0)
    engine_config = EngineConfig(model=str(dense_path), device="cpu", seed=5, num_kv_blocks=16)
    for dp_rank in (0, 2):
        core, _, _ = await _build_core(RankConfig(dp_rank=dp_rank, dp_size=3, engine=engine_config), init)
        try:
            assert core.executor.sampler.generator.initial_seed() == rank_seed(5, dp_rank)
        finally:
            core.shutdown()
