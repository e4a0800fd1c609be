"""The one heartbeat sender: a frame every interval, numbered from 1, sync or async sends, link errors ignored.
Virtual time (trio ``MockClock(autojump_threshold=0)``)."""

from __future__ import annotations

import anyio
import pytest
import trio

from asyncdp.messages import Heartbeat
from asyncdp.transport.heartbeat import send_heartbeats


@pytest.mark.trio
async def test_heartbeats_go_out_every_interval_numbered_from_one_through_a_sync_send(autojump_clock):
    sent: list[tuple[float, Heartbeat]] = []
    with trio.move_on_after(3.5):
        await send_heartbeats(lambda beat: sent.append((trio.current_time(), beat)), 1.0, "coordinator")
    assert [t for t, _ in sent] == [1.0, 2.0, 3.0]
    assert [(b.sender, b.seq) for _, b in sent] == [("coordinator", 1), ("coordinator", 2), ("coordinator", 3)]


@pytest.mark.trio
async def test_a_broken_link_does_not_stop_the_heartbeats(autojump_clock):
    attempts: list[int] = []

    async def send(beat: Heartbeat) -> None:
        attempts.append(beat.seq)
        raise anyio.BrokenResourceError

    with trio.move_on_after(2.5):
        await send_heartbeats(send, 1.0, "engine-0")
    assert attempts == [1, 2]
