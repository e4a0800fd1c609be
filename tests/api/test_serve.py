"""serve_http: readiness, client disconnects, graceful drain and its deadline, on both backends.

Token delays here are real time (a real Hypercorn and real sockets), kept to tens of milliseconds.
"""

from __future__ import annotations

from functools import partial

import anyio
import httpx
import orjson
import pytest

from asyncdp.api import create_app, serve_http, set_draining
from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running, sse_events

pytestmark = pytest.mark.anyio

STREAM = {"prompt": "a", "max_tokens": 10, "stream": True}


async def open_raw_stream(base_url: str, body: dict) -> tuple[anyio.abc.SocketStream, bytes]:
    """POST a streaming request over a bare socket and read up to its first SSE event.

    A bare socket rather than httpx: leaving an httpx stream early leaves its async generators to the
    garbage collector, which trio reports as a warning.
    """
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    payload = orjson.dumps(body)
    sock = await anyio.connect_tcp(host, int(port))
    await sock.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
    received = b""
    with anyio.fail_after(5):
        while b"data: " not in received:
            received += await sock.receive()
    return sock, received


async def read_rest(sock: anyio.abc.SocketStream) -> bytes:
    received = b""
    with anyio.fail_after(5):
        try:
            while b"[DONE]" not in received:
                received += await sock.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
            pass
    return received


def dechunk(raw: bytes) -> str:
    """The body of a raw chunked HTTP/1.1 response (possibly cut short)."""
    _, _, rest = raw.partition(b"\r\n\r\n")
    body = b""
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        body, rest = body + rest[:size], rest[size + 2:]
    return body.decode()


async def test_client_disconnect_mid_stream_aborts_the_request() -> None:
    fake = FakeEngineClient(token_delay_s=0.02)
    async with running(fake) as srv:
        sock, _ = await open_raw_stream(srv.base_url, {**STREAM, "max_tokens": 200})
        assert fake.num_active == 1
        await sock.aclose()
        with anyio.fail_after(5):
            await fake.wait_until(lambda: fake.aborted)
        assert fake.num_active == 0
        assert fake.finished == []
        # The server keeps serving after the abort.
        again = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})
        assert again.status_code == 200


async def test_disconnect_during_non_streaming_request_aborts_it() -> None:
    fake = FakeEngineClient(token_delay_s=0.02)
    async with running(fake) as srv, anyio.create_task_group() as tg:
        async def doomed() -> None:
            await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 200})

        tg.start_soon(doomed)
        with anyio.fail_after(5):
            await fake.wait_until(lambda: fake.num_active == 1)
        tg.cancel_scope.cancel()  # closes the client's connection mid-request
        with anyio.fail_after(5):
            await fake.wait_until(lambda: fake.aborted)
    assert fake.finished == []


async def test_shutdown_lets_in_flight_stream_finish_and_refuses_new_connections() -> None:
    fake = FakeEngineClient(token_delay_s=0.02)
    async with running(fake, shutdown_timeout_s=5.0) as srv:
        sock, body = await open_raw_stream(srv.base_url, STREAM)
        async with sock:
            srv.stop.set()
            with anyio.fail_after(5):
                await fake.wait_until(lambda: srv.app.extensions["asyncdp"].draining)
            async with httpx.AsyncClient(base_url=srv.base_url) as fresh:
                try:
                    late = await fresh.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})
                    assert late.status_code == 503
                except httpx.ConnectError:
                    pass  # the listener is already closed: also allowed by spec §12.5
            body += await read_rest(sock)
    events = sse_events(dechunk(body))
    assert events[-1] == "[DONE]"
    assert "".join(orjson.loads(e)["choices"][0]["text"] for e in events[:-1]) == "".join(
        chr(t) for t in fake.expected_token_ids(fake.tokenizer.encode("a"), None, 10))
    assert len(fake.finished) == 1 and fake.aborted == []


async def test_shutdown_deadline_cuts_and_aborts_a_long_request() -> None:
    fake = FakeEngineClient(token_delay_s=0.02)
    async with running(fake, shutdown_timeout_s=0.2) as srv:
        sock, body = await open_raw_stream(srv.base_url, {**STREAM, "max_tokens": 200})
        srv.stop.set()
        body += await read_rest(sock)  # ends when the server drops the connection at its deadline
        await sock.aclose()
        with anyio.fail_after(5):
            await fake.wait_until(lambda: fake.aborted)
    assert b"[DONE]" not in body
    assert fake.finished == []


async def test_cancelling_serve_http_drains_in_flight_requests_first() -> None:
    fake = FakeEngineClient(token_delay_s=0.02)
    app = create_app(fake, backend=__import__("sniffio").current_async_library())
    async with anyio.create_task_group() as tg:
        serve_scope = anyio.CancelScope()

        async def serve(*, task_status: anyio.abc.TaskStatus[tuple[str, int]]) -> None:
            with serve_scope:
                await serve_http(app, shutdown_timeout_s=5.0, task_status=task_status)

        host, port = await tg.start(serve)
        sock, body = await open_raw_stream(f"http://{host}:{port}", STREAM)
        async with sock:
            serve_scope.cancel()
            body += await read_rest(sock)
    assert sse_events(dechunk(body))[-1] == "[DONE]"
    assert len(fake.finished) == 1


async def test_draining_app_answers_503_in_openai_shape_and_fails_health() -> None:
    async with running() as srv:
        set_draining(srv.app)
        r = await srv.http.post("/v1/completions", json={"prompt": "a"})
        health = await srv.http.get("/health")
        metrics = await srv.http.get("/metrics")
    assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceUnavailableError"
    assert health.status_code == 503
    assert metrics.status_code == 200


async def test_serve_on_an_inherited_socket_reports_its_address() -> None:
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    fake = FakeEngineClient()
    app = create_app(fake, backend=__import__("sniffio").current_async_library())
    try:
        async with anyio.create_task_group() as tg:
            address = await tg.start(partial(serve_http, app, sock=listener.fileno()))
            assert address == listener.getsockname()
            async with httpx.AsyncClient(base_url=f"http://{address[0]}:{address[1]}") as http:
                assert (await http.get("/health")).status_code == 200
            tg.cancel_scope.cancel()
    finally:
        listener.close()


async def test_serving_an_app_built_for_the_other_backend_is_refused() -> None:
    backend = __import__("sniffio").current_async_library()
    other = "trio" if backend == "asyncio" else "asyncio"
    with pytest.raises(ValueError, match="other backend"):
        await serve_http(create_app(FakeEngineClient(), backend=other))
