"""The reasoning parsers of other open models (asyncdp.api.reasoning_parsers), as vLLM's of the same names, without
HTTP: each text split whole, then fed in every split (each cut point, character by character, three pieces), which
must reassemble the same split; the ``chat_template_kwargs`` switches; and the split counted in token ids
(``ReasoningTokens``) with each parser's tags as a byte tokenizer encodes them.

Before, only ``qwen3`` and ``deepseek_r1`` existed: these names were not in the registry (``deepseek_v3``, ``ernie45``
and ``hunyuan_a13b`` came later, ``holo2`` and ``minimax_m2_append_think`` later still: before them, they were not
either)."""

from __future__ import annotations

from typing import Any

import pytest

from asyncdp.api.reasoning_parsers import (
    PARSERS,
    end_token_ids,
    start_token_ids,
)
from asyncdp.api.reasoning_tokens import ReasoningTokens, count_reasoning_tokens
from asyncdp.api.tool_parsers import tags_are_special
from asyncdp.testing import byte_tokenizer
from tests.api.parser_feeds import assert_counts_at_every_cut, assert_read_alike_at_every_cut

THOUGHT_PHRASE, RESPONSE_PHRASE = "Here is my thought process:", "Here is my response:"

# parser name: [(text, reasoning, content, countable)]; countable: the byte-level count equals the reasoning's
# length (False where the tags are spelled in a way the ids do not find: Granite's "Here's"; or where the ids find
# a shorter tag: Hunyuan's end without its newline; both documented)
CASES: dict[str, list[tuple[str, str, str, bool]]] = {
    "mistral": [
        ("[THINK]Two and two.[/THINK]It is 4.", "Two and two.", "It is 4.", True),
        ("It is 4.", "", "It is 4.", True),  # no [THINK]: all content (vLLM's case 3.b)
        ("[THINK]Still thinking", "Still thinking", "", True),
        ("Hi [THINK]x[/THINK]y", "x", "Hi y", True),  # text before [THINK] is content
        ("a[/THINK]b", "", "ab", True),  # a stray [/THINK] is dropped (case 3.a)
        ("[THINK]a[THINK]b[/THINK]c[THINK]d", "a[THINK]b", "c[THINK]d", True),
        ("[THINK]abc[/TH", "abc[/TH", "", True),
        ("abc[TH", "", "abc[TH", True),
        ("[THINK][/THINK]", "", "", True),
        ("", "", "", True),
    ],
    "glm45": [
        ("<think>Two.</think>Four.", "Two.", "Four.", True),
        ("Four.", "", "Four.", True),  # enable_thinking false, or a model that did not think
        ("<think>still", "still", "", True),
        ("x</think>y", "", "xy", True),
        ("<think>a</think>b<think>c</think>", "a", "b<think>c</think>", True),
    ],
    "granite": [
        (f"{THOUGHT_PHRASE} Two and two. {RESPONSE_PHRASE} It is 4.", " Two and two. ", " It is 4.", True),
        ("Here's my thought process:\nA\nHere's my response:\nB", "\nA\n", "\nB", False),
        (f"{THOUGHT_PHRASE} mixed Here's my response: ok", " mixed ", " ok", False),
        ("It is 4.", "", "It is 4.", True),
        (f"{RESPONSE_PHRASE} 4", "", f"{RESPONSE_PHRASE} 4", True),  # no thought process: all content
        (f"{THOUGHT_PHRASE} still", " still", "", True),
        ("Here is my thought", "", "Here is my thought", True),
        (f"{THOUGHT_PHRASE} a {RESPONSE_PHRASE} b {RESPONSE_PHRASE} c", " a ", f" b {RESPONSE_PHRASE} c", True),
        ("Here: is my thought process: x", "", "Here: is my thought process: x", True),
        ("", "", "", True),
    ],
    "kimi_k2": [
        ("<think>Plan.</think>(no content)", "Plan.", "", True),
        ("Plan.</think>Sure (no content) ok(no content)", "Plan.", "Sure  ok", True),
        ("Plan.</think>(no cont", "Plan.", "(no cont", True),
        ("<think>a (no content) b</think>c", "a (no content) b", "c", True),  # only the content is cleaned
    ],
    "minimax_m2": [
        ("<think>Two.</think>Four.", "Two.", "Four.", True),
        ("Two.</think>Four.", "Two.", "Four.", True),
        ("Unfinished", "Unfinished", "", True),
    ],
    "seed_oss": [
        ("<seed:think>Two.</seed:think>Four.", "Two.", "Four.", True),
        ("Two.</seed:think>Four.", "Two.", "Four.", True),
        ("<think>x</think>y", "<think>x</think>y", "", True),  # other tags are text
        ("<seed:think>a</seed:th", "a</seed:th", "", True),
    ],
    "deepseek_v3": [  # (with thinking on: deepseek_r1's rules)
        ("<think>Two.</think>Four.", "Two.", "Four.", True),
        ("Two.</think>Four.", "Two.", "Four.", True),
        ("Unfinished", "Unfinished", "", True),
    ],
    "ernie45": [
        ("abc\n</think>\n\n<response>\ndef\n</response>\n", "abc\n", "\ndef\n", True),  # the wrapper is dropped
        ("abc\n</think>\ndef", "abc\n", "def", True),  # the newlines after </think> too (vLLM's stream)
        ("<think>abc</think>def", "abc", "def", True),
        ("abc\nABC</think>def\nDEF", "abc\nABC", "def\nDEF", True),
        ("abc", "abc", "", True),
        ("abc</think>", "abc", "", True),
        ("a</think>\n\n<response>\nx", "a", "\nx", True),  # cut inside the response
        ("a</think>\n\n<tool_call>\n{}\n</tool_call>", "a", "<tool_call>\n{}\n</tool_call>", True),
        ("a</think>x<response>y</response>\n\nz", "a", "xyz", True),  # the tags anywhere; newlines after </response>
        ("a</think>b<respon", "a", "b<respon", True),  # a partial tag at the end is content
        ("a</think>\n\n", "a", "", True),
    ],
    "hunyuan_a13b": [  # countable False: the ids of </think>\n<answer>\n leave the newline before it in the count
        ("<think>\nabc\n</think>\n<answer>\ndef\n</answer>", "abc", "def", False),
        ("<think>\n\n</think>\n<answer>\nhi\n</answer>", "", "hi", False),  # the fast (no-think) answer
        ("<think>\nabc</think>\n<answer>\ndef", "abc", "def", True),  # the end without its newline
        ("<think>\nabc", "abc", "", True),  # cut while thinking: reasoning (vLLM's stream)
        ("hi\n</answer>", "", "hi", True),  # no thinking: content, the answer's end dropped
        ("plain", "", "plain", True),
        ("pre<think>\nabc\n</think>\n<answer>\nd", "abc", "pred", False),  # text before <think> is content
        ("\n</think>\n<answer>\nx", "", "\n</think>\n<answer>\nx", True),  # an end before any start is text
        ("<think>x", "", "<think>x", True),  # <think> without its newline opens nothing
        ("<think>\na\n</think>\n<answer>\nb\n</answer>\nc", "a", "b\nc", False),
        ("<think>\na\n</think>\n<answer>\nb\n</ans", "a", "b\n</ans", False),
    ],
    "holo2": [  # (with thinking on, its default: deepseek_r1's rules)
        ("<think>Two.</think>Four.", "Two.", "Four.", True),
        ("Two.</think>Four.", "Two.", "Four.", True),
        ("Unfinished", "Unfinished", "", True),
        ("a</think>b</think>c", "a", "b</think>c", True),
    ],
    "minimax_m2_append_think": [  # nothing is reasoning: the content is the answer with <think> before it
        ("Two.</think>Four.", "", "<think>Two.</think>Four.", True),
        ("<think>Two.</think>Four.", "", "<think><think>Two.</think>Four.", True),  # prepended whatever comes
        ("Unfinished", "", "<think>Unfinished", True),
        ("</thi", "", "<think></thi", True),
    ],
    "step3": [
        ("Two.</think>Four.", "Two.", "Four.", True),
        ("<think>Two.</think>Four.", "<think>Two.", "Four.", True),  # no opening tag to drop
        ("Unfinished", "Unfinished", "", True),
    ],
}
ALL = [(name, *case) for name, cases in CASES.items() for case in cases]


@pytest.mark.parametrize(("name", "text", "reasoning", "content", "countable"), ALL)
def test_a_whole_answer_and_every_split_of_it(name: str, text: str, reasoning: str, content: str,
                                              countable: bool) -> None:
    assert_read_alike_at_every_cut(PARSERS[name], text, (reasoning, content), step=4)


@pytest.mark.parametrize(("name", "text", "reasoning", "content", "countable"), ALL)
def test_the_reasoning_tokens_are_those_of_the_reasoning_text(name: str, text: str, reasoning: str, content: str,
                                                              countable: bool) -> None:
    parser, tok = PARSERS[name], byte_tokenizer()
    start, end = start_token_ids(tok, parser), end_token_ids(tok, parser)
    assert end == tuple(parser.ends[0].encode())
    ids = list(text.encode())
    expected = len(reasoning.encode())
    if not countable:
        assert count_reasoning_tokens(ids, start, end, parser.opens, plain=parser.plain) != expected
        return
    assert count_reasoning_tokens(ids, start, end, parser.opens, plain=parser.plain) == expected
    assert_counts_at_every_cut(lambda: ReasoningTokens(start, end, parser.opens, plain=parser.plain), ids, expected)


def test_the_tag_ids_are_each_parsers_own() -> None:
    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["[THINK]", "[/THINK]"]})
    mistral = PARSERS["mistral"]
    assert start_token_ids(tok, mistral) == (tok.convert_tokens_to_ids("[THINK]"),)
    assert end_token_ids(tok, mistral) == (tok.convert_tokens_to_ids("[/THINK]"),)
    assert tags_are_special(mistral, tok) and not tags_are_special(PARSERS["glm45"], tok)
    assert start_token_ids(tok, PARSERS["step3"]) == ()  # step3 has no opening tag
    assert end_token_ids(tok, PARSERS["granite"]) == tuple(RESPONSE_PHRASE.encode())
    assert PARSERS["seed_oss"].tags == ("<seed:think>", "</seed:think>")
    hunyuan = PARSERS["hunyuan_a13b"]  # its end as ids without the newline: the fast answer's "\n\n" is one token
    assert start_token_ids(tok, hunyuan) == tuple(b"<think>\n")
    assert end_token_ids(tok, hunyuan) == tuple(b"</think>\n<answer>\n")
    assert "<response>" in PARSERS["ernie45"].tags  # (kept in the text, to be taken out of it)
    append = PARSERS["minimax_m2_append_think"]  # nothing to split, but </think> starts a constraint, as vLLM's
    assert end_token_ids(tok, append) == tuple(b"</think>") and append.tags == ("<think>", "</think>")


@pytest.mark.parametrize(("name", "kwargs", "thinks"), [
    ("glm45", {}, True), ("glm45", {"enable_thinking": True}, True), ("glm45", {"enable_thinking": False}, False),
    ("kimi_k2", {}, True), ("kimi_k2", {"thinking": True}, True), ("kimi_k2", {"thinking": False}, False),
    ("kimi_k2", {"enable_thinking": False}, True),  # (Kimi's switch is "thinking", as vLLM reads it)
    ("mistral", {"enable_thinking": False}, True), ("granite", {"thinking": False}, True),
    ("minimax_m2", {"enable_thinking": False}, True), ("seed_oss", {}, True), ("step3", {}, True),
    ("deepseek_v3", {}, False), ("deepseek_v3", {"thinking": True}, True),  # (vLLM's: off unless asked for)
    ("deepseek_v3", {"enable_thinking": True}, True), ("deepseek_v3", {"thinking": False, "enable_thinking": 1}, True),
    ("deepseek_v3", {"thinking": False}, False), ("ernie45", {"enable_thinking": False}, True),
    ("hunyuan_a13b", {"enable_thinking": False}, True),
    ("holo2", {}, True), ("holo2", {"thinking": None}, True),  # (vLLM's: on unless a switch is given)
    ("holo2", {"thinking": False}, False), ("holo2", {"enable_thinking": False}, False),
    ("holo2", {"thinking": False, "enable_thinking": True}, True),  # (either switch true: on, as deepseek_v3)
    ("holo2", {"thinking": True, "enable_thinking": False}, True), ("holo2", {"thinking": 0}, False),
    ("minimax_m2_append_think", {"enable_thinking": False}, True),
])
def test_the_thinking_switches(name: str, kwargs: dict[str, Any], thinks: bool) -> None:
    assert PARSERS[name].thinks(kwargs) is thinks


def test_a_possible_phrase_is_held_back_and_released_when_it_is_none() -> None:
    parser = PARSERS["granite"]()
    assert parser.feed("Here is my") == ("", "")  # may still open the thought process
    assert parser.feed(" thought process: Hmm. Here") == (" Hmm. ", "")
    assert parser.feed(" is the plan. Here's my") == ("Here is the plan. ", "")
    assert parser.feed(" response: 4") == ("", " 4")
    assert parser.finish() == ("", "")
    other = PARSERS["granite"]()
    assert other.feed("Here is a") == ("", "Here is a")  # no thought process: content, as it comes
    assert other.feed(" Here is my response: b") == ("", " Here is my response: b")


def test_minimax_m2_append_think_opens_the_content_with_think_once() -> None:
    parser = PARSERS["minimax_m2_append_think"]()
    assert parser.feed("Two") == ("", "<think>Two")  # the first piece carries it, as vLLM's first delta
    assert parser.feed(".</think>") == ("", ".</think>")
    assert parser.feed("Four.") == ("", "Four.")
    assert parser.finish() == ("", "")
    empty = PARSERS["minimax_m2_append_think"]()  # an empty answer's content is the tag alone (vLLM's whole answer)
    assert empty.read("", finished=False) == ("", "") and empty.read("", finished=True) == ("", "<think>")
