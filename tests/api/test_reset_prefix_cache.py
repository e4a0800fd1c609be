"""``POST /reset_prefix_cache``, vLLM's development route: served only in dev mode (``VLLM_SERVER_DEV_MODE=1``,
``create_app(server_dev_mode=True)``), a 404 otherwise; ``{"success": true}`` once every managed rank dropped its
prefix cache, ``{"success": false}`` when a request in flight holds KV blocks, unless ``reset_running_requests``;
the query's booleans read as vLLM's; the API key guards it like the other control routes."""

from __future__ import annotations

from functools import partial

import anyio
import pytest

from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running

pytestmark = pytest.mark.anyio

KEY = "sk-test-key"
PROMPT = "a prompt long enough to fill a few blocks of the fake's prefix cache " * 2


async def cached_tokens(srv) -> int:
    r = await srv.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


async def test_a_reset_drops_the_cached_prompts_and_answers_success_in_dev_mode_only() -> None:
    async with running(enable_prompt_tokens_details=True) as plain:
        r = await plain.http.post("/reset_prefix_cache")
        doc = (await plain.http.get("/openapi.json")).json()
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    assert "/reset_prefix_cache" not in doc["paths"] and not plain.fake.utility_calls
    async with running(server_dev_mode=True, enable_prompt_tokens_details=True) as srv:
        assert [await cached_tokens(srv) for _ in range(2)][1] > 0
        r = await srv.http.post("/reset_prefix_cache")
        assert r.status_code == 200 and r.json() == {"success": True}
        assert await cached_tokens(srv) == 0  # the same prompt starts cold
        get = await srv.http.get("/reset_prefix_cache")
    assert get.status_code == 405
    assert [(m, kw) for m, _, kw in srv.fake.utility_calls] == [
        ("reset_prefix_cache", {"reset_running_requests": False})]


async def test_a_request_in_flight_makes_it_fail_unless_the_running_requests_are_reset() -> None:
    fake = FakeEngineClient(token_delay_s=0.05)
    async with running(fake, server_dev_mode=True) as srv, anyio.create_task_group() as tg:
        tg.start_soon(partial(srv.http.post, "/v1/completions", json={"prompt": PROMPT, "max_tokens": 100}))
        with anyio.fail_after(10):
            await fake.wait_until(lambda: fake.num_active == 1)
        refused = await srv.http.post("/reset_prefix_cache")
        forced = await srv.http.post("/reset_prefix_cache", params={"reset_running_requests": "True",
                                                                     "reset_external": "0"})
        tg.cancel_scope.cancel()
    assert refused.status_code == forced.status_code == 200
    assert (refused.json(), forced.json()) == ({"success": False}, {"success": True})
    assert [kw for _, _, kw in fake.utility_calls] == [{"reset_running_requests": False},
                                                       {"reset_running_requests": True}]


@pytest.mark.parametrize("query", [{"reset_running_requests": "maybe"}, {"reset_external": ""},
                                   {"reset_external": "2"}])
async def test_a_query_value_that_is_no_boolean_is_a_400_naming_it(query: dict[str, str]) -> None:
    async with running(server_dev_mode=True) as srv:
        r = await srv.http.post("/reset_prefix_cache", params=query)
    assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(query))
    assert not srv.fake.utility_calls


async def test_the_api_key_guards_it() -> None:
    async with running(server_dev_mode=True, api_key=KEY) as srv:
        denied = await srv.http.post("/reset_prefix_cache")
        allowed = await srv.http.post("/reset_prefix_cache", headers={"Authorization": f"Bearer {KEY}"})
    assert denied.status_code == 401 and allowed.json() == {"success": True}
    assert len(srv.fake.utility_calls) == 1


async def test_the_openapi_document_describes_it_as_a_control_route_with_its_query() -> None:
    async with running(server_dev_mode=True) as srv:
        op = (await srv.http.get("/openapi.json")).json()["paths"]["/reset_prefix_cache"]["post"]
    assert op["tags"] == ["control"] and "requestBody" not in op
    assert [(p["name"], p["schema"]) for p in op["parameters"]] == [
        ("reset_running_requests", {"type": "boolean"}), ("reset_external", {"type": "boolean"})]


async def test_a_shutting_down_server_answers_503() -> None:
    async with running(server_dev_mode=True) as srv:
        srv.fake.shutting_down = True
        r = await srv.http.post("/reset_prefix_cache")
    assert r.status_code == 503
