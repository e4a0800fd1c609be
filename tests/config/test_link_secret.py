"""The deployment secret from the command line: ``ASYNCDP_DP_SECRET`` or ``--data-parallel-secret-file`` (which
wins); a file that is unreadable, empty, not a file, or that its group or others may access exits 2 with one line
naming the flag; the secret shows in no repr and no error message; every role config carries the plan's secret,
and each role's runtime config takes it from there."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncdp.apiserver.process import api_config
from asyncdp.cli import build_serve_config, main
from asyncdp.config.flags import EngineConfig
from asyncdp.config.roles import LaunchPlan, api_server_role, coordinator_role, engine_role
from asyncdp.engine.rank_process import rank_config

SECRET = "7c1f0e9a4b2d-the-secret"


@dataclass(frozen=True)
class Facts:
    is_moe: bool = False
    num_experts: int = 0


def config(cmd: str, env: dict[str, str] | None = None):
    return build_serve_config(shlex.split(cmd), env=env or {}, model_facts=lambda _name: Facts())


def secret_file(tmp_path: Path, content: bytes, mode: int = 0o600) -> Path:
    path = tmp_path / "dp.secret"
    path.write_bytes(content)
    path.chmod(mode)
    return path


def test_the_secret_comes_from_the_environment_and_the_file_wins(tmp_path):
    assert config("-dp 2").data_parallel_secret is None
    assert config("-dp 2", {"ASYNCDP_DP_SECRET": f"  {SECRET}\n"}).data_parallel_secret == SECRET.encode()
    path = secret_file(tmp_path, b"from-the-file\n")
    got = config(f"-dp 2 --data-parallel-secret-file {path}", {"ASYNCDP_DP_SECRET": SECRET})
    assert got.data_parallel_secret == b"from-the-file"
    assert SECRET not in repr(config("-dp 2", {"ASYNCDP_DP_SECRET": SECRET}))
    assert "from-the-file" not in repr(got)


@pytest.mark.parametrize(("content", "mode", "why"), [
    (b"x" * 32, 0o640, "accessible by its group or others (mode 640)"),
    (b"x" * 32, 0o604, "accessible by its group or others (mode 604)"),
    (b" \n\t", 0o600, "is empty"),
    (b"x" * 32, 0o000, "cannot be read"),
], ids=["group-readable", "world-readable", "empty", "unreadable"])
def test_a_bad_secret_file_exits_2_with_one_line_naming_the_flag(tmp_path, capsys, content, mode, why):
    if mode == 0o000 and os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000")
    path = secret_file(tmp_path, content, mode)
    code = main(["serve", "-dp", "2", "--data-parallel-secret-file", str(path)], model_facts=lambda _n: Facts(),
                run_serve=lambda _c: 0, env={})
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"asyncdp: error: --data-parallel-secret-file '{path}' ") and why in err[0]
    assert "x" * 32 not in err[0]


@pytest.mark.parametrize("where", ["missing", "directory"])
def test_a_secret_file_that_is_no_file_exits_2(tmp_path, capsys, where):
    path = tmp_path / "nothing" if where == "missing" else tmp_path
    code = main(["serve", "--data-parallel-secret-file", str(path)], model_facts=lambda _n: Facts(),
                run_serve=lambda _c: 0, env={})
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1 and "--data-parallel-secret-file" in err[0]


def test_every_role_config_carries_the_plans_secret_and_each_runtime_config_takes_it():
    dep = config("-dp 4 -dpl 2").deployment
    plan = LaunchPlan(engine=EngineConfig(executor="sim"), served_model_name="m", model_path="/m", deployment=dep,
                      link_secret=SECRET.encode())
    coordinator = coordinator_role(plan, socket_dir="/run")
    engine = engine_role(plan, 0, handshake_addr="unix:/hs", torch_threads=1)
    api = api_server_role(plan, 0, managed_ranks=dep.managed_ranks, coordinator_client_addr=None, socket_dir="/run")
    assert coordinator.link_secret == engine.link_secret == api.link_secret == SECRET.encode()
    assert rank_config(engine).link_secret == api_config(api).client.link_secret == SECRET.encode()
    assert SECRET not in repr(plan) and SECRET not in repr(rank_config(engine)) and SECRET not in repr(api_config(api))
