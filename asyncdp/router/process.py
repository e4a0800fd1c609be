"""The ``asyncdp route`` process: the poller and the HTTP proxy in one task group, and an orderly stop.

Theory of operation. :func:`serve_router` opens two httpx clients (one for ``/load`` polls, one for proxied
requests, so polls never queue behind requests for a connection; both verify ``https://`` endpoints,
:func:`upstream_tls_context`), starts the :class:`~asyncdp.router.poller.Poller` and waits until every endpoint
was polled once, then serves the :class:`~asyncdp.router.proxy.RouterApp` with
:func:`asyncdp.api.serve.serve_http` (over TLS with ``--ssl-certfile``/``--ssl-keyfile``) and reports the bound
address (``task_status.started((host, port))``, and the log line ``routing on http(s)://HOST:PORT to N
endpoints: ... (K usable now); backend BACKEND``). It runs on asyncio or trio (``--backend``), the same code on both.
SIGTERM or SIGINT sets ``draining`` (``/health`` 503, new requests 503), then Hypercorn stops accepting and gives
the requests in flight ``--shutdown-timeout`` seconds before it cancels them (a cancelled exchange closes its
upstream response, so the endpoint aborts the request). Then the poller is cancelled and the process exits 0. A
second signal cancels the requests still in flight at once (:meth:`~asyncdp.router.proxy.RouterApp.cancel_all`),
so the drain ends. A port that cannot be bound (bound in :func:`run_router`, before the event loop), or whose
lock another asyncdp process holds (:func:`claim_port`: the per-port lock ``asyncdp serve`` and the supervisor take,
held for the process's lifetime), ends the process with status 1 and one log line.
"""

from __future__ import annotations

import functools
import logging
import signal
import socket
import ssl

import anyio
import anyio.abc
import httpx
import sniffio

from asyncdp import runtime
from asyncdp.api.serve import SSLFiles, serve_http
from asyncdp.router.poller import Poller
from asyncdp.router.proxy import RouterApp
from asyncdp.router.settings import RouterSettings
from asyncdp.transport.http_socket import LISTEN_BACKLOG
from asyncdp.transport.port_lock import bind_locked

log = logging.getLogger("asyncdp.router")

PROCESS_TITLE = "asyncdp-route"


async def _watch_signals(app: RouterApp, stop: anyio.Event, shutdown_timeout_s: float, *,
                         task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        for signum in runtime.take_early_stops():  # held since the event loop began (runtime.run)
            _on_signal(app, stop, shutdown_timeout_s, signum)
        task_status.started()
        async for signum in signals:
            _on_signal(app, stop, shutdown_timeout_s, signum)


def _on_signal(app: RouterApp, stop: anyio.Event, shutdown_timeout_s: float, signum: int) -> None:
    name = signal.Signals(signum).name
    if stop.is_set():
        log.warning("received %s again: cancelling the %d requests in flight now", name, app.cancel_all())
        return
    log.info("received %s: draining the requests in flight for up to %g s", name, shutdown_timeout_s)
    app.draining = True
    stop.set()


def upstream_tls_context(ca_file: str | None) -> ssl.SSLContext:
    """How ``https://`` endpoints are verified: against ``--upstream-ca-file`` alone when given, else the system's
    trusted CAs (``ssl.create_default_context``), with the host name checked either way."""
    return ssl.create_default_context(cafile=ca_file)


def listen(host: str, port: int) -> socket.socket:
    """The router's listening socket (port 0: any free port); OSError when it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)


def claim_port(host: str, port: int) -> tuple[socket.socket, socket.socket]:
    """The listening socket (:func:`listen`) and the lock of its port (:func:`~asyncdp.transport.port_lock.hold_port`),
    taken before the bind (after it for port 0, on the port the kernel gave); OSError when either cannot be had,
    the lock's naming the pid of the asyncdp process that holds it. The socket has no ``SO_REUSEPORT``, so the
    kernel keeps anyone off a port the router listens on, but not the router off a port an ``asyncdp serve``
    launcher or a supervisor bound and does not listen on yet (a deployment still starting): the lock does."""
    return bind_locked(port, functools.partial(listen, host))


async def serve_router(settings: RouterSettings, sock: socket.socket, *,
                       task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED) -> None:
    """Run the router on the listening socket ``sock`` until a signal's drain ends (see the module docstring).
    ``sock`` is closed once Hypercorn serves its duplicate, so the port closes when Hypercorn stops."""
    poller = Poller(settings.endpoints, poll_interval_s=settings.poll_interval_s,
                    stale_after_s=settings.stale_after_s, poll_timeout_s=settings.poll_deadline_s)
    n = len(settings.endpoints)
    poll_limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)  # one kept-alive each
    proxy_limits = httpx.Limits(max_connections=None,
                                max_keepalive_connections=settings.upstream_max_idle_connections,
                                keepalive_expiry=settings.upstream_keepalive_s)
    verify = upstream_tls_context(settings.upstream_ca_file)
    async with (httpx.AsyncClient(limits=poll_limits, timeout=settings.poll_deadline_s, verify=verify) as poll_http,
                httpx.AsyncClient(limits=proxy_limits, verify=verify) as proxy_http):
        app = RouterApp(poller, proxy_http, connect_timeout_s=settings.connect_timeout_s,
                        max_body_bytes=settings.max_request_body_bytes,
                        replay_body_bytes=settings.replay_buffer_bytes)
        stop = anyio.Event()
        ssl_files = None
        if settings.ssl_certfile is not None and settings.ssl_keyfile is not None:
            ssl_files = SSLFiles(certfile=settings.ssl_certfile, keyfile=settings.ssl_keyfile)
        async with anyio.create_task_group() as tg:
            await tg.start(_watch_signals, app, stop, settings.shutdown_timeout_s)
            await tg.start(poller.run, poll_http)

            async def serve(*, task_status: anyio.abc.TaskStatus[tuple[str, int]]) -> None:
                await serve_http(app, sock=sock, ssl=ssl_files, shutdown_timeout_s=settings.shutdown_timeout_s,
                                 shutdown_trigger=stop.wait, task_status=task_status)
                tg.cancel_scope.cancel()  # drained: stop the poller and the signal watcher

            address = await tg.start(serve)
            sock.close()
            host, port = address[0], address[1]
            if not stop.is_set():  # (a stop held from before the watcher: it drains at once, it never routed)
                shown = f"[{host}]" if ":" in host else host
                log.info("routing on %s://%s:%d to %d endpoints: %s (%d usable now); backend %s", settings.scheme,
                         shown, port, n, ", ".join(settings.endpoints), poller.num_usable(),
                         sniffio.current_async_library())
            task_status.started((host, port))


def run_router(settings: RouterSettings) -> int:
    """The ``asyncdp route`` process: logging, the process title, the event loop; returns the exit status."""
    from asyncdp.logs import setup_logging

    setup_logging(prefix=PROCESS_TITLE, level=settings.log_level.upper())
    for noisy in ("httpx", "httpcore"):  # one INFO line per /load poll, 20 a second per endpoint
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        import setproctitle

        setproctitle.setproctitle(PROCESS_TITLE)
    except ImportError:
        pass
    try:
        sock, lock = claim_port(settings.host, settings.port)
    except OSError as exc:
        log.error("cannot listen on %s port %d: %s", settings.host, settings.port, exc.strerror or exc)
        return 1
    try:
        runtime.run(serve_router, settings, sock, backend=settings.backend, hold_stops=True)
    except KeyboardInterrupt:  # before the signal watcher is in place
        return 1
    finally:
        sock.close()
        lock.close()  # after the port: the next claimant finds it free once the lock is
    log.info("router stopped; exit status 0")
    return 0
