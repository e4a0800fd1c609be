"""A frame a rank cannot decode on a link it opened (to an API server, to the coordinator) is logged once and
dropped (spec §5.1), and the link goes on; it used to raise out of the rank's task group, ending the engine with
a traceback. In virtual time over in-memory links carrying encoded frames."""

from __future__ import annotations

import logging

import anyio
import pytest
import trio

from asyncdp import messages as m
from asyncdp.engine.rank_links import ClientMessage, CoordinatorMessage, InboxItem, RankLinks
from asyncdp.transport.links import MemoryLink
from tests.engine.test_rank_links import Owner

BAD = (b"\xc1", b"\x81\xa4type\xa7Unknown")


def _raw_link(name: str) -> tuple[MemoryLink, anyio.abc.ObjectSendStream[bytes], anyio.abc.ObjectReceiveStream[bytes]]:
    """The rank's end of a link, and the peer's raw send and receive streams (bytes, so anything can be sent)."""
    to_rank, from_peer = anyio.create_memory_object_stream[bytes](64)
    to_peer, from_rank = anyio.create_memory_object_stream[bytes](64)
    return MemoryLink(to_peer, from_peer, name=name), to_rank, from_rank


@pytest.mark.trio
async def test_bad_frames_from_a_client_and_the_coordinator_are_dropped_and_both_links_go_on(autojump_clock, caplog):
    client_link, to_rank_c, from_rank_c = _raw_link("client 0")
    coord_link, to_rank_k, from_rank_k = _raw_link("coordinator")
    links = RankLinks(0, {0: client_link}, coord_link)
    owner = Owner()
    send, receive = anyio.create_memory_object_stream[InboxItem](64)
    abort = m.AbortRequests(request_ids=["r1"])
    wave = m.StartWave(wave=3, exclude_rank=None)
    async with send, receive, trio.open_nursery() as nursery:
        links.start(nursery, send, owner, heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0)
        for frame in (*BAD, m.encode(abort)):
            await to_rank_c.send(frame)
        for frame in (*BAD, m.encode(wave)):
            await to_rank_k.send(frame)
        got = [await receive.receive() for _ in range(2)]
        for seq in range(1, 11):  # the coordinator's heartbeats go on: it is not lost
            await trio.sleep(1)
            await to_rank_k.send(m.encode(m.Heartbeat(sender="coordinator", seq=seq)))
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        nursery.cancel_scope.cancel()
    links.close()
    for stream in (to_rank_c, from_rank_c, to_rank_k, from_rank_k, client_link, coord_link):
        await stream.aclose()
    assert ClientMessage(0, abort) in got and CoordinatorMessage(wave) in got
    assert owner.lost == []
    assert len(warnings) == 2, warnings  # one per link
    assert any("client 0" in w for w in warnings) and any("coordinator" in w for w in warnings)
