"""The router closes a client's connection once a proxied answer is whole when the client asked for it (HTTP/1.0, or
``Connection: close``), on either backend, as ``asyncdp serve`` does.

Before the fix, on trio, Hypercorn's close of the connection (and for a kept-alive one, the start of its idle
timer) ran inside the app's last ``send``, which the disconnect watcher cancelled on the ``http.disconnect`` that
same close delivered: the connection stayed open, without idle timeout, until the client left, and a client that
reads to the end of the connection (HTTP/1.0) waited forever.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.router.upstream import echo_upstream, read_to_eof, routed, stop

pytestmark = pytest.mark.anyio


async def test_a_proxied_answer_closes_the_connection_the_client_asked_to_close(tmp_path: Path) -> None:
    async with echo_upstream() as upstream, routed(tmp_path / "router.log", upstream.url) as router:
        for request in (b"GET /v1/models HTTP/1.0\r\n\r\n",
                        b"GET /v1/models HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n",
                        b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"):
            data = await read_to_eof(router.port, request)
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 "), data
            assert orjson.loads(body)["target"] == "/v1/" + request.split(b"/v1/")[1].split(b" ")[0].decode()
        assert len(upstream.seen) == 3
        assert await stop(router) == 0
    assert "Traceback" not in router.log()
