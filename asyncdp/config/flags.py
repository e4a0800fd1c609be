"""The flags of ``asyncdp serve`` and the engine's configuration, and all validation of user input.

This is the only module that reads ``os.environ``. Every check raises :class:`~asyncdp.errors.ConfigError` with a
message that names the flag, its value and what to change.

Theory of operation (spec §2, §3, §4.1):

* :class:`EngineConfig` is what one rank's engine core needs.
* :class:`ServeConfig` holds every ``asyncdp serve`` flag, one field per flag, named after the flag (``None`` =
  not given). :meth:`ServeConfig.from_flags` builds it from a flag mapping plus the environment (the §2.4 env
  overrides apply only where the flag was not given) and runs the per-flag range checks (V13).
* :func:`asyncdp.config.deployment.resolve` (its own module, which imports this one and never the other way) is
  the pure mode derivation that turns a ServeConfig into a :class:`~asyncdp.config.deployment.DeploymentConfig`.
* The configuration agreement across ranks and launches (``Ready.config_hash``, ``NodeHello``, E6) is in
  :mod:`asyncdp.config.summary`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncdp.config.choices import (  # (defined there, importable from here as before)
    CHAT_TEMPLATE_CONTENT_FORMATS,
    DEFAULT_LB_POLICY,
    DEFAULT_MAX_SEQS_PER_REQUEST,
    DP_BACKENDS,
    ENGINE_CHOICES,
    HTTP_BACKENDS,
    LB_POLICIES,
    LOG_LEVELS,
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
)
from asyncdp.config.choices import DEFAULT_SIM_KV_BLOCKS as DEFAULT_SIM_KV_BLOCKS
from asyncdp.config.choices import MODES as MODES
from asyncdp.config.choices import default_max_request_body_bytes as default_max_request_body_bytes
from asyncdp.config.files import read_secret_file
from asyncdp.errors import ConfigError

DEFAULT_MODEL = "builtin:tiny-moe"


@dataclass(frozen=True, slots=True)
class SimCostProfile:
    """Step-time model of the simulated executor (ms): ``a + b*prefill_tokens + c*decode_seqs + d*kv_tokens +
    e*Σ p*(c0 + p/2)``, the last sum over the step's prefill chunks of ``p`` tokens after ``c0`` of context
    (prefill attention, quadratic in the chunk: routing-bench §5; 0 unless a profile turns it on)."""

    a_ms: float = 0.0
    b_ms_per_token: float = 0.0
    c_ms_per_seq: float = 0.0
    d_ms_per_kv_token: float = 0.0
    e_ms_per_token_pair: float = 0.0

    @classmethod
    def parse(cls, text: str) -> SimCostProfile:
        """Parse ``--sim-cost "a,b,c,d[,e]"`` (milliseconds)."""
        parts = [p.strip() for p in text.split(",")]
        try:
            values = [float(p) for p in parts]
        except ValueError:
            values = []
        if len(values) not in (4, 5) or any(v < 0 for v in values):
            raise ConfigError(f"--sim-cost must be four or five non-negative numbers 'a,b,c,d[,e]' in ms "
                              f"(got {text!r}).")
        return cls(*values)


# EngineConfig's annotations (strings, under ``from __future__ import annotations``) -> the type its value must have.
_FIELD_TYPES: dict[str, type] = {"int": int, "int | None": int, "bool": bool, "str": str, "str | None": str}


def _is(kind: type, value: object) -> bool:
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))  # True is no count


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything one rank's engine core needs. Shared by the offline ``LLM`` and the engine process."""

    model: str = DEFAULT_MODEL
    tokenizer: str | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: the model's own limit
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: derived from kv_cache_memory_bytes
    kv_cache_memory_bytes: int = 1 << 30
    enable_prefix_caching: bool = True
    executor: str = "torch"  # "torch" | "sim"
    sim_cost: SimCostProfile = SimCostProfile()
    seed: int = 0
    dtype: str = "auto"  # "auto" | "float32" | "bfloat16" | "float16"
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    torch_threads: int | None = None  # None: leave torch's default
    scheduling_policy: str = "fcfs"  # SCHEDULING_POLICIES

    def replace(self, **changes: object) -> EngineConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def validate(self) -> EngineConfig:
        def need(cond: bool, flag: str, allowed: str, value: object) -> None:
            if not cond:
                raise ConfigError(f"{flag} must be {allowed} (got {value!r}).")

        for field in dataclasses.fields(self):  # LLM(**engine_args) passes Python values: types first
            kind = _FIELD_TYPES.get(str(field.type))
            value = getattr(self, field.name)
            if kind is not None and not (value is None and "None" in str(field.type) or _is(kind, value)):
                flag = "--" + field.name.replace("_", "-")
                raise ConfigError(f"{field.name} ({flag}) must be {kind.__name__}"
                                  f"{' or None' if 'None' in str(field.type) else ''} (got {value!r}).")
        need(self.max_num_seqs >= 1, "--max-num-seqs", ">= 1", self.max_num_seqs)
        need(self.max_num_batched_tokens >= 1, "--max-num-batched-tokens", ">= 1", self.max_num_batched_tokens)
        need(self.max_model_len is None or self.max_model_len >= 2, "--max-model-len", ">= 2", self.max_model_len)
        need(self.block_size in (1, 2, 4, 8, 16, 32, 64, 128), "--block-size", "a power of two in [1, 128]",
             self.block_size)
        need(self.num_kv_blocks is None or self.num_kv_blocks >= 2, "--num-kv-blocks",
             ">= 2 (block 0 is the engine's scratch block)", self.num_kv_blocks)
        need(self.kv_cache_memory_bytes >= 1, "--kv-cache-memory-bytes", ">= 1", self.kv_cache_memory_bytes)
        for f, choices in ENGINE_CHOICES.items():  # --executor, --dtype, --device, --scheduling-policy
            need(getattr(self, f) in choices, "--" + f.replace("_", "-"), "one of " + ", ".join(choices), getattr(self, f))
        need(self.torch_threads is None or self.torch_threads >= 1, "--torch-threads", ">= 1", self.torch_threads)
        cost = self.sim_cost  # SimCostProfile.parse checks the flag's text; a profile built in Python is checked here
        need(isinstance(cost, SimCostProfile) and all(
            isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < math.inf
            for v in dataclasses.astuple(cost)), "sim_cost (--sim-cost)",
             "a SimCostProfile of non-negative finite numbers (ms)", cost)
        return self


def environ() -> Mapping[str, str]:
    """The process environment; the one accessor other modules use instead of ``os.environ``."""
    return os.environ


def cache_dir() -> Path:
    """Where built-in models are materialised: ``$ASYNCDP_CACHE_DIR``, else ``~/.cache/asyncdp``."""
    value = os.environ.get("ASYNCDP_CACHE_DIR")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "asyncdp"


# ---------------------------------------------------------------- serve flags

# §2.4: field -> (env variables in priority order, parser). A given flag always wins over the environment.
ENV_OVERRIDES: dict[str, tuple[tuple[str, ...], type]] = {
    "lb_policy": (("ASYNCDP_DP_LB_POLICY",), str),
    "dp_sync_interval": (("ASYNCDP_DP_SYNC_INTERVAL",), int),
    "dp_coordinator_startup_timeout_s": (("ASYNCDP_DP_COORDINATOR_STARTUP_TIMEOUT_S",), float),
    "engine_ready_timeout_s": (("ASYNCDP_ENGINE_READY_TIMEOUT_S", "VLLM_ENGINE_READY_TIMEOUT_S"), float),
    "dp_heartbeat_interval_s": (("ASYNCDP_DP_HEARTBEAT_INTERVAL_S",), float),
    "dp_heartbeat_timeout_s": (("ASYNCDP_DP_HEARTBEAT_TIMEOUT_S",), float),
    "api_key": (("ASYNCDP_API_KEY", "VLLM_API_KEY"), str),
}
KEEP_ALIVE_ENV = ("ASYNCDP_KEEP_ALIVE_ON_ENGINE_DEATH", "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH")
SERVER_DEV_MODE_ENV = ("ASYNCDP_SERVER_DEV_MODE", "VLLM_SERVER_DEV_MODE")  # =1: vLLM's dev routes (reset_prefix_cache)
# Set by the multi-port supervisor (§11.3) in the environment of each child it starts: the child's global rank.
# Internal (no flag, not a user override): it makes the child name itself asyncdp-api-dp{r}, log as APIServer_DP{r}.
SUPERVISED_RANK_ENV = "ASYNCDP_SUPERVISED_RANK"
# The deployment secret of the links between its processes (--data-parallel-secret-file wins over it). Never logged.
DP_SECRET_ENV = "ASYNCDP_DP_SECRET"
# Variables that hold a secret: a launcher's children get what they need of them in their role config, so none
# is left in their environments (readable in /proc by the same user, and by any library that dumps the environment).
SECRET_ENVS = frozenset({DP_SECRET_ENV, *ENV_OVERRIDES["api_key"][0]})
_API_KEY = re.compile(r"[\x21-\x7e]{1,4096}")


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Every ``asyncdp serve`` flag, one field each (spec §2). Resolved, it becomes a
    :class:`~asyncdp.config.deployment.ResolvedServeConfig` (this module does not know the deployment)."""

    model: str = DEFAULT_MODEL
    engine: EngineConfig = EngineConfig()
    # §2.1 data-parallel topology (None = not given; pass 2 derives it)
    data_parallel_size: int = 1
    data_parallel_size_local: int | None = None
    data_parallel_rank: int | None = None
    data_parallel_start_rank: int | None = None
    data_parallel_address: str | None = None
    data_parallel_rpc_port: int = 29550
    # the deployment secret's file; the secret (from it or the environment, by from_flags) is never logged
    data_parallel_secret_file: str | None = None
    data_parallel_secret: bytes | None = dataclasses.field(default=None, repr=False)
    data_parallel_backend: str = "mp"
    data_parallel_hybrid_lb: bool = False
    data_parallel_external_lb: bool = False
    data_parallel_multi_port_external_lb: bool = False
    enable_expert_parallel: bool = False
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    prefill_schedule_interval: int = 1
    cpu_distributed_timeout_seconds: int | None = None
    disable_nccl_for_dp_synchronization: bool = False
    device_ids: tuple[int, ...] | None = None
    # §2.2 front-end and process
    host: str | None = None
    port: int = 8000
    uds: str | None = None
    headless: bool = False
    api_server_count: int | None = None
    shutdown_timeout_s: int = 0
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    served_model_name: tuple[str, ...] = ()  # empty: the model argument
    max_queued_requests: int | None = None  # None: unlimited; above it HTTP 429
    max_seqs_per_request: int = DEFAULT_MAX_SEQS_PER_REQUEST
    max_request_body_bytes: int | None = None  # None: default_max_request_body_bytes(max_model_len)
    enable_prompt_tokens_details: bool = False  # usage.prompt_tokens_details.cached_tokens (vLLM's flag)
    chat_template: str | None = dataclasses.field(default=None, repr=False)  # --chat-template (cli: its text)
    chat_template_content_format: str = "auto"  # CHAT_TEMPLATE_CONTENT_FORMATS
    trust_request_chat_template: bool = False  # chat requests may bring their own chat_template (vLLM's flag)
    enable_tokenizer_info_endpoint: bool = False  # GET /tokenizer_info (vLLM's flag); off: a 404
    enable_auto_tool_choice: bool = False  # tool_choice "auto" parsed by tool_call_parser (which it requires)
    tool_call_parser: str | None = None  # TOOL_CALL_PARSERS
    reasoning_parser: str | None = None  # REASONING_PARSERS: chat answers' thinking in message.reasoning
    allowed_origins: tuple[str, ...] = ("*",)  # CORS (--allowed-origins ...): "*" allows any
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    # --api-key (ASYNCDP_API_KEY): every HTTP route but the probes wants "Authorization: Bearer KEY"; never logged
    api_key: str | None = dataclasses.field(default=None, repr=False)
    backend: str = "asyncio"
    lb_policy: str = DEFAULT_LB_POLICY
    log_level: str = "info"
    # §2.3 multi-port supervisor
    data_parallel_supervisor_port: int = 9256
    dp_supervisor_probe_interval_s: float = 5.0
    dp_supervisor_probe_timeout_s: float = 5.0  # total time of one probe request (connect plus response)
    dp_supervisor_probe_failure_threshold: int = 3
    # §2.4 asyncdp-only
    dp_sync_interval: int = 32
    dp_coordinator_startup_timeout_s: float = 120.0
    engine_ready_timeout_s: float = 600.0
    dp_heartbeat_interval_s: float = 1.0
    dp_heartbeat_timeout_s: float = 5.0
    dp_fail_fast: bool = False
    keep_alive_on_engine_death: bool = False
    server_dev_mode: bool = False  # env SERVER_DEV_MODE_ENV=1: POST /reset_prefix_cache is served (else a 404)
    supervised_rank: int | None = None  # env ASYNCDP_SUPERVISED_RANK: this server is a multi-port child

    @property
    def served_model_names(self) -> tuple[str, ...]:
        return self.served_model_name or (self.model,)

    def replace(self, **changes: object) -> ServeConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> ServeConfig:
        """Build and validate from ``{field: value}`` (None = flag not given), applying §2.4 env overrides.

        Keys are ServeConfig or EngineConfig field names; ``sim_cost`` may be the ``"a,b,c,d"`` string.
        """
        env = os.environ if env is None else env
        serve_fields = {f.name for f in dataclasses.fields(cls)} - {"engine"}
        engine_fields = {f.name for f in dataclasses.fields(EngineConfig)}
        unknown = set(flags) - serve_fields - engine_fields
        if unknown:
            raise TypeError(f"unknown flag fields: {sorted(unknown)}")
        given = {k: v for k, v in flags.items() if v is not None}
        serve = {k: v for k, v in given.items() if k in serve_fields}
        engine = {k: v for k, v in given.items() if k in engine_fields and k not in serve_fields}
        if isinstance(engine.get("sim_cost"), str):
            engine["sim_cost"] = SimCostProfile.parse(engine["sim_cost"])
        for name, (variables, parse) in ENV_OVERRIDES.items():
            if name in serve:
                continue
            for var in variables:
                raw = env.get(var, "").strip()
                if raw:
                    try:
                        serve[name] = parse(raw)
                    except ValueError:
                        raise ConfigError(f"environment variable {var}={raw!r} is not a valid "
                                          f"{parse.__name__}.") from None
                    break
        if "keep_alive_on_engine_death" not in serve:
            serve["keep_alive_on_engine_death"] = any(env.get(v, "").strip() == "1" for v in KEEP_ALIVE_ENV)
        if "server_dev_mode" not in serve:
            serve["server_dev_mode"] = any(env.get(v, "").strip() == "1" for v in SERVER_DEV_MODE_ENV)
        if serve.get("data_parallel_secret_file") is not None:
            serve["data_parallel_secret"] = read_secret_file(serve["data_parallel_secret_file"])
        elif "data_parallel_secret" not in serve and (raw := env.get(DP_SECRET_ENV, "").strip()):
            serve["data_parallel_secret"] = raw.encode()
        if "supervised_rank" not in serve and (raw := env.get(SUPERVISED_RANK_ENV, "").strip()):
            try:
                serve["supervised_rank"] = int(raw)
            except ValueError:
                raise ConfigError(f"environment variable {SUPERVISED_RANK_ENV}={raw!r} is not a valid int.") from None
        for key in ("device_ids", "served_model_name"):
            if key in serve:
                serve[key] = tuple(serve[key])
        model = serve.get("model", DEFAULT_MODEL)
        return cls(engine=EngineConfig(model=model, **engine), **serve).validate()

    def validate(self) -> ServeConfig:
        """Per-flag range checks (V13 and friends). Cross-flag rules live in :func:`resolve`."""

        def need(cond: bool, flag: str, allowed: str, value: object) -> None:
            if not cond:
                raise ConfigError(f"{flag} must be {allowed} (got {value!r}).")

        def optional_min(value: int | None, flag: str, low: int) -> None:
            need(value is None or value >= low, flag, f">= {low}", value)

        need(self.data_parallel_backend in DP_BACKENDS, "--data-parallel-backend", "one of mp, ray",
             self.data_parallel_backend)
        need(self.data_parallel_size >= 1, "--data-parallel-size", ">= 1", self.data_parallel_size)
        optional_min(self.data_parallel_size_local, "--data-parallel-size-local", 0)
        optional_min(self.data_parallel_rank, "--data-parallel-rank", 0)
        optional_min(self.data_parallel_start_rank, "--data-parallel-start-rank", 0)
        need(1 <= self.data_parallel_rpc_port <= 65535, "--data-parallel-rpc-port", "in 1..65535",
             self.data_parallel_rpc_port)
        need(self.tensor_parallel_size >= 1, "--tensor-parallel-size", ">= 1", self.tensor_parallel_size)
        need(self.pipeline_parallel_size >= 1, "--pipeline-parallel-size", ">= 1", self.pipeline_parallel_size)
        need(self.nnodes >= 1, "--nnodes", ">= 1", self.nnodes)
        need(self.node_rank >= 0, "--node-rank", ">= 0", self.node_rank)
        need(1 <= self.master_port <= 65535, "--master-port", "in 1..65535", self.master_port)
        need(self.prefill_schedule_interval >= 1, "--prefill-schedule-interval", ">= 1",
             self.prefill_schedule_interval)
        optional_min(self.cpu_distributed_timeout_seconds, "--cpu-distributed-timeout-seconds", 1)
        need(self.device_ids is None or (len(self.device_ids) > 0 and min(self.device_ids) >= 0),
             "--device-ids", "a non-empty list of device indices >= 0", self.device_ids)
        need(0 <= self.port <= 65535, "--port", "in 0..65535", self.port)
        optional_min(self.api_server_count, "--api-server-count", 0)
        need(self.shutdown_timeout_s >= 0, "--shutdown-timeout", ">= 0", self.shutdown_timeout_s)
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):  # M2 applies to every mode
            raise ConfigError("--ssl-keyfile and --ssl-certfile must be provided together.")
        optional_min(self.max_queued_requests, "--max-queued-requests", 1)
        need(1 <= self.max_seqs_per_request <= 2**31 - 1, "--max-seqs-per-request", "in 1..2147483647",
             self.max_seqs_per_request)
        optional_min(self.max_request_body_bytes, "--max-request-body-bytes", 1024)
        if self.api_key is not None and not _API_KEY.fullmatch(self.api_key):  # (its value is never echoed)
            raise ConfigError(f"--api-key (ASYNCDP_API_KEY) must be 1 to 4096 printable ASCII characters without "
                              f"spaces, as an Authorization header carries it (got {len(self.api_key)} characters).")
        need(self.chat_template_content_format in CHAT_TEMPLATE_CONTENT_FORMATS, "--chat-template-content-format",
             "one of " + ", ".join(CHAT_TEMPLATE_CONTENT_FORMATS), self.chat_template_content_format)
        need(self.tool_call_parser in (None, *TOOL_CALL_PARSERS), "--tool-call-parser",
             "one of " + ", ".join(TOOL_CALL_PARSERS), self.tool_call_parser)
        need(self.reasoning_parser in (None, *REASONING_PARSERS), "--reasoning-parser",
             "one of " + ", ".join(REASONING_PARSERS), self.reasoning_parser)
        need(self.backend in HTTP_BACKENDS, "--backend", "one of " + ", ".join(HTTP_BACKENDS), self.backend)
        need(self.lb_policy.partition("@")[0] in LB_POLICIES, "--lb-policy (--dp-lb-policy, ASYNCDP_DP_LB_POLICY)",
             "one of " + ", ".join(LB_POLICIES), self.lb_policy)
        need(self.log_level in LOG_LEVELS, "--log-level", "one of " + ", ".join(LOG_LEVELS), self.log_level)
        need(1 <= self.data_parallel_supervisor_port <= 65535, "--data-parallel-supervisor-port",
             "in 1..65535", self.data_parallel_supervisor_port)
        need(self.dp_supervisor_probe_interval_s > 0, "--dp-supervisor-probe-interval-s", "> 0",
             self.dp_supervisor_probe_interval_s)
        need(self.dp_supervisor_probe_timeout_s > 0, "--dp-supervisor-probe-timeout-s", "> 0",
             self.dp_supervisor_probe_timeout_s)
        need(self.dp_supervisor_probe_failure_threshold >= 1, "--dp-supervisor-probe-failure-threshold",
             ">= 1", self.dp_supervisor_probe_failure_threshold)
        optional_min(self.supervised_rank, SUPERVISED_RANK_ENV, 0)
        need(self.dp_sync_interval >= 1, "--dp-sync-interval", ">= 1", self.dp_sync_interval)
        need(self.dp_coordinator_startup_timeout_s > 0, "--dp-coordinator-startup-timeout-s", "> 0",
             self.dp_coordinator_startup_timeout_s)
        need(self.engine_ready_timeout_s > 0, "--engine-ready-timeout-s", "> 0", self.engine_ready_timeout_s)
        need(self.dp_heartbeat_interval_s > 0, "--dp-heartbeat-interval-s", "> 0", self.dp_heartbeat_interval_s)
        if not self.dp_heartbeat_timeout_s > 2 * self.dp_heartbeat_interval_s:
            raise ConfigError(
                f"--dp-heartbeat-timeout-s must be greater than 2 x --dp-heartbeat-interval-s "
                f"(got {self.dp_heartbeat_timeout_s} <= 2 x {self.dp_heartbeat_interval_s}).")
        self.engine.validate()
        return self


def json_strings(flag: str, raw: str) -> tuple[str, ...]:
    """A JSON list of non-empty strings (vLLM's form of the CORS flags), or a ConfigError naming ``flag``."""
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f'{flag} must be a JSON list of non-empty strings such as \'["*"]\' (got {raw!r}).')
    return tuple(value)


def prometheus_multiproc_dir() -> str | None:
    """The directory of Prometheus multiprocess mode (env ``PROMETHEUS_MULTIPROC_DIR``), or None.

    prometheus_client reads the same variable when it is first imported, so launchers set it in the
    environment of their children before those start.
    """
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
