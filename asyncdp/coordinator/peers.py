"""The coordinator's peers: one link per engine or client, its bounded outbox and writer, its liveness, and the
typed items the link readers post to the coordinator's core.

Theory of operation. A :class:`Peer` wraps one link. ``receive`` returns the next frame, or ``None`` once the
peer is gone: EOF, a link error, or silence past the heartbeat timeout (:class:`~asyncdp.dp.liveness.Liveness`:
any frame counts; a bad frame is logged, the first at WARNING and the rest at DEBUG, counts as heard, and is
skipped). ``write_loop`` drains the outbox to the
link, so no slow peer ever blocks the core; the core only ever calls ``send_nowait``.

Full outbox (no silent loss): a message is never dropped while the peer is connected. When a peer's outbox is
full (``CoordinatorConfig.outbox_size`` messages: it stopped reading), or one send to it takes longer than the
heartbeat timeout, the peer is *cut*: its link handler's scope is cancelled and the link is closed, so the peer
sees EOF. A cut client reconnects and subscribes again (it gets a fresh welcome snapshot); a cut engine is a lost
engine (MoE: the group is torn down; dense: the rank leaves the statistics). Only ``send_nowait`` to a peer that
is already closed or cut does nothing: nobody could receive that message.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from asyncdp.dp import wave as W
from asyncdp.dp.liveness import Liveness
from asyncdp.errors import ProtocolError
from asyncdp.messages import FirstRequest, RankStats, StartWaveRequest, Subscribe, WaveComplete
from asyncdp.transport.links import LINK_ERRORS

log = logging.getLogger(__name__)



class Link(Protocol):
    async def send(self, msg: Any) -> None: ...
    async def receive(self) -> Any: ...
    async def aclose(self) -> None: ...


class Listener(Protocol):
    async def serve(self, handler: Callable[[Any], Awaitable[None]]) -> None: ...


# ---------------------------------------------------------------------------------------- the core's inbox


@dataclass(frozen=True, slots=True)
class EngineMessage:
    """A load or wave message from engine ``dp_rank``'s link (the link, not the message, says who sent it)."""

    dp_rank: int
    msg: RankStats | WaveComplete | StartWaveRequest


@dataclass(frozen=True, slots=True)
class ClientMessage:
    """A client's ``FirstRequest`` (wake an idle MoE group)."""

    msg: FirstRequest


@dataclass(frozen=True, slots=True)
class ClientJoined:
    """Client link ``key`` subscribed: it gets a welcome snapshot."""

    key: int


@dataclass(frozen=True, slots=True)
class EngineRejoined:
    """Dense, once every rank subscribed: engine ``dp_rank`` subscribed again on ``peer`` (a restarted node)."""

    dp_rank: int
    peer: Peer


#: Everything the core receives; an engine loss (EOF, silence, ``EngineDead``, ``Goodbye``) is the wave
#: machine's own :class:`~asyncdp.dp.wave.EngineLost` event.
CoordinatorInbox = EngineMessage | ClientMessage | ClientJoined | EngineRejoined | W.EngineLost


class Peer:
    """One link with its bounded outbox (drained by ``write_loop``) and its liveness."""

    def __init__(self, link: Link, name: str, outbox_size: int, timeout_s: float) -> None:
        self.link = link
        self.name = name
        self.timeout_s = timeout_s
        self.liveness = Liveness(timeout_s, anyio.current_time())
        self._send, self._recv = anyio.create_memory_object_stream[Any](outbox_size)
        self.outbox_size = outbox_size
        self.flushed = anyio.Event()
        self.scope = anyio.CancelScope()
        self.lost_reason: str | None = None
        self.departed = False  # said Goodbye: its EOF is not a loss
        self.num_bad_frames = 0

    async def receive(self) -> Any:
        """The next frame, or None when the peer is gone (EOF, error, or silent past the heartbeat timeout)."""
        while True:
            planned = self.liveness.deadline_s()
            with anyio.CancelScope(deadline=planned):
                try:
                    msg = await self.link.receive()
                except ProtocolError as exc:  # the first at WARNING: one peer may not flood the log
                    self.num_bad_frames += 1
                    log.log(logging.WARNING if self.num_bad_frames == 1 else logging.DEBUG,
                            "dropping a bad frame from %s: %s", self.name, exc)
                    self.liveness.heard(anyio.current_time())
                    continue
                except LINK_ERRORS as exc:
                    self.lost_reason = self.lost_reason or f"{self.name} link closed ({type(exc).__name__})"
                    return None
                self.liveness.heard(anyio.current_time())
                return msg
            now = anyio.current_time()
            if self.liveness.excuse_late_wake(planned, now):
                continue  # this process was not running: read what the peer sent meanwhile (receive is safe to retry)
            self.lost_reason = self.lost_reason or self.liveness.describe(self.name, now)
            return None

    def send_nowait(self, msg: Any) -> bool:
        """Queue a message; False (and the peer is cut off) when its outbox is full, False when it is closed."""
        try:
            self._send.send_nowait(msg)
            return True
        except anyio.WouldBlock:
            self.cut(f"{self.name} is not reading (outbox full: {self.outbox_size} messages)")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        return False

    def close_outbox(self) -> None:
        self._send.close()

    def close(self) -> None:
        self._send.close()
        self._recv.close()

    def cut(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
        self.scope.cancel()

    async def write_loop(self) -> None:
        try:
            async with self._recv:
                async for msg in self._recv:
                    with anyio.move_on_after(self.timeout_s) as sc:
                        await self.link.send(msg)
                    if sc.cancelled_caught:
                        self.cut(f"{self.name}: send timed out after {self.timeout_s:g} s")
                        return
        except LINK_ERRORS as exc:
            self.cut(f"{self.name} link closed ({type(exc).__name__})")
        finally:
            self.flushed.set()


def describe_frame(msg: Any) -> str:
    """A peer's first frame for a log line: its type, and the rank or client a Subscribe names (never the whole
    frame: a stranger's may be megabytes)."""
    if isinstance(msg, Subscribe):
        return f"Subscribe(dp_rank={msg.dp_rank}, client_id={msg.client_id})"
    return type(msg).__name__
