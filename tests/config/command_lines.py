"""Real command lines for the config tests (tests/config/test_config_*.py): the model's facts are injected (no
model package needed) and the environment is an explicit mapping; ``serve`` builds the ServeConfig, ``deploy``
its resolved deployment, ``fails`` the ConfigError's message."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

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
