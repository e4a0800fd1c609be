"""``use_beam_search`` through the official ``openai`` client against ``asyncdp serve builtin:tiny-dense`` (torch
executor): each step is ordinary one-token requests through the DP client, and the answer is ``n`` distinct
beams, best first, with ``usage`` counting the returned beams' tokens; chat streams the same beams at the end, and
completions refuses ``stream`` (as vLLM's routes do)."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import openai
import pytest

from tests.e2e.conftest import Server, serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MODEL = "builtin:tiny-dense"
CHAT = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve(tmp_path_factory.mktemp("beam-search")) as running:
        yield running


async def test_beam_search_answers_n_distinct_beams_best_first(server: Server) -> None:
    with anyio.fail_after(120):
        async with server.openai() as client:
            plain = await client.completions.create(model=MODEL, prompt="Hello", max_tokens=1)
            beams = await client.completions.create(
                model=MODEL, prompt="Hello", n=3, max_tokens=6, logprobs=1,
                extra_body={"use_beam_search": True, "ignore_eos": True, "length_penalty": 0.5})
            chat = await client.chat.completions.create(
                model=MODEL, messages=CHAT, n=2, max_tokens=5,  # type: ignore[arg-type]
                extra_body={"use_beam_search": True, "ignore_eos": True})
    assert [c.index for c in beams.choices] == [0, 1, 2]
    assert len({c.text for c in beams.choices}) == 3
    # every beam runs to max_tokens (ignore_eos): same length, so the score orders by cumulative logprob
    sums = [sum(c.logprobs.token_logprobs) for c in beams.choices]  # type: ignore[arg-type, union-attr]
    assert all(len(c.logprobs.tokens) == 6 for c in beams.choices)  # type: ignore[union-attr]
    assert sums == sorted(sums, reverse=True)
    assert all(c.finish_reason == "length" for c in beams.choices)
    assert beams.usage is not None and plain.usage is not None
    assert beams.usage.prompt_tokens == plain.usage.prompt_tokens and beams.usage.completion_tokens == 18
    assert len(chat.choices) == 2 and chat.choices[0].message.content != chat.choices[1].message.content
    assert chat.usage is not None and chat.usage.completion_tokens == 10


async def test_chat_streams_the_same_beams_at_the_end(server: Server) -> None:
    with anyio.fail_after(120):
        async with server.openai() as client:
            kwargs: dict = {"model": MODEL, "messages": CHAT, "n": 2, "max_tokens": 5,
                            "extra_body": {"use_beam_search": True, "ignore_eos": True}}
            whole = await client.chat.completions.create(**kwargs)
            stream = await client.chat.completions.create(**kwargs, stream=True,
                                                          stream_options={"include_usage": True})
            chunks = [c async for c in stream]
    texts, finish = ["", ""], [None, None]
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finish[c.index] = finish[c.index] or c.finish_reason
    assert texts == [c.message.content for c in whole.choices] and finish == ["length", "length"]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


async def test_completions_beam_search_with_stream_is_a_400_naming_stream(server: Server) -> None:
    async with server.openai() as client:
        with pytest.raises(openai.BadRequestError) as refused:
            await client.completions.create(model=MODEL, prompt="Hello", n=2, stream=True,
                                            extra_body={"use_beam_search": True})
    assert refused.value.body["param"] == "stream"  # type: ignore[index]
