"""``--trust-request-chat-template`` (vLLM's flag) goes from the command line to every API server's app, off by
default; ``--no-trust-request-chat-template`` turns it off again."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from asyncdp.config.roles import api_server_role
from tests.config.command_lines import DENSE, serve


@dataclass(frozen=True)
class Info:
    max_position_embeddings: int = 4096
    is_moe: bool = False


@pytest.mark.parametrize(("flags", "expected"), [
    ("", False), ("--trust-request-chat-template", True), ("--trust_request_chat_template", True),
    ("--trust-request-chat-template --no-trust-request-chat-template", False),
])
def test_the_flag_reaches_the_api_servers_config(monkeypatch: pytest.MonkeyPatch, flags: str, expected: bool) -> None:
    import asyncdp.model as model
    from asyncdp.apiserver.process import api_config
    from asyncdp.launcher.launch_plan import plan_from_config

    monkeypatch.setattr(model, "resolve_model", lambda name: "/m")
    monkeypatch.setattr(model, "read_model_info", lambda path: Info())
    monkeypatch.setattr(model, "resolve_tokenizer", lambda tok, path: path)
    config = serve(f"-dp 2 {flags}", DENSE)
    assert config.trust_request_chat_template is expected
    plan = plan_from_config(config)
    assert plan.trust_request_chat_template is expected
    role = api_server_role(plan, 1, managed_ranks=(0, 1), coordinator_client_addr=None, socket_dir=None)
    assert role.trust_request_chat_template is expected
    assert api_config(role).trust_request_chat_template is expected
