"""The supervisor's HTTP server: ``GET /health``, ``/ready`` and ``/readyz`` (spec §11.3 "Endpoints").

Each answers 200 while the node is ready and not shutting down, else 503; there are no other routes (404, and
405 for another method, in the children's OpenAI error shape rather than the framework's HTML page). The
app asks ``is_serving()`` on every request, so a signal turns the answers to 503 at once while the port stays
open (the children are still draining). It runs on Quart (``QuartTrio`` under trio) behind Hypercorn through
:func:`asyncdp.api.serve.serve_http`, on a socket bound here first by :func:`listen_socket`: a busy port is a
:class:`~asyncdp.errors.StartupError` that names it. The supervisor binds its port before any child starts
(:func:`reserve_port`: held, but a connection is refused as to a closed port) and listens on it only once every
child is ready (:func:`start_listening`), which is the lifecycle's business (:mod:`asyncdp.supervisor.process`),
not this module's. :func:`ensure_port_free` checks a port without keeping it (each child's, before it starts).
:func:`~asyncdp.transport.http_socket.lock_http_port` takes a port's lock (:mod:`asyncdp.transport.port_lock`) for the supervisor's lifetime: neither
binding keeps a second deployment off a port whose owner does not listen yet.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from asyncdp.api.serve import SSLFiles, serve_http
from asyncdp.errors import StartupError
from asyncdp.transport.http_socket import shown_address

HEALTH_ROUTES = ("/health", "/ready", "/readyz")
# Health answers are tiny: a short drain is plenty once the supervisor stops its server.
_DRAIN_S = 1.0


def create_health_app(is_serving: Callable[[], bool], *, backend: str = "asyncio") -> Any:
    """The app with exactly :data:`HEALTH_ROUTES`: 200 ``{"status": "ready"}`` while ``is_serving()``, else 503
    ``{"status": "unavailable"}``."""
    if backend == "asyncio":
        from quart import Quart

        app_class: Any = Quart
    elif backend == "trio":
        from quart_trio import QuartTrio

        app_class = QuartTrio
    else:
        raise ValueError(f"backend must be 'asyncio' or 'trio', got {backend!r}")
    app = app_class("asyncdp.supervisor")

    async def health() -> tuple[dict[str, str], int]:
        if is_serving():
            return {"status": "ready"}, 200
        return {"status": "unavailable"}, 503

    for route in HEALTH_ROUTES:
        app.add_url_rule(route, endpoint=route.strip("/"), view_func=health, methods=["GET"])

    from werkzeug.exceptions import HTTPException

    from asyncdp.api.errors import error_body

    @app.errorhandler(HTTPException)
    async def _error(exc: HTTPException) -> tuple[dict[str, Any], int, dict[str, str]]:
        status = exc.code or 500
        headers = {k: v for k, v in exc.get_headers() if k == "Allow"}
        return error_body(status, exc.description or exc.name), status, headers

    return app


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def reserve_port(host: str | None, port: int, *, what: str) -> socket.socket:
    """Bind ``host`` (None: all interfaces) and ``port`` without listening: the port is the caller's (no port-0
    bind and no outgoing connection on the machine is given it), yet a connection to it is refused, as to a
    closed port. :func:`start_listening` opens it. StartupError naming ``what`` and the port if the bind fails."""
    bind_host = host or "0.0.0.0"
    sock = socket.socket(_family(bind_host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind_host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {what} {shown_address(host, port)}: {exc.strerror or exc}") from None
    return sock



def start_listening(sock: socket.socket, *, what: str) -> None:
    """Listen on a socket :func:`reserve_port` bound; StartupError naming ``what`` and the port if that fails
    (another program bound the same port with ``SO_REUSEADDR`` and listened first). The socket is closed then."""
    host, port = sock.getsockname()[:2]
    try:
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {what} {shown_address(host, port)}: {exc.strerror or exc}") from None


def listen_socket(host: str | None, port: int, *, what: str) -> socket.socket:
    """Bind and listen on ``host`` (None: all interfaces) and ``port``; StartupError naming ``what`` and the
    port if that fails."""
    sock = reserve_port(host, port, what=what)
    start_listening(sock, what=what)
    return sock


def ensure_port_free(host: str | None, port: int, *, what: str) -> None:
    """StartupError naming ``what`` and the port when ``port`` cannot be bound now; the port is not kept."""
    listen_socket(host, port, what=what).close()


async def serve_health(
    app: Any, sock: socket.socket, *, backend: str, ssl: SSLFiles | None,
    shutdown_trigger: Callable[[], Awaitable[Any]],
    task_status: anyio.abc.TaskStatus[Any] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on the listening ``sock`` until ``shutdown_trigger()`` returns; the caller closes ``sock``
    (Hypercorn serves a duplicate of it, so closing it once this has started does not stop the server)."""
    await serve_http(app, sock=sock, backend=backend, ssl=ssl, shutdown_timeout_s=_DRAIN_S,
                     shutdown_trigger=shutdown_trigger, task_status=task_status)
