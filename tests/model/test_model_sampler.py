"""Sampler: seeded reproducibility across batch compositions, filters, min_tokens and logprobs."""

from __future__ import annotations

import torch

from asyncdp.engine.sampler import Sampler, row_seed
from asyncdp.sampling_params import SamplingParams

VOCAB = 50
EOS = 7


def logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 2


def test_seeded_row_samples_the_same_alone_and_inside_a_batch() -> None:
    seeded = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=42)
    others = [SamplingParams(temperature=0.7), SamplingParams(temperature=0.0), SamplingParams(seed=5, min_p=0.1)]
    for step in range(20):
        batch = logits(4, seed=step)
        alone, _ = Sampler({EOS}, seed=1)(batch[2:3], [seeded], [step])
        mixed, _ = Sampler({EOS}, seed=2)(batch, [others[0], others[1], seeded, others[2]], [0, 3, step, 9])
        assert mixed[2] == alone[0]


def test_seeded_sampling_varies_across_steps_and_seeds() -> None:
    row = torch.zeros(1, VOCAB)  # uniform: the draw is decided by the noise alone
    sampler = Sampler({EOS})
    draws = {sampler(row, [SamplingParams(seed=3)], [n])[0][0] for n in range(30)}
    assert len(draws) > 5
    assert row_seed(3, 0) != row_seed(4, 0) and row_seed(3, 0) != row_seed(3, 1)


def test_top_k_one_equals_greedy() -> None:
    batch = logits(8)
    greedy, _ = Sampler({EOS})(batch, [SamplingParams(temperature=0.0)] * 8, [0] * 8)
    top1, _ = Sampler({EOS})(batch, [SamplingParams(temperature=1.5, top_k=1)] * 8, [0] * 8)
    assert top1 == greedy == batch.argmax(dim=-1).tolist()


def test_tiny_top_p_and_full_min_p_equal_greedy() -> None:
    batch = logits(6, seed=3)
    expected = batch.argmax(dim=-1).tolist()
    assert Sampler({EOS})(batch, [SamplingParams(top_p=1e-6)] * 6, [0] * 6)[0] == expected
    assert Sampler({EOS})(batch, [SamplingParams(min_p=1.0)] * 6, [0] * 6)[0] == expected


def test_unseeded_sampling_follows_the_distribution() -> None:
    row = torch.full((1, VOCAB), -30.0)
    row[0, 10], row[0, 11] = 0.0, 0.0  # two equally likely tokens
    sampler = Sampler({EOS}, seed=0)
    draws = [sampler(row, [SamplingParams()], [0])[0][0] for _ in range(200)]
    assert set(draws) == {10, 11}
    assert 60 < draws.count(10) < 140


def test_min_tokens_masks_eos_and_stop_tokens_until_reached() -> None:
    batch = torch.zeros(2, VOCAB)
    batch[:, EOS] = 10.0
    batch[:, 9] = 9.0
    batch[:, 20] = 8.0
    params = [SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=(9,)),
              SamplingParams(temperature=0.0, min_tokens=3, ignore_eos=True)]
    sampler = Sampler({EOS})
    assert sampler(batch, params, [2, 2])[0] == [20, 9]
    assert sampler(batch, params, [3, 3])[0] == [EOS, EOS]


def test_logprobs_report_raw_distribution_and_requested_width() -> None:
    batch = logits(3, seed=4)
    params = [SamplingParams(temperature=0.0, logprobs=5), SamplingParams(temperature=0.8, logprobs=0),
              SamplingParams(temperature=0.0)]
    tokens, lps = Sampler({EOS})(batch, params, [0, 0, 0])
    assert lps is not None and lps[2] is None
    first, second = lps[0], lps[1]
    assert first is not None and second is not None
    raw = torch.log_softmax(batch, dim=-1)
    assert len(first.top) == 5 and second.top == ()
    assert [t.token_id for t in first.top] == raw[0].topk(5).indices.tolist()
    assert first.token_id == tokens[0] == first.top[0].token_id
    assert abs(second.logprob - raw[1, tokens[1]].item()) < 1e-5
    assert all(a.logprob >= b.logprob for a, b in zip(first.top, first.top[1:], strict=False))


def test_all_greedy_batch_without_logprobs_returns_no_logprobs() -> None:
    tokens, lps = Sampler({EOS})(logits(4), [SamplingParams(temperature=0.0)] * 4, [0] * 4)
    assert lps is None and len(tokens) == 4
