"""Strangers on a deployment's links, for the end-to-end tests of the deployment secret: find every listener of a
process tree (the Unix sockets of its run directory, the TCP ports it listens on, from ``/proc``), connect to one
with a plain socket, send one well-formed asyncdp frame, and read what comes back until the deployment closes
the connection."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterable
from pathlib import Path

from asyncdp import messages as m

READ_TIMEOUT_S = 15.0  # more than the handshake's deadline (5 s): a listener that waits for it still answers


def frame(msg: m.Message) -> bytes:
    payload = m.encode(msg)
    return struct.pack(">I", len(payload)) + payload


def valid_looking_first_frame(listener: str) -> bytes:
    """The first frame a real peer of ``listener`` (a Unix socket's name, or "tcp") would send."""
    if "handshake" in listener or listener == "rpc":
        return frame(m.Hello(protocol_version=m.PROTOCOL_VERSION, dp_rank=0, local=True, headless=False,
                             host="stranger", pid=1, launcher_pid=1))
    if "coord-client" in listener:
        return frame(m.Subscribe(client_id=0))
    if "client" in listener:
        return frame(m.EngineReady(dp_rank=0, max_model_len=512, num_kv_blocks=64, block_size=16,
                                   coordinator_client_addr=None))
    return frame(m.Subscribe(dp_rank=0))


def poke(address: str | tuple[str, int], data: bytes) -> tuple[bytes, bool]:
    """Connect (a Unix path, or a TCP (host, port)), send ``data``, read until the peer closes. Returns what came
    back and whether the peer closed (False: still open after ``READ_TIMEOUT_S``)."""
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family) as sock:
        sock.settimeout(READ_TIMEOUT_S)
        sock.connect(address)
        sock.sendall(data)
        got = b""
        try:
            while chunk := sock.recv(4096):
                got += chunk
        except TimeoutError:
            return got, False
        except ConnectionResetError:  # closed with our bytes unread: closed all the same
            pass
        return got, True


def frames_in(data: bytes) -> list[m.Message]:
    out = []
    while len(data) >= 4:
        (size,) = struct.unpack(">I", data[:4])
        out.append(m.decode(data[4:4 + size]))
        data = data[4 + size:]
    return out


def run_sockets(run_root: Path) -> list[Path]:
    """The Unix sockets of the run directories under ``run_root`` (the deployment's ``TMPDIR``)."""
    return sorted(run_root.glob("asyncdp-*/*.sock"))


def listening_tcp_ports(pids: Iterable[int]) -> set[int]:
    """The TCP ports the processes ``pids`` listen on: their sockets' inodes matched against ``/proc/net/tcp``."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
