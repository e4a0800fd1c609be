"""Incremental detokenization and stop-string detection for one request.

Text is produced with a sliding window over the token ids (the vLLM "prefix offset / read offset" scheme):
each new token decodes ``tokens[prefix:]`` and ``tokens[prefix:read]``; the difference is the new text. A
window that decodes to text ending in U+FFFD is an incomplete UTF-8 character split across tokens: it is held
back until a later token completes it (at most ``_MAX_PENDING_TOKENS``, after which the replacement characters
are genuine and are emitted), and flushed when the request finishes. Each step decodes a few tokens, never the
whole context. A few prompt tokens seed the window so the first output token gets its leading space right.

Stop strings are searched only in the newly appended text plus the ``len(longest stop) - 1`` characters
before it. While stop strings are set, that many trailing characters are held back from the streamed deltas,
so a stop string is never half-streamed (the final delta releases what remains). A matched stop string
truncates the text; it is kept only with ``include_stop_str_in_output``. A stop token (EOS or a ``stop_token_ids``
entry) is never given to ``update`` unless ``include_stop_str_in_output`` asks for its text (``EngineCore``).

``spaces_between_special_tokens=False`` (vLLM's; it matters only with ``skip_special_tokens`` false) does what
vLLM's fast incremental detokenizer does, the one vLLM uses for every Hugging Face fast tokenizer: a token that is
an added token (special or not) right after another generated added token contributes its text exactly, so no
space the tokenizer's decoder would put between them (WordPiece's does; ByteLevel's and Metaspace's put none, so
for those tokenizers, the built-in models' and SmolLM2's among them, the text is the same either way). A space
between an added token and ordinary text is kept. vLLM's slow (pure Python tokenizer) path joins the text
around every added token with a space unless the flag is false; asyncdp applies the fast rule to every tokenizer.

Works with any tokenizer that has ``decode(ids, skip_special_tokens=...)``: a ``tokenizers.Tokenizer`` or a
Hugging Face tokenizer (whose Rust backend is used directly when it has one, for speed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from asyncdp.sampling_params import SamplingParams

DecodeFn = Callable[[list[int], bool], str]

_PROMPT_CONTEXT_TOKENS = 5
_MAX_PENDING_TOKENS = 8  # a UTF-8 character has at most 4 bytes; longer unresolved runs are really invalid


def make_decode_fn(tokenizer: Any) -> DecodeFn:
    """A ``decode(ids, skip_special_tokens)`` function for a HF tokenizer or a ``tokenizers.Tokenizer``."""
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    target = backend if backend is not None and hasattr(backend, "decode") else tokenizer
    # Both decode signatures take skip_special_tokens as the second positional argument; the bound method
    # itself is returned to save a Python call per decode (two per token per step).
    return target.decode


def added_token_texts(decode: DecodeFn) -> dict[int, str]:
    """Id -> text of the added tokens (special or not) of the tokenizer ``decode`` belongs to ({} when it has
    none or does not say): a ``tokenizers.Tokenizer``'s ``get_added_tokens_decoder()``, or a Hugging Face
    tokenizer's ``added_tokens_decoder``."""
    owner = getattr(decode, "__self__", None)
    table = getattr(owner, "get_added_tokens_decoder", None)
    added = table() if callable(table) else getattr(owner, "added_tokens_decoder", None)
    return {int(tid): str(tok.content) for tid, tok in added.items()} if isinstance(added, dict) else {}


class IncrementalDetokenizer:
    __slots__ = (
        "_decode", "_skip_special", "_tokens", "_prefix_offset", "_read_offset", "output_text",
        "_emitted", "_stop", "_max_stop_len", "_holdback", "_include_stop", "_added", "_last_added",
    )

    def __init__(self, decode: DecodeFn, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        self._decode = decode
        self._skip_special = params.skip_special_tokens
        context = list(prompt_token_ids[-(_PROMPT_CONTEXT_TOKENS + 1):])
        self._tokens = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self.output_text = ""
        self._emitted = 0  # characters of output_text already returned by take_delta()
        self._stop = params.stop
        self._max_stop_len = max((len(s) for s in params.stop), default=0)
        self._include_stop = params.include_stop_str_in_output
        self._holdback = 0 if params.include_stop_str_in_output else max(self._max_stop_len - 1, 0)
        # Added tokens whose text is given as it is after another one (spaces_between_special_tokens false)
        keep_spaces = params.skip_special_tokens or params.spaces_between_special_tokens
        self._added = None if keep_spaces else added_token_texts(decode) or None
        self._last_added = False  # the last generated token was an added token (the prompt's do not count)

    def update(self, token_id: int, *, check_stop: bool = True) -> str | None:
        """Add one generated token. Returns the stop string that now ends the text, if any."""
        tokens = self._tokens
        tokens.append(token_id)
        if self._added is not None:
            text = self._added.get(token_id)
            after_added, self._last_added = self._last_added, text is not None
            if text is not None and after_added:  # (vLLM's fast detokenizer: no space between the two)
                return self._advance(text, check_stop)
        prefix_offset = self._prefix_offset
        read_offset = self._read_offset
        decode = self._decode
        skip = self._skip_special
        prefix_text = decode(tokens[prefix_offset:read_offset], skip) if read_offset > prefix_offset else ""
        full_text = decode(tokens[prefix_offset:], skip)
        if len(full_text) <= len(prefix_text):
            return None  # nothing printable yet (a skipped special token, or a partial character)
        if full_text.endswith("\ufffd") and len(tokens) - read_offset < _MAX_PENDING_TOKENS:
            return None
        return self._advance(full_text[len(prefix_text):], check_stop)

    def _advance(self, new_text: str, check_stop: bool) -> str | None:
        """The window moves past the tokens whose text ``new_text`` is; the text is appended."""
        tokens = self._tokens
        self._prefix_offset = self._read_offset
        self._read_offset = len(tokens)
        # Keep the window list short: drop tokens nobody will decode again.
        if self._prefix_offset > 64:
            del tokens[:self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return self._append(new_text, check_stop)

    def _append(self, new_text: str, check_stop: bool) -> str | None:
        before = len(self.output_text)
        self.output_text += new_text
        if not (self._stop and check_stop):
            return None
        text = self.output_text
        search_from = max(before - self._max_stop_len + 1, 0)
        best_idx = -1
        best: str | None = None
        for s in self._stop:
            idx = text.find(s, search_from)
            if idx >= 0 and (best_idx < 0 or idx < best_idx):
                best_idx, best = idx, s
        if best is None:
            return None
        cut = best_idx + len(best) if self._include_stop else best_idx
        self.output_text = text[:cut]
        self._emitted = min(self._emitted, cut)
        return best

    def flush(self) -> None:
        """Emit text still held back for an incomplete character (the request is finishing)."""
        if self._read_offset < len(self._tokens):
            tokens = self._tokens
            prefix_text = self._decode(tokens[self._prefix_offset:self._read_offset], self._skip_special)
            full_text = self._decode(tokens[self._prefix_offset:], self._skip_special)
            self._prefix_offset = self._read_offset = len(tokens)
            if len(full_text) > len(prefix_text):
                self.output_text += full_text[len(prefix_text):]

    def take_delta(self, finished: bool) -> str:
        """Text not yet returned; while unfinished, the tail that could start a stop string is held back."""
        end = len(self.output_text) if finished else len(self.output_text) - self._holdback
        if end <= self._emitted:
            return ""
        delta = self.output_text[self._emitted:end]
        self._emitted = end
        return delta
