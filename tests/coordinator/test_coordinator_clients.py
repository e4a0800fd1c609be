"""The DP coordinator's client links, in trio's virtual time: a silent client is dropped, a client that stops
reading is cut off once its outbox is full, a dropped DP client subscribes again; and an unknown inbox item is
a ProtocolError."""

from __future__ import annotations

import logging

import anyio
import pytest
import trio

from asyncdp.coordinator.core import CoordinatorConfig, serve_coordinator
from asyncdp.errors import ProtocolError
from asyncdp.messages import Subscribe
from tests.coordinator.harness import DENSE2, FakePeer, coordinator


@pytest.mark.trio
async def test_silent_client_is_dropped_but_coordinator_continues(autojump_clock):
    async with coordinator(DENSE2) as h:
        await h.engines(2)
        quiet = await h.client(0)
        quiet.stop_heartbeats()
        await trio.sleep(7)
        assert quiet.eof_at is not None
        other = await h.client(1)
        assert not h.done.is_set() and other.eof_at is None


@pytest.mark.trio
async def test_a_client_that_stops_reading_is_cut_off_when_its_outbox_is_full_and_others_are_served(
        autojump_clock, caplog):
    """No silent loss: the coordinator never skips a message for a peer that does not read; once that peer's
    outbox is full it closes the peer's link (the peer sees EOF and subscribes again) and serves on."""
    caplog.set_level(logging.INFO, logger="asyncdp.coordinator.core")
    config = CoordinatorConfig(dp_size=2, wave_mode=False, outbox_size=2)
    async with coordinator(config) as h:
        await h.engines(2)
        other = await h.client(0)
        stuck_link = h.client_listener.connect(max_buffer=1)
        stuck = FakePeer(stuck_link, h.nursery, "client-1", reading=False)
        await stuck.send(Subscribe(client_id=1))
        # Heartbeats every 1 s: one fills the link's buffer, one blocks the writer, two fill the outbox; the
        # next one finds it full (long before a send could time out, after heartbeat_timeout_s).
        await trio.sleep(config.heartbeat_timeout_s + 1)
        with trio.fail_after(0.1):  # cut: what was queued, then EOF (a live link would go on forever)
            with pytest.raises((anyio.EndOfStream, anyio.ClosedResourceError)):
                while True:
                    await stuck_link.receive()
        beats_before = len(other.beats)
        await trio.sleep(3)
        assert len(other.beats) >= beats_before + 2 and other.eof_at is None and not h.done.is_set()
    assert any("client 1 is not reading (outbox full" in r.getMessage() for r in caplog.records)


@pytest.mark.trio
async def test_an_unknown_inbox_item_is_a_protocol_error(autojump_clock):
    from asyncdp.coordinator.core import Coordinator

    coord = Coordinator(DENSE2)
    async with coord._inbox_send, coord._inbox_recv:
        with pytest.raises(ProtocolError, match="unknown inbox item"):
            await coord._handle(("lost", 0, "positional", False))


# ---------------------------------------------------------------- a dropped client follows it again (issue #12)


@pytest.mark.trio
async def test_a_client_the_coordinator_dropped_for_silence_subscribes_again_and_gets_snapshots(autojump_clock):
    """A client whose heartbeats stopped (its event loop was blocked) is dropped by the real coordinator; the
    DP client connects and subscribes again instead of staying "coordinator dead" for good."""
    from asyncdp.apiserver.client import ClientConfig, DPClient
    from asyncdp.testing.links import MemoryLinkListener

    config = CoordinatorConfig(dp_size=2, wave_mode=False, heartbeat_interval_s=1.0, heartbeat_timeout_s=5.0,
                               subscribe_timeout_s=None)
    engines, clients = MemoryLinkListener(name="engines"), MemoryLinkListener(name="clients")
    # A heartbeat interval past the coordinator's timeout stands in for a blocked event loop.
    client = DPClient(ClientConfig(client_index=0, client_count=1, managed_ranks=(0, 1), dp_size=2,
                                   model_name="m", max_model_len=64, heartbeat_interval_s=30.0), tokenizer=None)
    connects = 0

    async def connect():
        nonlocal connects
        connects += 1
        return clients.connect()

    try:
        await _follow_a_silent_client(config, engines, clients, client, connect, lambda: connects)
    finally:
        engines.close()
        clients.close()


async def _follow_a_silent_client(config, engines, clients, client, connect, connects) -> None:
    async with anyio.create_task_group() as tg:
        await tg.start(serve_coordinator, config, engines, clients)
        t0 = trio.current_time()
        tg.start_soon(client.follow_coordinator, connect)
        await trio.sleep(1.0)
        assert client.coordinator_state == "alive" and client.snapshot_age_s() is not None
        await trio.sleep(5.5)  # dropped after 5 s of silence, then followed again after the backoff
        assert connects() == 2
        assert client.coordinator_state == "alive"
        assert client.coordinator.snapshot_received_at >= t0 + 5.5  # the new subscription's snapshot
        client.begin_shutdown()
        tg.cancel_scope.cancel()
