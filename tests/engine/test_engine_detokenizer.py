"""Incremental detokenizer with a byte-level tokenizer: split UTF-8, stop strings, special tokens."""

from __future__ import annotations

from engine_testing import BOS_ID, encode, make_byte_tokenizer

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
