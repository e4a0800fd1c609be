"""The DP coordinator role (spec §6, §5.7): aggregates rank load for the clients and runs the MoE wave machine.

Theory of operation. The coordinator accepts two kinds of links: one from every engine (all N) and one from every
API-server client. It owns no decisions itself: :class:`~asyncdp.dp.stats.StatsBook` decides what to publish and
when, :class:`~asyncdp.dp.wave.WaveMachine` decides wave transitions and what engine loss means. This module only
decodes, calls and performs.

Tasks, all in one task group: an engine acceptor and one handler per engine link, a client acceptor and one
handler per client link, the heartbeat sender (:func:`~asyncdp.transport.heartbeat.send_heartbeats`), and the
*core*. Each link handler runs a reader (the first frame is ``Subscribe``; any frame counts as liveness, and
silence past ``heartbeat_timeout_s`` means the peer is dead) and a writer draining that peer's bounded outbox, so
no slow peer ever blocks the core (:mod:`asyncdp.coordinator.peers`; a peer whose outbox is full is cut off, never
silently skipped). Readers forward load and wave messages to the core through one bounded memory stream of typed
items (:data:`~asyncdp.coordinator.peers.CoordinatorInbox`, dispatched with ``match``; an unknown item is a
:class:`~asyncdp.errors.ProtocolError`); the core is the only task that changes the load and wave state.

Prefix claims: a client's ``PrefixClaim`` is answered by its link's reader at once with ``PrefixOwner`` from the
:class:`~asyncdp.dp.prefix_directory.PrefixDirectory` (where several API servers agree to put a new prefix); a new
prefix of at least ``LONG_PLACEMENT_TOKENS`` is also told to every other client (``PrefixPlaced``). The
directory is separate state that never awaits, so the readers share it without a core round trip; the core only
drops a dead rank's entries, and an engine's reader those of its rank when it reset its prefix cache
(``PrefixCacheReset``). A malformed claim is logged and dropped (the client routes alone after its timeout).

Startup: once exactly N distinct engines have sent ``Subscribe{dp_rank}``, every engine gets
``CoordinatorReady``. An unknown or duplicate rank, or a missing one after ``subscribe_timeout_s``, is a
:class:`~asyncdp.errors.StartupError`. A link whose first frame is no ``Subscribe{dp_rank}`` (a stranger on the port)
is logged and dropped, as is any engine link once a MoE group serves.

Publishing (§6.3): ``StatsSnapshot`` to every client, at most every 100 ms while counts change, a heartbeat
snapshot every 5 s otherwise, wave changes at once with ``counts=None``. ``seq`` increases with every snapshot.

Rejoin (dense): after startup, a ``Subscribe`` for a dead rank is a restarted node's engine (the head's node book
admitted it): it takes the rank's place from zero counts and gets ``CoordinatorReady``, once the lost engine's
link is marked dead (a lost host: after the heartbeat timeout). A MoE group takes no member back.

Engine loss: MoE - ``Teardown{reason, dead_rank}`` to the other engines (:mod:`asyncdp.coordinator.teardown`),
then :func:`serve_coordinator` raises :class:`~asyncdp.errors.EngineDeadError` (the process exits 1); after a
``Goodbye`` (orderly departure) it returns normally instead. Dense - the rank is marked dead (after a ``Goodbye``,
a rank its node stopped in order, logged as a departure, not a loss) and the coordinator keeps serving; it returns
once every engine is gone, unless ranks live on other nodes (``ranks_can_return``) and the deployment is not
stopping: a node restarted in place of a lost one can still bring them back.

Links: anything with ``async send(msg)``, ``async receive()`` (raising ``anyio.EndOfStream`` at EOF) and
``async aclose()``. Listeners: anything with ``async serve(handler)`` that calls ``handler(link)`` per link
(the protocols are in :mod:`asyncdp.coordinator.peers`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from asyncdp.coordinator.claims import answer_claim
from asyncdp.coordinator.config import CoordinatorConfig
from asyncdp.coordinator.peers import (
    ClientJoined,
    ClientMessage,
    CoordinatorInbox,
    EngineMessage,
    EngineRejoined,
    Link,
    Listener,
    Peer,
    describe_frame,
)
from asyncdp.coordinator.teardown import tear_down
from asyncdp.dp import wave as W
from asyncdp.dp.prefix_directory import PrefixDirectory
from asyncdp.dp.stats import Publication, StatsBook
from asyncdp.errors import (
    AsyncDPError,
    EngineDeadError,
    ProtocolError,
    StartupError,
    leaf_exceptions,
)
from asyncdp.messages import (
    CoordinatorReady,
    EngineDead,
    FirstRequest,
    Goodbye,
    Heartbeat,
    PrefixCacheReset,
    PrefixClaim,
    RankStats,
    StartWave,
    StartWaveRequest,
    StatsSnapshot,
    Subscribe,
    WaveComplete,
)
from asyncdp.transport.heartbeat import send_heartbeats

log = logging.getLogger(__name__)

__all__ = ["Coordinator", "CoordinatorConfig", "Link", "Listener", "serve_coordinator"]


class Coordinator:
    def __init__(self, config: CoordinatorConfig, *, stopping: anyio.Event | None = None) -> None:
        self.config = config
        # Set by the process when the deployment shuts down in order: engine departures are then expected.
        self.stopping = stopping if stopping is not None else anyio.Event()
        self.book = StatsBook(config.dp_size, wave_mode=config.wave_mode, external=config.external_lb,
                              now_s=anyio.current_time(), publish_interval_s=config.publish_interval_s,
                              heartbeat_interval_s=config.heartbeat_publish_s,
                              step_snapshot_wait_s=config.step_snapshot_wait_s)
        self.machine = W.WaveMachine(config.dp_size, config.wave_mode)
        self.directory = PrefixDirectory(config.dp_size)  # API servers agree on new prefixes (PrefixClaim)
        self.engines: dict[int, Peer] = {}
        self.clients: dict[int, Peer] = {}
        self.all_subscribed = anyio.Event()
        self.seq = 0
        self._next_client_key = 0
        self._rejoining: dict[int, Peer] = {}  # dense: a restarted rank's peer, until its lost one is marked dead
        self._inbox_send: MemoryObjectSendStream[CoordinatorInbox]
        self._inbox_send, self._inbox_recv = anyio.create_memory_object_stream[CoordinatorInbox](1024)

    # ------------------------------------------------------------ role main

    async def run(self, engine_listener: Listener, client_listener: Listener,
                  task_status: TaskStatus[None]) -> None:
        async with self._inbox_send, self._inbox_recv, anyio.create_task_group() as tg:
            tg.start_soon(engine_listener.serve, self._serve_engine)
            tg.start_soon(client_listener.serve, self._serve_client)
            tg.start_soon(send_heartbeats, self._beat_nowait, self.config.heartbeat_interval_s, "coordinator")
            tg.start_soon(self._watch_subscriptions)
            task_status.started()
            await self._core()
            tg.cancel_scope.cancel()

    async def _watch_subscriptions(self) -> None:
        timeout = self.config.subscribe_timeout_s
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            await self.all_subscribed.wait()
            return
        missing = sorted(set(range(self.config.dp_size)) - set(self.engines))
        raise StartupError(f"DP coordinator: engine ranks {missing} did not subscribe within {timeout:g} s")

    def _beat_nowait(self, beat: Heartbeat) -> None:
        for peer in [*self.engines.values(), *self.clients.values()]:
            peer.send_nowait(beat)

    # ------------------------------------------------------------ links

    def _peer(self, link: Link, name: str) -> Peer:
        where = getattr(link, "remote", None)  # (a transport link names its peer's address; a test fake need not)
        return Peer(link, f"{name} from {where}" if where else name, self.config.outbox_size,
                    self.config.heartbeat_timeout_s)

    async def _run_peer(self, peer: Peer, reader: Callable[[], Awaitable[None]]) -> None:
        with peer.scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(peer.write_loop)
                await reader()
                tg.cancel_scope.cancel()

    async def _serve_engine(self, link: Link) -> None:
        peer = self._peer(link, "engine link")
        try:
            first = await peer.receive()
            if first is None:
                return
            if not isinstance(first, Subscribe) or first.dp_rank is None or (
                    self.all_subscribed.is_set() and self.config.wave_mode):
                # No engine (a stranger on the port, a client at the wrong address), or one too late for a MoE
                # group, which takes no member back: dropped, the deployment and its startup go on.
                log.warning("dropping the %s: it opened with %s%s", peer.name, describe_frame(first),
                            " after startup (a MoE group takes no member back)" if self.all_subscribed.is_set()
                            else " instead of Subscribe{dp_rank}")
                return
            if self.all_subscribed.is_set():
                if (rank := self._rejoining_rank(first, peer)) is None:
                    return
                await self._inbox_send.send(EngineRejoined(rank, peer))
            else:
                rank = self._subscribe_engine(first, peer)
            await self._run_peer(peer, lambda: self._read_engine(peer, rank))
            # (a restarted rank's peer that never took the rank's place, or lost it again, reports nothing)
            if not peer.departed and self.engines.get(rank) is peer:
                await self._inbox_send.send(W.EngineLost(rank, peer.lost_reason or f"engine rank {rank} lost"))
        finally:
            peer.close()
            with anyio.CancelScope(shield=True):
                await link.aclose()

    def _subscribe_engine(self, msg: Subscribe, peer: Peer) -> int:
        n = self.config.dp_size
        rank = msg.dp_rank
        assert rank is not None, "the link's handler checked it"
        if not 0 <= rank < n:
            raise StartupError(f"DP coordinator: Subscribe from unknown engine rank {rank} (dp_size={n})")
        if rank in self.engines or self.all_subscribed.is_set():
            raise StartupError(f"DP coordinator: duplicate Subscribe from engine rank {rank}")
        peer.name = f"engine rank {rank}"
        self.engines[rank] = peer
        if len(self.engines) == n:
            self.all_subscribed.set()
            for p in self.engines.values():
                p.send_nowait(CoordinatorReady())
            log.info("all %d engines subscribed; sent CoordinatorReady", n)
        return rank

    def _rejoining_rank(self, msg: Subscribe, peer: Peer) -> int | None:
        """Dense, after startup: the rank a restarted node's engine subscribes for, or None (logged) for a bad
        subscription: a serving coordinator drops that link, it does not fail."""
        rank = msg.dp_rank
        if rank is None or not 0 <= rank < self.config.dp_size:
            log.warning("dropping the %s: it opened with %s after startup", peer.name, describe_frame(msg))
            return None
        peer.name = f"engine rank {rank}"
        return rank

    def _rejoin(self, rank: int, peer: Peer) -> None:
        """The core: ``peer`` takes dead ``rank``'s place, or waits until the rank's lost link is marked dead (a
        lost host is seen only after the heartbeat timeout); a newer restart replaces a waiting one."""
        if self.machine.revive(rank):
            self.book.mark_alive(rank)
            self.engines[rank] = peer
            peer.send_nowait(CoordinatorReady())
            log.info("engine rank %d subscribed again (its node was restarted); it rejoins the load statistics",
                     rank)
        else:
            if (earlier := self._rejoining.get(rank)) is not None:
                earlier.cut(f"engine rank {rank} subscribed again in its place")
            self._rejoining[rank] = peer

    async def _read_engine(self, peer: Peer, rank: int) -> None:
        while (msg := await peer.receive()) is not None:
            if isinstance(msg, RankStats | WaveComplete | StartWaveRequest):
                await self._inbox_send.send(EngineMessage(rank, msg))
            elif isinstance(msg, PrefixCacheReset) and msg.dp_rank == rank:
                self.directory.forget_rank(rank)  # (shared by the readers: it never awaits)
            elif isinstance(msg, Goodbye):
                peer.departed = True
                await self._inbox_send.send(W.EngineLost(rank, f"rank {rank} shut down", orderly=True))
                return
            elif isinstance(msg, EngineDead):
                peer.lost_reason = f"engine rank {rank} died: {msg.reason}"
                return
            elif not isinstance(msg, Heartbeat):
                log.warning("dropping unexpected %s from %s", type(msg).__name__, peer.name)

    async def _serve_client(self, link: Link) -> None:
        peer = self._peer(link, "client link")
        key = self._next_client_key
        self._next_client_key += 1
        try:
            first = await peer.receive()
            if not isinstance(first, Subscribe) or first.client_id is None:
                if first is not None:
                    log.warning("dropping the %s: it opened with %s instead of Subscribe{client_id}", peer.name,
                                describe_frame(first))
                return
            peer.name = f"client {first.client_id}"
            self.clients[key] = peer
            await self._inbox_send.send(ClientJoined(key))
            await self._run_peer(peer, lambda: self._read_client(peer, key))
            # While the deployment stops in order every client leaves: that is no news worth a line each.
            log.log(logging.DEBUG if self.stopping.is_set() else logging.INFO, "%s left: %s", peer.name,
                    peer.lost_reason)
        finally:
            self.clients.pop(key, None)
            self.directory.forget_client(key)
            peer.close()
            with anyio.CancelScope(shield=True):
                await link.aclose()

    async def _read_client(self, peer: Peer, key: int) -> None:
        while (msg := await peer.receive()) is not None:
            if isinstance(msg, FirstRequest):
                await self._inbox_send.send(ClientMessage(msg))
            elif isinstance(msg, PrefixClaim):
                answer_claim(self.directory, self.clients, peer, key, msg)
            elif not isinstance(msg, Heartbeat | Subscribe):
                log.warning("dropping unexpected %s from %s", type(msg).__name__, peer.name)

    # ------------------------------------------------------------ the core

    async def _core(self) -> None:
        """The only task that changes state. Returns on an orderly end; raises when the group must die."""
        while True:
            now = anyio.current_time()
            item = None
            with anyio.CancelScope(deadline=self.book.next_publish_deadline(now)):
                item = await self._inbox_recv.receive()
            if item is None:
                pub = self.book.take_snapshot(anyio.current_time())
                if pub is not None:
                    self._publish(pub)
                continue
            if await self._handle(item):
                return

    async def _handle(self, item: CoordinatorInbox) -> bool:
        match item:
            case EngineMessage(dp_rank=rank, msg=RankStats() as msg):
                if msg.dp_rank != rank:
                    log.warning("RankStats for rank %d on the link of rank %d; dropped", msg.dp_rank, rank)
                    return False
                self.book.on_rank_stats(rank, msg.num_waiting, msg.num_running, msg.kv_cache_usage,
                                        msg.step, msg.wave, msg.prefill_tokens, msg.cache_fill)
                return False
            case EngineMessage(dp_rank=rank, msg=WaveComplete(wave=wave)):
                # The link says who sent it; a rank field that disagrees is not trusted.
                return await self._perform(self.machine.handle(W.WaveComplete(wave, rank)))
            case EngineMessage(dp_rank=rank, msg=StartWaveRequest(wave=wave)):
                return await self._perform(self.machine.handle(W.StartWaveRequest(rank, wave)))
            case ClientMessage(msg=msg):
                return await self._perform(self.machine.handle(W.FirstRequest(msg.exclude_rank, msg.wave)))
            case ClientJoined(key=key):
                peer = self.clients.get(key)
                if peer is not None:
                    self.seq += 1
                    peer.send_nowait(self._snapshot(Publication(None) if self.config.external_lb
                                                    else self.book.current()))
                return False
            case W.EngineLost():
                return await self._perform(self.machine.handle(item))
            case EngineRejoined(dp_rank=rank, peer=peer):
                if peer.lost_reason is None and not peer.departed:  # (gone meanwhile: nothing takes its place)
                    self._rejoin(rank, peer)
                return False
            case _:
                raise ProtocolError(f"DP coordinator: unknown inbox item {item!r}")

    def _snapshot(self, pub: Publication) -> StatsSnapshot:
        return StatsSnapshot(counts=pub.counts, wave=self.machine.current_wave, running=self.machine.running,
                             seq=self.seq, prefill_tokens=pub.prefill_tokens, cache_fill=pub.cache_fill)

    def _publish(self, pub: Publication) -> None:
        self.seq += 1
        snap = self._snapshot(pub)
        for peer in list(self.clients.values()):
            peer.send_nowait(snap)

    async def _perform(self, actions: list[W.Action]) -> bool:
        for action in actions:
            if isinstance(action, W.BroadcastStartWave):
                msg = StartWave(wave=action.wave, exclude_rank=action.exclude_rank)
                for peer in list(self.engines.values()):
                    peer.send_nowait(msg)
            elif isinstance(action, W.PublishWave):
                self._publish(Publication(None))
            elif isinstance(action, W.LogProtocolError):
                log.error("protocol error: %s", action.message)
            elif isinstance(action, W.MarkDead):
                if self.stopping.is_set():  # an orderly shutdown: the ranks leave, nothing was lost
                    log.debug("engine rank %d left (%s)", action.dp_rank, action.reason)
                elif action.orderly:  # its own node stopped it (Goodbye): a departure, not a loss
                    log.info("engine rank %d left in order (its node is stopping); it leaves the load statistics",
                             action.dp_rank)
                else:
                    log.warning("engine rank %d lost (%s); it leaves the load statistics", action.dp_rank,
                                action.reason)
                self.book.mark_dead(action.dp_rank)
                self.directory.drop_rank(action.dp_rank)
                self.engines.pop(action.dp_rank, None)
                if (waiting := self._rejoining.pop(action.dp_rank, None)) is not None and \
                        waiting.lost_reason is None and not waiting.departed:
                    self._rejoin(action.dp_rank, waiting)
                if self.machine.all_dead:
                    if self.config.ranks_can_return and not self.stopping.is_set():
                        log.warning("every engine rank is gone; the coordinator serves on, for a node restarted "
                                    "in place of a lost one to bring its ranks back")
                        continue
                    log.info("%s", "every engine rank left; the coordinator stops" if self.stopping.is_set()
                             else "every engine rank is gone; the coordinator stops")
                    return True
            elif isinstance(action, W.Teardown):
                await tear_down(action, self.engines, self.stopping, self.config)
                if action.orderly:
                    return True
                raise EngineDeadError(f"DP group torn down: {action.reason}")
        return False


async def serve_coordinator(config: CoordinatorConfig, engine_listener: Listener, client_listener: Listener, *,
                            stopping: anyio.Event | None = None,
                            task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Run the coordinator role until it ends. ``task_status.started()`` once its tasks are accepting links.

    Returns after an orderly end (a MoE ``Goodbye``, or every dense engine gone). Raises
    :class:`~asyncdp.errors.EngineDeadError` after a MoE teardown caused by a lost engine and
    :class:`~asyncdp.errors.StartupError` for a bad subscription; the process maps both to exit code 1.
    """
    coordinator = Coordinator(config, stopping=stopping)
    try:
        await coordinator.run(engine_listener, client_listener, task_status)
    except BaseExceptionGroup as group:
        # Under trio a teardown can leave Cancelled leaves beside the real error; they are not the cause.
        leaves = [e for e in leaf_exceptions(group) if not isinstance(e, anyio.get_cancelled_exc_class())]
        if len(leaves) == 1 and isinstance(leaves[0], AsyncDPError):
            raise leaves[0] from None
        raise
