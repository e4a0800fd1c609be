"""Real command lines for the config tests (tests/config/test_config_*.py): the model's facts are injected (no
model package needed) and the environment is an explicit mapping; ``serve`` builds the ServeConfig, ``deploy``
its resolved deployment, ``fails`` the ConfigError's message, ``exits_2`` what ``asyncdp serve`` prints as it exits 2
before starting anything."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from asyncdp.cli import build_serve_config, main, unsupported_reason
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


def underscored(cmd: str) -> str:
    """``cmd`` with every long flag in vLLM's other spelling: ``--max_model_len``."""
    return shlex.join("--" + w[2:].replace("-", "_") if w.startswith("--") else w for w in shlex.split(cmd))


class Launcher:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, config: Any) -> int:
        self.calls += 1
        return 0


def exits_2(cmd: str, facts: Facts, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The stderr lines of ``asyncdp serve cmd``, once it exited 2 without calling the launcher."""
    launcher = Launcher()
    assert main(["serve", *shlex.split(cmd)], model_facts=lambda _name: facts, run_serve=launcher, env={}) == 2
    assert launcher.calls == 0
    return capsys.readouterr().err.splitlines()



def accepted_both_spellings(cmd: str, read: Callable[[ServeConfig], Any], expected: Any, facts: Facts) -> None:
    """``asyncdp serve -dp 2 cmd`` resolves, in both of vLLM's spellings of its flags, to a configuration that
    ``read`` finds ``expected`` in and that nothing refuses."""
    for spelling in (cmd, underscored(cmd)):
        config = serve(f"-dp 2 {spelling}", facts)
        assert read(config) == expected, spelling
        assert unsupported_reason(config) is None

def refused_both_spellings(cmd: str, message: str, facts: Facts, capsys: pytest.CaptureFixture[str]) -> None:
    """``asyncdp serve -dp 2 cmd`` exits 2 with the one line ``message``, before the launcher, in both of vLLM's
    spellings of its flags (dashes and underscores)."""
    for spelling in (cmd, underscored(cmd)):
        assert exits_2(f"-dp 2 {spelling}", facts, capsys) == [f"asyncdp: error: {message}"]

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
