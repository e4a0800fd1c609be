"""The MoE group's teardown as the coordinator performs it (spec §8.7, §13): ``Teardown`` to every other engine.

A rank lost, or one that said ``Goodbye``: every other engine gets ``Teardown{reason, dead_rank, orderly}``, its
outbox is closed after it, and the coordinator waits up to ``teardown_flush_s`` for the frames to leave. A
``Goodbye`` is orderly for the others only when this deployment is stopping too: the whole group may be being
stopped, with this node's own signal a moment behind, so it waits up to ``peer_stop_grace_s`` for that first.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import anyio

from asyncdp.coordinator.config import CoordinatorConfig
from asyncdp.coordinator.peers import Peer
from asyncdp.dp import wave as W
from asyncdp.messages import Teardown

log = logging.getLogger("asyncdp.coordinator.core")  # the role's one log name (tests and operators read it)


async def tear_down(action: W.Teardown, engines: Mapping[int, Peer], stopping: anyio.Event,
                    config: CoordinatorConfig) -> None:
    """Send ``Teardown`` to every engine but ``action.dead_rank`` and flush it (module docstring)."""
    if action.orderly and not stopping.is_set():
        with anyio.move_on_after(config.peer_stop_grace_s):
            await stopping.wait()
    orderly = action.orderly and stopping.is_set()
    if action.orderly and not orderly:
        log.error("tearing down the DP group: %s, and this deployment was not asked to stop within %g s",
                  action.reason, config.peer_stop_grace_s)
    else:
        log.log(logging.INFO if orderly else logging.ERROR, "tearing down the DP group: %s", action.reason)
    msg = Teardown(reason=action.reason, dead_rank=action.dead_rank, orderly=orderly)
    others = [p for r, p in engines.items() if r != action.dead_rank]
    for peer in others:
        peer.send_nowait(msg)
        peer.close_outbox()
    with anyio.move_on_after(config.teardown_flush_s):
        for peer in others:
            await peer.flushed.wait()
