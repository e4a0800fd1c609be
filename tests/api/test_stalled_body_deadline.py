"""A client that stops sending its body is answered once ``BODY_TIMEOUT`` has passed since its request began, not
twice that: Quart's read gives up with a 408 at the deadline, and the hook that reads the rest of a body before
any answer goes out (``read_rest_of_body``) then waited a whole ``BODY_TIMEOUT`` more (120 s by default)."""

from __future__ import annotations

import anyio
import pytest

from tests.api.conftest import running
from tests.api.test_refusal_reads_body import _read_response

pytestmark = pytest.mark.anyio

TIMEOUT_S = 3.0


async def _stall(base_url: str, path: str) -> tuple[bytes, float]:
    """Send the headers and a tenth of a 1000-byte body, then nothing; return the status line and when it came."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: 1000\r\n\r\n").encode()
    with anyio.fail_after(4 * TIMEOUT_S):
        async with await anyio.connect_tcp(host, int(port)) as conn:
            started = anyio.current_time()
            await conn.send(head + b" " * 100)
            status = await _read_response(conn)
            return status, anyio.current_time() - started


async def test_a_stalled_body_is_answered_408_at_the_body_timeout() -> None:
    async with running() as srv:
        srv.app.config["BODY_TIMEOUT"] = TIMEOUT_S
        status, took = await _stall(srv.base_url, "/v1/completions")
    assert status.startswith(b"HTTP/1.1 408")
    assert TIMEOUT_S <= took < 1.5 * TIMEOUT_S, took  # 2 x TIMEOUT_S before


async def test_a_refusal_before_the_body_waits_for_it_only_until_the_body_timeout() -> None:
    async with running() as srv:
        srv.app.config["BODY_TIMEOUT"] = TIMEOUT_S
        status, took = await _stall(srv.base_url, "/v1/no-such-route")  # a 404, decided before any body byte
    assert status.startswith(b"HTTP/1.1 404")
    assert took < 1.5 * TIMEOUT_S, took
