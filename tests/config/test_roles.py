"""Each role's frozen config is derived from the resolved deployment and crosses the control channel intact."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import pytest

from asyncdp import messages as m
from asyncdp.cli import build_serve_config
from asyncdp.config.flags import EngineConfig
from asyncdp.config.roles import LaunchPlan, api_server_role, coordinator_role, engine_role


@dataclass(frozen=True)
class Facts:
    is_moe: bool = True
    num_experts: int = 8


def launch_plan(cmd: str, **fields) -> LaunchPlan:
    config = build_serve_config(shlex.split(cmd), env={}, model_facts=lambda _name: Facts())
    return LaunchPlan(engine=EngineConfig(executor="sim"), served_model_name="m", model_path="/m",
                      deployment=config.deployment, **fields)


@pytest.mark.parametrize("cmd", ["", "-dp 4", "-dp 4 --api-server-count 1", "-dp 4 -dpl 2 -dpr 2 -dph",
                                 "-dp 2 --data-parallel-rank 1"])
def test_every_role_config_round_trips_in_the_worker_hello(cmd):
    plan = launch_plan(cmd)
    roles = [coordinator_role(plan, socket_dir="/run"),
             engine_role(plan, plan.deployment.dp_start_rank, handshake_addr="unix:/hs", torch_threads=2),
             api_server_role(plan, 0, managed_ranks=plan.deployment.managed_ranks, coordinator_client_addr=None,
                             socket_dir="/run", http_shared_port=(None, 8000), node_table_fd=5)]
    for role in roles:
        hello = m.WorkerHello(role=role, name="asyncdp-x", parent_pid=1)
        assert m.decode_control(m.encode(hello)) == hello


def test_role_configs_follow_the_deployment_not_the_dp_size():
    plan = launch_plan("-dp 4 -dpl 2 -dpr 2 -dph", engine_ready_timeout_s=900.0)
    api = api_server_role(plan, 1, managed_ranks=plan.deployment.managed_ranks, coordinator_client_addr="tcp:h:1",
                          socket_dir=None)
    assert (api.mode, api.managed_ranks, api.client_count, api.client_index) == ("hybrid", (2, 3), 2, 1)
    coord = coordinator_role(plan, socket_dir="/run")
    assert (coord.wave_mode, coord.subscribe_timeout_s) == (True, 900.0)


def test_engine_role_keeps_an_explicit_torch_thread_count():
    plan = launch_plan("-dp 2")
    assert engine_role(plan, 1, handshake_addr="unix:/hs", torch_threads=3).engine.torch_threads == 3
    explicit = LaunchPlan(engine=EngineConfig(torch_threads=8), served_model_name="m", model_path="/m",
                          deployment=plan.deployment)
    assert engine_role(explicit, 1, handshake_addr="unix:/hs", torch_threads=3).engine.torch_threads == 8


def test_the_api_servers_get_the_served_names_and_the_cors_policy_from_the_command_line():
    from asyncdp.api.cors import Cors
    from asyncdp.apiserver.process import api_config
    from asyncdp.launcher.launch_plan import plan_from_config

    config = build_serve_config(shlex.split(
        "builtin:tiny-dense -dp 2 --served-model-name main alias --allowed-origins '[\"https://app.example\"]' "
        "--allowed-methods '[\"POST\"]' --allow-credentials"), env={})
    plan = plan_from_config(config)
    role = api_server_role(plan, 0, managed_ranks=plan.deployment.managed_ranks, coordinator_client_addr=None,
                           socket_dir="/run")
    role = m.decode_control(m.encode(m.WorkerHello(role=role, name="asyncdp-api-0", parent_pid=1))).role
    cfg = api_config(role)
    assert (cfg.client.model_name, cfg.model_aliases) == ("main", ("alias",))
    assert cfg.cors == Cors(origins=("https://app.example",), methods=("POST",), headers=("*",), credentials=True)


@pytest.mark.parametrize("value", ["*", "[]", '[""]', '{"a": 1}', "[1]", "[oops"])
def test_a_cors_flag_that_is_not_a_json_list_of_strings_is_a_config_error_naming_it(value):
    from asyncdp.errors import ConfigError

    with pytest.raises(ConfigError, match="--allowed-headers must be a JSON list"):
        build_serve_config(["--allowed-headers", value], env={}, model_facts=lambda _name: Facts())


@pytest.mark.parametrize(("cmd", "is_moe", "can_return"), [
    ("-dp 2", False, False),  # one node: nothing restarts a lost local rank
    ("-dp 2 -dpl 0", False, True),  # an API-only head: every rank lives on other nodes
    ("-dp 4 -dpl 2", False, True),  # a head with headless nodes beside it
    ("-dp 4 -dpl 2 -dph", False, True),  # hybrid: the coordinator runs on the head
    ("-dp 4 -dpl 2", True, False),  # MoE: a running group takes no member back
])
def test_the_coordinator_serves_on_after_losing_every_rank_only_where_a_restarted_node_can_bring_them_back(
        cmd, is_moe, can_return):
    config = build_serve_config(shlex.split(cmd), env={}, model_facts=lambda _name: Facts(is_moe=is_moe))
    plan = LaunchPlan(engine=EngineConfig(executor="sim"), served_model_name="m", model_path="/m",
                      deployment=config.deployment)
    assert coordinator_role(plan, socket_dir="/run").ranks_can_return is can_return
