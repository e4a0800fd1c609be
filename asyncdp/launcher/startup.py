"""Startup of one node: perform the launch table's start order, waiting for each stage's readiness (spec §5.3).

Theory of operation
-------------------
:func:`start_node` walks the :class:`~asyncdp.launcher.plan.LaunchTable` stage by stage:

1. the coordinator, when the table says it runs here: spawned, then its ``CoordinatorListening`` addresses
   (E8, ``--dp-coordinator-startup-timeout-s``); its client address goes into every API server's role config;
2. the API servers: one in-process (it shares the launcher's HTTP socket) or one child per row, each reporting
   its client listener (``ApiListening``);
3. the MoE group's torch.distributed rendezvous store when the table hosts it here (port 0, spec §5.5);
4. the handshake listener, then one engine per row (:mod:`.handshake` answers each);
5. every engine's and every API server's ``ChildReady`` within ``--engine-ready-timeout-s`` (E9).

:func:`run_startup` runs it so that a signal or a failure seen elsewhere ends every startup wait at once, and
turns a startup exception into the node's failure (exit 1).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from asyncdp import messages as m
from asyncdp.apiserver.client import DPClient
from asyncdp.apiserver.node_table import NodeTable
from asyncdp.apiserver.process import api_config, bind_client_listener, serve_api
from asyncdp.config.roles import api_server_role, coordinator_role, engine_role
from asyncdp.errors import ChildExited, StartupError
from asyncdp.launcher.children import spawn
from asyncdp.launcher.handshake import handshake
from asyncdp.launcher.node import RunningNode
from asyncdp.launcher.plan import COORDINATOR, ENGINE, ProcessSpec
from asyncdp.transport import listen, serve_links
from asyncdp.transport.control import ChildProcess

log = logging.getLogger("asyncdp.launcher")  # the role's one log name, whichever module logs

API_LISTENING_TIMEOUT_S = 60.0


async def run_startup(node: RunningNode, start: Callable[[], Awaitable[None]]) -> None:
    """Run ``start`` until it returns, fails, or ``node.shutdown`` is set (a signal, a failed handshake).

    Startup waits last up to ``--engine-ready-timeout-s``; a SIGTERM or a failure seen elsewhere must end them
    at once, not when the deadline expires.
    """
    async with anyio.create_task_group() as startup:

        async def abort_on_shutdown() -> None:
            await node.shutdown.wait()
            startup.cancel_scope.cancel()

        startup.start_soon(abort_on_shutdown)
        try:
            await start()
        except (ChildExited, StartupError, TimeoutError) as exc:
            node.fail(f"startup failed: {exc}")
        except Exception as exc:
            log.exception("startup failed")
            node.fail(f"startup failed: {exc}")
        startup.cancel_scope.cancel()


async def start_node(node: RunningNode, tg: anyio.abc.TaskGroup) -> None:
    """Perform the table's start order (module docstring)."""
    table = node.table
    if table.role(COORDINATOR):
        await _start_coordinator(node, tg, table.role(COORDINATOR)[0])
    inproc_ready: anyio.Event | None = None
    api_children: list[ChildProcess] = []
    apis = table.api_servers
    if len(apis) == 1 and apis[0].in_process:
        inproc_ready = await _start_inproc_api(node, tg, apis[0])
    else:
        api_children = await _start_api_children(node, tg, apis)
    if table.rendezvous_here:
        await _host_rendezvous(node)
    engines = await _start_engines(node, tg, table.role(ENGINE))
    await _wait_all(node, engines)
    if inproc_ready is not None:
        await _wait_inproc_api(node, inproc_ready)
    else:
        await _wait_all(node, api_children)


async def _start_coordinator(node: RunningNode, tg: anyio.abc.TaskGroup, row: ProcessSpec) -> None:
    coord = await spawn(node, tg, row, coordinator_role(node.plan, socket_dir=node.tmpdir))
    with anyio.fail_after(node.plan.coordinator_startup_timeout_s):
        ev = await coord.wait_event(m.CoordinatorListening)
    node.coordinator_addrs = m.CoordinatorAddrs(engine_addr=ev.engine_addr, client_addr=ev.client_addr)


def _coordinator_client_addr(node: RunningNode) -> str | None:
    return node.coordinator_addrs.client_addr if node.coordinator_addrs else None


async def _start_inproc_api(node: RunningNode, tg: anyio.abc.TaskGroup, row: ProcessSpec) -> anyio.Event:
    """The single API server runs in the launcher, on the launcher's HTTP socket. Returns its ready event."""
    role = api_server_role(node.plan, 0, managed_ranks=row.managed_ranks,
                           coordinator_client_addr=_coordinator_client_addr(node), socket_dir=node.tmpdir)
    cfg = api_config(role)
    listener, addr = await bind_client_listener(cfg)
    node.client_addrs.append(m.ClientAddr(client_index=0, addr=addr))
    ready = anyio.Event()

    async def inproc_api() -> None:
        async with anyio.create_task_group() as inner:
            async def run(*, task_status: anyio.abc.TaskStatus[DPClient]) -> None:
                node.inproc_api_code = await serve_api(cfg, node.http_sock, listener, node.api_shutdown,
                                                       task_status=task_status, stop_reason=lambda: node.failure,
                                                       drain=node.inproc_drain)
                node.inproc_api_done.set()
                if node.inproc_api_code:
                    node.fail("the API server stopped: no data-parallel rank can serve")

            try:
                node.inproc_client = await inner.start(run)
            except Exception as exc:  # startup of the API server failed (E9 and friends)
                node.inproc_api_done.set()
                node.fail(f"startup failed: {exc}")
                return
            ready.set()

    tg.start_soon(inproc_api)
    return ready


async def _start_api_children(node: RunningNode, tg: anyio.abc.TaskGroup,
                              rows: tuple[ProcessSpec, ...]) -> list[ChildProcess]:
    """One child per row, each on its own SO_REUSEPORT socket, sharing the node table and the metrics folder."""
    metrics_dir = os.path.join(node.tmpdir, "metrics")
    os.makedirs(metrics_dir)
    env = {"PROMETHEUS_MULTIPROC_DIR": metrics_dir}
    node.node_table, node.node_table_fd = NodeTable.create(len(rows))
    children = []
    for row in rows:
        index = row.client_index or 0
        role = api_server_role(node.plan, index, managed_ranks=row.managed_ranks,
                               coordinator_client_addr=_coordinator_client_addr(node), socket_dir=node.tmpdir,
                               http_shared_port=(node.plan.host, node.http_port), node_table_fd=node.node_table_fd)
        children.append(await spawn(node, tg, row, role, env=env, pass_fds=(node.node_table_fd,)))
    for child in children:
        with anyio.fail_after(API_LISTENING_TIMEOUT_S):
            ev = await child.wait_event(m.ApiListening)
        node.client_addrs.append(m.ClientAddr(client_index=child.rank or 0, addr=ev.client_addr))
    return children


async def _host_rendezvous(node: RunningNode) -> None:
    """A MoE group's torch.distributed rendezvous, hosted here on port 0 (spec §5.5)."""
    from asyncdp.model.distributed import dp_backend, host_rendezvous_store

    plan = node.plan
    host = "127.0.0.1"
    node.rendezvous_store, store_port = await anyio.to_thread.run_sync(host_rendezvous_store, host)
    device = "cuda" if plan.engine.device == "cuda" else "cpu"
    node.dp_group_info = m.DPGroupInfo(master_addr=host, master_port=store_port, dp_size=plan.dp_size,
                                       backend=dp_backend(device))


async def _start_engines(node: RunningNode, tg: anyio.abc.TaskGroup,
                         rows: tuple[ProcessSpec, ...]) -> list[ChildProcess]:
    """The handshake listener, then one engine per row; each engine's handshake runs in the node's task group."""
    link = node.table.link("handshake")
    if link is None or link.action != "bind" or link.transport != "unix":  # the CLI refuses the other modes
        raise StartupError(f"this build cannot host a {link.transport if link else 'missing'} handshake listener")
    hs_listener, node.handshake_addr = await listen("unix", directory=node.tmpdir, prefix="asyncdp-handshake")
    tg.start_soon(serve_links, hs_listener, lambda link: handshake(node, link))
    threads = max(1, (os.cpu_count() or 1) // node.plan.dp_size)
    engines = []
    for row in rows:
        assert row.dp_rank is not None, "an engine row has a rank"
        role = engine_role(node.plan, row.dp_rank, handshake_addr=node.handshake_addr, torch_threads=threads)
        engines.append(await spawn(node, tg, row, role))
    return engines


async def _wait_all(node: RunningNode, children: list[ChildProcess]) -> None:
    with anyio.fail_after(node.plan.engine_ready_timeout_s):
        for child in children:
            await child.wait_event(m.ChildReady)


async def _wait_inproc_api(node: RunningNode, ready: anyio.Event) -> None:
    async with anyio.create_task_group() as waiters:
        async def api_ready() -> None:
            await ready.wait()
            waiters.cancel_scope.cancel()

        async def api_failed() -> None:
            await node.inproc_api_done.wait()
            waiters.cancel_scope.cancel()

        waiters.start_soon(api_ready)
        waiters.start_soon(api_failed)
    if not ready.is_set():
        raise StartupError(node.failure or "the API server did not start")
