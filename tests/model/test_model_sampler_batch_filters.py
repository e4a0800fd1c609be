"""A seeded row without top-k/top-p samples from its whole distribution even when another row of its batch
asks for those filters (they then run over the whole batch)."""

from __future__ import annotations

import torch

from asyncdp.engine.sampler import Sampler, row_seed
from asyncdp.sampling_params import SamplingParams

VOCAB = 49152  # a real vocabulary's size (SmolLM2's): float32 sums over it round visibly


def tail_favoured_row(seed: int, num_output_tokens: int) -> torch.Tensor:
    """Logits whose least likely tokens meet the row's smallest Exp(1) noise: the seeded draw lands in the
    tail of the distribution, where the cumulative probability in float32 can pass 1.0."""
    generator = torch.Generator().manual_seed(row_seed(seed, num_output_tokens))
    noise = torch.empty(VOCAB).exponential_(generator=generator)
    values = torch.randn(VOCAB, generator=torch.Generator().manual_seed(102)).sort().values
    row = torch.empty(VOCAB)
    row[noise.argsort()] = values
    return row


def test_unfiltered_seeded_row_draws_the_same_token_next_to_rows_with_top_k_or_top_p() -> None:
    seeded = SamplingParams(temperature=1.0, seed=2)  # top_p 1.0, top_k 0: no filter
    row = tail_favoured_row(2, 0)
    alone, _ = Sampler({0})(row[None].clone(), [seeded], [0])
    assert torch.softmax(row, dim=-1)[alone[0]] < 1e-6  # the tail token, as built
    filtered = (SamplingParams(top_k=5), SamplingParams(top_p=0.5), SamplingParams(temperature=0.0, top_k=2))
    for other in filtered:
        mixed, _ = Sampler({0})(torch.stack([row, row]), [seeded, other], [0, 0])
        assert mixed[0] == alone[0], other  # before the fix the top_p 1.0 row lost its tail to rounding
