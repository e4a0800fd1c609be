"""A headless node: engines only, joined to the head over a node link (spec §3.4, §5.7, §12.5, §13).

Theory of operation
-------------------
A headless launcher has no HTTP port, no API server and no coordinator. :func:`join_head` connects to the head's
handshake listener (``--data-parallel-address:--data-parallel-rpc-port``), retrying until
``--engine-ready-timeout-s`` and logging what it waits for every 10 s, so launch order does not matter; it says
``NodeHello`` (its ranks and its parallel configuration) and waits for ``NodeAccepted``. A ``HandshakeError``
(overlapping ranks, a configuration that differs from the head's: the fields are named) fails the node before
any engine starts, and so does an answer that is no asyncdp frame (``-dpp`` names another service, the head's
HTTP port say) or one of another protocol version: one line names the address and the flags to check. :func:`start_headless` then spawns the local engines, which handshake with the head
themselves, and waits for them. :func:`follow_head` keeps the node link alive with heartbeats both ways:
``NodeShutdown`` is an orderly end (the engines drain, exit 0), ``Teardown`` and the link's loss (EOF, or no
heartbeat for ``--dp-heartbeat-timeout-s``: the head's tree died or its host is gone) stop the engines (signal,
grace, kill) and exit 1, with a log line saying so. vLLM's headless nodes never notice a lost head. A node
stopped on its own (a signal to it alone) says ``NodeStopping`` first, so that the head logs its departure as
an orderly one, not as the loss of the node. Saying it stops is a promise, not an outcome: its drain may still go
wrong (an engine that must be killed at the deadline, one that crashes meanwhile; exit status 1). So once its
engines are all gone and its exit status is known, :func:`leave_head` says ``NodeStopped`` (clean or not, and
what went wrong: which ranks, killed or crashed, their exit codes) as the link's last frame, whatever stopped the
node, then closes the link; the head logs the departure from that.
"""

from __future__ import annotations

import logging
import os
import socket

import anyio
import anyio.abc

from asyncdp import messages as m
from asyncdp.config.deployment import threads_per_engine
from asyncdp.config.roles import engine_role
from asyncdp.errors import ForeignPeerError, LinkAuthError, ProtocolError, StartupError
from asyncdp.launcher.children import spawn
from asyncdp.launcher.node import RunningNode
from asyncdp.launcher.node_book import span
from asyncdp.launcher.plan import ENGINE
from asyncdp.launcher.startup import head_handshake_addr
from asyncdp.transport import LINK_ERRORS, Link, connect_with_retry
from asyncdp.transport.heartbeat import keep_link

log = logging.getLogger("asyncdp.launcher")  # the role's one log name, whichever module logs

NODE_ACCEPT_TIMEOUT_S = 30.0


async def join_head(node: RunningNode, summary: dict[str, object], *, role: str = "headless",
                    processes: list[m.ProcessRow] | None = None, timeout_s: float | None = None) -> Link:
    """Connect the node link, say ``NodeHello``, and return the link once the head accepted this node.

    A headless node waits for the head up to ``--engine-ready-timeout-s``; a hybrid/external node joining for
    the topology (:mod:`.peer_link`) passes its ``role``, its ``processes`` and a shorter ``timeout_s``.
    Raises :class:`~asyncdp.errors.StartupError` naming why the head could not be joined."""
    plan = node.plan
    dep = plan.deployment
    addr = head_handshake_addr(node)
    ranks = span(dep.local_ranks)
    wait_s = timeout_s or plan.engine_ready_timeout_s
    try:
        link = await connect_with_retry(addr, timeout_s=wait_s, secret=plan.link_secret,
                                        what=f"the head front-end (this {role} node brings {ranks})")
    except TimeoutError:
        limit = f"{wait_s:g} s" if timeout_s else f"--engine-ready-timeout-s ({wait_s:g} s)"
        raise StartupError(f"no head front-end listening at {addr} (--data-parallel-address/"
                           f"--data-parallel-rpc-port) within {limit}") from None
    except LinkAuthError as exc:  # another secret, or none: a mistake of this launch's, never worth a retry
        raise StartupError(f"the head at {addr} {exc.problem}") from None
    try:
        await link.send(m.NodeHello(start_rank=dep.dp_start_rank, size_local=dep.dp_size_local,
                                    host=socket.gethostname(), pid=os.getpid(), protocol_version=m.PROTOCOL_VERSION,
                                    config_summary=dict(summary), role=role, processes=processes or []))
        with anyio.fail_after(NODE_ACCEPT_TIMEOUT_S):
            answer = await link.receive()
    except ForeignPeerError as exc:  # -dpp names the head's HTTP port, say, or another asyncdp version answers
        await link.aclose()
        raise StartupError(exc.handshake_problem(addr)) from None
    except (anyio.EndOfStream, TimeoutError, ProtocolError, *LINK_ERRORS) as exc:
        await link.aclose()
        raise StartupError(f"the head at {addr} did not answer this node's NodeHello ({type(exc).__name__})") from None
    if isinstance(answer, m.HandshakeError):
        await link.aclose()
        raise StartupError(f"the head at {addr} refused this node: {answer.reason}")
    if not isinstance(answer, m.NodeAccepted):
        await link.aclose()
        raise StartupError(f"the head at {addr} answered NodeHello with {type(answer).__name__}")
    log.info("joined the head at %s (%s, pid %d) with %s", addr, answer.head_host, answer.head_pid, ranks)
    return link


async def start_headless(node: RunningNode, tg: anyio.abc.TaskGroup, summary: dict[str, object]) -> None:
    """Join the head, then start this node's engines and wait until every one is ready."""
    node.head_link = await join_head(node, summary)
    tg.start_soon(follow_head, node, node.head_link)
    rows = node.table.role(ENGINE)
    threads = threads_per_engine(len(rows))
    engines = []
    for row in rows:
        assert row.dp_rank is not None, "an engine row has a rank"
        role = engine_role(node.plan, row.dp_rank, handshake_addr=head_handshake_addr(node), torch_threads=threads,
                           config_summary=summary)
        engines.append(await spawn(node, tg, row, role))
    timeout_s = node.plan.engine_ready_timeout_s
    with anyio.move_on_after(timeout_s) as waited:
        for child in engines:
            await child.wait_event(m.ChildReady)
    if waited.cancelled_caught:  # E9
        pending = ", ".join(c.name for c in engines if c.event(m.ChildReady) is None)
        raise StartupError(f"{pending} not ready after --engine-ready-timeout-s ({timeout_s:g} s)")


async def follow_head(node: RunningNode, link: Link) -> None:
    """The node link, for the node's life: an orderly stop, a teardown, or the loss of the head."""
    plan = node.plan
    head = head_handshake_addr(node)

    def on_message(msg: m.Message) -> bool:
        if isinstance(msg, m.NodeShutdown):
            log.info("the head at %s shuts the deployment down (%s): stopping this node's engines", head,
                     msg.reason)
            node.stop_deadline_s = msg.shutdown_timeout
            node.asked_to_stop.set()
            node.shutdown.set()  # keep heartbeating until this node closes the link, its engines gone
            return False
        if isinstance(msg, m.Teardown):
            node.fail(f"the head at {head} tore the deployment down: {msg.reason}")
            return True
        if isinstance(msg, m.HandshakeError):
            node.fail(f"the head at {head} refused this node: {msg.reason}")
            return True
        return False

    async with anyio.create_task_group() as tg:
        tg.start_soon(say_stopping, node, link)
        why = await keep_link(link, on_message, interval_s=plan.heartbeat_interval_s,
                              timeout_s=plan.heartbeat_timeout_s, sender=f"node-{plan.deployment.dp_start_rank}")
        tg.cancel_scope.cancel()
    if why == "done" or node.shutdown.is_set():
        return
    what = "its node link closed" if why == "closed" else f"no heartbeat for {plan.heartbeat_timeout_s:g} s"
    node.fail(f"lost the head front-end at {head} ({what}): stopping this node's engines")


async def say_stopping(node: RunningNode, link: Link) -> None:
    """Once this node stops in order on its own signal (not on the head's ``NodeShutdown``, not after a failure),
    tell the head: ``NodeStopping``, best effort within a second (a head that misses it logs a loss)."""
    await node.shutdown.wait()
    if node.failure is not None or node.stop_deadline_s is not None or not node.asked_to_stop.is_set():
        return
    with anyio.move_on_after(1.0):
        try:
            await link.send(m.NodeStopping(reason="a signal to the node",
                                           shutdown_timeout=node.plan.shutdown_timeout_s))
        except LINK_ERRORS:
            pass


async def leave_head(node: RunningNode, exit_status: int) -> None:
    """The node link's end, once this node's engines are all gone: say how the node ended (``NodeStopped``, best
    effort within a second: a head that is gone or stuck does not hold the exit), then close the link."""
    link = node.head_link
    if link is None:
        return
    with anyio.move_on_after(1.0):
        try:
            await link.send(node_outcome(node, exit_status))
        except LINK_ERRORS:
            pass
    await link.aclose()


def node_outcome(node: RunningNode, exit_status: int) -> m.NodeStopped:
    """``NodeStopped`` for this node's exit status: clean at 0; else the node's failure and every engine that did
    not exit 0, with its exit code (killed: its tree was SIGKILLed, at the drain deadline or on a second signal)."""
    if exit_status == 0:
        return m.NodeStopped(clean=True)
    ends = [f"{c.describe()} {'was killed, exit code' if c.killed else 'exited with code'} {c.returncode}"
            for c in node.children if c.role == ENGINE and c.returncode != 0]
    parts = [node.failure or "", *ends, f"exit status {exit_status}"]
    return m.NodeStopped(clean=False, detail="; ".join(p for p in parts if p))
