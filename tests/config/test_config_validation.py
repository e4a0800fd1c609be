"""Validation (spec §4.1), driven by real command lines: every rule's message for an invalid command line, the
checks of pass 2, expert parallelism on a dense model, and the range of every numeric flag."""

from __future__ import annotations

import pytest

from asyncdp.config.deployment import _pass2
from asyncdp.config.flags import ServeConfig
from asyncdp.errors import ConfigError
from tests.config.command_lines import DENSE, MOE, Facts, deploy, fails, serve

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
