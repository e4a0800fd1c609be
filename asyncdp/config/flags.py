"""The flags of ``asyncdp serve`` and the engine's configuration, and all validation of user input.

This is the only module that reads ``os.environ``. Every check raises :class:`~asyncdp.errors.ConfigError` with a
message that names the flag, its value and what to change.

Theory of operation (spec §2, §3, §4.1):

* :class:`EngineConfig` is what one rank's engine core needs (defined in :mod:`asyncdp.config.engine_config`).
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
    HTTP_BACKENDS,
    LB_POLICIES,
    LOG_LEVELS,
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
)
from asyncdp.config.choices import DEFAULT_SIM_KV_BLOCKS as DEFAULT_SIM_KV_BLOCKS
from asyncdp.config.choices import ENGINE_CHOICES as ENGINE_CHOICES
from asyncdp.config.choices import MODES as MODES
from asyncdp.config.choices import default_max_request_body_bytes as default_max_request_body_bytes
from asyncdp.config.engine_config import DEFAULT_MODEL as DEFAULT_MODEL
from asyncdp.config.engine_config import EngineConfig as EngineConfig
from asyncdp.config.engine_config import SimCostProfile as SimCostProfile
from asyncdp.config.files import read_secret_file
from asyncdp.config.vllm_flags import VllmFlags
from asyncdp.errors import ConfigError


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
    # vLLM's flags beyond data parallelism that carry over (honoured, accepted without effect, or refused)
    vllm: VllmFlags = VllmFlags()

    @property
    def served_model_names(self) -> tuple[str, ...]:
        return self.served_model_name or (self.model,)

    def replace(self, **changes: object) -> ServeConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> ServeConfig:
        """Build and validate from ``{field: value}`` (None = flag not given), applying §2.4 env overrides.

        Keys are ServeConfig, EngineConfig or VllmFlags field names; ``sim_cost`` may be the ``"a,b,c,d"`` string.
        """
        env = os.environ if env is None else env
        serve_fields = {f.name for f in dataclasses.fields(cls)} - {"engine", "vllm"}
        engine_fields = {f.name for f in dataclasses.fields(EngineConfig)}
        vllm_fields = {f.name for f in dataclasses.fields(VllmFlags)}
        unknown = set(flags) - serve_fields - engine_fields - vllm_fields
        if unknown:
            raise TypeError(f"unknown flag fields: {sorted(unknown)}")
        given = {k: v for k, v in flags.items() if v is not None}
        serve = {k: v for k, v in given.items() if k in serve_fields}
        engine = {k: v for k, v in given.items() if k in engine_fields and k not in serve_fields}
        if "kv_cache_memory_bytes" in engine:  # (as in vLLM: a given KV size wins over the memory share)
            engine.pop("gpu_memory_utilization", None)
        vllm = VllmFlags(**{k: v for k, v in given.items() if k in vllm_fields})
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
        return cls(engine=EngineConfig(model=model, **engine), vllm=vllm, **serve).validate()

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
        self.vllm.validate()
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
