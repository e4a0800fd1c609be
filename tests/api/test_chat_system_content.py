"""A system message reaches an "openai" chat template in the shape that template shows it in.

Templates that take the system prompt out of ``messages[0]`` print it as a string: Llama 3.2 Vision's trims
it (a list of parts printed as its Python repr), Gemma 3's and Mistral Small 3.1's read only the first part
when it is not a string. So the system content is a string (its text parts joined with a newline) for every
template that shows a string system message, whether the client sent a string or parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncdp.testing import FakeEngineClient
from asyncdp.testing.tokenizer import byte_tokenizer
from tests.api.conftest import running

pytestmark = pytest.mark.anyio

TEMPLATES = Path(__file__).parent / "chat_templates"
NO_SYSTEM_ROLE = {"gemma", "mixtral"}
PARTS = [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the rendering does not depend on the backend


async def prompt(name: str, system: Any) -> str:
    tok = byte_tokenizer()
    tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    async with running(FakeEngineClient(tokenizer=tok)) as srv:
        r = await srv.http.post("/tokenize", json={"messages": [{"role": "system", "content": system},
                                                                {"role": "user", "content": "Hello"}]})
    assert r.status_code == 200, r.text
    return str(tok.decode(r.json()["tokens"]))


@pytest.mark.parametrize("system", ["Be brief.", [{"type": "text", "text": "Be brief."}]])
async def test_llama_3_2_vision_prints_the_system_prompt_itself(system: Any) -> None:
    text = await prompt("llama3_2_vision", system)
    assert "Today Date: " in text
    assert text.split("\n\n", 2)[2].startswith("Be brief.<|eot_id|>"), text


@pytest.mark.parametrize("name", sorted(p.stem for p in TEMPLATES.glob("*.jinja") if p.stem not in NO_SYSTEM_ROLE))
async def test_every_text_part_of_a_system_message_shows_once(name: str) -> None:
    text = await prompt(name, PARTS)
    assert text.count("Be brief.") == 1 and text.count("Be kind.") == 1, text
    assert "'text'" not in text, text
