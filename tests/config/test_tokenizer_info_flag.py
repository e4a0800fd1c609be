"""``--enable-tokenizer-info-endpoint`` (vLLM's flag) goes from the command line to every API server's app, off by
default; ``--no-enable-tokenizer-info-endpoint`` turns it off again. Off, the app has no ``/tokenizer_info``."""

from __future__ import annotations

import pytest

from tests.config.command_lines import DENSE, api_server_configs, serve


@pytest.mark.parametrize(("flags", "expected"), [
    ("", False), ("--enable-tokenizer-info-endpoint", True), ("--enable_tokenizer_info_endpoint", True),
    ("--enable-tokenizer-info-endpoint --no-enable-tokenizer-info-endpoint", False),
])
def test_the_flag_reaches_every_api_servers_app(monkeypatch: pytest.MonkeyPatch, flags: str, expected: bool) -> None:
    from asyncdp.apiserver.process import make_app
    from asyncdp.testing import FakeEngineClient

    assert serve(f"-dp 2 --api-server-count 2 {flags}", DENSE).enable_tokenizer_info_endpoint is expected
    configs = api_server_configs(monkeypatch, flags)
    assert [cfg.enable_tokenizer_info_endpoint for cfg in configs] == [expected, expected]
    for cfg in configs:
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
