"""The API-server role: one DP client plus the HTTP app on a shared listening socket.

Theory of operation
-------------------
An API server owns a client listener (engines connect to it), a :class:`~asyncdp.apiserver.client.DPClient` and the Quart
app served by Hypercorn on a socket the launcher bound (spec §10: one port, N processes). It runs either inside
the launcher (``--api-server-count 1``) or as a child process (``asyncdp-api-{i}``); both call
:func:`serve_api`.

Readiness: HTTP is served from the start; ``task_status.started()`` fires once every managed rank sent
``EngineReady``. Before that ``/health`` and every generation request answer 503 at once.

Shutdown (spec §12.5): ``shutdown`` is set by a signal or by the launcher. New requests then get 503. With
``shutdown_timeout_s == 0`` every in-flight request is abandoned at once; otherwise they drain until the
deadline and the rest is abandoned then. An abandoned request fails with a 503 (a stream: an SSE error event)
that names the cause (a signal, or the launcher's teardown reason); a client's own abort and an operator's
``POST /pause?mode=abort`` still end requests with ``finish_reason = "abort"``. A watchdog ends the server
with exit code 1 when no managed rank can serve, unless keep-alive is set (spec §12.1).

A child gets an :class:`~asyncdp.config.roles.ApiServerRole` (:func:`api_config` turns it into its runtime
config), reports ``ApiListening`` (its client address), ``ChildReady`` and, at exit, ``ApiStopped`` on the control
channel, and follows ``ProcessTable`` and ``Shutdown`` from the launcher.

Several API servers on a node (``--api-server-count > 1``): each child listens on its own ``SO_REUSEPORT``
socket (:mod:`asyncdp.transport.http_socket`) and shares the launcher's node table (:mod:`asyncdp.apiserver.node_table`):
pooled admission, and a heartbeat whose silence turns the siblings' ``/health`` to 503.
"""

from __future__ import annotations

import logging
import signal
import socket
import tempfile
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import msgspec

from asyncdp import messages as m

# The Quart app, imported with this module (before any event loop runs here), not inside serve_api: imported there
# it held the API server's loop, or the launcher's for an in-process API server, for a second or more mid-startup.
from asyncdp.api.app import create_app
from asyncdp.api.cors import ALLOW_ALL, Cors
from asyncdp.api.serve import SSLFiles, http_log_level, http_logger, serve_http
from asyncdp.apiserver.client import ClientConfig, DPClient
from asyncdp.apiserver.node_table import NodeTable
from asyncdp.config.generation_config import GenerationDefaults
from asyncdp.config.roles import ApiServerRole
from asyncdp.config.vllm_flags import DEFAULT_MAX_LOGPROBS
from asyncdp.errors import ConfigError
from asyncdp.logs import DrainCounts
from asyncdp.transport import listen
from asyncdp.transport.control import ControlChannel, follow_parent

if TYPE_CHECKING:
    from quart import Quart

    from asyncdp.api.engine_client import EngineClient

log = logging.getLogger(__name__)

WATCHDOG_INTERVAL_S = 5.0
# At shutdown: how long aborted requests get to send their last chunk before HTTP stops.
FLUSH_S = 1.0


@dataclass(frozen=True, slots=True)
class ApiConfig:
    client: ClientConfig
    model_path: str
    backend: str = "asyncio"
    shutdown_timeout_s: float = 0.0
    keep_alive_on_engine_death: bool = False
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    socket_dir: str | None = None
    client_link_host: str | None = None  # TCP on this host when a managed engine runs on another node
    log_stats_interval_s: float = 10.0
    max_seqs_per_request: int = 256
    max_request_body_bytes: int | None = None  # None: derived from max_model_len by create_app
    enable_prompt_tokens_details: bool = False  # --enable-prompt-tokens-details
    max_logprobs: int = DEFAULT_MAX_LOGPROBS  # --max-logprobs
    generation_defaults: GenerationDefaults = GenerationDefaults()  # --generation-config's sampling defaults
    enable_log_requests: bool = False  # --enable-log-requests
    enable_log_outputs: bool = False  # --enable-log-outputs
    max_log_len: int | None = None  # --max-log-len
    uvicorn_log_level: str | None = None  # --uvicorn-log-level: the level of HTTP_LOGGER (None: --log-level's)
    scheduling_policy: str = "fcfs"  # the engines' --scheduling-policy
    chat_template: str | None = field(default=None, repr=False)  # --chat-template's text; None: the tokenizer's
    chat_template_content_format: str = "auto"  # --chat-template-content-format
    trust_request_chat_template: bool = False  # --trust-request-chat-template
    enable_tokenizer_info_endpoint: bool = False  # --enable-tokenizer-info-endpoint: GET /tokenizer_info
    server_dev_mode: bool = False  # ASYNCDP_SERVER_DEV_MODE=1: POST /reset_prefix_cache
    auto_tool_call_parser: str | None = None  # --tool-call-parser with --enable-auto-tool-choice
    reasoning_parser: str | None = None  # --reasoning-parser
    model_aliases: tuple[str, ...] = ()  # more names for the model (the first is the client's model_name)
    cors: Cors | None = ALLOW_ALL
    api_key: str | None = field(default=None, repr=False)  # --api-key


def make_metrics(cfg: ApiConfig) -> Any:
    from asyncdp.api.metrics import Metrics

    return Metrics(model_name=cfg.client.model_name)


def make_app(cfg: ApiConfig, client: EngineClient, metrics: Any) -> Quart:
    """The API server's app over ``client``, every front-end flag of ``cfg`` applied."""
    return create_app(client, backend=cfg.backend, metrics=metrics, max_seqs_per_request=cfg.max_seqs_per_request,
                      max_request_body_bytes=cfg.max_request_body_bytes,
                      enable_prompt_tokens_details=cfg.enable_prompt_tokens_details, max_logprobs=cfg.max_logprobs,
                      generation_defaults=cfg.generation_defaults,
                      enable_log_requests=cfg.enable_log_requests, enable_log_outputs=cfg.enable_log_outputs,
                      max_log_len=cfg.max_log_len,
                      scheduling_policy=cfg.scheduling_policy, chat_template=cfg.chat_template,
                      chat_template_content_format=cfg.chat_template_content_format,
                      trust_request_chat_template=cfg.trust_request_chat_template,
                      enable_tokenizer_info_endpoint=cfg.enable_tokenizer_info_endpoint,
                      server_dev_mode=cfg.server_dev_mode,
                      tool_call_parser=cfg.auto_tool_call_parser, reasoning_parser=cfg.reasoning_parser,
                      served_model_names=[cfg.client.model_name, *cfg.model_aliases], cors=cfg.cors,
                      api_key=cfg.api_key)


async def bind_client_listener(cfg: ApiConfig) -> tuple[anyio.abc.Listener[Any], str]:
    """The listener every managed engine connects to: Unix on one node, TCP port 0 across nodes (spec §5.1)."""
    if cfg.client_link_host is not None:
        return await listen("tcp", host=cfg.client_link_host)
    return await listen("unix", directory=cfg.socket_dir or tempfile.gettempdir(), prefix="asyncdp-client")


async def serve_api(
    cfg: ApiConfig,
    http_sock: socket.socket,
    client_listener: anyio.abc.Listener[Any],
    shutdown: anyio.Event,
    *,
    stop_reason: Callable[[], str | None] | None = None,
    node_table: NodeTable | None = None,
    drain: DrainCounts | None = None,
    task_status: anyio.abc.TaskStatus[DPClient] = anyio.TASK_STATUS_IGNORED,
) -> int:
    """Serve until ``shutdown`` is set; return the exit code (0 orderly, 1 all engines dead).

    ``stop_reason()`` names why the deployment stops when it is not an operator's signal (a teardown): the
    requests this server abandons fail with that cause. ``drain``, when given, receives how many in-flight
    requests completed normally during the drain and how many did not: failed (their rank died), aborted, or
    abandoned at the deadline (the launcher's "stopped" line)."""
    from asyncdp.model import load_tokenizer

    # (abandoned if this server is stopped meanwhile: loading imports transformers, seconds the launcher's stop
    # deadline would otherwise spend waiting, then kill this process and report the stop as a failure)
    tokenizer = await anyio.to_thread.run_sync(load_tokenizer, cfg.model_path, abandon_on_cancel=True)
    metrics = make_metrics(cfg)
    client = DPClient(cfg.client, tokenizer, metrics=metrics, node_table=node_table)
    app = make_app(cfg, client, metrics)
    if cfg.uvicorn_log_level is not None:
        http_logger().setLevel(http_log_level(cfg.uvicorn_log_level))
    ssl = SSLFiles(cfg.ssl_certfile, cfg.ssl_keyfile) if cfg.ssl_certfile and cfg.ssl_keyfile else None
    code = 0
    http_stop = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def http() -> None:
            await serve_http(
                app,
                sock=http_sock,
                backend=cfg.backend,
                ssl=ssl,
                shutdown_timeout_s=max(cfg.shutdown_timeout_s, FLUSH_S),
                shutdown_trigger=http_stop.wait,
            )
            tg.cancel_scope.cancel()  # the client links and the watchdog end with the HTTP server

        tg.start_soon(client.run_node_heartbeat)
        # HTTP from the start (issue #12): while the ranks load, /health and generation answer 503 at once
        # (the client is not healthy and refuses admission) instead of leaving connections queued unanswered.
        tg.start_soon(http)
        await tg.start(client.serve, client_listener)

        async def watchdog() -> None:
            nonlocal code
            while True:
                await anyio.sleep(WATCHDOG_INTERVAL_S)
                if not client.can_serve() and not client.shutting_down and not cfg.keep_alive_on_engine_death:
                    log.error("no data-parallel rank can serve; the API server exits (keep-alive is off)")
                    code = 1
                    shutdown.set()
                    return

        tg.start_soon(watchdog)
        task_status.started(client)
        await shutdown.wait()
        cause = stop_reason() if stop_reason is not None else None
        if code:
            cause = cause or "no data-parallel rank can serve"
        await _drain(cfg, client, http_sock, cause, drain)
        http_stop.set()
        tg.cancel_scope.deadline = anyio.current_time() + FLUSH_S + 1.0  # backstop; serve_http drains shielded
    return code


async def _drain(cfg: ApiConfig, client: DPClient, http_sock: socket.socket, cause: str | None,
                 drain: DrainCounts | None) -> None:
    """Drain in this order (spec 12.4/12.5): new requests get 503 while HTTP keeps serving; in-flight requests get
    --shutdown-timeout to finish, then whatever is left is abandoned: it fails with a 503 / an SSE error event
    naming the cause (never a 200 cut short with finish_reason "abort"), and HTTP stops (after this returns) only
    once those answers had a moment to reach the clients. Stopping HTTP first would cut them off."""
    what = f"the deployment is being torn down ({cause})" if cause else "the server is shutting down"
    client.begin_shutdown(what)
    inflight_at_stop = client.num_inflight
    # Hypercorn keeps its own duplicate of the listener until HTTP stops; this process's copy goes now, so
    # that the kernel refuses new connections once the last accepting process stopped, instead of queueing
    # connections that nobody will accept.
    http_sock.close()
    if cfg.shutdown_timeout_s > 0:
        with anyio.move_on_after(cfg.shutdown_timeout_s):
            await client.wait_idle()
    if drain is not None:  # drained: completed normally; aborted: all the others (failed, aborted, abandoned)
        drain.drained = min(client.num_drained, inflight_at_stop)
        drain.aborted = inflight_at_stop - drain.drained
    if cfg.shutdown_timeout_s > 0:
        await client.abort_all(f"{what} and its --shutdown-timeout of {cfg.shutdown_timeout_s:g} s passed")
    else:
        await client.abort_all(f"{what} with --shutdown-timeout 0")
    with anyio.move_on_after(FLUSH_S):
        await client.wait_idle()


def api_config(role: ApiServerRole) -> ApiConfig:
    """The API server's runtime configuration (its DP client's included) from its role config."""
    client = ClientConfig(
        client_index=role.client_index, client_count=role.client_count, managed_ranks=role.managed_ranks,
        dp_size=role.dp_size, model_name=role.model_name, max_model_len=role.max_model_len, is_moe=role.is_moe,
        lb_policy=role.lb_policy, max_queued_requests=role.max_queued_requests,
        engine_ready_timeout_s=role.engine_ready_timeout_s, coordinator_client_addr=role.coordinator_client_addr,
        mode=role.mode, enable_expert_parallel=role.enable_expert_parallel,
        local_ranks=role.local_ranks, link_secret=role.link_secret,
        heartbeat_interval_s=role.heartbeat_interval_s, heartbeat_timeout_s=role.heartbeat_timeout_s)
    return ApiConfig(
        client=client, model_path=role.model_path, backend=role.backend, shutdown_timeout_s=role.shutdown_timeout_s,
        keep_alive_on_engine_death=role.keep_alive_on_engine_death, ssl_keyfile=role.ssl_keyfile,
        ssl_certfile=role.ssl_certfile, socket_dir=role.socket_dir, client_link_host=role.client_link_host,
        max_seqs_per_request=role.max_seqs_per_request,
        max_request_body_bytes=role.max_request_body_bytes, model_aliases=role.model_aliases,
        enable_prompt_tokens_details=role.enable_prompt_tokens_details, scheduling_policy=role.scheduling_policy,
        max_logprobs=role.max_logprobs, enable_log_requests=role.enable_log_requests,
        enable_log_outputs=role.enable_log_outputs, max_log_len=role.max_log_len,
        generation_defaults=role.generation_defaults,
        uvicorn_log_level=role.uvicorn_log_level,
        chat_template=role.chat_template, chat_template_content_format=role.chat_template_content_format,
        trust_request_chat_template=role.trust_request_chat_template,
        enable_tokenizer_info_endpoint=role.enable_tokenizer_info_endpoint, server_dev_mode=role.server_dev_mode,
        auto_tool_call_parser=role.auto_tool_call_parser, reasoning_parser=role.reasoning_parser,
        cors=Cors(role.allowed_origins, role.allowed_methods, role.allowed_headers, role.allow_credentials),
        api_key=role.api_key)


def _http_socket(role: ApiServerRole) -> socket.socket:
    if role.http_shared_port is not None:  # its own SO_REUSEPORT listener: the kernel spreads connections
        from asyncdp.transport.http_socket import listen_shared_port

        host, port = role.http_shared_port
        return listen_shared_port(host, port)
    if role.http_fd is None:
        raise ConfigError(f"API server {role.client_index}: its role config names no HTTP socket")
    return socket.socket(fileno=role.http_fd)


async def run_api_process(role: ApiServerRole, control: ControlChannel) -> int:
    """Main of an API-server child process (role "api")."""
    cfg = api_config(role)
    http_sock = _http_socket(role)
    node_table = None
    if role.node_table_fd is not None:
        node_table = NodeTable(role.node_table_fd, cfg.client.client_count)
    shutdown = anyio.Event()
    code = 0
    listener, client_addr = await bind_client_listener(cfg)
    drain = DrainCounts()
    async with anyio.create_task_group() as tg:
        client: DPClient | None = None
        processes: list[dict[str, Any]] = []
        nodes: list[dict[str, Any]] = []
        reason: list[str] = []  # the launcher's teardown reason, when it sent one

        def stop() -> None:
            if client is None:  # still waiting for engines: nothing to drain
                tg.cancel_scope.cancel()
            else:
                shutdown.set()

        async def on_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    stop()

        def on_command(cmd: m.ControlMessage) -> None:
            nonlocal processes
            if isinstance(cmd, m.ProcessTable):
                processes = [msgspec.to_builtins(row) for row in cmd.processes]
                nodes[:] = [msgspec.to_builtins(row) for row in cmd.nodes]
                if client is not None:
                    client.processes = processes
                    client.nodes = list(nodes)
            elif isinstance(cmd, m.Shutdown):
                if cmd.reason:
                    reason.append(cmd.reason)
                stop()

        async def on_control() -> None:
            # Read from the start: the parent may stop this server, or die, while it still waits for engines.
            nonlocal code
            await follow_parent(control, on_command, who=f"API server {cfg.client.client_index}")
            code = 1
            tg.cancel_scope.cancel()

        tg.start_soon(on_signals)
        tg.start_soon(on_control)
        await control.send(m.ApiListening(client_addr=client_addr))

        async def run_api(*, task_status: anyio.abc.TaskStatus[DPClient]) -> None:
            nonlocal code
            code = await serve_api(cfg, http_sock, listener, shutdown, task_status=task_status,
                                   stop_reason=lambda: reason[0] if reason else None, node_table=node_table,
                                   drain=drain)
            with anyio.move_on_after(1.0), suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                # The launcher sums every API server's counts into one "stopped" line.
                await control.send(m.ApiStopped(drained=drain.drained, aborted=drain.aborted))
            tg.cancel_scope.cancel()

        client = await tg.start(run_api)
        client.processes = processes or client.processes
        client.nodes = list(nodes) or client.nodes
        await control.send(m.ChildReady())
    http_sock.close()
    if node_table is not None:
        node_table.close()
    return code
