"""An answer sent before the body was read (the API key's 401, the drain gate's 503, a 404, a 405, a route that
ignores its body) still reaches a client that is sending a large body, and the connection stays usable.

Answered while the body is still arriving, the refusal was followed by the server closing a connection with unread
data: the client's next write broke (a broken pipe or a reset), so it never read the answer, and ``asyncdp route``
in front turned it into a 502. Raw sockets here, since an HTTP client hides when the answer came.
"""

from __future__ import annotations

import anyio
import pytest

from asyncdp.api import set_draining
from tests.api.conftest import Server, running

pytestmark = pytest.mark.anyio

KEY = "sk-refusal"
BODY_BYTES = 4 << 20  # far more than the socket buffers hold: the server decides while the client still sends
FIRST_BYTES = 1 << 20


async def _post_then_reuse(srv: Server, path: str = "/v1/completions") -> tuple[bytes, bytes]:
    """POST a large body in two parts on one connection, read the answer, then ask /health on the same
    connection; returns the two answers' status lines."""
    host, port = srv.base_url.removeprefix("http://").rsplit(":", 1)
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {BODY_BYTES}\r\n\r\n").encode()
    with anyio.fail_after(20):
        async with await anyio.connect_tcp(host, int(port)) as conn:
            await conn.send(head + b" " * FIRST_BYTES)
            await conn.send(b" " * (BODY_BYTES - FIRST_BYTES))
            first = await _read_response(conn)
            await conn.send(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            second = await _read_response(conn)
    return first, second


async def _read_response(conn: anyio.abc.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += await conn.receive()
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += await conn.receive()
    return head.split(b"\r\n", 1)[0]


async def test_a_401_reaches_a_client_still_sending_its_body() -> None:
    async with running(api_key=KEY) as srv:
        first, second = await _post_then_reuse(srv)
    assert first.startswith(b"HTTP/1.1 401")
    assert second.startswith(b"HTTP/1.1 200")


async def test_the_drain_gates_503_reaches_a_client_still_sending_its_body() -> None:
    async with running() as srv:
        set_draining(srv.app)
        first, _ = await _post_then_reuse(srv)
    assert first.startswith(b"HTTP/1.1 503")


@pytest.mark.parametrize(("path", "status"), [("/v1/nothing", 404), ("/health", 405), ("/pause", 200)])
async def test_an_answer_that_ignores_the_body_reaches_a_client_still_sending_it(path: str, status: int) -> None:
    async with running() as srv:
        first, second = await _post_then_reuse(srv, path)
    assert first.startswith(f"HTTP/1.1 {status}".encode())
    assert second.startswith(b"HTTP/1.1 200")
