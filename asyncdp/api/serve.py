"""``serve_http``: run the app on Hypercorn under the anyio backend in use, with a graceful drain.

Theory of operation. The listening socket is bound here first (or handed in: an inherited fd from the
launcher, spec §10/E11), so readiness can report the real address (``task_status.started((host, port))``)
and port 0 works. Hypercorn gets a duplicate of the descriptor (``fd://``) and serves in a child task.

Shutdown, by ``shutdown_trigger()`` returning or by cancellation of the caller's scope:
  1. ``set_draining(app)``: new requests get 503, ``/health`` fails;
  2. Hypercorn closes its listener and gives in-flight connections ``shutdown_timeout_s`` to finish, then
     cancels them; the app's lifespan shutdown then cancels generation producers (aborting their requests).
The drain runs shielded from the caller's cancellation, bounded by ``shutdown_timeout_s`` plus a small margin,
so cancelling ``serve_http`` is a graceful stop, not an abrupt one. A trigger ends ``serve_http`` normally;
a cancellation is re-raised after the drain.

A request Hypercorn's HTTP/1.1 parser refuses (before the app sees it) is answered in OpenAI's error shape by
:mod:`asyncdp.api.protocol_errors`, installed here.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import sniffio
from hypercorn.config import Config

from asyncdp.api import protocol_errors
from asyncdp.api.context import set_draining
from asyncdp.logs import HTTP_LOGGER
from asyncdp.transport.http_socket import LISTEN_BACKLOG

# Time for Hypercorn's own shutdown steps (closing listeners, lifespan shutdown) beyond the drain deadline.
_SHUTDOWN_MARGIN_S = 5.0
# How long closing a TLS connection waits for the peer's close_notify (asyncio: 30 s); within the margin
# above.
TLS_CLOSE_TIMEOUT_S = 2.0




@dataclass(frozen=True, slots=True)
class SSLFiles:
    certfile: str
    keyfile: str
    ca_certs: str | None = None


def _listening_socket(host: str, port: int, sock: socket.socket | int | None) -> tuple[socket.socket, bool]:
    """The socket to serve on and whether this function created it (and so must close it)."""
    if isinstance(sock, int):
        return socket.socket(fileno=os.dup(sock)), True
    if sock is not None:
        return sock, False
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG), True


async def serve_http(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    sock: socket.socket | int | None = None,
    backend: str | None = None,
    ssl: SSLFiles | None = None,
    shutdown_timeout_s: float = 5.0,
    shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
    task_status: anyio.abc.TaskStatus[Any] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` until ``shutdown_trigger()`` returns or the caller's scope is cancelled, then drain.

    ``sock``: an already bound (and listening) socket or file descriptor; it is not closed here.
    ``task_status.started(address)`` reports ``sock.getsockname()`` once the socket listens.
    """
    backend = backend or sniffio.current_async_library()
    serve = _hypercorn_serve(app, backend)
    protocol_errors.install()  # requests Hypercorn cannot parse get OpenAI-style JSON errors, not empty ones
    listener, owned = _listening_socket(host, port, sock)
    address = listener.getsockname()
    config = _hypercorn_config(listener, shutdown_timeout_s, ssl)
    if owned:
        listener.close()  # once Hypercorn closes its duplicate, new connections are refused

    stop = anyio.Event()

    async def hypercorn_stopped() -> None:
        await stop.wait()

    async def run_hypercorn() -> None:
        try:
            await serve(app, config, shutdown_trigger=hypercorn_stopped)
        finally:
            stop.set()

    async def watch(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            if shutdown_trigger is None:
                await anyio.sleep_forever()
            else:
                await shutdown_trigger()
        finally:  # runs on cancellation too: that is what makes cancelling serve_http a graceful stop
            if hasattr(app, "extensions") and "asyncdp" in app.extensions:
                set_draining(app)
            stop.set()

    restore = _quiet_cancelled_connection_callbacks() if backend == "asyncio" else None
    unflood = rate_limit_send_warnings() if backend == "asyncio" else None
    unbound = _bounded_tls_close() if backend == "asyncio" and ssl is not None else None
    try:
        async with anyio.create_task_group() as outer:
            await outer.start(watch)
            # The server and its drain are shielded from the caller; `watch` turns cancellation into `stop`.
            with anyio.CancelScope(shield=True) as server_scope:
                async with anyio.create_task_group() as server:
                    server.start_soon(run_hypercorn)
                    task_status.started(address)
                    await stop.wait()
                    server_scope.deadline = anyio.current_time() + shutdown_timeout_s + _SHUTDOWN_MARGIN_S
            outer.cancel_scope.cancel()
    finally:
        if restore is not None:
            restore()
        if unflood is not None:
            unflood()
        if unbound is not None:
            unbound()


def _hypercorn_serve(app: Any, backend: str) -> Callable[..., Awaitable[Any]]:
    """Hypercorn's ``serve`` for ``backend``; refuses an app built for the other backend."""
    if backend == "asyncio":
        from hypercorn.asyncio import serve
    elif backend == "trio":
        from hypercorn.trio import serve
    else:
        raise ValueError(f"backend must be 'asyncio' or 'trio', got {backend!r}")
    is_trio_app = any(cls.__name__ == "QuartTrio" for cls in type(app).__mro__)
    is_quart_app = any(cls.__name__ == "Quart" for cls in type(app).__mro__)
    if is_quart_app and is_trio_app != (backend == "trio"):
        raise ValueError(f"the app was built for the other backend; build it with create_app(..., "
                         f"backend={backend!r}) to serve it under {backend}")
    return serve


def _hypercorn_config(listener: socket.socket, shutdown_timeout_s: float, ssl: SSLFiles | None) -> Config:
    config = Config()
    config.bind = [f"fd://{os.dup(listener.fileno())}"]  # Hypercorn owns and closes the duplicate
    config.graceful_timeout = shutdown_timeout_s
    config.backlog = LISTEN_BACKLOG
    config.accesslog = None
    # Hypercorn's errors go through our logging set-up (one format per process), not its own handler, and under
    # asyncdp's name: "hypercorn.error" at INFO read as an error to everyone who saw it.
    config.errorlog = http_logger()
    if ssl is not None:
        config.certfile, config.keyfile, config.ca_certs = ssl.certfile, ssl.keyfile, ssl.ca_certs
    return config


class RunningOnFilter(logging.Filter):
    """Demote Hypercorn's ``Running on <bind> (CTRL + C to quit)`` to DEBUG.

    Each API-server process prints it (once per process with several of them), and with the inherited socket
    the bind it names is ``fd://N``, an address nobody can connect to. The launcher's "serving ... on
    http://HOST:PORT" line says where the deployment really listens, once."""

    def __init__(self) -> None:
        super().__init__("asyncdp-running-on")

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith("Running on ")):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(HTTP_LOGGER).isEnabledFor(logging.DEBUG)


def http_log_level(uvicorn_level: str) -> int:
    """``--uvicorn-log-level`` (uvicorn's names, as vLLM takes them) as the level of :func:`http_logger`: uvicorn's
    ``trace`` is below ``debug``, which is the lowest Python level, so both are DEBUG."""
    return logging.DEBUG if uvicorn_level == "trace" else logging.getLevelName(uvicorn_level.upper())


def http_logger() -> logging.Logger:
    """The logger Hypercorn's error log goes to: ``asyncdp.http``, with :class:`RunningOnFilter` installed once."""
    logger = logging.getLogger(HTTP_LOGGER)
    if not any(isinstance(f, RunningOnFilter) for f in logger.filters):
        logger.addFilter(RunningOnFilter())
    return logger


def _quiet_cancelled_connection_callbacks() -> Callable[[], None]:
    """Hypercorn's asyncio server starts one task per connection from a protocol callback; when shutdown
    cancels a connection that is mid-request, asyncio logs that callback's CancelledError with a traceback,
    and a TLS connection whose idle client never answered the close (:func:`_bounded_tls_close`) its
    TimeoutError. Both are the intended end of that connection, not errors, so only those cases are
    filtered out."""
    import asyncio

    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, asyncio.CancelledError):
            return
        if isinstance(exc, TimeoutError) and str(exc) == "SSL shutdown timed out":  # _bounded_tls_close's end
            logging.getLogger(HTTP_LOGGER).debug("a TLS connection closed without its peer's close_notify")
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    return lambda: loop.set_exception_handler(previous)


def _bounded_tls_close() -> Callable[[], None]:
    """Bound the TLS close of each connection Hypercorn's asyncio server accepts to ``TLS_CLOSE_TIMEOUT_S``.
    Closing a TLS connection sends ``close_notify`` and waits for the peer's (asyncio's
    ``ssl_shutdown_timeout``, 30 s by default), and Hypercorn has no setting for it. An idle keep-alive
    client (a connection pool, a load balancer) never answers, so at shutdown each such connection held the
    drain for 30 s: past the deadline, the API server was killed and the deployment exited 1 with a
    traceback. Hypercorn opens its server with ``asyncio.start_server``, which calls the running loop's
    ``create_server``: this wraps that method on the loop for the server's life (returns the function that
    restores it)."""
    import asyncio

    loop = asyncio.get_running_loop()
    own = vars(loop).get("create_server")  # a wrapper already on the instance (normally none)
    original = loop.create_server

    async def create_server(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_shutdown_timeout", TLS_CLOSE_TIMEOUT_S)
        return await original(*args, **kwargs)

    loop.create_server = create_server  # type: ignore[method-assign]

    def restore() -> None:
        if own is None:
            vars(loop).pop("create_server", None)
        else:
            loop.create_server = own  # type: ignore[method-assign]

    return restore


SEND_WARNING = "socket.send() raised exception."
SEND_WARNING_EVERY_S = 10.0


class SendWarningLimiter(logging.Filter):
    """Let asyncio's ``socket.send() raised exception.`` through once per ``every_s``, with a count of those
    held back since.

    asyncio logs that line for every write to a transport whose peer already reset the connection, once more
    than five writes went there. When many streams are cancelled at once (a load generator stopping), Hypercorn
    still hands each closed connection the chunks its response had in hand, one write each, before the handler
    sees the disconnect: hundreds of identical lines that say nothing about the server. ``now`` is injectable
    for tests."""

    def __init__(self, every_s: float = SEND_WARNING_EVERY_S, now: Callable[[], float] | None = None) -> None:
        super().__init__("asyncdp-send-warnings")
        import time

        self.every_s = every_s
        self._now = now or time.monotonic
        self._next_s = -math.inf
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != SEND_WARNING:
            return True
        now = self._now()
        if now < self._next_s:
            self.suppressed += 1
            return False
        self._next_s = now + self.every_s
        if self.suppressed:
            record.msg = f"{SEND_WARNING} ({self.suppressed} more like it in the last {self.every_s:g} s: " \
                         "writes to connections their clients had reset)"
            self.suppressed = 0
        return True


def rate_limit_send_warnings() -> Callable[[], None]:
    """Install :class:`SendWarningLimiter` on the ``asyncio`` logger; returns the function that removes it."""
    logger = logging.getLogger("asyncio")
    limiter = SendWarningLimiter()
    logger.addFilter(limiter)
    return lambda: logger.removeFilter(limiter)
