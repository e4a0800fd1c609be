"""A second ``EngineReady`` for a rank whose link is alive and was heard from a moment ago (a stranger on the
client listener, or an engine of another launch at a stale address) is dropped with one line; the rank stays
with its link. It used to take the rank's place at once, marking the real engine dead in the balancer for good.
A restarted node's engine still takes the place of a lost one whose link lingers silent (spec §13)."""

from __future__ import annotations

import logging

import anyio
import pytest

from asyncdp import messages as m
from asyncdp.apiserver.client import DPClient
from asyncdp.transport import memory_link_pair
from tests.apiserver.client_links import _config, _ready


@pytest.mark.trio
async def test_an_engine_ready_for_a_rank_heard_a_moment_ago_is_dropped(autojump_clock, caplog):
    client = DPClient(_config(managed_ranks=(0, 1), dp_size=2), tokenizer=None)
    real = [memory_link_pair() for _ in range(2)]
    stranger_client, stranger = memory_link_pair()
    async with anyio.create_task_group() as tg:
        for rank, (client_end, engine_end) in enumerate(real):
            tg.start_soon(client.attach_engine, client_end)
            await engine_end.send(_ready(rank))
        await client.wait_engines_ready()
        await anyio.sleep(2)
        await real[1][1].send(m.Heartbeat(sender="engine-1", seq=1))  # rank 1 is alive: heard just now
        tg.start_soon(client.attach_engine, stranger_client)
        await stranger.send(_ready(1))
        with anyio.fail_after(1), pytest.raises(anyio.EndOfStream):  # the client closes the stranger's link
            await stranger.receive()
        assert client.engine_states()[1][0] is True and client.lb.dead_ranks == []
        lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
        tg.cancel_scope.cancel()
    for link in (stranger, stranger_client, *(end for pair in real for end in pair)):
        await link.aclose()
    assert len(lines) == 1 and "alive on its link" in lines[0].getMessage()
