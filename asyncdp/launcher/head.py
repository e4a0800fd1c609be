"""The launcher role: perform this node's launch table, watch it, and tear it down in order.

Theory of operation
-------------------
``run_serve(config)`` is the top process of ``asyncdp serve``. It resolves a
:class:`~asyncdp.config.roles.LaunchPlan` (the model is materialised here), binds the HTTP socket first (E11: a
busy port fails before any child starts; the port's lock, held until the launcher exits, keeps a second deployment
off it) and runs the node: :func:`asyncdp.launcher.plan.plan` computes the
:class:`~asyncdp.launcher.plan.LaunchTable` from the resolved deployment, :mod:`.startup` performs its start order
(coordinator -> API servers -> rendezvous -> engines -> readiness), :mod:`.children` watches every child and
stops them in the table's stop order. The shell decides nothing about the topology; it only performs the table.

A signal or a failure during startup ends the startup waits at once. During startup any child death aborts
startup (E12, exit 1); afterwards :func:`asyncdp.launcher.children.watch_child` decides. Shutdown (SIGTERM/SIGINT,
spec §12.5) runs API servers -> engines -> coordinator under one deadline of ``--shutdown-timeout + 5 s``; a
second signal kills every child's process tree at once. Exit 0 when orderly, 1 after any failure.

The run directory (Unix sockets, metrics files) is :mod:`.rundir`'s: created and locked here, removed on the way out;
a launch first removes those of deployments killed whole, which nobody was left to remove.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import time

import anyio
import anyio.abc

from asyncdp import messages as m
from asyncdp import runtime
from asyncdp.config.deployment import ResolvedServeConfig
from asyncdp.config.roles import LaunchPlan
from asyncdp.errors import AsyncDPError, StartupError
from asyncdp.launcher import rundir
from asyncdp.launcher.children import publish_process_table, stop_all
from asyncdp.launcher.headless import leave_head, start_headless
from asyncdp.launcher.launch_plan import bind_http_socket, plan_from_config, plan_summary, with_link_secret
from asyncdp.launcher.node import RunningNode, book_for
from asyncdp.launcher.node_book import span
from asyncdp.launcher.peer_link import follow_head_topology, wants_topology_link
from asyncdp.launcher.plan import API_SERVER
from asyncdp.launcher.startup import head_handshake_addr, run_startup, start_node
from asyncdp.logs import DrainCounts, serving_line, stopped_line
from asyncdp.transport.http_socket import lock_http_port, reserve_shared_port
from asyncdp.transport.port_lock import bind_locked

log = logging.getLogger("asyncdp.launcher")  # the role's one log name, whichever module logs


def run_serve(config: ResolvedServeConfig) -> int:
    """``asyncdp serve``: run a deployment until a signal or a failure; return the process exit code."""
    from asyncdp.logs import setup_logging

    started_at = time.monotonic()
    dep = config.deployment
    if config.supervised_rank is not None:  # a multi-port child (spec §11.3)
        prefix = f"APIServer_DP{config.supervised_rank}"
    elif dep.headless:
        prefix = "HeadlessLauncher"
    else:
        prefix = "asyncdp-launcher" if dep.api_server_count > 1 else "APIServer"
    setup_logging(prefix=prefix,
                  level=config.log_level.upper())
    try:
        plan = plan_from_config(config)  # resolves the model: a built-in is generated (or converted) once here
    except AsyncDPError as exc:
        log.error("%s", exc)
        return 1
    log.info("model %s: checkpoint %s (resolved in %.2f s)", config.model, plan.model_path,
             time.monotonic() - started_at)
    return run_plan(plan, started_at=started_at)


def _bind_http(plan: LaunchPlan) -> tuple[socket.socket, socket.socket | None]:
    """E11, first act: the HTTP port, and the port's lock. One API server listens on the launcher's socket; several
    each listen on their own ``SO_REUSEPORT`` socket (the kernel spreads connections), the launcher only reserves
    the port. The lock (:func:`~asyncdp.transport.http_socket.lock_http_port`) keeps a second deployment off the
    port, which ``SO_REUSEPORT`` would let it share; it is taken before the bind (after it for port 0, on the port
    the kernel gave). A multi-port supervisor's child takes none: its supervisor holds the lock of its port."""
    bind = functools.partial(bind_http_socket if plan.api_server_count == 1 else reserve_shared_port, plan.host)
    if plan.supervised_rank is not None:
        return bind(plan.port), None
    return bind_locked(plan.port, bind, functools.partial(lock_http_port, plan.host))


def run_plan(plan: LaunchPlan, *, started_at: float | None = None) -> int:
    """Run a deployment described by ``plan``; return the process exit code.

    ``started_at``: ``time.monotonic()`` when the command began (default: now), for the startup's total time."""
    started_at = time.monotonic() if started_at is None else started_at
    plan, unauthenticated = with_link_secret(plan)
    if unauthenticated is not None:
        log.warning("%s", unauthenticated)
    headless = plan.deployment.headless
    try:
        import setproctitle

        if plan.supervised_rank is not None:
            title = f"asyncdp-api-dp{plan.supervised_rank}"
        else:
            title = "asyncdp-launcher" if plan.api_server_count != 1 else "asyncdp-api-0"
        setproctitle.setproctitle(title)
    except ImportError:
        pass
    try:
        http_sock, port_lock = (None, None) if headless else _bind_http(plan)
    except StartupError as exc:
        log.error("%s", exc)
        return 1
    rundir.sweep_stale()
    run_dir = rundir.create()
    try:
        return runtime.run(_serve, plan, http_sock, run_dir.path, started_at, backend=plan.backend,
                           hold_stops=True)
    except KeyboardInterrupt:
        return 0
    finally:
        if http_sock is not None:
            http_sock.close()
        run_dir.remove()
        if port_lock is not None:  # last: the port is free for the next deployment only once this one let go
            port_lock.close()


async def _serve(plan: LaunchPlan, http_sock: socket.socket | None, tmpdir: str, started_at: float) -> int:
    summary = plan_summary(plan)
    node = RunningNode(plan, http_sock, tmpdir, started_at=started_at, book=book_for(plan, summary))
    headless = node.table.top == "headless"
    async with anyio.create_task_group() as tg:
        await tg.start(_watch_signals, node)  # in place before the first child: a stop never strands one
        if not node.shutdown.is_set():  # (stopped before the startup began: nothing to start, nor to stop)
            start = functools.partial(start_headless, node, tg, summary) if headless else \
                functools.partial(start_node, node, tg)
            await run_startup(node, start)
        if not node.shutdown.is_set():
            node.started = True
            log.info("%s", _ready_line(node))
            if not headless:
                await publish_process_table(node)
            if wants_topology_link(node):
                tg.start_soon(follow_head_topology, node, summary)
        await node.shutdown.wait()
        await stop_all(node)
        await node.peer_stop_verdict()
        code = 1 if node.failure is not None or node.inproc_api_code else 0
        await leave_head(node, code)  # a headless or dense hybrid node: NodeStopped, the node link's last frame
        tg.cancel_scope.cancel()
    if node.node_table is not None:
        node.node_table.close()
        os.close(node.node_table_fd)
    if headless:
        log.log(logging.INFO if code == 0 else logging.ERROR, "headless node stopped (exit status %d)", code)
        return code
    counts, unreported = _drain_counts(node)
    log.log(logging.INFO if code == 0 else logging.ERROR, "%s",
            stopped_line(counts, exit_status=code, unreported=unreported))
    return code


def _ready_line(node: RunningNode) -> str:
    plan = node.plan
    took_s = time.monotonic() - node.started_at
    if node.http_sock is None:
        return (f"headless node serving {span(plan.deployment.local_ranks)} of {plan.dp_size} for the head at "
                f"{head_handshake_addr(node)}; startup took {took_s:.1f} s")
    host, port = node.http_sock.getsockname()[:2]  # the address really bound (port 0 resolved)
    managed = plan.deployment.managed_ranks
    return serving_line(model=plan.served_model_name, model_path=_shown_model(plan),
                        scheme="https" if plan.ssl_certfile else "http", host=host, port=port,
                        dp_size=plan.dp_size, api_server_count=plan.api_server_count, took_s=took_s,
                        managed=span(managed) if len(managed) != plan.dp_size else None)


def _shown_model(plan: LaunchPlan) -> str | None:
    """The checkpoint behind the served name, when the name alone does not say it (a built-in's cache folder
    and a served name equal to the path add nothing)."""
    if plan.served_model_name.startswith("builtin:") or plan.served_model_name == plan.model_path:
        return None
    return plan.model_path


def _drain_counts(node: RunningNode) -> tuple[list[DrainCounts], int]:
    """Every API server's drain counts, and how many API servers exited without reporting theirs (one that never
    got ready, in a failed startup, had nothing to drain and is not counted)."""
    if node.inproc_client is not None or node.table.top == "api_server":
        return [node.inproc_drain], 0
    counts, unreported = [], 0
    for ch in node.children:
        if ch.role != API_SERVER or (ch.event(m.ApiStopped) is None and ch.event(m.ChildReady) is None):
            continue
        ev = ch.event(m.ApiStopped)
        if ev is None:
            unreported += 1
        else:
            counts.append(DrainCounts(drained=ev.drained, aborted=ev.aborted))
    return counts, unreported


async def _watch_signals(node: RunningNode, *, task_status: anyio.abc.TaskStatus[None]) -> None:
    """Started before anything else of the node: a stop held since the event loop began
    (:func:`asyncdp.runtime.take_early_stops`) counts as received now, before any child exists."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        for signum in runtime.take_early_stops():
            _on_signal(node, signum)
        task_status.started()
        async for signum in signals:
            _on_signal(node, signum)


def _on_signal(node: RunningNode, signum: int) -> None:
    if node.peer_stop is not None and not node.asked_to_stop.is_set():
        log.info("received %s: this node was already stopping with its MoE group", signal.Signals(signum).name)
        node.asked_to_stop.set()
        return
    node.asked_to_stop.set()
    if node.shutdown.is_set():
        log.warning("second signal: killing every child now")
        for ch in node.children:
            ch.kill_tree()
        return
    timeout_s = node.plan.shutdown_timeout_s
    log.info("received %s: shutting down (%s)", signal.Signals(signum).name,
             f"in-flight requests get up to {timeout_s:g} s to finish" if timeout_s > 0
             else "in-flight requests are aborted: --shutdown-timeout 0")
    node.shutdown.set()
