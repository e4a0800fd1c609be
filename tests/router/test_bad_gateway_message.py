"""The router's 502 says what failed and why the request was not sent elsewhere, in OpenAI's error shape: a client
(or its operator) reads ``Server disconnected without sending a response`` rather than an exception's name."""

from __future__ import annotations

import httpx
import pytest

from tests.router.test_proxy import A, B, app_with, echo

pytestmark = pytest.mark.anyio


async def test_a_502_names_the_endpoint_the_failure_and_that_the_request_is_not_sent_again() -> None:
    def killed(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)

    app, client = app_with({A: killed, B: echo})
    async with client:
        r = await client.post("/v1/completions", json={})
    error = r.json()["error"]
    assert r.status_code == 502 and error["type"] == "BadGateway" and app.calls == [A]  # type: ignore[attr-defined]
    assert error["message"] == (f"the endpoint {A} failed before answering (RemoteProtocolError: Server disconnected "
                                "without sending a response.); the request is not sent again, as it may have run there")
