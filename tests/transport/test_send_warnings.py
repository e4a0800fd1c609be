"""asyncio's ``socket.send() raised exception.`` flood after peers reset their connections (issue #12, item 13)."""

import asyncio
import contextlib
import logging
import socket
import struct

import pytest

from asyncdp.api.serve import SEND_WARNING, SendWarningLimiter, rate_limit_send_warnings


async def writes_after_a_reset(num_connections: int, writes_each: int) -> None:
    """Open connections, let each peer reset its end, then keep writing to them, as a server whose handlers
    have not yet seen the disconnect does."""
    listener = socket.create_server(("127.0.0.1", 0))
    writers = []
    async with asyncio.timeout(5):
        for _ in range(num_connections):
            reader, writer = await asyncio.open_connection(*listener.getsockname())
            peer, _ = listener.accept()
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            peer.close()  # RST
            with contextlib.suppress(ConnectionResetError):
                await reader.read()  # the transport has seen the reset (the handlers that write below have not)
            writers.append(writer)
    for _ in range(writes_each):
        for writer in writers:
            writer.write(b"data: chunk\n\n")
        await asyncio.sleep(0)
    for writer in writers:
        writer.close()
    listener.close()


def send_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "asyncio" and r.getMessage().startswith(SEND_WARNING)]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_writes_to_many_reset_connections_log_one_send_warning_with_a_count(caplog, anyio_backend):
    caplog.set_level(logging.WARNING, logger="asyncio")
    remove = rate_limit_send_warnings()
    try:
        await writes_after_a_reset(num_connections=20, writes_each=12)
    finally:
        remove()
    warnings = send_warnings(caplog)
    assert len(warnings) == 1, len(warnings)  # without the limiter: 20 x (12 - 5) lines
    caplog.clear()
    await writes_after_a_reset(num_connections=2, writes_each=8)
    assert len(send_warnings(caplog)) > 1  # removed: asyncio's own behaviour again


def test_the_limiter_reports_how_many_it_held_back_once_the_interval_passed():
    now = [0.0]
    limiter = SendWarningLimiter(every_s=10.0, now=lambda: now[0])

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.WARNING, __file__, 1, msg, None, None)

    assert limiter.filter(record(SEND_WARNING))
    assert not any(limiter.filter(record(SEND_WARNING)) for _ in range(99))
    assert limiter.filter(record("something else"))  # other asyncio records are untouched
    now[0] = 10.0
    passed = record(SEND_WARNING)
    assert limiter.filter(passed)
    assert "99 more like it" in passed.getMessage()
