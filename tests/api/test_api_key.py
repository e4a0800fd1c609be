"""``--api-key``: every route but the probes wants ``Authorization: Bearer KEY``; a wrong or missing key is a 401
in OpenAI's shape with ``WWW-Authenticate: Bearer``, and nothing reaches the engine client."""

from __future__ import annotations

import pytest

from tests.api.conftest import running

pytestmark = pytest.mark.anyio

KEY = "sk-test-key"
GUARDED = [
    ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 1}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 1}),
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/fake-model", None),
    ("POST", "/tokenize", {"prompt": "a"}),
    ("POST", "/detokenize", {"tokens": [1]}),
    ("GET", "/server_info", None),
    ("POST", "/pause", None),
    ("POST", "/resume", None),
    ("GET", "/is_paused", None),
    ("GET", "/no/such/route", None),
]
OPEN = ["/health", "/ping", "/version", "/metrics", "/load", "/openapi.json"]


@pytest.mark.parametrize(("method", "path", "body"), GUARDED, ids=[f"{m} {p}" for m, p, _ in GUARDED])
@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"bearer {KEY}", KEY, f"Bearer {KEY}x", "Bearer é"])
async def test_a_guarded_route_without_the_right_key_is_a_401_and_reaches_nothing(method, path, body, auth):
    headers = {} if auth is None else {"Authorization": auth.encode("utf-8")}  # (raw bytes: "é" too)
    async with running(api_key=KEY) as srv:
        r = await srv.http.request(method, path, json=body, headers=headers)
        assert r.status_code == 401, r.text
        assert r.headers["WWW-Authenticate"] == "Bearer"
        assert r.json()["error"]["type"] == "AuthenticationError"
        assert not srv.fake.submitted
        assert (await srv.http.get("/is_paused", headers={"Authorization": f"Bearer {KEY}"})).json() == {
            "is_paused": False}


@pytest.mark.parametrize(("method", "path", "body"), GUARDED[:-1], ids=[f"{m} {p}" for m, p, _ in GUARDED[:-1]])
async def test_a_guarded_route_with_the_key_answers_as_without_a_key(method, path, body):
    async with running(api_key=KEY) as keyed, running() as plain:
        with_key = await keyed.http.request(method, path, json=body, headers={"Authorization": f"Bearer {KEY}"})
        without = await plain.http.request(method, path, json=body)
    assert with_key.status_code == without.status_code != 401, (with_key.text, without.text)


@pytest.mark.parametrize("path", OPEN)
async def test_the_probes_and_the_schema_answer_without_a_key(path):
    async with running(api_key=KEY) as srv:
        r = await srv.http.get(path)
    assert r.status_code == 200, r.text
