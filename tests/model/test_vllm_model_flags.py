"""The vLLM flags that depend on the checkpoint or the device (docs/reference/cli.md, "vLLM flags that carry over"):
``--generation-config`` against the sampling defaults of the model's generation_config.json, and
``--gpu-memory-utilization``'s KV-cache budget on CUDA (its arithmetic everywhere, the executor on a GPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from asyncdp.cli import build_serve_config, unsupported_reason
from asyncdp.config.flags import EngineConfig
from asyncdp.errors import ConfigError
from asyncdp.model import read_model_info
from asyncdp.model.info import kv_bytes_from_share


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


def test_generation_config_auto_is_refused_where_the_checkpoint_recommends_sampling_defaults(recommending_path):
    with pytest.raises(ConfigError) as info:
        resolved(recommending_path, "--generation-config", "auto")
    assert str(info.value) == (
        "--generation-config auto is not supported in this build yet; asyncdp does not apply the sampling defaults "
        "of the model's generation_config.json (temperature=0.6, top_k=20, top_p=0.95): pass --generation-config "
        "vllm, or send these parameters with each request")


def test_without_generation_config_such_a_checkpoint_starts_with_a_warning_and_vllm_silences_it(recommending_path):
    warned = resolved(recommending_path).deployment.warnings
    assert [w for w in warned if "generation_config.json sets temperature=0.6, top_k=20, top_p=0.95" in w], warned
    assert resolved(recommending_path, "--generation-config", "vllm").deployment.warnings == ()


def test_generation_config_auto_is_accepted_where_the_checkpoint_recommends_nothing(dense_path):
    config = resolved(dense_path, "--generation-config", "auto")
    assert config.deployment.warnings == () and unsupported_reason(config) is None


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
