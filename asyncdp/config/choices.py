"""The fixed choices of ``asyncdp serve``'s flags, each a tuple of names (:mod:`asyncdp.config.flags` checks a
flag's value against its tuple and re-exports them all; the argument parser lists them in its help), and the
defaults of the flags whose default is a number."""

from __future__ import annotations

# Base names of the --lb-policy choices (asyncdp.dp.balance.make_policy builds them; ``name@preset`` picks a
# preset, checked by the CLI against make_policy's table). A test keeps this list equal to make_policy's.
LB_POLICIES = ("vllm", "vllm_legacy", "round_robin", "random", "power_of_two", "sglang_cache_aware", "llmd_weighted",
               "dynamo_kv", "aibrix_prefix", "session_hash", "vllm_token", "smg_least_load", "smg_prefix_hash",
               "prodstack_prefixaware", "prodstack_loadaware", "ray_prefix", "asyncdp")
DEFAULT_LB_POLICY = "vllm"
HTTP_BACKENDS = ("asyncio", "trio")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DP_BACKENDS = ("mp", "ray")
# --chat-template-content-format (vLLM's): how message content reaches the chat template; auto reads the template.
CHAT_TEMPLATE_CONTENT_FORMATS = ("auto", "string", "openai")
# --tool-call-parser (vLLM's names): the registry asyncdp.api.tool_parsers.PARSERS, kept equal by a test.
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "llama4_pythonic", "mistral", "openai", "pythonic", "qwen3_coder")
# --reasoning-parser (vLLM's names): the registry asyncdp.api.reasoning_parsers.PARSERS, kept equal by a test.
REASONING_PARSERS = ("deepseek_r1", "deepseek_v3", "ernie45", "glm45", "granite", "holo2", "hunyuan_a13b", "kimi_k2",
                     "minimax_m2", "minimax_m2_append_think", "mistral", "openai_gptoss", "qwen3", "seed_oss",
                     "step3")
# --scheduling-policy (vLLM's): how a rank's waiting queue is ordered and whom it preempts: fcfs by arrival;
# priority by the requests' priority, then arrival (asyncdp.engine.request_queue).
SCHEDULING_POLICIES = ("fcfs", "priority")
# The engine's choice flags: EngineConfig field -> its choices.
ENGINE_CHOICES = {"executor": ("torch", "sim"), "dtype": ("auto", "float32", "bfloat16", "float16"),
                  "device": ("auto", "cpu", "cuda"), "scheduling_policy": SCHEDULING_POLICIES}
MODES = ("single", "internal", "hybrid", "external", "headless", "multi-port")

# Most sequences (prompts x max(n, best_of)) one HTTP request may start: --max-seqs-per-request.
DEFAULT_MAX_SEQS_PER_REQUEST = 256
# KV-cache blocks of the simulated executor (--executor sim) when --num-kv-blocks is not given.
DEFAULT_SIM_KV_BLOCKS = 4096
# --max-request-body-bytes by default: room for a max_model_len prompt written as JSON token ids or escaped
# text (up to ~16 bytes a token), for a batch of such prompts, and never below 16 MiB.
_BODY_BYTES_PER_TOKEN = 64
_MIN_BODY_BYTES = 16 * 1024 * 1024


def default_max_request_body_bytes(max_model_len: int) -> int:
    """The default of ``--max-request-body-bytes``: 64 bytes per token of ``max_model_len``, at least 16 MiB."""
    return max(_MIN_BODY_BYTES, _BODY_BYTES_PER_TOKEN * max_model_len)
