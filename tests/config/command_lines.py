"""Real command lines for the config tests (tests/config/test_config_*.py): the model's facts are injected (no
model package needed) and the environment is an explicit mapping; ``serve`` builds the ServeConfig, ``deploy``
its resolved deployment, ``fails`` the ConfigError's message."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

import pytest

from asyncdp.cli import build_serve_config
from asyncdp.config.deployment import DeploymentConfig
from asyncdp.config.flags import ServeConfig
from asyncdp.errors import ConfigError


@dataclass(frozen=True)
class Facts:
    is_moe: bool = True
    num_experts: int = 8


MOE, DENSE = Facts(True, 8), Facts(False, 0)


def serve(cmd: str, facts: Facts = MOE, env: dict[str, str] | None = None) -> ServeConfig:
    return build_serve_config(shlex.split(cmd), env=env or {}, model_facts=lambda _name: facts)


def deploy(cmd: str, facts: Facts = MOE, env: dict[str, str] | None = None) -> DeploymentConfig:
    d = serve(cmd, facts, env).deployment
    assert d is not None
    return d


def fails(cmd: str, facts: Facts = MOE, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        serve(cmd, facts, env)
    return str(info.value)


@dataclass(frozen=True)
class _ModelInfo:
    max_position_embeddings: int = 512
    is_moe: bool = False


def api_server_configs(monkeypatch: pytest.MonkeyPatch, cmd: str, env: dict[str, str] | None = None) -> list[Any]:
    """The config each API server of ``asyncdp serve <dense model> -dp 2 --api-server-count 2 cmd`` starts with, as
    its process builds it from its role (no model on disk: its facts are injected), under ``env``."""
    import asyncdp.model as model
    from asyncdp.apiserver.process import api_config
    from asyncdp.config.roles import api_server_role
    from asyncdp.launcher.launch_plan import plan_from_config

    monkeypatch.setattr(model, "resolve_model", lambda name: "/m")
    monkeypatch.setattr(model, "read_model_info", lambda path: _ModelInfo())
    monkeypatch.setattr(model, "resolve_tokenizer", lambda tok, path: path)
    plan = plan_from_config(serve(f"-dp 2 --api-server-count 2 {cmd}", DENSE, env))
    return [api_config(api_server_role(plan, client_index=i, managed_ranks=(0, 1), coordinator_client_addr=None,
                                       socket_dir=None)) for i in range(2)]
