"""Mode derivation (spec §3), validation (§4.1) and flag handling (§2), driven by real command lines.

The model's facts are injected (no model package needed) and the environment is an explicit mapping.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import pytest

from asyncdp.cli import build_serve_config
from asyncdp.config.deployment import DeploymentConfig, _pass2, resolve
from asyncdp.config.flags import LB_POLICIES, ServeConfig, SimCostProfile
from asyncdp.errors import ConfigError


@dataclass(frozen=True)
class Facts:
    is_moe: bool = True
    num_experts: int = 8


MOE, DENSE = Facts(True, 8), Facts(False, 0)


def serve(cmd: str, facts: Facts = MOE, env: dict[str, str] | None = None) -> ServeConfig:
    return build_serve_config(shlex.split(cmd), env=env or {}, model_facts=lambda _name: facts)


def deploy(cmd: str, facts: Facts = MOE, env: dict[str, str] | None = None) -> DeploymentConfig:
    d = serve(cmd, facts, env).deployment
    assert d is not None
    return d


def fails(cmd: str, facts: Facts = MOE, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        serve(cmd, facts, env)
    return str(info.value)


# ---------------------------------------------------------------- §3.5 test vectors

TABLE = [
    # command line, mode, rank, local, API servers, coordinator here
    ("-dp 4", "internal", 0, 4, 4, True),
    ("-dp 4 --api-server-count 1", "internal", 0, 4, 1, True),
    ("-dp 4 -dpl 2 -dpa H -dpp 13345", "internal", 0, 2, 4, True),
    ("--headless -dp 4 -dpl 2 -dpr 2 -dpa H -dpp 13345", "headless", 2, 2, 0, False),
    ("-dp 4 -dpl 0", "internal", 0, 0, 4, True),
    ("-dp 4 -dpl 2 -dpr 0", "hybrid", 0, 2, 2, True),
    ("-dp 4 -dpl 2 -dpr 2 --data-parallel-hybrid-lb", "hybrid", 2, 2, 2, False),
    ("-dp 4 -dpl 4 -dpr 0", "internal", 0, 4, 4, True),
    ("-dp 4 -dpl 1 -dpr 3", "external", 3, 1, 1, False),
    ("-dp 2 --data-parallel-rank 1", "external", 1, 1, 1, False),
    ("-dp 2 --data-parallel-rank 0 --api-server-count 4", "external", 0, 1, 4, True),
    ("-dp 4 --nnodes 2 --node-rank 0", "internal", 0, 2, 4, True),
    ("--headless -dp 4 --nnodes 2 --node-rank 1", "headless", 2, 2, 0, False),
]


@pytest.mark.parametrize(("cmd", "mode", "rank", "local", "api_servers", "coordinator"), TABLE)
def test_derivation_vector_gives_mode_ranks_servers_and_coordinator(cmd, mode, rank, local, api_servers,
                                                                    coordinator):
    d = deploy(cmd)
    assert (d.mode, d.dp_start_rank, d.dp_size_local, d.api_server_count, d.coordinator_here) == (
        mode, rank, local, api_servers, coordinator)


def test_multi_port_vector_spawns_children_for_ranks_4_to_7_on_consecutive_ports():
    d = deploy("-dp 8 -dpl 4 --node-rank 1 -dpm --port 8000")
    assert (d.mode, d.dp_start_rank, d.api_server_count, d.coordinator_here) == ("multi-port", 4, 1, False)
    children = [(c.port, c.deployment.mode, c.deployment.dp_rank, c.deployment.api_server_count)
                for c in d.children]
    assert children == [(8000 + i, "external", 4 + i, 1) for i in range(4)]


@pytest.mark.parametrize(("cmd", "facts", "rule"), [
    ("-dp 4 --nnodes 2 --node-rank 1", MOE, "only the head (rank 0) runs API servers"),  # V25
    ("-dp 2 --data-parallel-rank 1", DENSE, "non-MoE models do not support external"),  # V9
    ("-dp 4 -dpl 1 -dpr 1", DENSE, "(hybrid LB with --data-parallel-size-local 1 is external LB)"),  # V9b
    ("-dp 4 -dpl 2 -dpr 3", MOE, "--data-parallel-start-rank 3 plus --data-parallel-size-local 2 exceeds"),  # V17
])
def test_derivation_vector_rejected(cmd, facts, rule):
    assert rule in fails(cmd, facts)


def test_internal_head_uses_given_address_and_rpc_port():
    d = deploy("-dp 4 -dpl 2 -dpa H -dpp 13345")
    assert (d.data_parallel_address, d.data_parallel_rpc_port) == ("H", 13345)


def test_address_falls_back_to_master_addr_then_loopback():
    assert deploy("-dp 2 --master-addr 10.1.2.3").data_parallel_address == "10.1.2.3"
    d = deploy("-dp 2")
    assert (d.data_parallel_address, d.data_parallel_rpc_port) == ("127.0.0.1", 29550)


@pytest.mark.parametrize(("cmd", "managed"), [
    ("-dp 4", (0, 1, 2, 3)),
    ("-dp 4 -dpl 2 -dpr 2 -dph", (2, 3)),
    ("-dp 2 --data-parallel-rank 1", (1,)),
    ("", (0,)),
    ("--headless -dp 4 -dpl 2 -dpr 2", ()),
])
def test_managed_ranks_follow_the_mode(cmd, managed):
    assert deploy(cmd).managed_ranks == managed


def test_single_mode_without_dp_flags():
    d = deploy("")
    assert (d.mode, d.dp_size, d.api_server_count, d.coordinator_here, d.local_ranks) == ("single", 1, 1, False, (0,))


def test_dense_internal_dp_is_accepted_with_coordinator_for_stats_only():
    d = deploy("-dp 2", DENSE)
    assert (d.mode, d.coordinator_here, d.waves) == ("internal", True, False)


def test_hybrid_with_one_local_rank_switches_to_external_with_a_warning():
    d = deploy("-dp 4 -dpl 1 -dpr 3")
    assert d.external and not d.hybrid
    assert any("switching to external" in w for w in d.warnings)


def test_api_server_count_zero_means_headless():
    d = deploy("-dp 4 -dpl 2 -dpr 2 --api-server-count 0")
    assert (d.mode, d.headless, d.api_server_count) == ("headless", True, 0)


# ---------------------------------------------------------------- §4.1 validation rules

RULES = [
    ("V1", "--headless --api-server-count 2 -dp 2 -dpl 2", MOE,
     "--api-server-count=2 cannot be used with --headless"),
    ("V2", "-dp 4 --data-parallel-rank 1 -dpr 0", MOE, "choose one data-parallel load-balancing mode"),
    ("V2", "-dp 4 -dpl 2 -dpe -dph", MOE, "choose one data-parallel load-balancing mode"),
    ("V3", "--headless -dph -dp 4 -dpl 2", MOE, "--data-parallel-hybrid-lb cannot be used with --headless"),
    ("V5", "-dp 4 --nnodes 2 -dpb ray", MOE, "--nnodes 2 requires --data-parallel-backend mp (got ray)"),
    ("V6", "-dp 3 --nnodes 2", MOE, "--nnodes 2 must evenly divide the total world size 3"),
    ("V7", "-dp 4 --nnodes 2 --node-rank 2", MOE, "--node-rank must be between 0 and 1 (got 2)"),
    ("V8", "-dp 4 --nnodes 2 --node-rank 1 -dpe --data-parallel-rank 3", MOE,
     "--data-parallel-rank 3 conflicts with rank 2 inferred from --node-rank/--nnodes"),
    ("V9", "-dp 2 --data-parallel-rank 1", DENSE, "non-MoE models do not support external data-parallel mode"),
    ("V9", "-dp 2 -dpe", DENSE, "non-MoE models do not support external data-parallel mode"),
    ("V9b", "-dp 4 -dpl 1 -dpr 1", DENSE, "non-MoE models do not support external data-parallel mode; launch "
                                         "independent asyncdp instances without --data-parallel-* flags. "
                                         "(hybrid LB with --data-parallel-size-local 1 is external LB)"),
    ("V10", "-dp 2 -dpe", MOE, "--data-parallel-external-lb requires a rank: set --data-parallel-rank"),
    ("V11", "-dp 4 --data-parallel-rank 1 -dpl 2", MOE,
     "an external data-parallel rank requires --data-parallel-size-local 1 (got 2)"),
    ("V12", "-dp 4 -dph", MOE, "--data-parallel-hybrid-lb requires --data-parallel-size-local"),
    ("V14", "-dp 2 -dpl 3", MOE, "--data-parallel-size-local (3) must be <= --data-parallel-size (2)"),
    ("V15", "--data-parallel-rank 0", MOE, "external data-parallel mode requires --data-parallel-size > 1"),
    ("V16", "-dp 2 --data-parallel-rank 2", MOE, "data-parallel rank 2 must be in the range [0, 2)"),
    ("V16", "-dp 2 -dpl 0 -dpr 2", MOE, "data-parallel rank 2 must be in the range [0, 2)"),
    ("V17", "-dp 4 -dpl 2 -dpr 3", MOE,
     "--data-parallel-start-rank 3 plus --data-parallel-size-local 2 exceeds --data-parallel-size 4"),
    ("V18", "-dp 4 -dpr 2", MOE, "--data-parallel-start-rank 2 requires --data-parallel-size-local"),
    ("V19", "--headless -dp 4 -dpl 0", MOE, "--data-parallel-size-local must be > 0 on a headless node"),
    ("V20", "--headless -dp 2 -dpe", MOE, "--headless cannot be combined with external LB"),
    ("V20", "--headless -dp 2 --data-parallel-rank 1", MOE, "--headless cannot be combined with external LB"),
    ("V21", "-dp 2 -tp 4 --nnodes 4", MOE, "a data-parallel rank would span nodes (tp*pp=4 > 8/4)"),
    ("V22", "-dp 2 -dpb ray", MOE, "--data-parallel-backend ray is not available in this build; use mp"),
    ("V23", "-dp 4 -tp 1 -ep", Facts(True, 2), "expert-parallel size (dp*tp = 4) exceeds the number of experts (2)"),
    ("V25", "-dp 4 --nnodes 2 --node-rank 1", MOE, "this node owns ranks 2..3 but only the head (rank 0)"),
    ("M1", "-dp 4 -dpl 2 -dpm --uds /tmp/a.sock", MOE,
     "--data-parallel-multi-port-external-lb does not support --uds"),
    ("M2", "-dp 4 -dpl 2 -dpm --ssl-keyfile k.pem", MOE, "--ssl-keyfile and --ssl-certfile must be provided together"),
    ("M3", "-dp 4 -dpl 2 -dpm --api-server-count 2", MOE,
     "--data-parallel-multi-port-external-lb requires --api-server-count=1"),
    ("M3", "-dp 4 -dpl 2 -dpm --headless", MOE, "--data-parallel-multi-port-external-lb requires --api-server-count=1"),
    ("M3", "-dp 4 -dpl 2 -dpm -asc 0", MOE, "--data-parallel-multi-port-external-lb requires --api-server-count=1"),
    ("M4", "-dp 4 -dpl 2 -dpm --data-parallel-rank 1", MOE,
     "--data-parallel-multi-port-external-lb manages child --data-parallel-rank values itself"),
    ("M5", "-dp 4 -dpl 2 -dpm -dph", MOE, "cannot be combined with --data-parallel-external-lb or "
                                          "--data-parallel-hybrid-lb"),
    ("M5", "-dp 4 -dpl 2 -dpm -dpe", MOE, "cannot be combined with --data-parallel-external-lb or "
                                          "--data-parallel-hybrid-lb"),
    ("M6", "-dp 1 -dpl 2 -dpm", MOE, "--data-parallel-multi-port-external-lb requires --data-parallel-size > 1"),
    ("M7", "-dp 4 -dpm", MOE, "requires --data-parallel-size-local >= 2 (got None)"),
    ("M7", "-dp 4 -dpl 1 -dpm", MOE, "requires --data-parallel-size-local >= 2 (got 1)"),
    ("M8", "-dp 4 -dpl 8 -dpm", MOE, "--data-parallel-size-local cannot exceed --data-parallel-size"),
    ("M9", "-dp 6 -dpl 4 -dpm", MOE, "--data-parallel-size must be divisible by --data-parallel-size-local"),
    ("M10", "-dp 8 -dpl 4 -dpr 6 -dpm", MOE, "multi-port supervised ranks 6..9 would exceed --data-parallel-size 8"),
    ("M10", "-dp 8 -dpl 4 --node-rank 2 -dpm", MOE, "multi-port supervised ranks 8..11 would exceed"),
    ("M11", "-dp 4 -dpl 2 -dpm --port 9255", MOE,
     "--data-parallel-supervisor-port 9256 overlaps with child rank ports 9255-9256"),
    ("M12", "-dp 4 -dpl 2 -dpm --port 65535 --data-parallel-supervisor-port 9000", MOE,
     "child ports 65535-65536 exceed 65535"),
    ("M13", "-dp 4 -dpl 2 -dpm -tp 2 --device-ids 0,1,2", MOE, "--device-ids lists 3 devices; 2 ranks x tp*pp need 4"),
    ("M13", "-dp 2 -tp 2 --device-ids 0,1,2", MOE, "--device-ids lists 3 devices; 2 ranks x tp*pp need 4"),
    ("M14", "-dp 4 -dpl 2 -dpm", DENSE, "non-MoE models do not support external data-parallel mode"),
    ("M12", "-dp 4 -dpl 2 -dpm --port 0", MOE, "serves local rank i on --port + i: give a fixed --port, not 0"),
    ("engine", "--num-kv-blocks 1", DENSE, "--num-kv-blocks must be >= 2 (block 0 is the engine's scratch block)"),
]


@pytest.mark.parametrize(("rule", "cmd", "facts", "message"), RULES, ids=[f"{r[0]}-{i}" for i, r in enumerate(RULES)])
def test_invalid_command_line_is_rejected_with_the_rule_message(rule, cmd, facts, message):
    assert message in fails(cmd, facts)


def test_v4_hybrid_and_external_flags_together_fail_in_pass_2():
    # Pass 1 already rejects this command line with V2; pass 2 keeps its own check for direct callers.
    assert "choose one" in fails("-dp 4 -dpl 2 -dpe -dph")
    config = ServeConfig(data_parallel_size=4, data_parallel_size_local=2, data_parallel_hybrid_lb=True,
                         data_parallel_external_lb=True)
    with pytest.raises(ConfigError, match="--data-parallel-hybrid-lb and --data-parallel-external-lb cannot be"):
        _pass2(config, False, is_moe=True, env={})


def test_v24_expert_parallel_on_dense_model_is_a_warning_and_ignored():
    d = deploy("-dp 2 -ep", DENSE)
    assert not d.enable_expert_parallel
    assert "--enable-expert-parallel ignored: model has no experts." in d.warnings


def test_expert_parallel_within_the_expert_count_is_enabled():
    assert deploy("-dp 4 -ep", Facts(True, 4)).enable_expert_parallel


V13 = [
    ("-dpb foo", "--data-parallel-backend must be one of mp, ray (got 'foo')"),
    ("-dp 0", "--data-parallel-size must be >= 1 (got 0)"),
    ("-dpl -1", "--data-parallel-size-local must be >= 0 (got -1)"),
    ("--data-parallel-rank -1", "--data-parallel-rank must be >= 0 (got -1)"),
    ("-dpr -1", "--data-parallel-start-rank must be >= 0 (got -1)"),
    ("-dpp 0", "--data-parallel-rpc-port must be in 1..65535 (got 0)"),
    ("-dpp 65536", "--data-parallel-rpc-port must be in 1..65535 (got 65536)"),
    ("--shutdown-timeout -1", "--shutdown-timeout must be >= 0 (got -1)"),
    ("--prefill-schedule-interval 0", "--prefill-schedule-interval must be >= 1 (got 0)"),
    ("--dp-sync-interval 0", "--dp-sync-interval must be >= 1 (got 0)"),
    ("--dp-heartbeat-interval-s 2 --dp-heartbeat-timeout-s 4",
     "--dp-heartbeat-timeout-s must be greater than 2 x --dp-heartbeat-interval-s"),
    ("--lb-policy nope", "one of vllm, vllm_legacy, round_robin, random, power_of_two, sglang_cache_aware, "
                         "llmd_weighted, dynamo_kv, aibrix_prefix, session_hash, vllm_token, smg_least_load, "
                         "smg_prefix_hash, prodstack_prefixaware, prodstack_loadaware, ray_prefix, asyncdp (got 'nope')"),
    ("--backend curio", "--backend must be one of asyncio, trio (got 'curio')"),
    ("--api-server-count -1", "--api-server-count must be >= 0 (got -1)"),
    ("--max-queued-requests 0", "--max-queued-requests must be >= 1 (got 0)"),
    ("--executor gpu", "--executor must be one of torch, sim (got 'gpu')"),
    ("--sim-cost 1,2,3", "--sim-cost must be four or five non-negative numbers"),
    ("--device-ids 0,x", "--device-ids must be integers"),
    ("-dp x", "argument --data-parallel-size/-dp: invalid int value: 'x'"),
    ("--no-such-flag", "unrecognized arguments: --no-such-flag"),
]


@pytest.mark.parametrize(("cmd", "message"), V13)
def test_out_of_range_flag_names_flag_value_and_range(cmd, message):
    assert message in fails(cmd)


def test_heartbeat_timeout_just_above_twice_the_interval_is_accepted():
    assert serve("--dp-heartbeat-interval-s 2 --dp-heartbeat-timeout-s 4.5").dp_heartbeat_timeout_s == 4.5


# ---------------------------------------------------------------- §2 spellings, --no- flags, env overrides


def test_underscore_spellings_equal_dash_spellings():
    a = serve("--data_parallel_size 4 --data_parallel_size_local=2 --data_parallel_start_rank 0 --dp_lb_policy "
              "round_robin --max_num_seqs 7")
    b = serve("--data-parallel-size 4 --data-parallel-size-local=2 --data-parallel-start-rank 0 --dp-lb-policy "
              "round_robin --max-num-seqs 7")
    assert a == b
    assert (a.deployment.mode, a.lb_policy, a.engine.max_num_seqs) == ("hybrid", "round_robin", 7)


def test_underscores_in_values_are_kept():
    c = serve("--lb-policy=vllm_legacy --served-model-name my_model")
    assert (c.lb_policy, c.served_model_names) == ("vllm_legacy", ("my_model",))


@pytest.mark.parametrize("policy", LB_POLICIES)
def test_every_lb_policy_is_accepted_by_both_spellings(policy):
    assert serve(f"--lb-policy {policy}").lb_policy == policy == serve(f"--dp-lb-policy {policy}").lb_policy


def test_no_prefix_turns_bool_flags_off():
    assert serve("").engine.enable_prefix_caching is True
    assert serve("--no-enable-prefix-caching").engine.enable_prefix_caching is False
    assert serve("--no-enable_prefix_caching").engine.enable_prefix_caching is False
    assert deploy("-dp 4 -dpl 2 -dpr 2 --no-data-parallel-hybrid-lb --headless").mode == "headless"
    assert serve("--dp-fail-fast").dp_fail_fast is True
    assert serve("--no-dp-fail-fast").dp_fail_fast is False
    assert deploy("-dp 4 -ep --no-enable-expert-parallel").enable_expert_parallel is False


def test_defaults_match_the_spec():
    c = serve("")
    assert (c.model, c.port, c.data_parallel_rpc_port, c.master_port, c.data_parallel_supervisor_port) == (
        "builtin:tiny-moe", 8000, 29550, 29501, 9256)
    assert (c.lb_policy, c.backend, c.dp_sync_interval, c.dp_coordinator_startup_timeout_s,
            c.engine_ready_timeout_s, c.dp_heartbeat_interval_s, c.dp_heartbeat_timeout_s) == (
        "vllm", "asyncio", 32, 120.0, 600.0, 1.0, 5.0)
    assert (c.max_queued_requests, c.shutdown_timeout_s, c.keep_alive_on_engine_death) == (None, 0, False)


def test_env_overrides_apply_when_flag_not_given():
    env = {"ASYNCDP_DP_LB_POLICY": "power_of_two", "ASYNCDP_DP_SYNC_INTERVAL": "8",
           "ASYNCDP_DP_COORDINATOR_STARTUP_TIMEOUT_S": "7.5", "VLLM_ENGINE_READY_TIMEOUT_S": "30",
           "ASYNCDP_DP_HEARTBEAT_INTERVAL_S": "0.5", "ASYNCDP_DP_HEARTBEAT_TIMEOUT_S": "2"}
    c = serve("", env=env)
    assert (c.lb_policy, c.dp_sync_interval, c.dp_coordinator_startup_timeout_s, c.engine_ready_timeout_s,
            c.dp_heartbeat_interval_s, c.dp_heartbeat_timeout_s) == ("power_of_two", 8, 7.5, 30.0, 0.5, 2.0)


def test_flag_wins_over_env():
    c = serve("--dp-lb-policy random --dp-sync-interval 4", env={"ASYNCDP_DP_LB_POLICY": "round_robin",
                                                                   "ASYNCDP_DP_SYNC_INTERVAL": "8"})
    assert (c.lb_policy, c.dp_sync_interval) == ("random", 4)


def test_asyncdp_engine_ready_timeout_env_wins_over_vllm_one():
    env = {"ASYNCDP_ENGINE_READY_TIMEOUT_S": "11", "VLLM_ENGINE_READY_TIMEOUT_S": "22"}
    assert serve("", env=env).engine_ready_timeout_s == 11.0


@pytest.mark.parametrize(("env", "message"), [
    ({"ASYNCDP_DP_LB_POLICY": "bogus"}, "(got 'bogus')"),
    ({"ASYNCDP_DP_SYNC_INTERVAL": "abc"}, "environment variable ASYNCDP_DP_SYNC_INTERVAL='abc' is not a valid int"),
    ({"ASYNCDP_DP_SYNC_INTERVAL": "0"}, "--dp-sync-interval must be >= 1 (got 0)"),
])
def test_invalid_env_override_is_a_config_error(env, message):
    assert message in fails("", env=env)


@pytest.mark.parametrize("var", ["VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "ASYNCDP_KEEP_ALIVE_ON_ENGINE_DEATH"])
def test_keep_alive_env(var):
    assert serve("", env={var: "1"}).keep_alive_on_engine_death is True
    assert serve("", env={var: "0"}).keep_alive_on_engine_death is False


def test_ray_span_pack_strategy_gives_one_local_rank_before_v22():
    # ray is V22 in this build, but the derivation still follows R7's ray rule up to that point.
    config = ServeConfig(data_parallel_size=4, data_parallel_backend="ray")
    par = _pass2(config, False, is_moe=True, env={"VLLM_RAY_DP_PACK_STRATEGY": "span"})
    assert (par.rank, par.local) == (0, 1)
    with pytest.raises(ConfigError, match="ray is not available"):
        resolve(config, is_moe=True, num_experts=8, env={})


# ---------------------------------------------------------------- engine flags and multi-port children


def test_engine_flags_build_the_engine_config():
    c = serve("some/dir --max-num-seqs 3 --max-num-batched-tokens 64 --max-model-len 128 --block-size 8 "
              "--num-kv-blocks 10 --seed 5 --dtype float32 --device cpu --executor sim --sim-cost 1,0.5,0.25,0 "
              "--torch-threads 1")
    e = c.engine
    assert (e.model, e.max_num_seqs, e.max_num_batched_tokens, e.max_model_len, e.block_size, e.num_kv_blocks,
            e.seed, e.dtype, e.device, e.executor, e.torch_threads) == (
        "some/dir", 3, 64, 128, 8, 10, 5, "float32", "cpu", "sim", 1)
    assert e.sim_cost == SimCostProfile(1.0, 0.5, 0.25, 0.0)


def test_model_flag_and_positional_agree_or_fail():
    assert serve("--model a").model == "a" == serve("a --model a").model
    assert "the model is given twice" in fails("a --model b")


def test_multi_port_child_rank_and_port_follow_the_start_rank():
    d = deploy("-dp 16 -dpl 4 -dpr 8 -dpm --port 8000")
    assert (d.children[2].port, d.children[2].deployment.dp_rank) == (8002, 10)


def test_multi_port_children_slice_device_ids_and_rank_zero_child_runs_coordinator():
    d = deploy("-dp 4 -dpl 2 -dpm -tp 2 --device-ids 4,5,6,7")
    assert [c.device_ids for c in d.children] == [(4, 5), (6, 7)]
    assert [c.deployment.coordinator_here for c in d.children] == [True, False]
    assert deploy("-dp 4 -dpl 2 -dpm -tp 2").children[1].device_ids == (2, 3)



def test_request_limit_flags_parse_validate_and_default() -> None:
    from asyncdp.config.flags import DEFAULT_MAX_SEQS_PER_REQUEST, default_max_request_body_bytes

    c = serve("")
    assert (c.max_seqs_per_request, c.max_request_body_bytes) == (DEFAULT_MAX_SEQS_PER_REQUEST, None) == (256, None)
    c = serve("--max-seqs-per-request 8 --max-request-body-bytes 4096")
    assert (c.max_seqs_per_request, c.max_request_body_bytes) == (8, 4096)
    assert "--max-seqs-per-request must be in 1..2147483647 (got 0)" in fails("--max-seqs-per-request 0")
    assert "--max-request-body-bytes must be >= 1024 (got 10)" in fails("--max-request-body-bytes 10")
    # The body default grows with the context length and never drops below 16 MiB.
    assert default_max_request_body_bytes(2048) == 16 * 1024 * 1024
    assert default_max_request_body_bytes(1_000_000) == 64_000_000


def test_launch_plan_resolves_the_body_limit_from_max_model_len(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncdp.model as model
    from asyncdp.launcher.launch_plan import plan_from_config

    @dataclass(frozen=True)
    class Info:
        max_position_embeddings: int = 4096
        is_moe: bool = False

    monkeypatch.setattr(model, "resolve_model", lambda name: "/m")
    monkeypatch.setattr(model, "read_model_info", lambda path: Info())
    monkeypatch.setattr(model, "resolve_tokenizer", lambda tok, path: path)
    default = plan_from_config(serve("--max-model-len 1000000", DENSE))
    given = plan_from_config(serve("--max-request-body-bytes 2048 --max-seqs-per-request 3", DENSE))
    assert (default.max_request_body_bytes, default.max_seqs_per_request) == (64_000_000, 256)
    assert (given.max_request_body_bytes, given.max_seqs_per_request) == (2048, 3)
