"""A token's raw bytes, and where each token starts in the text a run of tokens decodes to.

Chat ``logprobs`` carry each token's ``bytes``, and a token that is part of a multi-byte character has no text
of its own: ``decode([id])`` gives U+FFFD, whose UTF-8 is not the token's bytes. A byte-level BPE vocabulary
(GPT-2 style: every byte written as one printable character; the built-in byte tokenizer, the GGUF-converted
SmolLM2 tokenizer, most HF ``tokenizer.json`` files whose decoder is ``ByteLevel``) holds the raw bytes: the
token's vocabulary string mapped back through GPT-2's bytes-to-unicode table. Added tokens (specials) are their
content's UTF-8. A tokenizer without a byte-level vocabulary (SentencePiece-style, a test double) falls back to
the UTF-8 of ``decode([id])``: exact for every token that decodes to whole characters, U+FFFD's bytes otherwise.

``TextOffsets`` walks tokens' bytes through an incremental UTF-8 decoder: a token's offset is the number of
characters the tokens before it completed, so the offset of a token inside a multi-byte character is that
character's, and an offset never depends on how the tokens were split into chunks (streamed or not).
"""

from __future__ import annotations

import codecs
import weakref
from typing import Any

from asyncdp.model.byte_level import CHAR_TO_BYTE


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return type(decoder).__name__ == "ByteLevel" and hasattr(tokenizer, "convert_ids_to_tokens")


class TokenBytes:
    """``token_bytes(id)``: the raw bytes of one token of ``tokenizer`` (see the module docstring), cached."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._byte_level = _is_byte_level(tokenizer)
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self._added = {int(i): str(getattr(t, "content", t)) for i, t in added.items()}
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        found = self._cache.get(token_id)
        if found is None:
            found = self._cache[token_id] = self._lookup(token_id)
        return found

    def _lookup(self, token_id: int) -> bytes:
        if token_id in self._added:
            return self._added[token_id].encode("utf-8")
        if self._byte_level:
            piece = self._tokenizer.convert_ids_to_tokens(token_id)
            table = CHAR_TO_BYTE
            if isinstance(piece, str) and all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
        return str(self._tokenizer.decode([token_id])).encode("utf-8")  # documented fallback


_BY_TOKENIZER: weakref.WeakKeyDictionary[Any, TokenBytes] = weakref.WeakKeyDictionary()


def token_bytes_of(tokenizer: Any) -> TokenBytes:
    """The (shared, cached) ``TokenBytes`` of ``tokenizer``."""
    try:
        found = _BY_TOKENIZER.get(tokenizer)
    except TypeError:  # not weak-referenceable: no sharing
        return TokenBytes(tokenizer)
    if found is None:
        found = _BY_TOKENIZER[tokenizer] = TokenBytes(tokenizer)
    return found


class TextOffsets:
    """Character offsets of successive tokens in the text they decode to, from ``start``; carried across the
    chunks of a stream, so streamed offsets equal the whole answer's."""

    def __init__(self, tokenizer: Any, start: int = 0) -> None:
        self._bytes = token_bytes_of(tokenizer)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.chars = start

    def next(self, token_id: int) -> int:
        """The offset of ``token_id`` (where its first byte's character starts), then move past it."""
        offset = self.chars
        self.chars += len(self._decoder.decode(self._bytes(token_id)))
        return offset

