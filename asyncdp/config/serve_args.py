"""The arguments of ``asyncdp serve``: one argparse group per section of spec §2, each flag with its help text.

Definitions only: :mod:`asyncdp.cli` parses them (every flag not given is ``None``) and hands the result to
:meth:`~asyncdp.config.flags.ServeConfig.from_flags`, which checks ranges and applies the environment. The defaults
the help texts quote are :class:`~asyncdp.config.flags.ServeConfig`'s own, so the two cannot disagree.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from asyncdp.config.flags import (
    CHAT_TEMPLATE_CONTENT_FORMATS,
    DEFAULT_MODEL,
    DP_BACKENDS,
    ENGINE_CHOICES,
    HTTP_BACKENDS,
    LB_POLICIES,
    LOG_LEVELS,
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    ServeConfig,
)
from asyncdp.config.vllm_flags import (
    ALL2ALL_BACKENDS,
    DISTRIBUTED_EXECUTOR_BACKENDS,
    EXPERT_PLACEMENT_STRATEGIES,
    KV_CACHE_DTYPES,
    TOKENIZER_MODES,
    UVICORN_LOG_LEVELS,
    human_readable_int,
)

_D = ServeConfig()  # defaults for help texts


def _bool(group: Any, *names: str, help: str, dest: str | None = None) -> None:
    group.add_argument(*names, action=argparse.BooleanOptionalAction, default=None, dest=dest, help=help)


def _choice(group: Any, *names: str, choices: Sequence[str], help: str) -> None:
    """A flag that takes one of ``choices``, listed in its help; ServeConfig.validate checks the value (exit 2)."""
    group.add_argument(*names, default=None, metavar="{" + ",".join(choices) + "}", help=help)


def _nullable(value: str) -> str | None:
    return None if value in ("", "None") else value  # vLLM's optional strings


def _dtype(name: str) -> str:
    return {"half": "float16", "float": "float32"}.get(name, name)  # vLLM's other spellings


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    """Every ``asyncdp serve`` flag, one argument group per section of spec §2."""
    p.add_argument("model_arg", nargs="?", metavar="MODEL", default=None,
                   help=f"built-in model name or Hugging Face checkpoint directory (default: {DEFAULT_MODEL})")
    p.add_argument("--model", default=None, help="same as the positional MODEL")
    _add_topology_flags(p.add_argument_group("data-parallel topology"))
    _add_front_end_flags(p.add_argument_group("front-end and processes"))
    _add_supervisor_flags(p.add_argument_group("multi-port supervisor"))
    _add_tuning_flags(p.add_argument_group("asyncdp data-parallel tuning"))
    _add_engine_flags(p.add_argument_group("engine"))
    _add_vllm_flags(p.add_argument_group("vLLM flags that carry over (docs/reference/cli.md)"))


def _add_topology_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--data-parallel-size", "-dp", type=int, default=None, metavar="N",
                   help="global number of data-parallel ranks (engine replicas) (default: 1)")
    g.add_argument("--data-parallel-size-local", "-dpl", type=int, default=None, metavar="L",
                   help="data-parallel ranks on this node; 0 = API-only head (default: derived)")
    g.add_argument("--data-parallel-rank", "-dpn", type=int, default=None, metavar="R",
                   help="run this process as the single external-LB rank R (MoE models only)")
    g.add_argument("--data-parallel-start-rank", "-dpr", type=int, default=None, metavar="S",
                   help="global rank of the first local rank; selects hybrid LB unless --headless (0 counts too)")
    g.add_argument("--data-parallel-address", "-dpa", default=None, metavar="HOST",
                   help="head-node address for the handshake and the DP process group "
                        "(default: --master-addr, then 127.0.0.1)")
    g.add_argument("--data-parallel-rpc-port", "-dpp", type=int, default=None, metavar="PORT",
                   help=f"head-node TCP handshake port (default: {_D.data_parallel_rpc_port})")
    g.add_argument("--data-parallel-secret-file", default=None, metavar="PATH",
                   help="file holding the deployment secret that authenticates the links between its processes "
                        "(mode 600; every node the same); env ASYNCDP_DP_SECRET holds the secret itself; without "
                        "one, one node draws a fresh secret and several nodes run unauthenticated, with a warning "
                        "(default: none)")
    _choice(g, "--data-parallel-backend", "-dpb", choices=DP_BACKENDS,
            help="process backend; ray is not available in this build (default: mp)")
    _bool(g, "--data-parallel-hybrid-lb", "-dph",
          help="hybrid LB: each node's API servers balance over its own local ranks S..S+L-1 only. "
               "Rank hints (X-data-parallel-rank) are local indices in [0, L) (default: off)")
    _bool(g, "--data-parallel-external-lb", "-dpe",
          help="external LB: one API endpoint per rank, set with --data-parallel-rank (default: off)")
    g.add_argument("--data-parallel-multi-port-external-lb", "-dpm", action="store_true", default=None,
                   help="multi-port supervisor: one child API server per local rank on consecutive ports "
                        "--port .. --port+L-1")
    _bool(g, "--enable-expert-parallel", "-ep",
          help="shard MoE experts by expert across DP x TP ranks (default: off)")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=None, metavar="N",
                   help="tensor-parallel size per rank (default: 1)")
    g.add_argument("--pipeline-parallel-size", "-pp", type=int, default=None, metavar="N",
                   help="pipeline-parallel size per rank (default: 1)")
    g.add_argument("--nnodes", "-n", type=int, default=None, metavar="N",
                   help="number of nodes; lets asyncdp infer this node's ranks (default: 1)")
    g.add_argument("--node-rank", "-r", type=int, default=None, metavar="I",
                   help="index of this node, < --nnodes when --nnodes > 1; with -dpm and no -dpr the node's first "
                        "rank is node-rank x L (default: 0)")
    g.add_argument("--master-addr", default=None, metavar="HOST",
                   help=f"fallback for --data-parallel-address (default: {_D.master_addr})")
    g.add_argument("--master-port", type=int, default=None, metavar="PORT",
                   help=f"rendezvous port of a multi-node TP/PP group, not used for DP (default: {_D.master_port})")
    g.add_argument("--prefill-schedule-interval", type=int, default=None, metavar="N",
                   help="MoE DP prefill cadence in steps; 1 = off (default: 1)")
    g.add_argument("--cpu-distributed-timeout-seconds", type=int, default=None, metavar="S",
                   help="timeout of the CPU (gloo) groups, including the DP control group (default: torch's)")
    _bool(g, "--disable-nccl-for-dp-synchronization",
          help="run the per-forward token-count exchange on the gloo group even on GPU (default: off)")
    g.add_argument("--device-ids", default=None, metavar="IDS",
                   help="devices relative to the visible set, e.g. 0,1,2,3; local rank i uses "
                        "[i*tp*pp, (i+1)*tp*pp)")


def _add_front_end_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--host", default=None, help="HTTP bind host (default: all interfaces)")
    g.add_argument("--port", type=int, default=None,
                   help=f"HTTP port; in multi-port mode the port of local rank 0 (default: {_D.port})")
    g.add_argument("--uds", default=None, metavar="PATH", help="serve HTTP on a Unix domain socket")
    g.add_argument("--headless", action="store_true", default=None,
                   help="engines only: no API server and no coordinator on this node")
    g.add_argument("--api-server-count", "-asc", type=int, default=None, metavar="C",
                   help="API-server processes sharing --port; 0 behaves as --headless (default: per mode)")
    g.add_argument("--shutdown-timeout", dest="shutdown_timeout_s", type=int, default=None, metavar="S",
                   help="0 = abort in-flight requests at shutdown; > 0 = drain for up to S seconds (default: 0)")
    g.add_argument("--ssl-keyfile", default=None, help="TLS key file (requires --ssl-certfile)")
    g.add_argument("--ssl-certfile", default=None, help="TLS certificate file (requires --ssl-keyfile)")
    g.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="model name(s) in the API; the first is reported (default: MODEL)")
    g.add_argument("--max-queued-requests", type=int, default=None, metavar="N",
                   help="admission limit per API server; above it requests get HTTP 429 (default: unlimited)")
    g.add_argument("--max-seqs-per-request", type=int, default=None, metavar="N",
                   help="most sequences one request may run, prompts x max(n, best_of); above it HTTP 400 "
                        f"(default: {_D.max_seqs_per_request})")
    g.add_argument("--max-request-body-bytes", type=int, default=None, metavar="BYTES",
                   help="largest request body, checked before parsing; above it HTTP 413 (default: 64 bytes "
                        "per token of --max-model-len, at least 16 MiB)")
    _bool(g, "--enable-prompt-tokens-details",
          help="add usage.prompt_tokens_details.cached_tokens to chat and completions responses: the prompt "
               "tokens the prefix cache supplied (default: false)")
    g.add_argument("--chat-template", default=None, metavar="FILE|TEMPLATE",
                   help="the chat template to render chat messages with, instead of the tokenizer's: a Jinja file, "
                        "or the template itself (default: the tokenizer's)")
    _choice(g, "--chat-template-content-format", choices=CHAT_TEMPLATE_CONTENT_FORMATS,
            help="how message content reaches the chat template: 'string' (the text), 'openai' (a list of "
                 "{'type': 'text', 'text': ...} parts, for templates that loop over parts); auto reads the "
                 "template to choose (default: auto)")
    _bool(g, "--trust-request-chat-template",
          help="let chat and /tokenize requests render with their own chat_template (a Jinja template run in "
               "the sandbox, a 400 without this flag): only for clients trusted with the server's CPU "
               "(default: false)")
    _bool(g, "--enable-tokenizer-info-endpoint",
          help="serve GET /tokenizer_info, the tokenizer's configuration (its special tokens and chat template), "
               "for clients such as lm-evaluation-harness's remote tokenizer; a 404 without it (default: false)")
    g.add_argument("--enable-auto-tool-choice", action="store_true", default=None,
                   help='serve tool_choice "auto" (and tools without a tool_choice), a 400 without it: the model '
                        "writes freely and --tool-call-parser, which it requires, finds the tool calls in its text "
                        "(default: off)")
    _choice(g, "--tool-call-parser", choices=TOOL_CALL_PARSERS,
            help="the format of the model's tool calls, for --enable-auto-tool-choice: hermes reads "
                 "<tool_call>{json}</tool_call> blocks (Hermes, Qwen) (default: none)")
    _choice(g, "--reasoning-parser", choices=REASONING_PARSERS,
            help="return a reasoning model's thinking (<think>...</think>) in chat answers' "
                 "message.reasoning, apart from their content: qwen3 (Qwen3, QwQ), deepseek_r1 (DeepSeek-R1 "
                 "and its distills) (default: none)")
    for flag, what in (("--allowed-origins", "origins"), ("--allowed-methods", "methods"),
                       ("--allowed-headers", "request headers")):
        g.add_argument(flag, default=None, metavar="JSON",
                       help=f"CORS: the {what} cross-origin requests may use, a JSON list; \"*\" allows any "
                            '(default: ["*"])')
    _bool(g, "--allow-credentials", help="CORS: allow credentials (cookies, Authorization) on cross-origin requests "
                                         "(default: false)")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help="answer 401 unless 'Authorization: Bearer KEY' comes with the request, on every route but "
                        "/health, /ping, /version, /metrics, /load and /openapi.json; the environment variable "
                        "ASYNCDP_API_KEY (or VLLM_API_KEY) keeps it out of the process list (default: no key)")
    _choice(g, "--backend", choices=HTTP_BACKENDS,
            help=f"anyio backend of every process (default: {_D.backend})")
    g.add_argument("--lb-policy", "--dp-lb-policy", dest="lb_policy", default=None,
                   metavar="POLICY",
                   help=f"client load-balancing policy, one of {', '.join(LB_POLICIES)}; "
                        f"env ASYNCDP_DP_LB_POLICY (default: {_D.lb_policy})")
    _choice(g, "--log-level", choices=LOG_LEVELS,
            help=f"log level (default: {_D.log_level})")


def _add_supervisor_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--data-parallel-supervisor-port", type=int, default=None, metavar="PORT",
                   help=f"port of the aggregated /health, /ready, /readyz (default: {_D.data_parallel_supervisor_port})")
    g.add_argument("--dp-supervisor-probe-interval-s", type=float, default=None, metavar="S",
                   help="time between probe rounds, and between retries of a failed connection (default: 5.0)")
    g.add_argument("--dp-supervisor-probe-timeout-s", type=float, default=None, metavar="S",
                   help="request timeout: total time of one probe HTTP request, connect plus response "
                        "(default: 5.0)")
    g.add_argument("--dp-supervisor-probe-failure-threshold", type=int, default=None, metavar="N",
                   help="connection attempts per probe once the node is ready; 1 before (default: 3)")


def _add_tuning_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--dp-sync-interval", type=int, default=None, metavar="STEPS",
                   help="MoE: steps between group 'unfinished' all-reduces; env ASYNCDP_DP_SYNC_INTERVAL "
                        f"(default: {_D.dp_sync_interval})")
    g.add_argument("--dp-coordinator-startup-timeout-s", type=float, default=None, metavar="S",
                   help="time allowed for the coordinator to report its addresses; env "
                        f"ASYNCDP_DP_COORDINATOR_STARTUP_TIMEOUT_S (default: {_D.dp_coordinator_startup_timeout_s})")
    g.add_argument("--engine-ready-timeout-s", type=float, default=None, metavar="S",
                   help="time a client waits for EngineReady from all its ranks; env ASYNCDP_ENGINE_READY_TIMEOUT_S, "
                        f"then VLLM_ENGINE_READY_TIMEOUT_S (default: {_D.engine_ready_timeout_s})")
    g.add_argument("--dp-heartbeat-interval-s", type=float, default=None, metavar="S",
                   help="interval of liveness heartbeats; env ASYNCDP_DP_HEARTBEAT_INTERVAL_S "
                        f"(default: {_D.dp_heartbeat_interval_s})")
    g.add_argument("--dp-heartbeat-timeout-s", type=float, default=None, metavar="S",
                   help="silence after which a peer is dead, > 2x the interval; env ASYNCDP_DP_HEARTBEAT_TIMEOUT_S "
                        f"(default: {_D.dp_heartbeat_timeout_s})")
    _bool(g, "--dp-fail-fast",
          help="dense only: tear the deployment down when any rank dies instead of degrading (default: off)")


def _add_engine_flags(g: argparse._ArgumentGroup) -> None:
    e = _D.engine
    g.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model's)")
    g.add_argument("--max-num-seqs", type=int, default=None, metavar="N",
                   help=f"most sequences per step (default: {e.max_num_seqs})")
    g.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None, metavar="N",
                   help=f"most tokens per step (default: {e.max_num_batched_tokens})")
    g.add_argument("--max-model-len", type=human_readable_int, default=None, metavar="N",
                   help="longest prompt plus output, in tokens (default: the model's limit)")
    g.add_argument("--block-size", type=int, default=None, metavar="N", help=f"KV-cache block size (default: {e.block_size})")
    g.add_argument("--num-kv-blocks", "--num-gpu-blocks-override", dest="num_kv_blocks", type=int, default=None,
                   metavar="N", help="KV-cache blocks per rank (default: from --kv-cache-memory-bytes)")
    g.add_argument("--kv-cache-memory-bytes", type=human_readable_int, default=None, metavar="BYTES",
                   help=f"KV-cache memory per rank when --num-kv-blocks is not given, capped at what --max-num-seqs "
                        f"full-length sequences use (default: {e.kv_cache_memory_bytes})")
    _bool(g, "--enable-prefix-caching", help="reuse cached KV blocks of shared prompt prefixes (default: on)")
    g.add_argument("--seed", type=int, default=None, help=f"sampling seed (default: {e.seed})")
    g.add_argument("--dtype", type=_dtype, default=None, metavar="{auto,half,float16,bfloat16,float,float32}",
                   help="model weight and activation dtype; half is float16, float is float32 (default: auto)")
    g.add_argument("--device", default=None, metavar="{auto,cpu,cuda}",
                   help="execution device (default: auto)")
    g.add_argument("--executor", default=None, metavar="{torch,sim}",
                   help="torch runs the model; sim simulates step times with --sim-cost (default: torch)")
    g.add_argument("--sim-cost", default=None, metavar="A,B,C,D[,E]",
                   help="sim step time in ms: a + b*prefill_tokens + c*decode_seqs + d*kv_tokens "
                        "(+ e*sum of p*(c0 + p/2) over the prefill chunks of p tokens after c0 of context)")
    g.add_argument("--torch-threads", type=int, default=None, metavar="N",
                   help="torch intra-op threads per engine (default: the node's cores divided among its engines)")
    _choice(g, "--scheduling-policy", choices=ENGINE_CHOICES["scheduling_policy"],
            help="how a rank orders its waiting requests and whom it preempts: fcfs by arrival, priority by "
                 f"the requests' priority (lower first), then arrival (default: {e.scheduling_policy})")


def _add_vllm_flags(g: argparse._ArgumentGroup) -> None:
    """vLLM's flags beyond data parallelism (asyncdp.config.vllm_flags): honoured, accepted without effect, or
    refused (exit 2) for a value this build cannot honour."""
    v = _D.vllm
    g.add_argument("--max-logprobs", type=int, default=None, metavar="N",
                   help=f"most logprobs, top_logprobs and prompt_logprobs a request may ask; above it HTTP 400; -1: "
                        f"the vocabulary's size (default: {v.max_logprobs})")
    g.add_argument("--gpu-memory-utilization", type=float, default=None, metavar="F",
                   help="share of a CUDA device's memory for the weights and the KV cache, which takes what the "
                        "weights leave of it; no effect on CPU (default: unset, --kv-cache-memory-bytes sizes the "
                        "KV cache; vLLM's is 0.9)")
    _choice(g, "--uvicorn-log-level", choices=UVICORN_LOG_LEVELS,
            help="log level of the API servers' HTTP server (logger asyncdp.http); trace is debug "
                 "(default: --log-level)")
    _bool(g, "--enable-log-requests", help="log one INFO line per prompt of each request accepted (default: off)")
    _bool(g, "--disable-log-requests", help="deprecated in vLLM and without effect there and here (default: on)")
    g.add_argument("--max-log-len", type=int, default=None, metavar="N",
                   help="most prompt token ids a request's log line shows (default: all)")
    g.add_argument("--generation-config", default=None, metavar="{auto,vllm,FOLDER}",
                   help="the sampling defaults of requests that leave them unset: auto, those of the model's "
                        "generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens "
                        "as max_tokens); vllm, none; a folder, its generation_config.json's, whose max_new_tokens "
                        f"also caps every request's max_tokens (default: {v.generation_config})")
    g.add_argument("--override-generation-config", default=None, metavar="JSON",
                   help="a JSON object of generation_config.json fields that override or add to those defaults "
                        "(with vllm too); its max_new_tokens caps every request's max_tokens (default: {})")
    _bool(g, "--trust-remote-code", help="accepted; asyncdp never runs a checkpoint's code (default: off)")
    _bool(g, "--enable-log-outputs", help="with --enable-log-requests, also log one INFO line per choice generated "
                                          "(each delta of a stream, then the whole) (default: off)")
    _choice(g, "--all2all-backend", choices=ALL2ALL_BACKENDS,
            help="allgather_reducescatter (naive, pplx: the same, as in vLLM) names the exchange of MoE ranks "
                 "without --enable-expert-parallel, which is refused with it; the kernel libraries are refused "
                 "(default: asyncdp's exchange)")
    _choice(g, "--expert-placement-strategy", choices=EXPERT_PLACEMENT_STRATEGIES,
            help="linear: each expert-parallel rank holds a contiguous block of experts; round_robin is refused "
                 f"with --enable-expert-parallel (default: {v.expert_placement_strategy})")
    _bool(g, "--enforce-eager", help="no effect: asyncdp captures no CUDA graphs (default: off)")
    _bool(g, "--enable-chunked-prefill",
          help="no effect: prompts are always chunked; --no-enable-chunked-prefill is refused (default: on)")
    g.add_argument("--max-seq-len-to-capture", type=int, default=None, metavar="N",
                   help=f"no effect: no CUDA graphs (default: {v.max_seq_len_to_capture})")
    g.add_argument("--compilation-config", "-O", default=None, metavar="JSON|LEVEL",
                   help="no effect: asyncdp compiles nothing (default: {})")
    _bool(g, "--async-scheduling", help="no effect on any output (default: off)")
    g.add_argument("--swap-space", type=float, default=None, metavar="GIB",
                   help=f"no effect: preempted requests are recomputed (default: {v.swap_space})")
    _choice(g, "--distributed-executor-backend", choices=DISTRIBUTED_EXECUTOR_BACKENDS,
            help="mp and uni: no effect; the others are refused (default: none)")
    _choice(g, "--tokenizer-mode", choices=TOKENIZER_MODES,
            help=f"auto and hf: no effect; the others are refused (default: {v.tokenizer_mode})")
    _choice(g, "--kv-cache-dtype", choices=KV_CACHE_DTYPES,
            help=f"auto: the model's dtype; the others are refused (default: {v.kv_cache_dtype})")
    g.add_argument("--load-format", default=None, metavar="FORMAT",
                   help=f"auto and safetensors: no effect; the others are refused (default: {v.load_format})")
    g.add_argument("--download-dir", default=None, metavar="DIR",
                   help="no effect: asyncdp never downloads (default: none)")
    g.add_argument("--cpu-offload-gb", type=float, default=None, metavar="GIB",
                   help="0: no effect; more is refused (default: 0)")
    _bool(g, "--calculate-kv-scales", help="no effect: the KV cache is never fp8 (default: off)")
    g.add_argument("--quantization", "-q", default=None, metavar="METHOD",
                   help="refused: asyncdp runs unquantized weights (default: none)")
    g.add_argument("--disable-log-stats", action="store_true", default=None,
                   help="no effect: asyncdp logs no periodic stats (they are on /metrics)")
    _bool(g, "--disable-uvicorn-access-log", help="no effect: asyncdp writes no access log (default: off)")
    _bool(g, "--disable-custom-all-reduce", help="no effect: no tensor parallelism (default: off)")
    _add_moe_and_model_flags(g)


def _add_moe_and_model_flags(g: argparse._ArgumentGroup) -> None:
    """The rest of the carried-over flags: MoE command lines' (no effect: asyncdp moves no expert, splits no batch),
    and those of the model and its KV cache, accepted where they ask nothing asyncdp lacks."""
    v = _D.vllm
    _bool(g, "--enable-eplb", help="no effect: asyncdp moves and replicates no expert; needs --enable-expert-parallel "
                                   "(default: off)")
    g.add_argument("--eplb-config", default=None, metavar="JSON",
                   help="no effect: window_size, step_interval, num_redundant_experts (needs --enable-eplb), "
                        "log_balancedness, ... (default: {})")
    _bool(g, "--enable-dbo", help="no effect: each step runs as one batch (default: off)")
    g.add_argument("--dbo-decode-token-threshold", type=int, default=None, metavar="N",
                   help=f"no effect (default: {v.dbo_decode_token_threshold})")
    g.add_argument("--dbo-prefill-token-threshold", type=int, default=None, metavar="N",
                   help=f"no effect (default: {v.dbo_prefill_token_threshold})")
    for flag, what in (("--revision", "the model's"), ("--code-revision", "the model code's"),
                       ("--tokenizer-revision", "the tokenizer's")):
        g.add_argument(flag, type=_nullable, default=None, metavar="REV",
                       help=f"no effect: {what} revision on the Hugging Face Hub; asyncdp reads local directories "
                            "as they are (default: none)")
    g.add_argument("--max-cudagraph-capture-size", type=int, default=None, metavar="N",
                   help="no effect: no CUDA graphs (default: none)")
    g.add_argument("--cudagraph-capture-sizes", "--cuda-graph-sizes", dest="cudagraph_capture_sizes", type=int,
                   nargs="+", default=None, metavar="N", help="no effect: no CUDA graphs (default: none)")
    _bool(g, "--disable-cascade-attn", help="no effect: asyncdp has no cascade attention (default: off)")
    g.add_argument("--hf-overrides", default=None, metavar="JSON",
                   help="{}: no effect; an override of config.json is refused (default: {})")
    g.add_argument("--kv-transfer-config", default=None, metavar="JSON",
                   help="refused with a kv_connector: asyncdp has no KV connector (default: none)")
    g.add_argument("--kv-events-config", default=None, metavar="JSON",
                   help="refused with enable_kv_cache_events: asyncdp publishes no KV cache events (default: none)")
    g.add_argument("--limit-mm-per-prompt", default=None, metavar="JSON",
                   help="every modality 0: no effect on a text-only model; a media count is refused (default: {})")
