"""The one heartbeat sender: every role that must look alive to a peer runs :func:`send_heartbeats` in a task;
:func:`keep_link` is both halves for a link that exists only to say "alive" (the node links of spec §5.7).

The receiving side is :class:`asyncdp.dp.liveness.Liveness` (any frame counts, not only heartbeats); this side
only has to make sure a frame goes out at least every ``interval_s``. ``send`` is the role's own way to deliver
one message (a link's ``send``, or a non-blocking enqueue into per-peer outboxes); it may raise the link errors
of :data:`LINK_ERRORS`, which end nothing here: the peer's reader sees the EOF and decides.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from asyncdp.dp.liveness import Liveness
from asyncdp.messages import Heartbeat, Message
from asyncdp.transport.links import LINK_ERRORS, Frames, Link


async def send_heartbeats(send: Callable[[Heartbeat], Awaitable[None] | None], interval_s: float,
                          sender: str) -> None:
    """Forever: sleep ``interval_s``, then ``send(Heartbeat(sender, seq))`` with ``seq`` counting from 1.

    ``send`` may be sync (an enqueue) or async (a link send); link errors are ignored (the reader notices).
    Cancel the enclosing scope to stop it.
    """
    seq = 0
    while True:
        await anyio.sleep(interval_s)
        seq += 1
        try:
            pending = send(Heartbeat(sender=sender, seq=seq))
            if pending is not None:
                await pending
        except LINK_ERRORS:
            pass


async def keep_link(link: Link, on_message: Callable[[Message], bool | None], *, interval_s: float,
                    timeout_s: float, sender: str) -> str:
    """Keep a liveness link (spec §5.7): heartbeat on it every ``interval_s`` and read it until it ends.

    Every frame counts as a sign of life (:class:`~asyncdp.dp.liveness.Liveness`); ``on_message(msg)`` gets each
    frame that is not a heartbeat and may return True to stop following. Returns why it ended: ``"closed"`` (EOF
    or a broken link: the peer's process ended), ``"silent"`` (nothing heard for ``timeout_s``: host or network
    lost) or ``"done"`` (``on_message`` said so). The link stays open; the caller closes it. A frame this build
    cannot decode is logged (the first at WARNING) and dropped.
    """
    liveness = Liveness(timeout_s, anyio.current_time())
    frames = Frames(link, f"the node link with {link.remote}")

    async def beat(msg: Heartbeat) -> None:
        with anyio.move_on_after(timeout_s):  # a full link to a silent peer: skip a beat
            await link.send(msg)

    async with anyio.create_task_group() as tg:
        tg.start_soon(send_heartbeats, beat, interval_s, sender)
        try:
            while True:
                planned = liveness.deadline_s()
                with anyio.move_on_at(planned):
                    msg = await frames.next()
                    if msg is None:
                        return "closed"
                    liveness.heard(anyio.current_time())
                    if not isinstance(msg, Heartbeat) and on_message(msg):
                        return "done"
                    continue
                if liveness.excuse_late_wake(planned, anyio.current_time()):
                    continue  # this process was not running: read what the peer sent meanwhile first
                return "silent"
        finally:
            tg.cancel_scope.cancel()
    return "closed"  # not reached: the loop returns (mypy cannot tell that a task group re-raises)
