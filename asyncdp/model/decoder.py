"""Decoder-only causal LMs: the Llama / Qwen2 / Qwen3 dense family and Qwen3-MoE / Mixtral, our own torch code.

Family differences are configuration, not classes: ``ArchSpec.from_config`` reads the HF ``config.json`` and says
whether q/k/v carry a bias (Qwen2), whether q and k are RMS-normalised per head (Qwen3), which layers are sparse
(``decoder_sparse_step``, ``mlp_only_layers``) and whether top-k weights are renormalised. Parameter names follow
the HF checkpoint names except where projections are fused (``qkv_proj``, ``gate_up_proj``, experts' ``w13``);
``asyncdp.model.loader`` maps the HF tensors onto them.

``CausalLM.forward`` takes the flattened batch (token ids, positions, ``AttentionMetadata``) plus the per-layer
KV-cache tensors and returns the final hidden states; ``compute_logits`` turns selected rows into fp32 logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from asyncdp.errors import ConfigError
from asyncdp.model.info import SUPPORTED_TYPES
from asyncdp.model.layers import MLP, Attention, AttentionMetadata, Embedding, Linear, RMSNorm, rope_tables
from asyncdp.model.moe import ExpertShard, LocalExperts, SparseMoeBlock


@dataclass(frozen=True, slots=True)
class ArchSpec:
    model_type: str
    vocab_size: int
    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    rope_theta: float
    max_positions: int
    qkv_bias: bool
    qk_norm: bool
    tie_embeddings: bool
    num_experts: int
    top_k: int
    moe_intermediate: int
    norm_topk_prob: bool
    sparse_layers: frozenset[int]

    @staticmethod
    def from_config(cfg: dict[str, Any]) -> ArchSpec:
        model_type = str(cfg.get("model_type"))
        if model_type not in SUPPORTED_TYPES:
            raise ConfigError(f"model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_TYPES)}.")
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"rope scaling {rope_type!r} is not supported (only unscaled RoPE).")
        theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        num_layers = int(cfg["num_hidden_layers"])
        num_experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        if model_type == "mixtral":
            moe_inter, norm_topk, sparse = int(cfg["intermediate_size"]), True, frozenset(range(num_layers))
        elif num_experts:
            step = int(cfg.get("decoder_sparse_step") or 1)
            mlp_only = set(cfg.get("mlp_only_layers") or [])
            sparse = frozenset(i for i in range(num_layers) if i not in mlp_only and (i + 1) % step == 0)
            moe_inter, norm_topk = int(cfg["moe_intermediate_size"]), bool(cfg.get("norm_topk_prob", False))
        else:
            moe_inter, norm_topk, sparse = 0, False, frozenset()
        return ArchSpec(
            model_type=model_type,
            vocab_size=int(cfg["vocab_size"]),
            hidden=hidden,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or hidden // num_heads),
            intermediate=int(cfg.get("intermediate_size") or 0),
            eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            max_positions=int(cfg.get("max_position_embeddings", 2048)),
            qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            num_experts=num_experts,
            top_k=int(cfg.get("num_experts_per_tok") or 0),
            moe_intermediate=moe_inter,
            norm_topk_prob=norm_topk,
            sparse_layers=sparse,
        )


class DecoderLayer(nn.Module):
    def __init__(self, spec: ArchSpec, layer: int, shard: ExpertShard) -> None:
        super().__init__()
        self.self_attn = Attention(spec.hidden, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                                   bias=spec.qkv_bias, qk_norm=spec.qk_norm, eps=spec.eps)
        self.mlp: nn.Module
        if layer in spec.sparse_layers:
            e0, e1, i0, i1 = shard.resolve(spec.num_experts, spec.moe_intermediate)
            experts = LocalExperts(spec.hidden, e1 - e0, i1 - i0, expert_start=e0, num_experts=spec.num_experts,
                                   intermediate_start=i0)
            self.mlp = SparseMoeBlock(spec.hidden, spec.num_experts, spec.top_k, spec.norm_topk_prob, experts)
        else:
            self.mlp = MLP(spec.hidden, spec.intermediate)
        self.input_layernorm = RMSNorm(spec.hidden, spec.eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden, spec.eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata,
                k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, meta, k_cache, v_cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(nn.Module):
    def __init__(self, spec: ArchSpec, shard: ExpertShard) -> None:
        super().__init__()
        self.embed_tokens = Embedding(spec.vocab_size, spec.hidden)
        self.layers = nn.ModuleList(DecoderLayer(spec, i, shard) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden, spec.eps)


class CausalLM(nn.Module):
    rope_cos: torch.Tensor  # [max_positions, head_dim] fp32 buffers
    rope_sin: torch.Tensor

    def __init__(self, spec: ArchSpec, shard: ExpertShard | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.model = Backbone(spec, shard or ExpertShard())
        self.lm_head = None if spec.tie_embeddings else Linear(spec.hidden, spec.vocab_size, bias=False)
        cos, sin = rope_tables(spec.head_dim, spec.max_positions, spec.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def moe_blocks(self) -> list[SparseMoeBlock]:
        return [layer.mlp for layer in self.model.layers if isinstance(layer.mlp, SparseMoeBlock)]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        cos = self.rope_cos[positions].unsqueeze(1).to(x.dtype)
        sin = self.rope_sin[positions].unsqueeze(1).to(x.dtype)
        for layer, (k_cache, v_cache) in zip(self.model.layers, kv_caches, strict=True):
            x = layer(x, cos, sin, meta, k_cache, v_cache)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return torch.nn.functional.linear(hidden, weight).float()
