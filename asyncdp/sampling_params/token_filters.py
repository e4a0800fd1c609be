"""vLLM's ``allowed_token_ids`` and ``bad_words``: their checks against a vocabulary and the bad-word rule.

``bad_words`` are strings; the engine bans token sequences. ``tokenize_bad_words`` turns each word into them as
vLLM's ``SamplingParams.update_from_tokenizer`` does: the word with its leading whitespace stripped, encoded
without special tokens, and the same word after one space (``" word"``), kept only when its first token differs
from the plain form's and it has as many tokens (a tokenizer that folds the space into the word's first token
gives a second sequence; one that spends a token on the space does not). A word whose plain form encodes to
nothing is refused; more than ``MAX_NUM_BAD_WORDS`` sequences in all are refused (vLLM's
``VLLM_MAX_NUM_BAD_WORDS`` default).

``banned_tokens`` is vLLM's rule per step: for each sequence, when the generated tokens end with all of it but
its last token (nothing, for a one-token sequence), that last token is banned. Only the output is matched, never
the prompt, as in vLLM.

``with_token_filters`` is what an engine core runs on every request it takes (the API server ran it already,
naming the field in a 400): the ids checked against the executor's vocabulary and the words tokenized where that
was not done yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from asyncdp.errors import InvalidSamplingParams

if TYPE_CHECKING:
    from asyncdp.sampling_params import SamplingParams

# Most token sequences the bad words of one request may make (each word makes one or two), as vLLM's default.
MAX_NUM_BAD_WORDS = 128


def _encode(tokenizer: Any, text: str) -> tuple[int, ...]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return tuple(getattr(ids, "ids", ids))  # a ``tokenizers.Tokenizer`` gives an Encoding


def bad_word_sequences(words: Sequence[str], tokenizer: Any) -> tuple[tuple[int, ...], ...]:
    """The token sequences ``words`` ban (vLLM's rules, see the module docstring)."""
    out: list[tuple[int, ...]] = []
    for word in words:
        plain = _encode(tokenizer, word.lstrip())
        if not plain:
            raise InvalidSamplingParams(f"bad_words entries must tokenize to at least one token, got {word!r}.",
                                        field="bad_words")
        out.append(plain)
        spaced = _encode(tokenizer, " " + word.lstrip())
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
        if len(out) > MAX_NUM_BAD_WORDS:
            raise InvalidSamplingParams(f"bad_words make too many token sequences: more than {MAX_NUM_BAD_WORDS}.",
                                        field="bad_words")
    return tuple(out)


def check_vocab(params: SamplingParams, vocab_size: int) -> None:
    """``InvalidSamplingParams`` naming the field when an allowed or bad-word token id is outside
    ``[0, vocab_size)``."""
    outside = [t for t in params.allowed_token_ids or () if not 0 <= t < vocab_size]
    if outside:
        raise InvalidSamplingParams(f"allowed_token_ids must be token ids in [0, {vocab_size}), got {outside[:5]}.",
                                    field="allowed_token_ids")
    outside = [t for seq in params.bad_words_token_ids for t in seq if not 0 <= t < vocab_size]
    if outside:
        raise InvalidSamplingParams(f"bad_words make token ids outside [0, {vocab_size}): {outside[:5]}.",
                                    field="bad_words")


def tokenize_bad_words(params: SamplingParams, tokenizer: Any) -> SamplingParams:
    """``params`` with ``bad_words_token_ids`` made from ``bad_words`` (unchanged when there are none or they
    are made already)."""
    if not params.bad_words or params.bad_words_token_ids:
        return params
    if tokenizer is None:
        raise InvalidSamplingParams("bad_words need a tokenizer; this engine has none.", field="bad_words")
    return msgspec.structs.replace(params, bad_words_token_ids=bad_word_sequences(params.bad_words, tokenizer))


def with_token_filters(params: SamplingParams, tokenizer: Any, vocab_size: int | None) -> SamplingParams:
    """``params`` ready for an engine: bad words tokenized, ids checked against ``vocab_size`` (when known)."""
    if params.allowed_token_ids is None and not params.bad_words:
        return params
    params = tokenize_bad_words(params, tokenizer)
    if vocab_size is not None:
        check_vocab(params, vocab_size)
    return params


def banned_tokens(sequences: Sequence[Sequence[int]], output_token_ids: Sequence[int]) -> list[int]:
    """The tokens the next step may not sample: the last token of every sequence whose other tokens end
    ``output_token_ids``."""
    banned: list[int] = []
    num_out = len(output_token_ids)
    for seq in sequences:
        prefix = len(seq) - 1
        if prefix > num_out:
            continue
        if prefix == 0 or all(output_token_ids[num_out - prefix + k] == seq[k] for k in range(prefix)):
            banned.append(seq[-1])
    return banned
