"""Flag handling (spec §2), driven by real command lines: spellings, ``--no-`` flags, defaults, environment
overrides, the engine's flags, the model flag, and the request limits the launch plan resolves."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from asyncdp.config.deployment import _pass2, resolve
from asyncdp.config.flags import LB_POLICIES, ServeConfig, SimCostProfile
from asyncdp.errors import ConfigError
from tests.config.command_lines import DENSE, deploy, fails, serve

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


# ---------------------------------------------------------------- engine flags and request limits


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
