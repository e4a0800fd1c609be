"""Completions' ``text_offset`` is each token's character offset in the choice's text, from the tokens' bytes:
the same streamed or not (the stream's cursor used to move only by the text sent, so a token whose text a stop
string or a partial character held back shifted every later offset), and a token inside a multi-byte character
has that character's offset."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncdp.api.openai_format import completion_logprobs
from asyncdp.api.token_bytes import TextOffsets
from asyncdp.messages import Logprob, TokenLogprobs
from asyncdp.testing.tokenizer import byte_tokenizer
from tests.api.conftest import running, sse_events

TEXT = "abé€f"  # 1 + 1 + 2 + 3 + 1 bytes: one token per byte with the byte tokenizer


def _lps(ids: list[int]) -> list[TokenLogprobs]:
    return [TokenLogprobs(token_id=t, logprob=-1.0, top=(Logprob(token_id=t, logprob=-1.0),)) for t in ids]


def test_offsets_are_character_offsets_in_the_text() -> None:
    tok = byte_tokenizer()
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert len(ids) == 8
    offsets = completion_logprobs(tok, _lps(ids))["text_offset"]
    assert offsets == [0, 1, 2, 2, 3, 3, 3, 4]  # é's two bytes at 2, €'s three at 3, f at 4 = TEXT.index("f")
    assert offsets[-1] == TEXT.index("f")


@pytest.mark.parametrize("cuts", [[1, 2, 3, 4, 5, 6, 7], [3], [4, 5], [2, 7]])
def test_offsets_do_not_depend_on_how_the_tokens_are_chunked(cuts: list[int]) -> None:
    tok = byte_tokenizer()
    ids = tok.encode(TEXT, add_special_tokens=False)
    cursor = TextOffsets(tok)
    streamed: list[int] = []
    for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True):
        streamed += completion_logprobs(tok, _lps(ids[a:b]), cursor)["text_offset"]
    assert streamed == completion_logprobs(tok, _lps(ids))["text_offset"]


def _offsets(doc: dict[str, Any]) -> tuple[str, list[int]]:
    choice = doc["choices"][0]
    return choice["text"], choice["logprobs"]["text_offset"]


@pytest.mark.anyio
@pytest.mark.parametrize("extra", [{"stop": ["zz"]}, {"stop": ["zzzz"], "echo": True}, {}])
async def test_streamed_offsets_equal_the_whole_answers(extra: dict) -> None:
    # "zz" never matches, but the fake (as the engine's detokenizer) holds back its length - 1 characters
    body = {"prompt": "hi", "max_tokens": 6, "logprobs": 0, "seed": 3, **extra}
    async with running() as srv:
        whole = (await srv.http.post("/v1/completions", json=body)).json()
        r = await srv.http.post("/v1/completions", json={**body, "stream": True})
    text, offsets = _offsets(whole)
    streamed_text, streamed = "", []
    for event in sse_events(r.text):
        if event != "[DONE]":
            part, part_offsets = _offsets(json.loads(event))
            streamed_text += part
            streamed += part_offsets
    assert streamed_text == text
    assert streamed == offsets
    first = 2 if extra.get("echo") else 0  # after the echoed prompt "hi"
    assert offsets[first:] == list(range(first, first + 6))
