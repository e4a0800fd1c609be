"""``VLLM_SERVER_DEV_MODE=1`` (or ``ASYNCDP_SERVER_DEV_MODE=1``), vLLM's switch of its development routes, goes from
the launcher's environment to every API server's app, which then serves ``POST /reset_prefix_cache``; any other
value, or none, leaves the route out (a 404, as in vLLM)."""

from __future__ import annotations

import pytest

from tests.config.command_lines import api_server_configs


@pytest.mark.parametrize(("env", "expected"), [
    ({}, False), ({"ASYNCDP_SERVER_DEV_MODE": "1"}, True), ({"VLLM_SERVER_DEV_MODE": "1"}, True),
    ({"VLLM_SERVER_DEV_MODE": " 1 "}, True), ({"VLLM_SERVER_DEV_MODE": "0"}, False),
    ({"ASYNCDP_SERVER_DEV_MODE": "true"}, False),
])
def test_the_environment_reaches_every_api_servers_app(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                       expected: bool) -> None:
    from asyncdp.apiserver.process import make_app
    from asyncdp.testing import FakeEngineClient

    configs = api_server_configs(monkeypatch, "", env)
    assert [cfg.server_dev_mode for cfg in configs] == [expected, expected]
    for cfg in configs:
        fake = FakeEngineClient()
        routes = {rule.rule for rule in make_app(cfg, fake, fake.metrics).url_map.iter_rules()}
        assert ("/reset_prefix_cache" in routes) is expected
