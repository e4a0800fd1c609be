"""Idle keep-alive connections when the server stops, on both backends (real Hypercorn, real sockets).

Under trio, Quart cancels a request's nursery as soon as Hypercorn reports the stream closed, which happens inside
the response's last ``send``; Hypercorn restarts the connection's idle timer from that same ``send``, so the timer
was cancelled before it started. The connection then waited for its client's next request whatever happened: at
shutdown it held Hypercorn for the whole drain deadline after every request had finished (``asyncdp serve
--backend trio --shutdown-timeout 5`` then outlasted the launcher's deadline and its API servers were killed).
"""

from __future__ import annotations

import anyio
import httpx
import pytest
import sniffio

from asyncdp.api import create_app, serve_http
from asyncdp.testing import FakeEngineClient

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_an_idle_keep_alive_connection_does_not_hold_a_stopping_server_for_its_drain_deadline(
        stream: bool) -> None:
    app = create_app(FakeEngineClient(), backend=sniffio.current_async_library())
    stop, stopped = anyio.Event(), anyio.Event()

    async def serve(*, task_status: anyio.abc.TaskStatus[tuple[str, int]]) -> None:
        await serve_http(app, shutdown_timeout_s=60.0, shutdown_trigger=stop.wait, task_status=task_status)
        stopped.set()

    async with anyio.create_task_group() as tg:
        host, port = await tg.start(serve)
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=5.0) as http:
            r = await http.post("/v1/completions", json={"prompt": "a", "max_tokens": 3, "stream": stream})
            assert r.status_code == 200  # read whole: the connection stays open, idle, in the client's pool
            stop.set()
            with anyio.fail_after(5):  # nothing is in flight: far below the 60 s the drain would allow
                await stopped.wait()
