"""A rank's links: the readers, the heartbeat, one bounded outbox and writer per client, the death notice
(spec §5.7, §8.1, §8.8), and the typed items the readers post to the busy loop.

Theory of operation. Readers decode frames and post them into the rank's bounded inbox (the busy loop is the
only consumer) as one of the :data:`InboxItem` structs. Two coordinator events cannot wait for the loop, which
may be blocked in a collective or on the execution thread: ``Teardown`` and the loss of the coordinator (EOF, or
silence past the heartbeat timeout by :class:`~asyncdp.dp.liveness.Liveness`) go straight to the owner's
``on_teardown`` / ``on_coordinator_lost``; the loss is reported once, whichever is seen first (a failed send, which
the owner reports itself, counts too). Heartbeats are sent (:func:`~asyncdp.transport.heartbeat.send_heartbeats`)
to the coordinator and, through their outboxes, to every client (which declares a rank silent past the heartbeat
timeout dead), and checked by their own tasks on the event loop, never by the execution thread.

The busy loop never writes to a client link and never waits for one: :meth:`RankLinks.post_nowait` puts the
message into that client's bounded outbox and a writer task drains it, so a slow client delays only its own
writer. A message is never dropped while the link is up: when a client's outbox is full (the client stopped
reading) the rank *cuts that client's link* instead, once, with a warning: the writer stops, tells the client
``EngineDead`` (best effort, bounded by ``CUT_NOTICE_S``) and closes the link, so the client's reader sees EOF and
fails that client's requests with a clear error; the reader here then posts :class:`ClientGone` and the rank
aborts the client's requests. Other clients are unaffected. Outputs go only to the client that owns the
request; utility results only to the caller. Coordinator messages are few and sent directly. ``flush`` closes
the outboxes and waits (bounded) for the writers, so the last outputs reach the clients before an orderly exit.
``announce_death`` writes ``EngineDead`` straight to every link (shielded, at most 5 s), bypassing outboxes that
may be stuck.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from contextlib import suppress
from dataclasses import dataclass
from typing import Protocol

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectSendStream

from asyncdp import messages as m
from asyncdp.dp.liveness import Liveness
from asyncdp.errors import AsyncDPError, InvalidRequestError, RankTornDown, leaf_exceptions
from asyncdp.transport import Link
from asyncdp.transport.heartbeat import send_heartbeats
from asyncdp.transport.links import LINK_ERRORS, Frames

log = logging.getLogger(__name__)

OUTBOX_SIZE = 1024
EOF_FLUSH_S = 5.0
CUT_NOTICE_S = 1.0  # how long a cut link's writer tries to hand the client its EngineDead notice


# ---------------------------------------------------------------------------------------- the rank's inbox


@dataclass(frozen=True, slots=True)
class ClientMessage:
    """A frame from client ``client_index``'s link."""

    client_index: int
    msg: m.Message


@dataclass(frozen=True, slots=True)
class ClientGone:
    """Client ``client_index``'s link ended (it closed it, or the rank cut it): nobody receives its outputs."""

    client_index: int


@dataclass(frozen=True, slots=True)
class CoordinatorMessage:
    """A frame from the coordinator other than ``Heartbeat`` and ``Teardown`` (handled by the reader)."""

    msg: m.Message


@dataclass(frozen=True, slots=True)
class Wake:
    """No news: only wakes the busy loop (a shutdown request from another task)."""


@dataclass(frozen=True, slots=True)
class GrammarCompiled:
    """The grammar of ``msg`` (an admitted request waiting for it) compiled in a worker thread, or failed to
    (``error``); ``ticket`` names that compilation (:mod:`asyncdp.engine.rank_grammar`)."""

    msg: m.AddRequest
    ticket: int
    error: InvalidRequestError | None = None


InboxItem = ClientMessage | ClientGone | CoordinatorMessage | Wake | GrammarCompiled
WAKE = Wake()


class LinkOwner(Protocol):
    def on_teardown(self, reason: str, *, orderly: bool = False) -> None:
        """``Teardown`` arrived from the coordinator (may raise to end the rank); ``orderly``: the deployment
        is stopping in order."""

    def on_coordinator_lost(self, reason: str) -> None:
        """The coordinator link reached EOF or went silent (may raise to end the rank)."""


class _ClientOutbox:
    """One client's bounded outbox, drained by its writer task; ``cut`` ends both at once. A deque and an event
    the writer waits on when it finds the deque empty, not a memory object stream: an outbox has one producer,
    the busy loop, which never waits for it, and one consumer; the stream's receive cost a scheduling point, an
    event, a receiver object and a cancellation check per message (about 7 µs on asyncio), twice per request."""

    def __init__(self, client_index: int, size: int) -> None:
        self.client_index = client_index
        self.size = size
        self._items: deque[m.Message] = deque()
        self._closed = False  # nothing more is queued: the writer sends what is there, then ends
        self._wakeup: anyio.Event | None = None  # the writer waits on it for the next item
        self.flushed = anyio.Event()
        self.scope = anyio.CancelScope()
        self.cut_reason: str | None = None

    def put_nowait(self, msg: m.Message) -> bool:
        """Queue ``msg``; False when the outbox is full. A closed outbox takes nothing (and is not full)."""
        if self._closed:
            return True
        if len(self._items) >= self.size:
            return False
        self._items.append(msg)
        self._wake()
        return True

    def close(self) -> None:
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set()

    async def get(self) -> m.Message | None:
        """The next message (at once when one is queued), or None once the outbox is closed and empty."""
        items = self._items
        while not items:
            if self._closed:
                return None
            wakeup = self._wakeup = anyio.Event()
            await wakeup.wait()
        return items.popleft()


class RankLinks:
    def __init__(self, dp_rank: int, clients: dict[int, Link], coordinator: Link | None, *,
                 outbox_size: int = OUTBOX_SIZE) -> None:
        self.dp_rank = dp_rank
        self.clients = clients
        self.coordinator = coordinator
        self.outbox_size = outbox_size
        self._outboxes: dict[int, _ClientOutbox] = {}
        self._coordinator_lost = False  # reported to the owner (or seen by it on a send): never again

    def start(self, tg: anyio.abc.TaskGroup, inbox: MemoryObjectSendStream[InboxItem], owner: LinkOwner, *,
              heartbeat_interval_s: float, heartbeat_timeout_s: float) -> None:
        """Start the writers, the readers and (with a coordinator) the heartbeat tasks in ``tg``."""
        for ci, link in self.clients.items():
            box = self._outboxes[ci] = _ClientOutbox(ci, self.outbox_size)
            tg.start_soon(self._write_link, link, box)
            tg.start_soon(self._read_client, ci, link, inbox)
            # through the outbox, like every frame to a client: a client that stops reading is cut, not blocked on
            tg.start_soon(send_heartbeats, functools.partial(self.post_nowait, ci), heartbeat_interval_s,
                          f"engine-{self.dp_rank}")
        if self.coordinator is not None:
            liveness = Liveness(heartbeat_timeout_s, anyio.current_time())
            tg.start_soon(self._read_coordinator, self.coordinator, inbox, owner, liveness)
            tg.start_soon(send_heartbeats, self.coordinator.send, heartbeat_interval_s, f"engine-{self.dp_rank}")
            tg.start_soon(self._watch_coordinator, owner, liveness, heartbeat_interval_s)

    # ------------------------------------------------------------ readers and the coordinator watch

    async def _read_client(self, client_index: int, link: Link, inbox: MemoryObjectSendStream[InboxItem]) -> None:
        frames = Frames(link, f"rank {self.dp_rank}: client {client_index}'s link")
        try:
            while (msg := await frames.next()) is not None:
                item = ClientMessage(client_index, msg)
                try:  # room in the inbox: no scheduling point of its own (the next read has one when it waits)
                    inbox.send_nowait(item)
                except anyio.WouldBlock:
                    await inbox.send(item)
        except LINK_ERRORS:
            pass  # this rank cut the link (a full outbox), or it broke: the same as a close
        # DEBUG: every client closes its link to every rank at each shutdown; the rank logs the aborts it causes.
        log.debug("rank %d: the link of client %d ended", self.dp_rank, client_index)
        # Nobody can receive that client's outputs any more: its requests are aborted, not run to the end.
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await inbox.send(ClientGone(client_index))

    async def _read_coordinator(self, link: Link, inbox: anyio.abc.ObjectSendStream[InboxItem],
                                owner: LinkOwner, liveness: Liveness) -> None:
        frames = Frames(link, f"rank {self.dp_rank}: the coordinator's link")
        while (msg := await frames.next()) is not None:
            liveness.heard(anyio.current_time())
            if isinstance(msg, m.Heartbeat):
                continue
            if isinstance(msg, m.Teardown):  # at once: the loop may be blocked in a collective
                owner.on_teardown(f"teardown from the coordinator: {msg.reason}", orderly=msg.orderly)
                return
            await inbox.send(CoordinatorMessage(msg))
        self._lose_coordinator(owner, "the coordinator closed its link")

    async def _watch_coordinator(self, owner: LinkOwner, liveness: Liveness, interval_s: float) -> None:
        while not self._coordinator_lost:  # a link known closed is not also reported silent
            planned = anyio.current_time() + interval_s
            await anyio.sleep_until(planned)
            now = anyio.current_time()
            # after a stall of this process the coordinator's frames are still unread: the reader gets its turn
            if liveness.expired(now) and not liveness.excuse_late_wake(planned, now):
                self._lose_coordinator(owner, liveness.describe("the coordinator", now))
                return

    def _lose_coordinator(self, owner: LinkOwner, reason: str) -> None:
        """The coordinator is gone: tell the owner once, whichever of EOF and silence is seen first."""
        if self._coordinator_lost:
            return
        self._coordinator_lost = True
        owner.on_coordinator_lost(reason)

    # ------------------------------------------------------------ client outboxes

    async def _write_link(self, link: Link, box: _ClientOutbox) -> None:
        try:
            with box.scope:
                while (msg := await box.get()) is not None:
                    try:
                        await link.send(msg)
                    except LINK_ERRORS:
                        return  # the client is gone
        finally:
            box.close()  # what the loop posts from now on goes nowhere
            if box.cut_reason is not None:
                await self._close_cut_link(link, box.cut_reason)
            box.flushed.set()

    async def _close_cut_link(self, link: Link, reason: str) -> None:
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(CUT_NOTICE_S):
                with suppress(*LINK_ERRORS):
                    await link.send(m.EngineDead(dp_rank=self.dp_rank, reason=reason))
            with anyio.move_on_after(CUT_NOTICE_S), suppress(*LINK_ERRORS):
                await link.aclose()

    def post_nowait(self, client_index: int, msg: m.Message) -> None:
        """Queue ``msg`` for a client without waiting; a full outbox cuts that client's link (never a drop of a
        message the client could still receive). A no-op for an unknown, closed or already cut client."""
        box = self._outboxes.get(client_index)
        if box is None or box.cut_reason is not None:
            return
        if not box.put_nowait(msg):
            self.cut_client(client_index, f"the outbox to client {client_index} is full ({box.size} messages: "
                                          f"the client stopped reading); rank {self.dp_rank} cut its link")

    def cut_client(self, client_index: int, reason: str) -> None:
        """End one client's link now (idempotent): its writer stops, notifies and closes the link."""
        box = self._outboxes.get(client_index)
        if box is None or box.cut_reason is not None:
            return
        box.cut_reason = reason
        log.warning("rank %d: %s", self.dp_rank, box.cut_reason)
        box.close()
        box.scope.cancel()

    def live_stats_client(self) -> int | None:
        """The client that gets scheduler stats when no client has outputs: the lowest index whose link is not
        cut (a cut one would swallow them, and their counter deltas with them); None when every link is cut."""
        return next((ci for ci in sorted(self._outboxes) if self._outboxes[ci].cut_reason is None), None)

    def is_cut(self, client_index: int) -> bool:
        box = self._outboxes.get(client_index)
        return box is not None and box.cut_reason is not None

    def close(self) -> None:
        for box in self._outboxes.values():
            box.close()

    async def flush(self, timeout_s: float = EOF_FLUSH_S) -> None:
        """Close every outbox and wait until the writers have sent what was queued (bounded)."""
        self.close()
        with anyio.move_on_after(timeout_s):
            for box in self._outboxes.values():
                await box.flushed.wait()

    # ------------------------------------------------------------ direct sends

    async def send_coordinator(self, msg: m.Message) -> bool:
        """False when the coordinator link is broken (the caller decides what that means)."""
        if self.coordinator is None:
            return True
        try:
            await self.coordinator.send(msg)
            return True
        except LINK_ERRORS:
            self._coordinator_lost = True  # the caller reports it; the reader's EOF and the watch stay quiet
            return False

    async def announce_death(self, reason: str) -> None:
        """Tell every client and the coordinator that this rank is dead; bounded flush (spec §8.8)."""
        dead = m.EngineDead(dp_rank=self.dp_rank, reason=reason)
        links = [link for ci, link in self.clients.items() if not self.is_cut(ci)]
        with anyio.CancelScope(shield=True), anyio.move_on_after(EOF_FLUSH_S):
            for link in [*links, *([self.coordinator] if self.coordinator else [])]:
                try:
                    await link.send(dead)
                except Exception:  # noqa: BLE001 - best effort: the peer may be gone too
                    pass


def main_error(exc: BaseException) -> BaseException | None:
    """The error a failed run reports: None for plain cancellation; the single meaningful leaf of a task group
    failure (a RankTornDown wins over the collective errors it causes), else ``exc`` itself."""
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        return None
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    leaves = [e for e in leaf_exceptions(exc) if not isinstance(e, anyio.get_cancelled_exc_class())]
    if not leaves:
        return None
    if all(isinstance(e, AsyncDPError) for e in leaves):
        torn = [e for e in leaves if isinstance(e, RankTornDown)]  # a peer's orderly stop is the better cause
        return next((e for e in torn if e.peer_stopped), torn[0] if torn else leaves[0])
    return exc


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe_error(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"

