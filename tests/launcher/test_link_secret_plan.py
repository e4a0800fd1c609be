"""Which secret a launch's links use (``with_link_secret``): the operator's when given; a fresh one drawn for a
deployment whose links all stay on this node; none, with a startup warning that says how to set one, for a
deployment that spans launches (a multi-port supervisor's child leaves the warning to its supervisor). And a
child process's environment never holds the secret's variable."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import pytest

from asyncdp.cli import build_serve_config
from asyncdp.config.flags import EngineConfig
from asyncdp.config.roles import LaunchPlan
from asyncdp.launcher.launch_plan import with_link_secret
from asyncdp.transport.control import _child_env


@dataclass(frozen=True)
class Facts:
    is_moe: bool = True
    num_experts: int = 8


def plan(cmd: str, **fields) -> LaunchPlan:
    dep = build_serve_config(shlex.split(cmd), env={}, model_facts=lambda _name: Facts()).deployment
    return LaunchPlan(engine=EngineConfig(executor="sim"), served_model_name="m", model_path="/m", deployment=dep,
                      **fields)


@pytest.mark.parametrize("cmd", ["", "-dp 2", "-dp 4 --api-server-count 2"])
def test_a_deployment_on_one_node_draws_a_fresh_secret_of_its_own(cmd):
    first, warning = with_link_secret(plan(cmd))
    second, _ = with_link_secret(plan(cmd))
    assert warning is None
    assert first.link_secret is not None and len(first.link_secret) == 32
    assert first.link_secret != second.link_secret


@pytest.mark.parametrize("cmd", ["-dp 4 -dpl 2 -dpa 10.0.0.1", "-dp 4 -dpl 2 -dpr 2 --headless -dpa 10.0.0.1",
                                 "-dp 2 -dpl 0 -dpa 10.0.0.1", "-dp 4 -dpl 2 -dpr 2 -dph -dpa 10.0.0.1",
                                 "-dp 2 --data-parallel-rank 1 -dpa 10.0.0.1"])
def test_a_deployment_across_launches_without_a_secret_runs_unauthenticated_with_a_warning(cmd):
    got, warning = with_link_secret(plan(cmd))
    assert got.link_secret is None
    assert warning is not None and "not authenticated" in warning and "10.0.0.1" in warning
    assert "ASYNCDP_DP_SECRET" in warning and "--data-parallel-secret-file" in warning


def test_the_operators_secret_wins_and_a_supervised_child_leaves_the_warning_to_its_supervisor():
    given, warning = with_link_secret(plan("-dp 4 -dpl 2", link_secret=b"operator"))
    assert (given.link_secret, warning) == (b"operator", None)
    child, warning = with_link_secret(plan("-dp 2 --data-parallel-rank 1", supervised_rank=1))
    assert (child.link_secret, warning) == (None, None)


def test_a_childs_environment_never_holds_the_secret(monkeypatch):
    monkeypatch.setenv("ASYNCDP_DP_SECRET", "not for children")
    env = _child_env({"EXTRA": "1"})
    assert "ASYNCDP_DP_SECRET" not in env and env["EXTRA"] == "1"
