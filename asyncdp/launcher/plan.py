"""The launch table: what one node of a deployment starts, in which order, and which links it binds or joins.

Theory of operation
-------------------
:func:`plan` is a pure function of the resolved :class:`~asyncdp.config.deployment.DeploymentConfig` (spec §3.3,
§3.4, §5.1, §5.4, §11). It never re-derives the mode from ``dp_size``: every answer comes from the fields
``resolve()`` computed (``mode``, ``dp_start_rank``, ``dp_size_local``, ``api_server_count``, ``managed_ranks``,
``coordinator_here``, ``local_engines_only``). The launcher's async shell (:mod:`asyncdp.launcher.head`) only
performs the table it returns; modes this build cannot run yet are planned (and unit-tested) all the same, and
the CLI refuses them before the shell starts.

A :class:`LaunchTable` says:

* ``top``: what the top process of this node is: the single API server doubling as launcher
  (``"api_server"``), a launcher in front of several API servers (``"launcher"``), a headless launcher
  (``"headless"``) or the multi-port supervisor (``"supervisor"``);
* ``processes``: every child (and the in-process API server) in start order, stages
  coordinator -> API servers -> engines; ``stop_order`` is API servers -> engines -> coordinator (spec §12.5:
  the front-ends drain first, so it is not the reverse of the start order);
* ``coordinator``: ``"here"`` (this node starts it), ``"remote"`` (another node hosts it; addresses arrive with
  ``HandshakeInit`` or ``EngineReady``) or ``"none"``; ``rendezvous_here``: this node hosts the MoE group's
  torch.distributed store (the rank-0 front-end, port 0, spec §5.5);
* ``links``: each listener this node binds and each remote listener it connects to, with its transport: Unix when
  every peer is on this host, TCP on the DP address otherwise (port 0 except the user-facing rpc port);
* ``children``: the multi-port supervisor's per-rank tables (each an external-LB server of its own).
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncdp.config.deployment import DeploymentConfig

# Process roles of a table row; the top process itself is not a row, except the in-process API server.
COORDINATOR, API_SERVER, ENGINE, SERVER = "coordinator", "api", "engine", "server"
_START_STAGES = (COORDINATOR, API_SERVER, ENGINE, SERVER)
_STOP_STAGES = (SERVER, API_SERVER, ENGINE, COORDINATOR)


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """One process this node starts (a row of the table)."""

    role: str  # COORDINATOR | API_SERVER | ENGINE | SERVER (a multi-port child: API server + engine)
    name: str  # the process title (spec §3.4)
    log_prefix: str
    dp_rank: int | None = None  # ENGINE, SERVER: the global rank
    local_index: int | None = None  # ENGINE, SERVER: index among this node's ranks (picks its devices)
    client_index: int | None = None  # API_SERVER: its index on this node's front-end
    managed_ranks: tuple[int, ...] = ()  # API_SERVER: global ranks it routes to
    in_process: bool = False  # API_SERVER: runs inside the launcher (one API server on the node)
    handshakes: tuple[str, ...] = ()  # ENGINE: names of the handshake links it joins ("handshake", "local_handshake")
    port: int | None = None  # SERVER: its HTTP port


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """One link end on this node: a listener it binds, or a remote listener it connects to (spec §5.1)."""

    name: str  # "handshake" | "local_handshake" | "client" | "coordinator_engine" | "coordinator_client" | "node"
    action: str  # "bind" | "connect"
    transport: str  # "unix" | "tcp"
    host: str | None = None  # TCP: the DP address (bind or connect)
    # TCP bind: 0 = the kernel picks and the binder reports it, else the user-facing rpc port. TCP connect: the
    # rpc port, or 0 when the address is learned at runtime (HandshakeInit, EngineReady).
    port: int = 0

    @property
    def crosses_nodes(self) -> bool:
        return self.transport == "tcp"


@dataclass(frozen=True, slots=True)
class LaunchTable:
    """What one node starts, in order, and which links it binds or joins."""

    mode: str
    top: str  # "api_server" | "launcher" | "headless" | "supervisor"
    processes: tuple[ProcessSpec, ...]  # in start order
    coordinator: str  # "here" | "remote" | "none"
    rendezvous_here: bool
    client_count: int  # API servers of this node's front-end (the engines' client_count)
    links: tuple[LinkSpec, ...] = ()
    children: tuple[LaunchTable, ...] = ()  # multi-port: one table per supervised rank

    def role(self, role: str) -> tuple[ProcessSpec, ...]:
        return tuple(p for p in self.processes if p.role == role)

    @property
    def engine_ranks(self) -> tuple[int, ...]:
        """Global ranks of the engines this node starts (a multi-port supervisor's through its children)."""
        return tuple(p.dp_rank for p in self.processes if p.role in (ENGINE, SERVER) and p.dp_rank is not None)

    @property
    def api_servers(self) -> tuple[ProcessSpec, ...]:
        return self.role(API_SERVER)

    @property
    def stop_order(self) -> tuple[str, ...]:
        """Roles in the order they stop: front-ends drain first, the coordinator outlives the engines."""
        return tuple(r for r in _STOP_STAGES if self.role(r))

    def link(self, name: str) -> LinkSpec | None:
        return next((link for link in self.links if link.name == name), None)

    @property
    def crosses_nodes(self) -> bool:
        """Some link of this node is TCP: the deployment spans launches (nodes), which must share its secret."""
        return any(link.crosses_nodes for link in self.links)


def plan(dep: DeploymentConfig) -> LaunchTable:
    """This node's launch table for the resolved deployment ``dep``. Pure."""
    if dep.mode == "multi-port":
        return _plan_supervisor(dep)
    coordinator = "here" if dep.coordinator_here else ("remote" if _coordinator_needed(dep) else "none")
    apis = _api_servers(dep)
    engines = _engines(dep)
    procs = [*([_coordinator_row()] if coordinator == "here" else []), *apis, *engines]
    order = {role: i for i, role in enumerate(_START_STAGES)}
    procs.sort(key=lambda p: order[p.role])  # stable: the rows of one stage keep their index order
    if dep.headless:
        top = "headless"
    else:
        top = "api_server" if dep.api_server_count == 1 else "launcher"
    return LaunchTable(
        mode=dep.mode, top=top, processes=tuple(procs), coordinator=coordinator,
        rendezvous_here=_owns_rank_0(dep) and dep.waves, client_count=dep.api_server_count,
        links=_links(dep, coordinator))


def _coordinator_needed(dep: DeploymentConfig) -> bool:
    """§3.3: a coordinator exists iff ``dp > 1 and (MoE or not external)``."""
    return dep.dp_size > 1 and (dep.is_moe or not dep.external)


def _owns_rank_0(dep: DeploymentConfig) -> bool:
    """The rank-0 front-end: the head of internal LB (rank 0 even with no local engines), the hybrid node with
    ``S == 0``, external rank 0. It hosts the handshake listener every engine joins (spec §5.4)."""
    return not dep.headless and dep.dp_start_rank == 0


def _all_local(dep: DeploymentConfig) -> bool:
    """Every engine of the deployment runs on this node (spec §5.1: Unix links only)."""
    return dep.dp_size_local == dep.dp_size and not dep.external


def _coordinator_row() -> ProcessSpec:
    return ProcessSpec(role=COORDINATOR, name="asyncdp-coordinator", log_prefix="DPCoordinator")


def _api_servers(dep: DeploymentConfig) -> list[ProcessSpec]:
    if dep.headless:
        return []
    count = dep.api_server_count
    return [ProcessSpec(role=API_SERVER, name=f"asyncdp-api-{i}", log_prefix="APIServer" if count == 1 else
                        f"APIServer_{i}", client_index=i, managed_ranks=dep.managed_ranks, in_process=count == 1)
            for i in range(count)]


def _engines(dep: DeploymentConfig) -> list[ProcessSpec]:
    handshakes = ("handshake",) if _owns_rank_0(dep) or dep.headless else ("handshake", "local_handshake")
    return [ProcessSpec(role=ENGINE, name=f"asyncdp-engine-dp{r}", log_prefix=f"EngineCore_DP{r}", dp_rank=r,
                        local_index=i, handshakes=handshakes)
            for i, r in enumerate(dep.local_ranks)]


def _tcp(name: str, action: str, dep: DeploymentConfig, port: int = 0) -> LinkSpec:
    return LinkSpec(name=name, action=action, transport="tcp", host=dep.data_parallel_address, port=port)


def _links(dep: DeploymentConfig, coordinator: str) -> tuple[LinkSpec, ...]:
    """§5.1 and §5.4: the listeners this node binds and the remote ones it joins."""
    rpc = dep.data_parallel_rpc_port
    links: list[LinkSpec] = []
    if dep.headless:  # the node link and every local engine's handshake go to the head
        links.append(_tcp("node", "connect", dep, rpc))
        links.append(_tcp("handshake", "connect", dep, rpc))
        return tuple(links)
    if _owns_rank_0(dep):
        links.append(LinkSpec(name="handshake", action="bind", transport="unix") if _all_local(dep)
                     else _tcp("handshake", "bind", dep, rpc))
    else:  # hybrid S > 0, external r > 0: its engines join both the head and this front-end
        links.append(_tcp("handshake", "connect", dep, rpc))
        if dep.dp_size_local:
            links.append(LinkSpec(name="local_handshake", action="bind", transport="unix"))
    links.append(LinkSpec(name="client", action="bind", transport="unix") if not _remote_engines(dep)
                 else _tcp("client", "bind", dep))
    if coordinator == "here":
        links.append(LinkSpec(name="coordinator_engine", action="bind", transport="unix") if _all_local(dep)
                     else _tcp("coordinator_engine", "bind", dep))
        links.append(LinkSpec(name="coordinator_client", action="bind", transport="unix") if not dep.local_engines_only
                     else _tcp("coordinator_client", "bind", dep))
    elif coordinator == "remote":  # the address comes with the local engines' EngineReady (spec §5.4)
        links.append(_tcp("coordinator_client", "connect", dep))
    return tuple(links)


def _remote_engines(dep: DeploymentConfig) -> bool:
    """Some engine this node's API servers manage runs on another node (client links then are TCP)."""
    local = set(dep.local_ranks)
    return any(r not in local for r in dep.managed_ranks)


def _plan_supervisor(dep: DeploymentConfig) -> LaunchTable:
    """§11.3: one external-LB server per local rank, each with its own port and its own table."""
    children: list[LaunchTable] = []
    rows: list[ProcessSpec] = []
    for i, child in enumerate(dep.children):
        child_dep = child.deployment
        assert child_dep is not None, "resolve() resolves every multi-port child"
        children.append(plan(child_dep))
        rank = child_dep.dp_start_rank
        rows.append(ProcessSpec(role=SERVER, name=f"asyncdp-api-dp{rank}", log_prefix=f"APIServer_DP{rank}",
                                dp_rank=rank, local_index=i, port=child.port))
    return LaunchTable(mode=dep.mode, top="supervisor", processes=tuple(rows), coordinator="none",
                       rendezvous_here=False, client_count=0, children=tuple(children))
