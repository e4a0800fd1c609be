"""The ``qwen3`` and ``deepseek_r1`` reasoning parsers (asyncdp.api.reasoning_parsers), without HTTP: each text
split whole into reasoning and content, then fed in every split (each cut point, and character by character),
which must reassemble the same split, as a streamed answer must equal the whole one; and the same split counted
in token ids (``ReasoningTokens``, for ``usage.completion_tokens_details.reasoning_tokens``)."""

from __future__ import annotations

from functools import partial

import pytest

from asyncdp.api.reasoning_parsers import (
    END,
    PARSERS,
    START,
    DeepSeekR1Parser,
    Qwen3Parser,
    ReasoningParser,
    end_markers,
    end_token_ids,
    split,
    start_token_ids,
)
from asyncdp.api.reasoning_tokens import ReasoningTokens, count_reasoning_tokens
from asyncdp.api.tool_parsers import tags_are_special
from asyncdp.config.flags import REASONING_PARSERS
from asyncdp.sampling_params import StartMarker
from asyncdp.testing import byte_tokenizer
from tests.api.parser_feeds import assert_counts_at_every_cut, assert_read_alike_at_every_cut, fed, whole

# name: (text, reasoning, content), both parsers while thinking (as vLLM reads them today)
CASES: dict[str, tuple[str, str, str]] = {
    "no tags: all reasoning (the template opened the block)": ("The answer is 4.", "The answer is 4.", ""),
    "a whole block then the answer": ("<think>\nTwo and two.\n</think>\n\nThe answer is 4.", "\nTwo and two.\n",
                                      "\n\nThe answer is 4."),
    "only the closing tag (deepseek_r1's template opened it)": ("Two and two.\n</think>\n\n4", "Two and two.\n",
                                                                "\n\n4"),
    "an unterminated block is all reasoning": ("<think>\nStill thinking", "\nStill thinking", ""),
    "an empty block (Qwen3's /no_think)": ("<think>\n\n</think>\n\nHi!", "\n\n", "\n\nHi!"),
    "text before the opening tag stays reasoning": ("Hmm. <think>deep</think>ok", "Hmm. deep", "ok"),
    "a second opening tag stays in the reasoning": ("<think>a <think> b</think>c", "a <think> b", "c"),
    "tags after the end are content": ("x</think>y<think>z</think>", "x", "y<think>z</think>"),
    "a partial closing tag at the end is reasoning": ("abc</thi", "abc</thi", ""),
    "tag-like text is no tag": ("a < b </ c <th <thinker> </thinking>", "a < b </ c <th <thinker> </thinking>", ""),
    "the closing tag alone": ("</think>", "", ""),
    "nothing": ("", "", ""),
    "unicode around the tags": ("<think>Zürich 東京</think>答え", "Zürich 東京", "答え"),
}


@pytest.mark.parametrize("parser", [DeepSeekR1Parser, Qwen3Parser])
@pytest.mark.parametrize("name", CASES)
def test_a_whole_answer(parser: type[ReasoningParser], name: str) -> None:
    text, reasoning, content = CASES[name]
    assert whole(parser(), text) == (reasoning, content)


@pytest.mark.parametrize("name", CASES)
def test_every_split_of_the_text_gives_the_whole_answer(name: str) -> None:
    text = CASES[name][0]
    assert_read_alike_at_every_cut(Qwen3Parser, text, whole(Qwen3Parser(), text))


def test_a_possible_tag_is_held_back_and_released_when_it_is_none() -> None:
    parser = DeepSeekR1Parser()
    assert parser.feed("Let me see <") == ("Let me see ", "")
    assert parser.feed("/th") == ("", "")
    assert parser.feed("ought>") == ("</thought>", "")  # no tag after all
    assert parser.feed(" so.</think>\n\nYes") == (" so.", "\n\nYes")
    assert parser.feed("</think> <") == ("", "</think> <")  # the answer is sent as it comes
    assert parser.finish() == ("", "")


def test_a_whole_answer_without_reasoning_has_none() -> None:
    assert split(Qwen3Parser(), "</think>\n\nHi") == (None, "\n\nHi")
    assert split(Qwen3Parser(), "<think>x</think>") == ("x", "")


def test_qwen3_without_thinking_is_all_content_and_deepseek_r1_has_no_such_switch() -> None:
    assert Qwen3Parser.thinks({}) and Qwen3Parser.thinks({"enable_thinking": True})
    assert not Qwen3Parser.thinks({"enable_thinking": False})
    assert DeepSeekR1Parser.thinks({"enable_thinking": False})


def test_the_registry_is_the_flags_choices() -> None:
    assert tuple(PARSERS) == REASONING_PARSERS


def test_think_tags_marked_special_are_detected() -> None:
    tok = byte_tokenizer()
    tok.add_tokens(["<think>", "</think>"])  # as Qwen3's and DeepSeek-R1's: added, not special
    assert not tags_are_special(Qwen3Parser, tok)
    special = byte_tokenizer()
    special.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    assert tags_are_special(DeepSeekR1Parser, special)


def byte_ids(text: str) -> list[int]:
    """``text`` as byte-level ids, each tag several of them (a tokenizer that does not add the tags)."""
    return list(text.encode())


OPEN, CLOSE = 1000, 1001  # the tags as one added token each, as in Qwen3's and DeepSeek-R1's tokenizers


def tag_ids(text: str) -> list[int]:
    """``text`` as byte-level ids, each tag one token."""
    out: list[int] = []
    for i, piece in enumerate(text.split(END)):
        if i:
            out.append(CLOSE)
        for j, part in enumerate(piece.split(START)):
            if j:
                out.append(OPEN)
            out += part.encode()
    return out


@pytest.mark.parametrize("name", CASES)
def test_the_reasoning_tokens_are_those_of_the_reasoning_text_tags_left_out(name: str) -> None:
    """Before, nothing counted them. With multi-token tags (bytes) and one-token tags alike, and whatever pieces
    the ids come in, the count is the reasoning text's own tokens (a later tag in it is text, and counts)."""
    text, reasoning, _ = CASES[name]
    for encode, start, end in ((byte_ids, byte_ids(START), byte_ids(END)), (tag_ids, [OPEN], [CLOSE])):
        ids, expected = encode(text), len(encode(reasoning))
        assert count_reasoning_tokens(ids, start, end) == expected, ids
        assert_counts_at_every_cut(partial(ReasoningTokens, start, end), ids, expected)
        one_by_one = ReasoningTokens(start, end)
        for token in ids:
            one_by_one.feed([token])
        assert one_by_one.finish() == expected


def test_a_possible_tag_is_counted_once_it_is_none() -> None:
    counter = ReasoningTokens(byte_ids(START), byte_ids(END))
    counter.feed(byte_ids("ab</th"))
    assert counter.count == 2  # "</th" may begin the end tag
    counter.feed(byte_ids("ought>"))
    assert counter.count == 12
    counter.feed(byte_ids("c</think>and the answer"))
    assert counter.count == 13
    assert counter.finish() == 13


def test_the_tags_are_the_tokenizers_own_encoding() -> None:
    tok = byte_tokenizer()
    assert (start_token_ids(tok), end_token_ids(tok)) == (tuple(byte_ids(START)), tuple(byte_ids(END)))
    tok.add_tokens([START, END])
    assert (start_token_ids(tok), end_token_ids(tok)) == ((256 + 3,), (256 + 4,))


XML_CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n</function>\n</tool_call>"
# qwen3 only: a tool call that whitespace and <function follow ends the thinking (vLLM's Qwen3.5 reading)
CALL_CASES: dict[str, tuple[str, str, str]] = {
    "a call ends the thinking": ("I should call it" + XML_CALL, "I should call it", XML_CALL),
    "the model's own opening tag": ("<think>I should call it\n\n" + XML_CALL, "I should call it\n\n", XML_CALL),
    "a Hermes JSON call stays reasoning": ('I should<tool_call>{"name": "f"}</tool_call>',
                                           'I should<tool_call>{"name": "f"}</tool_call>', ""),
    "a mention, then a call": ("say <tool_call> then<tool_call> <function=f>", "say <tool_call> then",
                               "<tool_call> <function=f>"),
    "cut before deciding: reasoning": ("a<tool_call>\n<functio", "a<tool_call>\n<functio", ""),
    "</think> first wins": ("a</think>b" + XML_CALL, "a", "b" + XML_CALL),
    "after the call, </think> is content": ("a" + XML_CALL + "</think>", "a", XML_CALL + "</think>"),
}


@pytest.mark.parametrize("name", CALL_CASES)
def test_qwen3_ends_the_thinking_at_a_tool_call_whole_and_at_every_split(name: str) -> None:
    text, reasoning, content = CALL_CASES[name]
    assert whole(Qwen3Parser(), text) == (reasoning, content)
    assert fed(Qwen3Parser(), list(text)) == (reasoning, content)
    for cut in range(len(text) + 1):
        assert fed(Qwen3Parser(), [text[:cut], text[cut:]]) == (reasoning, content), cut
    if content.startswith("<tool_call>"):
        assert whole(DeepSeekR1Parser(), text)[1] != content  # (only qwen3 reads it so)


@pytest.mark.parametrize("name", CALL_CASES)
def test_the_reasoning_tokens_stop_before_the_call_that_ended_the_thinking(name: str) -> None:
    text, reasoning, _ = CALL_CASES[name]
    call, decode = byte_ids("<tool_call>"), (lambda ids: bytes(ids).decode("utf-8", "replace"))
    ids, expected = byte_ids(text), len(byte_ids(reasoning))
    assert count_reasoning_tokens(ids, byte_ids(START), byte_ids(END), False, call, decode) == expected
    assert_counts_at_every_cut(lambda: ReasoningTokens(byte_ids(START), byte_ids(END), False, call, decode), ids,
                               expected)


# a constrained answer (``constrained=True``): the grammar starts after the first <tool_call> generated (vLLM ends
# the reasoning there for its grammar), so any <tool_call> ends the thinking and the tag is not the content
CONSTRAINED_CASES: dict[str, tuple[str, str, str]] = {
    "any call ends it, the tag dropped": ('I should<tool_call>{"ok":false}', "I should", '{"ok":false}'),
    "an XML call too": ("I should call it" + XML_CALL, "I should call it", XML_CALL[len("<tool_call>"):]),
    "</think> first wins": ("a</think>b<tool_call>{}", "a", "b<tool_call>{}"),
    "a tag cut short stays reasoning": ("a<tool_ca", "a<tool_ca", ""),
}


@pytest.mark.parametrize("name", CONSTRAINED_CASES)
def test_a_constrained_answer_ends_the_thinking_where_its_grammar_starts(name: str) -> None:
    text, reasoning, content = CONSTRAINED_CASES[name]
    make = partial(Qwen3Parser, constrained=True)
    assert whole(make(), text) == fed(make(), list(text)) == (reasoning, content)
    for cut in range(len(text) + 1):
        assert fed(make(), [text[:cut], text[cut:]]) == (reasoning, content), cut
    ids = byte_ids(text)
    count = partial(ReasoningTokens, byte_ids(START), byte_ids(END), False, byte_ids("<tool_call>"),
                    lambda ids: bytes(ids).decode(), bare_call=True)
    assert_counts_at_every_cut(count, ids, len(byte_ids(reasoning)))
    assert whole(DeepSeekR1Parser(constrained=True), text) == whole(DeepSeekR1Parser(), text)  # (no calls)


def test_qwen3s_tool_call_starts_a_constraint_too() -> None:
    tok = byte_tokenizer()
    assert end_markers(tok, Qwen3Parser) == (StartMarker(ids=tuple(byte_ids("<tool_call>"))),)
    assert end_markers(tok, DeepSeekR1Parser) == ()
