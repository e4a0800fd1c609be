"""``--generation-config`` and ``--override-generation-config`` resolved as vLLM's ModelConfig.get_diff_sampling_param
and its serving layer do (docs/reference/cli.md, "vLLM flags that carry over"): which sampling defaults apply, the
default ``max_tokens`` and the server-wide cap, from real command lines; each API server gets them in its role."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from asyncdp.cli import main
from asyncdp.config.generation_config import GenerationDefaults, resolve_generation_defaults
from tests.config.command_lines import DENSE, api_server_configs, fails, serve

QWEN3 = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 64, "do_sample": True, "bos_token_id": 1}


def write_generation_config(folder: Path, **fields: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, **fields}))
    return folder


def test_auto_takes_the_models_sampling_fields_and_max_new_tokens_as_the_default_max_tokens():
    assert resolve_generation_defaults("auto", {}, QWEN3) == GenerationDefaults(
        temperature=0.6, top_p=0.95, top_k=20, max_tokens=64)  # (not a cap: vLLM's override_max_tokens is None)


def test_null_fields_and_fields_beyond_vllms_six_are_not_defaults():
    fields = {"temperature": None, "repetition_penalty": 1.1, "min_p": 0.05, "presence_penalty": 1.5,
              "max_length": 100, "do_sample": True}
    assert resolve_generation_defaults("auto", {}, fields) == GenerationDefaults(repetition_penalty=1.1, min_p=0.05)


def test_vllm_ignores_the_model_but_not_the_override():
    assert resolve_generation_defaults("vllm", {}, QWEN3) == GenerationDefaults()
    assert resolve_generation_defaults("vllm", {"temperature": 0.5}, QWEN3) == GenerationDefaults(temperature=0.5)


def test_the_override_wins_over_and_adds_to_the_models_and_its_max_new_tokens_caps_every_request():
    assert resolve_generation_defaults("auto", {"temperature": 0.2, "min_p": 0.1, "max_new_tokens": 32}, QWEN3) == (
        GenerationDefaults(temperature=0.2, top_p=0.95, top_k=20, min_p=0.1, max_tokens=32, max_tokens_cap=32))


def test_a_folder_is_read_instead_of_the_model_and_its_max_new_tokens_caps_every_request(tmp_path):
    folder = write_generation_config(tmp_path / "gen", temperature=0.3, max_new_tokens=8)
    assert resolve_generation_defaults(str(folder), {"top_k": 5}, QWEN3) == GenerationDefaults(
        temperature=0.3, top_k=5, max_tokens=8, max_tokens_cap=8)
    assert resolve_generation_defaults(str(tmp_path), {}, QWEN3) == GenerationDefaults()  # no file: none (vLLM)


@pytest.mark.parametrize(("defaults", "given", "expected"), [
    (GenerationDefaults(), None, None),  # the engine: up to max_model_len
    (GenerationDefaults(), 9, 9),
    (GenerationDefaults(max_tokens=64), None, 64),
    (GenerationDefaults(max_tokens=64), 100, 100),  # the request's own wins over the default
    (GenerationDefaults(max_tokens=64, max_tokens_cap=32), 100, 32),
    (GenerationDefaults(max_tokens_cap=32), None, 32),
    (GenerationDefaults(max_tokens_cap=32), 5, 5),
])
def test_max_tokens_is_the_requests_else_the_default_at_most_the_cap(defaults, given, expected):
    assert defaults.max_tokens_for(given) == expected


def test_the_flags_default_is_auto_and_both_reach_the_resolved_configuration(tmp_path):
    assert serve("", DENSE).vllm.generation_config == "auto"
    config = serve("""--override-generation-config '{"temperature": 0.5, "max_new_tokens": 7}'""", DENSE)
    assert config.vllm.generation_defaults == GenerationDefaults(temperature=0.5, max_tokens=7, max_tokens_cap=7)
    folder = write_generation_config(tmp_path / "gen", top_p=0.5)
    assert serve(f"--generation-config {folder}", DENSE).vllm.generation_defaults == GenerationDefaults(top_p=0.5)


def test_applied_defaults_are_said_once_at_startup_in_vllms_words(capsys):
    def launcher(config: object) -> int:
        return 0

    cmd = """--override-generation-config '{"temperature": 0.5, "max_new_tokens": 7}'"""
    assert main(["serve", *shlex.split(cmd)], model_facts=lambda _name: DENSE, run_serve=launcher, env={}) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "sampling param" in line]
    assert warned == [
        "asyncdp: warning: Default sampling parameters have been overridden by the model's Hugging Face generation "
        "config recommended from the model creator. If this is not intended, please relaunch with "
        "`--generation-config vllm`. Using default sampling params from model: {'temperature': 0.5, "
        "'max_tokens': 7}, every request's max_tokens at most 7"]
    assert main(["serve"], model_facts=lambda _name: DENSE, run_serve=launcher, env={}) == 0
    assert "sampling param" not in capsys.readouterr().err  # nothing applies: nothing said


@pytest.mark.parametrize(("cmd", "message"), [
    ("--override-generation-config '[1]'", """--override-generation-config must be a JSON object such as """
                                           """'{"temperature": 0.5}' (got '[1]')."""),
    ("--override-generation-config '{'", """--override-generation-config must be a JSON object such as """
                                         """'{"temperature": 0.5}' (got '{')."""),
    ("""--override-generation-config '{"temperature": -1}'""",
     "the sampling defaults of the model's generation_config.json and --override-generation-config are invalid: "
     "temperature must be >= 0 and finite, got -1."),
    ("""--override-generation-config '{"max_new_tokens": 0}'""",
     "the sampling defaults of the model's generation_config.json and --override-generation-config are invalid: "
     "max_tokens must be in [1, 2147483647], got 0."),
    ("--generation-config /no/such/folder", "--generation-config must be auto, vllm or a folder holding "
                                            "generation_config.json (got '/no/such/folder': no such folder)."),
])
def test_a_bad_value_exits_2_naming_what_to_fix(cmd, message):
    assert fails(cmd, DENSE) == message


def test_a_folders_invalid_json_exits_2_naming_the_file(tmp_path):
    (tmp_path / "generation_config.json").write_text("{")
    assert fails(f"--generation-config {tmp_path}", DENSE).startswith(
        f"{tmp_path / 'generation_config.json'}: invalid JSON")


def test_the_defaults_reach_every_api_server(monkeypatch):
    for cfg in api_server_configs(monkeypatch, """--override-generation-config '{"top_k": 3}'"""):
        assert cfg.generation_defaults == GenerationDefaults(top_k=3)
    for cfg in api_server_configs(monkeypatch, ""):  # (these facts carry no generation_config.json)
        assert cfg.generation_defaults == GenerationDefaults()


def test_the_defaults_cross_the_control_channel_into_the_api_servers_config():
    from asyncdp import messages as m
    from asyncdp.apiserver.process import api_config
    from asyncdp.config.flags import EngineConfig
    from asyncdp.config.roles import LaunchPlan, api_server_role

    defaults = GenerationDefaults(temperature=0.5, top_k=3, max_tokens=9, max_tokens_cap=9)
    plan = LaunchPlan(engine=EngineConfig(executor="sim"), served_model_name="m", model_path="/m",
                      deployment=serve("", DENSE).deployment, generation_defaults=defaults)
    role = api_server_role(plan, 0, managed_ranks=(0,), coordinator_client_addr=None, socket_dir=None)
    role = m.decode_control(m.encode(m.WorkerHello(role=role, name="asyncdp-api-0", parent_pid=1))).role
    assert api_config(role).generation_defaults == defaults
