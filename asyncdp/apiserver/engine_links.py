"""The DP client's links to its engine ranks: the ``EngineReady`` handshake, bounded sends, utility calls.

Theory of operation
-------------------
:class:`EngineLinks` accepts the links every managed rank opens to the client's listener and keeps one reader
per link; :func:`read_engine_ready` takes the first frame within
``ENGINE_READY_FRAME_TIMEOUT_S`` and accepts it only if it is an ``EngineReady`` of a managed rank (anything else
drops that link; the client keeps waiting for a good one); a bad frame after it is logged and dropped, the link
goes on. :class:`EngineLink` is one accepted link: the rank,
its ``EngineReady``, whether it is alive and when it was last heard from. A managed rank may connect again after
its link ended (dense: a restarted node brings its ranks back, spec §13): the new link takes the rank's place
(``on_ready`` again), and an old link still open but silent for half the heartbeat timeout then counts as dead at
once (a lost host); a rank whose link was heard more recently keeps it, and the new link is dropped. Only the
current link of a rank reports its end.

Every wait on an engine has a deadline. :func:`send_to_engine` bounds a send by ``ENGINE_SEND_TIMEOUT_S`` (a
link that stays full means the rank stopped reading) and turns a broken link into ``EngineDeadError``; a
deadline passed is ``EngineTimeoutError``; both name the rank and the message. :class:`UtilityCalls` keeps the
calls waiting on ``UtilityResult`` frames: a call ends when every rank it was sent to answered, fails at once
with ``EngineDeadError`` when one of those ranks dies or its link closes (``on_rank_dead``), and fails with
``EngineTimeoutError`` naming the ranks that never answered within ``ClientConfig.utility_timeout_s`` (600 s).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from asyncdp import messages as m
from asyncdp.dp.liveness import Liveness
from asyncdp.errors import (
    AsyncDPError,
    EngineDeadError,
    EngineTimeoutError,
    ProtocolError,
    StartupError,
    UnavailableError,
)
from asyncdp.transport import Link
from asyncdp.transport.links import LINK_ERRORS, Frames

log = logging.getLogger(__name__)

ENGINE_READY_FRAME_TIMEOUT_S = 30.0
# A send to a rank waits for room on its link at most this long: a rank that does not read for that long is stuck.
ENGINE_SEND_TIMEOUT_S = 30.0
ABORT_SEND_TIMEOUT_S = 2.0



@dataclass(slots=True)
class EngineLink:
    dp_rank: int
    link: Link
    ready: m.EngineReady
    last_seen: float = 0.0
    heard_s: float = 0.0  # anyio.current_time() when it was last heard from
    ended: str | None = None  # once it ended: how (its EngineDead reason, "its link closed", a missed heartbeat)

    @property
    def alive(self) -> bool:
        return self.ended is None


async def read_engine_ready(link: Link, managed_ranks: tuple[int, ...], client_index: int) -> m.EngineReady | None:
    """The link's first frame if it is the ``EngineReady`` of a managed rank; else None (the link is closed).

    Anything else is no engine of this client (a port scan, another service, a stranger: the listener is TCP on the
    DP address multi-node): one line naming its address, a plain connect-and-close at DEBUG only."""
    who = f"client {client_index}: an engine link from {link.remote}"
    try:
        with anyio.fail_after(ENGINE_READY_FRAME_TIMEOUT_S):  # a connected engine is ready: it says so at once
            first = await link.receive()
    except anyio.EndOfStream:
        level, why = logging.DEBUG, "closed before its first frame"
    except TimeoutError:
        level, why = logging.WARNING, f"sent no frame within {ENGINE_READY_FRAME_TIMEOUT_S:g} s"
    except ProtocolError as exc:
        level, why = logging.WARNING, str(exc)
    else:
        if isinstance(first, m.EngineReady) and first.dp_rank in managed_ranks:
            return first
        if isinstance(first, m.EngineReady):  # an engine, at the wrong client
            level, why = logging.ERROR, f"EngineReady of rank {first.dp_rank}, which this client does not manage"
        else:
            level, why = logging.WARNING, f"sent {type(first).__name__} instead of EngineReady"
    log.log(level, "dropped %s: %s", who, why)
    await link.aclose()
    return None


async def send_to_engine(engine: EngineLink, msg: m.Message, timeout_s: float = ENGINE_SEND_TIMEOUT_S) -> None:
    """Send ``msg`` within ``timeout_s``: ``EngineTimeoutError`` past it, ``EngineDeadError`` on a broken link.
    Encoding errors (``msgspec.EncodeError``, ``OverflowError``, ...) pass through: the caller maps them."""
    # A bare cancel scope, as fail_after builds inside its two context-manager layers: one per request, and those
    # layers were a third of what this function cost the API process (sampled CPU profile, zero-cost model).
    try:
        with anyio.CancelScope(deadline=anyio.current_time() + timeout_s) as scope:
            await engine.link.send(msg)
    except LINK_ERRORS as exc:
        raise EngineDeadError(f"engine rank {engine.dp_rank}: its link broke ({type(exc).__name__})") from exc
    if scope.cancelled_caught:  # only its deadline cancels this scope (an outer cancellation propagates)
        raise EngineTimeoutError(f"engine rank {engine.dp_rank} did not take {type(msg).__name__} within "
                                 f"{timeout_s:g} s (its link stayed full)")


@dataclass(slots=True)
class _PendingCall:
    method: str
    waiting: set[int]  # ranks that have not answered yet
    results: dict[int, m.UtilityResult] = field(default_factory=dict)
    error: Exception | None = None
    done: anyio.Event = field(default_factory=anyio.Event)


class UtilityCalls:
    """Utility calls in flight from one client, keyed by ``call_id``."""

    def __init__(self, client_index: int) -> None:
        self._client_index = client_index
        self._pending: dict[int, _PendingCall] = {}
        self._ids = itertools.count(1)

    async def call(self, engines: list[EngineLink], method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                   timeout_s: float) -> Any:
        """Run ``method`` on every live engine of ``engines``; the first one's value, or raise."""
        live = [e for e in engines if e.alive]
        if not live:
            raise UnavailableError("no data-parallel rank can serve requests")
        call_id = next(self._ids)
        pending = self._pending[call_id] = _PendingCall(method, {e.dp_rank for e in live})
        msg = m.UtilityCall(client_index=self._client_index, call_id=call_id, method=method, args=list(args),
                            kwargs=dict(kwargs))
        try:
            with anyio.fail_after(timeout_s):
                for e in live:
                    await send_to_engine(e, msg, timeout_s)
                await pending.done.wait()
        except TimeoutError:
            raise EngineTimeoutError(
                f"{method} did not complete on every rank within {timeout_s:g} s; no "
                f"answer from engine rank(s) {sorted(pending.waiting)}") from None
        finally:
            del self._pending[call_id]
        if pending.error is not None:
            raise pending.error
        failed = [r for r in pending.results.values() if not r.ok]
        if failed:
            # a pause/resume misuse (a resume that overtook this pause) is the caller's conflict, not ours: 409;
            # a prefix-cache reset refused (blocks in use) is the route's {"success": false}
            raise m.ERROR_KINDS.get(failed[0].error_kind or "", AsyncDPError)(f"{method} failed: {failed[0].error}")
        return pending.results[live[0].dp_rank].value

    def on_result(self, dp_rank: int, msg: m.UtilityResult) -> None:
        pending = self._pending.get(msg.call_id)
        if pending is None or dp_rank not in pending.waiting:
            return  # a late answer to a call that already ended
        pending.results[dp_rank] = msg
        pending.waiting.discard(dp_rank)
        if not pending.waiting:
            pending.done.set()

    def on_rank_dead(self, dp_rank: int, reason: str) -> None:
        """Fail at once every call still waiting on ``dp_rank`` (it died, or its link closed)."""
        for pending in self._pending.values():
            if dp_rank in pending.waiting and pending.error is None:
                pending.error = EngineDeadError(
                    f"engine rank {dp_rank} died during utility call {pending.method!r}: {reason}")
                pending.done.set()


class EngineLinks:
    """The client's accepted engine links by rank: the handshake, one reader per link, readiness, aborts.

    ``on_ready(engine)`` runs once a link's ``EngineReady`` is accepted, ``on_message(rank, msg)`` for every later
    frame but ``EngineDead``, ``on_dead(rank, reason)`` once when the link ends (``EngineDead``, EOF, error)."""

    def __init__(self, managed_ranks: tuple[int, ...], client_index: int, *,
                 on_ready: Callable[[EngineLink], None], on_message: Callable[[int, m.Message], None],
                 on_dead: Callable[[int, str], None], heartbeat_timeout_s: float = 5.0,
                 link_secret: bytes | None = None) -> None:
        self.managed_ranks = managed_ranks
        self.link_secret = link_secret  # every engine proves it holds the deployment secret (None: none)
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.client_index = client_index
        self.engines: dict[int, EngineLink] = {}
        self.last_ended: EngineLink | None = None
        self.all_ready = anyio.Event()
        self._on_ready = on_ready
        self._on_message = on_message
        self._on_dead = on_dead

    def starting_problem(self) -> str | None:
        """``/health``'s message until every managed rank was ready once (a remote one may take minutes: say
        how many are, not "no engine"), else None."""
        if self.all_ready.is_set():
            return None
        ready = len(set(self.managed_ranks) & set(self.engines))
        return f"The engines are still starting: {ready} of {len(self.managed_ranks)} managed ranks are ready."

    def alive(self, dp_rank: int) -> bool:
        e = self.engines.get(dp_rank)
        return e is not None and e.alive

    def any_alive(self) -> bool:
        return any(e.alive for e in self.engines.values())

    def none_alive(self) -> str:
        """Why no rank can serve (a 503's words): the last managed rank to end, and how."""
        if (last := self.last_ended) is None or last.alive:
            return "no data-parallel rank can serve requests"
        return f"no data-parallel rank can serve requests: the last, engine rank {last.dp_rank}, ended ({last.ended})"

    async def accept(self, listener: anyio.abc.SocketListener, tg: anyio.abc.TaskGroup) -> None:
        """Task: accept engine connections and serve each in ``tg`` (each proves the deployment secret first, in its
        own task: a stranger that stalls the exchange holds up nobody)."""
        from asyncdp.transport import accept_link
        from asyncdp.transport.link_auth import RefusalLog

        refusals = RefusalLog("engine")

        async def serve(stream: anyio.abc.SocketStream) -> None:
            link = await accept_link(stream, name="engine", secret=self.link_secret, refusals=refusals)
            if link is not None:
                await self.serve_link(link)

        async with listener:
            while True:
                tg.start_soon(serve, await listener.accept())

    async def wait_ready(self, timeout_s: float) -> None:
        with anyio.move_on_after(timeout_s) as scope:
            await self.all_ready.wait()
        if scope.cancelled_caught:
            missing = sorted(set(self.managed_ranks) - set(self.engines))
            raise StartupError(f"engine ranks {missing} did not send EngineReady within --engine-ready-timeout-s "
                               f"{timeout_s:g}")

    async def serve_link(self, link: Link) -> None:
        """Serve one engine link: first frame ``EngineReady``, then every frame until it ends."""
        first = await read_engine_ready(link, self.managed_ranks, self.client_index)
        if first is None:
            return
        rank = first.dp_rank
        old = self.engines.get(rank)
        if old is not None and old.alive:
            silent_s = anyio.current_time() - old.heard_s
            if silent_s < self.heartbeat_timeout_s / 2:  # it heartbeats: a stranger, or a stale address's engine
                log.warning("client %d: dropped a second link for engine rank %d from %s: the rank is alive on "
                            "its link (heard %.1f s ago)", self.client_index, rank, link.remote, silent_s)
                await link.aclose()
                return
            # a restarted node's rank while the lost one's link still lingers, silent
            old.ended = "a new engine took its place"
            self._on_dead(rank, old.ended)
        engine = self.engines[rank] = EngineLink(rank, link, first, last_seen=time.monotonic(),
                                                 heard_s=anyio.current_time())
        self._on_ready(engine)
        if set(self.managed_ranks) <= set(self.engines):
            self.all_ready.set()
        reason = "its link closed"
        liveness = Liveness(self.heartbeat_timeout_s, anyio.current_time())
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch, rank, liveness, tg.cancel_scope)
                frames = Frames(link, f"client {self.client_index}: engine rank {rank}")
                while (msg := await frames.next()) is not None:
                    heard = anyio.current_time()
                    liveness.heard(heard)
                    engine.last_seen, engine.heard_s = time.monotonic(), heard
                    if isinstance(msg, m.EngineDead):
                        reason = msg.reason
                        break
                    if not isinstance(msg, m.Heartbeat):
                        self._on_message(rank, msg)
                tg.cancel_scope.cancel()
            if tg.cancel_scope.cancelled_caught and liveness.expired(anyio.current_time()):
                reason = liveness.describe(f"engine rank {rank}", anyio.current_time())
        finally:
            if engine.alive:
                engine.ended, self.last_ended = reason, engine
                self._on_dead(rank, reason)
            await link.aclose()

    @staticmethod
    async def _watch(rank: int, liveness: Liveness, reader: anyio.CancelScope) -> None:
        """Cancel the link's reader once the rank has been silent past the heartbeat timeout (a rank frozen with
        its link open: its requests must not wait forever)."""
        while True:
            planned = liveness.deadline_s() + 1e-3
            await anyio.sleep_until(planned)
            now = anyio.current_time()
            # after a stall of this process the rank's heartbeats are still unread: the reader gets its turn first
            if liveness.expired(now) and not liveness.excuse_late_wake(planned, now):
                reader.cancel()
                return

    async def send_abort(self, dp_rank: int, ids: list[str]) -> None:
        """Best effort, bounded by ``ABORT_SEND_TIMEOUT_S``; nothing is sent to a dead rank."""
        engine = self.engines.get(dp_rank)
        if engine is None or not engine.alive:
            return
        with anyio.move_on_after(ABORT_SEND_TIMEOUT_S):
            try:
                await engine.link.send(m.AbortRequests(request_ids=ids))
            except LINK_ERRORS:
                pass
