"""A rank's links: the readers, the heartbeat, one bounded outbox and writer per client, the death notice
(spec §5.7, §8.1, §8.8).

Theory of operation. Readers decode frames and post them into the rank's bounded inbox (the busy loop is the
only consumer). Two coordinator events cannot wait for the loop, which may be blocked in a collective or on
the execution thread: ``Teardown`` and the loss of the coordinator (EOF, or silence past the heartbeat
timeout) go straight to the owner's ``on_teardown`` / ``on_coordinator_lost``. Heartbeats are sent and
checked by their own task on the event loop, never by the execution thread.

The busy loop never writes to a client link itself: it puts messages into that client's bounded outbox, and a
writer task drains it, so a slow client delays only its own writer (until its outbox is full). Outputs go
only to the client that owns the request; utility results only to the caller. Coordinator messages are few
and sent directly. ``flush`` closes the outboxes and waits (bounded) for the writers, so the last outputs
reach the clients before an orderly exit. ``announce_death`` writes ``EngineDead`` straight to every link
(shielded, at most 5 s), bypassing outboxes that may be stuck.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectSendStream

from asyncdp import messages as m
from asyncdp.transport import Link

log = logging.getLogger(__name__)

OUTBOX_SIZE = 1024
EOF_FLUSH_S = 5.0
_LINK_ERRORS = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


@dataclass(slots=True)
class Inbox:
    """An item the readers post to the busy loop."""

    kind: str  # "client" | "client_gone" | "coordinator" | "wake"
    msg: Any = None
    client_index: int = -1


class LinkOwner(Protocol):
    def on_teardown(self, reason: str, *, orderly: bool = False) -> None:
        """``Teardown`` arrived from the coordinator (may raise to end the rank); ``orderly``: the deployment
        is stopping in order."""

    def on_coordinator_lost(self, reason: str) -> None:
        """The coordinator link reached EOF or went silent (may raise to end the rank)."""


class RankLinks:
    def __init__(self, dp_rank: int, clients: dict[int, Link], coordinator: Link | None) -> None:
        self.dp_rank = dp_rank
        self.clients = clients
        self.coordinator = coordinator
        self.stats_client = min(clients) if clients else 0  # gets scheduler stats when no client has outputs
        self._outboxes: dict[int, MemoryObjectSendStream[m.Message]] = {}
        self._flushed: list[anyio.Event] = []
        self._coordinator_seen = 0.0

    def start(self, tg: anyio.abc.TaskGroup, inbox: anyio.abc.ObjectSendStream[Inbox], owner: LinkOwner, *,
              heartbeat_interval_s: float, heartbeat_timeout_s: float) -> None:
        """Start the writers, the readers and (with a coordinator) the heartbeat task in ``tg``."""
        for ci, link in self.clients.items():
            send, recv = anyio.create_memory_object_stream[m.Message](OUTBOX_SIZE)
            self._outboxes[ci] = send
            self._flushed.append(anyio.Event())
            tg.start_soon(self._write_link, link, recv, self._flushed[-1])
            tg.start_soon(self._read_client, ci, link, inbox)
        if self.coordinator is not None:
            self._coordinator_seen = anyio.current_time()
            tg.start_soon(self._read_coordinator, self.coordinator, inbox, owner)
            tg.start_soon(self._heartbeat, self.coordinator, owner, heartbeat_interval_s, heartbeat_timeout_s)

    async def _read_client(self, client_index: int, link: Link, inbox: anyio.abc.ObjectSendStream[Inbox]) -> None:
        async for msg in link:
            await inbox.send(Inbox("client", msg, client_index))
        # DEBUG: every client closes its link to every rank at each shutdown; the rank logs the aborts it causes.
        log.debug("rank %d: client %d closed its link", self.dp_rank, client_index)
        # Nobody can receive that client's outputs any more: its requests are aborted, not run to the end.
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await inbox.send(Inbox("client_gone", None, client_index))

    async def _read_coordinator(self, link: Link, inbox: anyio.abc.ObjectSendStream[Inbox],
                                owner: LinkOwner) -> None:
        async for msg in link:
            self._coordinator_seen = anyio.current_time()
            if isinstance(msg, m.Heartbeat):
                continue
            if isinstance(msg, m.Teardown):  # at once: the loop may be blocked in a collective
                owner.on_teardown(f"teardown from the coordinator: {msg.reason}", orderly=msg.orderly)
                return
            await inbox.send(Inbox("coordinator", msg))
        owner.on_coordinator_lost("the coordinator closed its link")

    async def _heartbeat(self, link: Link, owner: LinkOwner, interval_s: float, timeout_s: float) -> None:
        seq = 0
        while True:
            await anyio.sleep(interval_s)
            seq += 1
            try:
                await link.send(m.Heartbeat(sender=f"engine-{self.dp_rank}", seq=seq))
            except _LINK_ERRORS:
                pass  # the reader sees the EOF
            silence = anyio.current_time() - self._coordinator_seen
            if silence > timeout_s:
                owner.on_coordinator_lost(f"no heartbeat from the coordinator for {silence:.1f} s")
                return

    @staticmethod
    async def _write_link(link: Link, outbox: anyio.abc.ObjectReceiveStream[m.Message],
                          flushed: anyio.Event) -> None:
        try:
            async with outbox:
                async for msg in outbox:
                    try:
                        await link.send(msg)
                    except _LINK_ERRORS:
                        return  # the client is gone
        finally:
            flushed.set()

    def close(self) -> None:
        for out in self._outboxes.values():
            out.close()

    async def flush(self, timeout_s: float = EOF_FLUSH_S) -> None:
        """Close every outbox and wait until the writers have sent what was queued (bounded)."""
        self.close()
        with anyio.move_on_after(timeout_s):
            for event in self._flushed:
                await event.wait()

    async def send_to_client(self, client_index: int, msg: m.Message) -> None:
        out = self._outboxes.get(client_index)
        if out is None:
            return
        try:
            await out.send(msg)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    def post_nowait(self, client_index: int, msg: m.Message) -> None:
        out = self._outboxes.get(client_index)
        if out is None:
            return
        try:
            out.send_nowait(msg)
        except anyio.WouldBlock:
            log.warning("rank %d: outbox of client %d is full; dropping %s", self.dp_rank, client_index,
                        type(msg).__name__)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    async def send_coordinator(self, msg: m.Message) -> bool:
        """False when the coordinator link is broken (the caller decides what that means)."""
        if self.coordinator is None:
            return True
        try:
            await self.coordinator.send(msg)
            return True
        except _LINK_ERRORS:
            return False

    async def announce_death(self, reason: str) -> None:
        """Tell every client and the coordinator that this rank is dead; bounded flush (spec §8.8)."""
        dead = m.EngineDead(dp_rank=self.dp_rank, reason=reason)
        with anyio.CancelScope(shield=True), anyio.move_on_after(EOF_FLUSH_S):
            for link in [*self.clients.values(), *([self.coordinator] if self.coordinator else [])]:
                try:
                    await link.send(dead)
                except Exception:  # noqa: BLE001 - best effort: the peer may be gone too
                    pass
