"""``--enable-tokenizer-info-endpoint`` (vLLM's flag) goes from the command line to every API server's app, off by
default; ``--no-enable-tokenizer-info-endpoint`` turns it off again. Off, the app has no ``/tokenizer_info``."""

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
    ("", False), ("--enable-tokenizer-info-endpoint", True), ("--enable_tokenizer_info_endpoint", True),
    ("--enable-tokenizer-info-endpoint --no-enable-tokenizer-info-endpoint", False),
])
def test_the_flag_reaches_every_api_servers_app(monkeypatch: pytest.MonkeyPatch, flags: str, expected: bool) -> None:
    import asyncdp.model as model
    from asyncdp.apiserver.process import api_config, make_app
    from asyncdp.launcher.launch_plan import plan_from_config
    from asyncdp.testing import FakeEngineClient

    monkeypatch.setattr(model, "resolve_model", lambda name: "/m")
    monkeypatch.setattr(model, "read_model_info", lambda path: Info())
    monkeypatch.setattr(model, "resolve_tokenizer", lambda tok, path: path)
    config = serve(f"-dp 2 --api-server-count 2 {flags}", DENSE)
    assert config.enable_tokenizer_info_endpoint is expected
    plan = plan_from_config(config)
    assert plan.enable_tokenizer_info_endpoint is expected
    for index in (0, 1):
        role = api_server_role(plan, index, managed_ranks=(0, 1), coordinator_client_addr=None, socket_dir=None)
        assert role.enable_tokenizer_info_endpoint is expected
        cfg = api_config(role)
        assert cfg.enable_tokenizer_info_endpoint is expected
        fake = FakeEngineClient()
        app = make_app(cfg, fake, fake.metrics)
        routes = {rule.rule for rule in app.url_map.iter_rules()}
        assert ("/tokenizer_info" in routes) is expected


def test_make_app_renders_with_the_servers_chat_template() -> None:
    from asyncdp.apiserver.client_config import ClientConfig
    from asyncdp.apiserver.process import ApiConfig, make_app
    from asyncdp.testing import FakeEngineClient

    client = ClientConfig(client_index=0, client_count=1, managed_ranks=(0,), dp_size=1, model_name="m",
                          max_model_len=64)
    fake = FakeEngineClient()
    make_app(ApiConfig(client=client, model_path="m", chat_template="T {{ messages }}"), fake, fake.metrics)
    assert fake.tokenizer.chat_template == "T {{ messages }}"
