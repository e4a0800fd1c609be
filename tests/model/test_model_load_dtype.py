"""A model is built in its serving dtype, not built in fp32 and converted.

Built in fp32 and then ``.to(bfloat16)``, a model held its fp32 parameters and their bf16 copies at once: three
times its serving size at the peak of its load (a 7B model: 42 GB of GPU memory to serve from 14 GB). The spy
records every floating-point tensor that a factory op (``empty``, ``ones``, ``zeros``, ``full``) creates during the load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from asyncdp.model.loader import load_model

_FACTORIES = {torch.ops.aten.empty, torch.ops.aten.empty_strided, torch.ops.aten.ones, torch.ops.aten.zeros,
              torch.ops.aten.full}


class _Factories(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.created: list[tuple[str, torch.dtype, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in _FACTORIES and isinstance(out, torch.Tensor) and out.dtype.is_floating_point:
            self.created.append((str(func), out.dtype, out.numel()))
        return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("which", ["dense", "moe"])
def test_parameters_are_created_in_the_serving_dtype(which: str, dtype: torch.dtype, dense_path: Path,
                                                     moe_path: Path) -> None:
    path = dense_path if which == "dense" else moe_path
    spy = _Factories()
    with spy:
        model = load_model(path, device=torch.device("cpu"), dtype=dtype)
    numel = sum(p.numel() for p in model.parameters())
    created = sum(n for _, _, n in spy.created)
    assert created >= numel  # every parameter was created by a factory op the spy saw
    assert [c for c in spy.created if c[1] != dtype] == []
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert model.rope_cos.dtype == model.rope_sin.dtype == torch.float32
    assert torch.get_default_dtype() == torch.float32  # restored


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_a_bf16_load_holds_the_fp32_loads_weights_rounded(which: str, dense_path: Path, moe_path: Path) -> None:
    path = dense_path if which == "dense" else moe_path
    cpu = torch.device("cpu")
    full = load_model(path, device=cpu, dtype=torch.float32)
    half = load_model(path, device=cpu, dtype=torch.bfloat16)
    ref = dict(full.named_parameters())
    for name, p in half.named_parameters():
        assert torch.equal(p, ref[name].to(torch.bfloat16)), name
    assert torch.equal(half.rope_cos, full.rope_cos) and torch.equal(half.rope_sin, full.rope_sin)
