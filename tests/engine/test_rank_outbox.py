"""A rank's client outboxes (``asyncdp.engine.rank_links``): a deque and a wake-up event since session 48, no longer
a memory object stream; what the stream did, they still do. Messages reach the client in order; ``flush`` sends
what was queued before the writer ends; a full outbox cuts the link once; what the busy loop posts after the
client's link broke goes nowhere, without a cut or a warning. In virtual time over in-memory links."""

from __future__ import annotations

import logging

import anyio
import pytest
import trio

from asyncdp import messages as m
from asyncdp.engine.rank_links import InboxItem, RankLinks, _ClientOutbox
from asyncdp.transport import memory_link_pair


class Owner:
    def on_teardown(self, reason: str, *, orderly: bool = False) -> None:
        raise AssertionError(f"no teardown expected: {reason}")

    def on_coordinator_lost(self, reason: str) -> None:
        raise AssertionError(f"no coordinator: {reason}")


def beat(seq: int) -> m.Heartbeat:
    return m.Heartbeat(sender="engine-0", seq=seq)


@pytest.mark.trio
async def test_posted_messages_reach_the_client_in_order_and_flush_sends_what_was_queued(autojump_clock):
    client, rank_end = memory_link_pair(name="client0")
    links = RankLinks(0, {0: rank_end}, None, outbox_size=64)
    send, receive = anyio.create_memory_object_stream[InboxItem](16)
    async with send, receive, client, rank_end, trio.open_nursery() as nursery:
        links.start(nursery, send, Owner(), heartbeat_interval_s=1000.0, heartbeat_timeout_s=5000.0)
        for call_id in range(10):
            links.post_nowait(0, m.UtilityResult(call_id=call_id, ok=True))
        with trio.fail_after(5):
            await links.flush()
            got = [await client.receive() for _ in range(10)]
        nursery.cancel_scope.cancel()
    assert [r.call_id for r in got if isinstance(r, m.UtilityResult)] == list(range(10))
    assert not links.is_cut(0)


@pytest.mark.trio
async def test_a_full_outbox_cuts_the_link_once_and_the_client_sees_its_end(autojump_clock, caplog):
    client, rank_end = memory_link_pair(name="client0")
    links = RankLinks(0, {0: rank_end}, None, outbox_size=4)
    send, receive = anyio.create_memory_object_stream[InboxItem](16)
    with caplog.at_level(logging.WARNING, logger="asyncdp.engine.rank_links"):
        async with send, receive, client, rank_end, trio.open_nursery() as nursery:
            links.start(nursery, send, Owner(), heartbeat_interval_s=1000.0, heartbeat_timeout_s=5000.0)
            for seq in range(20):  # without a scheduling point: the writer takes none of them meanwhile
                links.post_nowait(0, beat(seq))
            with trio.fail_after(5):
                seen = [msg async for msg in client]
            nursery.cancel_scope.cancel()
    assert links.is_cut(0)
    assert isinstance(seen[-1], m.EngineDead) and "outbox to client 0 is full" in seen[-1].reason
    assert sum("is full" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.trio
async def test_posts_after_the_client_link_broke_go_nowhere_without_a_cut(autojump_clock, caplog):
    client, rank_end = memory_link_pair(name="client0")
    links = RankLinks(0, {0: rank_end}, None, outbox_size=4)
    send, receive = anyio.create_memory_object_stream[InboxItem](16)
    with caplog.at_level(logging.WARNING, logger="asyncdp.engine.rank_links"):
        async with send, receive, rank_end, trio.open_nursery() as nursery:
            links.start(nursery, send, Owner(), heartbeat_interval_s=1000.0, heartbeat_timeout_s=5000.0)
            await client.aclose()  # the client's process ended
            links.post_nowait(0, beat(0))
            await trio.sleep(1)  # the writer's send fails: it ends
            for seq in range(1, 100):
                links.post_nowait(0, beat(seq))
            with trio.fail_after(5):
                await links.flush()
            nursery.cancel_scope.cancel()
    assert not links.is_cut(0)
    assert not [r for r in caplog.records if "is full" in r.getMessage()]


@pytest.mark.trio
async def test_a_queued_message_is_taken_without_a_scheduling_point():
    box = _ClientOutbox(0, 8)
    assert box.put_nowait(beat(1)) and box.put_nowait(beat(2))
    with trio.CancelScope() as scope:
        scope.cancel()  # a scheduling point would raise Cancelled here
        first, second = await box.get(), await box.get()
    assert (first, second) == (beat(1), beat(2))
    box.close()
    assert await box.get() is None
