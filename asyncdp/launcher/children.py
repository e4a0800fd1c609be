"""The launcher's children: spawn one from a table row, watch it, tell it things, stop them all in order.

Theory of operation
-------------------
:func:`spawn` starts a row of the :class:`~asyncdp.launcher.plan.LaunchTable` with its role config (a child
that is spawned is always recorded, never orphaned) and starts two tasks in the node's task group: one reads
its control events, one waits for its exit. :func:`watch_child` decides what an exit means: during startup the
startup waits see it (E12); afterwards an API-server death tears the node down, a dense engine death only
degrades service (unless ``--dp-fail-fast``; and a headless node whose last engine died stops, exit 1, which the
head sees as a lost node), a MoE engine or coordinator death tears the group down.

:func:`stop_all` runs the table's ``stop_order`` (API servers -> engines -> coordinator, spec §12.5) under one
deadline of ``--shutdown-timeout + 5 s``: it warns the coordinator (``Stopping``), names a teardown to the API
servers (``Shutdown{reason}``), closes the launcher's copy of the HTTP socket, then signals each stage and kills
stragglers' process trees. A stop that had to kill a child is no orderly stop: it is recorded as the node's
failure (exit status 1), as the multi-port supervisor does (spec §11.3), and so is, on a dense headless node, an
engine that ended with an error (it crashed in the drain, say): that node is its engines, and its exit status is
what the head learns of its drain (``NodeStopped``, :mod:`.headless`).
"""

from __future__ import annotations

import functools
import logging
import signal
from typing import Any

import anyio
import anyio.abc

from asyncdp import messages as m
from asyncdp.config.roles import RoleConfig
from asyncdp.launcher.node import RunningNode
from asyncdp.launcher.plan import API_SERVER, COORDINATOR, ENGINE, ProcessSpec
from asyncdp.transport.control import ChildProcess, spawn_child

log = logging.getLogger("asyncdp.launcher")  # the role's one log name, whichever module logs

SHUTDOWN_GRACE_S = 5.0
# [ours] A multi-port supervisor kills its children's trees at the same drain + 5 s (spec §11.3). A supervised
# node keeps this much of it to kill its own stragglers and exit by itself first: at the same deadline, a loaded
# machine's supervisor SIGKILLed a child that was killing its slow engine at that moment (an orderly stop, exit 1).
SUPERVISED_MARGIN_S = 1.5
# The engines of a failed startup have no request to drain (no API server got ready): a SIGTERM ends a startup at
# once, even in the MoE group's rendezvous (waiting for a rank that never came: the engine abandons that thread).
# They get this long, not the drain deadline, before their trees are killed.
FAILED_STARTUP_ENGINE_GRACE_S = 1.0
_SEND_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


async def spawn(node: RunningNode, tg: anyio.abc.TaskGroup, row: ProcessSpec, config: RoleConfig, *,
                env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()) -> ChildProcess:
    rank = row.client_index if row.role == API_SERVER else row.dp_rank
    with anyio.CancelScope(shield=True):  # short and bounded: a started child is always recorded, never orphaned
        child = await spawn_child(name=row.name, role=row.role, rank=rank, config=config, backend=node.plan.backend,
                                  env=env, log_prefix=row.log_prefix, log_level=node.plan.log_level,
                                  run_dir=node.tmpdir, pass_fds=pass_fds)
        node.children.append(child)
    tg.start_soon(child.read_events)
    tg.start_soon(watch_child, node, child)
    return child


async def watch_child(node: RunningNode, child: ChildProcess) -> None:
    code = await child.watch_exit()
    if child.role == API_SERVER and node.node_table is not None and child.rank is not None:
        node.node_table.clear(child.rank)  # its slots and heartbeat no longer count for the siblings
    if node.shutdown.is_set():
        return
    what = f"{child.describe()} exited with code {code}"
    if not node.started:
        return  # startup waits see ChildExited and fail with E12
    plan = node.plan
    if child.role == ENGINE and plan.is_moe and plan.dp_size > 1:
        if code != 0:  # the events it sent before it exited (PeerLeftGroup) are read by now, or soon
            with anyio.move_on_after(1.0):
                await child.events_ended.wait()
        left = child.event(m.PeerLeftGroup)
        if code == 0 or left is not None:
            # a MoE engine ends before its node stops after a peer left the group in order: with 0 after an orderly
            # teardown (its node stops with the head), else with 1 after saying so (PeerLeftGroup: the node of its
            # own launch, which may still be asked to stop a moment later)
            why = "a peer was stopped" if left is None else f"{left.reason}; exit code {code}"
            node.stop_with_peer(f"{child.describe()} left with its MoE group ({why})")
            return
    if child.role == ENGINE and not plan.is_moe and not plan.dp_fail_fast:
        none_here = all(c.exited.is_set() for c in node.children if c.role == ENGINE)
        if node.table.top == "headless" and none_here:
            # a headless node is its engines: with none left it serves nothing, and its exit is what tells the
            # head (a lost node: its ranks leave the balancer, spec §13)
            node.fail(f"{what}; no local rank left: stopping this node")
            return
        # An internal-LB head also balances over other nodes' ranks; any other node's API servers only over its own.
        others_elsewhere = plan.deployment.mode == "internal" and plan.deployment.dp_size_local < plan.dp_size
        log.error("%s; %s", what, "no rank is left to serve" if none_here and not others_elsewhere
                  else "the other ranks keep serving")
        return
    if child.role == COORDINATOR and not plan.is_moe:
        log.warning("%s; clients route on in-flight counts only", what)
        return
    node.fail(f"{what}; tearing the deployment down")


async def tell(children: list[ChildProcess], msg: m.ControlMessage) -> None:
    """Best effort, one second each: a child that is gone or stuck does not hold the launcher."""
    for ch in children:
        if not ch.exited.is_set():
            await _send_within_1s(ch.control, msg)


async def publish_process_table(node: RunningNode) -> None:
    """The deployment's processes and nodes to every API server of this node (``/server_info``), and to every
    hybrid/external node linked to this head (their endpoints show the head's whole view)."""
    table = node.process_table()
    nodes = node.node_rows()
    await publish_topology(node, table, nodes)
    for remote in node.remote_nodes:
        if remote.entry.role != "headless" and not remote.closed.is_set():
            await _send_within_1s(remote.link, m.NodeTopology(processes=table, nodes=nodes))


async def publish_topology(node: RunningNode, processes: list[m.ProcessRow], nodes: list[m.NodeRow]) -> None:
    """Processes and nodes to this node's API servers as given (a hybrid/external node: the head's view)."""
    if node.inproc_client is not None:
        node.inproc_client.processes = [_row_dict(row) for row in processes]
        node.inproc_client.nodes = [_row_dict(row) for row in nodes]
    for ch in node.children:
        if ch.role == API_SERVER and not ch.exited.is_set():
            await _send_within_1s(ch.control, m.ProcessTable(processes=processes, nodes=nodes))


async def _send_within_1s(link: Any, msg: Any) -> None:
    """Best effort: a peer that is gone or stuck does not hold the launcher."""
    with anyio.move_on_after(1.0):
        try:
            await link.send(msg)
        except _SEND_ERRORS:
            pass


def _row_dict(row: m.ProcessRow | m.NodeRow) -> dict[str, object]:
    import msgspec

    out: dict[str, object] = msgspec.to_builtins(row)
    return out


async def _stop_remote_nodes(node: RunningNode, deadline: float) -> None:
    """``NodeShutdown`` (or ``Teardown`` after a failure) to every headless node; wait until they left."""
    if not any(r.entry.role == "headless" for r in node.remote_nodes):
        return
    if node.failure is not None:
        await tell_nodes(node, m.Teardown(reason=node.failure))
    else:
        await tell_nodes(node, m.NodeShutdown(reason="the head received a signal",
                                              shutdown_timeout=node.plan.shutdown_timeout_s))
    with anyio.move_on_after(max(0.5, deadline - anyio.current_time())):
        await wait_nodes_gone(node)


async def stop_all(node: RunningNode) -> None:
    """The table's stop order, under one shared deadline (spec §12.5)."""
    timeout_s = node.plan.shutdown_timeout_s if node.stop_deadline_s is None else node.stop_deadline_s
    grace_s = SHUTDOWN_GRACE_S - (SUPERVISED_MARGIN_S if node.plan.supervised_rank is not None else 0.0)
    deadline = anyio.current_time() + timeout_s + grace_s

    async def stop_role(role: str) -> None:
        children = [c for c in node.children if c.role == role and not c.exited.is_set()]
        if not children:
            return
        grace_s = max(0.5, deadline - anyio.current_time())
        if role == ENGINE and not node.started and node.failure is not None:
            grace_s = min(grace_s, FAILED_STARTUP_ENGINE_GRACE_S)
        async with anyio.create_task_group() as tg:
            for ch in children:
                tg.start_soon(functools.partial(ch.stop, grace_s=grace_s))

    # The coordinator logs the engines' departures as expected, not as losses; a MoE engine takes a peer's orderly
    # departure before its own turn (after the API servers) for its own stop, not for a teardown.
    await tell([c for c in node.children if c.role in (COORDINATOR, ENGINE)], m.Stopping())
    if node.failure is not None:  # a teardown: the API servers name it to the requests they abandon
        await tell([c for c in node.children if c.role == API_SERVER], m.Shutdown(reason=node.failure))
    node.api_shutdown.set()
    # The launcher never accepts on the HTTP socket; its copy would keep the port open (connections queue and
    # hang) after every API server stopped accepting. Spec §12.5: a refused connection once the listener closes.
    if node.http_sock is not None:
        node.http_sock.close()
    for role in node.table.stop_order:
        if role == API_SERVER:
            await stop_role(API_SERVER)
            if node.inproc_client is not None:
                with anyio.move_on_after(max(0.5, deadline - anyio.current_time())):
                    await node.inproc_api_done.wait()
        elif role == ENGINE:
            async with anyio.create_task_group() as tg:  # this node's engines and every headless node's at once
                tg.start_soon(stop_role, ENGINE)
                tg.start_soon(_stop_remote_nodes, node, deadline)
        else:
            if role == COORDINATOR and ENGINE not in node.table.stop_order:
                # an API-only head: its engines are all on headless nodes, and they too stop before the coordinator
                await _stop_remote_nodes(node, deadline)
            await stop_role(role)
    if not {ENGINE, COORDINATOR} & set(node.table.stop_order):  # (no role left to stop them before)
        await _stop_remote_nodes(node, deadline)
    for ch in node.children:
        await ch.control.aclose()
    bad = [c for c in node.children if c.returncode not in (0, None) and c.returncode != -signal.SIGTERM]
    if bad and node.failure is None and not node.started:
        node.failure = "children failed: " + ", ".join(c.describe() for c in bad)
    crashed = [c for c in bad if not c.killed]
    if crashed and node.failure is None and node.table.top == "headless" and not node.plan.is_moe:
        # a dense headless node is its engines: one that ended with an error (in its drain, say) is its failure, and
        # the head hears it (NodeStopped). (A MoE engine leaving with its group exits 1 in an orderly stop.)
        node.failure = "not every engine stopped in order: " + ", ".join(
            f"{c.describe()} exited with code {c.returncode}" for c in crashed)
        log.error("%s", node.failure)
    killed = [c for c in node.children if c.killed]
    if killed and node.failure is None:
        node.failure = "killed before they exited by themselves: " + ", ".join(c.describe() for c in killed)
        log.error("%s; the stop was not orderly", node.failure)


async def tell_nodes(node: RunningNode, msg: m.Message) -> None:
    """Best effort, one second each: ``NodeShutdown`` or ``Teardown`` to every headless node still linked."""
    for remote in node.remote_nodes:
        if remote.entry.role == "headless" and not remote.closed.is_set():
            await _send_within_1s(remote.link, msg)


async def wait_nodes_gone(node: RunningNode) -> None:
    """Until every headless node closed its node link (after its engines exited). Hybrid and external nodes
    stop on their own signals; their topology links close with this process."""
    for remote in node.remote_nodes:
        if remote.entry.role == "headless":
            await remote.closed.wait()
