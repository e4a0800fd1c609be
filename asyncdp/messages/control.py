"""The control-channel messages between a parent process and its children: the worker hello carrying the
role's config (:mod:`asyncdp.config.roles`), commands down (``Stopping``, ``Shutdown``, ``ProcessTable``), events
up (``CoordinatorListening``, ``ApiListening``, ``ChildReady``, ``ApiStopped``, ``PeerLeftGroup``).
:data:`ControlMessage` is their union.
"""

from __future__ import annotations

from typing import Union

from asyncdp.config.roles import RoleConfig
from asyncdp.messages.link import _Msg
from asyncdp.messages.node_link import NodeRow, ProcessRow


class WorkerHello(_Msg, frozen=True):
    """Parent -> child, the first frame: which role to run, with its config, and how to run it."""

    role: RoleConfig
    name: str
    parent_pid: int
    backend: str = "asyncio"
    parent_death_signal: bool = True  # PR_SET_PDEATHSIG; False: watch the parent's pidfd (trio: spawn_child)
    log_prefix: str = ""
    log_level: str = "INFO"
    run_dir: str | None = None  # removed by an orphaned child (the parent was SIGKILLed)


class Stopping(_Msg, frozen=True):
    """Launcher -> coordinator and engines: an orderly shutdown of the node begins; engines leaving now are not
    losses (coordinator), and a MoE peer's orderly departure before this engine's own turn is its stop (engine)."""


class Shutdown(_Msg, frozen=True):
    """Launcher -> API server or engine: stop in order; ``reason`` names a teardown to abandoned requests."""

    reason: str | None = None


class ProcessTable(_Msg, frozen=True):
    """Launcher -> API server: the deployment's processes and nodes once every one started (again when a node
    is lost)."""

    processes: list[ProcessRow]
    nodes: list[NodeRow] = []


class CoordinatorListening(_Msg, frozen=True):
    """Coordinator -> launcher: it is serving; the addresses it bound (spec §5.1: the binder reports them)."""

    engine_addr: str
    client_addr: str


class ApiListening(_Msg, frozen=True):
    """API server -> launcher: its client listener is bound (engines get this address in HandshakeInit)."""

    client_addr: str


class ChildReady(_Msg, frozen=True):
    """Engine or API server -> launcher: ready to serve (an engine: handshake done; an API server: every managed
    rank sent EngineReady)."""

    dp_rank: int | None = None


class ApiStopped(_Msg, frozen=True):
    """API server -> launcher, at exit: its drain counts, for the launcher's one "stopped" line."""

    drained: int
    aborted: int


class PeerLeftGroup(_Msg, frozen=True):
    """Engine -> launcher, before it exits 1: its MoE group ended because a peer left it in order (the coordinator's
    node stopped) while this engine was not asked to stop. Its launcher stops the node and exits 0 only if its own
    request to stop follows within ``PEER_STOP_GRACE_S`` (spec §8.7: a whole group's signals arrive apart)."""

    dp_rank: int
    reason: str  # the teardown's ("teardown from the coordinator: rank 0 shut down")


ControlMessage = Union[  # noqa: UP007 - msgspec needs a real Union of tagged structs
    WorkerHello, Stopping, Shutdown, ProcessTable, CoordinatorListening, ApiListening, ChildReady, ApiStopped,
    PeerLeftGroup,
]
