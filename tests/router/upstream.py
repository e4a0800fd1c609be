"""A real upstream for the router's tests: a tiny ASGI app served by Hypercorn (:func:`asyncdp.api.serve.serve_http`)
on 127.0.0.1 and a free port, in the test's own event loop.

It answers ``GET /load`` with one idle rank (the telemetry contract, so the router uses it), and every other
request with a JSON echo of what arrived: method, target, headers (as a list of pairs, repeats kept), the peer's
address, the body's size and digest and in how many ``http.request`` events it came. Every request is also recorded
in :attr:`EchoUpstream.seen` once its body arrived whole (a request cut off is not). ``draining = True`` makes it answer 503 "The server is shutting down." without reading
the body, as a stopping ``asyncdp serve`` does. :func:`routed` runs a real ``asyncdp route`` process in front of
it without blocking the loop that serves it.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import orjson
import sniffio

from asyncdp.api.context import DRAINING_MESSAGE
from asyncdp.api.errors import error_body
from asyncdp.api.serve import SSLFiles, serve_http
from tests.router.route_process import RouterProcess, route

IDLE_LOAD = {"seq": 1, "ranks": [{"dp_rank": 0, "up": True, "waiting": 0, "running": 0, "inflight": 0,
                                  "kv_cache_usage": 0.0}]}


@dataclass
class EchoUpstream:
    url: str = ""
    seen: list[dict[str, Any]] = field(default_factory=list)
    draining: bool = False
    body_started: anyio.Event = field(default_factory=anyio.Event)  # the first body bytes of any request arrived

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                       send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/load":
            await _json(send, 200, IDLE_LOAD)
            return
        if self.draining:
            self.seen.append({"path": scope["path"], "draining": True})
            await _json(send, 503, error_body(503, DRAINING_MESSAGE))
            return
        digest, size, events = hashlib.sha256(), 0, 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            events += 1
            if message.get("body"):
                self.body_started.set()
            digest.update(message.get("body", b""))
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        target = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
        echo = {"method": scope["method"], "target": target.decode(), "scheme": scope["scheme"],
                "headers": [[k.decode(), v.decode()] for k, v in scope["headers"]],
                "client": list(scope["client"]), "body_bytes": size, "body_sha256": digest.hexdigest(),
                "body_events": events}
        self.seen.append(echo)
        await _json(send, 200, echo)


async def _json(send: Callable[[dict[str, Any]], Awaitable[None]], status: int, body: Any) -> None:
    data = orjson.dumps(body)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data, "more_body": False})


@asynccontextmanager
async def echo_upstream(ssl: SSLFiles | None = None) -> AsyncIterator[EchoUpstream]:
    """An :class:`EchoUpstream` served on 127.0.0.1 and a free port (``https`` with ``ssl``) for the block."""
    app = EchoUpstream()
    async with anyio.create_task_group() as tg:
        host, port = (await tg.start(lambda task_status: serve_http(app, host="127.0.0.1", port=0, ssl=ssl,
                                                                    shutdown_timeout_s=0.0,
                                                                    task_status=task_status)))[:2]
        app.url = f"{'https' if ssl else 'http'}://{host}:{port}"
        yield app
        tg.cancel_scope.cancel()


@asynccontextmanager
async def routed(log_path: Path, *endpoints: str, args: tuple[str, ...] = ()) -> AsyncIterator[RouterProcess]:
    """:func:`tests.router.route_process.route`, entered and left in a worker thread: the test's event loop, which
    serves the upstream, keeps running while the router starts (its first polls) and stops. The router runs on the
    test's own backend (``--backend``, unless ``args`` name one), so a test run on trio checks a router on trio."""
    if "--backend" not in args:
        args = ("--backend", sniffio.current_async_library(), *args)
    block = route(log_path, *endpoints, args=args)
    router = await anyio.to_thread.run_sync(block.__enter__)
    try:
        yield router
    finally:
        await anyio.to_thread.run_sync(block.__exit__, None, None, None)


async def stop(router: RouterProcess) -> int:
    """SIGTERM, then the exit code, without blocking the event loop."""
    return await anyio.to_thread.run_sync(router.stop)


def header_values(echo: dict[str, Any], name: str) -> list[str]:
    """Every value of header ``name`` (lower case) an :class:`EchoUpstream` answer shows, in order."""
    return [v for k, v in echo["headers"] if k == name]


async def read_to_eof(port: int, request: bytes) -> bytes:
    """Send ``request`` as it is to 127.0.0.1:``port``; all that comes back until the connection closes (within
    10 s, else TimeoutError)."""
    with anyio.fail_after(10):
        async with await anyio.connect_tcp("127.0.0.1", port) as conn:
            await conn.send(request)
            data = b""
            try:
                while chunk := await conn.receive():
                    data += chunk
            except anyio.EndOfStream:
                pass
    return data
