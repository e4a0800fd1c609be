"""Chat ``logprobs`` ``bytes`` are each token's raw bytes (``asyncdp.api.token_bytes``), not the UTF-8 of the
U+FFFD that a token inside a multi-byte character decodes to alone; ``token`` stays the token's own text."""

from __future__ import annotations

from asyncdp.api.openai_format import chat_logprobs
from asyncdp.api.token_bytes import token_bytes_of
from asyncdp.messages import Logprob, TokenLogprobs
from asyncdp.testing.tokenizer import byte_tokenizer


def _lps(ids: list[int]) -> list[TokenLogprobs]:
    return [TokenLogprobs(token_id=t, logprob=-1.0, top=(Logprob(token_id=t, logprob=-1.0),)) for t in ids]


def test_chat_bytes_are_the_tokens_raw_bytes() -> None:
    tok = byte_tokenizer()
    ids = tok.encode("é€", add_special_tokens=False)
    lps = [TokenLogprobs(token_id=t, logprob=-1.0, top=(Logprob(token_id=t, logprob=-1.0),
                                                        Logprob(token_id=0xE2, logprob=-2.0))) for t in ids]
    content = chat_logprobs(tok, lps, 2)["content"]
    assert [e["bytes"] for e in content] == [[0xC3], [0xA9], [0xE2], [0x82], [0xAC]]
    assert bytes(b for e in content for b in e["bytes"]).decode() == "é€"
    assert [e["token"] for e in content] == ["\ufffd"] * 5  # the token's own text, as vLLM gives it
    assert [e["top_logprobs"][1]["bytes"] for e in content] == [[0xE2]] * 5
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert chat_logprobs(tok, _lps([eos, ord("a")]), 0)["content"][0]["bytes"] == list(b"<|im_end|>")


def test_a_tokenizer_without_a_byte_level_vocabulary_falls_back_to_its_decoded_text() -> None:
    class Plain:
        def decode(self, ids: list[int]) -> str:
            return {1: "hé", 2: "\ufffd"}[ids[0]]

    token_bytes = token_bytes_of(Plain())
    assert (token_bytes(1), token_bytes(2)) == ("hé".encode(), "\ufffd".encode())
