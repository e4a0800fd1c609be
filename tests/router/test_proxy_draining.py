"""An endpoint that is stopping answers every new request 503 "The server is shutting down." before it reads it;
the router sends such a request to the next endpoint (a rolling restart loses nothing), while any other 503 (a
rank that died with the request, no rank up) comes back to the client as it is."""

from __future__ import annotations

import httpx
import pytest

from asyncdp.api.context import DRAINING_MESSAGE
from asyncdp.api.errors import error_body
from tests.router.test_proxy import A, B, app_with, echo, streamed

pytestmark = pytest.mark.anyio


def draining(request: httpx.Request) -> httpx.Response:
    return streamed(503, httpx.Response(503, json=error_body(503, DRAINING_MESSAGE)).content)


def rank_died(request: httpx.Request) -> httpx.Response:
    return streamed(503, httpx.Response(503, json=error_body(503, "engine rank 0 died")).content,
                    headers={"X-Answer": "kept"})


async def test_a_draining_endpoints_503_sends_the_request_to_the_next_endpoint() -> None:
    app, client = app_with({A: draining, B: echo})
    async with client:
        r = await client.post("/v1/completions", json={"prompt": "hi"})
    assert r.status_code == 200 and r.json()["endpoint"] == B and r.json()["body"] == '{"prompt":"hi"}'
    assert app.calls == [A, B]  # type: ignore[attr-defined]
    assert app.poller.candidates() == [1]  # A is out until its next /load answer


async def test_when_every_endpoint_drains_the_answer_is_503_naming_them() -> None:
    app, client = app_with({A: draining, B: draining})
    async with client:
        r = await client.post("/v1/completions", json={})
    assert r.status_code == 503 and app.calls == [A, B]  # type: ignore[attr-defined]
    assert "draining" in r.json()["error"]["message"] and A in r.json()["error"]["message"]


async def test_any_other_503_comes_back_as_it_is_and_is_not_sent_again() -> None:
    app, client = app_with({A: rank_died, B: echo})
    async with client:
        r = await client.post("/v1/completions", json={})
    assert r.status_code == 503 and r.json()["error"]["message"] == "engine rank 0 died"
    assert r.headers["X-Answer"] == "kept" and app.calls == [A]  # type: ignore[attr-defined]
