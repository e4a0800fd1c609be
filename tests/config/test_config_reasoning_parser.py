"""``--reasoning-parser``: an unknown name is refused (exit 2, naming the choices), and the parser reaches every
API server's role."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from asyncdp.config.roles import api_server_role
from tests.config.command_lines import DENSE, fails, serve


def test_an_unknown_parser_is_refused_naming_the_choices():
    assert fails("--reasoning-parser granite", DENSE) == (
        "--reasoning-parser must be one of deepseek_r1, qwen3 (got 'granite').")


@dataclass(frozen=True)
class _Info:
    max_position_embeddings: int = 512
    is_moe: bool = False


@pytest.mark.parametrize(("flags", "parser"), [("--reasoning-parser qwen3", "qwen3"),
                                               ("--reasoning-parser deepseek_r1", "deepseek_r1"), ("", None)])
def test_the_parser_reaches_every_api_server_role(monkeypatch: pytest.MonkeyPatch, flags: str, parser: str | None):
    import asyncdp.model as model
    from asyncdp.apiserver.process import api_config
    from asyncdp.launcher.launch_plan import plan_from_config

    monkeypatch.setattr(model, "resolve_model", lambda name: "/m")
    monkeypatch.setattr(model, "read_model_info", lambda path: _Info())
    monkeypatch.setattr(model, "resolve_tokenizer", lambda tok, path: path)
    plan = plan_from_config(serve(f"-dp 2 --api-server-count 2 {flags}", DENSE))
    roles = [api_server_role(plan, client_index=i, managed_ranks=(0, 1), coordinator_client_addr=None,
                             socket_dir=None) for i in range(2)]
    assert [api_config(r).reasoning_parser for r in roles] == [parser, parser]
