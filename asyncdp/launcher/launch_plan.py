"""The launch plan: what ``asyncdp serve`` resolved from its command line and the model, before anything starts.

:func:`plan_from_config` resolves the model (a built-in is materialised on first use), reads its facts and
flattens the validated, resolved ``ServeConfig`` into a :class:`~asyncdp.config.roles.LaunchPlan` that carries the
deployment as ``resolve()`` derived it (the launcher never re-derives the mode), the one object the launcher and
the role configs work from. :func:`bind_http_socket` is the launcher's first act (E11): a busy port fails
before any child process exists.
"""

from __future__ import annotations

import dataclasses
import secrets
import socket

from asyncdp.config.deployment import ResolvedServeConfig
from asyncdp.config.flags import default_max_request_body_bytes
from asyncdp.config.roles import LaunchPlan
from asyncdp.launcher.plan import plan as launch_table
from asyncdp.transport.http_socket import LISTEN_BACKLOG, bind_listener
from asyncdp.transport.link_auth import LINK_SECRET_BYTES, unauthenticated_warning

__all__ = ["LaunchPlan", "bind_http_socket", "plan_from_config", "plan_summary", "with_link_secret"]


def bind_http_socket(host: str | None, port: int) -> socket.socket:
    """Bind and listen on the user-facing port before anything else starts (E11)."""
    sock = bind_listener(host, port, reuse_port=False, backlog=LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


def plan_summary(plan: LaunchPlan) -> dict[str, object]:
    """What must agree across the launches of one deployment, as ``NodeHello`` carries it (the head compares
    a headless node's with its own and names the differing fields)."""
    from asyncdp import messages as m
    from asyncdp.config.summary import model_identity, parallel_config_summary
    from asyncdp.model import read_model_info

    dep = plan.deployment
    info = read_model_info(plan.model_path)
    return dict(parallel_config_summary(
        plan.engine, model_identity=model_identity(plan.model_path), dp_size=dep.dp_size,
        tp_size=dep.tensor_parallel_size, pp_size=dep.pipeline_parallel_size,
        enable_expert_parallel=dep.enable_expert_parallel, num_experts=info.num_experts,
        sync_interval=plan.sync_interval, prefill_schedule_interval=plan.prefill_schedule_interval,
        max_model_len=plan.max_model_len, protocol_version=m.PROTOCOL_VERSION))


def with_link_secret(plan: LaunchPlan) -> tuple[LaunchPlan, str | None]:
    """The plan with its deployment's link secret, and a warning to log at startup (or None).

    The operator's secret (``ASYNCDP_DP_SECRET``, ``--data-parallel-secret-file``) wins. A deployment whose links
    all stay on this node (no TCP link in its launch table) draws a fresh one: no other launch needs to know it,
    and the children get it in their role configs. One that spans launches without a secret keeps its links
    unauthenticated, as before, with the warning (a multi-port supervisor's child leaves it to its supervisor)."""
    if plan.link_secret is not None:
        return plan, None
    if not launch_table(plan.deployment).crosses_nodes:
        return dataclasses.replace(plan, link_secret=secrets.token_bytes(LINK_SECRET_BYTES)), None
    if plan.supervised_rank is not None:
        return plan, None
    dep = plan.deployment
    return plan, unauthenticated_warning(dep.data_parallel_address, dep.data_parallel_rpc_port)


def plan_from_config(config: ResolvedServeConfig) -> LaunchPlan:
    """Resolve the model and turn a validated, resolved ``ServeConfig`` into a launch plan."""
    from asyncdp.model import read_model_info, resolve_model, resolve_tokenizer

    dep = config.deployment
    path = resolve_model(config.model)
    info = read_model_info(path)
    max_model_len = config.engine.max_model_len or info.max_position_embeddings
    return LaunchPlan(
        engine=config.engine.replace(model=str(path)),
        served_model_name=config.served_model_names[0],
        served_model_aliases=config.served_model_names[1:],
        model_path=str(path),
        tokenizer_path=str(resolve_tokenizer(config.engine.tokenizer, path)),
        deployment=dep,
        host=config.host,
        port=config.port,
        backend=config.backend,
        shutdown_timeout_s=float(config.shutdown_timeout_s),
        lb_policy=config.lb_policy,
        max_queued_requests=config.max_queued_requests,
        max_seqs_per_request=config.max_seqs_per_request,
        enable_prompt_tokens_details=config.enable_prompt_tokens_details,
        max_logprobs=config.vllm.max_logprobs, generation_defaults=config.vllm.generation_defaults,
        enable_log_requests=config.vllm.enable_log_requests, enable_log_outputs=config.vllm.enable_log_outputs,
        max_log_len=config.vllm.max_log_len, uvicorn_log_level=config.vllm.uvicorn_log_level,
        chat_template=config.chat_template, chat_template_content_format=config.chat_template_content_format,
        trust_request_chat_template=config.trust_request_chat_template,
        enable_tokenizer_info_endpoint=config.enable_tokenizer_info_endpoint, server_dev_mode=config.server_dev_mode,
        auto_tool_call_parser=config.tool_call_parser if config.enable_auto_tool_choice else None,
        reasoning_parser=config.reasoning_parser,
        max_request_body_bytes=config.max_request_body_bytes or default_max_request_body_bytes(max_model_len),
        heartbeat_interval_s=config.dp_heartbeat_interval_s,
        heartbeat_timeout_s=config.dp_heartbeat_timeout_s,
        engine_ready_timeout_s=config.engine_ready_timeout_s,
        coordinator_startup_timeout_s=config.dp_coordinator_startup_timeout_s,
        sync_interval=config.dp_sync_interval,
        prefill_schedule_interval=config.prefill_schedule_interval,
        keep_alive_on_engine_death=config.keep_alive_on_engine_death,
        allowed_origins=config.allowed_origins, allowed_methods=config.allowed_methods,
        allowed_headers=config.allowed_headers, allow_credentials=config.allow_credentials, api_key=config.api_key,
        dp_fail_fast=config.dp_fail_fast,
        ssl_keyfile=config.ssl_keyfile,
        ssl_certfile=config.ssl_certfile,
        log_level=config.log_level.upper(),
        max_model_len=max_model_len,
        supervised_rank=config.supervised_rank,
        link_secret=config.data_parallel_secret,
    )
