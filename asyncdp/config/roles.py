"""Each process role's frozen configuration, derived from the resolved deployment (no dict payloads).

Theory of operation
-------------------
:class:`LaunchPlan` is what ``asyncdp serve`` resolved before anything starts: the flags, the model's facts
(path, tokenizer, context length) and the :class:`~asyncdp.config.deployment.DeploymentConfig`. The launcher
derives one role config per child from it with :func:`coordinator_role`, :func:`engine_role` and
:func:`api_server_role`; the configs are frozen msgspec structs, tagged by class name (:data:`RoleConfig`), so
they travel inside the worker hello of the control channel (:mod:`asyncdp.messages`) through the one codec, and
a child that gets the wrong role or a malformed config fails with a :class:`~asyncdp.errors.ProtocolError`.
Each role's process main turns its role config into the role's own runtime config (``CoordinatorConfig``,
``RankConfig``, ``ApiConfig``); this module imports no role. Every role config carries the deployment's link secret
(``link_secret``, sent over the control channel like ``--api-key``, never on a command line or in an environment);
role configs are never logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import msgspec

from asyncdp.config.deployment import DeploymentConfig
from asyncdp.config.flags import DEFAULT_MAX_SEQS_PER_REQUEST, EngineConfig
from asyncdp.config.generation_config import GenerationDefaults
from asyncdp.config.vllm_flags import DEFAULT_MAX_LOGPROBS


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Everything the launcher needs: the resolved deployment plus the flags and model facts the roles use."""

    engine: EngineConfig
    served_model_name: str
    model_path: str
    deployment: DeploymentConfig
    served_model_aliases: tuple[str, ...] = ()  # --served-model-name's other names, served as well
    tokenizer_path: str = ""  # --tokenizer, resolved; empty: the model's
    host: str | None = None
    port: int = 8000
    backend: str = "asyncio"
    shutdown_timeout_s: float = 0.0
    lb_policy: str = "vllm"
    max_queued_requests: int | None = None
    max_seqs_per_request: int = DEFAULT_MAX_SEQS_PER_REQUEST
    max_request_body_bytes: int = 0  # resolved with max_model_len (0: unknown yet)
    enable_prompt_tokens_details: bool = False
    max_logprobs: int = DEFAULT_MAX_LOGPROBS  # --max-logprobs: above it a request's logprobs are a 400
    generation_defaults: GenerationDefaults = GenerationDefaults()  # --generation-config's, resolved by the cli
    enable_log_requests: bool = False  # --enable-log-requests (--max-log-len: max_log_len)
    enable_log_outputs: bool = False  # --enable-log-outputs
    max_log_len: int | None = None
    uvicorn_log_level: str | None = None  # --uvicorn-log-level: the API servers' HTTP log (None: --log-level's)
    chat_template: str | None = field(default=None, repr=False)  # --chat-template's text; None: the tokenizer's
    chat_template_content_format: str = "auto"  # --chat-template-content-format
    trust_request_chat_template: bool = False  # --trust-request-chat-template
    enable_tokenizer_info_endpoint: bool = False  # --enable-tokenizer-info-endpoint: GET /tokenizer_info
    server_dev_mode: bool = False  # ASYNCDP_SERVER_DEV_MODE=1 (VLLM_SERVER_DEV_MODE=1): POST /reset_prefix_cache
    # --tool-call-parser when --enable-auto-tool-choice is on: tool_choice "auto" is served (None: a 400)
    auto_tool_call_parser: str | None = None
    reasoning_parser: str | None = None  # --reasoning-parser: chat answers' thinking apart from their content
    allowed_origins: tuple[str, ...] = ("*",)  # CORS (--allowed-origins ...): "*" allows any
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    api_key: str | None = field(default=None, repr=False)  # --api-key: never logged
    # The deployment secret every link's handshake proves (the operator's, or drawn by the launcher of a
    # deployment that is all on one node); None: unauthenticated links. Never logged.
    link_secret: bytes | None = field(default=None, repr=False)
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    engine_ready_timeout_s: float = 600.0
    coordinator_startup_timeout_s: float = 120.0
    sync_interval: int = 32
    prefill_schedule_interval: int = 1
    keep_alive_on_engine_death: bool = False
    dp_fail_fast: bool = False
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    log_level: str = "INFO"
    max_model_len: int = 0  # resolved by the caller from the model (0: unknown yet)
    supervised_rank: int | None = None  # a multi-port supervisor's child: titled asyncdp-api-dp{rank}

    @property
    def dp_size(self) -> int:
        return self.deployment.dp_size

    @property
    def api_server_count(self) -> int:
        return self.deployment.api_server_count

    @property
    def is_moe(self) -> bool:
        return self.deployment.is_moe

    @property
    def enable_expert_parallel(self) -> bool:
        return self.deployment.enable_expert_parallel

    @property
    def mode(self) -> str:
        return self.deployment.mode


class _Role(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    pass


class CoordinatorRole(_Role, frozen=True):
    """``asyncdp-coordinator``: where to bind, how many engines to expect, the heartbeat rule."""

    dp_size: int
    wave_mode: bool  # MoE with dp > 1
    external_lb: bool
    socket_dir: str
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    subscribe_timeout_s: float  # engines subscribe only after loading their model
    ranks_can_return: bool = False  # dense with ranks on other nodes: a restarted node may bring lost ranks back
    # TCP on this host (the DP address) when peers are on other nodes; None: a Unix socket (spec §5.1).
    engine_link_host: str | None = None
    client_link_host: str | None = None
    link_secret: bytes | None = None  # the deployment secret both listeners ask for (None: none)


class EngineRole(_Role, frozen=True):
    """``asyncdp-engine-dp{r}``: one rank's configuration and the handshake address it joins."""

    dp_rank: int
    dp_size: int
    engine: EngineConfig
    handshake_addr: str  # the head front-end's (rank 0's) handshake listener
    # Hybrid node S > 0: this node's own front-end, which hands out the client addresses (spec §5.4).
    local_handshake_addr: str | None = None
    headless: bool = False  # this engine runs on a headless node (Hello.headless, E4)
    local: bool = True  # the head front-end runs on this node (Hello.local)
    is_moe: bool = False
    external_lb: bool = False
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    shutdown_timeout_s: float = 0.0
    sync_interval: int = 32
    prefill_schedule_interval: int = 1
    enable_expert_parallel: bool = False
    # The launch's parallel-configuration summary (plan_summary), said in Hello (checked before the DP group forms)
    config_summary: dict[str, Any] = {}
    link_secret: bytes | None = None  # the deployment secret every link of this rank proves (None: none)


class ApiServerRole(_Role, frozen=True):
    """``asyncdp-api-{i}`` (or the in-process API server): its client identity, managed ranks and HTTP settings."""

    client_index: int
    client_count: int
    managed_ranks: tuple[int, ...]
    dp_size: int
    model_name: str
    max_model_len: int
    model_path: str  # the API server reads only the tokenizer from it
    mode: str
    model_aliases: tuple[str, ...] = ()  # more names the API serves the model under (--served-model-name)
    is_moe: bool = False
    lb_policy: str = "vllm"
    max_queued_requests: int | None = None
    engine_ready_timeout_s: float = 600.0
    coordinator_client_addr: str | None = None
    client_link_host: str | None = None  # TCP on this host when a managed engine runs on another node
    local_ranks: tuple[int, ...] = ()  # the ranks whose engines run on this node
    enable_expert_parallel: bool = False
    heartbeat_interval_s: float = 1.0  # to the coordinator
    heartbeat_timeout_s: float = 5.0  # a coordinator silent this long is dead
    backend: str = "asyncio"
    shutdown_timeout_s: float = 0.0
    keep_alive_on_engine_death: bool = False
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    socket_dir: str | None = None
    max_seqs_per_request: int = DEFAULT_MAX_SEQS_PER_REQUEST
    max_request_body_bytes: int | None = None
    enable_prompt_tokens_details: bool = False
    max_logprobs: int = DEFAULT_MAX_LOGPROBS  # --max-logprobs
    generation_defaults: GenerationDefaults = GenerationDefaults()  # --generation-config's sampling defaults
    enable_log_requests: bool = False  # --enable-log-requests
    enable_log_outputs: bool = False  # --enable-log-outputs
    max_log_len: int | None = None  # --max-log-len
    uvicorn_log_level: str | None = None  # --uvicorn-log-level
    scheduling_policy: str = "fcfs"  # the engines' --scheduling-policy: fcfs refuses a priority other than 0
    chat_template: str | None = None  # --chat-template's text; None: the tokenizer's
    chat_template_content_format: str = "auto"  # --chat-template-content-format
    trust_request_chat_template: bool = False  # --trust-request-chat-template
    enable_tokenizer_info_endpoint: bool = False  # --enable-tokenizer-info-endpoint: GET /tokenizer_info
    server_dev_mode: bool = False  # ASYNCDP_SERVER_DEV_MODE=1 (VLLM_SERVER_DEV_MODE=1): POST /reset_prefix_cache
    auto_tool_call_parser: str | None = None  # --tool-call-parser with --enable-auto-tool-choice
    reasoning_parser: str | None = None  # --reasoning-parser
    allowed_origins: tuple[str, ...] = ("*",)  # CORS (--allowed-origins ...): "*" allows any
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    api_key: str | None = None  # --api-key (sent over the child's control channel, never on its command line)
    # How a child gets its HTTP socket: its own SO_REUSEPORT listener on (host, port), or an inherited fd.
    http_shared_port: tuple[str | None, int] | None = None
    http_fd: int | None = None
    node_table_fd: int | None = None  # the siblings' shared admission/heartbeat table (several API servers)
    link_secret: bytes | None = None  # the deployment secret of its engine and coordinator links (None: none)


RoleConfig = Union[CoordinatorRole, EngineRole, ApiServerRole]  # noqa: UP007 - msgspec needs a real Union


def coordinator_role(plan: LaunchPlan, *, socket_dir: str, engine_link_host: str | None = None,
                     client_link_host: str | None = None) -> CoordinatorRole:
    return CoordinatorRole(
        engine_link_host=engine_link_host, client_link_host=client_link_host,
        dp_size=plan.dp_size, wave_mode=plan.deployment.waves, external_lb=plan.deployment.external,
        socket_dir=socket_dir, heartbeat_interval_s=plan.heartbeat_interval_s,
        heartbeat_timeout_s=plan.heartbeat_timeout_s,
        # Engines subscribe only after loading their model: the same budget as the API servers' ready wait.
        subscribe_timeout_s=plan.engine_ready_timeout_s,
        ranks_can_return=not plan.deployment.waves and plan.deployment.dp_size_local < plan.dp_size,
        link_secret=plan.link_secret)


def engine_role(plan: LaunchPlan, dp_rank: int, *, handshake_addr: str, torch_threads: int,
                local_handshake_addr: str | None = None,
                config_summary: Mapping[str, Any] | None = None) -> EngineRole:
    """Rank ``dp_rank``; ``torch_threads`` applies unless ``--torch-threads`` was given. ``config_summary`` is
    the launch's parallel configuration, which the rank says in ``Hello``."""
    engine = plan.engine if plan.engine.torch_threads else plan.engine.replace(torch_threads=torch_threads)
    dep = plan.deployment
    return EngineRole(
        dp_rank=dp_rank, dp_size=plan.dp_size, engine=engine, handshake_addr=handshake_addr,
        local_handshake_addr=local_handshake_addr, headless=dep.headless,
        local=not dep.headless and dep.dp_start_rank == 0, is_moe=plan.is_moe,
        external_lb=plan.deployment.external, heartbeat_interval_s=plan.heartbeat_interval_s,
        heartbeat_timeout_s=plan.heartbeat_timeout_s, shutdown_timeout_s=plan.shutdown_timeout_s,
        sync_interval=plan.sync_interval, prefill_schedule_interval=plan.prefill_schedule_interval,
        enable_expert_parallel=plan.enable_expert_parallel, config_summary=dict(config_summary or {}),
        link_secret=plan.link_secret)


def api_server_role(plan: LaunchPlan, client_index: int, *, managed_ranks: tuple[int, ...],
                    coordinator_client_addr: str | None, socket_dir: str | None,
                    client_link_host: str | None = None,
                    http_shared_port: tuple[str | None, int] | None = None,
                    node_table_fd: int | None = None) -> ApiServerRole:
    return ApiServerRole(
        client_index=client_index, client_count=plan.api_server_count, managed_ranks=managed_ranks,
        dp_size=plan.dp_size, model_name=plan.served_model_name, max_model_len=plan.max_model_len,
        model_aliases=plan.served_model_aliases, model_path=plan.tokenizer_path or plan.model_path, mode=plan.mode, is_moe=plan.is_moe,
        lb_policy=plan.lb_policy, max_queued_requests=plan.max_queued_requests,
        engine_ready_timeout_s=plan.engine_ready_timeout_s, coordinator_client_addr=coordinator_client_addr,
        client_link_host=client_link_host, local_ranks=plan.deployment.local_ranks,
        enable_expert_parallel=plan.enable_expert_parallel, heartbeat_interval_s=plan.heartbeat_interval_s,
        heartbeat_timeout_s=plan.heartbeat_timeout_s, backend=plan.backend,
        shutdown_timeout_s=plan.shutdown_timeout_s, keep_alive_on_engine_death=plan.keep_alive_on_engine_death,
        ssl_keyfile=plan.ssl_keyfile, ssl_certfile=plan.ssl_certfile, socket_dir=socket_dir,
        max_seqs_per_request=plan.max_seqs_per_request, max_request_body_bytes=plan.max_request_body_bytes or None,
        enable_prompt_tokens_details=plan.enable_prompt_tokens_details, max_logprobs=plan.max_logprobs,
        generation_defaults=plan.generation_defaults,
        enable_log_requests=plan.enable_log_requests, enable_log_outputs=plan.enable_log_outputs,
        max_log_len=plan.max_log_len,
        uvicorn_log_level=plan.uvicorn_log_level, scheduling_policy=plan.engine.scheduling_policy,
        chat_template=plan.chat_template, chat_template_content_format=plan.chat_template_content_format,
        trust_request_chat_template=plan.trust_request_chat_template,
        enable_tokenizer_info_endpoint=plan.enable_tokenizer_info_endpoint, server_dev_mode=plan.server_dev_mode,
        auto_tool_call_parser=plan.auto_tool_call_parser, reasoning_parser=plan.reasoning_parser,
        allowed_origins=plan.allowed_origins, allowed_methods=plan.allowed_methods,
        allowed_headers=plan.allowed_headers, allow_credentials=plan.allow_credentials, api_key=plan.api_key,
        http_shared_port=http_shared_port, node_table_fd=node_table_fd, link_secret=plan.link_secret)
