"""vLLM's ``guided_whitespace_pattern`` through the official ``openai`` client (``extra_body``) against
``asyncdp serve builtin:tiny-dense``: the whitespace allowed between a JSON constraint's tokens. With ``""`` the
JSON comes back compact, whole and streamed; a pattern the grammar library refuses is a 400 naming it."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator

import anyio
import openai
import pytest

from tests.e2e.conftest import Server, serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio,
              pytest.mark.skipif(importlib.util.find_spec("llguidance") is None, reason="needs llguidance")]

MODEL = "builtin:tiny-dense"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "array", "items": {
    "type": "boolean"}, "maxItems": 3}}, "required": ["n", "ok"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve(tmp_path_factory.mktemp("whitespace-pattern")) as running:
        yield running


async def test_an_empty_pattern_gives_compact_json(server: Server) -> None:
    with anyio.fail_after(60):
        async with server.openai() as client:
            whole = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "JSON please."}], max_tokens=64,
                temperature=1.0, n=3, seed=5, response_format=FORMAT,  # type: ignore[arg-type]
                extra_body={"guided_whitespace_pattern": ""})
            streamed = await client.completions.create(
                model=MODEL, prompt="JSON: ", max_tokens=64, temperature=1.0, seed=6, stream=True,
                extra_body={"guided_json": SCHEMA, "guided_whitespace_pattern": ""})
            texts = [c.message.content or "" for c in whole.choices]
            texts.append("".join([chunk.choices[0].text async for chunk in streamed]))
    for text in texts:  # no strings in the schema: any whitespace would lie between tokens
        assert json.dumps(json.loads(text), separators=(",", ":")) == text, text


async def test_a_pattern_the_library_refuses_is_a_400_naming_it(server: Server) -> None:
    with anyio.fail_after(30):
        async with server.openai() as client:
            with pytest.raises(openai.BadRequestError) as err:
                await client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, extra_body={
                    "guided_json": SCHEMA, "guided_whitespace_pattern": "[ "})
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "guided_whitespace_pattern"
