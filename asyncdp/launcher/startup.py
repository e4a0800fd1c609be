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

import functools
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from asyncdp import messages as m
from asyncdp.apiserver.client import DPClient
from asyncdp.apiserver.node_table import NodeTable
from asyncdp.apiserver.process import api_config, bind_client_listener, serve_api
from asyncdp.config.deployment import threads_per_engine
from asyncdp.config.roles import api_server_role, coordinator_role, engine_role
from asyncdp.errors import ChildExited, StartupError, leaf_exceptions
from asyncdp.launcher.children import publish_process_table, spawn
from asyncdp.launcher.handshake import handshake
from asyncdp.launcher.node import RunningNode
from asyncdp.launcher.plan import COORDINATOR, ENGINE, ProcessSpec
from asyncdp.transport import listen, serve_links
from asyncdp.transport.control import ChildProcess

log = logging.getLogger("asyncdp.launcher")  # the role's one log name, whichever module logs

API_LISTENING_TIMEOUT_S = 60.0
PROGRESS_EVERY_S = 10.0  # "waiting for ..." lines during startup (spec §2.5)


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
            node.fail(f"startup failed: {node.ranks_timeout() or str(exc) or type(exc).__name__}")
        except Exception as exc:
            log.exception("startup failed")
            node.fail(f"startup failed: {exc}")
        startup.cancel_scope.cancel()


async def start_node(node: RunningNode, tg: anyio.abc.TaskGroup) -> None:
    """Perform the table's start order (module docstring).

    ``--engine-ready-timeout-s`` counts from here for the engines and the deployment's ranks (E9): one deadline,
    not one per stage, and it starts before the coordinator, whose own wait for the engines' subscriptions has
    the same length, so that the launcher's failure names the missing ranks before that wait ends them."""
    node.ranks_deadline = anyio.current_time() + node.plan.engine_ready_timeout_s
    table = node.table
    await _bind_handshake(node, tg)
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
    node.init_ready.set()  # every address HandshakeInit carries is known: answer the engines' Hellos
    engines = await _start_engines(node, tg, table.role(ENGINE))
    # The API servers' /server_info shows every process from before they can answer /health 200 (their engines
    # load for seconds yet): published only once startup ended, a client that saw /health 200 at once could read
    # an empty table.
    await publish_process_table(node)
    await _wait_all(node, engines, deadline=node.ranks_deadline)
    await _wait_ranks_ready(node, node.ranks_deadline)
    if inproc_ready is not None:
        await _wait_inproc_api(node, inproc_ready)
    else:
        await _wait_all(node, api_children)


def _tcp_host(node: RunningNode, link_name: str) -> str | None:
    """The DP address when the table says ``link_name`` is bound on TCP (peers on other nodes), else None."""
    link = node.table.link(link_name)
    return link.host if link is not None and link.action == "bind" and link.transport == "tcp" else None


async def _bind_handshake(node: RunningNode, tg: anyio.abc.TaskGroup) -> None:
    """The handshake listener(s) this node hosts, serving at once (spec §5.1, §5.4).

    The head's TCP listener is the user-facing ``--data-parallel-rpc-port``: bound first, so that a busy port
    fails before any child starts, and open for the deployment's life (engines and headless nodes of other
    launches may connect before this node's own children are up: their ``Hello`` waits for ``init_ready``). A
    hybrid node with ``S > 0`` also hosts a Unix listener for its own engines."""
    for name in ("handshake", "local_handshake"):
        link = node.table.link(name)
        if link is None or link.action != "bind":
            continue
        if link.transport == "tcp":
            assert link.host is not None, "a TCP link names its host"
            try:
                listener, addr = await listen("tcp", host=link.host, port=link.port)
            except OSError as exc:
                raise StartupError(f"cannot listen on {link.host}:{link.port} for the data-parallel handshake "
                                   f"(--data-parallel-rpc-port): {exc.strerror or exc}") from None
        else:
            listener, addr = await listen("unix", directory=node.tmpdir, prefix=f"asyncdp-{name}")
        if name == "handshake":
            node.handshake_addr = addr
        else:
            node.local_handshake_addr = addr
        tg.start_soon(functools.partial(serve_links, listener, functools.partial(handshake, node), name=name,
                                        secret=node.plan.link_secret))


async def _start_coordinator(node: RunningNode, tg: anyio.abc.TaskGroup, row: ProcessSpec) -> None:
    role = coordinator_role(node.plan, socket_dir=node.tmpdir, engine_link_host=_tcp_host(node, "coordinator_engine"),
                            client_link_host=_tcp_host(node, "coordinator_client"))
    coord = await spawn(node, tg, row, role)
    timeout_s = node.plan.coordinator_startup_timeout_s
    with anyio.move_on_after(timeout_s) as waited:
        ev = await coord.wait_event(m.CoordinatorListening)
    if waited.cancelled_caught:  # E8
        raise StartupError(f"the DP coordinator did not report its addresses within "
                           f"--dp-coordinator-startup-timeout-s ({timeout_s:g} s)")
    node.coordinator_addrs = m.CoordinatorAddrs(engine_addr=ev.engine_addr, client_addr=ev.client_addr)


def _coordinator_client_addr(node: RunningNode) -> str | None:
    return node.coordinator_addrs.client_addr if node.coordinator_addrs else None


async def _start_inproc_api(node: RunningNode, tg: anyio.abc.TaskGroup, row: ProcessSpec) -> anyio.Event:
    """The single API server runs in the launcher, on the launcher's HTTP socket. Returns its ready event."""
    role = api_server_role(node.plan, 0, managed_ranks=row.managed_ranks,
                           coordinator_client_addr=_coordinator_client_addr(node), socket_dir=node.tmpdir,
                           client_link_host=_tcp_host(node, "client"))
    cfg = api_config(role)
    http_sock = node.http_sock
    assert http_sock is not None, "an API server's node binds its HTTP port first"
    listener, addr = await bind_client_listener(cfg)
    node.client_addrs.append(m.ClientAddr(client_index=0, addr=addr))
    ready = anyio.Event()

    async def inproc_api() -> None:
        async with anyio.create_task_group() as inner:
            async def run(*, task_status: anyio.abc.TaskStatus[DPClient]) -> None:
                node.inproc_api_code = await serve_api(cfg, http_sock, listener, node.api_shutdown,
                                                       task_status=task_status, stop_reason=lambda: node.failure,
                                                       drain=node.inproc_drain)
                node.inproc_api_done.set()
                if node.inproc_api_code:
                    node.fail("the API server stopped: no data-parallel rank can serve")

            try:
                node.inproc_client = await inner.start(run)
            except Exception as exc:  # startup of the API server failed (E9 and friends)
                node.inproc_api_done.set()
                leaves = leaf_exceptions(exc)
                # (after a failure elsewhere the node closes the HTTP socket under it: that failure is the story)
                if node.failure is None and not node.shutdown.is_set() and \
                        not all(isinstance(e, (StartupError, TimeoutError)) for e in leaves):
                    log.error("the API server failed to start", exc_info=exc)
                node.fail("startup failed: " + (node.ranks_timeout() or
                                                "; ".join(str(e) or type(e).__name__ for e in leaves)))
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
                               client_link_host=_tcp_host(node, "client"),
                               http_shared_port=(node.plan.host, node.http_port or node.plan.port),
                               node_table_fd=node.node_table_fd)
        children.append(await spawn(node, tg, row, role, env=env, pass_fds=(node.node_table_fd,)))
    for child in children:
        with anyio.move_on_after(API_LISTENING_TIMEOUT_S) as waited:
            ev = await child.wait_event(m.ApiListening)
        if waited.cancelled_caught:
            raise StartupError(f"{child.name} did not report its client listener within "
                               f"{API_LISTENING_TIMEOUT_S:g} s")
        node.client_addrs.append(m.ClientAddr(client_index=child.rank or 0, addr=ev.client_addr))
    return children


def _rendezvous_store(host: str, device: str) -> tuple[Any, int, str]:
    """In a worker thread: importing torch takes seconds, and the event loop keeps heartbeating meanwhile."""
    from asyncdp.model.distributed import dp_backend, host_rendezvous_store

    store, port = host_rendezvous_store(host)
    return store, port, dp_backend(device)


async def _host_rendezvous(node: RunningNode) -> None:
    """A MoE group's torch.distributed rendezvous, hosted here on the DP address, port 0 (spec §5.5), and this
    launch's nonce, which every rank gets with the store's address in ``HandshakeInit.dp_group`` (the sealed
    store's keys are derived from it: a value sealed in an earlier launch opens in no later one).

    Off the event loop, import included: a headless node that joined already is heartbeating to this loop, and
    a loop blocked in ``import torch`` for longer than ``--dp-heartbeat-timeout-s`` lost it."""
    plan = node.plan
    host = plan.deployment.data_parallel_address
    device = "cuda" if plan.engine.device == "cuda" else "cpu"
    node.rendezvous_store, store_port, backend = await anyio.to_thread.run_sync(_rendezvous_store, host, device)
    node.dp_group_info = m.DPGroupInfo(master_addr=host, master_port=store_port, dp_size=plan.dp_size,
                                       backend=backend, launch_nonce=secrets.token_bytes(m.LAUNCH_NONCE_BYTES))


def head_handshake_addr(node: RunningNode) -> str:
    """Where this node's engines find the head front-end: its own listener, or the head's rpc port."""
    link = node.table.link("handshake")
    if link is not None and link.action == "connect":
        return f"tcp:{link.host}:{link.port}"
    return node.handshake_addr


async def _start_engines(node: RunningNode, tg: anyio.abc.TaskGroup,
                         rows: tuple[ProcessSpec, ...]) -> list[ChildProcess]:
    """One engine per row, each told where the head's (and on a hybrid node, its own) handshake listener is."""
    threads = threads_per_engine(len(rows))
    engines = []
    for row in rows:
        assert row.dp_rank is not None, "an engine row has a rank"
        role = engine_role(node.plan, row.dp_rank, handshake_addr=head_handshake_addr(node), torch_threads=threads,
                           local_handshake_addr=node.local_handshake_addr or None,
                           config_summary=node.book.summary if node.book is not None else None)
        engines.append(await spawn(node, tg, row, role))
    return engines


async def _wait_all(node: RunningNode, children: list[ChildProcess], *, deadline: float | None = None) -> None:
    """Every child's ``ChildReady`` by ``deadline`` (default: ``--engine-ready-timeout-s`` from now; E9), logging
    every 10 s which are still starting and, on the head front-end, which of the deployment's ranks are not ready
    (spec §2.5): a head's own engines are ready only once every rank reached the coordinator, other nodes' too.
    At the deadline, a :class:`StartupError` names what is missing (:func:`_not_ready`)."""
    started = anyio.current_time()
    if deadline is None:
        deadline = started + node.plan.engine_ready_timeout_s
    with anyio.move_on_at(deadline) as scope:
        for child in children:
            while True:
                with anyio.move_on_after(PROGRESS_EVERY_S) as waited:
                    await child.wait_event(m.ChildReady)
                if not waited.cancelled_caught:
                    break
                pending = ", ".join(c.name for c in children if c.event(m.ChildReady) is None)
                line = f"waiting for {pending} to be ready ({anyio.current_time() - started:.0f} s)"
                if (book := node.front_end_book()) is not None and book.missing():
                    line += f"; the deployment's ranks: {book.waiting_line()}"
                log.info("%s", line)
    if scope.cancelled_caught:
        raise TimeoutError(_not_ready(node, children))


def _not_ready(node: RunningNode, children: list[ChildProcess]) -> str:
    """E9: on the head front-end, the deployment's ranks that are not ready (those that never arrived, and where
    to start them); elsewhere, this node's children that are not."""
    timeout_s = node.plan.engine_ready_timeout_s
    if (line := node.ranks_timeout()) is not None:
        return line
    pending = ", ".join(c.name for c in children if c.event(m.ChildReady) is None)
    return f"{pending} not ready after --engine-ready-timeout-s ({timeout_s:g} s)"


async def _wait_ranks_ready(node: RunningNode, deadline: float) -> None:
    """The head front-end (the owner of the TCP handshake listener) is ready only when every rank of the
    deployment sent ``Ready``, local or remote (spec §5.3 step 8). Logs what it waits for every 10 s; E9 at
    ``deadline``, naming the ranks that never connected."""
    book = node.front_end_book()
    if book is None:
        return
    while book.missing():
        now = anyio.current_time()
        if now >= deadline:
            raise StartupError(_not_ready(node, []))
        changed = node.ranks_changed
        with anyio.move_on_after(min(PROGRESS_EVERY_S, deadline - now)) as waited:
            await changed.wait()
        if waited.cancelled_caught and book.missing():
            log.info("waiting for the deployment's ranks: %s", book.waiting_line())


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
