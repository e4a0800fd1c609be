"""An API server reads its chat template once at startup: one fetch of the source from the tokenizer and one
Jinja parse, shared by the content-format and role detectors (rendering compiles it once in Transformers)."""

from __future__ import annotations

from typing import Any

import pytest

import asyncdp.config.chat_template as chat_template
from asyncdp.api import create_app
from asyncdp.testing import FakeEngineClient
from asyncdp.testing.tokenizer import byte_tokenizer


class CountingTokenizer:
    """A tokenizer that counts the fetches of its template (a render's own fetch, inside the wrapped tokenizer,
    is not counted)."""

    def __init__(self) -> None:
        self.tok = byte_tokenizer()
        self.fetches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tok, name)

    def get_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        self.fetches += 1
        return self.tok.get_chat_template(*args, **kwargs)


@pytest.mark.parametrize("content_format", ["auto", "openai", "string"])
def test_the_template_is_fetched_and_parsed_once_per_api_server(
    monkeypatch: pytest.MonkeyPatch, content_format: str,
) -> None:
    parses = []
    parse = chat_template.PARSER.parse
    monkeypatch.setattr(chat_template.PARSER, "parse", lambda *a, **k: parses.append(1) or parse(*a, **k))
    tok = CountingTokenizer()
    create_app(FakeEngineClient(tokenizer=tok), backend="asyncio", chat_template_content_format=content_format)
    assert tok.fetches == 1
    assert len(parses) == 1
