"""vLLM's flags of MoE DP command lines and the other common ones that carry over (docs/reference/cli.md, "vLLM flags
that carry over"): ``--enable-eplb``, ``--eplb-config``, ``--all2all-backend``, ``--expert-placement-strategy``,
``--enable-dbo``, the revisions, ``--enable-log-outputs``, the CUDA graph sizes, ``--disable-cascade-attn``,
``--hf-overrides``, ``--kv-transfer-config``, ``--kv-events-config`` and ``--limit-mm-per-prompt``, driven by real
command lines of a MoE model with -dp 2. Accepted values parse in both spellings and reach the resolved
configuration; refused values exit 2 with one line in the house form before the launcher is called; out-of-range
values and vLLM's own cross-flag rules exit 2 naming what the flag must be or needs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from asyncdp.cli import unsupported_reason
from asyncdp.config.flags import ServeConfig
from tests.config.command_lines import (
    DENSE,
    MOE,
    accepted_both_spellings,
    api_server_configs,
    exits_2,
    refused_both_spellings,
    serve,
)

EPLB = """{"window_size": 100, "step_interval": 200, "num_redundant_experts": 2, "log_balancedness": true}"""

ACCEPTED: list[tuple[str, Callable[[ServeConfig], Any], Any]] = [
    # group 1: honoured
    ("--all2all-backend allgather_reducescatter", lambda c: c.vllm.all2all_backend, "allgather_reducescatter"),
    ("--expert-placement-strategy linear -ep", lambda c: c.vllm.expert_placement_strategy, "linear"),
    ("--enable-log-requests --enable-log-outputs", lambda c: (c.vllm.enable_log_requests,
                                                              c.vllm.enable_log_outputs), (True, True)),
    ("--no-enable-log-outputs", lambda c: c.vllm.enable_log_outputs, False),
    # group 2: accepted without effect
    ("--enable-eplb -ep", lambda c: c.vllm.enable_eplb, True),
    ("--no-enable-eplb", lambda c: c.vllm.enable_eplb, False),
    (f"--enable-eplb -ep --eplb-config '{EPLB}'", lambda c: c.vllm.eplb_config, EPLB),
    ("--eplb-config {}", lambda c: c.vllm.eplb_config, "{}"),
    ("--all2all-backend naive", lambda c: c.vllm.all2all_backend, "naive"),  # (removed in vLLM: its fallback)
    ("--all2all-backend pplx", lambda c: c.vllm.all2all_backend, "pplx"),
    ("--expert-placement-strategy round_robin", lambda c: c.vllm.expert_placement_strategy, "round_robin"),
    ("--enable-dbo", lambda c: c.vllm.enable_dbo, True),
    ("--no-enable-dbo", lambda c: c.vllm.enable_dbo, False),
    ("--dbo-decode-token-threshold 16 --dbo-prefill-token-threshold 256", lambda c: (
        c.vllm.dbo_decode_token_threshold, c.vllm.dbo_prefill_token_threshold), (16, 256)),
    ("--revision main --code-revision v1 --tokenizer-revision abc123", lambda c: (
        c.vllm.revision, c.vllm.code_revision, c.vllm.tokenizer_revision), ("main", "v1", "abc123")),
    ("--max-cudagraph-capture-size 512", lambda c: c.vllm.max_cudagraph_capture_size, 512),
    ("--cudagraph-capture-sizes 1 2 4 8", lambda c: c.vllm.cudagraph_capture_sizes, (1, 2, 4, 8)),
    ("--cuda-graph-sizes 1 2 4", lambda c: c.vllm.cudagraph_capture_sizes, (1, 2, 4)),
    ("--disable-cascade-attn", lambda c: c.vllm.disable_cascade_attn, True),
    ("--no-disable-cascade-attn", lambda c: c.vllm.disable_cascade_attn, False),
    ("--hf-overrides {}", lambda c: c.vllm.hf_overrides, "{}"),
    ("--kv-transfer-config {}", lambda c: c.vllm.kv_transfer_config, "{}"),
    ("""--kv-events-config '{"enable_kv_cache_events": false}'""", lambda c: c.vllm.kv_events_config,
     '{"enable_kv_cache_events": false}'),
    ("""--limit-mm-per-prompt '{"image": 0, "video": 0}'""", lambda c: c.vllm.limit_mm_per_prompt,
     '{"image": 0, "video": 0}'),
    ("""--limit-mm-per-prompt '{"video": {"count": 0, "num_frames": 32}}'""", lambda c: c.vllm.limit_mm_per_prompt,
     '{"video": {"count": 0, "num_frames": 32}}'),
]


@pytest.mark.parametrize(("cmd", "read", "expected"), ACCEPTED, ids=[c for c, _, _ in ACCEPTED])
def test_accepted_flag_reaches_the_resolved_config_in_both_spellings(cmd, read, expected):
    accepted_both_spellings(cmd, read, expected, MOE)


@pytest.mark.parametrize("backend", ["naive", "pplx"])
def test_a_removed_all2all_backend_falls_back_to_allgather_reducescatter_with_vllms_warning(backend):
    warnings = serve(f"-dp 2 --all2all-backend {backend}", MOE).deployment.warnings
    assert f"The '{backend}' all2all backend has been removed. Falling back to 'allgather_reducescatter'." in warnings


def test_a_moe_command_line_with_eplb_dbo_and_graph_sizes_carries_over():
    """vLLM's docs' expert-parallel command lines, less their kernel libraries, start as they are."""
    config = serve("-dp 2 -ep --enable-eplb --eplb-config '{\"num_redundant_experts\": 2}' --revision main "
                   "--enable-dbo --max-cudagraph-capture-size 256 --disable-cascade-attn "
                   "--limit-mm-per-prompt '{\"image\": 0}'", MOE)
    assert unsupported_reason(config) is None
    assert config.deployment.enable_expert_parallel and config.vllm.enable_eplb and config.vllm.enable_dbo


REMOVED_LIBRARY = ("is not supported in this build yet; asyncdp's MoE ranks exchange tokens with torch.distributed "
                   "collectives, not that library's kernels: drop --all2all-backend")
REFUSED = [
    ("--all2all-backend deepep_low_latency -ep", f"--all2all-backend deepep_low_latency {REMOVED_LIBRARY}"),
    ("--all2all-backend deepep_high_throughput", f"--all2all-backend deepep_high_throughput {REMOVED_LIBRARY}"),
    ("--all2all-backend flashinfer_all2allv -ep", f"--all2all-backend flashinfer_all2allv {REMOVED_LIBRARY}"),
    ("--all2all-backend mori_low_latency", f"--all2all-backend mori_low_latency {REMOVED_LIBRARY}"),
    ("--all2all-backend allgather_reducescatter -ep",
     "--all2all-backend allgather_reducescatter with --enable-expert-parallel is not supported in this build yet; "
     "asyncdp's expert-parallel ranks send each token to its experts' ranks with an all-to-all (torch.distributed "
     "all_to_all_single), not an all-gather: drop --all2all-backend"),
    ("--all2all-backend naive -ep",
     "--all2all-backend naive with --enable-expert-parallel is not supported in this build yet; asyncdp's "
     "expert-parallel ranks send each token to its experts' ranks with an all-to-all (torch.distributed "
     "all_to_all_single), not an all-gather: drop --all2all-backend"),
    ("--expert-placement-strategy round_robin -ep",
     "--expert-placement-strategy round_robin is not supported in this build yet; each expert-parallel rank holds "
     "a contiguous block of experts: drop --expert-placement-strategy (or pass linear)"),
    ("""--hf-overrides '{"architectures": ["MixtralForCausalLM"]}'""",
     "--hf-overrides setting architectures is not supported in this build yet; asyncdp runs the checkpoint's "
     "config.json as it is: drop --hf-overrides (or pass {})"),
    ("""--hf-overrides '{"rope_theta": 1e6, "max_position_embeddings": 8192}'""",
     "--hf-overrides setting rope_theta, max_position_embeddings is not supported in this build yet; asyncdp runs "
     "the checkpoint's config.json as it is: drop --hf-overrides (or pass {})"),
    ("""--kv-transfer-config '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'""",
     "--kv-transfer-config with kv_connector NixlConnector is not supported in this build yet; asyncdp has no KV "
     "connector (disaggregated prefill, KV cache transfer or offloading): drop --kv-transfer-config"),
    ("""--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq"}'""",
     "--kv-events-config with enable_kv_cache_events is not supported in this build yet; asyncdp publishes no KV "
     "cache events: drop --kv-events-config (or set enable_kv_cache_events to false)"),
    ("""--limit-mm-per-prompt '{"image": 2}'""",
     "--limit-mm-per-prompt image 2 is not supported in this build yet; asyncdp serves text-only models, whose "
     "prompts hold no media: drop --limit-mm-per-prompt (or give every modality 0)"),
    ("""--limit-mm-per-prompt '{"image": 0, "video": {"count": 1}}'""",
     "--limit-mm-per-prompt video 1 is not supported in this build yet; asyncdp serves text-only models, whose "
     "prompts hold no media: drop --limit-mm-per-prompt (or give every modality 0)"),
]


@pytest.mark.parametrize(("cmd", "message"), REFUSED, ids=[c for c, _ in REFUSED])
def test_refused_value_exits_2_with_one_line_before_the_launcher(cmd, message, capsys):
    refused_both_spellings(cmd, message, MOE, capsys)


def test_expert_parallel_refusals_do_not_apply_where_the_model_has_no_experts():
    """On a dense model --enable-expert-parallel is ignored (with its warning): no expert is placed or sent."""
    config = serve("-dp 2 -ep --all2all-backend allgather_reducescatter --expert-placement-strategy round_robin",
                   DENSE)
    assert unsupported_reason(config) is None


EPLB_KEYS = ("window_size > 0, step_interval > 0, num_redundant_experts >= 0, log_balancedness true or false, "
             "log_balancedness_interval > 0, use_async true or false, policy default, communicator torch_nccl, "
             "torch_gloo, nixl or pynccl")
INVALID = [
    ("--all2all-backend fast", "--all2all-backend must be one of allgather_reducescatter, deepep_high_throughput, "
                               "deepep_low_latency, deepep_v2, flashinfer_all2allv, flashinfer_nvlink_one_sided, "
                               "flashinfer_nvlink_two_sided, mori_high_throughput, mori_low_latency, naive, nixl_ep, "
                               "pplx (got 'fast')."),
    ("--expert-placement-strategy random", "--expert-placement-strategy must be one of linear, round_robin "
                                           "(got 'random')."),
    ("""--eplb-config '{"window_size": 0}'""", f"--eplb-config must be a JSON object of {EPLB_KEYS} "
                                                """(got '{"window_size": 0}')."""),
    ("""--eplb-config '{"windows": 10}'""", f"--eplb-config must be a JSON object of {EPLB_KEYS} "
                                             """(got '{"windows": 10}')."""),
    ("""--eplb-config '{"log_balancedness": 1}'""", f"--eplb-config must be a JSON object of {EPLB_KEYS} "
                                                     """(got '{"log_balancedness": 1}')."""),
    ("--eplb-config 3", f"--eplb-config must be a JSON object of {EPLB_KEYS} (got '3')."),
    ("--dbo-decode-token-threshold -1", "--dbo-decode-token-threshold must be >= 0 (got -1)."),
    ("--dbo-prefill-token-threshold -1", "--dbo-prefill-token-threshold must be >= 0 (got -1)."),
    ("--hf-overrides '[1]'", """--hf-overrides must be a JSON object such as '{"rope_theta": 1000000}' """
                             """(got '[1]')."""),
    ("--kv-transfer-config nixl", """--kv-transfer-config must be a JSON object such as '{"kv_connector": """
                                  """"NixlConnector", "kv_role": "kv_both"}' (got 'nixl')."""),
    ("--kv-events-config on", """--kv-events-config must be a JSON object such as '{"enable_kv_cache_events": """
                              """false}' (got 'on')."""),
    ("--limit-mm-per-prompt image=2", """--limit-mm-per-prompt must be a JSON object of counts such as '{"image": """
                                      """0, "video": 0}' (got 'image=2')."""),
    ("""--limit-mm-per-prompt '{"image": -1}'""", """--limit-mm-per-prompt must be a JSON object of counts such as """
                                                  """'{"image": 0, "video": 0}' (got '{"image": -1}')."""),
    ("--cudagraph-capture-sizes 1 x", "argument --cudagraph-capture-sizes/--cuda-graph-sizes: invalid int value: "
                                      "'x'"),
    # vLLM's own rules between the EPLB flags (vllm/config/parallel.py)
    ("-dp 2 --enable-eplb", "--enable-eplb needs --enable-expert-parallel, as in vLLM."),
    ("-dp 1 --enable-eplb -ep", "--enable-eplb needs more than one expert-parallel rank (dp x tp = 1), as in vLLM."),
    ("""-dp 2 -ep --eplb-config '{"num_redundant_experts": 2}'""",
     "--eplb-config's num_redundant_experts (2) needs --enable-eplb, as in vLLM."),
]


@pytest.mark.parametrize(("cmd", "message"), INVALID, ids=[c for c, _ in INVALID])
def test_out_of_range_value_exits_2_naming_what_the_flag_must_be(cmd, message, capsys):
    assert exits_2(cmd, MOE, capsys) == [f"asyncdp: error: {message}"]


def test_enable_log_outputs_reaches_every_api_server(monkeypatch):
    for cfg in api_server_configs(monkeypatch, "--enable-log-requests --enable-log-outputs --max-log-len 4"):
        assert (cfg.enable_log_requests, cfg.enable_log_outputs, cfg.max_log_len) == (True, True, 4)
    for cfg in api_server_configs(monkeypatch, "--enable-log-outputs"):  # (vLLM logs nothing without the logger)
        assert (cfg.enable_log_requests, cfg.enable_log_outputs) == (False, True)
