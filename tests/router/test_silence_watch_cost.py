"""What watching for a silent endpoint costs a request: no task of its own. The poller's task checks the requests
in flight at an endpoint when a poll there times out (asyncdp.router.silence.SilenceWatch); a watcher task per
request cost about 50 µs of the router's CPU per request on asyncio (task group, task, cancellation), about 3 %
of what the router spends on one (docs/benchmarks.md). A request in flight runs in its own (ASGI) task plus its
client-disconnect watcher, and nothing more; tests/router/test_silent_endpoint.py checks what the watch does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import orjson
import pytest

from tests.router.test_silent_endpoint import EVENT, SSE
from tests.router.test_streamed_body_failover import A, B, router

pytestmark = pytest.mark.anyio

N = 5  # requests in flight at once


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_request_in_flight_runs_no_watcher_task_of_its_own() -> None:
    release = anyio.Event()
    streaming = 0
    all_streaming = anyio.Event()

    async def held(request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            yield EVENT
            await release.wait()
            yield EVENT

        return httpx.Response(200, headers=SSE, content=body())

    app, _endpoints = router({A: held, B: held})
    ended: list[bytes] = []

    async def call() -> None:
        nonlocal streaming
        sent: list[dict[str, Any]] = []
        received: list[bool] = []

        async def receive() -> dict[str, Any]:
            if not received:
                received.append(True)
                return {"type": "http.request", "body": orjson.dumps({"stream": True}), "more_body": False}
            await anyio.sleep_forever()  # the client stays
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            nonlocal streaming
            sent.append(message)
            if message.get("body") == EVENT and len(sent) == 2:
                streaming += 1
                if streaming == N:
                    all_streaming.set()

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "raw_path": b"/v1/completions",
                 "query_string": b"", "headers": [(b"content-type", b"application/json")],
                 "client": ("127.0.0.1", 1234), "scheme": "http"}
        await app(scope, receive, send)
        ended.append(b"".join(m.get("body", b"") for m in sent[1:]))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            before = len(anyio.get_running_tasks())
            for _ in range(N):
                tg.start_soon(call)
            await all_streaming.wait()
            added = len(anyio.get_running_tasks()) - before
            release.set()
    assert added == 2 * N, f"{added} tasks for {N} requests in flight"  # each: its own and its disconnect watcher
    assert ended == [EVENT * 2] * N
