"""Convert a Llama-family GGUF file (as llama.cpp writes it) into a Hugging Face checkpoint directory.

What is written into ``dest``: ``model.safetensors`` (every tensor dequantized to fp32 by the ``gguf`` package),
``config.json`` (a ``LlamaConfig``), ``generation_config.json``, and a fast tokenizer (``tokenizer.json``,
``tokenizer_config.json`` with the GGUF's chat template, ``special_tokens_map.json``) that
``transformers.AutoTokenizer`` loads. Torch-free: tensors go through numpy and ``safetensors.numpy``.

Weights. GGUF names map onto HF names (``blk.N.attn_q`` -> ``model.layers.N.self_attn.q_proj`` ...). llama.cpp's
converter permutes the rows of q and k from HF's half-rotation RoPE layout into GGML's interleaved one
(per head: ``reshape(heads, 2, head_dim // 2) -> swap``); ``_unpermute`` is its inverse. A file without
``output.weight`` has tied embeddings.

Tokenizer. Only ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE) is supported: tokens and merges become a
``tokenizers`` BPE model, the pre-tokenizer follows ``tokenizer.ggml.pre`` (llama.cpp's regex split table: the
GPT-2 regex, with digits split one by one first for the StarCoder-style ``smollm``/``starcoder``/``refact``
vocabularies), control tokens (type 3) become special added tokens and user-defined ones (type 4) plain added
tokens.

``CONVERTER_VERSION`` is part of the built-in model's cache key: bump it whenever the output changes.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from asyncdp.errors import ModelNotFoundError

CONVERTER_VERSION = 1

# llama.cpp's `tokenizer.ggml.pre` values whose regex split is "\p{N}" (digits alone) then the GPT-2 regex.
_DIGITS_FIRST = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"})
_GPT2_ONLY = frozenset({"gpt2", "default", "mpt", "olmo", "jais"})
_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


def hf_name(gguf_name: str) -> str:
    """The Hugging Face Llama weight name of a GGUF tensor name; ModelNotFoundError for an unknown one."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK.match(gguf_name)
    if m is not None and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    raise ModelNotFoundError(f"GGUF tensor {gguf_name!r} has no Llama equivalent; this converter cannot read it.")


def _unpermute(weight: Any, num_heads: int) -> Any:
    """Undo llama.cpp's q/k row permutation: GGML's interleaved RoPE pairs back to HF's rotate-half layout."""
    rows, cols = weight.shape
    return weight.reshape(num_heads, rows // num_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


class GGUFFile:
    """The metadata and tensors of one GGUF file (a thin reader over ``gguf.GGUFReader``)."""

    def __init__(self, path: Path) -> None:
        try:
            from gguf import GGUFReader
        except ImportError as exc:
            raise ModelNotFoundError(
                "reading a GGUF model needs the 'gguf' package; install it with: pip install gguf") from exc
        self.path = path
        self.reader = GGUFReader(str(path))

    def get(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelNotFoundError(f"{self.path}: GGUF metadata {key!r} is missing.")
        return value


def llama_config(gguf: GGUFFile) -> dict[str, Any]:
    """The HF ``config.json`` of the GGUF's Llama model (fp32, since the weights are dequantized to fp32)."""
    arch = gguf.require("general.architecture")
    if arch != "llama":
        raise ModelNotFoundError(f"{gguf.path}: GGUF architecture {arch!r} is not supported (only 'llama').")
    p = "llama."
    hidden = int(gguf.require(p + "embedding_length"))
    heads = int(gguf.require(p + "attention.head_count"))
    names = {t.name for t in gguf.reader.tensors}
    vocab = gguf.get(p + "vocab_size") or len(gguf.require("tokenizer.ggml.tokens"))
    bos, eos = gguf.get("tokenizer.ggml.bos_token_id"), gguf.get("tokenizer.ggml.eos_token_id")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(gguf.require(p + "feed_forward_length")),
        "num_hidden_layers": int(gguf.require(p + "block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(gguf.get(p + "attention.head_count_kv") or heads),
        "head_dim": int(gguf.get(p + "rope.dimension_count") or hidden // heads),
        "max_position_embeddings": int(gguf.require(p + "context_length")),
        # GGUF stores these as float32: print the shortest float32 spelling (9.9999997e-06 -> 1e-05).
        "rms_norm_eps": float(f"{float(gguf.require(p + 'attention.layer_norm_rms_epsilon')):.7g}"),
        "rope_theta": float(f"{float(gguf.get(p + 'rope.freq_base') or 10000.0):.7g}"),
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_id": None if eos is None else int(eos),
        "pad_token_id": gguf.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
        "use_cache": True,
        "initializer_range": 0.02,
    }


def tokenizer_json(gguf: GGUFFile) -> str:
    """A ``tokenizers`` byte-level BPE tokenizer rebuilt from the GGUF's ``tokenizer.ggml.*`` metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = gguf.require("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelNotFoundError(f"{gguf.path}: GGUF tokenizer {kind!r} is not supported (only byte-level BPE).")
    tokens: list[str] = list(gguf.require("tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in gguf.require("tokenizer.ggml.merges")]
    types: list[int] = list(gguf.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    pre = gguf.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_FIRST:
        pre_tokenizer: Any = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in _GPT2_ONLY:
        pre_tokenizer = byte_level
    else:
        raise ModelNotFoundError(f"{gguf.path}: GGUF pre-tokenizer {pre!r} is not supported.")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
                               byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    added = [AddedToken(t, special=k == _TOKEN_CONTROL, normalized=False)
             for t, k in zip(tokens, types, strict=True) if k in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED)]
    tok.add_tokens(added)
    return tok.to_str(pretty=False)


def _token(tokens: list[str], key: str, gguf: GGUFFile) -> str | None:
    index = gguf.get(key)
    return None if index is None or not 0 <= int(index) < len(tokens) else tokens[int(index)]


def convert(src: Path, dest: Path, *, desc: str | None = None, extra_eos: tuple[str, ...] = ()) -> Path:
    """Write the HF checkpoint of the GGUF file ``src`` into the (existing or new) directory ``dest``.

    ``extra_eos`` names further tokens that end generation (written to ``generation_config.json``), e.g. a chat
    model's ``<|endoftext|>`` next to its ``<|im_end|>``. A progress bar on stderr follows the dequantization.
    """
    import numpy as np
    from gguf import dequantize
    from safetensors.numpy import save_file
    from tqdm import tqdm

    gguf = GGUFFile(src)
    config = llama_config(gguf)
    tokens: list[str] = list(gguf.require("tokenizer.ggml.tokens"))
    dest.mkdir(parents=True, exist_ok=True)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    weights: dict[str, Any] = {}
    tensors = gguf.reader.tensors
    for t in tqdm(tensors, desc=desc or f"dequantizing {src.name}", unit="tensor", file=sys.stderr,
                  leave=False, dynamic_ncols=True):
        name = hf_name(t.name)
        # GGUF lists dims innermost first; dequantize returns the row-major [rows, cols] array HF expects.
        value = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        value = value.reshape([int(d) for d in reversed(t.shape.tolist())])
        if name.endswith("q_proj.weight"):
            value = _unpermute(value, heads)
        elif name.endswith("k_proj.weight"):
            value = _unpermute(value, kv_heads)
        weights[name] = np.ascontiguousarray(value)
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    del weights

    eos_ids = [config["eos_token_id"]] if config["eos_token_id"] is not None else []
    eos_ids += [tokens.index(t) for t in extra_eos if t in tokens and tokens.index(t) not in eos_ids]
    _write_json(dest / "config.json", config)
    _write_json(dest / "generation_config.json", {
        "bos_token_id": config["bos_token_id"], "eos_token_id": eos_ids, "pad_token_id": config["pad_token_id"]})
    (dest / "tokenizer.json").write_text(tokenizer_json(gguf), encoding="utf-8")
    specials = {"bos_token": _token(tokens, "tokenizer.ggml.bos_token_id", gguf),
                "eos_token": _token(tokens, "tokenizer.ggml.eos_token_id", gguf),
                "unk_token": _token(tokens, "tokenizer.ggml.unknown_token_id", gguf),
                "pad_token": _token(tokens, "tokenizer.ggml.padding_token_id", gguf)}
    _write_json(dest / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": bool(gguf.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(gguf.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "chat_template": gguf.get("tokenizer.chat_template"),
    })
    _write_json(dest / "special_tokens_map.json", {k: v for k, v in specials.items() if v is not None})
    return dest


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
