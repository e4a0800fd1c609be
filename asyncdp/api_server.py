"""The API-server role: one DP client plus the HTTP app on a shared listening socket.

Theory of operation
-------------------
An API server owns a client listener (engines connect to it), a :class:`~asyncdp.client.DPClient` and the Quart
app served by Hypercorn on a socket the launcher bound (spec §10: one port, N processes). It runs either inside
the launcher (``--api-server-count 1``) or as a child process (``asyncdp-api-{i}``); both call
:func:`serve_api`.

Readiness: ``task_status.started()`` fires once every managed rank sent ``EngineReady`` and HTTP is being
served. ``/health`` is 503 before that (connections queue on the socket meanwhile).

Shutdown (spec §12.5): ``shutdown`` is set by a signal or by the launcher. New requests then get 503. With
``shutdown_timeout_s == 0`` every in-flight request is aborted (``finish_reason = "abort"``); otherwise they
drain until the deadline. A watchdog ends the server with exit code 1 when no managed rank can serve, unless
keep-alive is set (spec §12.1).
"""

from __future__ import annotations

import logging
import signal
import socket
import tempfile
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import msgspec

from asyncdp.client import ClientConfig, DPClient
from asyncdp.procs import ControlChannel, follow_parent
from asyncdp.transport import listen

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
    log_stats_interval_s: float = 10.0
    max_seqs_per_request: int = 256
    max_request_body_bytes: int | None = None  # None: derived from max_model_len by create_app


class ApiServerExit(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def make_metrics(cfg: ApiConfig) -> Any:
    from asyncdp.metrics import Metrics

    return Metrics(model_name=cfg.client.model_name)


async def bind_client_listener(cfg: ApiConfig) -> tuple[anyio.abc.Listener[Any], str]:
    return await listen("unix", directory=cfg.socket_dir or tempfile.gettempdir(), prefix="asyncdp-client")


async def serve_api(
    cfg: ApiConfig,
    http_sock: socket.socket,
    client_listener: anyio.abc.Listener[Any],
    shutdown: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[DPClient] = anyio.TASK_STATUS_IGNORED,
) -> int:
    """Serve until ``shutdown`` is set; return the exit code (0 orderly, 1 all engines dead)."""
    from asyncdp.api.app import create_app
    from asyncdp.api.serve import SSLFiles, serve_http
    from asyncdp.model import load_tokenizer

    tokenizer = await anyio.to_thread.run_sync(load_tokenizer, cfg.model_path)
    metrics = make_metrics(cfg)
    client = DPClient(cfg.client, tokenizer, metrics=metrics)
    app = create_app(client, backend=cfg.backend, metrics=metrics, max_seqs_per_request=cfg.max_seqs_per_request,
                     max_request_body_bytes=cfg.max_request_body_bytes)
    ssl = SSLFiles(cfg.ssl_certfile, cfg.ssl_keyfile) if cfg.ssl_certfile and cfg.ssl_keyfile else None
    code = 0
    http_stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        await tg.start(client.serve, client_listener)

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

        tg.start_soon(http)

        async def watchdog() -> None:
            nonlocal code
            while True:
                await anyio.sleep(WATCHDOG_INTERVAL_S)
                if not client.is_healthy() and not client.shutting_down and not cfg.keep_alive_on_engine_death:
                    log.error("no data-parallel rank can serve; the API server exits (keep-alive is off)")
                    code = 1
                    shutdown.set()
                    return

        tg.start_soon(watchdog)
        task_status.started(client)
        await shutdown.wait()
        # Drain in this order (spec 12.4/12.5): new requests get 503 while HTTP keeps serving; in-flight requests
        # get --shutdown-timeout to finish, then whatever is left is aborted, and HTTP stops only once their final
        # chunks (finish_reason "abort") had a moment to reach the clients. Stopping HTTP first would cut them off.
        client.begin_shutdown()
        # Hypercorn keeps its own duplicate of the listener until HTTP stops; this process's copy goes now, so
        # that the kernel refuses new connections once the last accepting process stopped, instead of queueing
        # connections that nobody will accept.
        http_sock.close()
        if cfg.shutdown_timeout_s > 0:
            with anyio.move_on_after(cfg.shutdown_timeout_s):
                await client.wait_idle()
        await client.abort_all()
        with anyio.move_on_after(FLUSH_S):
            await client.wait_idle()
        http_stop.set()
        tg.cancel_scope.deadline = anyio.current_time() + FLUSH_S + 1.0  # backstop; serve_http drains shielded
    return code


async def run_api_process(payload: dict[str, Any], control: ControlChannel) -> int:
    """Main of an API-server child process (role "api")."""
    cfg = msgspec.convert(payload["api"], ApiConfig)
    http_sock = socket.socket(fileno=payload["http_fd"])
    shutdown = anyio.Event()
    code = 0
    listener, client_addr = await bind_client_listener(cfg)
    async with anyio.create_task_group() as tg:
        client: DPClient | None = None
        processes: list[dict[str, Any]] = []

        def stop() -> None:
            if client is None:  # still waiting for engines: nothing to drain
                tg.cancel_scope.cancel()
            else:
                shutdown.set()

        async def on_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    stop()

        def on_command(cmd: dict[str, Any]) -> None:
            nonlocal processes
            if cmd.get("cmd") == "processes":
                processes = cmd["processes"]
                if client is not None:
                    client.processes = processes
            elif cmd.get("cmd") == "shutdown":
                stop()

        async def on_control() -> None:
            # Read from the start: the parent may stop this server, or die, while it still waits for engines.
            nonlocal code
            await follow_parent(control, on_command, who=f"API server {cfg.client.client_index}")
            code = 1
            tg.cancel_scope.cancel()

        tg.start_soon(on_signals)
        tg.start_soon(on_control)
        await control.send({"event": "listening", "client_addr": client_addr})

        async def run_api(*, task_status: anyio.abc.TaskStatus[DPClient]) -> None:
            nonlocal code
            code = await serve_api(cfg, http_sock, listener, shutdown, task_status=task_status)
            tg.cancel_scope.cancel()

        client = await tg.start(run_api)
        client.processes = processes or client.processes
        await control.send({"event": "ready"})
    http_sock.close()
    return code
