"""A rank's coordinator link (spec §5.7): its loss reaches the owner once, whichever of EOF and silence the rank
sees first. In virtual time over in-memory links."""

from __future__ import annotations

import anyio
import pytest
import trio

from asyncdp import messages as m
from asyncdp.engine.rank_links import InboxItem, RankLinks
from asyncdp.transport import memory_link_pair


class Owner:
    def __init__(self) -> None:
        self.lost: list[str] = []

    def on_teardown(self, reason: str, *, orderly: bool = False) -> None:
        raise AssertionError(f"no teardown expected: {reason}")

    def on_coordinator_lost(self, reason: str) -> None:
        self.lost.append(reason)


@pytest.mark.trio
async def test_a_closed_coordinator_link_is_reported_once_and_not_again_as_silence(autojump_clock):
    coordinator, rank_end = memory_link_pair(name="coordinator")
    links = RankLinks(0, {}, rank_end)
    owner = Owner()
    send, receive = anyio.create_memory_object_stream[InboxItem](16)
    async with send, receive, rank_end, trio.open_nursery() as nursery:
        links.start(nursery, send, owner, heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0)
        await coordinator.send(m.Heartbeat(sender="coordinator", seq=1))
        await coordinator.aclose()  # the coordinator's process ended
        await trio.sleep(60)  # virtual time: many heartbeat timeouts
        nursery.cancel_scope.cancel()
    assert owner.lost == ["the coordinator closed its link"]


@pytest.mark.trio
async def test_a_silent_coordinator_is_reported_once(autojump_clock):
    coordinator, rank_end = memory_link_pair(name="coordinator")
    links = RankLinks(0, {}, rank_end)
    owner = Owner()
    send, receive = anyio.create_memory_object_stream[InboxItem](16)
    async with send, receive, rank_end, coordinator, trio.open_nursery() as nursery:
        links.start(nursery, send, owner, heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0)
        await trio.sleep(60)  # virtual time: the coordinator's host is gone, its link stays open
        nursery.cancel_scope.cancel()
    assert len(owner.lost) == 1 and owner.lost[0].startswith("no heartbeat from the coordinator"), owner.lost
