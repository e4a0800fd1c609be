"""``--chat-template-content-format`` (vLLM's flag) goes from the command line to every API server's app; a value
other than auto, string or openai is a configuration error naming the flag."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from asyncdp.config.roles import api_server_role
from tests.config.command_lines import DENSE, fails, serve


@dataclass(frozen=True)
class Info:
    max_position_embeddings: int = 4096
    is_moe: bool = False


@pytest.mark.parametrize(("flags", "expected"), [
    ("", "auto"), ("--chat-template-content-format openai", "openai"),
    ("--chat-template-content-format=string", "string"), ("--chat_template_content_format auto", "auto"),
])
def test_the_flag_reaches_the_api_servers_config(monkeypatch: pytest.MonkeyPatch, flags: str, expected: str) -> None:
    import asyncdp.model as model
    from asyncdp.apiserver.process import api_config
    from asyncdp.launcher.launch_plan import plan_from_config

    monkeypatch.setattr(model, "resolve_model", lambda name: "/m")
    monkeypatch.setattr(model, "read_model_info", lambda path: Info())
    monkeypatch.setattr(model, "resolve_tokenizer", lambda tok, path: path)
    config = serve(f"-dp 2 {flags}", DENSE)
    assert config.chat_template_content_format == expected
    plan = plan_from_config(config)
    role = api_server_role(plan, 1, managed_ranks=(0, 1), coordinator_client_addr=None, socket_dir=None)
    assert role.chat_template_content_format == expected
    assert api_config(role).chat_template_content_format == expected


@pytest.mark.parametrize("value", ["parts", "OpenAI", ""])
def test_an_unknown_format_names_the_flag_and_the_choices(value: str) -> None:
    message = fails(f"--chat-template-content-format '{value}'", DENSE)
    assert message == f"--chat-template-content-format must be one of auto, string, openai (got {value!r})."
