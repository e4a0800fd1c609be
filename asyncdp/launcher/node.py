"""The running node: what the launcher's tasks share while they perform the launch table.

Theory of operation
-------------------
:class:`RunningNode` holds the node's :class:`~asyncdp.config.roles.LaunchPlan`, the
:class:`~asyncdp.launcher.plan.LaunchTable` computed from its deployment, the HTTP socket bound first (E11), and
what startup learns as it goes (the coordinator's and the API servers' addresses, the engines that said Hello and
Ready, the spawned children). ``shutdown`` is the one event every task waits on: a signal sets it, and so does
:meth:`RunningNode.fail`, which records the first failure (the exit status is 1 then), and
:meth:`RunningNode.stop_with_peer`, when a MoE peer left the group in an orderly way first (the exit status is 0
if this node's own request to stop, ``asked_to_stop``, follows within ``PEER_STOP_GRACE_S``). Nothing here starts
a task; the shell (:mod:`.head`, :mod:`.startup`, :mod:`.children`) does.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec

from asyncdp import messages as m
from asyncdp.apiserver.client import DPClient
from asyncdp.apiserver.node_table import NodeTable
from asyncdp.config.deployment import DeploymentConfig
from asyncdp.config.roles import LaunchPlan
from asyncdp.dp.liveness import PEER_STOP_GRACE_S
from asyncdp.launcher.node_book import NodeBook, NodeEntry
from asyncdp.launcher.plan import API_SERVER, COORDINATOR, LaunchTable, plan
from asyncdp.logs import DrainCounts
from asyncdp.transport import Link
from asyncdp.transport.control import ChildProcess

log = logging.getLogger("asyncdp.launcher")  # the role's one log name, whichever module logs


def node_role(dep: DeploymentConfig) -> str:
    """This launch's role among the deployment's nodes: the head owns rank 0's front-end."""
    if dep.headless:
        return "headless"
    return "head" if dep.dp_start_rank == 0 else dep.mode


def book_for(plan: LaunchPlan, summary: dict[str, Any]) -> NodeBook:
    """This launch's node book: its own ranks and role, and the configuration summary other launches must match."""
    dep = plan.deployment
    return NodeBook(dp_size=dep.dp_size, mode=dep.mode, local_ranks=dep.local_ranks, summary=summary,
                    host=socket.gethostname(), pid=os.getpid(), role=node_role(dep), is_moe=plan.is_moe)


@dataclass
class RemoteNodeLink:
    """A headless node's node link, held by the head (spec §5.7)."""

    entry: NodeEntry
    link: Link
    closed: anyio.Event = field(default_factory=anyio.Event)
    stopping: str | None = None  # the reason the node gave in NodeStopping: it stops on purpose


@dataclass
class RunningNode:
    plan: LaunchPlan
    http_sock: socket.socket | None  # None on a headless node (no HTTP)
    tmpdir: str
    shutdown: anyio.Event = field(default_factory=anyio.Event)
    api_shutdown: anyio.Event = field(default_factory=anyio.Event)
    started: bool = False
    failure: str | None = None
    asked_to_stop: anyio.Event = field(default_factory=anyio.Event)  # a signal, or the head's NodeShutdown
    peer_stop: str | None = None  # a MoE peer's orderly departure stopped this node first (stop_with_peer)
    peer_stop_at: float = 0.0  # anyio.current_time() then
    children: list[ChildProcess] = field(default_factory=list)
    client_addrs: list[m.ClientAddr] = field(default_factory=list)
    coordinator_addrs: m.CoordinatorAddrs | None = None
    book: NodeBook | None = None  # the handshake listener's book of nodes and ranks (set by the shell)
    init_ready: anyio.Event = field(default_factory=anyio.Event)  # HandshakeInit's addresses are all known
    ranks_changed: anyio.Event = field(default_factory=anyio.Event)  # a rank became ready or a node was lost
    remote_nodes: list[RemoteNodeLink] = field(default_factory=list)
    head_link: Link | None = None  # a headless (or dense hybrid S > 0) node's node link to the head
    stop_deadline_s: float | None = None  # a headless node told to stop: the head's --shutdown-timeout
    inproc_client: DPClient | None = None
    dp_group_info: m.DPGroupInfo | None = None
    rendezvous_store: Any = None  # the torch TCPStore of a MoE DP group; lives as long as the deployment
    inproc_api_done: anyio.Event = field(default_factory=anyio.Event)
    inproc_api_code: int = 0
    handshake_addr: str = ""
    local_handshake_addr: str = ""  # a hybrid node with S > 0: its own engines' listener
    node_table: NodeTable | None = None  # with several API servers: their shared admission/heartbeat table
    node_table_fd: int = -1
    started_at: float = 0.0  # time.monotonic() when `asyncdp serve` began: the startup line's total
    inproc_drain: DrainCounts = field(default_factory=DrainCounts)
    ranks_deadline: float = math.inf  # anyio time when the engines' --engine-ready-timeout-s ends (E9)

    def __post_init__(self) -> None:
        if self.book is None:  # the shell passes one with the plan's configuration summary (node admission)
            self.book = book_for(self.plan, {})

    @functools.cached_property
    def table(self) -> LaunchTable:
        """What this node starts, from the resolved deployment (never re-derived here)."""
        return plan(self.plan.deployment)

    @property
    def http_port(self) -> int | None:
        if self.http_sock is None:
            return None
        return self.http_sock.getsockname()[1] if self.http_sock.fileno() != -1 else self.plan.port

    def front_end_book(self) -> NodeBook | None:
        """The node book when this node is the head front-end (it owns the TCP handshake listener), else None."""
        link = self.table.link("handshake")
        if link is None or link.action != "bind" or link.transport != "tcp":
            return None
        return self.book

    def ranks_timeout(self) -> str | None:
        """E9 on the head front-end once ``ranks_deadline`` passed with ranks missing: which, and what to do.

        Startup reports a failure seen from then on as this: the coordinator's wait for the engines is as long
        and starts later, and when it ends first its links close, and the engines and the handshakes end after
        them, each a consequence of the ranks that never came."""
        book = self.front_end_book()
        if book is None or not book.missing() or anyio.current_time() < self.ranks_deadline:
            return None
        dep = self.plan.deployment
        return book.timeout_line(self.plan.engine_ready_timeout_s, dep.data_parallel_address,
                                 dep.data_parallel_rpc_port)

    def note_ranks_changed(self) -> None:
        self.ranks_changed.set()
        self.ranks_changed = anyio.Event()

    def fail(self, reason: str) -> None:
        if self.failure is None and not self.shutdown.is_set():
            log.error("%s", reason)
            self.failure = reason
        self.shutdown.set()

    def stop_with_peer(self, reason: str) -> None:
        """A MoE peer left the group in an orderly way before this node was asked to stop. The group cannot go on,
        so the node stops now; its exit status waits for its own request to stop (:meth:`peer_stop_verdict`): a
        whole group's signals reach its nodes a moment apart (spec §8.7: peers that were shutting down exit 0)."""
        if self.shutdown.is_set():
            return
        log.info("%s; stopping this node (exit status 0 if it is asked to stop within %g s)", reason,
                 PEER_STOP_GRACE_S)
        self.peer_stop, self.peer_stop_at = reason, anyio.current_time()
        self.shutdown.set()

    async def peer_stop_verdict(self) -> None:
        """After :meth:`stop_with_peer`: wait what is left of the grace for this node's own request to stop, and
        record a failure (exit status 1) if none came."""
        if self.peer_stop is None or self.asked_to_stop.is_set():
            return
        with anyio.move_on_after(max(0.0, self.peer_stop_at + PEER_STOP_GRACE_S - anyio.current_time())):
            await self.asked_to_stop.wait()
        if not self.asked_to_stop.is_set() and self.failure is None:
            self.failure = f"{self.peer_stop}, and this node was not asked to stop within {PEER_STOP_GRACE_S:g} s"
            log.error("%s", self.failure)

    def process_table(self) -> list[m.ProcessRow]:
        """The deployment's processes for ``/server_info``: the top process first, then every child, then what the
        handshake learned of other nodes (their launchers and engines)."""
        host = socket.gethostname()
        top = {"launcher": "launcher", "headless": "headless_launcher"}.get(self.table.top, "api_server")
        rows = [m.ProcessRow(role=top, rank=None, client_index=0 if top == "api_server" else None,
                             pid=os.getpid(), host=host,
                             ports={"http": self.http_port, "handshake": self.handshake_addr})]
        for ch in self.children:
            ports: dict[str, int | str | None] = {}
            if ch.role == API_SERVER:
                listening = ch.event(m.ApiListening)
                ports = {"http": self.http_port, "client_link": listening.client_addr if listening else None}
            elif ch.role == COORDINATOR and self.coordinator_addrs:
                ports = {"engine_link": self.coordinator_addrs.engine_addr,
                         "client_link": self.coordinator_addrs.client_addr}
            is_api = ch.role == API_SERVER
            rows.append(m.ProcessRow(role="api_server" if is_api else ch.role, rank=None if is_api else ch.rank,
                                     client_index=ch.rank if is_api else None, pid=ch.pid, host=host, ports=ports))
        book = self.book
        if book is not None:
            for remote in self.remote_nodes:
                entry = remote.entry
                if entry.role != "headless":  # it reported its own processes
                    rows.extend(msgspec.structs.replace(row, node=entry.index) for row in entry.processes
                                if row.role != "engine")
                    continue
                rows.append(m.ProcessRow(role="headless_launcher", rank=None, client_index=None,
                                         pid=entry.pid or 0, host=entry.host, ports={}, node=entry.index))
            local = set(self.plan.deployment.local_ranks)
            for rank, hello in sorted(book.connected.items()):
                owner = book.node_of(rank)
                if rank not in local and owner is not None:  # (a lost node's engines are gone with it)
                    rows.append(m.ProcessRow(role="engine", rank=rank, client_index=None, pid=hello.pid,
                                             host=hello.host, ports={}, node=owner.index))
        return rows

    def node_rows(self) -> list[m.NodeRow]:
        return self.book.rows() if self.book is not None else []
