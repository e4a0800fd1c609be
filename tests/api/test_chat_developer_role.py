"""OpenAI's ``developer`` message is the system prompt of a template without a developer role of its own.

The official client sends ``developer`` for newer models; OpenAI treats it as the system message. A template
that does not know the role dropped it (DeepSeek's, Qwen2.5's), rendered it as a role its model never saw
(ChatML's, Llama's) or raised (Mistral Small 3.1's, Mixtral's). It now reaches such a template as ``system``,
and every system message of that request is merged into one, first (vLLM's renderer does both); a template
that names the role itself gets it as it is.
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
NO_SYSTEM_ROLE = {"gemma", "mixtral"}  # they raise on a system message
USER = {"role": "user", "content": "What is 2+2?"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the rendering does not depend on the backend


def tokenizer(template: str) -> Any:
    tok = byte_tokenizer()
    tok.chat_template = template
    return tok


def fixture(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


async def tokenize(tok: Any, messages: list[dict[str, Any]]) -> tuple[int, Any]:
    async with running(FakeEngineClient(tokenizer=tok)) as srv:
        r = await srv.http.post("/tokenize", json={"messages": messages})
    return r.status_code, r.json()


@pytest.mark.parametrize("name", sorted(p.stem for p in TEMPLATES.glob("*.jinja")))
async def test_a_developer_message_renders_as_the_system_message(name: str) -> None:
    tok = tokenizer(fixture(name))
    as_system = await tokenize(tok, [{"role": "system", "content": "Be brief."}, USER])
    as_developer = await tokenize(tok, [{"role": "developer", "content": "Be brief."}, USER])
    assert as_developer == as_system
    if name in NO_SYSTEM_ROLE:
        assert as_developer[0] == 400 and as_developer[1]["error"]["param"] == "messages"
    else:
        assert as_developer[0] == 200
        assert "Be brief." in tok.decode(as_developer[1]["tokens"])


async def test_the_official_client_gets_an_answer_from_a_template_that_refused_the_role() -> None:
    tok = tokenizer(fixture("mistral_small_3_1"))  # "Only user, system and assistant roles are supported!"
    async with running(FakeEngineClient(tokenizer=tok)) as srv:
        answer = await srv.openai().chat.completions.create(
            model="fake-model", max_tokens=2, messages=[{"role": "developer", "content": "Be brief."}, USER])
        as_system = await srv.http.post("/tokenize", json={"messages": [{"role": "system", "content": "Be brief."},
                                                                        USER]})
    assert answer.usage is not None and answer.usage.prompt_tokens == as_system.json()["count"]


@pytest.mark.parametrize("name", ["qwen2_5", "llama3_2_vision", "mistral_small_3_1", "gemma3"])
async def test_system_and_developer_messages_make_one_system_prompt_in_order(name: str) -> None:
    tok = tokenizer(fixture(name))
    merged = await tokenize(tok, [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]}, USER,
        {"role": "assistant", "content": "4"}, {"role": "developer", "content": "Be kind."}, USER])
    one = await tokenize(tok, [{"role": "system", "content": "Be brief.\n\nAnswer in French.\n\nBe kind."}, USER,
                               {"role": "assistant", "content": "4"}, USER])
    assert merged[0] == 200, merged[1]
    assert merged == one


DEVELOPER_AWARE = ("{% for m in messages %}{% if m.role == 'developer' %}[DEV]{% elif m.role == 'system' %}[SYS]"
                   "{% else %}[{{ m.role }}]{% endif %}{{ m.content }}{% endfor %}")


async def test_a_template_with_a_developer_role_gets_the_message_as_it_is() -> None:
    from asyncdp.api.template_roles import has_developer_role

    assert has_developer_role(DEVELOPER_AWARE)
    assert not has_developer_role(fixture("chatml"))
    tok = tokenizer(DEVELOPER_AWARE)
    status, body = await tokenize(tok, [{"role": "system", "content": "S"}, {"role": "developer", "content": "D"},
                                        USER])
    assert status == 200
    assert tok.decode(body["tokens"]) == "[SYS]S[DEV]D[user]What is 2+2?"
