"""An endpoint that dies mid-answer (its connection reset, or closed before the response's end), in-process: the
router's app in front of endpoints that are an httpx transport (tests/router/test_silent_endpoint.py's
:class:`Cluster`), whose response body raises httpx's error after some chunks, as httpx does when the endpoint's
process is killed. A stream of events cut at an event boundary ends with an error event (502, naming the endpoint)
and ``data: [DONE]``; anything else stays cut off (no end of body), so that no client reads a truncated answer as
whole. tests/router/test_route_killed_endpoint_e2e.py does it with a real endpoint killed with SIGKILL."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
import trio

from tests.router.test_silent_endpoint import EVENT, SSE, Cluster, Handler, echo

pytestmark = pytest.mark.trio

A, B = "http://a:1", "http://b:2"
PEER_CLOSED = "peer closed connection without sending complete message body (incomplete chunked read)"


def dying(*chunks: bytes, headers: dict[str, str] | None = None,
          error: type[httpx.TransportError] = httpx.RemoteProtocolError) -> Handler:
    """A response of ``chunks`` (an SSE stream unless ``headers`` say otherwise), then the endpoint dies."""
    async def endpoint(request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk
            raise error(PEER_CLOSED if error is httpx.RemoteProtocolError else "[Errno 104] Connection reset by peer")

        return httpx.Response(200, headers=SSE if headers is None else headers, content=body())

    return endpoint


@pytest.mark.parametrize("error", [httpx.RemoteProtocolError, httpx.ReadError])
async def test_a_stream_cut_at_an_event_boundary_ends_with_an_error_event_and_done(
        autojump_clock: trio.testing.MockClock, error: type[httpx.TransportError]) -> None:
    cluster = Cluster({A: dying(EVENT, EVENT, error=error), B: echo})
    status, body, ended, _took = await cluster.call(stream=True)
    assert status == 200 and ended and body.startswith(EVENT + EVENT) and body.endswith(b"data: [DONE]\n\n")
    event, done, rest = body[len(EVENT + EVENT):].split(b"\n\n")
    assert done == b"data: [DONE]" and rest == b""
    error_json = orjson.loads(event.removeprefix(b"data: "))["error"]
    assert set(error_json) == {"message", "type", "param", "code"}
    assert error_json["code"] == 502 and error_json["type"] == "BadGateway"
    assert error_json["message"].startswith(f"the endpoint {A} failed mid-answer ({error.__name__}: ")
    assert cluster.endpoints.calls == [A]  # never sent again: it may have run


async def test_a_stream_that_dies_before_its_first_event_ends_with_the_error_event(
        autojump_clock: trio.testing.MockClock) -> None:
    cluster = Cluster({A: dying(), B: echo})
    status, body, ended, _took = await cluster.call(stream=True)
    assert status == 200 and ended and body.startswith(b'data: {"error":') and body.endswith(b"data: [DONE]\n\n")


async def test_a_stream_cut_inside_an_event_stays_cut_off(autojump_clock: trio.testing.MockClock) -> None:
    cluster = Cluster({A: dying(EVENT, EVENT[:9]), B: echo})
    status, body, ended, _took = await cluster.call(stream=True)
    assert status == 200 and body == EVENT + EVENT[:9] and not ended


async def test_a_compressed_stream_stays_cut_off(autojump_clock: trio.testing.MockClock) -> None:
    """Nothing can be added to a compressed body: an event would not decode."""
    cluster = Cluster({A: dying(b"\x1f\x8b", headers={**SSE, "Content-Encoding": "gzip"}), B: echo})
    status, body, ended, _took = await cluster.call(stream=True)
    assert status == 200 and body == b"\x1f\x8b" and not ended


async def test_a_response_that_is_not_a_stream_of_events_stays_cut_off(
        autojump_clock: trio.testing.MockClock) -> None:
    """Half a JSON document: the client must see it incomplete (its connection closed without the end), not
    read an answer made up of the part it got and an error."""
    cluster = Cluster({A: dying(b'{"choices": [{"text": "Once', headers={"Content-Type": "application/json"}),
                       B: echo})
    status, body, ended, _took = await cluster.call()
    assert status == 200 and body == b'{"choices": [{"text": "Once' and not ended
