"""The ``hermes`` tool-call parser and the content rules of ``tool_choice: "auto"`` (asyncdp.api.tool_parsers),
without HTTP: each text parsed whole, then fed in every split (each cut point, and character by character),
which must reassemble the same answer, as a streamed answer must equal the whole one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncdp.api.tool_parsers import PARSERS, AutoToolCalls, HermesParser, ParsedCall, tags_are_special
from asyncdp.config.flags import TOOL_CALL_PARSERS
from asyncdp.testing import byte_tokenizer

NAMES = ("get_weather", "get_time")


def call(name: str, arguments: Any) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)}\n</tool_call>'


def whole(text: str) -> tuple[str, list[ParsedCall]]:
    return AutoToolCalls(HermesParser(NAMES)).feed(text, finished=True)


def fed(pieces: list[str]) -> tuple[str, list[ParsedCall]]:
    auto = AutoToolCalls(HermesParser(NAMES))
    content, calls = "", []
    for i, piece in enumerate(pieces):
        more, found = auto.feed(piece, finished=i == len(pieces) - 1)
        content += more
        calls += found
    return content, calls


WEATHER = call("get_weather", {"city": "Paris"})
CASES: dict[str, tuple[str, str, list[ParsedCall]]] = {  # name: (text, content, calls)
    "plain text": ("Hello there.\n", "Hello there.\n", []),
    "a tag-like text that is no tag": ("a <tool or <tool_cal> b", "a <tool or <tool_cal> b", []),
    "one call": (WEATHER, "", [ParsedCall("get_weather", '{"city": "Paris"}')]),
    "several calls": (WEATHER + "\n" + call("get_time", {}) + "\n", "",
                      [ParsedCall("get_weather", '{"city": "Paris"}'), ParsedCall("get_time", "{}")]),
    "text before a call": ("Let me check.\n\n" + WEATHER, "Let me check.",
                           [ParsedCall("get_weather", '{"city": "Paris"}')]),
    "text between and after calls": ("A " + WEATHER + " B " + WEATHER + " C \n", "A  B  C",
                                     [ParsedCall("get_weather", '{"city": "Paris"}')] * 2),
    "malformed JSON stays text": ("x <tool_call>{\"name\": \"get_weather\", </tool_call>",
                                  "x <tool_call>{\"name\": \"get_weather\", </tool_call>", []),
    "an unknown name stays text": (call("launch", {}), call("launch", {}), []),
    "a bad block beside a good one": (call("launch", {}) + WEATHER, call("launch", {}),
                                      [ParsedCall("get_weather", '{"city": "Paris"}')]),
    "unterminated and incomplete stays text": ('Hi <tool_call>\n{"name": "get_weather", "argu',
                                               'Hi <tool_call>\n{"name": "get_weather", "argu', []),
    "unterminated but complete is a call": ('<tool_call>{"name": "get_time", "arguments": {}}\n', "",
                                            [ParsedCall("get_time", "{}")]),
    "a partial tag at the end stays text": ("Hi <tool_c", "Hi <tool_c", []),
    "unicode and nested arguments": (call("get_weather", {"city": "Zürich 東京", "opts": {"days": [1, 2]}}), "",
                                     [ParsedCall("get_weather", '{"city": "Zürich 東京", "opts": {"days": [1, 2]}}')]),
    "arguments as a JSON string of an object": (
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>', "",
        [ParsedCall("get_weather", '{"city": "Oslo"}')]),
    "arguments as a string that is no object stays text": (
        '<tool_call>{"name": "get_weather", "arguments": "Oslo"}</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": "Oslo"}</tool_call>', []),
    "no arguments are an empty object": ('<tool_call>{"name": "get_time"}</tool_call>', "",
                                         [ParsedCall("get_time", "{}")]),
    "whitespace only": ("  \n", "  \n", []),
}


@pytest.mark.parametrize("name", CASES)
def test_a_whole_answer(name: str) -> None:
    text, content, calls = CASES[name]
    assert whole(text) == (content, calls)


@pytest.mark.parametrize("name", CASES)
def test_every_split_of_the_text_gives_the_whole_answer(name: str) -> None:
    text = CASES[name][0]
    expected = whole(text)
    assert fed(list(text)) == expected, "character by character"
    for cut in range(len(text) + 1):
        assert fed([text[:cut], text[cut:]]) == expected, cut
    for a in range(0, len(text), 3):
        for b in range(a, len(text), 5):
            assert fed([text[:a], text[a:b], text[b:], ""]) == expected, (a, b)


def test_a_possible_tag_is_held_back_and_released_when_it_is_none() -> None:
    auto = AutoToolCalls(HermesParser(NAMES))
    assert auto.feed("Hello <tool", False) == ("Hello", [])  # (the space waits for what follows)
    assert auto.feed("box> ok", False) == (" <toolbox> ok", [])
    assert auto.feed(" <tool_call>{\"name\": \"get_time\"}", False) == ("", [])  # the block is held until it closes
    assert auto.feed("</tool_call>", False) == ("", [ParsedCall("get_time", "{}")])
    assert auto.feed("\n", True) == ("", [])  # the space and the newline around the call: dropped


def test_the_registry_is_the_flags_choices() -> None:
    assert tuple(PARSERS) == TOOL_CALL_PARSERS


def test_tags_marked_special_are_detected() -> None:
    tok = byte_tokenizer()
    assert not tags_are_special(HermesParser, tok)
    tok.add_tokens(["<tool_call>", "</tool_call>"])  # as Qwen's: added, not special; decoding keeps them
    assert not tags_are_special(HermesParser, tok)
    assert "<tool_call>" in tok.decode(tok.encode("<tool_call>x"), skip_special_tokens=True)
    special = byte_tokenizer()
    special.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    assert tags_are_special(HermesParser, special)
    assert "<tool_call>" not in special.decode(special.encode("<tool_call>x"), skip_special_tokens=True)
