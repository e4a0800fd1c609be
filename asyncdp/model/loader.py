"""Load a Hugging Face safetensors checkpoint into ``CausalLM``, reading the HF weight names directly.

The model is built on the target device without a random init (no init cost; not on the meta device, whose
first use imports sympy and torch's symbolic shapes, a second or more of every engine's startup), then every
tensor of every ``*.safetensors`` file is copied into place. Fused parameters take slices: q/k/v -> ``qkv_proj``,
gate/up -> ``gate_up_proj``; per-expert tensors (``mlp.experts.<e>.gate_proj.weight``, Mixtral's
``block_sparse_moe.experts.<e>.w1``) and transformers-5 fused ones (``mlp.experts.gate_up_proj``) go into the
experts' ``w13``/``w2`` restricted to the process's ``ExpertShard`` (expert range and intermediate slice), so an
expert-parallel rank reads only its own experts. Every parameter must be written exactly once, else the
checkpoint is rejected.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open

from asyncdp.errors import ModelNotFoundError
from asyncdp.model.decoder import ArchSpec, CausalLM
from asyncdp.model.info import load_config
from asyncdp.model.moe import ExpertShard, LocalExperts

_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_FUSED_EXPERTS = re.compile(r"^(model\.layers\.\d+\.mlp)\.experts\.(gate_up_proj|down_proj)$")
_QKV = re.compile(r"^(.*\.self_attn)\.(q|k|v)_proj\.(weight|bias)$")
_GATE_UP = re.compile(r"^(.*\.mlp)\.(gate|up)_proj\.weight$")
_MIXTRAL = (("block_sparse_moe.", "mlp."), (".w1.weight", ".gate_proj.weight"), (".w3.weight", ".up_proj.weight"),
            (".w2.weight", ".down_proj.weight"))


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default dtype set to ``dtype`` for the block (process-wide: a model is built before its rank
    runs anything else on torch)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_model(path: Path, *, device: torch.device, dtype: torch.dtype,
               shard: ExpertShard | None = None) -> CausalLM:
    spec = ArchSpec.from_config(load_config(path))
    # Uninitialised (layers.Linear, layers.Embedding): every weight is read below. Built in ``dtype`` itself: built
    # in fp32 and then converted, a bf16 model held three times its size at its peak, on the GPU too.
    with torch.device(device), _default_dtype(dtype):
        model = CausalLM(spec, shard)
    model.rope_cos, model.rope_sin = model.rope_cos.to(device), model.rope_sin.to(device)  # fp32 (CPU-built)
    _load_weights(model, path)
    model.eval().requires_grad_(False)
    return model


def _load_weights(model: CausalLM, path: Path) -> None:
    spec = model.spec
    params = dict(model.named_parameters())
    pending = {name: p.numel() for name, p in params.items()}
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    qkv_rows = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}

    def put(name: str, rows: tuple[int, int] | None, tensor: torch.Tensor) -> None:
        if name not in params:
            raise ModelNotFoundError(f"{path}: unexpected weight for {name!r}.")
        target = params[name].data if rows is None else params[name].data[rows[0]: rows[1]]
        if target.shape != tensor.shape:
            raise ModelNotFoundError(f"{path}: {name} expects {tuple(target.shape)}, file has {tuple(tensor.shape)}.")
        target.copy_(tensor)
        pending[name] -= tensor.numel()

    files = sorted(path.glob("*.safetensors"))
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                name = key
                if ".block_sparse_moe." in name:
                    for old, new in _MIXTRAL:
                        name = name.replace(old, new)
                if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and model.lm_head is None):
                    continue
                if (m := _EXPERT.match(name)) is not None:
                    _put_expert(model, pending, m.group(1), int(m.group(2)), m.group(3), f.get_tensor(key))
                elif (m := _FUSED_EXPERTS.match(name)) is not None:
                    tensor = f.get_tensor(key)
                    for e in range(tensor.shape[0]):
                        if m.group(2) == "down_proj":
                            _put_expert(model, pending, m.group(1), e, "down_proj", tensor[e])
                        else:
                            gate, up = tensor[e].chunk(2, dim=0)
                            _put_expert(model, pending, m.group(1), e, "gate_proj", gate)
                            _put_expert(model, pending, m.group(1), e, "up_proj", up)
                elif (m := _QKV.match(name)) is not None:
                    put(f"{m.group(1)}.qkv_proj.{m.group(3)}", qkv_rows[m.group(2)], f.get_tensor(key))
                elif (m := _GATE_UP.match(name)) is not None and f"{m.group(1)}.gate_up_proj.weight" in params:
                    inter = params[f"{m.group(1)}.gate_up_proj.weight"].shape[0] // 2
                    rows = (0, inter) if m.group(2) == "gate" else (inter, 2 * inter)
                    put(f"{m.group(1)}.gate_up_proj.weight", rows, f.get_tensor(key))
                else:
                    put(name, None, f.get_tensor(key))
    missing = [name for name, left in pending.items() if left != 0]
    if missing:
        raise ModelNotFoundError(f"{path}: weights missing from the checkpoint: {', '.join(missing[:8])}.")


def _put_expert(model: CausalLM, pending: dict[str, int], prefix: str,
                expert: int, kind: str, tensor: torch.Tensor) -> None:
    experts = model.get_submodule(f"{prefix}.experts")
    if not isinstance(experts, LocalExperts):
        raise ModelNotFoundError(f"{prefix}: expert weights for a dense layer.")
    local = expert - experts.expert_start
    if not 0 <= local < experts.num_local_experts:
        return  # another rank's expert
    inter = experts.local_intermediate
    i0, i1 = experts.intermediate_start, experts.intermediate_start + inter
    if kind == "down_proj":
        target = experts.w2.data[local]
        piece = tensor[:, i0:i1]
        name = f"{prefix}.experts.w2"
    else:
        rows = slice(0, inter) if kind == "gate_proj" else slice(inter, 2 * inter)
        target = experts.w13.data[local, rows]
        piece = tensor[i0:i1]
        name = f"{prefix}.experts.w13"
    if target.shape != piece.shape:
        raise ModelNotFoundError(f"{prefix}.experts.{expert}.{kind}: expects {tuple(target.shape)}, "
                                 f"file has {tuple(piece.shape)}.")
    target.copy_(piece)
    pending[name] -= piece.numel()
