"""A frame the API server cannot decode on its link to the coordinator is logged once and dropped (spec §5.1), and
the link goes on: the next snapshot is applied. It used to raise out of the client's task group, ending the API
server with a traceback. Virtual time, a hand-driven coordinator sending encoded frames."""

from __future__ import annotations

import logging

import anyio
import pytest

from asyncdp import messages as m
from asyncdp.apiserver.client import DPClient
from asyncdp.transport.links import MemoryLink
from tests.apiserver.client_links import _config


@pytest.mark.trio
async def test_bad_frames_from_the_coordinator_are_dropped_and_the_next_snapshot_applied(autojump_clock, caplog):
    client = DPClient(_config(managed_ranks=(0, 1), dp_size=2), tokenizer=None)
    to_client, from_coordinator = anyio.create_memory_object_stream[bytes](16)
    to_coordinator, from_client = anyio.create_memory_object_stream[bytes](16)
    link = MemoryLink(to_coordinator, from_coordinator, name="coordinator")
    snapshot = m.StatsSnapshot(counts=[[3, 1, 0], [0, 0, 0]], wave=0, running=False, seq=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.attach_coordinator, link)
        assert isinstance(m.decode(await from_client.receive()), m.Subscribe)
        for frame in (b"\xc1", b"\x81\xa4type\xa7Unknown", m.encode(snapshot)):
            await to_client.send(frame)
        await anyio.sleep(1)
        assert client.server_info()["coordinator"]["state"] == "alive"
        assert client.snapshot_age_s() == pytest.approx(1.0, abs=0.01)
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        tg.cancel_scope.cancel()
    for stream in (to_client, from_client, link):
        await stream.aclose()
    assert len(warnings) == 1 and "the coordinator's link" in warnings[0]
