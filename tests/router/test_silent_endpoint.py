"""Requests in flight to an endpoint that stops answering (asyncdp.router.silence), in-process and in virtual time
(trio's ``MockClock`` with autojump): the router's real :class:`Poller` polls endpoints that are an httpx transport;
an endpoint "freezes" when a request reaches it: its ``GET /load`` and that request hang from then on, as a
stopped process's would. What is checked: who answers, what the client gets, that the frozen endpoint's request
was cancelled (its connection closed), and when, on the virtual clock. tests/router/test_route_frozen_endpoint_e2e.py
does the same with real processes and SIGSTOP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import orjson
import pytest
import trio

from asyncdp.router.poller import Poller
from asyncdp.router.proxy import RouterApp
from tests.router.test_streamed_body_failover import IDLE, Endpoints, Handler, echo

pytestmark = pytest.mark.trio

POLL_TIMEOUT_S = 0.5
POLL_INTERVAL_S = 0.05
WITHIN_S = 3 * (POLL_TIMEOUT_S + POLL_INTERVAL_S)  # the bound on ending a request there (silence.py)
EVENT = b'data: {"choices": [{"text": "x"}]}\n\n'
SSE = {"Content-Type": "text/event-stream"}


class Cluster:
    """Endpoints ``urls`` behind a router app and its running poller; ``frozen`` ones hang on everything."""

    def __init__(self, handlers: dict[str, Handler], *, usable: tuple[str, ...] | None = None) -> None:
        self.frozen: set[str] = set()
        self.closed: list[str] = []  # endpoints whose hanging request was cancelled (the router closed it)
        self.poller = Poller(list(handlers), poll_interval_s=POLL_INTERVAL_S, stale_after_s=1e9,
                             poll_timeout_s=POLL_TIMEOUT_S)
        for ep in self.poller.endpoints:
            if usable is None or ep.url in usable:
                ep.observe({"seq": 1, "ranks": [IDLE]}, anyio.current_time())
        self.endpoints = Endpoints(handlers)
        self.app = RouterApp(self.poller, httpx.AsyncClient(transport=self.endpoints), connect_timeout_s=1.0)
        self.refusing: set[str] = set()  # their /load is refused (an endpoint that drains closes its port)

    def freezing(self, url: str) -> Handler:
        """An endpoint that freezes once a request reaches it."""
        async def endpoint(request: httpx.Request) -> httpx.Response:
            self.frozen.add(url)
            await self.hang(url)
            raise AssertionError("unreachable")

        return endpoint

    async def hang(self, url: str) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            self.closed.append(url)

    async def poll(self, request: httpx.Request) -> httpx.Response:
        url = f"{request.url.scheme}://{request.url.netloc.decode()}"
        if url in self.refusing:
            raise httpx.ConnectError("connection refused", request=request)
        if url in self.frozen:
            await anyio.sleep_forever()
        return httpx.Response(200, json={"seq": 1, "ranks": [IDLE]})

    async def call(self, stream: bool = False) -> tuple[int, bytes, bool, float]:
        """One request through the app while the poller runs: its status, body, whether the body ended (its
        last event said so), and the virtual seconds it took."""
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if not received:
                received.append(True)
                return {"type": "http.request", "body": orjson.dumps({"stream": stream}), "more_body": False}
            await anyio.sleep_forever()  # the client stays
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        received: list[bool] = []
        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "raw_path": b"/v1/completions",
                 "query_string": b"", "headers": [(b"content-type", b"application/json")],
                 "client": ("127.0.0.1", 1234), "scheme": "http"}
        async with httpx.AsyncClient(transport=httpx.MockTransport(self.poll)) as poll_http, \
                anyio.create_task_group() as tg:
            tg.start_soon(self.poller.run, poll_http)
            start = trio.current_time()
            with anyio.fail_after(60):  # virtual seconds: a request left to hang fails the test
                await self.app(scope, receive, send)
            took = trio.current_time() - start
            tg.cancel_scope.cancel()
        body = b"".join(m.get("body", b"") for m in sent[1:])
        return sent[0]["status"], body, not sent[-1].get("more_body", False), took


def events(*chunks: bytes, gap_s: float = 0.0, then: Any = None) -> Handler:
    """A stream of ``chunks``, ``gap_s`` apart; then ``then()`` (awaited: a hang) or the end."""
    async def endpoint(request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            for i, chunk in enumerate(chunks):
                if i:
                    await anyio.sleep(gap_s)
                yield chunk
            if then is not None:
                await then()

        return httpx.Response(200, headers=SSE, content=body())

    return endpoint


A, B, C = "http://a:1", "http://b:2", "http://c:3"


async def test_a_request_whose_endpoint_freezes_before_answering_goes_once_to_the_next(
        autojump_clock: trio.testing.MockClock) -> None:
    cluster = Cluster({A: echo, B: echo})
    cluster.endpoints.handlers[A] = cluster.freezing(A)
    status, body, ended, took = await cluster.call()
    assert status == 200 and ended and "bytes" in orjson.loads(body)
    assert cluster.endpoints.calls == [A, B] and cluster.closed == [A] and took <= WITHIN_S
    assert cluster.poller.candidates() == [1]


async def test_a_request_is_sent_again_once_only_then_it_is_a_504(autojump_clock: trio.testing.MockClock) -> None:
    cluster = Cluster({A: echo, B: echo, C: echo})
    for url in (A, B):
        cluster.endpoints.handlers[url] = cluster.freezing(url)
    status, body, ended, took = await cluster.call()
    error = orjson.loads(body)["error"]
    assert status == 504 and ended and error["code"] == 504 and set(error) == {"message", "type", "param", "code"}
    assert f"the endpoint {B} stopped answering" in error["message"]
    assert "sent to another endpoint once already" in error["message"]
    assert cluster.endpoints.calls == [A, B] and cluster.closed == [A, B] and took <= 2 * WITHIN_S


async def test_with_no_other_usable_endpoint_it_is_a_503(autojump_clock: trio.testing.MockClock) -> None:
    cluster = Cluster({A: echo, B: echo}, usable=(A,))
    cluster.refusing.add(B)
    cluster.endpoints.handlers[A] = cluster.freezing(A)
    status, body, ended, took = await cluster.call()
    error = orjson.loads(body)["error"]
    assert status == 503 and ended and error["code"] == 503 and took <= WITHIN_S
    assert error["message"].startswith(f"no endpoint can take the request ({A} stopped answering")
    assert cluster.endpoints.calls == [A] and cluster.closed == [A]


async def test_a_stream_that_started_ends_with_an_error_event_and_done(
        autojump_clock: trio.testing.MockClock) -> None:
    cluster = Cluster({A: echo, B: echo})

    async def freeze() -> None:
        cluster.frozen.add(A)
        await cluster.hang(A)

    cluster.endpoints.handlers[A] = events(EVENT, EVENT, then=freeze)
    status, body, ended, took = await cluster.call(stream=True)
    assert status == 200 and ended and body.startswith(EVENT + EVENT) and body.endswith(b"data: [DONE]\n\n")
    error = orjson.loads(body[len(EVENT + EVENT):].split(b"\n\n")[0].removeprefix(b"data: "))["error"]
    assert error["code"] == 504 and f"the endpoint {A} stopped answering" in error["message"]
    assert cluster.endpoints.calls == [A] and cluster.closed == [A] and took <= WITHIN_S


async def test_a_stream_cut_inside_an_event_ends_without_its_end(autojump_clock: trio.testing.MockClock) -> None:
    cluster = Cluster({A: echo, B: echo})

    async def freeze() -> None:
        cluster.frozen.add(A)
        await cluster.hang(A)

    cluster.endpoints.handlers[A] = events(EVENT, EVENT[:9], then=freeze)  # half an event: nothing can follow it
    status, body, ended, _took = await cluster.call(stream=True)
    assert status == 200 and body == EVENT + EVENT[:9] and not ended and cluster.closed == [A]


async def test_a_stream_that_keeps_coming_is_not_cut_while_its_load_hangs(
        autojump_clock: trio.testing.MockClock) -> None:
    """A live endpoint whose /load is slow: the stream's events keep arriving closer than the poll timeout, so each
    poll that times out finds something heard since it started."""
    cluster = Cluster({A: echo, B: echo})
    cluster.frozen.add(A)  # its /load only
    cluster.endpoints.handlers[A] = events(*[EVENT] * 40, gap_s=POLL_TIMEOUT_S / 5)
    status, body, ended, took = await cluster.call(stream=True)
    assert status == 200 and ended and body == EVENT * 40 and cluster.closed == []
    assert took == pytest.approx(39 * POLL_TIMEOUT_S / 5) and cluster.poller.candidates() == [1]


async def test_a_refused_poll_does_not_end_the_requests_in_flight(autojump_clock: trio.testing.MockClock) -> None:
    """An endpoint that drains closes its port (its polls are refused) but finishes what it has, however slowly."""
    cluster = Cluster({A: echo, B: echo})
    cluster.refusing.add(A)
    cluster.endpoints.handlers[A] = events(EVENT, EVENT, gap_s=10 * POLL_TIMEOUT_S)
    status, body, ended, took = await cluster.call(stream=True)
    assert status == 200 and ended and body == EVENT * 2 and took == pytest.approx(10 * POLL_TIMEOUT_S)


async def test_one_stall_of_the_endpoint_ends_nothing(autojump_clock: trio.testing.MockClock) -> None:
    """One poll unanswered (the endpoint's event loop stalled a moment), the next answered: its requests in flight
    stay there, however long they take without a byte, and are not sent elsewhere to run twice."""
    cluster = Cluster({A: echo, B: echo})
    stalled: list[float] = []

    async def poll(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a" and not stalled:
            stalled.append(trio.current_time())
            await anyio.sleep(2 * POLL_TIMEOUT_S)  # this one poll goes unanswered, then the endpoint answers
        return httpx.Response(200, json={"seq": 1, "ranks": [IDLE]})

    cluster.poll = poll  # type: ignore[method-assign]

    async def slow(request: httpx.Request) -> httpx.Response:
        await anyio.sleep(10 * POLL_TIMEOUT_S)  # a long completion: nothing is sent until it ends
        return await echo(request)

    cluster.endpoints.handlers[A] = slow
    status, body, ended, took = await cluster.call()
    assert stalled and status == 200 and ended and "bytes" in orjson.loads(body)
    assert cluster.endpoints.calls == [A] and cluster.closed == [] and took == pytest.approx(10 * POLL_TIMEOUT_S)
