"""Request targets a careless or hostile client sends, through a real ``asyncdp route`` process in front of a real
upstream, written byte for byte on a socket (an HTTP client would clean them up first).

Before the fix: ``POST /v1/../pause`` reached the endpoint's ``/pause`` (httpx resolved the dot segment that the
router's route check let through as ``/v1/*``), an absolute-form target (``GET http://host/v1/models``) was a 404,
a target with a ``#`` or a WebSocket handshake was a bare 500 (the first with a traceback in the log), and a
``CONNECT`` that the upstream answered 2xx broke the connection with a traceback.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from asyncdp.router.target import request_target
from tests.router.upstream import echo_upstream, read_to_eof, routed, stop

ERROR_KEYS = {"message", "type", "param", "code"}


def target(raw_path: bytes, query: bytes = b"") -> tuple[str, bytes, int]:
    from urllib.parse import unquote

    t = request_target({"path": unquote(raw_path.decode("ascii")), "raw_path": raw_path, "query_string": query})
    return t.path, t.raw, t.error


def test_a_dot_segment_literal_or_percent_encoded_is_no_route() -> None:
    for raw in (b"/v1/../pause", b"/v1/%2e%2e/pause", b"/v1/..%2fpause", b"/v1/./models", b"/v1/models/.."):
        assert target(raw)[2] == 404, raw
    for raw in (b"/v1/..x/models", b"/v1/models/...", b"/v1/..;/pause"):  # no dot segment: the endpoint decides
        assert target(raw)[2] == 0, raw


def test_an_absolute_form_target_is_routed_and_forwarded_as_its_path() -> None:
    assert target(b"http://evil.example:81/v1/models", b"a=1") == ("/v1/models", b"/v1/models?a=1", 0)
    assert target(b"HTTPS://x")[:2] == ("/", b"/")
    assert target(b"http://x/v1/../pause")[2] == 404


def test_a_target_httpx_cannot_send_is_a_400_and_a_plain_one_is_sent_as_it_came() -> None:
    assert target(b"/v1/models#frag")[2] == 400
    assert target(b"/v1/models", b"q=#x")[2] == 400
    assert target(b"/v1/models/a%20b\"{x}", b"q=%ff")[1:] == (b"/v1/models/a%20b\"{x}?q=%ff", 0)


async def exchange(port: int, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` (which asks to close the connection) as it is; the status and the body of the answer."""
    head, _, body = (await read_to_eof(port, request)).partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def get(target: bytes, *headers: bytes, method: bytes = b"GET") -> bytes:
    """A request that asks to close the connection after it (a WebSocket handshake's ``Connection`` header is the
    ``Upgrade`` one: the router closes it after refusing it)."""
    if not any(h.startswith(b"Connection:") for h in headers):
        headers += (b"Connection: close",)
    return b"%s %s HTTP/1.1\r\nHost: router\r\n%s\r\n" % (method, target, b"".join(h + b"\r\n" for h in headers))


WEBSOCKET = (b"Connection: Upgrade", b"Upgrade: websocket", b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
             b"Sec-WebSocket-Version: 13")


@pytest.mark.anyio
async def test_hostile_targets_get_openai_errors_and_reach_no_other_route_of_the_endpoint(tmp_path: Path) -> None:
    async with echo_upstream() as upstream, routed(tmp_path / "router.log", upstream.url) as router:
        refused = {
            get(b"/v1/../pause", b"Content-Length: 0", method=b"POST"): 404,
            get(b"/v1/%2e%2e/server_info"): 404,
            get(b"/tokenize/../../pause", method=b"POST"): 404,
            get(b"/v1/models#fragment"): 400,
            get(b"/v1/models", method=b"CONNECT"): 405,
            get(b"/v1/models", *WEBSOCKET): 400,
            get(b"/elsewhere", *WEBSOCKET): 404,
        }
        for request, status in refused.items():
            got, body = await exchange(router.port, request)
            assert got == status, (request, got, body)
            assert set(orjson.loads(body)["error"]) == ERROR_KEYS, body
        assert upstream.seen == []  # none of them reached the endpoint

        got, body = await exchange(router.port, get(b"http://evil.example/v1/models?x=1"))
        assert got == 200, body
        assert orjson.loads(body)["target"] == "/v1/models?x=1"
        assert await stop(router) == 0
    assert "Traceback" not in router.log()
