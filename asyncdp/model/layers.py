"""Building blocks of the decoder: RMSNorm, rotary tables, paged-KV attention and the SwiGLU MLP.

The batch arrives flattened: every scheduled chunk's tokens concatenated, single-token chunks (decodes) first.
``AttentionMetadata`` is built once per step by the model runner and shared by all layers:

* ``slot_mapping[t]`` is where token t's K/V goes in the paged cache (``block * block_size + offset``);
* the first ``num_decode`` tokens are one query each: their keys are gathered through ``decode_slots`` (padded
  with scratch slots) and masked by ``decode_mask``; all of them run in ONE attention call;
* each prefill chunk attends causally to its cached prefix plus itself. Without a prefix the new K/V are used
  directly (``is_causal``), with a prefix the keys are gathered through ``kv_slots`` with an offset causal mask.

Per layer the KV cache is a pair of tensors ``[num_blocks, block_size, num_kv_heads, head_dim]``. Grouped-query
attention in decode folds the query heads of a group into the query-length axis, so no K/V repetition is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(slots=True)
class PrefillChunk:
    start: int  # first token of the chunk in the flattened batch
    end: int
    kv_slots: torch.Tensor | None = None  # [context_len] cache slots of positions 0..context_len; None: no prefix
    mask: torch.Tensor | None = None  # [1, q_len, context_len] bool, True = attend


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64
    num_decode: int = 0
    decode_slots: torch.Tensor | None = None  # [B, max_context] int64, contiguous
    decode_mask: torch.Tensor | None = None  # [B, 1, 1, max_context] bool
    prefills: list[PrefillChunk] = field(default_factory=list)


class Linear(nn.Linear):
    """``nn.Linear`` without its random init: every weight of a model comes from its checkpoint (the loader checks
    that each is written exactly once), so the model is built straight on its device, uninitialised."""

    def reset_parameters(self) -> None:
        pass


class Embedding(nn.Embedding):
    """``nn.Embedding`` without its random init (as :class:`Linear`)."""

    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


def rope_tables(head_dim: int, max_positions: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape [max_positions, head_dim] (the half-rotation layout of Llama/Qwen), in fp32, on the CPU
    whatever the default device (the loader moves them)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.int64, device="cpu").float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim]; cos/sin [T, 1, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, *, bias: bool,
                 qk_norm: bool, eps: float) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_size, self.kv_size = num_heads * head_dim, num_kv_heads * head_dim
        # q, k and v projections fused into one matmul (loaded from the separate HF tensors).
        self.qkv_proj = Linear(hidden, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = Linear(self.q_size, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata,
                k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        num_tokens = x.shape[0]
        nh, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = self.qkv_proj(x).split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        q = q.view(num_tokens, nh, hd)
        k = k.view(num_tokens, nkv, hd)
        v = v.view(num_tokens, nkv, hd)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        k_flat = k_cache.view(-1, nkv, hd)
        v_flat = v_cache.view(-1, nkv, hd)
        k_flat.index_copy_(0, meta.slot_mapping, k)
        v_flat.index_copy_(0, meta.slot_mapping, v)

        if meta.num_decode == num_tokens and not meta.prefills:
            out = self._decode(q, k_flat, v_flat, meta)
        else:
            out = torch.empty_like(q)
            if meta.num_decode:
                out[: meta.num_decode] = self._decode(q[: meta.num_decode], k_flat, v_flat, meta)
            for chunk in meta.prefills:
                out[chunk.start: chunk.end] = self._prefill(q, k, v, k_flat, v_flat, chunk)
        return self.o_proj(out.view(num_tokens, self.q_size))

    def _decode(self, q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        assert meta.decode_slots is not None
        batch = q.shape[0]
        group = self.num_heads // self.num_kv_heads
        slots = meta.decode_slots
        gathered = (batch, slots.shape[1], self.num_kv_heads, self.head_dim)
        keys = k_flat.index_select(0, slots.view(-1)).view(gathered).transpose(1, 2)  # [B, nkv, C, hd]
        values = v_flat.index_select(0, slots.view(-1)).view(gathered).transpose(1, 2)
        queries = q.view(batch, self.num_kv_heads, group, self.head_dim)  # a group's heads act as query rows
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=meta.decode_mask)
        return out.reshape(batch, self.num_heads, self.head_dim)

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_flat: torch.Tensor,
                 v_flat: torch.Tensor, chunk: PrefillChunk) -> torch.Tensor:
        queries = q[chunk.start: chunk.end].transpose(0, 1)  # [nh, q, hd]
        gqa = self.num_heads != self.num_kv_heads
        if chunk.kv_slots is None:
            keys = k[chunk.start: chunk.end].transpose(0, 1)
            values = v[chunk.start: chunk.end].transpose(0, 1)
            out = F.scaled_dot_product_attention(queries, keys, values, is_causal=True, enable_gqa=gqa)
        else:
            keys = k_flat[chunk.kv_slots].transpose(0, 1)
            values = v_flat[chunk.kv_slots].transpose(0, 1)
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=chunk.mask, enable_gqa=gqa)
        return out.transpose(0, 1)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)
