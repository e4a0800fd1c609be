"""A tiny byte-level tokenizer with a ChatML chat template, built in memory (no download).

Token ids 0..255 are the 256 bytes (in GPT-2's byte-to-unicode alphabet, so every string round-trips);
three special tokens follow. It is a real ``transformers`` fast tokenizer, so code under test uses the same
``encode`` / ``decode`` / ``apply_chat_template`` calls as with a checkpoint's tokenizer.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from asyncdp.model.byte_level import BYTE_TO_CHAR

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _byte_alphabet() -> list[str]:
    # GPT-2's printable stand-ins for the 256 bytes, in byte order.
    from tokenizers import pre_tokenizers

    if set(BYTE_TO_CHAR) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise RuntimeError("tokenizers changed its byte-level alphabet")
    return list(BYTE_TO_CHAR)


@cache
def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(_byte_alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok.to_str()


def byte_tokenizer() -> Any:
    """A fresh ``PreTrainedTokenizerFast``: ids 0..255 are bytes, ``eos_token`` is ``<|im_end|>``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
    )
