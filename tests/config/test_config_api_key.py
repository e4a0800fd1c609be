"""``--api-key`` and its environment variables: where the key comes from, what is refused (exit 2, the key never
echoed), and that it reaches every API server's role config without showing in a repr or a log line."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from asyncdp.config.roles import api_server_role
from tests.config.command_lines import DENSE, fails, serve

KEY = "sk-test-0123456789"


def test_no_key_by_default():
    assert serve("-dp 2", DENSE).api_key is None


def test_the_flag_gives_the_key():
    assert serve(f"-dp 2 --api-key {KEY}", DENSE).api_key == KEY


@pytest.mark.parametrize("env", [{"ASYNCDP_API_KEY": KEY}, {"VLLM_API_KEY": KEY},
                                 {"ASYNCDP_API_KEY": KEY, "VLLM_API_KEY": "other"}])
def test_the_environment_gives_the_key_asyncdp_before_vllm(env):
    assert serve("-dp 2", DENSE, env=env).api_key == KEY


def test_the_flag_wins_over_the_environment():
    assert serve(f"--api-key {KEY}", DENSE, env={"ASYNCDP_API_KEY": "from-env"}).api_key == KEY


@pytest.mark.parametrize("key", ["", "two words", "tab\there", "é-accent", "x" * 4097])
def test_a_key_that_cannot_travel_in_an_authorization_header_is_refused_without_echoing_it(key):
    message = fails(f"--api-key '{key}'", DENSE)
    assert "--api-key (ASYNCDP_API_KEY) must be 1 to 4096 printable ASCII characters" in message
    assert f"got {len(key)} characters" in message
    if key:
        assert key not in message


@dataclass(frozen=True)
class _Info:
    max_position_embeddings: int = 512
    is_moe: bool = False


def test_the_key_is_not_in_the_config_reprs_and_reaches_every_api_server_role(monkeypatch: pytest.MonkeyPatch):
    import asyncdp.model as model
    from asyncdp.launcher.launch_plan import plan_from_config

    monkeypatch.setattr(model, "resolve_model", lambda name: "/m")
    monkeypatch.setattr(model, "read_model_info", lambda path: _Info())
    monkeypatch.setattr(model, "resolve_tokenizer", lambda tok, path: path)
    config = serve(f"-dp 2 --api-server-count 2 --api-key {KEY}", DENSE)
    plan = plan_from_config(config)
    assert plan.api_key == KEY
    assert KEY not in repr(config) and KEY not in repr(plan)
    roles = [api_server_role(plan, client_index=i, managed_ranks=(0, 1), coordinator_client_addr=None,
                             socket_dir=None) for i in range(2)]
    assert [r.api_key for r in roles] == [KEY, KEY]
