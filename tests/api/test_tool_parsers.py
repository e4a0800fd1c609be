"""The tool-call parsers (``hermes``, ``llama3_json``, ``pythonic``) and the content rules of ``tool_choice:
"auto"`` (asyncdp.api.tool_parsers), without HTTP: each text parsed whole, then fed in every split (each cut
point, and character by character), which must reassemble the same answer, as a streamed answer must equal the
whole one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncdp.api.tool_parsers import (
    PARSERS,
    AutoToolCalls,
    HermesParser,
    Llama3JsonParser,
    ParsedCall,
    PythonicParser,
    ToolCallParser,
    tags_are_special,
)
from asyncdp.config.flags import TOOL_CALL_PARSERS
from asyncdp.testing import byte_tokenizer
from tests.api.parser_feeds import assert_every_split_agrees, feed_pieces

NAMES = ("get_weather", "get_time")


def call(name: str, arguments: Any) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)}\n</tool_call>'


def whole(text: str, parser: type[ToolCallParser] = HermesParser) -> tuple[str, list[ParsedCall]]:
    return AutoToolCalls(parser(NAMES)).feed(text, finished=True)


def fed(pieces: list[str], parser: type[ToolCallParser] = HermesParser) -> tuple[str, list[ParsedCall]]:
    return feed_pieces(AutoToolCalls(parser(NAMES)), pieces)


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


TAG = "<|python_tag|>"
PARIS = ParsedCall("get_weather", '{"city": "Paris"}')
LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
LLAMA_CASES: dict[str, tuple[str, str, list[ParsedCall]]] = {
    "plain text": ("Hello there.\n", "Hello there.\n", []),
    "one call": (LLAMA_CALL, "", [PARIS]),
    "one call after whitespace": ("\n " + LLAMA_CALL + "\n", "", [PARIS]),
    "one call after the tag": (TAG + LLAMA_CALL, "", [PARIS]),
    "arguments for parameters": ('{"name": "get_time", "arguments": {}}', "", [ParsedCall("get_time", "{}")]),
    "several calls": (TAG + LLAMA_CALL + '; {"name": "get_time", "parameters": {}}\n' + LLAMA_CALL, "",
                      [PARIS, ParsedCall("get_time", "{}"), PARIS]),
    "text before a tag and a call": ("Let me check.\n" + TAG + LLAMA_CALL, "Let me check.", [PARIS]),
    "text after the calls": (LLAMA_CALL + "\nThat is all. " + LLAMA_CALL, "\nThat is all. " + LLAMA_CALL,
                             [PARIS]),
    "a bare object after text stays text": ("Sure: " + LLAMA_CALL, "Sure: " + LLAMA_CALL, []),
    "a trailing separator stays text": (LLAMA_CALL + ";", ";", [PARIS]),
    "invalid JSON stays text": ('{"name": "get_weather", "parameters": {city: 1}} ok',
                                '{"name": "get_weather", "parameters": {city: 1}} ok', []),
    "an unknown name stays text with its tag": (TAG + '{"name": "launch", "parameters": {}}',
                                                TAG + '{"name": "launch", "parameters": {}}', []),
    "a bad object beside a good one": (LLAMA_CALL + '; {"name": "launch", "parameters": {}}',
                                       '; {"name": "launch", "parameters": {}}', [PARIS]),
    "no parameters stays text": ('{"name": "get_time"}', '{"name": "get_time"}', []),
    "both parameters and arguments stay text": ('{"name": "get_time", "parameters": {}, "arguments": {}}',
                                                '{"name": "get_time", "parameters": {}, "arguments": {}}', []),
    "a JSON answer that is no call": ('{"answer": "{not a brace}"}', '{"answer": "{not a brace}"}', []),
    "an unclosed object stays text": ('{"name": "get_weather", "parameters": {"ci',
                                      '{"name": "get_weather", "parameters": {"ci', []),
    "the tag before Python code stays text": (TAG + "print(1)", TAG + "print(1)", []),
    "a partial tag at the end stays text": ("Hi <|python_t", "Hi <|python_t", []),
    "a tag at the end stays text": ("Hi <|python_tag|> ", "Hi <|python_tag|> ", []),
    "a tag at the end after a call stays text": (LLAMA_CALL + "; " + TAG, "; " + TAG, [PARIS]),
    "unicode, escapes and nested arguments": (
        '{"name": "get_weather", "parameters": {"city": "Zürich \\"東京\\" }", "opts": {"days": [1, {"a": []}]}}}',
        "", [ParsedCall("get_weather", '{"city": "Zürich \\"東京\\" }", "opts": {"days": [1, {"a": []}]}}')]),
    "parameters as a JSON string of an object": ('{"name": "get_time", "parameters": "{\\"tz\\": \\"UTC\\"}"}', "",
                                                 [ParsedCall("get_time", '{"tz": "UTC"}')]),
    "whitespace only": ("  \n", "  \n", []),
}
PYTHONIC_CASES: dict[str, tuple[str, str, list[ParsedCall]]] = {
    "plain text": ("Hello there.\n", "Hello there.\n", []),
    "one call": ('[get_weather(city="Paris")]', "", [PARIS]),
    "several calls after whitespace": ("\n [get_weather(city='Paris'), get_time()]\n", "",
                                       [PARIS, ParsedCall("get_time", "{}")]),
    "literals": ('[get_time(a=1, b=-2.5, c=True, d=None, e=[1, (2, 3)], f={"k": "v"}, g=null, h="")]', "",
                 [ParsedCall("get_time", '{"a": 1, "b": -2.5, "c": true, "d": null, "e": [1, [2, 3]], '
                                         '"f": {"k": "v"}, "g": null, "h": ""}')]),
    "unicode, quotes and brackets in strings": ('[get_weather(city="Zürich ]) \\" 東京", note=\'it\\\'s (x\')]', "",
                                                [ParsedCall("get_weather", '{"city": "Zürich ]) \\" 東京", '
                                                                           '"note": "it\'s (x"}')]),
    "text after the list": ('[get_time()] Done.', " Done.", [ParsedCall("get_time", "{}")]),
    "text before the list stays text": ('Sure: [get_time()]', 'Sure: [get_time()]', []),
    "a list of something else stays text": ("[1, 2] and [Note] x", "[1, 2] and [Note] x", []),
    "an empty list stays text": ("[]", "[]", []),
    "a name not followed by a call stays text": ("[get_time] x", "[get_time] x", []),
    "a non-literal argument stays text": ("[get_weather(city=y)]", "[get_weather(city=y)]", []),
    "a call as an argument stays text": ("[get_weather(city=str(1))]", "[get_weather(city=str(1))]", []),
    "a positional argument stays text": ('[get_weather("Paris")]', '[get_weather("Paris")]', []),
    "an unknown name keeps the whole list text": ("[get_time(), launch()] ok", "[get_time(), launch()] ok", []),
    "invalid Python stays text": ("[get_time(a=)] ok", "[get_time(a=)] ok", []),
    "an unclosed list stays text": ("[get_weather(city='Par", "[get_weather(city='Par", []),
    "an escape Python warns about is a string": ('[get_weather(city="a\\d")]', "",
                                                 [ParsedCall("get_weather", '{"city": "a\\\\d"}')]),
    "an infinite number stays text": ("[get_time(x=1e999)]", "[get_time(x=1e999)]", []),
    "whitespace only": ("  \n", "  \n", []),
}
ALL_CASES = [(HermesParser, name, *case) for name, case in CASES.items()] + [
    (Llama3JsonParser, name, *case) for name, case in LLAMA_CASES.items()] + [
    (PythonicParser, name, *case) for name, case in PYTHONIC_CASES.items()]


@pytest.mark.parametrize(("parser", "name", "text", "content", "calls"), ALL_CASES,
                         ids=[f"{c[0].name}: {c[1]}" for c in ALL_CASES])
def test_a_whole_answer(parser: type[ToolCallParser], name: str, text: str, content: str,
                        calls: list[ParsedCall]) -> None:
    assert whole(text, parser) == (content, calls)


@pytest.mark.parametrize(("parser", "name", "text", "content", "calls"), ALL_CASES,
                         ids=[f"{c[0].name}: {c[1]}" for c in ALL_CASES])
def test_every_split_of_the_text_gives_the_whole_answer(parser: type[ToolCallParser], name: str, text: str,
                                                        content: str, calls: list[ParsedCall]) -> None:
    assert_every_split_agrees(lambda: AutoToolCalls(parser(NAMES)), text)


def test_a_possible_tag_is_held_back_and_released_when_it_is_none() -> None:
    auto = AutoToolCalls(HermesParser(NAMES))
    assert auto.feed("Hello <tool", False) == ("Hello", [])  # (the space waits for what follows)
    assert auto.feed("box> ok", False) == (" <toolbox> ok", [])
    assert auto.feed(" <tool_call>{\"name\": \"get_time\"}", False) == ("", [])  # the block is held until it closes
    assert auto.feed("</tool_call>", False) == ("", [ParsedCall("get_time", "{}")])
    assert auto.feed("\n", True) == ("", [])  # the space and the newline around the call: dropped


def test_the_registry_is_the_flags_choices() -> None:
    assert tuple(PARSERS) == TOOL_CALL_PARSERS


def test_llama3_json_holds_text_only_while_it_may_be_a_call() -> None:
    auto = AutoToolCalls(Llama3JsonParser(NAMES))
    assert auto.feed('{"name": "get_time", ', False) == ("", [])  # the object is held until it closes
    assert auto.feed('"parameters": {}}', False) == ("", [ParsedCall("get_time", "{}")])
    assert auto.feed(" ; ", False) == ("", [])  # a separator waits for what follows it
    assert auto.feed("Done. {", False) == (" ; Done. {", [])  # text now: a brace is text, sent at once
    prose = AutoToolCalls(Llama3JsonParser(NAMES))
    assert prose.feed("Hello <|pyth", False) == ("Hello", [])  # only a possible tag is held
    assert prose.feed("on> {", True) == (" <|python> {", [])


def test_pythonic_holds_text_only_while_it_may_be_a_list_of_calls() -> None:
    auto = AutoToolCalls(PythonicParser(NAMES))
    assert auto.feed("[get_", False) == ("", [])
    assert auto.feed("time] is a", False) == ("[get_time] is a", [])  # no call: released
    assert auto.feed(" [get_time()]", True) == (" [get_time()]", [])
    calls = AutoToolCalls(PythonicParser(NAMES))
    assert calls.feed("[get_time(), get_weather(city='Oslo'", False) == ("", [])  # held until the list closes
    assert calls.feed(")]", True) == ("", [ParsedCall("get_time", "{}"), ParsedCall("get_weather", '{"city": "Oslo"}')])


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
    llama = byte_tokenizer()
    assert not tags_are_special(Llama3JsonParser, llama)
    llama.add_special_tokens({"additional_special_tokens": ["<|python_tag|>"]})  # as Llama 3's tokenizer marks it
    assert tags_are_special(Llama3JsonParser, llama) and not tags_are_special(PythonicParser, llama)
    assert "<|python_tag|>" not in llama.decode(llama.encode("<|python_tag|>{}"), skip_special_tokens=True)
    assert "<|python_tag|>" in llama.decode(llama.encode("<|python_tag|>{}"), skip_special_tokens=False)


@pytest.mark.parametrize("body", [
    '{"name": "get_weather", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}",  # json.loads recurses
    '{"name": "get_weather", "arguments": "' + "[" * 100_000 + "]" * 100_000 + '"}',  # a string holding it
])
def test_hermes_keeps_json_nested_past_the_recursion_limit_as_text(body: str) -> None:
    """A model that writes JSON nested deeper than Python's recursion limit inside a block: the block stays text
    (a RecursionError out of the parser would be a 500 mid-answer)."""
    text = f"<tool_call>{body}</tool_call>"
    assert HermesParser({"get_weather"}).feed(text) == [text]


@pytest.mark.parametrize(("parser", "text"), [
    (HermesParser, '<tool_call>{"name": ["get_weather"], "arguments": {}}</tool_call>'),
    (HermesParser, '<tool_call>{"name": {"a": 1}, "arguments": {}}</tool_call>'),
    (Llama3JsonParser, '{"name": ["get_weather"], "parameters": {}}'),
    (Llama3JsonParser, '<|python_tag|>{"name": {"a": 1}, "parameters": {}}'),
])
def test_a_name_that_is_not_a_string_leaves_the_object_text(parser: type[ToolCallParser], text: str) -> None:
    """A model may write any JSON as the name: one that is no string (a list cannot even be looked up among the
    tools' names) is no call, and the object stays text, never a TypeError's 500."""
    p = parser({"get_weather"})
    assert "".join(str(piece) for piece in p.feed(text) + p.finish()) == text


@pytest.mark.parametrize(("parser", "text"), [
    (HermesParser, f"A {call('get_time', {})} B {call('get_weather', {'city': 'X'})} C {call('get_time', {})}"),
    (PythonicParser, '[get_time(), get_weather(city="X"), get_time()] C'),
], ids=["hermes", "pythonic"])
def test_not_parallel_keeps_the_first_call_and_drops_the_rest_in_every_split(parser: type[ToolCallParser],
                                                                           text: str) -> None:
    for cut in range(len(text) + 1):
        for pieces in ([text[:cut], text[cut:]], list(text)):
            auto = AutoToolCalls(parser(NAMES), parallel=False)
            calls = [c for i, p in enumerate(pieces) for c in auto.feed(p, finished=i == len(pieces) - 1)[1]]
            assert calls == [ParsedCall("get_time", "{}")] and auto.num_calls == 1
