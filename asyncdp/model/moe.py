"""Routed experts: the router, the expert-backend interface and the single-process backend.

A sparse MoE block routes locally (softmax over experts in fp32 -> top-k -> optional renormalisation, as HF
Qwen3-MoE and Mixtral do) and hands ``hidden [T, H]``, ``topk_ids [T, k]`` (global expert ids) and
``topk_weights [T, k]`` to an ``ExpertBackend``, which returns the weighted sum of the chosen experts' outputs
``[T, H]`` in the original token order.

``LocalExperts`` holds experts ``[expert_start, expert_end)`` and, of each, the intermediate slice
``[intermediate_start, intermediate_end)`` (an ``ExpertShard``). With the full range it is the whole layer; the
expert-parallel backend (each DP rank holds E/ep experts and exchanges tokens with all-to-all) wraps an
expert-range ``LocalExperts``; the TP-style backend wraps an intermediate-slice one and sums partial outputs
across ranks. Tokens routed to experts outside the held range contribute nothing here.

Computation groups tokens by expert: the (token, expert) pairs are sorted by expert id once; then either each
expert runs one pair of matmuls over its contiguous rows (many tokens), or, when padding every group to the widest
costs little (decode batches), all experts run as two batched matmuls over a padded [E, widest, H] buffer. The
weighted results are scattered back to token order with ``index_add_``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from asyncdp.model.layers import Linear


class ExpertBackend(Protocol):
    def __call__(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """hidden [T, H], topk_ids [T, k] int64 global expert ids, topk_weights [T, k] -> [T, H]."""
        ...


@dataclass(frozen=True, slots=True)
class ExpertShard:
    """The part of every MoE layer's experts one process holds. ``None`` ends mean "up to the last"."""

    expert_start: int = 0
    expert_end: int | None = None
    intermediate_start: int = 0
    intermediate_end: int | None = None

    def resolve(self, num_experts: int, intermediate: int) -> tuple[int, int, int, int]:
        e1 = num_experts if self.expert_end is None else self.expert_end
        i1 = intermediate if self.intermediate_end is None else self.intermediate_end
        if not 0 <= self.expert_start < e1 <= num_experts or not 0 <= self.intermediate_start < i1 <= intermediate:
            raise ValueError(f"expert shard {self} outside {num_experts} experts x {intermediate} intermediate")
        return self.expert_start, e1, self.intermediate_start, i1

    @staticmethod
    def for_expert_parallel(num_experts: int, ep_rank: int, ep_size: int) -> ExpertShard:
        """Contiguous blocks of E // ep experts; the first E % ep ranks hold one extra (spec §9)."""
        base, extra = divmod(num_experts, ep_size)
        start = ep_rank * base + min(ep_rank, extra)
        return ExpertShard(expert_start=start, expert_end=start + base + (1 if ep_rank < extra else 0))

    @staticmethod
    def for_tensor_parallel(intermediate: int, rank: int, size: int) -> ExpertShard:
        """Every expert's intermediate dimension split in ``size`` near-equal contiguous slices."""
        base, extra = divmod(intermediate, size)
        start = rank * base + min(rank, extra)
        return ExpertShard(intermediate_start=start, intermediate_end=start + base + (1 if rank < extra else 0))


class LocalExperts(nn.Module):
    """SwiGLU experts held in this process: w13 [E_local, 2*I_local, H] (gate rows, then up), w2 [E_local, H, I_local]."""

    def __init__(self, hidden: int, num_local_experts: int, local_intermediate: int, expert_start: int = 0,
                 num_experts: int | None = None, intermediate_start: int = 0) -> None:
        super().__init__()
        self.expert_start = expert_start
        self.intermediate_start = intermediate_start
        self.holds_all = num_experts is None or (expert_start == 0 and num_local_experts == num_experts)
        self.num_local_experts = num_local_experts
        self.local_intermediate = local_intermediate
        self.w13 = nn.Parameter(torch.empty(num_local_experts, 2 * local_intermediate, hidden), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(num_local_experts, hidden, local_intermediate), requires_grad=False)

    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        top_k = topk_ids.shape[1]
        local_ids = topk_ids.reshape(-1) - self.expert_start
        weights = topk_weights.reshape(-1)
        pair_index = None
        if not self.holds_all:
            held = (local_ids >= 0) & (local_ids < self.num_local_experts)
            if not bool(held.all()):
                pair_index = held.nonzero().squeeze(1)
                local_ids = local_ids[pair_index]
                weights = weights[pair_index]
        out = torch.zeros_like(hidden)
        if local_ids.numel() == 0:
            return out
        order = torch.argsort(local_ids, stable=True)
        counts_t = torch.bincount(local_ids, minlength=self.num_local_experts)
        counts = counts_t.tolist()
        pairs = order if pair_index is None else pair_index[order]
        token_index = pairs // top_k
        sorted_weights = weights[order].unsqueeze(1).to(hidden.dtype)
        num_pairs, widest = local_ids.numel(), max(counts)
        if num_pairs <= 512 and widest * self.num_local_experts <= max(4 * num_pairs, 2048):
            y = self._padded(hidden, local_ids[order], counts_t, token_index, widest)
        else:
            y = self._grouped(hidden[token_index], counts)
        out.index_add_(0, token_index, y * sorted_weights)
        return out

    def _padded(self, hidden: torch.Tensor, sorted_ids: torch.Tensor, counts: torch.Tensor,
                token_index: torch.Tensor, widest: int) -> torch.Tensor:
        """Few tokens (decode): every expert's rows padded to the widest group, two batched matmuls in all."""
        starts = counts.cumsum(0) - counts
        rank = torch.arange(sorted_ids.numel(), device=hidden.device) - starts[sorted_ids]
        buf = hidden.new_zeros(self.num_local_experts, widest, hidden.shape[1])
        buf[sorted_ids, rank] = hidden[token_index]
        gate, up = torch.bmm(buf, self.w13.transpose(1, 2)).split(self.local_intermediate, dim=-1)
        y = torch.bmm(F.silu(gate) * up, self.w2.transpose(1, 2))
        return y[sorted_ids, rank]

    def _grouped(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Many tokens (prefill): one pair of matmuls per expert over its contiguous rows."""
        outputs = []
        offset = 0
        for expert, count in enumerate(counts):
            if count:
                rows = x[offset: offset + count]
                gate, up = F.linear(rows, self.w13[expert]).split(self.local_intermediate, dim=-1)
                outputs.append(F.linear(F.silu(gate) * up, self.w2[expert]))
                offset += count
        return torch.cat(outputs)


class SparseMoeBlock(nn.Module):
    def __init__(self, hidden: int, num_experts: int, top_k: int, norm_topk_prob: bool,
                 experts: LocalExperts) -> None:
        super().__init__()
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.gate = Linear(hidden, num_experts, bias=False)
        self.experts = experts
        self._backend: ExpertBackend | None = None

    def set_backend(self, backend: ExpertBackend) -> None:
        """Route the expert computation through ``backend`` (e.g. an all-to-all wrapper around ``self.experts``)."""
        self._backend = backend

    @property
    def backend(self) -> ExpertBackend | None:
        """The installed cross-rank backend, or None when ``self.experts`` computes alone."""
        return self._backend

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, weights.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = self.route(x)
        backend = self._backend if self._backend is not None else self.experts
        return backend(x, ids, weights)
