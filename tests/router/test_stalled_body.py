"""A client that stops sending its body half-way gets a 408 once no part of it came for ``body_idle_timeout_s``
(60 s), instead of holding the request (and, for a body streamed to an endpoint, that endpoint's connection) for
ever; a body that keeps coming, however slowly, goes through. In-process, in virtual time (trio's ``MockClock``
with autojump: the 60 s pass at once); the endpoints are an httpx transport that reads the request body as a
stream, as a real connection does."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import orjson
import pytest
import trio

from asyncdp.router.body import BODY_IDLE_TIMEOUT_S
from asyncdp.router.poller import Poller
from asyncdp.router.proxy import RouterApp
from tests.router.test_streamed_body_failover import IDLE, PART, Endpoints, echo, read_all

A = "http://a:1"


def router(endpoint: Any, *, replay: int) -> tuple[RouterApp, Endpoints]:
    poller = Poller([A], poll_interval_s=0.05, stale_after_s=1e9)  # no poller runs here: the answer stays fresh
    poller.endpoints[0].observe({"seq": 1, "ranks": [IDLE]}, anyio.current_time())
    endpoints = Endpoints({A: endpoint})
    return RouterApp(poller, httpx.AsyncClient(transport=endpoints), connect_timeout_s=1.0, replay_body_bytes=replay,
                     max_body_bytes=10_000), endpoints


class SlowClient:
    """A body of ``parts`` parts, each ``gap_s`` after the previous one; after ``stall_after`` parts, nothing more
    (the client stalls; it is still there)."""

    def __init__(self, parts: int, gap_s: float, stall_after: int | None = None) -> None:
        self.parts, self.gap_s, self.stall_after = parts, gap_s, stall_after
        self.num_read = 0
        self.sent: list[dict[str, Any]] = []
        self.scope = {"type": "http", "method": "POST", "path": "/v1/completions", "raw_path": b"/v1/completions",
                      "query_string": b"", "headers": [(b"content-type", b"application/json")],
                      "client": ("127.0.0.1", 1234), "scheme": "http"}

    async def receive(self) -> dict[str, Any]:
        if self.num_read == self.parts or self.num_read == self.stall_after:
            await anyio.sleep_forever()
        if self.num_read:
            await anyio.sleep(self.gap_s)
        self.num_read += 1
        return {"type": "http.request", "body": PART, "more_body": self.num_read < self.parts}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    async def call(self, app: RouterApp) -> tuple[int, Any, float]:
        """The answer's status and JSON, and the virtual seconds it took."""
        start = trio.current_time()
        with anyio.fail_after(3600):
            await app(self.scope, self.receive, self.send)
        took = trio.current_time() - start
        return self.sent[0]["status"], orjson.loads(b"".join(m.get("body", b"") for m in self.sent[1:])), took


def recording_cuts(cut: list[httpx.Request]) -> Any:
    """An endpoint that reads the body, and records a request whose body ended in an error (the router's, when the
    body stalls) before it answered."""
    async def endpoint(request: httpx.Request) -> httpx.Response:
        try:
            await read_all(request)
        except Exception:
            cut.append(request)
            raise
        return httpx.Response(200)

    return endpoint


@pytest.mark.trio
async def test_a_held_body_that_stalls_is_a_408_after_the_idle_timeout_and_nothing_is_sent(
        autojump_clock: trio.testing.MockClock) -> None:
    app, endpoints = router(echo, replay=1000)
    status, body, took = await SlowClient(5, gap_s=1.0, stall_after=2).call(app)
    assert status == 408 and body["error"]["code"] == 408 and "60 s" in body["error"]["message"]
    assert took == pytest.approx(1.0 + BODY_IDLE_TIMEOUT_S) and endpoints.calls == []


@pytest.mark.trio
async def test_a_streamed_body_that_stalls_is_a_408_and_its_endpoint_sees_the_request_cut_off(
        autojump_clock: trio.testing.MockClock) -> None:
    cut: list[httpx.Request] = []
    app, endpoints = router(recording_cuts(cut), replay=150)  # 2 parts (200 bytes) are over it: streamed
    status, body, took = await SlowClient(10, gap_s=1.0, stall_after=4).call(app)
    assert status == 408 and "no part of its request body" in body["error"]["message"]
    assert took == pytest.approx(3.0 + BODY_IDLE_TIMEOUT_S) and endpoints.calls == [A] and len(cut) == 1
    assert app.poller.endpoints[0].num_inflight == 0 and app.poller.candidates() == [0]  # not the endpoint's fault


@pytest.mark.trio
async def test_a_body_that_keeps_coming_slowly_goes_through_whatever_its_total_time(
        autojump_clock: trio.testing.MockClock) -> None:
    for replay in (10_000, 150):  # held whole, then streamed
        app, _endpoints = router(echo, replay=replay)
        status, body, took = await SlowClient(4, gap_s=BODY_IDLE_TIMEOUT_S - 1).call(app)
        assert status == 200 and body["bytes"] == 4 * len(PART) and took > 2 * BODY_IDLE_TIMEOUT_S
