"""The node link's messages (spec §5.7): what a launcher and the head say to each other, and the rows of the
process and node tables they carry (which ``/server_info`` shows, and the control channel hands to API servers).
"""

from __future__ import annotations

from typing import Any

import msgspec

from asyncdp.messages.link import _Msg


class ProcessRow(msgspec.Struct, frozen=True, kw_only=True):
    """One process of the node, as ``/server_info`` shows it."""

    role: str
    rank: int | None
    client_index: int | None
    pid: int
    host: str
    ports: dict[str, int | str | None]
    node: int = 0  # the launch (node) it belongs to: an index into the NodeRow list, 0 the answering one's head


class NodeRow(msgspec.Struct, frozen=True, kw_only=True):
    """One node (launch) of the deployment, as ``/server_info`` shows it."""

    node: int
    role: str  # "head" | "headless" | "hybrid" | "external"
    host: str
    pid: int | None  # its launcher's pid, when known
    ranks: list[int]
    state: str  # "alive" | "lost" | "stopped"


class NodeHello(_Msg, frozen=True):
    """Launcher -> head, the first frame of a node link (spec §5.7): which ranks it brings, and the parallel
    configuration its engines run (a headless node says it before they start: a mismatch names the fields).
    A hybrid node with S > 0 or an external rank server opens one once it serves, with its processes, so that
    every endpoint's ``/server_info`` shows the whole deployment."""

    start_rank: int
    size_local: int
    host: str
    pid: int
    protocol_version: int
    config_summary: dict[str, Any]
    role: str = "headless"  # "headless" | "hybrid" | "external"
    processes: list[ProcessRow] = []


class NodeAccepted(_Msg, frozen=True):
    """Head -> launcher: the node belongs to the deployment (a headless node's engines may start)."""

    head_host: str
    head_pid: int
    node_index: int = 0


class NodeTopology(_Msg, frozen=True):
    """Head -> hybrid/external nodes: the deployment's processes and nodes, each time they change."""

    processes: list[ProcessRow]
    nodes: list[NodeRow]


class NodeShutdown(_Msg, frozen=True):
    """Head -> headless launchers: an orderly shutdown of the deployment; drain for ``shutdown_timeout`` s."""

    reason: str
    shutdown_timeout: float


class NodeStopping(_Msg, frozen=True):
    """Headless launcher -> head [ours]: this node stops in order on its own (a signal to it alone); its ranks
    drain for up to ``shutdown_timeout`` s, then its node link closes. Its departure is no loss."""

    reason: str
    shutdown_timeout: float


class NodeStopped(_Msg, frozen=True):
    """Headless launcher -> head [ours], the last frame of a node link, best effort: how the node ended, once its
    engines are all gone and its exit status is known. ``clean`` is exit status 0 (every engine exited by itself,
    in order); otherwise ``detail`` says what went wrong (which ranks were killed or crashed, their exit codes)."""

    clean: bool
    detail: str = ""
