"""SSE payloads never contain a raw line separator, so line readers that split like ``str.splitlines``
(httpx's ``aiter_lines``, used by guidellm and the openai client) see whole events."""

from __future__ import annotations

import orjson
import pytest

from asyncdp.api.sse import sse
from tests.api.conftest import running

SEPARATORS = "\u0085\u2028\u2029"


def test_sse_escapes_every_line_separator_and_keeps_the_value() -> None:
    obj = {"text": f"a{SEPARATORS}b\r\n\x0b\x0c\x1c\x1d\x1ec"}
    event = sse(obj)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    line = event[len(b"data: "):-2].decode()
    assert line.splitlines() == [line]
    assert orjson.loads(line) == obj


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_streamed_text_with_line_separators_parses_line_by_line(path: str) -> None:
    text = f"x{SEPARATORS}y"
    body = ({"prompt": text, "echo": True} if path == "/v1/completions" else
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}], "echo": True,
             "continue_final_message": True})
    async with running() as srv, srv.http.stream("POST", path, json={**body, "max_tokens": 3, "stream": True}) as r:
        lines = [line async for line in r.aiter_lines()]
    events = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert [line for line in lines if line and not line.startswith("data: ")] == []
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    pieces = [c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content") or "" for c in chunks]
    assert "".join(pieces).startswith(text)
