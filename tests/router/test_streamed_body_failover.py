"""Failover of a streamed body, in-process: the app is called with an ASGI ``receive`` that hands out the body in
parts, the endpoints are an httpx transport that reads the request body as a stream (as a real connection does).

A body over ``--replay-buffer-bytes`` can still go to the next endpoint when the first refused the connection (it
read none of it), but not once an endpoint read it (its drain 503): that is a 503 saying why. A client that leaves
while its body streams ends the exchange; a body that crosses the limit while it streams is a 413 sent once the
rest of it was read."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
import orjson
import pytest

from asyncdp.api.context import DRAINING_MESSAGE
from asyncdp.api.errors import error_body
from asyncdp.router.poller import Poller
from asyncdp.router.proxy import RouterApp
from tests.router.test_proxy import streamed

pytestmark = pytest.mark.anyio

A, B = "http://a:1", "http://b:2"
IDLE = {"dp_rank": 0, "up": True, "waiting": 0, "running": 0, "inflight": 0, "kv_cache_usage": 0.0}
PART = b"p" * 100
Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


class Endpoints(httpx.AsyncBaseTransport):
    def __init__(self, handlers: dict[str, Handler]) -> None:
        self.handlers = handlers
        self.calls: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = f"{request.url.scheme}://{request.url.netloc.decode()}"
        self.calls.append(url)
        return await self.handlers[url](request)


async def refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


async def read_all(request: httpx.Request) -> bytes:
    assert isinstance(request.stream, httpx.AsyncByteStream)
    return b"".join([chunk async for chunk in request.stream])


async def echo(request: httpx.Request) -> httpx.Response:
    body = await read_all(request)
    return streamed(200, orjson.dumps({"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest(),
                                       "content_length": request.headers.get("content-length"),
                                       "chunked": request.headers.get("transfer-encoding") == "chunked"}))


async def drain_after_reading(request: httpx.Request) -> httpx.Response:
    await read_all(request)
    return streamed(503, orjson.dumps(error_body(503, DRAINING_MESSAGE)))


def router(handlers: dict[str, Handler], *, replay: int = 150, limit: int = 10_000) -> tuple[RouterApp, Endpoints]:
    poller = Poller([A, B], poll_interval_s=0.05, stale_after_s=1.0)
    for ep in poller.endpoints:
        ep.observe({"seq": 1, "ranks": [IDLE]}, anyio.current_time())
    endpoints = Endpoints(handlers)
    app = RouterApp(poller, httpx.AsyncClient(transport=endpoints), connect_timeout_s=1.0, max_body_bytes=limit,
                    replay_body_bytes=replay)
    return app, endpoints


class Client:
    """The client's side of one request: its body in ``parts``, then (``leave``) a disconnect, else silence."""

    def __init__(self, parts: int, *, leave_after: int | None = None, sized: bool = False) -> None:
        self.parts = parts
        self.leave_after = leave_after
        self.num_read = 0
        self.sent: list[dict[str, Any]] = []
        headers = [(b"content-type", b"application/json")]
        if sized:
            headers.append((b"content-length", str(parts * len(PART)).encode()))
        self.scope = {"type": "http", "method": "POST", "path": "/v1/completions", "raw_path": b"/v1/completions",
                      "query_string": b"", "headers": headers, "client": ("127.0.0.1", 1234), "scheme": "http"}

    async def receive(self) -> dict[str, Any]:
        if self.leave_after is not None and self.num_read >= self.leave_after:
            return {"type": "http.disconnect"}
        if self.num_read >= self.parts:
            await anyio.sleep_forever()
        self.num_read += 1
        return {"type": "http.request", "body": PART, "more_body": self.num_read < self.parts}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    async def call(self, app: RouterApp) -> tuple[int | None, Any]:
        with anyio.fail_after(5):
            await app(self.scope, self.receive, self.send)
        if not self.sent:
            return None, None
        return self.sent[0]["status"], orjson.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))


@pytest.mark.parametrize("sized", [False, True])
async def test_a_streamed_body_fails_over_when_the_first_endpoint_refused_the_connection(sized: bool) -> None:
    app, endpoints = router({A: refuse, B: echo})
    client = Client(10, sized=sized)
    status, body = await client.call(app)
    assert status == 200 and endpoints.calls == [A, B]
    assert body["bytes"] == 10 * len(PART) and body["sha256"] == hashlib.sha256(PART * 10).hexdigest()
    assert body["chunked"] is not sized and body["content_length"] == (str(10 * len(PART)) if sized else None)


async def test_a_small_body_fails_over_after_a_drain_and_a_streamed_one_is_a_503_saying_why() -> None:
    app, endpoints = router({A: drain_after_reading, B: echo})
    status, body = await Client(1).call(app)  # 100 bytes: held whole
    assert status == 200 and endpoints.calls == [A, B]

    app, endpoints = router({A: drain_after_reading, B: echo})
    status, body = await Client(10).call(app)  # 1000 bytes, over the 150 held
    assert status == 503 and endpoints.calls == [A]
    message = body["error"]["message"]
    assert "draining" in message and "--replay-buffer-bytes" in message and "cannot be sent to another" in message
    assert app.poller.candidates() == [1]  # A is out until its next /load answer


async def test_a_client_that_leaves_while_its_body_streams_ends_the_exchange_with_no_answer() -> None:
    app, endpoints = router({A: echo, B: echo})
    client = Client(10, leave_after=4)
    assert await client.call(app) == (None, None)
    assert endpoints.calls == [A] and app.poller.endpoints[0].num_inflight == 0


async def test_a_body_that_crosses_the_limit_while_it_streams_is_a_413_once_the_client_sent_it_all() -> None:
    app, endpoints = router({A: echo, B: echo}, limit=500)
    client = Client(10)
    status, body = await client.call(app)
    assert status == 413 and body["error"]["code"] == 413 and "limit of 500 bytes" in body["error"]["message"]
    assert client.num_read == 10 and endpoints.calls == [A]  # it read the rest before it answered


async def test_a_content_length_over_the_limit_is_a_413_and_nothing_is_sent() -> None:
    app, endpoints = router({A: echo, B: echo}, limit=500)
    client = Client(10, sized=True)
    status, _body = await client.call(app)
    assert status == 413 and client.num_read == 10 and endpoints.calls == []
