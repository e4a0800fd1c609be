"""The ``asyncdp`` command: exit codes, the one-line error format, --help, and the hand-off to the launcher.

A few cases run ``python -m asyncdp`` as a real subprocess; the rest call :func:`asyncdp.cli.main` with fake model
facts and a fake ``run_serve`` so nothing starts.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncdp.cli import main, normalize_argv
from asyncdp.config.flags import ServeConfig
from asyncdp.errors import ModelNotFoundError

ROOT = Path(__file__).resolve().parents[1]


def run_asyncdp(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ASYNCDP_", "VLLM_"))}
    return subprocess.run([sys.executable, "-m", "asyncdp", *args], cwd=ROOT, env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("args", "env", "message"), [
    (["serve", "-dp", "0"], {}, "--data-parallel-size must be >= 1 (got 0)"),
    (["serve", "--data_parallel_rpc_port", "70000"], {}, "--data-parallel-rpc-port must be in 1..65535"),
    (["serve", "--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
    (["serve", "--dp-heartbeat-timeout-s", "1"], {}, "--dp-heartbeat-timeout-s must be greater than 2 x"),
    (["serve"], {"ASYNCDP_DP_LB_POLICY": "bogus"}, "(got 'bogus')"),
    (["serve", "--max-seqs-per-request", "0"], {}, "--max-seqs-per-request must be in 1..2147483647 (got 0)"),
    (["serve", "--enable-auto-tool-choice"], {}, "--enable-auto-tool-choice requires --tool-call-parser (one of "
                                                 "hermes, llama3_json, llama4_pythonic, mistral, openai, pythonic, "
                                                 "qwen3_coder)"),
    (["serve", "--tool-call-parser", "llama3"], {}, "--tool-call-parser must be one of hermes, llama3_json, "
                                                    "llama4_pythonic, mistral, openai, pythonic, qwen3_coder (got "
                                                    "'llama3')"),
    (["serve", "--reasoning-parser", "olmo3"], {}, "--reasoning-parser must be one of deepseek_r1, "
     "deepseek_v3, ernie45, glm45, granite, holo2, hunyuan_a13b, kimi_k2, minimax_m2, minimax_m2_append_think, "
     "mistral, openai_gptoss, qwen3, seed_oss, step3 (got 'olmo3')"),
])
def test_invalid_command_line_exits_2_with_one_error_line(args, env, message):
    proc = run_asyncdp(*args, env=env)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("asyncdp: error: ")
    assert message in lines[0]
    assert proc.stdout == ""


def test_missing_command_exits_2():
    proc = run_asyncdp()
    assert proc.returncode == 2
    assert proc.stderr.startswith("asyncdp: error: ")


DP_FLAGS = [
    "--data-parallel-size", "-dp", "--data-parallel-size-local", "-dpl", "--data-parallel-rank", "-dpn",
    "--data-parallel-start-rank", "-dpr", "--data-parallel-address", "-dpa", "--data-parallel-rpc-port", "-dpp",
    "--data-parallel-backend", "-dpb", "--data-parallel-hybrid-lb", "-dph", "--data-parallel-external-lb", "-dpe",
    "--data-parallel-multi-port-external-lb", "-dpm", "--enable-expert-parallel", "-ep", "--nnodes", "-n",
    "--node-rank", "-r", "--master-addr", "--master-port", "--prefill-schedule-interval",
    "--cpu-distributed-timeout-seconds", "--disable-nccl-for-dp-synchronization", "--device-ids",
    "--headless", "--api-server-count", "-asc", "--shutdown-timeout", "--ssl-keyfile", "--ssl-certfile",
    "--data-parallel-supervisor-port", "--dp-supervisor-probe-interval-s", "--dp-supervisor-probe-timeout-s",
    "--dp-supervisor-probe-failure-threshold", "--dp-lb-policy", "--lb-policy", "--dp-sync-interval",
    "--dp-coordinator-startup-timeout-s", "--engine-ready-timeout-s", "--dp-heartbeat-interval-s",
    "--dp-heartbeat-timeout-s", "--dp-fail-fast", "--no-data-parallel-hybrid-lb", "--max-queued-requests",
    "--backend", "--no-enable-prefix-caching", "--executor", "--sim-cost",
]


def test_serve_help_lists_every_dp_flag_and_documents_hybrid_rank_hints():
    proc = run_asyncdp("serve", "--help")
    assert proc.returncode == 0, proc.stderr
    missing = [flag for flag in DP_FLAGS if flag not in proc.stdout]
    assert missing == []
    assert "local indices in [0, L)" in " ".join(proc.stdout.split())
    assert "request timeout" in proc.stdout  # §2.3: the probe timeout is a request timeout, not a retry delay


def test_version_exits_0():
    proc = run_asyncdp("--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("asyncdp ")


def test_normalize_argv_rewrites_flag_names_only():
    assert normalize_argv(["--data_parallel_size=2", "--served-model-name", "a_b", "-dp", "--", "--x_y"]) == [
        "--data-parallel-size=2", "--served-model-name", "a_b", "-dp", "--", "--x_y"]


# ---------------------------------------------------------------- main() with fakes


@dataclass(frozen=True)
class Facts:
    is_moe: bool
    num_experts: int


class FakeLauncher:
    def __init__(self, exit_code: int = 0) -> None:
        self.exit_code = exit_code
        self.configs: list[ServeConfig] = []

    def __call__(self, config: ServeConfig) -> int:
        self.configs.append(config)
        return self.exit_code


def moe_facts(_name: str) -> Facts:
    return Facts(is_moe=True, num_experts=8)


def test_supported_mode_hands_the_resolved_config_to_the_launcher_and_returns_its_code():
    launcher = FakeLauncher(exit_code=1)
    code = main(["serve", "my-model", "-dp", "2", "--port", "0"], model_facts=moe_facts, run_serve=launcher, env={})
    assert code == 1
    (config,) = launcher.configs
    assert (config.model, config.port, config.deployment.mode, config.deployment.dp_size) == ("my-model", 0,
                                                                                             "internal", 2)


def test_dense_model_with_dp_runs_internal_mode():
    launcher = FakeLauncher()
    assert main(["serve", "-dp", "2"], model_facts=lambda _n: Facts(False, 0), run_serve=launcher, env={}) == 0
    assert launcher.configs[0].deployment.is_moe is False


@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "pythonic"])
def test_every_tool_call_parser_reaches_the_launcher(parser, capsys):
    launcher = FakeLauncher()
    argv = ["serve", "--enable-auto-tool-choice", "--tool-call-parser", parser]
    assert main(argv, model_facts=lambda _n: Facts(False, 0), run_serve=launcher, env={}) == 0
    assert [(c.enable_auto_tool_choice, c.tool_call_parser) for c in launcher.configs] == [(True, parser)]
    assert "error" not in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "mode"), [
    (["-dp", "4", "-dpl", "2", "-dpr", "2", "--headless"], "headless"),
    (["-dp", "4", "-dpl", "2", "-dpr", "0"], "hybrid"),
    (["-dp", "4", "-dpl", "2", "--data-parallel-hybrid-lb"], "hybrid"),
    (["-dp", "2", "--data-parallel-rank", "1"], "external"),
    (["-dp", "4", "-dpl", "2", "-dpm"], "multi-port"),
    (["-dp", "4", "--nnodes", "2"], "internal"),
    (["-dp", "4", "-dpl", "2"], "internal"),
    (["-dp", "4", "-dpl", "0"], "internal"),
])
def test_every_data_parallel_mode_reaches_the_launcher(argv, mode, capsys):
    launcher = FakeLauncher()
    assert main(["serve", *argv], model_facts=moe_facts, run_serve=launcher, env={}) == 0
    assert [c.deployment.mode for c in launcher.configs] == [mode]
    assert "error" not in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "what"), [
    (["--uds", "/tmp/x.sock"], "--uds"),
    (["-dp", "2", "-tp", "2"], "tensor parallelism"),
    (["-pp", "2"], "pipeline parallelism"),
])
def test_valid_but_unbuilt_mode_exits_2_before_the_launcher(argv, what, capsys):
    launcher = FakeLauncher()
    assert main(["serve", *argv], model_facts=moe_facts, run_serve=launcher, env={}) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("asyncdp: error: ") and what in err[-1]
    assert "is not supported in this build yet; " in err[-1]  # ... followed by what to change
    assert launcher.configs == []


@pytest.mark.parametrize(("argv", "message"), [
    (["-pp", "2"],
     "pipeline parallelism (--pipeline-parallel-size 2) is not supported in this build yet; each data-parallel "
     "rank runs on one device: drop --pipeline-parallel-size"),
])
def test_unbuilt_mode_message_says_what_to_change_and_names_only_flags_that_were_passed(argv, message, capsys):
    assert main(["serve", *argv], model_facts=moe_facts, run_serve=FakeLauncher(), env={}) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"asyncdp: error: {message}"


def test_dense_model_with_external_lb_flags_exits_2_saying_to_run_independent_servers(capsys):
    launcher = FakeLauncher()
    assert main(["serve", "-dp", "2", "--data-parallel-rank", "1"], model_facts=lambda _n: Facts(False, 0),
                run_serve=launcher, env={}) == 2
    assert "launch independent asyncdp instances" in capsys.readouterr().err
    assert launcher.configs == []


def test_invalid_unbuilt_mode_reports_the_validation_error_not_the_unsupported_one(capsys):
    assert main(["serve", "-dp", "4", "-dpl", "2", "-dpr", "3"], model_facts=moe_facts, run_serve=FakeLauncher(),
                env={}) == 2
    assert "exceeds --data-parallel-size 4" in capsys.readouterr().err


def test_ray_backend_exits_2_with_v22(capsys):
    assert main(["serve", "-dp", "2", "-dpb", "ray"], model_facts=moe_facts, run_serve=FakeLauncher(), env={}) == 2
    assert "asyncdp: error: --data-parallel-backend ray is not available in this build; use mp." in (
        capsys.readouterr().err)


def test_unknown_model_exits_2(capsys):
    def missing(name: str) -> Facts:
        raise ModelNotFoundError(f"model {name!r} is neither a built-in name nor a checkpoint directory.")

    assert main(["serve", "nope"], model_facts=missing, run_serve=FakeLauncher(), env={}) == 2
    assert capsys.readouterr().err == "asyncdp: error: model 'nope' is neither a built-in name nor a checkpoint " \
                                      "directory.\n"


@pytest.mark.parametrize("kind", ["missing", "empty_dir", "unknown_builtin", "tokenizer_dir", "builtin"])
def test_a_tokenizer_that_is_not_there_exits_2_before_anything_starts(kind, tmp_path, capsys):
    # cli.md: exit 2, one line, nothing started. A --tokenizer path without a tokenizer started the engines and
    # then failed every API server with a 100-line traceback and exit 1.
    if kind == "tokenizer_dir":
        (tmp_path / "tokenizer.json").write_text("{}")
    tokenizer = {"missing": str(tmp_path / "nope"), "empty_dir": str(tmp_path), "unknown_builtin": "builtin:nope",
                 "tokenizer_dir": str(tmp_path), "builtin": "builtin:tiny-dense"}[kind]
    launcher = FakeLauncher()
    code = main(["serve", "--tokenizer", tokenizer], model_facts=moe_facts, run_serve=launcher, env={})
    if kind in ("tokenizer_dir", "builtin"):
        assert code == 0 and len(launcher.configs) == 1
        return
    err = capsys.readouterr().err
    assert code == 2 and not launcher.configs
    assert err.startswith("asyncdp: error: ") and err.count("\n") == 1 and tokenizer in err, err


@pytest.mark.parametrize("kind", ["missing_key", "key_is_the_certificate", "a_good_pair"])
def test_tls_files_that_do_not_load_exit_2_before_anything_starts(kind, tmp_path, capsys):
    # Missing or mismatched --ssl-* files started the engines, then failed the API server with a traceback,
    # "startup failed: [Errno 2] No such file or directory" (naming neither file nor flag) and exit 1.
    from tests.supervisor.conftest import _self_signed

    cert, key = _self_signed(tmp_path)
    key = {"missing_key": str(tmp_path / "nope.pem"), "key_is_the_certificate": cert, "a_good_pair": key}[kind]
    launcher = FakeLauncher()
    code = main(["serve", "--ssl-certfile", cert, "--ssl-keyfile", key], model_facts=moe_facts, run_serve=launcher,
                env={})
    if kind == "a_good_pair":
        assert code == 0 and len(launcher.configs) == 1
        return
    err = capsys.readouterr().err
    assert code == 2 and not launcher.configs
    assert err.startswith("asyncdp: error: --ssl-") and err.count("\n") == 1 and key in err, err


def test_auto_switch_warning_is_printed_before_the_external_rank_starts(capsys):
    launcher = FakeLauncher()
    assert main(["serve", "-dp", "4", "-dpl", "1", "-dpr", "3"], model_facts=moe_facts, run_serve=launcher,
                env={}) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("asyncdp: warning: hybrid LB with one local rank is external LB")
    assert [(c.deployment.mode, c.deployment.dp_start_rank) for c in launcher.configs] == [("external", 3)]


def test_resolved_config_survives_pickling_for_spawned_children():
    launcher = FakeLauncher()
    main(["serve", "-dp", "2", "--device-ids", "0,1"], model_facts=moe_facts, run_serve=launcher, env={})
    config = launcher.configs[0]
    assert pickle.loads(pickle.dumps(config)) == config


class FakeModelPackage(types.ModuleType):
    """Stands in for ``asyncdp.model``: records exports, lists two names."""

    def __init__(self) -> None:
        super().__init__("asyncdp.model")
        self.exported: list[tuple[str, Path]] = []

    def export_builtin(self, name: str, directory: Path) -> Path:
        self.exported.append((name, directory))
        return directory

    def builtin_names(self) -> list[str]:  # the real package's spelling
        return ["builtin:tiny-dense", "builtin:tiny-moe"]


def test_model_export_and_list_call_the_model_package(monkeypatch, capsys, tmp_path):
    fake = FakeModelPackage()
    monkeypatch.setitem(sys.modules, "asyncdp.model", fake)
    assert main(["model", "export", "builtin:tiny-moe", str(tmp_path / "out")]) == 0
    assert fake.exported == [("builtin:tiny-moe", tmp_path / "out")]
    assert main(["model", "list"]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["builtin:tiny-dense", "builtin:tiny-moe"]


def test_model_export_of_unknown_name_exits_2(monkeypatch, capsys, tmp_path):
    fake = FakeModelPackage()

    def refuse(name: str, directory: Path) -> Path:
        raise ModelNotFoundError(f"unknown built-in model {name!r}.")

    fake.export_builtin = refuse  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "asyncdp.model", fake)
    assert main(["model", "export", "nope", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "asyncdp: error: unknown built-in model 'nope'.\n"


def test_model_list_prints_every_builtin_name_with_its_prefix(capsys):
    assert main(["model", "list"]) == 0
    assert capsys.readouterr().out.split() == ["builtin:smollm2-135m", "builtin:tiny-dense", "builtin:tiny-moe"]


def test_model_export_prints_the_directory_and_unknown_name_exits_2(tmp_path, capsys):
    assert main(["model", "export", "tiny-dense", str(tmp_path / "d")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "d")
    assert (tmp_path / "d" / "config.json").is_file()
    assert main(["model", "export", "nope", str(tmp_path / "e")]) == 2
    assert "unknown built-in model 'nope'" in capsys.readouterr().err


def test_model_export_into_a_folder_that_cannot_be_made_is_one_line_and_exit_1(tmp_path, capsys):
    # It was a FileExistsError/NotADirectoryError traceback.
    (tmp_path / "file").write_text("")
    assert main(["model", "export", "tiny-dense", str(tmp_path / "file" / "d")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"asyncdp: error: cannot write the checkpoint into {tmp_path / 'file' / 'd'}: ") \
        and err.count("\n") == 1, err


# ---------------------------------------------------------------- engine flags the model cannot take (spec §4.1)


@pytest.mark.parametrize(("flags", "message"), [
    (["--max-model-len", "100000"], "--max-model-len 100000 exceeds the model's max_position_embeddings (2048)"),
    (["--kv-cache-memory-bytes", "-5"], "--kv-cache-memory-bytes must be >= 1 (got -5)"),
    (["--kv-cache-memory-bytes", "100"], "--kv-cache-memory-bytes 100 holds fewer than 2 KV blocks (16384 bytes each)"),
    (["--num-kv-blocks", "3", "--max-model-len", "512"], "--max-model-len 512 does not fit in the KV cache (3 blocks"),
    (["--executor", "sim", "--max-model-len", "4096"], "exceeds the model's max_position_embeddings (2048)"),
])
def test_engine_flags_the_model_cannot_take_exit_2_before_the_launcher(flags, message, capsys):
    launcher = FakeLauncher()
    assert main(["serve", "builtin:tiny-dense", *flags], run_serve=launcher, env={}) == 2
    assert launcher.configs == []
    err = capsys.readouterr().err
    assert err.startswith("asyncdp: error: ") and err.count("\n") == 1, err
    assert message in err


def test_a_checkpoint_directory_is_checked_against_its_own_config_json(tmp_path, capsys):
    assert main(["model", "export", "tiny-moe", str(tmp_path / "m")]) == 0
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 300}))
    launcher = FakeLauncher()
    assert main(["serve", str(tmp_path / "m"), "--max-model-len", "301"], run_serve=launcher, env={}) == 2
    assert "--max-model-len 301 exceeds the model's max_position_embeddings (300)" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "m"), "--max-model-len", "300"], run_serve=launcher, env={}) == 0
    assert launcher.configs[0].engine.max_model_len == 300


def test_max_model_len_beyond_the_model_exits_2_with_one_line_and_starts_nothing():
    proc = run_asyncdp("serve", "builtin:tiny-dense", "--max-model-len", "100000", "--host", "127.0.0.1",
                       "--port", "0")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == ["asyncdp: error: --max-model-len 100000 exceeds the model's "
                                        "max_position_embeddings (2048); lower --max-model-len."]


def test_serve_help_describes_what_the_parser_accepts_for_sim_cost_and_node_rank():
    text = " ".join(run_asyncdp("serve", "--help").stdout.split())
    assert "--sim-cost A,B,C,D[,E]" in text and "e*sum of p*(c0 + p/2)" in text  # five terms parse, not four
    # --node-rank is bounded by --nnodes only when --nnodes > 1: a multi-port node of one launch picks its ranks
    # with it (spec §3.5: -dp 8 -dpl 4 --node-rank 1 -dpm serves ranks 4..7)
    assert "index of this node in [0, nnodes)" not in text
    assert "< --nnodes when --nnodes > 1" in text
