"""``allowed_token_ids`` and ``bad_words`` through the official ``openai`` client (``extra_body``) against
``asyncdp serve builtin:tiny-dense`` with the torch executor: the API server tokenizes the words, the params cross
the link to the engine process, and its sampler masks the tokens.

The built-in model's tokenizer is byte-level, so a character is a token: restricted to "a", "b", "c", sampled at
temperature 1 with ``n`` > 1, every generated character is one of them; banning "ab" and "c" too leaves only texts
of the form ``b*a*``. With logprobs (raw, as vLLM reports them) and with a grammar on top, the same holds. Bad
values are OpenAI-style 400s naming the parameter.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator

import anyio
import openai
import pytest

from tests.e2e.conftest import Server, serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MODEL = "builtin:tiny-dense"
ABC = [ord(c) for c in "abc"]
CHAT = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve(tmp_path_factory.mktemp("token-filters")) as running:
        yield running


async def test_every_generated_id_is_allowed_and_no_bad_word_appears(server: Server) -> None:
    with anyio.fail_after(60):
        async with server.openai() as client:
            allowed = await client.completions.create(
                model=MODEL, prompt="Hello", max_tokens=24, temperature=1.0, n=3, seed=7, logprobs=2,
                extra_body={"allowed_token_ids": ABC, "ignore_eos": True})
            banned = await client.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=24, temperature=1.0, n=3, seed=8,  # type: ignore[arg-type]
                extra_body={"allowed_token_ids": ABC, "bad_words": ["ab", "c"]})
            streamed = await client.completions.create(
                model=MODEL, prompt="Hi", max_tokens=16, temperature=1.0, stream=True,
                extra_body={"allowed_token_ids": ABC, "bad_words": ["b"]})
            text = "".join([chunk.choices[0].text async for chunk in streamed])
    assert len(allowed.choices) == 3
    for choice in allowed.choices:
        assert len(choice.text) == 24 and set(choice.text) <= set("abc"), choice.text
        assert choice.logprobs is not None and choice.logprobs.tokens == list(choice.text)
    assert len({c.text for c in allowed.choices}) > 1  # sampled, not one forced path
    assert len(banned.choices) == 3
    for chat_choice in banned.choices:
        content = chat_choice.message.content or ""
        assert len(content) == 24 and re.fullmatch("b*a*", content), content
    assert len(text) == 16 and set(text) <= {"a", "c"}, text


@pytest.mark.skipif(importlib.util.find_spec("llguidance") is None, reason="needs llguidance")
async def test_a_grammar_and_the_filters_combine(server: Server) -> None:
    with anyio.fail_after(60):
        async with server.openai() as client:
            answer = await client.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=12, temperature=1.0, n=2,  # type: ignore[arg-type]
                extra_body={"guided_regex": "[a-d]+", "allowed_token_ids": [*ABC, ord("z")], "bad_words": ["b"]})
    for choice in answer.choices:
        assert choice.message.content and set(choice.message.content) <= {"a", "c"}, choice.message.content


@pytest.mark.parametrize(("name", "value"), [("allowed_token_ids", []), ("allowed_token_ids", [10**6]),
                                             ("bad_words", [""])])
async def test_bad_values_are_400_naming_the_parameter(server: Server, name: str, value: object) -> None:
    with anyio.fail_after(30):
        async with server.openai() as client:
            with pytest.raises(openai.BadRequestError) as err:
                await client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, extra_body={name: value})
    assert err.value.status_code == 400 and isinstance(err.value.body, dict)
    assert err.value.body["param"] == name
