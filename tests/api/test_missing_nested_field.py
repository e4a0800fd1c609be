"""A required field missing inside an object is a 400 whose ``param`` names that field (``messages[0].role``), as
OpenAI names it, not the object that lacks it (``messages[0]``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import running

pytestmark = pytest.mark.anyio

USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [USER, {"content": "no role"}]}, "messages[1].role"),
    ({"messages": [USER], "tools": [{"type": "function"}]}, "tools[0].function"),
    ({"messages": [USER], "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ({}, "messages"),
])
async def test_the_missing_field_is_named(body: dict[str, Any], param: str) -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/chat/completions", json={**body, "max_tokens": 1})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
