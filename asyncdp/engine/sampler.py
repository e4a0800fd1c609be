"""Batched sampling of one token per row of ``logits [B, V]`` (fp32).

Order per row (vLLM semantics): the structured-output mask (tokens the row's grammar forbids get -inf; one
bool tensor for the constrained rows, so logprobs are those of the constrained distribution, as in vLLM) ->
raw log-probabilities for logprobs (log_softmax of the unprocessed logits) -> ``allowed_token_ids`` (every
other token -inf) -> ``bad_words`` (the last token of each banned sequence whose other tokens end the output,
``token_filters.banned_tokens``, -inf) -> ``logit_bias`` added -> min_tokens mask (EOS and ``stop_token_ids``
get -inf while ``num_output_tokens < min_tokens``; EOS is masked even with ``ignore_eos``, which is harmless
since it would not stop the request) ->
penalties: repetition (tokens seen in the prompt or the output: positive logits divided by the penalty, negative
ones multiplied), frequency (``-= frequency_penalty * count_in_output``) and presence (``-= presence_penalty`` for
tokens in the output) -> greedy rows take the argmax (penalties and bias apply to them too); sampled rows divide
by the temperature, apply min-p (on the tempered distribution), then top-k and top-p (one sort shared by both),
and draw with the exponential race ``argmax(p / Exp(1))``.

Penalties need each row's prompt and output token ids (references held by the scheduled chunks); token counts
are built per step, batched, only for the rows that use a penalty (one ``bincount`` over the flattened ids).

Reproducibility: a row with ``seed`` draws its Exp(1) noise from its own ``torch.Generator`` seeded with
BLAKE2b(seed, num_output_tokens), so the same request yields the same tokens whatever else shares its batch.
Rows without a seed share one generator seeded from the engine seed (which ``rank_seed`` derives per DP rank, so
ranks draw different unseeded samples). Fast path: an all-greedy batch without logprobs, active min_tokens,
penalties, logit_bias or token filters is a single argmax.

Logprobs are computed before the token filters, as vLLM's default ``logprobs_mode`` (``raw_logprobs``) does: the
structured-output mask is in them (vLLM applies it to the logits before its sampler), ``allowed_token_ids`` and
``bad_words`` are not (nor bias, penalties or temperature), so a filtered-out token can be among the top
alternatives.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Collection, Sequence

import torch

from asyncdp.messages import Logprob, TokenLogprobs
from asyncdp.sampling_params import MIN_REPETITION_PENALTY, SamplingParams
from asyncdp.sampling_params.token_filters import banned_tokens


def row_seed(seed: int, num_output_tokens: int) -> int:
    data = (seed % 2**64).to_bytes(8, "little") + num_output_tokens.to_bytes(8, "little")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & (2**63 - 1)


def rank_seed(seed: int, dp_rank: int) -> int:
    """The unseeded-sampling generator's seed of rank ``dp_rank``: distinct per rank, stable per (seed, rank)."""
    data = b"rank" + (seed % 2**64).to_bytes(8, "little") + dp_rank.to_bytes(8, "little")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & (2**63 - 1)


def token_logprobs(raw: torch.Tensor, token_ids: torch.Tensor, num_top: Sequence[int | None]
                   ) -> list[TokenLogprobs | None]:
    """Per row of log-probabilities ``raw [B, V]``: the logprob of ``token_ids[row]`` and its top-n alternatives
    (n = ``num_top[row]``; None: no entry for that row)."""
    chosen = raw.gather(1, token_ids.unsqueeze(1)).squeeze(1).tolist()
    ids_list: list[int] = token_ids.tolist()
    max_n = max((n or 0) for n in num_top) if num_top else 0
    top_values: list[list[float]] = []
    top_ids: list[list[int]] = []
    if max_n:
        values, ids = raw.topk(min(max_n, raw.shape[1]), dim=-1)
        top_values, top_ids = values.tolist(), ids.tolist()
    out: list[TokenLogprobs | None] = []
    for i, n in enumerate(num_top):
        if n is None:
            out.append(None)
            continue
        top = tuple(Logprob(token_id=t, logprob=v)
                    for t, v in zip(top_ids[i][:n], top_values[i][:n], strict=True)) if n else ()
        out.append(TokenLogprobs(token_id=ids_list[i], logprob=chosen[i], top=top))
    return out


def apply_logit_bias(logits: torch.Tensor, params: Sequence[SamplingParams], rows: Sequence[int]) -> None:
    """Add each row's ``logit_bias`` in place (ids beyond the vocabulary are ignored)."""
    vocab = logits.shape[1]
    index_rows: list[int] = []
    index_cols: list[int] = []
    values: list[float] = []
    for i in rows:
        for token_id, bias in params[i].logit_bias:
            if token_id < vocab:
                index_rows.append(i)
                index_cols.append(token_id)
                values.append(bias)
    if values:
        device = logits.device
        logits.index_put_((torch.tensor(index_rows, device=device), torch.tensor(index_cols, device=device)),
                          torch.tensor(values, dtype=logits.dtype, device=device), accumulate=True)


def _token_counts(token_ids: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """``[R, V]`` occurrence counts of each row's ids (ids outside ``[0, V)`` are dropped): one bincount."""
    num_rows = len(token_ids)
    # The flat index is built on the host (its length is known there) and copied once; the count runs on device.
    flat = torch.tensor(list(itertools.chain.from_iterable(token_ids)), dtype=torch.int64)
    row = torch.repeat_interleave(torch.arange(num_rows), torch.tensor([len(t) for t in token_ids]))
    flat = torch.where((flat < 0) | (flat >= vocab), vocab, flat)  # out of range -> a spare column, dropped
    counts = torch.bincount((row * (vocab + 1) + flat).to(device), minlength=num_rows * (vocab + 1))
    return counts.view(num_rows, vocab + 1)[:, :vocab]


def apply_penalties(logits: torch.Tensor, params: Sequence[SamplingParams], rows: Sequence[int],
                    prompt_token_ids: Sequence[Sequence[int]], output_token_ids: Sequence[Sequence[int]]) -> None:
    """Repetition, frequency and presence penalties of ``rows``, in place (vLLM semantics)."""
    vocab = logits.shape[1]
    device = logits.device
    index = torch.tensor(rows, dtype=torch.int64, device=device)
    sub = logits.index_select(0, index)
    ps = [params[i] for i in rows]
    out_counts = _token_counts([output_token_ids[i] for i in rows], vocab, device)
    in_output = out_counts > 0
    if any(p.repetition_penalty != 1.0 for p in ps):
        seen = in_output | (_token_counts([prompt_token_ids[i] for i in rows], vocab, device) > 0)
        # clamped: a penalty under the validated minimum (params built without validate()) would make the
        # divided logits inf and the distribution NaN
        rep = torch.tensor([max(p.repetition_penalty, MIN_REPETITION_PENALTY) for p in ps], dtype=sub.dtype,
                           device=device).unsqueeze(1)
        sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    freq = torch.tensor([p.frequency_penalty for p in ps], dtype=sub.dtype, device=device).unsqueeze(1)
    pres = torch.tensor([p.presence_penalty for p in ps], dtype=sub.dtype, device=device).unsqueeze(1)
    sub = sub - freq * out_counts.to(sub.dtype) - pres * in_output.to(sub.dtype)
    logits.index_copy_(0, index, sub)


def apply_allowed_tokens(logits: torch.Tensor, rows: Sequence[int], allowed: torch.Tensor) -> torch.Tensor:
    """A copy of ``logits`` whose ``rows`` have -inf at every token not allowed (``allowed``: bool
    ``[len(rows), V]``, one row per entry of ``rows``)."""
    neg_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    if len(rows) == logits.shape[0] and list(rows) == list(range(len(rows))):
        return torch.where(allowed, logits, neg_inf)  # every row constrained: one pass, no gather
    index = torch.tensor(list(rows), dtype=torch.int64, device=logits.device)
    return logits.index_copy(0, index, torch.where(allowed, logits.index_select(0, index), neg_inf))


def allowed_mask(params: Sequence[SamplingParams], rows: Sequence[int], vocab: int, device: torch.device
                 ) -> torch.Tensor:
    """Bool ``[len(rows), V]``: True at each row's ``allowed_token_ids`` (ids beyond the vocabulary dropped)."""
    index_rows: list[int] = []
    index_cols: list[int] = []
    for r, i in enumerate(rows):
        ids = [t for t in params[i].allowed_token_ids or () if t < vocab]
        index_rows.extend([r] * len(ids))
        index_cols.extend(ids)
    allowed = torch.zeros((len(rows), vocab), dtype=torch.bool)
    allowed[torch.tensor(index_rows, dtype=torch.int64), torch.tensor(index_cols, dtype=torch.int64)] = True
    return allowed.to(device)


def apply_bad_words(logits: torch.Tensor, params: Sequence[SamplingParams], rows: Sequence[int],
                    output_token_ids: Sequence[Sequence[int]]) -> None:
    """-inf, in place, at the tokens each row's ``bad_words`` ban after its output so far."""
    vocab = logits.shape[1]
    index_rows: list[int] = []
    index_cols: list[int] = []
    for i in rows:
        banned = [t for t in banned_tokens(params[i].bad_words_token_ids, output_token_ids[i]) if t < vocab]
        index_rows.extend([i] * len(banned))
        index_cols.extend(banned)
    if index_cols:
        device = logits.device
        logits[torch.tensor(index_rows, device=device), torch.tensor(index_cols, device=device)] = float("-inf")


class Sampler:
    def __init__(self, eos_token_ids: Collection[int], seed: int = 0, device: torch.device | None = None) -> None:
        self.eos_token_ids = tuple(sorted(eos_token_ids))
        self.device = device or torch.device("cpu")
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, params: Sequence[SamplingParams],
                 num_output_tokens: Sequence[int], *,
                 prompt_token_ids: Sequence[Sequence[int]] | None = None,
                 output_token_ids: Sequence[Sequence[int]] | None = None,
                 token_mask: tuple[Sequence[int], torch.Tensor] | None = None,
                 ) -> tuple[list[int], list[TokenLogprobs | None] | None]:
        """Sample one token per row. Returns the tokens and, when any row asked for logprobs, per-row logprobs.

        ``prompt_token_ids`` / ``output_token_ids`` (per row) are read only by rows with a penalty; a row whose
        ids are not given is penalised as if it had none; ``output_token_ids`` are read by rows with
        ``bad_words`` too. ``token_mask`` is (rows, allowed): the allowed tokens of the structured-output rows
        (see ``apply_allowed_tokens``).
        """
        want_logprobs = any(p.logprobs is not None for p in params)
        min_tokens_rows = [i for i, (p, n) in enumerate(zip(params, num_output_tokens, strict=True))
                           if n < p.min_tokens]
        bias_rows = [i for i, p in enumerate(params) if p.logit_bias]
        penalty_rows = [i for i, p in enumerate(params) if p.has_penalties]
        filter_rows = [i for i, p in enumerate(params) if p.allowed_token_ids is not None or p.bad_words_token_ids]
        all_greedy = all(p.greedy for p in params)
        if (all_greedy and not want_logprobs and not min_tokens_rows and not bias_rows and not penalty_rows
                and token_mask is None and not filter_rows):
            return logits.argmax(dim=-1).tolist(), None

        copied = token_mask is not None
        if token_mask is not None:
            logits = apply_allowed_tokens(logits, token_mask[0], token_mask[1])  # a copy
        raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        if filter_rows:
            allowed_rows = [i for i in filter_rows if params[i].allowed_token_ids is not None]
            if allowed_rows:
                logits = apply_allowed_tokens(logits, allowed_rows,
                                              allowed_mask(params, allowed_rows, logits.shape[1], logits.device))
                copied = True
            bad_rows = [i for i in filter_rows if params[i].bad_words_token_ids]
            if bad_rows:
                if not copied:
                    logits, copied = logits.clone(), True
                apply_bad_words(logits, params, bad_rows, output_token_ids or [()] * len(params))
        if (bias_rows or min_tokens_rows or penalty_rows) and not copied:
            logits = logits.clone()
        if bias_rows:
            apply_logit_bias(logits, params, bias_rows)
        if min_tokens_rows:
            for i in min_tokens_rows:
                banned = list(self.eos_token_ids) + list(params[i].stop_token_ids)
                logits[i, [t for t in banned if t < logits.shape[1]]] = float("-inf")
        if penalty_rows:
            none: list[Sequence[int]] = [()] * len(params)
            apply_penalties(logits, params, penalty_rows, prompt_token_ids or none, output_token_ids or none)

        if all_greedy:
            tokens = logits.argmax(dim=-1)
        else:
            tokens = self._sample(logits, params, num_output_tokens)
        token_list: list[int] = tokens.tolist()
        if raw_logprobs is None:
            return token_list, None
        return token_list, token_logprobs(raw_logprobs, tokens, [p.logprobs for p in params])

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
            top_p = torch.tensor(top_ps, device=logits.device).unsqueeze(1)
            # top_p 1.0 filters nothing: a float32 cumsum can pass 1.0 in a long tail, and would cut it
            drop = (mass_before > top_p) & (top_p < 1.0)
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
