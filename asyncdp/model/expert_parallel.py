"""Routed experts across DP ranks (spec §9): the lockstep token-count exchange and two expert backends.

Every forward of a MoE rank with dp > 1, real or dummy, runs the same collectives in the same order on every rank:

1. ``ForwardSizes.exchange(num_tokens)``: an all-gather of every rank's token count (1 for a dummy batch), so
   every rank knows the per-rank sizes and ``max_tokens`` before the model runs.
2. Per MoE layer, in layer order, the installed backend's collectives:

   * ``ExpertParallelBackend`` (``--enable-expert-parallel``): rank r holds the contiguous expert block of
     ``ExpertShard.for_expert_parallel``. The (token, expert) pairs are sorted by expert id, hence by owner;
     ``all_to_all_single`` of the per-destination pair counts, then one uneven ``all_to_all_single`` of the rows
     ``[hidden | weight | expert id]`` (small batches: one padded even all-to-all, no counts exchange, see the
     class); the owner computes ``weight * expert(hidden)`` per row and the reverse
     ``all_to_all_single`` brings the results back; ``index_add_`` sums them per token in expert order, exactly
     as the single-process ``LocalExperts`` does.
   * ``TensorParallelExpertsBackend`` (EP off): every rank holds its ``1/dp`` slice of every expert's
     intermediate dimension. The packed rows ``[hidden | weights | expert ids]`` of all ranks are all-gathered,
     padded to ``max_tokens``; each rank computes its partial outputs for every real token; a reduce-scatter
     (sum) leaves each rank the full outputs of its own tokens.

Expert ids travel inside the hidden-state tensor as raw int32 bits (``Tensor.view(dtype)``): all-gather and
all-to-all copy bytes, so the ids arrive intact and one collective carries the whole row.

A primitive that gloo lacks in the installed torch is emulated: reduce-scatter as all-reduce plus slice.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from asyncdp.model.moe import ExpertShard, LocalExperts, SparseMoeBlock

__all__ = ["EP_PADDED_MAX_ROWS", "ExpertParallelBackend", "ForwardSizes", "TensorParallelExpertsBackend",
           "expert_shard_for", "install_expert_backends", "pack_rows", "unpack_rows"]


def expert_shard_for(num_experts: int, moe_intermediate: int, dp_rank: int, dp_size: int,
                     enable_expert_parallel: bool) -> ExpertShard:
    """What rank ``dp_rank`` loads: its expert block (EP) or its intermediate slice of every expert (EP off)."""
    if enable_expert_parallel:
        return ExpertShard.for_expert_parallel(num_experts, dp_rank, dp_size)
    return ExpertShard.for_tensor_parallel(moe_intermediate, dp_rank, dp_size)


def pack_rows(hidden: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[T, H], [T, k] ids, [T, k] weights -> one [T, H + k + k * 4 / elem] tensor of hidden's dtype."""
    bits = ids.to(torch.int32).contiguous().view(hidden.dtype)
    return torch.cat([hidden, weights.to(hidden.dtype), bits], dim=1)


def unpack_rows(packed: torch.Tensor, hidden_size: int,
                top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of ``pack_rows``: views of hidden [T, H] and weights [T, k], and int64 ids [T, k]."""
    hidden = packed[:, :hidden_size]
    weights = packed[:, hidden_size: hidden_size + top_k]
    ids = packed[:, hidden_size + top_k:].contiguous().view(torch.int32).to(torch.int64)
    return hidden, ids, weights


def _all_gather(out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup) -> None:
    if hasattr(dist, "all_gather_single"):
        dist.all_gather_single(out, inp, group=group)
    else:  # pragma: no cover - older torch
        dist.all_gather_into_tensor(out, inp, group=group)


EP_PADDED_MAX_ROWS = 256  # per destination: padded dispatch up to this many rows, uneven above


class _ReduceScatter:
    """reduce-scatter (sum) over dim 0, or all-reduce + slice where the backend lacks it (decided once)."""

    def __init__(self) -> None:
        self.emulate = not hasattr(dist, "reduce_scatter_single")

    def __call__(self, out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup, rank: int) -> None:
        if not self.emulate:
            try:
                dist.reduce_scatter_single(out, inp, group=group)
                return
            except (RuntimeError, NotImplementedError):  # the backend lacks it: every rank fails alike
                self.emulate = True
        full = inp.clone()
        dist.all_reduce(full, group=group)
        rows = out.shape[0]
        out.copy_(full[rank * rows: (rank + 1) * rows])


class ForwardSizes:
    """The per-rank token counts of the current forward, exchanged before it (spec §9, lockstep)."""

    def __init__(self, group: dist.ProcessGroup, dp_rank: int, dp_size: int, device: torch.device) -> None:
        self.group = group
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.device = device
        self.sizes = [0] * dp_size
        self.num_exchanges = 0

    def exchange(self, num_tokens: int) -> list[int]:
        mine = torch.tensor([num_tokens], dtype=torch.int64, device=self.device)
        out = torch.empty(self.dp_size, dtype=torch.int64, device=self.device)
        _all_gather(out, mine, self.group)
        self.sizes = [int(v) for v in out.tolist()]
        self.num_exchanges += 1
        return self.sizes

    @property
    def max_tokens(self) -> int:
        return max(self.sizes)


class ExpertParallelBackend:
    """Experts spread over the DP ranks; tokens travel to their experts' owners and back (all-to-all).

    Two dispatches, chosen per forward from values every rank shares (so all ranks choose alike):

    * uneven (spec §9): all-to-all of the per-destination pair counts, then uneven all-to-alls of the rows;
      3 collectives per layer, payload = the real rows.
    * padded (small batches, when ``sizes`` is given and ``max_tokens * top_k <= padded_max_rows``): no counts
      exchange; every rank sends every destination exactly ``max_tokens * top_k`` rows (the most any rank can
      route anywhere), padding marked by expert id -1; 2 collectives per layer. In decode the padding costs
      little and the saved round trip is a third of the layer's latency.
    """

    def __init__(self, experts: LocalExperts, group: dist.ProcessGroup, ep_rank: int, ep_size: int,
                 num_experts: int, *, sizes: ForwardSizes | None = None,
                 padded_max_rows: int = EP_PADDED_MAX_ROWS) -> None:
        self.experts = experts
        self.group = group
        self.ep_rank = ep_rank
        self.ep_size = ep_size
        self.sizes = sizes
        self.padded_max_rows = padded_max_rows
        self.num_padded = self.num_uneven = 0
        owner = torch.empty(num_experts, dtype=torch.int64)
        for r in range(ep_size):
            s = ExpertShard.for_expert_parallel(num_experts, r, ep_size)
            assert s.expert_end is not None
            owner[s.expert_start: s.expert_end] = r
        if (experts.expert_start, experts.num_local_experts) != (
                int((owner == ep_rank).nonzero()[0]), int((owner == ep_rank).sum())):
            raise ValueError(f"rank {ep_rank} holds experts from {experts.expert_start} "
                             f"({experts.num_local_experts}), not its expert-parallel block")
        self.owner = owner.to(experts.w13.device)

    def __call__(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        num_tokens, top_k = topk_ids.shape
        flat_ids = topk_ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)  # by expert id, hence by owner (contiguous blocks)
        sorted_ids = flat_ids[order]
        token_index = order // top_k
        dest = self.owner[sorted_ids]
        send_counts = torch.bincount(dest, minlength=self.ep_size)
        rows = pack_rows(hidden[token_index], sorted_ids.unsqueeze(1), topk_weights.reshape(-1)[order].unsqueeze(1))
        capacity = 0 if self.sizes is None else self.sizes.max_tokens * top_k
        if 0 < capacity <= self.padded_max_rows:
            returned = self._padded(rows, dest, send_counts, capacity, hidden.shape[1])
            self.num_padded += 1
        else:
            returned = self._uneven(rows, send_counts, hidden.shape[1])
            self.num_uneven += 1
        out = torch.zeros_like(hidden)
        out.index_add_(0, token_index, returned)
        assert out.shape[0] == num_tokens
        return out

    def _uneven(self, rows: torch.Tensor, send_counts: torch.Tensor, hidden_size: int) -> torch.Tensor:
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        send_splits = send_counts.tolist()
        recv_splits = recv_counts.tolist()
        received = rows.new_empty(sum(recv_splits), rows.shape[1])
        dist.all_to_all_single(received, rows, recv_splits, send_splits, group=self.group)
        r_hidden, r_ids, r_weights = unpack_rows(received, hidden_size, 1)
        computed = self.experts(r_hidden, r_ids, r_weights)  # weight * expert(row), one pair per row
        returned = rows.new_empty(rows.shape[0], hidden_size)
        dist.all_to_all_single(returned, computed, send_splits, recv_splits, group=self.group)
        return returned

    def _padded(self, rows: torch.Tensor, dest: torch.Tensor, send_counts: torch.Tensor, capacity: int,
                hidden_size: int) -> torch.Tensor:
        ep, width = self.ep_size, rows.shape[1]
        slot = torch.arange(rows.shape[0], device=rows.device) - (send_counts.cumsum(0) - send_counts)[dest]
        send = pack_rows(rows.new_zeros(ep * capacity, hidden_size), torch.full((ep * capacity, 1), -1,
                     dtype=torch.int64, device=rows.device), rows.new_zeros(ep * capacity, 1)).view(ep, capacity, width)
        send[dest, slot] = rows
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=self.group)
        r_hidden, r_ids, r_weights = unpack_rows(received.view(ep * capacity, width), hidden_size, 1)
        real = (r_ids[:, 0] >= 0).nonzero().squeeze(1)
        computed = rows.new_zeros(ep, capacity, hidden_size)
        computed.view(ep * capacity, hidden_size)[real] = self.experts(r_hidden[real], r_ids[real], r_weights[real])
        back = torch.empty_like(computed)
        dist.all_to_all_single(back, computed, group=self.group)
        return back[dest, slot]


class TensorParallelExpertsBackend:
    """Every expert's intermediate dimension split over the DP ranks; all-gather in, reduce-scatter out."""

    def __init__(self, experts: LocalExperts, group: dist.ProcessGroup, sizes: ForwardSizes) -> None:
        self.experts = experts
        self.group = group
        self.sizes = sizes
        self._reduce_scatter = _ReduceScatter()

    def __call__(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        num_tokens, top_k = topk_ids.shape
        hidden_size = hidden.shape[1]
        sizes = self.sizes.sizes
        if sizes[self.sizes.dp_rank] != num_tokens:
            raise RuntimeError(f"forward of {num_tokens} tokens, but {sizes[self.sizes.dp_rank]} were exchanged; "
                               "ForwardSizes.exchange must run before every forward")
        max_tokens = max(sizes)
        packed = pack_rows(hidden, topk_ids, topk_weights)
        if num_tokens < max_tokens:
            packed = torch.cat([packed, packed.new_zeros(max_tokens - num_tokens, packed.shape[1])])
        gathered = packed.new_empty(len(sizes) * max_tokens, packed.shape[1])
        _all_gather(gathered, packed, self.group)
        g_hidden, g_ids, g_weights = unpack_rows(gathered, hidden_size, top_k)
        partial = hidden.new_zeros(len(sizes) * max_tokens, hidden_size)
        if all(s == max_tokens for s in sizes):
            partial = self.experts(g_hidden, g_ids, g_weights)
        else:  # skip the padding rows
            real = torch.cat([torch.arange(r * max_tokens, r * max_tokens + s, device=hidden.device)
                              for r, s in enumerate(sizes)])
            partial[real] = self.experts(g_hidden[real], g_ids[real], g_weights[real])
        mine = hidden.new_empty(max_tokens, hidden_size)
        self._reduce_scatter(mine, partial, self.group, self.sizes.dp_rank)
        return mine[:num_tokens]


def install_expert_backends(blocks: list[SparseMoeBlock], *, group: dist.ProcessGroup, dp_rank: int, dp_size: int,
                            num_experts: int, enable_expert_parallel: bool, sizes: ForwardSizes,
                            ep_padded_max_rows: int = EP_PADDED_MAX_ROWS) -> None:
    """Route every MoE block's experts through the matching cross-rank backend."""
    for block in blocks:
        backend: ExpertParallelBackend | TensorParallelExpertsBackend
        if enable_expert_parallel:
            backend = ExpertParallelBackend(block.experts, group, dp_rank, dp_size, num_experts, sizes=sizes,
                                            padded_max_rows=ep_padded_max_rows)
        else:
            backend = TensorParallelExpertsBackend(block.experts, group, sizes)
        block.set_backend(backend)
