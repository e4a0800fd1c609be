"""``--chat-template`` (vLLM's flag) names a template file or is the template itself; its text goes from the
command line to every API server's configuration. A value that is neither, an empty template or one that does not
parse is one line naming the flag, before anything starts."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncdp.config.roles import api_server_role
from tests.config.command_lines import DENSE, fails, serve

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"


@dataclass(frozen=True)
class Info:
    max_position_embeddings: int = 4096
    is_moe: bool = False


def api_server_template(monkeypatch: pytest.MonkeyPatch, flags: str) -> str | None:
    import asyncdp.model as model
    from asyncdp.apiserver.process import api_config
    from asyncdp.launcher.launch_plan import plan_from_config

    monkeypatch.setattr(model, "resolve_model", lambda name: "/m")
    monkeypatch.setattr(model, "read_model_info", lambda path: Info())
    monkeypatch.setattr(model, "resolve_tokenizer", lambda tok, path: path)
    plan = plan_from_config(serve(f"-dp 2 {flags}", DENSE))
    role = api_server_role(plan, 1, managed_ranks=(0, 1), coordinator_client_addr=None, socket_dir=None)
    return api_config(role).chat_template


def test_a_template_file_reaches_the_api_servers_as_its_text(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "template.jinja"
    path.write_text(TEMPLATE, encoding="utf-8")
    assert api_server_template(monkeypatch, f"--chat-template {path}") == TEMPLATE


def test_a_template_given_inline_is_the_template(monkeypatch: pytest.MonkeyPatch) -> None:
    assert api_server_template(monkeypatch, f"--chat-template {shlex.quote(TEMPLATE)}") == TEMPLATE


def test_without_the_flag_the_tokenizers_template_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    assert api_server_template(monkeypatch, "") is None


def test_the_template_is_not_in_the_configs_repr(tmp_path: Path) -> None:
    config = serve(f"--chat-template {shlex.quote(TEMPLATE)}", DENSE)
    assert config.chat_template == TEMPLATE and "m.role" not in repr(config)


@pytest.mark.parametrize("value", ["missing.jinja", "chatml", ""])
def test_a_path_that_cannot_be_read_names_the_flag(value: str) -> None:
    message = fails(f"--chat-template {shlex.quote(value)}", DENSE)
    assert message == (f"--chat-template {value!r} is neither a readable template file (No such file or directory) "
                       f"nor a template (it holds no {{, }} or newline).")


def test_a_directory_is_not_a_template_file(tmp_path: Path) -> None:
    message = fails(f"--chat-template {tmp_path}", DENSE)
    assert message.startswith(f"--chat-template {str(tmp_path)!r} is neither a readable template file (Is a directory)")


def test_a_template_that_does_not_parse_names_the_flag_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.jinja"
    path.write_text("{% for m in messages %}\n{{ m.content }\n{% endfor %}", encoding="utf-8")
    message = fails(f"--chat-template {path}", DENSE)
    assert message.startswith(f"--chat-template {str(path)!r} is not a valid Jinja template (line 2: ")
    inline = fails("--chat-template '{% for m in messages %}'", DENSE)
    assert inline.startswith("--chat-template (the template given inline) is not a valid Jinja template (line 1: ")


def test_an_empty_file_names_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "empty.jinja"
    path.write_text("\n", encoding="utf-8")
    assert fails(f"--chat-template {path}", DENSE) == f"--chat-template {str(path)!r} is empty; give a Jinja chat template."


def test_transformers_generation_tag_parses(tmp_path: Path) -> None:
    source = "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    assert serve(f"--chat-template {shlex.quote(source)}", DENSE).chat_template == source
