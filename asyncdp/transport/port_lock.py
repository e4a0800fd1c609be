"""One deployment per port number on a machine: a lock the launcher (or the supervisor, or ``asyncdp route``) holds
for its lifetime.

The node's HTTP port is shared by the API processes through ``SO_REUSEPORT`` (:mod:`.http_socket`), and the kernel
lets *any* process of the same user bind such a port. A second deployment started on the same ``--port`` while the
first is still starting (its launcher has bound the port, no API process listens yet) passes the busy-port check,
binds the port too, and the kernel then splits the connections between the two deployments without a word.
Nothing in the socket layer can refuse it, so the launcher takes this lock first and holds it until it exits.

The lock is the abstract Unix socket name ``\\0asyncdp-port-PORT``, bound and listening (:func:`hold_port`). An
abstract name belongs to a socket, not to a file: it is gone the moment its process exits, however it exits, so a
crashed or killed deployment never blocks the next one and nothing is left to clean up. Abstract names live in
the network namespace, as ports do: two containers with their own network each have their own names and ports.

The lock is per port number, whatever the address: a deployment on ``0.0.0.0:8000`` and one on
``127.0.0.1:8000`` would share the port through ``SO_REUSEPORT`` as well (the more specific one wins the
connections to it), so two asyncdp deployments on one machine need two port numbers. The listening name lets a
second claimant read the holder's pid (``SO_PEERCRED``), for the error message; it never accepts.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
from collections.abc import Callable

__all__ = ["bind_locked", "hold_port", "lock_name"]

_NAME = "asyncdp-port-{port}"


def lock_name(port: int) -> bytes:
    """The abstract socket address (leading NUL) that locks ``port``."""
    return b"\0" + _NAME.format(port=port).encode()


def hold_port(port: int) -> socket.socket:
    """Take the lock of ``port`` and return it; close it (or exit) to let go. Never inherited by children.

    ``OSError(EADDRINUSE)`` when another process holds it; its message names the holder's pid when it can be read.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(lock_name(port))
        sock.listen(8)
    except OSError as exc:
        sock.close()
        if exc.errno != errno.EADDRINUSE:
            raise
        holder = _holder_pid(port)
        held_by = "another asyncdp deployment" + (f", pid {holder}" if holder else "")
        raise OSError(errno.EADDRINUSE, f"{os.strerror(errno.EADDRINUSE)} (held by {held_by})") from None
    return sock


def _holder_pid(port: int) -> int | None:
    """The pid of the process that listens on the lock of ``port`` (its ``SO_PEERCRED``), None if unknown."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)  # a full backlog answers at once instead of waiting
        try:
            probe.connect(lock_name(port))
            creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return None
    pid = struct.unpack("3i", creds)[0]
    return pid or None


def bind_locked(port: int, bind: Callable[[int], socket.socket],
                lock: Callable[[int], socket.socket] = hold_port) -> tuple[socket.socket, socket.socket]:
    """``bind(port)`` under the port's lock (``lock``: :func:`hold_port`, or a wrapper that words its error): the
    lock is taken before the bind, or right after it on the port the kernel gave for port 0. Returns the socket and
    the lock; when either cannot be had, what was had is closed and the error raised."""
    with contextlib.ExitStack() as undo:
        held = lock(port) if port else None
        if held is not None:
            undo.callback(held.close)
        sock = bind(port)
        undo.callback(sock.close)
        if held is None:
            held = lock(sock.getsockname()[1])
        undo.pop_all()
    return sock, held
