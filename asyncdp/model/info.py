"""What the engine needs to know about a checkpoint, read from its JSON files only (no torch, no weights).

``read_model_info`` accepts the Hugging Face ``config.json`` spellings of the families asyncdp runs: Llama,
Qwen2, Qwen3 (dense) and Qwen3-MoE / Mixtral (routed experts). EOS ids are the union of ``config.json`` and
``generation_config.json`` so that a chat model stops on ``<|im_end|>`` as well as ``<|endoftext|>``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncdp.config.flags import DEFAULT_SIM_KV_BLOCKS, EngineConfig
from asyncdp.config.generation_config import sampling_fields
from asyncdp.errors import ConfigError, ModelNotFoundError

DENSE_TYPES = ("llama", "qwen2", "qwen3")
MOE_TYPES = ("qwen3_moe", "mixtral")
SUPPORTED_TYPES = DENSE_TYPES + MOE_TYPES
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # the dtypes the torch executor runs


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
    # the sampling defaults generation_config.json sets, applied under --generation-config auto (vLLM's default;
    # asyncdp.config.generation_config): (name, value) pairs
    generation_defaults: tuple[tuple[str, Any], ...] = ()


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
    generation: dict[str, Any] = {}
    if gen_path.is_file():
        try:
            generation = json.loads(gen_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ModelNotFoundError(f"{gen_path}: invalid JSON ({exc}).") from exc
        eos |= _ids(generation.get("eos_token_id"))
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
        generation_defaults=tuple(sampling_fields(generation).items()),
    )


def kv_block_bytes(info: ModelInfo, block_size: int, dtype: str) -> int:
    """Bytes of one KV-cache block: K and V of every layer for ``block_size`` tokens."""
    return 2 * info.num_layers * block_size * info.num_kv_heads * info.head_dim * DTYPE_BYTES[dtype]


def kv_cache_num_blocks(config: EngineConfig, *, max_model_len: int, bytes_per_block: int) -> int:
    """The torch executor's KV-cache blocks per rank, block 0 (scratch) included: ``--num-kv-blocks``, else what
    ``--kv-cache-memory-bytes`` holds, capped at what ``--max-num-seqs`` sequences of ``max_model_len`` tokens
    can use plus the scratch block."""
    if config.num_kv_blocks:
        return config.num_kv_blocks
    cap = config.max_num_seqs * math.ceil(max_model_len / config.block_size)
    return min(config.kv_cache_memory_bytes // bytes_per_block, cap + 1)


def kv_bytes_from_share(share: float, *, total_bytes: int, free_bytes: int) -> int:
    """``--gpu-memory-utilization`` on a CUDA device: the KV cache gets ``share`` of the device's memory less what
    is in use on it once the weights are loaded (this process's and any other's), as vLLM gives the KV cache the
    share less the weights; activations and the sampler's buffers come out of the rest of the device. Never
    below 0."""
    return max(0, int(share * total_bytes) - (total_bytes - free_bytes))


def check_fits_model(config: EngineConfig, info: ModelInfo) -> None:
    """Raise ConfigError for an engine configuration this checkpoint cannot run, from its JSON files alone.

    The launcher runs this before anything starts (spec §4.1: exit 2, one line), so that an impossible
    ``--max-model-len`` or KV-cache size is not found by every engine after it loaded the model. The engine
    repeats the checks for library users; messages match. With ``--device auto`` the KV sizing assumes the
    checkpoint's dtype (a CPU engine may widen float16 to float32, halving its blocks: the engine catches that).
    """
    torch = config.executor == "torch"
    if torch and info.model_type not in SUPPORTED_TYPES:
        raise ConfigError(f"model_type {info.model_type!r} is not supported; supported: {', '.join(SUPPORTED_TYPES)}.")
    dtype = info.dtype if config.dtype == "auto" else config.dtype
    if torch and dtype not in DTYPE_BYTES:
        raise ConfigError(f"checkpoint dtype {dtype!r} is not supported; pass --dtype float32.")
    max_positions = info.max_position_embeddings
    if config.max_model_len is not None and config.max_model_len > max_positions:
        raise ConfigError(f"--max-model-len {config.max_model_len} exceeds the model's max_position_embeddings "
                          f"({max_positions}); lower --max-model-len.")
    if not torch:
        num_blocks = config.num_kv_blocks or DEFAULT_SIM_KV_BLOCKS
    elif config.gpu_memory_utilization is not None and config.device != "cpu" and not config.num_kv_blocks:
        return  # on CUDA the KV cache is sized from the device's free memory: the engine checks it there
    else:
        if config.device == "cpu" and dtype == "float16":
            dtype = "float32"  # as the executor does: fp16 matmuls are slow or missing on CPU
        bytes_per_block = kv_block_bytes(info, config.block_size, dtype)
        num_blocks = kv_cache_num_blocks(config, max_model_len=config.max_model_len or max_positions,
                                         bytes_per_block=bytes_per_block)
        if num_blocks < 2:
            raise ConfigError(f"--kv-cache-memory-bytes {config.kv_cache_memory_bytes} holds fewer than 2 KV "
                              f"blocks ({bytes_per_block} bytes each); raise it.")
    capacity_tokens = (num_blocks - 1) * config.block_size
    if config.max_model_len is not None and config.max_model_len > capacity_tokens:
        raise ConfigError(
            f"--max-model-len {config.max_model_len} does not fit in the KV cache "
            f"({num_blocks} blocks of {config.block_size} tokens, one reserved): lower --max-model-len or "
            f"raise --num-kv-blocks / the KV cache memory.")
