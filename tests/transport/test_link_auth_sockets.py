"""The deployment secret on real sockets (127.0.0.1 and Unix): ``connect``/``serve_links`` with the secret carry
frames; a stranger's link is closed before its handler runs (nothing it sent is read as a message), with one
WARNING naming its address (a scanner that keeps trying gets one line a minute, the secret none); an asyncdp peer
without the secret is told why; and a peer with a secret that meets a listener without one fails with a line that
says so."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

from asyncdp import messages
from asyncdp.errors import ForeignPeerError, LinkAuthError, ProtocolError
from asyncdp.transport import StreamLink, connect, listen, serve_links
from asyncdp.transport.link_auth import RefusalLog
from asyncdp.transport.links import frame_bytes

SECRET = b"s3cr3t-of-the-deployment"


@asynccontextmanager
async def listening(kind: str, tmp_path, secret: bytes | None) -> AsyncIterator[tuple[str, list[object]]]:
    """A listener serving an echo handler (every message it reads, or the error it raised, is noted; messages are
    sent back); yields its address. On the way out it waits for the handlers to end (the peers closed)."""
    listener, addr = await listen(kind, directory=str(tmp_path), host="127.0.0.1")
    seen: list[object] = []
    running = 0
    idle = anyio.Event()

    async def echo(link: StreamLink) -> None:
        nonlocal running, idle
        running += 1
        try:
            async for msg in link:
                seen.append(msg)
                await link.send(msg)
        except ProtocolError as exc:
            seen.append(exc)
        finally:
            running -= 1
            if running == 0:
                idle.set()
                idle = anyio.Event()

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: serve_links(listener, echo, name="test", secret=secret))
        yield addr, seen
        with anyio.fail_after(5):
            while running:
                await idle.wait()
        tg.cancel_scope.cancel()


def raw_socket(addr: str) -> socket.socket:
    kind, _, where = addr.partition(":")
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(where)
    else:
        host, _, port = where.rpartition(":")
        sock = socket.create_connection((host, int(port)))
    sock.settimeout(10)
    return sock


def read_to_end(sock: socket.socket) -> bytes:
    got = b""
    while chunk := sock.recv(4096):
        got += chunk
    return got


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["tcp", "unix"])
async def test_links_that_prove_the_secret_carry_frames(kind, tmp_path):
    async with listening(kind, tmp_path, SECRET) as (addr, seen):
        link = await connect(addr, secret=SECRET)
        with anyio.fail_after(5):
            await link.send(messages.Subscribe(dp_rank=1))
            assert await link.receive() == messages.Subscribe(dp_rank=1)
        await link.aclose()
    assert seen == [messages.Subscribe(dp_rank=1)]


@pytest.mark.anyio
async def test_a_stranger_sending_a_valid_frame_is_told_why_and_closed_and_its_frame_is_never_read(tmp_path, caplog):
    # (TCP: on asyncio, a Unix socket's receive cancelled as bytes arrive can raise anyio's InvalidStateError, and
    # the listener is cancelled while it may still drain the stranger; the e2e test covers Unix sockets)
    caplog.set_level(logging.DEBUG, logger="asyncdp")
    async with listening("tcp", tmp_path, SECRET) as (addr, seen):
        sock = raw_socket(addr)
        port = sock.getsockname()[1]
        await anyio.to_thread.run_sync(sock.sendall, frame_bytes(messages.Subscribe(dp_rank=0)))
        answer = await anyio.to_thread.run_sync(read_to_end, sock)
        sock.close()
    assert seen == []
    assert isinstance(messages.decode(answer[4:]), messages.HandshakeError)
    assert b"ASYNCDP_DP_SECRET" in answer
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "refused a link from" in warnings[0] and "test listener" in warnings[0]
    assert f"127.0.0.1:{port}" in warnings[0]
    assert SECRET.decode() not in caplog.text


@pytest.mark.anyio
async def test_another_secret_fails_the_connect_and_the_listener_goes_on_serving(tmp_path, caplog):
    async with listening("tcp", tmp_path, SECRET) as (addr, seen):
        with pytest.raises(LinkAuthError, match="the secrets do not match"):
            await connect(addr, secret=b"another secret")
        link = await connect(addr, secret=SECRET)
        with anyio.fail_after(5):
            await link.send(messages.Heartbeat(sender="x", seq=1))
            assert await link.receive() == messages.Heartbeat(sender="x", seq=1)
        await link.aclose()
    assert seen == [messages.Heartbeat(sender="x", seq=1)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "instead of proving it holds this deployment's secret" in warnings[0]
    assert "another secret" not in caplog.text and SECRET.decode() not in caplog.text


@pytest.mark.anyio
async def test_a_peer_with_a_secret_at_a_listener_without_one_fails_with_a_line_that_says_so(tmp_path):
    async with listening("tcp", tmp_path, None) as (addr, seen):
        with pytest.raises(LinkAuthError, match="it holds no deployment secret") as raised:
            await connect(addr, secret=SECRET)
    assert "\n" not in str(raised.value)
    assert len(seen) == 1 and isinstance(seen[0], ForeignPeerError)
    assert "a deployment-secret handshake: that peer holds a deployment secret and this process none" in str(seen[0])


@pytest.mark.anyio
async def test_a_peer_without_a_secret_at_a_listener_with_one_reads_a_handshake_error(tmp_path):
    # (TCP: on asyncio, a Unix socket's receive cancelled as bytes arrive can raise anyio's InvalidStateError)
    async with listening("tcp", tmp_path, SECRET) as (addr, seen):
        link = await connect(addr)
        await link.send(messages.Hello(protocol_version=messages.PROTOCOL_VERSION, dp_rank=0, local=True,
                                       headless=False, host="h", pid=1, launcher_pid=1))
        with anyio.fail_after(5):
            answer = await link.receive()
        await link.aclose()
    assert isinstance(answer, messages.HandshakeError) and "ASYNCDP_DP_SECRET" in answer.reason
    assert seen == []


@pytest.mark.trio
async def test_a_scanner_that_keeps_trying_gets_one_warning_a_minute(autojump_clock, caplog):
    from asyncdp.transport.link_auth import Refusal

    caplog.set_level(logging.DEBUG, logger="asyncdp")
    refusals = RefusalLog("engine", every_s=60.0)
    for _ in range(5):
        refusals.note("10.0.0.9:4242", Refusal("it does not speak the deployment-secret handshake"))
        await anyio.sleep(10)
    refusals.note("10.0.0.9:4242", Refusal("it closed", quiet=True))
    await anyio.sleep(20)  # 70 s after the first
    refusals.note("10.0.0.9:4243", Refusal("it does not speak the deployment-secret handshake"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "refused a link from 10.0.0.9:4242 to the engine listener: it does not speak the deployment-secret handshake",
        "refused a link from 10.0.0.9:4243 to the engine listener: it does not speak the deployment-secret handshake "
        "(4 more refused since the last such line)"]
    assert refusals.num_refused == 7


@pytest.mark.anyio
@pytest.mark.parametrize("answer", [b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n", b"HTTP/1.1 400 " + b"x" * 80],
                         ids=["short-then-closed", "long"])
async def test_a_secret_holding_peer_pointed_at_an_http_port_says_it_is_no_asyncdp_listener(answer):
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def http(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()
            await stream.send(answer)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, http)
        with pytest.raises(LinkAuthError) as raised:
            await connect(f"tcp:127.0.0.1:{port}", secret=SECRET)
        tg.cancel_scope.cancel()
    assert str(raised.value).startswith(f"the peer at tcp:127.0.0.1:{port} is not an asyncdp listener (it answered "
                                        "the deployment-secret handshake with b'HTTP/1.1 400 ")
    assert "--data-parallel-rpc-port" in str(raised.value)
