"""The coordinator's test harness: in-memory links and listeners, fake engines and clients that heartbeat and
queue what they receive, and ``coordinator()``, which serves the real coordinator over them in trio's virtual
time."""

from __future__ import annotations

from contextlib import asynccontextmanager

import anyio
import trio

from asyncdp.coordinator.core import CoordinatorConfig, serve_coordinator
from asyncdp.errors import AsyncDPError
from asyncdp.messages import CoordinatorReady, Heartbeat, StatsSnapshot, Subscribe

# ---------------------------------------------------------------- in-memory transport fakes


class MemoryLink:
    """One end of a duplex in-memory link carrying message objects (the Link interface of asyncdp.transport)."""

    def __init__(self, send, recv) -> None:
        self._send, self._recv = send, recv

    async def send(self, msg) -> None:
        await self._send.send(msg)

    async def receive(self):
        return await self._recv.receive()

    async def aclose(self) -> None:
        self.close_nowait()

    def close_nowait(self) -> None:
        self._send.close()
        self._recv.close()


def link_pair(max_buffer: int = 1000) -> tuple[MemoryLink, MemoryLink]:
    a_send, b_recv = anyio.create_memory_object_stream(max_buffer)
    b_send, a_recv = anyio.create_memory_object_stream(max_buffer)
    return MemoryLink(a_send, a_recv), MemoryLink(b_send, b_recv)


class MemoryListener:
    def __init__(self) -> None:
        self._send, self._recv = anyio.create_memory_object_stream(100)
        self.links: list[MemoryLink] = []

    def connect(self, max_buffer: int = 1000) -> MemoryLink:
        ours, theirs = link_pair(max_buffer)
        self._send.send_nowait(theirs)
        self.links += [ours, theirs]
        return ours

    def close(self) -> None:
        self._send.close()
        self._recv.close()
        for link in self.links:  # links nobody accepted or closed: no unclosed-stream warnings
            link.close_nowait()

    async def serve(self, handler) -> None:
        async with anyio.create_task_group() as tg:
            async for link in self._recv:
                tg.start_soon(handler, link)


class FakePeer:
    """An engine or client: heartbeats every second, queues every non-heartbeat frame with its arrival time."""

    def __init__(self, link: MemoryLink, nursery: trio.Nursery, name: str, *, reading: bool = True) -> None:
        self.link = link
        self.name = name
        self.beats: list[float] = []
        self.eof_at: float | None = None
        self._q_send, self._q_recv = trio.open_memory_channel(10_000)
        self._hb_scope = trio.CancelScope()
        if reading:  # a peer that never reads still heartbeats: it is alive, only stuck
            nursery.start_soon(self._read)
        nursery.start_soon(self._heartbeat)

    async def _read(self) -> None:
        try:
            while True:
                msg = await self.link.receive()
                if isinstance(msg, Heartbeat):
                    self.beats.append(trio.current_time())
                else:
                    self._q_send.send_nowait((trio.current_time(), msg))
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self.eof_at = trio.current_time()

    async def _heartbeat(self) -> None:
        with self._hb_scope:
            seq = 0
            while True:
                await trio.sleep(1.0)
                seq += 1
                try:
                    await self.link.send(Heartbeat(sender=self.name, seq=seq))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return

    def stop_heartbeats(self) -> None:
        self._hb_scope.cancel()

    async def send(self, msg) -> None:
        await self.link.send(msg)

    async def expect(self, cls, within_s: float = 10.0):
        """The next queued message of type ``cls`` (others are skipped), as (arrival time, message)."""
        with trio.fail_after(within_s):
            while True:
                t, msg = await self._q_recv.receive()
                if isinstance(msg, cls):
                    return t, msg

    def drain(self) -> list[tuple[float, object]]:
        out = []
        while True:
            try:
                out.append(self._q_recv.receive_nowait())
            except trio.WouldBlock:
                return out

    async def close(self) -> None:
        self.stop_heartbeats()
        await self.link.aclose()


class Harness:
    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.engine_listener = MemoryListener()
        self.client_listener = MemoryListener()
        self.error: BaseException | None = None
        self.done = trio.Event()
        self.ended_at: float | None = None

    async def engine(self, rank: int) -> FakePeer:
        peer = FakePeer(self.engine_listener.connect(), self.nursery, f"engine-{rank}")
        await peer.send(Subscribe(dp_rank=rank))
        return peer

    async def engines(self, n: int) -> list[FakePeer]:
        peers = [await self.engine(r) for r in range(n)]
        for p in peers:
            await p.expect(CoordinatorReady)
        return peers

    async def client(self, index: int = 0) -> FakePeer:
        peer = FakePeer(self.client_listener.connect(), self.nursery, f"client-{index}")
        await peer.send(Subscribe(client_id=index))
        await peer.expect(StatsSnapshot)  # the welcome snapshot
        return peer


@asynccontextmanager
async def coordinator(config: CoordinatorConfig, *, stopping: trio.Event | None = None):
    async with trio.open_nursery() as nursery:
        h = Harness(nursery)

        async def main() -> None:
            try:
                await serve_coordinator(config, h.engine_listener, h.client_listener, stopping=stopping)
            except AsyncDPError as exc:
                h.error = exc
            h.ended_at = trio.current_time()
            h.done.set()

        nursery.start_soon(main)
        try:
            yield h
        finally:
            nursery.cancel_scope.cancel()
            h.engine_listener.close()
            h.client_listener.close()


MOE2 = CoordinatorConfig(dp_size=2, wave_mode=True)


DENSE2 = CoordinatorConfig(dp_size=2, wave_mode=False)
