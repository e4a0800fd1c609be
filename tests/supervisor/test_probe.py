"""Probing one child (spec §11.3 "Probing"): the pure decisions, and the probe against real loopback sockets."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

from asyncdp.supervisor.probe import (
    ProbeResult,
    ProbeTarget,
    attempts_per_probe,
    judge_round,
    parse_status_line,
    probe_child,
    probe_host,
    probe_round,
)


def test_probe_host_maps_wildcards_and_unset_to_loopback():
    assert [probe_host(h) for h in ("0.0.0.0", "::", None, "")] == ["127.0.0.1", "::1", "127.0.0.1", "127.0.0.1"]
    assert probe_host("10.1.2.3") == "10.1.2.3" and probe_host("::1") == "::1"


def test_status_line_gives_the_code_and_anything_else_is_refused():
    assert parse_status_line(b"HTTP/1.1 503 Service Unavailable\r\n") == 503
    assert parse_status_line(b"HTTP/1.0 200") == 200
    for garbage in (b"", b"SSH-2.0-OpenSSH_9.6\r\n", b"HTTP/1.1 20 OK", b"HTTP/1.1 abc OK"):
        with pytest.raises(ValueError):
            parse_status_line(garbage)


def test_one_attempt_before_ready_and_the_threshold_after():
    assert attempts_per_probe(ready=False, failure_threshold=3) == 1
    assert attempts_per_probe(ready=True, failure_threshold=3) == 3


def test_round_is_ready_only_when_every_child_is_healthy_and_unhealthy_only_after_ready():
    ok, bad, gone = ProbeResult(0, 8000, 200), ProbeResult(1, 8001, 503), ProbeResult(2, 8002, None, "refused")
    assert judge_round([ok, ok], ready=False).kind == "ready"
    assert judge_round([ok, ok], ready=True).kind == "ready"
    assert judge_round([ok, bad, gone], ready=False).kind == "polling"
    verdict = judge_round([ok, bad, gone], ready=True)
    assert (verdict.kind, verdict.unhealthy) == ("unhealthy", (bad, gone))
    assert (bad.describe(), gone.describe()) == ("answered HTTP 503", "unreachable (refused)")


@asynccontextmanager
async def loopback_server(handle: Callable[[anyio.abc.SocketStream], Awaitable[None]]) -> AsyncIterator[list[int]]:
    """A TCP server on 127.0.0.1 running ``handle`` per connection; yields [port, connections so far]."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    stats = [port, 0]

    async def counted(stream: anyio.abc.SocketStream) -> None:
        stats[1] += 1
        async with stream:
            await handle(stream)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, counted)
        yield stats
        tg.cancel_scope.cancel()


async def answer(status: int, stream: anyio.abc.SocketStream) -> None:
    await stream.receive()
    await stream.send(f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n".encode())


@pytest.mark.anyio
async def test_any_http_answer_counts_at_once_without_a_retry():
    for status in (200, 503):
        async with loopback_server(lambda s, status=status: answer(status, s)) as stats:
            with anyio.fail_after(10):
                r = await probe_child(ProbeTarget(3, "127.0.0.1", stats[0]), attempts=3, timeout_s=5,
                                      interval_s=0.01)
            assert (r.dp_rank, r.port, r.status, r.healthy, stats[1]) == (3, stats[0], status, status == 200, 1)


@pytest.mark.anyio
async def test_a_connection_closed_before_an_answer_is_retried_up_to_the_attempts():
    async def hang_up(stream: anyio.abc.SocketStream) -> None:
        await stream.receive()

    async with loopback_server(hang_up) as stats:
        with anyio.fail_after(10):
            r = await probe_child(ProbeTarget(0, "127.0.0.1", stats[0]), attempts=3, timeout_s=5, interval_s=0.01)
    assert (r.status, stats[1]) == (None, 3)
    assert r.error == "connection closed before an answer after 3 attempts"


@pytest.mark.anyio
async def test_a_silent_child_times_out_each_attempt():
    async def silent(stream: anyio.abc.SocketStream) -> None:
        await anyio.sleep_forever()

    async with loopback_server(silent) as stats:
        with anyio.fail_after(10):
            r = await probe_child(ProbeTarget(0, "127.0.0.1", stats[0]), attempts=2, timeout_s=0.2, interval_s=0.01)
    assert (r.status, r.error, stats[1]) == (None, "timed out after 2 attempts", 2)


@pytest.mark.anyio
async def test_a_refused_connection_is_unreachable_and_a_round_keeps_target_order():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    async with loopback_server(lambda s: answer(200, s)) as stats:
        with anyio.fail_after(10):
            results = await probe_round([ProbeTarget(0, "127.0.0.1", closed_port), ProbeTarget(1, "127.0.0.1", stats[0])],
                                        attempts=1, timeout_s=5, interval_s=0.01)
    assert [(r.dp_rank, r.status) for r in results] == [(0, None), (1, 200)]
    assert results[0].error == "connection refused"
