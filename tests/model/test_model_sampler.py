"""Sampler: seeded reproducibility across batch compositions, filters, min_tokens, logprobs, penalties, logit_bias."""

from __future__ import annotations

import pytest
import torch

from asyncdp.engine.sampler import Sampler, apply_logit_bias, apply_penalties, rank_seed, row_seed
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


# ---------------------------------------------------------------- penalties and logit_bias


def reference_processed(row: torch.Tensor, p: SamplingParams, prompt: list[int], output: list[int]) -> torch.Tensor:
    """One row, token by token: bias, then repetition / frequency / presence penalties (vLLM semantics)."""
    out = row.clone()
    for token_id, bias in p.logit_bias:
        out[token_id] += bias
    for t in range(out.shape[0]):
        count = output.count(t)
        if t in prompt or count:
            out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
        out[t] -= p.frequency_penalty * count + p.presence_penalty * (count > 0)
    return out


PENALISED = [
    SamplingParams(temperature=0.0, repetition_penalty=1.7),
    SamplingParams(temperature=0.0, frequency_penalty=1.5),
    SamplingParams(temperature=0.0, presence_penalty=-1.2, logit_bias=((3, 4.0), (40, -100.0))),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, repetition_penalty=0.6, frequency_penalty=-0.5, presence_penalty=2.0,
                   logit_bias=((7, 2.5),)),
]


def penalised_batch(seed: int) -> tuple[torch.Tensor, list[list[int]], list[list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    batch = torch.randn(len(PENALISED), VOCAB, generator=gen) * 2
    prompts = [torch.randint(0, VOCAB, (int(n),), generator=gen).tolist() for n in (5, 1, 9, 3, 12)]
    outputs = [torch.randint(0, VOCAB // 4, (int(n),), generator=gen).tolist() for n in (7, 12, 0, 4, 20)]
    return batch, prompts, outputs


def test_penalties_and_logit_bias_match_a_per_row_reference() -> None:
    for seed in range(5):
        batch, prompts, outputs = penalised_batch(seed)
        processed = batch.clone()
        bias_rows = [i for i, p in enumerate(PENALISED) if p.logit_bias]
        apply_logit_bias(processed, PENALISED, bias_rows)
        apply_penalties(processed, PENALISED, [i for i, p in enumerate(PENALISED) if p.has_penalties],
                        prompts, outputs)
        expected = torch.stack([reference_processed(batch[i], p, prompts[i], outputs[i])
                                for i, p in enumerate(PENALISED)])
        torch.testing.assert_close(processed, expected)
        tokens, _ = Sampler({EOS})(batch, PENALISED, [len(o) for o in outputs],
                                   prompt_token_ids=prompts, output_token_ids=outputs)
        assert tokens == expected.argmax(dim=-1).tolist()


def test_repetition_penalty_matches_transformers_processor() -> None:
    from transformers import RepetitionPenaltyLogitsProcessor

    gen = torch.Generator().manual_seed(11)
    batch = torch.randn(3, VOCAB, generator=gen) * 3
    prompts = [[1, 2, 3, 2], [50], [9, 9, 60, 61]]
    outputs = [[4, 4, 5], [50, 51], []]
    for penalty in (0.5, 1.3, 2.0):
        params = [SamplingParams(temperature=0.0, repetition_penalty=penalty)] * 3
        ours = batch.clone()
        apply_penalties(ours, params, [0, 1, 2], prompts, outputs)
        processor = RepetitionPenaltyLogitsProcessor(penalty)
        theirs = torch.stack([processor(torch.tensor([p + o]), batch[i:i + 1].clone())[0]
                              for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))])
        torch.testing.assert_close(ours, theirs)


def test_penalties_apply_to_greedy_rows_and_leave_logprobs_raw() -> None:
    batch = torch.zeros(1, VOCAB)
    batch[0, 10], batch[0, 11] = 5.0, 4.0
    params = [SamplingParams(temperature=0.0, frequency_penalty=1.0, logprobs=1)]
    tokens, lps = Sampler({EOS})(batch, params, [2], prompt_token_ids=[[]], output_token_ids=[[10, 10]])
    assert tokens == [11]  # 5 - 2 * 1 < 4
    assert lps is not None and lps[0] is not None
    raw = torch.log_softmax(batch, dim=-1)
    assert lps[0].top[0].token_id == 10 and abs(lps[0].logprob - raw[0, 11].item()) < 1e-6


def test_logit_bias_steers_sampled_rows_and_ignores_ids_beyond_the_vocabulary() -> None:
    batch = logits(4, seed=9)
    params = [SamplingParams(temperature=1.0, logit_bias=((17, 100.0), (VOCAB + 5, 100.0)))] * 4
    tokens, _ = Sampler({EOS}, seed=3)(batch, params, [0] * 4)
    assert tokens == [17] * 4


def test_rank_seeds_differ_across_ranks_and_seeds_and_are_stable() -> None:
    seeds = {rank_seed(s, r) for s in range(4) for r in range(8)}
    assert len(seeds) == 32 and rank_seed(0, 1) == rank_seed(0, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_penalties_and_logit_bias_on_cuda_match_cpu() -> None:
    batch, prompts, outputs = penalised_batch(0)
    rows = [i for i, p in enumerate(PENALISED) if p.has_penalties]
    results = []
    for device in ("cpu", "cuda"):
        processed = batch.to(device)
        apply_logit_bias(processed, PENALISED, [i for i, p in enumerate(PENALISED) if p.logit_bias])
        apply_penalties(processed, PENALISED, rows, prompts, outputs)
        results.append(processed.cpu())
    torch.testing.assert_close(results[1], results[0])
