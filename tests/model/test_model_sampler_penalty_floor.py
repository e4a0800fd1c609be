"""The sampler clamps ``repetition_penalty`` to ``MIN_REPETITION_PENALTY`` for params that never went through
``validate()``: a tiny positive penalty made penalised fp32 logits inf, the distribution NaN, and every draw
token 0 (the API and ``validate()`` refuse such values: tests/api/test_repetition_penalty_floor.py)."""

from __future__ import annotations

import pytest
import torch

from asyncdp.engine.sampler import Sampler, apply_penalties
from asyncdp.sampling_params import MIN_REPETITION_PENALTY, SamplingParams


@pytest.mark.parametrize("penalty", [1e-40, 1e-300, MIN_REPETITION_PENALTY])
def test_the_sampler_keeps_logits_finite_under_a_tiny_penalty(penalty: float) -> None:
    logits = torch.tensor([[3.0, -2.0, 1.0, 0.5]])
    params = [SamplingParams(repetition_penalty=penalty)]  # unvalidated, as a caller of the sampler may pass
    penalised = logits.clone()
    apply_penalties(penalised, params, [0], [[0, 1]], [[2]])
    assert torch.isfinite(penalised).all()
    assert penalised[0, 3] == 0.5  # not seen: untouched
    assert penalised[0, 0] > 1e6 and penalised[0, 2] > 1e5  # seen, positive: divided, huge but finite
    tokens, _ = Sampler({99})(logits.clone(), params, [1], prompt_token_ids=[[0, 1]], output_token_ids=[[2]])
    assert tokens == [0]  # the largest penalised logit wins: sampled from a real distribution
    tokens, _ = Sampler({99})(torch.tensor([[-1.0, -1.0, -1.0, 2.0]]), params, [1], prompt_token_ids=[[3]],
                              output_token_ids=[[]])
    assert tokens == [3]  # before: NaN everywhere, and the draw fell on token 0
