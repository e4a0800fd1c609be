"""The DP client's link to the coordinator, hand-driven in virtual time: followed again after the coordinator
dropped the client, dead while it refuses reconnection, and dead past the heartbeat timeout, when the client
routes on its own in-flight counts."""



import anyio
import pytest

from asyncdp import messages as m
from asyncdp.api.metrics import Metrics
from asyncdp.apiserver.client import DPClient
from asyncdp.transport import memory_link_pair
from asyncdp.transport.links import MemoryLink
from tests.apiserver.client_links import _config, _sample


@pytest.mark.trio
async def test_the_coordinator_is_followed_again_after_it_dropped_the_client(autojump_clock, monkeypatch):
    """A client the coordinator dropped (missed heartbeats while its event loop was blocked) reconnects and
    subscribes again; meanwhile the snapshot age grows at scrape time and the state says ``reconnecting``."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics(model_name="m", multiproc_dir=None)
    # A heartbeat timeout past the 23 s of silence below: this test is about a dropped link, not a silent one.
    client = DPClient(_config(managed_ranks=(0, 1), dp_size=2, heartbeat_timeout_s=60.0), tokenizer=None,
                      metrics=metrics)
    coordinator_ends: list[MemoryLink] = []
    connected = anyio.Event()

    async def connect() -> MemoryLink:
        nonlocal connected
        ours, theirs = memory_link_pair()
        coordinator_ends.append(theirs)
        connected.set()
        return ours

    snapshot = m.StatsSnapshot(counts=[[0, 0, 0], [0, 0, 0]], wave=0, running=False, seq=1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.follow_coordinator, connect)
        await connected.wait()
        assert isinstance(await coordinator_ends[0].receive(), m.Subscribe)
        await coordinator_ends[0].send(snapshot)
        await anyio.sleep(23)
        info = client.server_info()["coordinator"]
        assert info["state"] == "alive"
        assert info["snapshot_age_s"] == pytest.approx(23, abs=0.01)
        assert _sample(metrics, "asyncdp:dp_coordinator_snapshot_age_seconds") == pytest.approx(23, abs=0.01)
        connected = anyio.Event()
        await coordinator_ends[0].aclose()  # the coordinator drops this client
        await anyio.sleep(0.1)
        assert client.server_info()["coordinator"]["state"] == "reconnecting"
        assert _sample(metrics, "asyncdp:dp_coordinator_up") == 0
        assert _sample(metrics, "asyncdp:dp_coordinator_snapshot_age_seconds") == pytest.approx(23.1, abs=0.01)
        await connected.wait()
        sub = await coordinator_ends[1].receive()
        assert isinstance(sub, m.Subscribe) and sub.client_id == 0
        await coordinator_ends[1].send(snapshot)
        await anyio.sleep(0.1)
        assert client.server_info()["coordinator"]["state"] == "alive"
        assert _sample(metrics, "asyncdp:dp_coordinator_up") == 1
        assert _sample(metrics, "asyncdp:dp_coordinator_snapshot_age_seconds") == pytest.approx(0.1, abs=0.01)
        client.begin_shutdown()
        tg.cancel_scope.cancel()
    for end in coordinator_ends:
        await end.aclose()


@pytest.mark.trio
async def test_a_coordinator_that_refuses_reconnection_is_dead_until_it_answers_again(autojump_clock):
    # The fake coordinator never sends a frame: a heartbeat timeout past this test's 20 s keeps it "alive".
    client = DPClient(_config(managed_ranks=(0, 1), dp_size=2, heartbeat_timeout_s=60.0), tokenizer=None)
    coordinator_ends: list[MemoryLink] = []
    refuse = True
    attempts = 0

    async def connect() -> MemoryLink:
        nonlocal attempts
        attempts += 1
        if attempts > 1 and refuse:
            raise ConnectionRefusedError("nobody listens")  # the coordinator process is gone
        ours, theirs = memory_link_pair()
        coordinator_ends.append(theirs)
        return ours

    async with anyio.create_task_group() as tg:
        tg.start_soon(client.follow_coordinator, connect)
        await anyio.sleep(0.1)
        assert client.coordinator_state == "alive"
        await coordinator_ends[0].aclose()
        await anyio.sleep(5)
        assert client.coordinator_state == "dead"
        refuse = False
        await anyio.sleep(15)  # the next attempt, after the capped backoff
        assert client.coordinator_state == "alive" and len(coordinator_ends) == 2
        client.begin_shutdown()
        tg.cancel_scope.cancel()
    for end in coordinator_ends:
        await end.aclose()


@pytest.mark.trio
async def test_a_coordinator_silent_past_the_heartbeat_timeout_is_dead_and_the_client_routes_on_inflight(
        autojump_clock, monkeypatch):
    """The link stays open but nothing arrives (a frozen coordinator process, a lost host): after
    ``heartbeat_timeout_s`` the coordinator is dead in ``/server_info`` and ``/metrics``, its last loads are not
    kept frozen, and the client connects and subscribes again."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics(model_name="m", multiproc_dir=None)
    client = DPClient(_config(managed_ranks=(0, 1), dp_size=2, heartbeat_timeout_s=5.0), tokenizer=None,
                      metrics=metrics)
    coordinator_ends: list[MemoryLink] = []
    reconnected = anyio.Event()

    async def connect() -> MemoryLink:
        ours, theirs = memory_link_pair()
        coordinator_ends.append(theirs)
        if len(coordinator_ends) == 2:
            reconnected.set()
        return ours

    async with anyio.create_task_group() as tg:
        tg.start_soon(client.follow_coordinator, connect)
        await anyio.sleep(0.1)
        assert isinstance(await coordinator_ends[0].receive(), m.Subscribe)
        # Rank 0 is loaded: while this snapshot is believed, every request goes to rank 1.
        await coordinator_ends[0].send(m.StatsSnapshot(counts=[[40, 0, 0], [0, 0, 0]], wave=0, running=False, seq=1))
        await anyio.sleep(4.8)  # silent, but not for the timeout yet
        assert client.server_info()["coordinator"]["state"] == "alive"
        assert _sample(metrics, "asyncdp:dp_coordinator_up") == 1
        await anyio.sleep(0.3)  # 5.1 s of silence: dead (the reconnection waits for its backoff)
        assert client.server_info()["coordinator"]["state"] == "dead"
        assert _sample(metrics, "asyncdp:dp_coordinator_up") == 0
        picks = {client.lb.select(f"r{i}") for i in range(3)}
        assert picks == {0, 1}  # on in-flight counts: rank 0's stale 40 waiting no longer counts
        with anyio.fail_after(5):
            await reconnected.wait()
        assert isinstance(await coordinator_ends[1].receive(), m.Subscribe)
        client.begin_shutdown()
        tg.cancel_scope.cancel()
    for end in coordinator_ends:
        await end.aclose()
