"""The launch plan: what ``asyncdp serve`` resolved from its command line and the model, before anything starts.

:func:`plan_from_config` resolves the model (a built-in is materialised on first use), reads its facts and
flattens the validated :class:`~asyncdp.config.flags.ServeConfig` and its deployment into a :class:`LaunchPlan`, the
one object the launcher works from. :func:`bind_http_socket` is the launcher's first act (E11): a busy port fails
before any child process exists.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from asyncdp.config.flags import (
    DEFAULT_MAX_SEQS_PER_REQUEST,
    EngineConfig,
    ServeConfig,
    default_max_request_body_bytes,
)
from asyncdp.errors import StartupError


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Everything the launcher needs, resolved from the command line."""

    engine: EngineConfig
    served_model_name: str
    model_path: str
    tokenizer_path: str = ""  # --tokenizer, resolved; empty: the model's
    is_moe: bool = False
    dp_size: int = 1
    api_server_count: int = 1
    host: str | None = None
    port: int = 8000
    backend: str = "asyncio"
    shutdown_timeout_s: float = 0.0
    lb_policy: str = "vllm"
    max_queued_requests: int | None = None
    max_seqs_per_request: int = DEFAULT_MAX_SEQS_PER_REQUEST
    max_request_body_bytes: int = 0  # resolved with max_model_len (0: unknown yet)
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    engine_ready_timeout_s: float = 600.0
    coordinator_startup_timeout_s: float = 120.0
    sync_interval: int = 32
    prefill_schedule_interval: int = 1
    enable_expert_parallel: bool = False
    keep_alive_on_engine_death: bool = False
    dp_fail_fast: bool = False
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    log_level: str = "INFO"
    max_model_len: int = 0  # resolved by the caller from the model (0: unknown yet)

    @property
    def mode(self) -> str:
        return "single" if self.dp_size == 1 else "internal"


def bind_http_socket(host: str | None, port: int) -> socket.socket:
    """Bind and listen on the user-facing port before anything else starts (E11)."""
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host or "0.0.0.0", port))
        sock.listen(4096)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host or '0.0.0.0'}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def plan_from_config(config: ServeConfig) -> LaunchPlan:
    """Resolve the model and turn a validated ``ServeConfig`` into a launch plan."""
    from asyncdp.model import read_model_info, resolve_model, resolve_tokenizer

    dep = config.deployment
    assert dep is not None, "ServeConfig.deployment is set by asyncdp.cli.build_serve_config"
    path = resolve_model(config.model)
    info = read_model_info(path)
    max_model_len = config.engine.max_model_len or info.max_position_embeddings
    return LaunchPlan(
        engine=config.engine.replace(model=str(path)),
        served_model_name=config.served_model_names[0],
        model_path=str(path),
        tokenizer_path=str(resolve_tokenizer(config.engine.tokenizer, path)),
        is_moe=info.is_moe,
        dp_size=dep.dp_size,
        api_server_count=dep.api_server_count,
        host=config.host,
        port=config.port,
        backend=config.backend,
        shutdown_timeout_s=float(config.shutdown_timeout_s),
        lb_policy=config.lb_policy,
        max_queued_requests=config.max_queued_requests,
        max_seqs_per_request=config.max_seqs_per_request,
        max_request_body_bytes=config.max_request_body_bytes or default_max_request_body_bytes(max_model_len),
        heartbeat_interval_s=config.dp_heartbeat_interval_s,
        heartbeat_timeout_s=config.dp_heartbeat_timeout_s,
        engine_ready_timeout_s=config.engine_ready_timeout_s,
        coordinator_startup_timeout_s=config.dp_coordinator_startup_timeout_s,
        sync_interval=config.dp_sync_interval,
        prefill_schedule_interval=config.prefill_schedule_interval,
        enable_expert_parallel=dep.enable_expert_parallel,
        keep_alive_on_engine_death=config.keep_alive_on_engine_death,
        dp_fail_fast=config.dp_fail_fast,
        ssl_keyfile=config.ssl_keyfile,
        ssl_certfile=config.ssl_certfile,
        log_level=config.log_level.upper(),
        max_model_len=max_model_len,
    )
