"""Checkpoint naming, export and loading: built-ins materialise as real HF checkpoints, bad names fail clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from asyncdp.errors import ModelNotFoundError
from asyncdp.model import builtin_names, load_tokenizer, read_model_info, resolve_model
from asyncdp.model.loader import load_model
from asyncdp.model.moe import ExpertShard


def test_transformers_loads_exported_checkpoint_and_tokenizer(model_path: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_path))
    tok = transformers.AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
    info = read_model_info(model_path)
    assert model.config.model_type == info.model_type
    assert 10_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    text = "héllo <|im_end|>"
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("AB") == [65, 66]  # byte-level: id == byte
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids("<|im_end|>") in info.eos_token_ids


def test_model_info_reports_moe_shape(moe_path: Path, dense_path: Path) -> None:
    moe, dense = read_model_info(moe_path), read_model_info(dense_path)
    assert (moe.is_moe, moe.num_experts, moe.num_experts_per_tok) == (True, 8, 2)
    assert (dense.is_moe, dense.num_experts) == (False, 0)
    assert (moe.num_heads, moe.num_kv_heads, moe.head_dim, moe.max_position_embeddings) == (4, 2, 16, 2048)
    assert moe.eos_token_ids == {256, 258}
    assert moe.dtype == "float32"


def test_resolve_builtin_materialises_once_in_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCDP_CACHE_DIR", str(tmp_path))
    first = resolve_model("builtin:tiny-dense")
    assert first.parent == tmp_path / "models" and first.name.startswith("tiny-dense-")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("builtin:tiny-dense") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "models").iterdir()] == [first.name]  # no temp folder left behind
    assert load_tokenizer(first).encode("a") == [97]


def test_resolve_unknown_builtin_lists_known_names() -> None:
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("builtin:huge")
    for name in builtin_names():
        assert name in str(info.value)


def test_resolve_directory_without_weights_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(ModelNotFoundError, match=r"safetensors"):
        resolve_model(str(tmp_path))


def test_resolve_missing_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="neither"):
        resolve_model(str(tmp_path / "absent"))


def test_resolve_accepts_an_exported_directory(dense_path: Path) -> None:
    assert resolve_model(str(dense_path)) == dense_path


def _expert_outputs(path: Path, shards: list[ExpertShard]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 64, generator=gen)
    outs = []
    for shard in shards:
        model = load_model(path, device=torch.device("cpu"), dtype=torch.float32, shard=shard)
        block = model.moe_blocks()[1]
        ids, weights = block.route(hidden)
        outs.append(block.experts(hidden, ids, weights))
    return outs


def test_expert_range_shards_sum_to_the_full_layer(moe_path: Path) -> None:
    full, *parts = _expert_outputs(moe_path, [ExpertShard()] + [ExpertShard.for_expert_parallel(8, r, 3)
                                                                for r in range(3)])
    assert [s.expert_end for s in (ExpertShard.for_expert_parallel(8, r, 3) for r in range(3))] == [3, 6, 8]
    torch.testing.assert_close(sum(parts), full)


def test_intermediate_slices_sum_to_the_full_layer(moe_path: Path) -> None:
    full, *parts = _expert_outputs(moe_path, [ExpertShard()] + [ExpertShard.for_tensor_parallel(32, r, 3)
                                                                for r in range(3)])
    torch.testing.assert_close(sum(parts), full)


def test_fused_expert_tensors_load_like_per_expert_tensors(moe_path: Path, tmp_path: Path) -> None:
    """transformers-5 style ``mlp.experts.gate_up_proj`` [E, 2I, H] / ``down_proj`` [E, H, I] tensors."""
    import shutil

    from safetensors.torch import load_file, save_file

    tensors = load_file(str(moe_path / "model.safetensors"))
    fused: dict[str, torch.Tensor] = {}
    for layer in range(4):
        p = f"model.layers.{layer}.mlp.experts"
        gate_up = [torch.cat([tensors.pop(f"{p}.{e}.gate_proj.weight"), tensors.pop(f"{p}.{e}.up_proj.weight")])
                   for e in range(8)]
        fused[f"{p}.gate_up_proj"] = torch.stack(gate_up)
        fused[f"{p}.down_proj"] = torch.stack([tensors.pop(f"{p}.{e}.down_proj.weight") for e in range(8)])
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(moe_path / name, tmp_path / name)
    save_file({**tensors, **fused}, str(tmp_path / "model.safetensors"))
    cpu = torch.device("cpu")
    a = load_model(moe_path, device=cpu, dtype=torch.float32, shard=ExpertShard(expert_start=2, expert_end=5))
    b = load_model(tmp_path, device=cpu, dtype=torch.float32, shard=ExpertShard(expert_start=2, expert_end=5))
    for x, y in zip(a.moe_blocks(), b.moe_blocks(), strict=True):
        torch.testing.assert_close(x.experts.w13, y.experts.w13, rtol=0, atol=0)
        torch.testing.assert_close(x.experts.w2, y.experts.w2, rtol=0, atol=0)


def test_checkpoint_missing_a_weight_is_refused(dense_path: Path, tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    tensors = load_file(str(dense_path / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    shutil.copy(dense_path / "config.json", tmp_path / "config.json")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelNotFoundError, match="qkv_proj"):
        load_model(tmp_path, device=torch.device("cpu"), dtype=torch.float32)


def test_padded_and_grouped_expert_paths_agree(moe_path: Path) -> None:
    model = load_model(moe_path, device=torch.device("cpu"), dtype=torch.float32)
    experts = model.moe_blocks()[0].experts
    hidden = torch.randn(40, 64, generator=torch.Generator().manual_seed(3))
    ids, weights = model.moe_blocks()[0].route(hidden)
    local = ids.reshape(-1)
    order = torch.argsort(local, stable=True)
    counts = torch.bincount(local, minlength=8)
    token_index = order // 2
    padded = experts._padded(hidden, local[order], counts, token_index, int(counts.max()))
    grouped = experts._grouped(hidden[token_index], counts.tolist())
    torch.testing.assert_close(padded, grouped)


def test_model_package_imports_without_torch_or_transformers() -> None:
    """API servers resolve models too; only the executor may pull in torch."""
    import subprocess
    import sys

    code = ("import sys, asyncdp.model; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_tokenizer_flag_accepts_a_directory_holding_only_a_tokenizer(dense_path: Path, tmp_path: Path) -> None:
    import shutil

    from asyncdp.config.flags import EngineConfig
    from asyncdp.engine.build import build_engine_core

    tok_dir = tmp_path / "tokenizer-only"
    tok_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(dense_path / name, tok_dir / name)
    core = build_engine_core(EngineConfig(model=str(dense_path), tokenizer=str(tok_dir), executor="sim"))
    try:
        assert core.tokenizer.encode("hi", add_special_tokens=False) == list(b"hi")
    finally:
        core.shutdown()
