"""vLLM's flags beyond data parallelism carry over (docs/reference/cli.md, "vLLM flags that carry over"): every flag of
the three groups, driven by real command lines. Honoured and accepted ones parse (in both spellings) and reach the
resolved configuration, or each API server's; refused values exit 2 with one line in the house form, before the
launcher is called; out-of-range values exit 2 naming what the flag must be."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from asyncdp.config.flags import ServeConfig
from tests.config.command_lines import (
    DENSE,
    accepted_both_spellings,
    api_server_configs,
    exits_2,
    refused_both_spellings,
)

# vLLM's own DP end-to-end tests start their servers with these (tests/v1/distributed/test_internal_lb_dp.py).
VLLM_DP_TEST_FLAGS = "--dtype bfloat16 --max-model-len 2048 --max-num-seqs 128 --enforce-eager"

ACCEPTED: list[tuple[str, Callable[[ServeConfig], Any], Any]] = [
    # group 1: honoured (their effects: tests/api/test_vllm_flag_effects.py, tests/e2e/test_vllm_dp_flags.py)
    ("--max-logprobs 5", lambda c: c.vllm.max_logprobs, 5),
    ("--max-logprobs 0", lambda c: c.vllm.max_logprobs, 0),
    ("--max-logprobs 50", lambda c: c.vllm.max_logprobs, 50),  # (above vLLM's default too: the server's cap)
    ("--max-logprobs -1", lambda c: c.vllm.max_logprobs, -1),  # (vLLM's "no cap": the vocabulary's size)
    ("--gpu-memory-utilization 0.5", lambda c: c.engine.gpu_memory_utilization, 0.5),
    ("--gpu-memory-utilization 0.5 --kv-cache-memory-bytes 2G", lambda c: (
        c.engine.gpu_memory_utilization, c.engine.kv_cache_memory_bytes), (None, 2 * 2**30)),  # (a given size wins)
    ("--uvicorn-log-level trace", lambda c: c.vllm.uvicorn_log_level, "trace"),
    ("--enable-log-requests --max-log-len 8", lambda c: (c.vllm.enable_log_requests, c.vllm.max_log_len), (True, 8)),
    ("--no-enable-log-requests", lambda c: c.vllm.enable_log_requests, False),
    ("--generation-config vllm", lambda c: c.vllm.generation_config, "vllm"),
    ("--generation-config auto", lambda c: c.vllm.generation_config, "auto"),  # (these facts carry no defaults)
    ("--trust-remote-code", lambda c: c.vllm.trust_remote_code, True),
    ("--no-trust-remote-code", lambda c: c.vllm.trust_remote_code, False),
    ("--num-gpu-blocks-override 64", lambda c: c.engine.num_kv_blocks, 64),
    ("--dtype half", lambda c: c.engine.dtype, "float16"),
    ("--dtype float", lambda c: c.engine.dtype, "float32"),
    ("--max-model-len 1k --max-num-batched-tokens 4K --kv-cache-memory-bytes 512M", lambda c: (
        c.engine.max_model_len, c.engine.max_num_batched_tokens, c.engine.kv_cache_memory_bytes),
     (1000, 4096, 512 * 2**20)),
    (VLLM_DP_TEST_FLAGS, lambda c: (c.engine.dtype, c.engine.max_model_len, c.engine.max_num_seqs,
                                    c.vllm.enforce_eager), ("bfloat16", 2048, 128, True)),
    # group 2: accepted without effect
    ("--enforce-eager", lambda c: c.vllm.enforce_eager, True),
    ("--no-enforce-eager", lambda c: c.vllm.enforce_eager, False),
    ("--enable-chunked-prefill", lambda c: c.vllm.enable_chunked_prefill, True),
    ("--max-seq-len-to-capture 4096", lambda c: c.vllm.max_seq_len_to_capture, 4096),
    ("--compilation-config {}", lambda c: c.vllm.compilation_config, "{}"),
    ("""--compilation-config '{"level": 3}'""", lambda c: c.vllm.compilation_config, '{"level": 3}'),
    ("-O3", lambda c: c.vllm.compilation_config, "3"),
    ("--async-scheduling", lambda c: c.vllm.async_scheduling, True),
    ("--no-async-scheduling", lambda c: c.vllm.async_scheduling, False),
    ("--swap-space 8", lambda c: c.vllm.swap_space, 8.0),
    ("--cpu-offload-gb 0", lambda c: c.vllm.cpu_offload_gb, 0.0),
    ("--distributed-executor-backend mp", lambda c: c.vllm.distributed_executor_backend, "mp"),
    ("--distributed-executor-backend uni", lambda c: c.vllm.distributed_executor_backend, "uni"),
    ("--tokenizer-mode auto", lambda c: c.vllm.tokenizer_mode, "auto"),
    ("--tokenizer-mode hf", lambda c: c.vllm.tokenizer_mode, "hf"),
    ("--kv-cache-dtype auto", lambda c: c.vllm.kv_cache_dtype, "auto"),
    ("--calculate-kv-scales", lambda c: c.vllm.calculate_kv_scales, True),
    ("--load-format auto", lambda c: c.vllm.load_format, "auto"),
    ("--load-format safetensors", lambda c: c.vllm.load_format, "safetensors"),
    ("--download-dir /tmp/models", lambda c: c.vllm.download_dir, "/tmp/models"),
    ("--disable-log-stats", lambda c: c.vllm.disable_log_stats, True),
    ("--disable-log-requests", lambda c: c.vllm.disable_log_requests, True),
    ("--no-disable-log-requests", lambda c: c.vllm.disable_log_requests, False),
    ("--disable-uvicorn-access-log", lambda c: c.vllm.disable_uvicorn_access_log, True),
    ("--disable-custom-all-reduce", lambda c: c.vllm.disable_custom_all_reduce, True),
]


@pytest.mark.parametrize(("cmd", "read", "expected"), ACCEPTED, ids=[c for c, _, _ in ACCEPTED])
def test_accepted_flag_reaches_the_resolved_config_in_both_spellings(cmd, read, expected):
    accepted_both_spellings(cmd, read, expected, DENSE)


REFUSED = [
    ("--quantization fp8", "--quantization fp8 is not supported in this build yet; asyncdp runs the checkpoint's "
                           "unquantized weights: drop --quantization"),
    ("-q awq", "--quantization awq is not supported in this build yet; asyncdp runs the checkpoint's unquantized "
               "weights: drop --quantization"),
    ("--kv-cache-dtype fp8", "--kv-cache-dtype fp8 is not supported in this build yet; the KV cache takes the "
                             "model's dtype: drop --kv-cache-dtype (or pass auto)"),
    ("--kv-cache-dtype fp8_e5m2", "--kv-cache-dtype fp8_e5m2 is not supported in this build yet; the KV cache "
                                  "takes the model's dtype: drop --kv-cache-dtype (or pass auto)"),
    ("--cpu-offload-gb 4", "--cpu-offload-gb 4 is not supported in this build yet; the weights stay on the device: "
                           "drop --cpu-offload-gb (or pass 0)"),
    ("--no-enable-chunked-prefill", "--no-enable-chunked-prefill is not supported in this build yet; asyncdp always "
                                    "splits long prompts into chunks of --max-num-batched-tokens: drop "
                                    "--no-enable-chunked-prefill"),
    ("--tokenizer-mode mistral", "--tokenizer-mode mistral is not supported in this build yet; asyncdp loads the "
                                 "checkpoint's fast tokenizer (tokenizer.json): drop --tokenizer-mode (or pass "
                                 "auto or hf)"),
    ("--tokenizer-mode slow", "--tokenizer-mode slow is not supported in this build yet; asyncdp loads the "
                              "checkpoint's fast tokenizer (tokenizer.json): drop --tokenizer-mode (or pass auto "
                              "or hf)"),
    ("--load-format pt", "--load-format pt is not supported in this build yet; asyncdp loads the checkpoint's "
                         "safetensors weights: drop --load-format (or pass auto or safetensors)"),
    ("--load-format dummy", "--load-format dummy is not supported in this build yet; asyncdp loads the "
                            "checkpoint's safetensors weights: drop --load-format (or pass auto or safetensors)"),
    ("--distributed-executor-backend ray", "--distributed-executor-backend ray is not supported in this build yet; "
                                           "each data-parallel rank runs in its own process on one device: drop "
                                           "--distributed-executor-backend (or pass mp or uni)"),
]


@pytest.mark.parametrize(("cmd", "message"), REFUSED, ids=[c for c, _ in REFUSED])
def test_refused_value_exits_2_with_one_line_before_the_launcher(cmd, message, capsys):
    refused_both_spellings(cmd, message, DENSE, capsys)


INVALID = [
    ("--gpu-memory-utilization 0", "--gpu-memory-utilization must be in (0, 1] (got 0.0)."),
    ("--gpu-memory-utilization 1.5", "--gpu-memory-utilization must be in (0, 1] (got 1.5)."),
    ("--max-logprobs -2", "--max-logprobs must be -1 (no limit) or >= 0 (got -2)."),
    ("--generation-config /models/gen", "--generation-config must be auto, vllm or a folder holding "
                                        "generation_config.json (got '/models/gen': no such folder)."),
    ("--max-log-len -1", "--max-log-len must be >= 0 (got -1)."),
    ("--swap-space -1", "--swap-space must be >= 0 (GiB) (got -1.0)."),
    ("--cpu-offload-gb -1", "--cpu-offload-gb must be >= 0 (GiB) (got -1.0)."),
    ("--uvicorn-log-level loud", "--uvicorn-log-level must be one of critical, error, warning, info, debug, trace "
                                 "(got 'loud')."),
    ("--tokenizer-mode fast", "--tokenizer-mode must be one of auto, hf, slow, mistral, custom (got 'fast')."),
    ("--kv-cache-dtype fp4", "--kv-cache-dtype must be one of auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2, fp8_inc, "
                             "fp8_ds_mla (got 'fp4')."),
    ("--distributed-executor-backend threads", "--distributed-executor-backend must be one of ray, mp, uni, "
                                               "external_launcher (got 'threads')."),
    ("-O fast", """--compilation-config (-O) must be a JSON object such as '{"level": 3}' or an optimization level """
                """0..3 (got 'fast')."""),
    ("--max-model-len 2x", "argument --max-model-len: '2x' is not a count such as 2048, 2k (2000) or 2K (2048)"),
]


@pytest.mark.parametrize(("cmd", "message"), INVALID, ids=[c for c, _ in INVALID])
def test_out_of_range_value_exits_2_naming_what_the_flag_must_be(cmd, message, capsys):
    assert exits_2(cmd, DENSE, capsys) == [f"asyncdp: error: {message}"]


def test_front_end_flags_reach_every_api_server(monkeypatch):
    for cfg in api_server_configs(monkeypatch, "--max-logprobs 3 --enable-log-requests --max-log-len 4 "
                                               "--uvicorn-log-level warning"):
        assert (cfg.max_logprobs, cfg.enable_log_requests, cfg.max_log_len, cfg.uvicorn_log_level) == (
            3, True, 4, "warning")
    for cfg in api_server_configs(monkeypatch, ""):  # vLLM's defaults; the HTTP log follows --log-level
        assert (cfg.max_logprobs, cfg.enable_log_requests, cfg.max_log_len, cfg.uvicorn_log_level) == (
            20, False, None, None)
