"""A handshake address that names something else: the side that connected names the address and the flags to
check in one line (no traceback, no frame length), and the head's listener drops a connection that does not speak
asyncdp instead of failing its startup, while another asyncdp protocol version is refused by name (E5)."""

from __future__ import annotations

import functools
import shlex
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import anyio.abc
import msgspec
import pytest

from asyncdp import messages as m
from asyncdp.cli import build_serve_config
from asyncdp.config.flags import EngineConfig
from asyncdp.config.roles import LaunchPlan
from asyncdp.errors import StartupError
from asyncdp.launcher.handshake import handshake
from asyncdp.launcher.headless import join_head
from asyncdp.launcher.node import RunningNode
from asyncdp.transport import listen, serve_links

HTTP_400 = b"HTTP/1.1 400 \r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


@dataclass(frozen=True)
class Facts:
    is_moe: bool = False
    num_experts: int = 0


def node_for(cmd: str, tmp_path, sock: socket.socket | None = None) -> RunningNode:
    config = build_serve_config(shlex.split(cmd), env={}, model_facts=lambda _name: Facts())
    plan = LaunchPlan(engine=EngineConfig(executor="sim"), served_model_name="m", model_path=str(tmp_path),
                      deployment=config.deployment)
    return RunningNode(plan, sock, str(tmp_path))


@asynccontextmanager
async def answering(answer: bytes) -> AsyncIterator[int]:
    """A TCP peer on 127.0.0.1, port 0, that reads a little and answers ``answer`` (as an HTTP server answers a
    request it cannot parse). Yields its port."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def peer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()
            await stream.send(answer)
            await anyio.sleep_forever()

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, peer)
        yield listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_headless_node_whose_rpc_port_is_an_http_port_fails_naming_the_address_and_the_flags(tmp_path):
    async with answering(HTTP_400) as port:
        node = node_for(f"-dp 2 -dpl 1 -dpr 1 --headless -dpa 127.0.0.1 -dpp {port}", tmp_path)
        with anyio.fail_after(10), pytest.raises(StartupError) as raised:
            await join_head(node, {})
    text = str(raised.value)
    assert f"the peer at tcp:127.0.0.1:{port} is not an asyncdp handshake listener" in text
    assert "HTTP/1.1 400" in text and "--data-parallel-address/--data-parallel-rpc-port" in text
    assert "bytes exceeds" not in text


@pytest.mark.anyio
async def test_a_headless_node_answered_by_another_protocol_version_says_so(tmp_path):
    newer = msgspec.msgpack.encode({"type": "NodeAccepted", "head_host": "h", "protocol_version": 99})
    async with answering(struct.pack(">I", len(newer)) + newer) as port:
        node = node_for(f"-dp 2 -dpl 1 -dpr 1 --headless -dpa 127.0.0.1 -dpp {port}", tmp_path)
        with anyio.fail_after(10), pytest.raises(StartupError) as raised:
            await join_head(node, {})
    text = str(raised.value)
    assert "speaks another asyncdp protocol (a NodeAccepted message of protocol_version 99" in text
    assert f"this build speaks protocol_version {m.PROTOCOL_VERSION}" in text


@asynccontextmanager
async def head_listener(tmp_path) -> AsyncIterator[tuple[RunningNode, str]]:
    """A head node's handshake listener, serving :func:`handshake` on 127.0.0.1 port 0, during startup."""
    with socket.socket() as sock:
        node = node_for("-dp 2 -dpl 1 -dpa 127.0.0.1 --api-server-count 1", tmp_path, sock)
        listener, addr = await listen("tcp", host="127.0.0.1")
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve_links, listener, functools.partial(handshake, node))
            yield node, addr
            tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_an_http_request_on_the_heads_rpc_port_is_dropped_without_failing_startup(tmp_path, caplog):
    async with head_listener(tmp_path) as (node, addr):
        host, port = addr.removeprefix("tcp:").rsplit(":", 1)
        async with await anyio.connect_tcp(host, int(port)) as stream:
            await stream.send(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            with anyio.fail_after(10):
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    await stream.receive()  # the head closed it
    assert node.failure is None and not node.shutdown.is_set()
    assert "does not speak asyncdp (it sent b'GET /health HTTP/1.1'" in caplog.text


@pytest.mark.anyio
async def test_a_peer_of_another_protocol_version_is_refused_by_name_on_both_sides(tmp_path):
    older = msgspec.msgpack.encode({"type": "NodeHello", "start_rank": 1, "protocol_version": 4})
    async with head_listener(tmp_path) as (node, addr):
        host, port = addr.removeprefix("tcp:").rsplit(":", 1)
        async with await anyio.connect_tcp(host, int(port)) as stream:
            await stream.send(struct.pack(">I", len(older)) + older)
            with anyio.fail_after(10):
                header = await _receive_exactly(stream, 4)
                answer = m.decode(await _receive_exactly(stream, struct.unpack(">I", header)[0]))
    assert isinstance(answer, m.HandshakeError) and "protocol_version 4" in answer.reason
    assert node.failure is not None and "another asyncdp protocol" in node.failure
    assert f"this head speaks protocol_version {m.PROTOCOL_VERSION}" in node.failure


async def _receive_exactly(stream: anyio.abc.ByteReceiveStream, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += await stream.receive(size - len(data))
    return data
