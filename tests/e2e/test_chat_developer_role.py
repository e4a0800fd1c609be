"""``asyncdp serve --chat-template`` Mistral Small 3.1's template (which raised on any role but system, user and
assistant) through the official ``openai`` client: a ``developer`` message is its system prompt, the startup log
says so, and careless template kwargs and tool calls are OpenAI-style 400s naming the field at fault."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TEMPLATE = Path(__file__).resolve().parents[1] / "api" / "chat_templates" / "mistral_small_3_1.jinja"
MODEL = "builtin:tiny-dense"
USER = {"role": "user", "content": "hi"}


async def test_developer_messages_and_careless_requests(tmp_path: Path) -> None:
    with serve(tmp_path, "--chat-template", str(TEMPLATE), model=MODEL) as server:
        async with server.openai() as client:
            answer = await client.chat.completions.create(
                model=MODEL, max_tokens=2, messages=[{"role": "developer", "content": "Be brief."}, USER])
            assert answer.choices[0].finish_reason in ("length", "stop")
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model=MODEL, max_tokens=2, messages=[USER],
                                                     extra_body={"chat_template_kwargs": {"strftime_now": "x"}})
            assert caught.value.body["param"] == "chat_template_kwargs"  # type: ignore[index]
        bad_call: list[dict[str, Any]] = [USER, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": 7, "arguments": "{}"}}]}]
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10.0) as http:
            r = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": bad_call, "max_tokens": 2})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "messages[1].tool_calls[0].function.name"
        assert "developer messages given as system" in server.log()
