"""Incremental detokenizer with a byte-level tokenizer: split UTF-8, stop strings, special tokens."""

from __future__ import annotations

import pytest
from engine_testing import BOS_ID, encode, make_byte_tokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.decoders import DecodeStream

from asyncdp.engine.detokenizer import IncrementalDetokenizer, make_decode_fn
from asyncdp.sampling_params import SamplingParams

TOK = make_byte_tokenizer()
DECODE = make_decode_fn(TOK)


def stream(text_or_ids, params=None, prompt=(104, 105)) -> tuple[list[str], str | None, str]:
    d = IncrementalDetokenizer(DECODE, list(prompt), params or SamplingParams())
    ids = encode(text_or_ids) if isinstance(text_or_ids, str) else text_or_ids
    deltas = []
    stop = None
    for t in ids:
        stop = d.update(t)
        deltas.append(d.take_delta(stop is not None))
        if stop is not None:
            break
    else:
        d.flush()
        deltas.append(d.take_delta(True))
    return deltas, stop, d.output_text


def test_multibyte_characters_split_across_tokens_are_never_emitted_broken():
    text = "h\u00e9llo \u20ac \U0001F600!"
    deltas, _, out = stream(text)
    assert "".join(deltas) == text == out
    assert all("\ufffd" not in d for d in deltas)
    assert deltas[1] == "" and deltas[2] == "\u00e9"  # the first byte of é is held back


def test_an_incomplete_character_at_finish_is_flushed_as_a_replacement_character():
    deltas, _, out = stream(list(b"ab") + [0xE2, 0x82])
    assert out.startswith("ab") and out.endswith("\ufffd") and "".join(deltas) == out


def test_stop_string_spanning_tokens_ends_the_text_before_it():
    deltas, stop, out = stream("hello world, bye", SamplingParams(stop=("o w",)))
    assert stop == "o w" and out == "hell" and "".join(deltas) == "hell"


def test_include_stop_str_in_output_keeps_the_stop_string():
    _, stop, out = stream("hello world", SamplingParams(stop=("o w",), include_stop_str_in_output=True))
    assert stop == "o w" and out == "hello w"


def test_streamed_deltas_never_contain_the_beginning_of_a_stop_string():
    deltas, _, out = stream("abcXYZdef", SamplingParams(stop=("XYZ",)))
    assert out == "abc" and all("X" not in d for d in deltas)


def test_earliest_of_several_stop_strings_wins():
    _, stop, out = stream("one two three", SamplingParams(stop=("three", "two")))
    assert stop == "two" and out == "one "


def test_special_tokens_are_skipped_unless_asked_to_keep_them():
    ids = encode("hi") + [BOS_ID] + encode("yo")
    assert stream(ids)[2] == "hiyo"
    assert stream(ids, SamplingParams(skip_special_tokens=False))[2] == "hi<bos>yo"


def test_stop_checking_can_be_deferred_for_min_tokens():
    d = IncrementalDetokenizer(DECODE, [104], SamplingParams(stop=("a",)))
    assert d.update(97, check_stop=False) is None
    assert d.update(97) == "a"


def test_hf_style_tokenizer_object_with_backend_is_supported():
    class HFLike:  # the attribute a transformers fast tokenizer has
        backend_tokenizer = TOK

        def decode(self, ids, skip_special_tokens=False):  # pragma: no cover - the backend is preferred
            raise AssertionError("slow path used")

    d = IncrementalDetokenizer(make_decode_fn(HFLike()), [], SamplingParams())
    for t in encode("\u00e9t\u00e9"):
        d.update(t)
    assert d.output_text == "\u00e9t\u00e9"


def wordpiece_tokenizer() -> Tokenizer:
    """A BERT-style tokenizer: its WordPiece decoder puts a space between tokens, added ones included."""
    vocab = {w: i for i, w in enumerate(["[UNK]", "hello", "world", "##s", "a", "!"])}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(["[CLS]", "[SEP]"])
    tok.add_tokens(["<x>"])  # an added token that is not special
    return tok


def vllm_fast_text(tok: Tokenizer, prompt: list[int], ids: list[int], skip: bool, spaces: bool) -> str:
    """What vLLM's fast incremental detokenizer (a DecodeStream primed with the prompt) makes of ``ids``: with
    spaces_between_special_tokens false (and special tokens kept), an added token right after another one is its
    text as it is."""
    stream = DecodeStream(ids=prompt, skip_special_tokens=skip)
    added = {tid: t.content for tid, t in tok.get_added_tokens_decoder().items()}
    text, last_added = "", False
    for t in ids:
        piece = stream.step(tok, t)
        if not (skip or spaces):
            if t in added and last_added:
                piece = added[t]
            last_added = t in added
        text += piece or ""
    return text


@pytest.mark.parametrize(("skip", "spaces"), [(True, True), (True, False), (False, True), (False, False)])
def test_spaces_between_special_tokens_as_vllm_fast_detokenizer(skip: bool, spaces: bool) -> None:
    tok = wordpiece_tokenizer()
    prompt = tok.encode("a").ids
    ids = tok.encode("hello [CLS] [SEP] worlds <x> <x> [SEP] a !").ids
    params = SamplingParams(skip_special_tokens=skip, spaces_between_special_tokens=spaces)
    d = IncrementalDetokenizer(make_decode_fn(tok), prompt, params)
    for t in ids:
        d.update(t)
    d.flush()
    assert d.output_text == vllm_fast_text(tok, prompt, ids, skip, spaces)
    if not skip:
        kept = " hello [CLS] [SEP] worlds <x> <x> [SEP] a!"
        assert d.output_text == (kept if spaces else " hello [CLS][SEP] worlds <x><x>[SEP] a!")


def test_spaces_between_special_tokens_changes_nothing_where_the_decoder_puts_no_space() -> None:
    ids = encode("hi") + [BOS_ID, BOS_ID] + encode("yo")
    params = SamplingParams(skip_special_tokens=False, spaces_between_special_tokens=False)
    assert stream(ids, params)[2] == stream(ids, SamplingParams(skip_special_tokens=False))[2] == "hi<bos><bos>yo"
