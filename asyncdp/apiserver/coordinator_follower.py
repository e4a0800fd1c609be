"""An API server's side of the DP coordinator link: subscribe, heartbeat, hand every snapshot on, reconnect.

Theory of operation
-------------------
:class:`CoordinatorFollower` is owned by the DP client (:class:`asyncdp.apiserver.client.DPClient`). ``attach(link)``
sends ``Subscribe{client_id}``, heartbeats every ``heartbeat_interval_s`` and passes each ``StatsSnapshot`` to
the client's callback until the link ends, or until the coordinator has been silent (no frame at all: it sends a
``Heartbeat`` every interval even when nothing changes) for ``heartbeat_timeout_s`` (``--dp-heartbeat-timeout-s``,
decided by :class:`asyncdp.dp.liveness.Liveness`): a link that stays open but silent is a dead coordinator (a
frozen process, a lost host), closed here and then treated as a lost link. ``follow(connect)`` wraps that for the client's life: after a lost
link (the coordinator dropped this client for missed heartbeats while its event loop was blocked, say) it
connects and subscribes again, with capped exponential backoff, until the client shuts down or the coordinator
has been unreachable for ``GIVE_UP_S``.

State (``/server_info`` ``coordinator.state``, ``asyncdp:dp_coordinator_up``): ``none`` (no coordinator in
this mode), ``starting``, ``alive`` while subscribed, ``reconnecting`` after a lost link until an attempt
answers, ``dead`` after a silent link, while attempts are refused (its process is gone) or after giving up. Whenever
the coordinator stops being ``alive`` the client's ``on_lost`` callback runs, and the client routes on its own
in-flight counts (the last snapshot is forgotten, not kept frozen). Time is ``anyio.current_time()`` (virtual in tests).

Prefix claims: ``direct(lb, ...)`` asks the coordinator's prefix directory (:mod:`asyncdp.dp.prefix_directory`)
where a prompt goes when the balancer's policy wants it asked (several API servers, a first block this one never
placed): one ``PrefixClaim`` on the link, the ``PrefixOwner`` with the same ``seq`` taken off the read loop. It
waits at most ``CLAIM_TIMEOUT_S``; without a subscribed link, on a lost link or after that time the request is
routed by the policy alone. Another API server's claim of a long new prefix arrives as ``PrefixPlaced`` and goes to
the ``on_placed`` callback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio

from asyncdp import messages as m
from asyncdp.dp.balance import LoadBalancer
from asyncdp.dp.liveness import Liveness
from asyncdp.errors import LinkAuthError
from asyncdp.transport import Link, connect_with_retry
from asyncdp.transport import connect as connect_link
from asyncdp.transport.heartbeat import send_heartbeats
from asyncdp.transport.links import LINK_ERRORS, Frames

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0  # each connection attempt; the first also retries for that long (startup)
BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 10.0
GIVE_UP_S = 600.0
SEND_TIMEOUT_S = 2.0  # FirstRequest is best effort: a lost link is this follower's to reconnect
CLAIM_TIMEOUT_S = 0.05  # a prefix claim's round trip (sub-millisecond on a live coordinator); then route alone



@dataclass(slots=True)
class _Waiter:
    """A prefix claim waiting for its ``PrefixOwner``."""

    done: anyio.Event = field(default_factory=anyio.Event)
    reply: m.PrefixOwner | None = None


class CoordinatorFollower:
    def __init__(self, client_index: int, heartbeat_interval_s: float,
                 on_snapshot: Callable[[m.StatsSnapshot], None], shutting_down: Callable[[], bool], *,
                 state: str = "starting", heartbeat_timeout_s: float = 5.0,
                 on_lost: Callable[[], None] = lambda: None,
                 on_placed: Callable[[m.PrefixPlaced], None] = lambda msg: None,
                 link_secret: bytes | None = None) -> None:
        self.client_index = client_index
        self._link_secret = link_secret  # the deployment secret the coordinator's listener asks for
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._on_snapshot = on_snapshot
        self._on_lost = on_lost
        self._on_placed = on_placed
        self._shutting_down = shutting_down
        self.state = state
        self.link: Link | None = None  # while subscribed
        self.snapshot_received_at: float | None = None
        self._claim_seq = 0
        self._claims: dict[int, _Waiter] = {}  # seq -> the claim waiting for its answer

    def snapshot_age_s(self) -> float | None:
        if self.snapshot_received_at is None:
            return None
        return anyio.current_time() - self.snapshot_received_at

    async def send_first_request(self, exclude_rank: int, wave: int) -> bool:
        """MoE: ask the coordinator to start ``wave`` (spec §6.5), best effort; False without a subscribed link."""
        link = self.link
        if link is None:
            return False
        with anyio.move_on_after(SEND_TIMEOUT_S):
            try:
                await link.send(m.FirstRequest(exclude_rank=exclude_rank, wave=wave))
            except LINK_ERRORS:
                pass  # the follow loop sees the lost link and reconnects
        return True

    async def claim(self, hashes: Sequence[int], proposal: int, prompt_tokens: int,
                    scope: tuple[int, int], candidates: Sequence[int] = (), *,
                    deep: bool = False) -> m.PrefixOwner | None:
        """Ask the coordinator's prefix directory where a new prefix goes (:mod:`asyncdp.dp.prefix_directory`).
        None without a subscribed link, when the link breaks, or after ``CLAIM_TIMEOUT_S``: the caller routes
        on its own then."""
        link = self.link
        if link is None:
            return None
        self._claim_seq += 1
        seq = self._claim_seq
        waiter = self._claims[seq] = _Waiter()
        try:
            with anyio.move_on_after(CLAIM_TIMEOUT_S):
                await link.send(m.PrefixClaim(seq=seq, hashes=list(hashes), proposal=proposal,
                                              prompt_tokens=prompt_tokens, first_rank=scope[0], last_rank=scope[1],
                                              candidates=list(candidates), deep=deep))
                await waiter.done.wait()
        except LINK_ERRORS:
            pass  # the follow loop sees the lost link and reconnects
        finally:
            del self._claims[seq]
        return waiter.reply

    async def direct(self, lb: LoadBalancer, request_id: str, prompt: Sequence[int], max_tokens: int,
                     now_us: int, routing_key: str | None = None, cache_salt: str | None = None) -> int | None:
        """The global rank the prefix directory sends this request to, when ``lb``'s policy claims its prompt
        (:meth:`LoadBalancer.claim`) and the coordinator answers in time; None to route on the policy."""
        if self.link is None:
            return None
        ask = lb.claim(request_id, prompt, max_tokens=max_tokens, now_us=now_us, routing_key=routing_key,
                       cache_salt=cache_salt)
        if ask is None:
            return None
        engines = lb.engines
        reply = await self.claim(ask.hashes, ask.proposal, len(prompt), (engines[0], engines[-1]), ask.candidates,
                                 deep=ask.deep)
        return None if reply is None else lb.on_prefix_owner(ask.hashes, reply.owner, reply.matched, reply.others)

    def _answered(self, msg: m.PrefixOwner) -> None:
        waiter = self._claims.get(msg.seq)
        if waiter is not None:  # else it timed out already
            waiter.reply = msg
            waiter.done.set()

    async def follow_addr(self, addr: str) -> None:
        """:meth:`follow` the coordinator listening at ``addr``."""
        attempts = 0

        async def connect() -> Link:
            nonlocal attempts
            attempts += 1
            if attempts == 1:  # at startup the coordinator may still be binding: retry for a while
                return await connect_with_retry(addr, timeout_s=CONNECT_TIMEOUT_S, what="the DP coordinator",
                                                secret=self._link_secret)
            return await connect_link(addr, secret=self._link_secret)

        await self.follow(connect)

    async def follow(self, connect: Callable[[], Awaitable[Link]]) -> None:
        """Attach over ``connect()``'s link, and again after every lost link, until shutdown or give-up."""
        backoff_s = BACKOFF_MIN_S
        unreachable_since: float | None = None
        while not self._shutting_down():
            try:
                with anyio.fail_after(CONNECT_TIMEOUT_S):
                    link = await connect()
            except (TimeoutError, OSError, anyio.BrokenResourceError, LinkAuthError) as exc:
                self.state = "dead"
                now = anyio.current_time()
                unreachable_since = now if unreachable_since is None else unreachable_since
                if now - unreachable_since >= GIVE_UP_S:
                    log.warning("client %d: cannot reach the DP coordinator (%s); routing on in-flight counts "
                                "only from now on", self.client_index, type(exc).__name__)
                    return
                await anyio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
                continue
            if self.state in ("reconnecting", "dead"):
                log.info("client %d: following the DP coordinator again", self.client_index)
            unreachable_since = None
            backoff_s = BACKOFF_MIN_S
            silent = await self.attach(link)
            if self._shutting_down():
                return
            self.state = "dead" if silent else "reconnecting"
            await anyio.sleep(backoff_s)

    async def attach(self, link: Link) -> bool:
        """Follow the coordinator over an already-connected link: subscribe, heartbeat, hand on every
        ``StatsSnapshot``; returns when the coordinator ends or drops this client (False) or has been silent for
        ``heartbeat_timeout_s`` (True; the link is closed here)."""
        self.link = link
        self.state = "alive"
        liveness = Liveness(self.heartbeat_timeout_s, anyio.current_time())
        frames = Frames(link, f"client {self.client_index}: the coordinator's link")
        silent = False
        try:
            async with link, anyio.create_task_group() as tg:
                await link.send(m.Subscribe(client_id=self.client_index))
                tg.start_soon(self._send_heartbeats, link)
                while True:
                    planned = liveness.deadline_s()
                    with anyio.move_on_at(planned) as silence:
                        if (msg := await frames.next()) is None:
                            break  # the coordinator ended or dropped this client
                        liveness.heard(anyio.current_time())
                        if isinstance(msg, m.StatsSnapshot):
                            self.snapshot_received_at = anyio.current_time()
                            self._on_snapshot(msg)
                        elif isinstance(msg, m.PrefixOwner):
                            self._answered(msg)
                        elif isinstance(msg, m.PrefixPlaced):
                            self._on_placed(msg)
                        continue
                    if silence.cancelled_caught:  # nothing heard before the liveness deadline
                        if liveness.excuse_late_wake(planned, anyio.current_time()):
                            continue  # this process was not running: read what came meanwhile first
                        silent = True
                        break
                tg.cancel_scope.cancel()
        except LINK_ERRORS:
            pass  # the Subscribe could not be sent: the link is already gone
        self.link = None
        self.state = "dead"
        for waiter in self._claims.values():  # claims on this link get no answer now: route alone
            waiter.done.set()
        self._on_lost()
        if not self._shutting_down():
            why = (liveness.describe("the DP coordinator", anyio.current_time()) if silent
                   else "lost the DP coordinator link")
            log.warning("client %d: %s; routing on in-flight counts only meanwhile", self.client_index, why)
        return silent

    async def _send_heartbeats(self, link: Link) -> None:
        async def beat(msg: m.Heartbeat) -> None:
            with anyio.move_on_after(self.heartbeat_timeout_s):  # a full link to a silent peer: skip a beat
                await link.send(msg)

        await send_heartbeats(beat, self.heartbeat_interval_s, f"client-{self.client_index}")
