"""Where a rank's gloo pair sockets listen: on the interface this host reaches the DP address from.

gloo, unless ``GLOO_SOCKET_IFNAME`` names interfaces, listens on the address the machine's hostname resolves to,
whatever ``--data-parallel-address`` says: on a host whose name resolves to its LAN address, a one-node deployment
on ``-dpa 127.0.0.1`` offered its ranks' pair sockets (which authenticate nobody) to the LAN, and on one whose
name resolves to a loopback alias (``127.0.1.1``, Debian's default) a rank on another node could not reach them.
:func:`gloo_interface` names the interface that holds the local IPv4 address a connection to the rendezvous store
leaves from (``lo`` for a store on 127.0.0.1; the interface facing the head on a headless node); the engine sets
it before the group is made (:func:`pin_gloo_interface`). An operator's own ``GLOO_SOCKET_IFNAME`` wins; an IPv6
DP address, or an address that is not its interface's primary one (gloo would bind the primary), changes nothing.
Linux only (the interface's address is read with ``SIOCGIFADDR``); elsewhere nothing changes.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Mapping

from asyncdp.config.flags import environ

GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
_SIOCGIFADDR = 0x8915  # Linux


def local_address_towards(host: str, port: int) -> str | None:
    """The local IPv4 address a connection to ``host:port`` leaves from (a UDP connect: nothing is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host, port))
            return str(sock.getsockname()[0])
    except OSError:  # an IPv6 address, a name that does not resolve, no route
        return None


def interface_address(name: str) -> str | None:
    """The primary IPv4 address of interface ``name``, or None (no IPv4 address, not Linux)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
    except OSError:
        return None
    return socket.inet_ntoa(answer[20:24])


def gloo_interface(host: str, port: int) -> str | None:
    """The interface whose primary IPv4 address is the one this host reaches ``host:port`` from, or None."""
    local = local_address_towards(host, port)
    if local is None:
        return None
    for _, name in socket.if_nameindex():
        if interface_address(name) == local:
            return name
    return None


def gloo_environment(host: str, port: int, env: Mapping[str, str]) -> dict[str, str]:
    """What to add to the environment so that gloo listens towards ``host:port``: nothing when ``env`` names
    interfaces already or none was found."""
    if env.get(GLOO_SOCKET_IFNAME):
        return {}
    name = gloo_interface(host, port)
    return {GLOO_SOCKET_IFNAME: name} if name else {}


def pin_gloo_interface(host: str, port: int) -> str | None:
    """Set ``GLOO_SOCKET_IFNAME`` for this process (torch reads it each time it makes a gloo group); returns the
    interface gloo will listen on when one is set, the operator's included, else None."""
    os.environ.update(gloo_environment(host, port, environ()))  # torch reads the C environment, not flags
    return environ().get(GLOO_SOCKET_IFNAME) or None
