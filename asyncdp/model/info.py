"""What the engine needs to know about a checkpoint, read from its JSON files only (no torch, no weights).

``read_model_info`` accepts the Hugging Face ``config.json`` spellings of the families asyncdp runs: Llama,
Qwen2, Qwen3 (dense) and Qwen3-MoE / Mixtral (routed experts). EOS ids are the union of ``config.json`` and
``generation_config.json`` so that a chat model stops on ``<|im_end|>`` as well as ``<|endoftext|>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncdp.errors import ModelNotFoundError

DENSE_TYPES = ("llama", "qwen2", "qwen3")
MOE_TYPES = ("qwen3_moe", "mixtral")
SUPPORTED_TYPES = DENSE_TYPES + MOE_TYPES


@dataclass(frozen=True, slots=True)
class ModelInfo:
    architecture: str  # e.g. "Qwen3MoeForCausalLM"
    model_type: str  # e.g. "qwen3_moe"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    eos_token_ids: frozenset[int]
    is_moe: bool
    num_experts: int  # 0 for dense models
    num_experts_per_tok: int  # 0 for dense models
    dtype: str  # "float32" | "bfloat16" | "float16"


def _ids(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def load_config(path: Path) -> dict[str, Any]:
    try:
        with open(path / "config.json", encoding="utf-8") as f:
            config: dict[str, Any] = json.load(f)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"{path}: cannot read config.json ({exc}).") from exc
    # Multimodal wrappers keep the language model's fields under text_config.
    if "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}
    return config


def read_model_info(path: Path | str) -> ModelInfo:
    path = Path(path)
    config = load_config(path)
    eos = _ids(config.get("eos_token_id"))
    gen_path = path / "generation_config.json"
    if gen_path.is_file():
        try:
            eos |= _ids(json.loads(gen_path.read_text(encoding="utf-8")).get("eos_token_id"))
        except ValueError as exc:
            raise ModelNotFoundError(f"{gen_path}: invalid JSON ({exc}).") from exc
    num_heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    num_experts = int(config.get("num_experts") or config.get("num_local_experts")
                      or config.get("n_routed_experts") or 0)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    architectures = config.get("architectures") or ["?"]
    return ModelInfo(
        architecture=str(architectures[0]),
        model_type=str(config.get("model_type", "?")),
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        num_layers=int(config["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_dim=int(config.get("head_dim") or hidden // num_heads),
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        eos_token_ids=frozenset(eos),
        is_moe=num_experts > 0,
        num_experts=num_experts,
        num_experts_per_tok=int(config.get("num_experts_per_tok") or 0) if num_experts else 0,
        dtype=dtype,
    )
