"""A bad frame on an engine link after its ``EngineReady`` (a broken engine, or a stranger on the client listener,
which multi-node deployments bind on TCP): the frame is logged and dropped (spec §5.1), once per link, and the
link, its rank and the API server go on; it used to raise out of the client's task group and take the API server
(and with it an in-process launcher) down with a traceback."""

from __future__ import annotations

import logging

import anyio
import pytest

from asyncdp import messages as m
from asyncdp.apiserver.client import DPClient
from asyncdp.transport.links import MemoryLink
from tests.apiserver.client_links import _config, _ready

UNDECODABLE = b"\xc1"
UNKNOWN_TYPE = b"\x81\xa4type\xa7Unknown"
WRONG_FIELDS = b"\x82\xa4type\xa9Heartbeat\xa6sender\x07"


@pytest.mark.trio
async def test_bad_frames_after_engine_ready_are_dropped_and_the_rank_serves_on(autojump_clock, caplog):
    client = DPClient(_config(), tokenizer=None)
    to_client, from_engine = anyio.create_memory_object_stream[bytes](16)
    to_engine, from_client = anyio.create_memory_object_stream[bytes](16)
    link = MemoryLink(to_engine, from_engine, name="engine")
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.attach_engine, link)
        await to_client.send(m.encode(_ready()))
        with anyio.fail_after(5):
            await client.wait_engines_ready()
        for frame in (UNDECODABLE, UNKNOWN_TYPE, WRONG_FIELDS):
            await to_client.send(frame)
        await to_client.send(m.encode(m.Heartbeat(sender="engine", seq=1)))
        await anyio.sleep(1)
        assert client.is_healthy() and client._links.alive(0)
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        tg.cancel_scope.cancel()
    for stream in (to_client, from_client):
        await stream.aclose()
    assert len(warnings) == 1 and "engine rank 0" in warnings[0].getMessage()
    assert "bad frame" in warnings[0].getMessage()
