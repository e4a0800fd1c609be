"""A hybrid node with ``S > 0`` (or an external rank server ``r > 0``) on the head's node link, for the topology.

Theory of operation
-------------------
Such a node serves on its own: its engines handshake with the head and with this node's front-end, its API
servers follow the head's coordinator. Once it serves, :func:`follow_head_topology` opens a node link to the
head's handshake listener and says ``NodeHello`` with ``role`` = its mode, its configuration summary and its own
processes; the head admits it (same checks as a headless node, the ranks its engines already brought included)
and answers ``NodeAccepted``. From then on the head sends ``NodeTopology`` (every process and node of the
deployment) whenever its view changes, and this node hands it to its API servers as is: ``/server_info`` on any
endpoint shows the whole deployment. Heartbeats go both ways. A node stopped on its own signal says ``NodeStopping`` and,
once its engines are gone, ``NodeStopped`` with its outcome, as a headless node does (:mod:`.headless`), so that
the head logs its departure as a stop, not as the loss of the node (MoE: the stop is named before the group's
teardown that follows it). Losing the link is not a failure here (a dense
hybrid node keeps serving its ranks when the head is gone, spec §11.1; a MoE group's teardown comes through the
coordinator, and its engines' exit stops this node): it is logged and the endpoints fall back to this node's own
view.
"""

from __future__ import annotations

import logging

import anyio

from asyncdp import messages as m
from asyncdp.errors import StartupError
from asyncdp.launcher.children import publish_process_table, publish_topology
from asyncdp.launcher.headless import join_head, say_stopping
from asyncdp.launcher.node import RunningNode
from asyncdp.launcher.startup import head_handshake_addr
from asyncdp.transport.heartbeat import keep_link

log = logging.getLogger("asyncdp.launcher")  # the role's one log name, whichever module logs

JOIN_TIMEOUT_S = 30.0


def wants_topology_link(node: RunningNode) -> bool:
    """A front-end whose engines handshake with another launch's head (hybrid S > 0, external r > 0)."""
    link = node.table.link("handshake")
    return link is not None and link.action == "connect" and not node.plan.deployment.headless


async def follow_head_topology(node: RunningNode, summary: dict[str, object]) -> None:
    """Task, after startup: join the head as a peer node and mirror its topology to this node's API servers."""
    dep = node.plan.deployment
    addr = head_handshake_addr(node)
    try:
        link = await join_head(node, summary, role=dep.mode, processes=node.process_table(),
                               timeout_s=JOIN_TIMEOUT_S)
    except StartupError as exc:
        log.warning("could not join the head for the deployment's topology (%s); /server_info shows this node "
                    "only", exc)
        return
    send, receive = anyio.create_memory_object_stream[m.NodeTopology](16)

    def on_message(msg: m.Message) -> bool:
        if isinstance(msg, m.NodeTopology):
            try:
                send.send_nowait(msg)
            except anyio.WouldBlock:  # the publisher is behind: a newer view follows
                pass
        return False

    async def publish() -> None:
        async for topology in receive:
            await publish_topology(node, topology.processes, topology.nodes)

    plan = node.plan
    node.head_link = link  # its last frame says how the node ended (headless.leave_head, NodeStopped)
    async with link, send, receive, anyio.create_task_group() as tg:
        tg.start_soon(publish)
        tg.start_soon(say_stopping, node, link)  # a stop of this node alone is news to the head (MoE: the cause
        # of the group's teardown, logged before it)
        why = await keep_link(link, on_message, interval_s=plan.heartbeat_interval_s,
                              timeout_s=plan.heartbeat_timeout_s, sender=f"node-{dep.dp_start_rank}")
        tg.cancel_scope.cancel()
    if node.shutdown.is_set():
        return
    lost = "closed" if why == "closed" else "no heartbeat"
    if plan.is_moe:  # the head hosts the group's coordinator: this node's engines end with the group, and say why
        log.warning("lost the head's node link at %s (%s): the MoE group cannot go on without the head; this node "
                    "stops with it", addr, lost)
    else:
        log.warning("lost the head's node link at %s (%s): this node keeps serving its ranks; /server_info shows "
                    "this node only", addr, lost)
    await publish_process_table(node)
