"""The front-end's side of the handshake (spec §5.3 steps 2-6, §5.4) and of the node links (§5.7).

Theory of operation
-------------------
Every connection to a handshake listener starts with one frame. ``Hello`` is an engine: :func:`handshake` has
the node's :class:`~asyncdp.launcher.node_book.NodeBook` check it (E4, E5), waits until the addresses
``HandshakeInit`` carries are all known (``node.init_ready``: the API servers' client listeners, the coordinator's,
the DP group's rendezvous), answers, and waits for ``Ready`` (E6 through the book). ``NodeHello`` is a headless
launcher: :func:`serve_node_link` has the book admit it (ranks, configuration), answers ``NodeAccepted`` and keeps
the link alive with heartbeats both ways until it ends; a lost node is a teardown for a MoE group and a
degradation for a dense one (its API servers see the engine links end on their own). A headless node's last
frame, ``NodeStopped``, says how it ended (its exit status, and what went wrong); the head logs the departure from
it: "stopped in order" at INFO only when it was clean; an unclean one at ERROR with its detail (which ranks were
killed or crashed, their exit codes), as "stopped, not in order" after ``NodeStopping`` (the operator stopped it,
its drain failed) and as a loss otherwise. A node that said ``NodeStopping`` (its own signal: it stops on purpose)
and whose link then closed without ``NodeStopped`` is logged at WARNING: its word that it stops is no outcome,
and what usually ends a launcher between the two is a SIGKILL in its drain (an orchestrator's grace ran out),
yet a lost last frame (it is best effort, a second) is possible too, so it is neither an INFO all-clear nor an
ERROR. Such a node, like one stopped by the head's ``NodeShutdown``, is ``stopped`` in the book, not ``lost``:
the state says whether it left on purpose, the log whether its drain went well; either way a dense deployment
takes its ranks back from a node restarted in its place. Dense: a node restarted in place of one that left, with
the same ranks and configuration, is admitted again (the book decides) and its engines' handshakes are answered as
at startup; they reach the coordinator and every API server on their own, which take the ranks back. A refused or
failed engine of such a node is only logged: the deployment serves on. Both links stay open for the
deployment's life. A refused or broken handshake during startup fails the node with a reason (the refused side
gets ``HandshakeError`` with the same reason); it never raises into the launcher's task group. A connection whose
first frame is no asyncdp frame at all (an HTTP client on the rpc port), or that closes or stays silent before
its first frame (a port scan, a TCP probe), is only logged and dropped: it is no engine, and startup goes on.
"""

from __future__ import annotations

import logging
import math
import os
import socket

import anyio

from asyncdp import messages as m
from asyncdp.dp.liveness import PEER_STOP_GRACE_S
from asyncdp.errors import ForeignPeerError, ProtocolError
from asyncdp.launcher.children import publish_process_table
from asyncdp.launcher.node import RemoteNodeLink, RunningNode
from asyncdp.launcher.node_book import NodeEntry, span
from asyncdp.transport import LINK_ERRORS, Link, link_auth
from asyncdp.transport.heartbeat import keep_link
from asyncdp.transport.links import Frames

log = logging.getLogger("asyncdp.launcher")  # the role's one log name, whichever module logs

HANDSHAKE_HELLO_TIMEOUT_S = 30.0


async def handshake(node: RunningNode, link: Link) -> None:
    """Serve one connection to the handshake listener: an engine's handshake or a headless node's node link."""
    first: m.Message | None = None
    try:
        try:
            with anyio.fail_after(HANDSHAKE_HELLO_TIMEOUT_S):  # a connected peer speaks at once
                first = await link.receive()
        except (TimeoutError, *LINK_ERRORS) as exc:
            _silent_peer(link, exc)
            return
        if isinstance(first, m.NodeHello):
            await serve_node_link(node, link, first)
        elif isinstance(first, m.Hello):
            await _engine_handshake(node, link, first)
        else:
            await link.send(m.HandshakeError(reason=f"expected Hello or NodeHello, got {type(first).__name__}"))
    except ForeignPeerError as exc:
        await _foreign_peer(node, link, exc)
    except (anyio.EndOfStream, ProtocolError, TimeoutError, *LINK_ERRORS) as exc:
        # The engine closed its link (it crashed loading the model, say) or spoke garbage. Its exit is seen by
        # the child watchers; during startup, fail now with a reason instead of crashing the launcher.
        if not node.started:
            who = f"engine rank {first.dp_rank}" if isinstance(first, m.Hello) else "an engine"
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            node.fail(f"startup failed: {node.ranks_timeout() or f'the handshake with {who} broke off ({why})'}")


def _silent_peer(link: Link, exc: BaseException) -> None:
    """A connection that ended or went quiet before its first frame: no engine (an engine says ``Hello`` as soon as
    it connects, and a crashed one is seen by whoever watches its process), but a port scan, a TCP probe or a peer
    that stalled. It is dropped; startup goes on."""
    if isinstance(exc, TimeoutError):
        log.warning("dropped a connection to the handshake listener from %s: it sent no frame within %g s",
                    link.remote, HANDSHAKE_HELLO_TIMEOUT_S)
    else:  # (probes do this every few seconds: not worth a line at INFO)
        log.debug("a connection to the handshake listener from %s closed before its first frame", link.remote)


async def _foreign_peer(node: RunningNode, link: Link, exc: ForeignPeerError) -> None:
    """A connection whose first frame is no asyncdp frame of this version. Another asyncdp version is refused as
    any peer is (E5: it gets the reason too, in the one message every version decodes); anything else (an HTTP
    client on the rpc port, a port scanner) is no engine of this deployment: logged and dropped."""
    if not exc.other_version:
        if exc.seen == link_auth.UNEXPECTED_HELLO:  # an asyncdp node that holds a secret: no stranger
            log.warning("dropped a connection to the handshake listener from %s: it sent %s", link.remote, exc.seen)
        else:
            log.warning("dropped a connection to the handshake listener from %s that does not speak asyncdp "
                        "(it sent %s)", link.remote, exc.seen)
        return
    problem = (f"a peer speaks another asyncdp protocol ({exc.seen}); this head speaks protocol_version "
               f"{exc.protocol_version}: run the same asyncdp version on every node")
    with anyio.move_on_after(1.0):
        try:
            await link.send(m.HandshakeError(reason=problem))
        except LINK_ERRORS:
            pass
    _refuse(node, problem)


def _refuse(node: RunningNode, problem: str) -> None:
    """A refused peer fails startup; once the deployment serves, the refusal is only logged."""
    if node.started:
        log.error("refused a peer: %s", problem)
    else:
        node.fail(f"startup failed: {problem}")


async def _engine_handshake(node: RunningNode, link: Link, hello: m.Hello) -> None:
    book = node.book
    assert book is not None, "the shell sets the book before it listens"
    problem = book.admit_engine(hello)
    if problem:
        await link.send(m.HandshakeError(reason=problem))
        _refuse(node, f"handshake with engine rank {hello.dp_rank}: {problem}")
        return
    await node.init_ready.wait()  # bounded by the startup deadline; a failed startup cancels it
    managed = hello.dp_rank in node.plan.deployment.managed_ranks
    await link.send(m.HandshakeInit(clients=node.client_addrs if managed else [],
                                    coordinator=node.coordinator_addrs, dp_group=node.dp_group_info,
                                    client_count=node.table.client_count))
    try:
        # During startup its deadline bounds this wait; after it (a restarted node's engine) nothing would, and a
        # peer that said Hello and went silent would hold the rank for good
        with anyio.move_on_after(node.plan.engine_ready_timeout_s if node.started else math.inf) as waited:
            ready = await link.receive()
        if waited.cancelled_caught:
            log.warning("dropped engine rank %d on %s (pid %d): no Ready within --engine-ready-timeout-s (%g s); "
                        "the rank may join again", hello.dp_rank, hello.host, hello.pid,
                        node.plan.engine_ready_timeout_s)
            return
        if isinstance(ready, m.HandshakeError):  # the engine could not start: its reason, as one line
            _refuse(node, f"engine rank {hello.dp_rank}: {ready.reason}")
            return
        if not isinstance(ready, m.Ready):
            _refuse(node, f"engine rank {hello.dp_rank} sent {type(ready).__name__} instead of Ready")
            return
        problem = book.engine_ready(hello.dp_rank, ready.config_hash, ready.config_summary)
        if problem:
            with anyio.move_on_after(1.0):
                await link.send(m.HandshakeError(reason=problem))
            _refuse(node, problem)
            return
        node.note_ranks_changed()
        if node.started:  # a restarted node's engine (dense): every endpoint's /server_info shows it again
            log.info("engine rank %d on %s (pid %d) is ready again", hello.dp_rank, hello.host, hello.pid)
            await publish_process_table(node)
        frames = Frames(link, f"the handshake link of engine rank {hello.dp_rank}")
        while await frames.next() is not None:  # the handshake link stays open for the deployment's life (§5.7)
            pass
        book.engine_gone(hello)
    finally:
        if node.started:  # a restarted node's engine that failed: its rank may come again (startup names it)
            book.engine_gone(hello)
    plan = node.plan
    remote = hello.dp_rank not in plan.deployment.local_ranks  # local engines are watched as children
    if remote and plan.is_moe and node.started:
        # (a remote engine that left in an orderly way: its node was stopped, maybe with this one, whose signal
        # may be a moment behind; a crash tears the group down through the coordinator meanwhile)
        with anyio.move_on_after(PEER_STOP_GRACE_S):
            await node.shutdown.wait()
    if remote and node.started and not node.shutdown.is_set() and (plan.is_moe or plan.dp_fail_fast):
        why = "the MoE group is torn down" if plan.is_moe else "--dp-fail-fast tears the deployment down"
        cause = next((f" (its node is stopping: {r.stopping})" for r in node.remote_nodes
                      if r.stopping is not None and hello.dp_rank in r.entry.ranks), "")
        node.fail(f"engine rank {hello.dp_rank} on {hello.host} (pid {hello.pid}) ended{cause}; {why}")


async def serve_node_link(node: RunningNode, link: Link, hello: m.NodeHello) -> None:
    """The head's side of a headless node's node link: admit, then heartbeats both ways until it ends."""
    book = node.book
    assert book is not None, "the shell sets the book before it listens"
    entry, problem = book.admit_node(hello)
    if entry is None:
        with anyio.move_on_after(1.0):
            await link.send(m.HandshakeError(reason=problem or "refused"))
        _refuse(node, problem or "a node was refused")
        return
    await link.send(m.NodeAccepted(head_host=socket.gethostname(), head_pid=os.getpid(), node_index=entry.index))
    back = hello.role == "headless" and node.started  # dense: restarted in place of a node that left
    one = len(entry.ranks) == 1
    log.info("%s %s", entry.describe(), f"joined again: {span(entry.ranks)} {'rejoins' if one else 'rejoin'} the "
             f"deployment as {'its engine gets' if one else 'their engines get'} ready" if back else "joined")
    remote = RemoteNodeLink(entry, link)
    node.remote_nodes.append(remote)
    plan = node.plan
    if node.started:  # every endpoint's /server_info: the whole deployment
        await publish_process_table(node)
    stopping: list[m.NodeStopping] = []
    outcome: list[m.NodeStopped] = []

    def on_message(msg: m.Message) -> None:
        if isinstance(msg, m.NodeStopped) and not outcome:
            outcome.append(msg)
        if isinstance(msg, m.NodeStopping) and not stopping and not node.shutdown.is_set():
            stopping.append(msg)
            remote.stopping = msg.reason
            drain = "drains" if len(entry.ranks) == 1 else "drain"
            log.info("%s is stopping (%s)%s", entry.describe(), msg.reason, "" if plan.is_moe else
                     f": {span(entry.ranks)} {drain} for up to {msg.shutdown_timeout:g} s, new requests go to "
                     "the other ranks")

    try:
        why = await keep_link(link, on_message, interval_s=plan.heartbeat_interval_s,
                              timeout_s=plan.heartbeat_timeout_s, sender="head")
    finally:
        remote.closed.set()
    if plan.is_moe and why == "closed" and node.started:
        # (a node that closed its link may have been stopped with this one, whose signal may be a moment behind:
        # as for a remote engine above; a crash tears the group down through the coordinator meanwhile)
        with anyio.move_on_after(PEER_STOP_GRACE_S):
            await node.shutdown.wait()
    ended = outcome[0] if outcome else None  # its own account of how it ended (NodeStopped), if it came
    # its state: "stopped" when it left on purpose (it said so, then ended; or it ended clean), else "lost"
    orderly = (bool(stopping) and (why == "closed" or ended is not None)) or (ended is not None and ended.clean)
    lost = book.lose_node(entry, orderly=orderly or (node.shutdown.is_set() and node.failure is None))
    node.remote_nodes.remove(remote)  # (a node restarted in its place links anew)
    node.note_ranks_changed()
    if node.shutdown.is_set():
        if ended is not None and not ended.clean:
            log.error("%s left, not in order: %s", entry.describe(), ended.detail)
        else:
            log.info("%s left", entry.describe())
        return
    what, level = _departure(entry, why, plan.heartbeat_timeout_s, stopping=bool(stopping), ended=ended)
    if plan.is_moe:
        node.fail(f"{what}; the MoE group is torn down")
    elif not node.started and hello.role == "headless":
        node.fail(f"startup failed: {what}")
    else:  # dense: the other nodes keep serving (a hybrid node's own endpoint went with it)
        rest = "the other ranks keep serving" if book.ready else (
            "no rank is left to serve (a node restarted in its place brings them back while the API servers are "
            "up: ASYNCDP_KEEP_ALIVE_ON_ENGINE_DEATH=1)")
        log.log(level, "%s; %s %s the balancer, %s", what, span(lost), "leaves" if len(lost) == 1 else "leave", rest)
        await publish_process_table(node)


def _departure(entry: NodeEntry, why: str, heartbeat_timeout_s: float, *, stopping: bool,
               ended: m.NodeStopped | None) -> tuple[str, int]:
    """What a node's departure was, and the level to log it at: its own account (``NodeStopped``) first; without
    one, a node that said ``NodeStopping`` and whose link then closed is taken at its word, with a warning."""
    who = entry.describe()
    if ended is not None and ended.clean:
        return f"{who} stopped in order", logging.INFO
    if ended is not None:
        return f"{who} stopped, not in order: {ended.detail}" if stopping else f"lost {who}: {ended.detail}", \
            logging.ERROR
    if stopping and why == "closed":
        return (f"{who} stopped: it said it stops, then its node link closed without its outcome (its launcher "
                "was killed in its drain, or its last frame was lost)"), logging.WARNING
    return f"lost {who}: " + ("its node link closed" if why == "closed" else
                              f"no heartbeat for {heartbeat_timeout_s:g} s"), logging.ERROR
