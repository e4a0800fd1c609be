"""The node's HTTP port shared by several API processes through ``SO_REUSEPORT`` (spec §10: one port, N processes).

With one shared listening socket, whichever process wakes first accepts a whole burst (asyncio accepts up to
its backlog per wake-up), so one API server gets every connection. Instead, each API process binds its own
listener on the same address with ``SO_REUSEPORT`` and the kernel spreads new connections across them.

The launcher binds first, with ``SO_REUSEPORT`` but without listening (:func:`reserve_shared_port`): a busy port
fails before any child starts (E11), port 0 resolves to a real port, and no connection is ever queued on a
socket nobody accepts on. The API children then bind and listen (:func:`listen_shared_port`). The kernel only
lets processes of the same user share a port this way.

That check cannot keep out a second deployment of the same user: started while the first one's API children do
not listen yet (or racing its own check against the first one's), it binds the port as well, and the kernel
splits the connections between the two deployments without a word. So before it binds, the launcher takes the
port's lock (:func:`lock_http_port`, :mod:`.port_lock`: an abstract Unix socket name, gone when the launcher
exits, however) and holds it for the deployment's lifetime; a second deployment fails at once with the error a
busy port gives (E11).
"""

from __future__ import annotations

import socket

from asyncdp.errors import StartupError
from asyncdp.transport.port_lock import hold_port

# The pending-connection queue of every HTTP listener (the kernel caps it at net.core.somaxconn). Hypercorn listens
# again on the socket it is handed, with its own default of 100 unless told: a burst of clients past that waited
# for SYN retries.
LISTEN_BACKLOG = 4096


def bind_listener(host: str | None, port: int, *, reuse_port: bool = True, backlog: int | None = None) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``SO_REUSEADDR``: a previous run's TIME_WAIT does not count; and
    ``SO_REUSEPORT`` unless told otherwise), listening when ``backlog`` is given. Any failure is one
    ``StartupError`` naming the address."""
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host or "0.0.0.0", port))
        if backlog is not None:
            sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host or '0.0.0.0'}:{port}: {exc.strerror}") from None
    return sock


def reserve_shared_port(host: str | None, port: int) -> socket.socket:
    """The launcher's socket: bound with ``SO_REUSEPORT``, not listening. Keep it open for the deployment.

    ``SO_REUSEPORT`` would also let a second deployment of the same user bind the port, and the kernel would then
    split the connections between the two without a word. So the port is first bound and listened on alone,
    without ``SO_REUSEPORT``: that fails while anyone listens there (E11). A deployment whose API children do not
    listen yet is not seen that way: the launcher holds the port's lock (:func:`lock_http_port`) before this."""
    if port:
        bind_listener(host, port, reuse_port=False, backlog=1).close()
    return bind_listener(host, port)


def listen_shared_port(host: str | None, port: int, backlog: int = LISTEN_BACKLOG) -> socket.socket:
    """One API process's own listener on the shared port."""
    return bind_listener(host, port, backlog=backlog)


def shown_address(host: str | None, port: int) -> str:
    """``host:port`` for a message (None: all interfaces; an IPv6 host in brackets)."""
    host = host or "0.0.0.0"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def lock_http_port(host: str | None, port: int, *, what: str = "") -> socket.socket:
    """The deployment's lock of ``port`` (:func:`~asyncdp.transport.port_lock.hold_port`), held until it is closed;
    another deployment holding it is the ``StartupError`` of a busy port (E11), naming ``what`` (the port's role,
    if any), the address and the holder's pid."""
    try:
        return hold_port(port)
    except OSError as exc:
        named = f"{what} " if what else ""
        raise StartupError(f"cannot listen on {named}{shown_address(host, port)}: {exc.strerror or exc}") from None
