"""Cross-origin requests as vLLM answers them (asyncdp.api.cors): by default any origin may call the API; a
narrower --allowed-origins/--allowed-methods/--allowed-headers refuses the rest at the preflight."""

from __future__ import annotations

import pytest

from asyncdp.api.cors import Cors
from tests.api.conftest import running

pytestmark = pytest.mark.anyio

PREFLIGHT = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "content-type, authorization"}


async def test_by_default_any_origin_gets_a_preflight_and_every_response_is_marked_even_behind_an_api_key() -> None:
    async with running(api_key="k") as srv:
        pre = await srv.http.options("/v1/chat/completions", headers=PREFLIGHT)
        ok = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1},
                                 headers={"Origin": "https://app.example", "Authorization": "Bearer k"})
        denied = await srv.http.post("/v1/completions", json={"prompt": "a"}, headers={"Origin": "https://x.example"})
        same_origin = await srv.http.get("/health")
    assert pre.status_code == 200  # answered before the API-key check: a browser sends no key with it
    assert pre.headers["Access-Control-Allow-Origin"] == "*"
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    assert pre.headers["Access-Control-Allow-Headers"] == "content-type, authorization"
    assert int(pre.headers["Access-Control-Max-Age"]) > 0
    assert ok.status_code == 200 and ok.headers["Access-Control-Allow-Origin"] == "*"
    assert denied.status_code == 401 and denied.headers["Access-Control-Allow-Origin"] == "*"  # the page can read why
    assert "Access-Control-Allow-Origin" not in same_origin.headers  # no Origin, no CORS headers


async def test_a_narrower_policy_echoes_an_allowed_origin_and_refuses_the_rest_with_an_openai_error() -> None:
    cors = Cors(origins=("https://app.example",), methods=("GET", "POST"), headers=("content-type",),
                credentials=True)
    async with running(cors=cors) as srv:
        pre = await srv.http.options("/v1/completions", headers={**PREFLIGHT, "Access-Control-Request-Headers":
                                                                 "Content-Type"})
        bad_origin = await srv.http.options("/v1/completions", headers={**PREFLIGHT, "Origin": "https://evil.example"})
        bad_method = await srv.http.options("/v1/completions", headers={**PREFLIGHT,
                                                                        "Access-Control-Request-Method": "DELETE"})
        bad_header = await srv.http.options("/v1/completions", headers=PREFLIGHT)  # authorization is not allowed
        ok = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1},
                                 headers={"Origin": "https://app.example"})
        other = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1},
                                    headers={"Origin": "https://evil.example"})
    assert pre.status_code == 200 and pre.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert pre.headers["Access-Control-Allow-Credentials"] == "true" and pre.headers["Vary"] == "Origin"
    assert pre.headers["Access-Control-Allow-Methods"] == "GET, POST"
    for r, word in ((bad_origin, "origin"), (bad_method, "DELETE"), (bad_header, "authorization")):
        assert r.status_code == 400 and word in r.json()["error"]["message"], r.text
    assert "Access-Control-Allow-Origin" not in bad_origin.headers
    assert ok.headers["Access-Control-Allow-Origin"] == "https://app.example" and "Origin" in ok.headers["Vary"]
    assert ok.headers["Access-Control-Allow-Credentials"] == "true"
    assert other.status_code == 200 and "Access-Control-Allow-Origin" not in other.headers  # the browser hides it


async def test_without_a_cors_policy_no_response_carries_cors_headers() -> None:
    async with running(cors=None) as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1},
                                headers={"Origin": "https://app.example"})
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers
