"""``allowed_token_ids`` and ``bad_words`` on ``SamplingParams``: vLLM's shapes and checks, the bad-word
tokenization rules of vLLM's ``update_from_tokenizer``, the per-step ban rule, and the wire."""

from __future__ import annotations

import msgspec
import pytest

from asyncdp.errors import InvalidSamplingParams
from asyncdp.messages import AddRequest, decode, encode
from asyncdp.sampling_params import MAX_NUM_BAD_WORDS, SamplingParams
from asyncdp.sampling_params.token_filters import (
    bad_word_sequences,
    banned_tokens,
    check_vocab,
    with_token_filters,
)


class WordTokenizer:
    """Whole words are one token each; a leading space is folded into the word (another id), as BPE does."""

    def __init__(self, words: list[str]) -> None:
        self.ids = {w: i for i, w in enumerate(words)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert add_special_tokens is False
        out, pending_space = [], False
        for part in text.split(" "):
            if part:
                out.append(self.ids[(" " if pending_space else "") + part])
            pending_space = True
        return out


def test_lists_become_tuples_duplicate_words_are_dropped_and_all_of_it_survives_the_wire() -> None:
    params = SamplingParams(allowed_token_ids=[3, 1], bad_words=["x", "y", "x"],
                            bad_words_token_ids=[[5, 6], [7]]).validate()
    assert params.allowed_token_ids == (3, 1) and params.bad_words == ("x", "y")
    assert params.bad_words_token_ids == ((5, 6), (7,))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams) == params
    msg = AddRequest(request_id="r", client_index=0, wave=0, prompt_token_ids=[1], sampling_params=params,
                     arrival_time=0.0)
    assert decode(encode(msg)) == msg


def test_unset_filters_stay_off_the_wire() -> None:
    assert msgspec.msgpack.encode(SamplingParams()) == msgspec.msgpack.encode(
        SamplingParams(allowed_token_ids=None, bad_words=[], bad_words_token_ids=[]))
    assert SamplingParams()._has_plain_types()
    assert not SamplingParams(allowed_token_ids=[1])._has_plain_types()
    assert not SamplingParams(bad_words=["x"])._has_plain_types()


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"allowed_token_ids": []}, "allowed_token_ids"),  # vLLM: "allowed_token_ids is not None and empty!"
    ({"allowed_token_ids": [-1]}, "allowed_token_ids"),
    ({"allowed_token_ids": [True]}, "allowed_token_ids"),
    ({"allowed_token_ids": ["1"]}, "allowed_token_ids"),
    ({"bad_words": [""]}, "bad_words"),  # vLLM: "bad_words cannot contain an empty string"
    ({"bad_words": [3]}, "bad_words"),
    ({"bad_words_token_ids": [[]]}, "bad_words"),
    ({"bad_words_token_ids": [[1]] * (MAX_NUM_BAD_WORDS + 1)}, "bad_words"),
    ({"bad_words_token_ids": [["a"]]}, "bad_words_token_ids"),
])
def test_bad_values_are_refused_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidSamplingParams) as err:
        SamplingParams(**kwargs).validate()
    assert err.value.field == field


def test_a_word_bans_its_plain_form_and_its_form_after_a_space_when_that_is_another_token() -> None:
    tok = WordTokenizer(["hello", " hello", "big", "dog", " big", " dog"])
    assert bad_word_sequences(["hello"], tok) == ((0,), (1,))
    assert bad_word_sequences(["  big dog"], tok) == ((2, 5), (4, 5))  # leading whitespace stripped first


def test_a_space_that_costs_its_own_token_adds_no_second_sequence() -> None:
    class Bytes:
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return list(text.encode())

    assert bad_word_sequences(["ab"], Bytes()) == ((97, 98),)  # " ab" is 3 tokens: not the same length


def test_a_word_that_tokenizes_to_nothing_or_too_many_words_are_refused() -> None:
    tok = WordTokenizer(["a", " a"])
    with pytest.raises(InvalidSamplingParams, match="at least one token") as err:
        bad_word_sequences([" "], tok)
    assert err.value.field == "bad_words"
    many = WordTokenizer([w for i in range(70) for w in (f"w{i}", f" w{i}")])
    with pytest.raises(InvalidSamplingParams, match="too many") as err:
        bad_word_sequences([f"w{i}" for i in range(70)], many)  # 140 sequences > 128
    assert err.value.field == "bad_words"


def test_ids_outside_the_vocabulary_are_refused_naming_the_field() -> None:
    check_vocab(SamplingParams(allowed_token_ids=[0, 9], bad_words_token_ids=[[9]]), 10)
    for params, field in ((SamplingParams(allowed_token_ids=[10]), "allowed_token_ids"),
                          (SamplingParams(bad_words_token_ids=[[3, 10]]), "bad_words")):
        with pytest.raises(InvalidSamplingParams) as err:
            check_vocab(params, 10)
        assert err.value.field == field


def test_with_token_filters_tokenizes_once_and_needs_a_tokenizer() -> None:
    tok = WordTokenizer(["x", " x"])
    params = with_token_filters(SamplingParams(bad_words=["x"]), tok, 2)
    assert params.bad_words_token_ids == ((0,), (1,))
    assert with_token_filters(params, None, 2) is params  # made already: nothing to do
    plain = SamplingParams()
    assert with_token_filters(plain, None, None) is plain
    with pytest.raises(InvalidSamplingParams, match="need a tokenizer"):
        with_token_filters(SamplingParams(bad_words=["x"]), None, 2)


def test_the_last_token_is_banned_when_the_output_ends_with_the_rest() -> None:
    words = [(5,), (1, 2, 3), (2, 4)]
    assert banned_tokens(words, []) == [5]  # a one-token word: always
    assert banned_tokens(words, [1]) == [5]
    assert banned_tokens(words, [1, 2]) == [5, 3, 4]
    assert banned_tokens(words, [9, 1, 2]) == [5, 3, 4]
    assert banned_tokens(words, [1, 2, 9]) == [5]
