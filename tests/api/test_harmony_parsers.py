"""gpt-oss's harmony parsers (asyncdp.api.harmony_parsers: ``--reasoning-parser openai_gptoss`` and
``--tool-call-parser openai``), without HTTP: each answer read whole, then fed in every split (each cut point,
character by character, three pieces), which must give the same reading, alone and one parser after the other as
the server chains them; the headers as harmony reads them; and the reasoning counted in token ids, the tags as a
byte tokenizer encodes them and as one special token each (gpt-oss's).

Before, neither name was in its registry, and asyncdp.api.harmony_parsers did not exist."""

from __future__ import annotations

import pytest

from asyncdp.api.harmony import TAGS, Header, Splitter, parse_header
from asyncdp.api.reasoning_parsers import PARSERS as REASONING_PARSERS
from asyncdp.api.reasoning_parsers import end_markers, end_token_ids, split, token_counter
from asyncdp.api.tool_parsers import PARSERS as TOOL_PARSERS
from asyncdp.api.tool_parsers import AutoToolCalls, ParsedCall, tags_are_special
from asyncdp.sampling_params import StartMarker
from asyncdp.testing import byte_tokenizer
from tests.api.parser_feeds import (
    assert_counts_at_every_cut,
    assert_every_split_agrees,
    assert_read_alike_at_every_cut,
    whole,
)

REASONING, TOOLS = REASONING_PARSERS["openai_gptoss"], TOOL_PARSERS["openai"]
NAMES = ("get_weather", "get_time")
A = "<|channel|>analysis<|message|>"  # the first message's header: the prompt wrote <|start|>assistant
FINAL = "<|start|>assistant<|channel|>final<|message|>"
CALL = "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
TIME = "<|start|>assistant<|channel|>commentary to=functions.get_time json<|message|>"
SF = ParsedCall("get_weather", '{"city": "SF"}')
NOW = ParsedCall("get_time", "{}")

# name: (text, reasoning, content): the reasoning parser's reading
CASES: dict[str, tuple[str, str, str]] = {
    "analysis then final": (A + "2+2 is 4.<|end|>" + FINAL + "It is 4.<|return|>", "2+2 is 4.", "It is 4."),
    "the stop token not in the text": (A + "Two.<|end|>" + FINAL + "It is 4.", "Two.", "It is 4."),
    "analysis only, cut": (A + "Still thinking", "Still thinking", ""),
    "analysis only, ended": (A + "Done thinking.<|end|>", "Done thinking.", ""),
    "a final without analysis": ("<|channel|>final<|message|>Hi!", "", "Hi!"),
    "the role written again": ("assistant<|channel|>final<|message|>Hi!", "", "Hi!"),
    "two analysis messages joined": (A + "a<|end|><|start|>assistant" + A + "b<|end|>" + FINAL + "c", "ab", "c"),
    "a call after analysis": (A + "Need it.<|end|>" + CALL + '{"city": "SF"}<|call|>', "Need it.",
                              CALL + '{"city": "SF"}<|call|>'),
    "a call without analysis": (TIME[len("<|start|>assistant"):] + "{}", "",
                                TIME[len("<|start|>assistant"):] + "{}"),
    "a preamble is content": (A + "x<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>" + TIME
                              + "{}", "x", "Checking." + TIME + "{}"),
    "a built-in tool's call is reasoning": (A + "x<|end|><|start|>assistant<|channel|>analysis to=python code"
                                            "<|message|>print(1)<|call|>", "xprint(1)", ""),
    "a call on the analysis channel": (A + "x<|end|><|start|>assistant to=functions.get_time<|channel|>analysis"
                                       "<|message|>{}", "x",
                                       "<|start|>assistant to=functions.get_time<|channel|>analysis<|message|>{}"),
    "another channel is content": ("<|channel|>notes<|message|>n<|end|>" + FINAL + "f", "", "nf"),
    "no harmony at all": ("Just text, no tags.", "", "Just text, no tags."),
    "a header that is none": ("<|channel|>analysis is what I do<|message|>x", "",
                              "<|channel|>analysis is what I do<|message|>x"),
    "a header cut": ("<|channel|>analy", "", "<|channel|>analy"),
    "an empty channel": ("<|channel|><|message|>x<|end|>" + FINAL + "y", "", "<|channel|><|message|>x<|end|>y"),
    "a start with no header": (A + "a<|end|><|start|>oops, text<|end|>" + FINAL + "b", "a",
                               "<|start|>oops, text<|end|>b"),
    "text between messages": (A + "a<|end|>\n" + FINAL + "b", "a", "\nb"),
    "a start inside a body is body": (A + "a<|start|>assistant<|channel|>final<|message|>b", "a" + FINAL + "b", ""),
    "a partial terminator at the end": (A + "abc<|en", "abc<|en", ""),
    "empty": ("", "", ""),
}


@pytest.mark.parametrize(("text", "reasoning", "content"), CASES.values(), ids=list(CASES))
def test_the_reasoning_parser_whole_and_at_every_split(text: str, reasoning: str, content: str) -> None:
    assert_read_alike_at_every_cut(REASONING, text, (reasoning, content))


def test_a_whole_answer_without_reasoning_has_none() -> None:
    assert split(REASONING(), "<|channel|>final<|message|>Hi") == (None, "Hi")


# name: (text, content, calls): the tool-call parser's reading of the text it is given
TOOL_CASES: dict[str, tuple[str, str, list[ParsedCall]]] = {
    "text": ("It is 4.", "It is 4.", []),
    "a call": (CALL + '{"city": "SF"}<|call|>', "", [SF]),
    "a call the answer ends in": (CALL + ' {"city": "SF"}\n', "", [SF]),
    "the first message's call": ('<|channel|>commentary to=functions.get_weather<|constrain|>json<|message|>'
                                 '{"city": "SF"}', "", [SF]),
    "the recipient in the role's section": ('<|start|>assistant to=functions.get_weather<|channel|>commentary json'
                                            '<|message|>{"city": "SF"}', "", [SF]),
    "a preamble and a call": ("Checking." + CALL + '{"city": "SF"}', "Checking.", [SF]),
    "two calls": (CALL + '{"city": "SF"}<|call|>' + TIME + "{}<|end|>", "", [SF, NOW]),
    "an unknown function stays text": ("<|start|>assistant<|channel|>commentary to=functions.launch<|message|>{}",
                                       "<|start|>assistant<|channel|>commentary to=functions.launch<|message|>{}", []),
    "arguments that are no object stay text": (TIME + "[1]<|call|>", TIME + "[1]<|call|>", []),
    "arguments cut stay text": (CALL + '{"city": "S', CALL + '{"city": "S', []),
    "a call then a bad one": (TIME + "{}<|call|>" + TIME + "{x", TIME + "{x", [NOW]),
    "a final channel addressed to a function is no call": ("<|start|>assistant<|channel|>final to=functions.get_time"
                                                           "<|message|>{}", "<|start|>assistant<|channel|>final "
                                                           "to=functions.get_time<|message|>{}", []),
    "a whole harmony answer, without the reasoning parser": (A + "hm<|end|>" + TIME + "{}", A + "hm<|end|>", [NOW]),
    "a header cut": (TIME[:30], TIME[:30], []),
}


@pytest.mark.parametrize(("text", "content", "calls"), TOOL_CASES.values(), ids=list(TOOL_CASES))
def test_the_tool_call_parser_whole_and_at_every_split(text: str, content: str, calls: list[ParsedCall]) -> None:
    assert AutoToolCalls(TOOLS(NAMES)).feed(text, finished=True) == (content, calls)
    assert_every_split_agrees(lambda: AutoToolCalls(TOOLS(NAMES)), text)


def _chained(pieces: list[str]) -> tuple[str, str, list[ParsedCall]]:
    """The reasoning, content and calls of ``pieces`` through both parsers, as the server chains them."""
    thinker, auto = REASONING(), AutoToolCalls(TOOLS(NAMES))
    reasoning, content, calls = "", "", []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        more, text = thinker.read(piece, last)
        said, found = auto.feed(text, last)
        reasoning, content, calls = reasoning + more, content + said, calls + found
    return reasoning, content, calls


@pytest.mark.parametrize(("text", "expected"), [
    (A + "Need the weather.<|end|>" + CALL + '{"city": "SF"}<|call|>', ("Need the weather.", "", [SF])),
    (CALL[len("<|start|>assistant"):] + '{"city": "SF"}', ("", "", [SF])),  # a call without analysis
    (A + "Two.<|end|>" + CALL + '{"city": "SF"}<|call|>' + TIME + "{}", ("Two.", "", [SF, NOW])),
    (A + "a<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>" + TIME + "{}",
     ("a", "Checking.", [NOW])),
    (A + "a<|end|>" + FINAL + "It is 4.", ("a", "It is 4.", [])),
    (A + "a<|end|>" + CALL + '{"city"', ("a", CALL + '{"city"', [])),  # cut inside the arguments: text
])
def test_both_parsers_chained_whole_and_at_every_split(text: str, expected: tuple[str, str, list[ParsedCall]]) -> None:
    assert _chained([text]) == expected
    assert _chained(list(text)) == expected, "character by character"
    for cut in range(len(text) + 1):
        assert _chained([text[:cut], text[cut:]]) == expected, cut


@pytest.mark.parametrize(("text", "started", "header"), [
    ("<|channel|>analysis", False, Header("analysis", None, None)),
    ("<|start|>assistant<|channel|>final", True, Header("final", None, None)),
    ("<|channel|>commentary to=functions.f <|constrain|>json", False, Header("commentary", "functions.f",
                                                                            "<|constrain|>json")),
    ("<|channel|>commentary to=functions.f<|constrain|>json", False, Header("commentary", "functions.f",
                                                                           "<|constrain|>json")),
    ("<|start|>assistant to=functions.f<|channel|>commentary json", True, Header("commentary", "functions.f", "json")),
    (" to=functions.f<|channel|>commentary", False, Header("commentary", "functions.f", None)),
    ("<|channel|>final <|constrain|>json", False, Header("final", None, "<|constrain|>json")),
    ("<|start|>assistant", True, Header(None, None, None)),
    ("<|start|>", True, None),  # no role
    ("<|channel|>", False, None),  # no channel name
    ("<|channel|>a<|channel|>b", False, None),  # two channels
    ("<|channel|>a to=x y z", False, None),  # a word too many
    ("hello<|channel|>final", False, None),  # the first message's header begins with its role, recipient or channel
    ("<|channel|>final\n" + "x" * 300, False, None),  # too long
])
def test_headers_read_as_harmony_reads_them(text: str, started: bool, header: Header | None) -> None:
    assert parse_header(text, started) == header


def test_what_cannot_be_a_header_is_released_at_once() -> None:
    parser = REASONING()
    assert parser.feed("Hel") == ("", "Hel")  # no header begins so: loose text, as it comes
    assert parser.feed("lo <|chan <|sta") == ("", "lo <|chan ")  # (may begin <|start|>)
    thinker = REASONING()
    assert thinker.feed("<|channel|>anal") == ("", "")  # may still be a header: held
    assert thinker.feed("ysis<|message|>Hm") == ("Hm", "")
    assert thinker.feed("m<|e") == ("m", "")  # may begin <|end|>
    assert thinker.feed("nd|><|start|>assistant<|channel|>final<|message|>4") == ("", "4")
    calls = TOOLS(NAMES)
    assert calls.feed(CALL + '{"city"') == []  # a call: held to its end
    assert calls.feed(': "SF"}') == [] and calls.finish() == [SF]
    assert Splitter().feed("x" * 10) != []


@pytest.mark.parametrize("special", [False, True])
@pytest.mark.parametrize("text", [case[0] for case in CASES.values()], ids=list(CASES))
def test_the_reasoning_tokens_are_the_analysis_bodies_tokens(text: str, special: bool) -> None:
    tok = byte_tokenizer()
    if special:
        tok.add_special_tokens({"additional_special_tokens": list(TAGS)})  # one token each, as gpt-oss's
    make = token_counter(tok, REASONING)
    reasoning, _ = whole(REASONING(), text)
    ids = tok.encode(text, add_special_tokens=False)
    expected = len(tok.encode(reasoning, add_special_tokens=False))
    counter = make()
    counter.feed(ids)
    assert counter.finish() == expected
    assert_counts_at_every_cut(make, ids, expected)


def test_the_tags_are_gpt_oss_special_tokens_and_a_constraint_starts_after_the_final_header() -> None:
    tok = byte_tokenizer()
    assert not tags_are_special(REASONING, tok) and not tags_are_special(TOOLS, tok)
    tok.add_special_tokens({"additional_special_tokens": list(TAGS)})
    assert tags_are_special(REASONING, tok) and tags_are_special(TOOLS, tok)
    assert end_token_ids(tok, REASONING) == tuple(tok.convert_tokens_to_ids(["<|channel|>"])) + tuple(
        b"final") + tuple(tok.convert_tokens_to_ids(["<|message|>"]))
    assert REASONING.thinks({"enable_thinking": False}) and REASONING.thinks({})


def test_a_final_header_with_any_content_type_is_a_start_marker_as_the_tokenizer_encodes_its_parts() -> None:
    """vLLM's bound: ``<|message|>`` within the 20 ids after ``<|channel|>final`` (at most 19 between), no
    ``<|end|>`` between; the other parsers have no such marker."""
    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(TAGS)})
    channel, message, end = tok.convert_tokens_to_ids(["<|channel|>", "<|message|>", "<|end|>"])
    assert end_markers(tok, REASONING) == (StartMarker(ids=(channel, *b"final"), closed_by=(message,),
                                                       max_gap_tokens=19, cancelled_by=(end,)),)
    assert end_markers(tok, REASONING_PARSERS["deepseek_r1"]) == ()
