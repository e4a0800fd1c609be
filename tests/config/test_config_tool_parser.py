"""``--enable-auto-tool-choice`` and ``--tool-call-parser``: what is refused (exit 2, as vLLM refuses the first
without the second), and that the parser reaches every API server's role only when both are given."""

from __future__ import annotations

import pytest

from tests.config.command_lines import DENSE, api_server_configs, fails, serve


def test_auto_tool_choice_without_a_parser_is_refused_naming_the_choices():
    message = fails("-dp 2 --enable-auto-tool-choice", DENSE)
    assert message.startswith("--enable-auto-tool-choice requires --tool-call-parser (one of hermes, llama3_json, "
                              "llama4_pythonic, mistral, openai, pythonic, qwen3_coder)"), message


def test_an_unknown_parser_is_refused_naming_the_choices():
    assert fails("--tool-call-parser granite", DENSE) == (
        "--tool-call-parser must be one of hermes, llama3_json, llama4_pythonic, mistral, openai, pythonic, qwen3_coder "
        "(got 'granite').")


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "llama4_pythonic", "mistral", "openai", "pythonic",
                                    "qwen3_coder"])
def test_every_parser_is_accepted_with_auto_tool_choice(parser: str):
    config = serve(f"--enable-auto-tool-choice --tool-call-parser {parser}", DENSE)
    assert config.tool_call_parser == parser and config.enable_auto_tool_choice


def test_a_parser_alone_is_accepted_as_vllm_accepts_it():
    config = serve("--tool-call-parser hermes", DENSE)
    assert config.tool_call_parser == "hermes" and not config.enable_auto_tool_choice


@pytest.mark.parametrize(("flags", "parser"), [
    ("--enable-auto-tool-choice --tool-call-parser hermes", "hermes"),
    ("--tool-call-parser hermes", None),  # the parser alone serves no "auto"
    ("", None),
])
def test_the_parser_reaches_every_api_server_role_with_auto_tool_choice(monkeypatch: pytest.MonkeyPatch,
                                                                         flags: str, parser: str | None):
    assert [c.auto_tool_call_parser for c in api_server_configs(monkeypatch, flags)] == [parser, parser]
