"""The one heartbeat sender: every role that must look alive to a peer runs :func:`send_heartbeats` in a task.

The receiving side is :class:`asyncdp.dp.liveness.Liveness` (any frame counts, not only heartbeats); this side
only has to make sure a frame goes out at least every ``interval_s``. ``send`` is the role's own way to deliver
one message (a link's ``send``, or a non-blocking enqueue into per-peer outboxes); it may raise the link errors
of :data:`LINK_ERRORS`, which end nothing here: the peer's reader sees the EOF and decides.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from asyncdp.messages import Heartbeat
from asyncdp.transport.links import LINK_ERRORS


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
