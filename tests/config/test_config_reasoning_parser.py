"""``--reasoning-parser``: an unknown name is refused (exit 2, naming the choices), and the parser reaches every
API server's role."""

from __future__ import annotations

import pytest

from tests.config.command_lines import DENSE, api_server_configs, fails


def test_an_unknown_parser_is_refused_naming_the_choices():
    assert fails("--reasoning-parser olmo3", DENSE) == (
        "--reasoning-parser must be one of deepseek_r1, deepseek_v3, ernie45, glm45, granite, holo2, hunyuan_a13b, "
        "kimi_k2, minimax_m2, minimax_m2_append_think, mistral, openai_gptoss, qwen3, seed_oss, step3 (got 'olmo3').")


@pytest.mark.parametrize(("flags", "parser"), [("--reasoning-parser qwen3", "qwen3"),
                                               ("--reasoning-parser deepseek_r1", "deepseek_r1"), ("", None),
                                               ("--reasoning-parser deepseek_v3", "deepseek_v3"),
                                               ("--reasoning-parser ernie45", "ernie45"),
                                               ("--reasoning-parser hunyuan_a13b", "hunyuan_a13b"),
                                               ("--reasoning-parser holo2", "holo2"),
                                               ("--reasoning-parser minimax_m2_append_think",
                                                "minimax_m2_append_think"),
                                               ("--reasoning-parser openai_gptoss", "openai_gptoss")])
def test_the_parser_reaches_every_api_server_role(monkeypatch: pytest.MonkeyPatch, flags: str, parser: str | None):
    assert [c.reasoning_parser for c in api_server_configs(monkeypatch, flags)] == [parser, parser]
