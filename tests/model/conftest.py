"""Shared fixtures: the built-in checkpoints exported once per session, and a torch limited to one thread."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncdp.model import export_builtin


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def dense_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_builtin("builtin:tiny-dense", tmp_path_factory.mktemp("tiny-dense"))


@pytest.fixture(scope="session")
def moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_builtin("builtin:tiny-moe", tmp_path_factory.mktemp("tiny-moe"))


@pytest.fixture(params=["dense", "moe"])
def model_path(request: pytest.FixtureRequest, dense_path: Path, moe_path: Path) -> Path:
    return dense_path if request.param == "dense" else moe_path
