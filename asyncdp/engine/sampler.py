"""Batched sampling of one token per row of ``logits [B, V]`` (fp32).

Order per row: raw log-probabilities for logprobs (log_softmax of the unprocessed logits) -> min_tokens mask (EOS
and ``stop_token_ids`` get -inf while ``num_output_tokens < min_tokens``; EOS is masked even with ``ignore_eos``,
which is harmless since it would not stop the request) -> greedy rows take the argmax; sampled rows divide by the
temperature, apply min-p (on the tempered distribution), then top-k and top-p (one sort shared by both), and draw
with the exponential race ``argmax(p / Exp(1))``.

Reproducibility: a row with ``seed`` draws its Exp(1) noise from its own ``torch.Generator`` seeded with
BLAKE2b(seed, num_output_tokens), so the same request yields the same tokens whatever else shares its batch.
Rows without a seed share one generator seeded from the engine seed. Fast path: an all-greedy batch without
logprobs or active min_tokens is a single argmax.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

import torch

from asyncdp.messages import Logprob, TokenLogprobs
from asyncdp.sampling_params import SamplingParams


def row_seed(seed: int, num_output_tokens: int) -> int:
    data = (seed % 2**64).to_bytes(8, "little") + num_output_tokens.to_bytes(8, "little")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & (2**63 - 1)


class Sampler:
    def __init__(self, eos_token_ids: Collection[int], seed: int = 0, device: torch.device | None = None) -> None:
        self.eos_token_ids = tuple(sorted(eos_token_ids))
        self.device = device or torch.device("cpu")
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, params: Sequence[SamplingParams],
                 num_output_tokens: Sequence[int]) -> tuple[list[int], list[TokenLogprobs | None] | None]:
        """Sample one token per row. Returns the tokens and, when any row asked for logprobs, per-row logprobs."""
        want_logprobs = any(p.logprobs is not None for p in params)
        min_tokens_rows = [i for i, (p, n) in enumerate(zip(params, num_output_tokens, strict=True))
                           if n < p.min_tokens]
        all_greedy = all(p.greedy for p in params)
        if all_greedy and not want_logprobs and not min_tokens_rows:
            return logits.argmax(dim=-1).tolist(), None

        raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        if min_tokens_rows:
            logits = logits.clone()
            for i in min_tokens_rows:
                banned = list(self.eos_token_ids) + list(params[i].stop_token_ids)
                logits[i, [t for t in banned if t < logits.shape[1]]] = float("-inf")

        if all_greedy:
            tokens = logits.argmax(dim=-1)
        else:
            tokens = self._sample(logits, params, num_output_tokens)
        token_list: list[int] = tokens.tolist()
        if raw_logprobs is None:
            return token_list, None
        return token_list, self._logprobs(raw_logprobs, tokens, params, token_list)

    def _sample(self, logits: torch.Tensor, params: Sequence[SamplingParams],
                num_output_tokens: Sequence[int]) -> torch.Tensor:
        batch, vocab = logits.shape
        greedy = torch.tensor([p.greedy for p in params], device=logits.device)
        temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=logits.device)
        scaled = logits / temps.unsqueeze(1)

        min_ps = [p.min_p for p in params]
        if any(min_ps):
            probs = torch.softmax(scaled, dim=-1)
            threshold = probs.amax(dim=-1, keepdim=True) * torch.tensor(min_ps, device=logits.device).unsqueeze(1)
            scaled = scaled.masked_fill(probs < threshold, float("-inf"))

        top_ks = [p.top_k if p.top_k > 0 else vocab for p in params]
        top_ps = [p.top_p for p in params]
        if any(k < vocab for k in top_ks) or any(p < 1.0 for p in top_ps):
            sorted_logits, sorted_index = scaled.sort(dim=-1, descending=True)
            ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
            drop = ranks >= torch.tensor(top_ks, device=logits.device).unsqueeze(1)
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            sorted_probs = torch.softmax(sorted_logits, dim=-1)
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            drop = mass_before > torch.tensor(top_ps, device=logits.device).unsqueeze(1)
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            scaled = torch.empty_like(scaled).scatter_(1, sorted_index, sorted_logits)

        probs = torch.softmax(scaled, dim=-1)
        noise = torch.empty_like(probs)
        unseeded = [i for i, p in enumerate(params) if p.seed is None]
        if unseeded:
            noise[unseeded] = torch.empty((len(unseeded), vocab), device=logits.device).exponential_(
                generator=self.generator)
        for i, p in enumerate(params):
            if p.seed is not None:
                gen = torch.Generator(device=logits.device).manual_seed(row_seed(p.seed, num_output_tokens[i]))
                noise[i] = torch.empty(vocab, device=logits.device).exponential_(generator=gen)
        sampled = (probs / noise).argmax(dim=-1)
        return torch.where(greedy, logits.argmax(dim=-1), sampled)

    @staticmethod
    def _logprobs(raw: torch.Tensor, tokens: torch.Tensor, params: Sequence[SamplingParams],
                  token_list: list[int]) -> list[TokenLogprobs | None]:
        chosen = raw.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
        max_n = max((p.logprobs or 0) for p in params)
        top_values: list[list[float]] = []
        top_ids: list[list[int]] = []
        if max_n:
            values, ids = raw.topk(min(max_n, raw.shape[1]), dim=-1)
            top_values, top_ids = values.tolist(), ids.tolist()
        out: list[TokenLogprobs | None] = []
        for i, p in enumerate(params):
            if p.logprobs is None:
                out.append(None)
                continue
            top = tuple(Logprob(token_id=t, logprob=v)
                        for t, v in zip(top_ids[i][: p.logprobs], top_values[i][: p.logprobs], strict=True)
                        ) if p.logprobs else ()
            out.append(TokenLogprobs(token_id=token_list[i], logprob=chosen[i], top=top))
        return out
