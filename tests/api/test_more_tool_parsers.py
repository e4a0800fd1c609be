"""The ``mistral``, ``qwen3_coder`` and ``llama4_pythonic`` tool-call parsers (asyncdp.api.tool_parsers), without
HTTP, as tests/api/test_tool_parsers.py checks the others: each text parsed whole, then fed in every split (each
cut point, and character by character), which must reassemble the same answer, as a streamed answer must equal
the whole one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncdp.api.tool_parsers import (
    PARSERS,
    AutoToolCalls,
    Llama4PythonicParser,
    MistralParser,
    ParsedCall,
    Qwen3CoderParser,
    ToolCallParser,
    tags_are_special,
)
from asyncdp.testing import byte_tokenizer
from tests.api.parser_feeds import assert_every_split_agrees, feed_pieces

NAMES = ("get_weather", "get_time")
PARAMETERS: dict[str, Any] = {
    "get_weather": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"},
        "metric": {"type": "boolean"}, "opts": {"type": "object"}, "hours": {"type": "array"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "when": {"anyOf": [{"type": "null"},
                                                                                     {"type": "integer"}]}}},
    "get_time": None,
}
PARIS = ParsedCall("get_weather", '{"city": "Paris"}')
TIME = ParsedCall("get_time", "{}")


def whole(text: str, parser: type[ToolCallParser]) -> tuple[str, list[ParsedCall]]:
    return AutoToolCalls(parser(NAMES, PARAMETERS)).feed(text, finished=True)


def fed(pieces: list[str], parser: type[ToolCallParser]) -> tuple[str, list[ParsedCall]]:
    return feed_pieces(AutoToolCalls(parser(NAMES, PARAMETERS)), pieces)


T = "[TOOL_CALLS]"
MISTRAL_CASES: dict[str, tuple[str, str, list[ParsedCall]]] = {  # name: (text, content, calls)
    "plain text": ("Hello [there].\n", "Hello [there].\n", []),
    "v11: a call": (T + 'get_weather[ARGS]{"city": "Paris"}', "", [PARIS]),
    "v11: a call without [ARGS]": (T + 'get_weather{"city": "Paris"}', "", [PARIS]),
    "v11: several calls": (T + 'get_weather[ARGS]{"city": "Paris"}' + T + "get_time[ARGS]{}", "", [PARIS, TIME]),
    "v11: arguments as written": (T + 'get_weather[ARGS]{ "city" :"Zürich \\"}{\\" ]" }', "",
                                  [ParsedCall("get_weather", '{ "city" :"Zürich \\"}{\\" ]" }')]),
    "text before the calls": ("Let me check.\n" + T + "get_time[ARGS]{}", "Let me check.", [TIME]),
    "text after the calls": (T + "get_time[ARGS]{} Done.", " Done.", [TIME]),
    "v11: an unknown name stays text": (T + "launch[ARGS]{} ok", T + "launch[ARGS]{} ok", []),
    "v11: a name's prefix stays text": (T + "get_tim{}", T + "get_tim{}", []),
    "v11: invalid arguments stay text": (T + "get_time[ARGS]{x: 1} ok", T + "get_time[ARGS]{x: 1} ok", []),
    "v11: arguments that are no object stay text": (T + "get_time[ARGS][1]", T + "get_time[ARGS][1]", []),
    "v11: a bad call beside a good one": (T + "launch{}" + T + "get_time{}", T + "launch{}", [TIME]),
    "v11: unclosed arguments stay text": (T + 'get_weather[ARGS]{"city": "Pa', T + 'get_weather[ARGS]{"city": "Pa', []),
    "old: an array of calls": (T + ' [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", '
                               '"arguments": {}}]', "", [PARIS, TIME]),
    "old: no arguments are an empty object": (T + '[{"name": "get_time"}]', "", [TIME]),
    "old: arguments as a JSON string of an object": (T + '[{"name": "get_time", "arguments": "{\\"tz\\": 1}"}]', "",
                                                     [ParsedCall("get_time", '{"tz": 1}')]),
    "old: text after the array": (T + '[{"name": "get_time", "arguments": {}}]\nDone.', "\nDone.", [TIME]),
    "old: an unknown name keeps the array text": (
        T + '[{"name": "get_time", "arguments": {}}, {"name": "launch", "arguments": {}}]',
        T + '[{"name": "get_time", "arguments": {}}, {"name": "launch", "arguments": {}}]', []),
    "old: invalid JSON stays text": (T + '[{"name": "get_time", }] x', T + '[{"name": "get_time", }] x', []),
    "old: an array of something else stays text": (T + "[1, [2]]", T + "[1, [2]]", []),
    "old: an empty array stays text": (T + "[]", T + "[]", []),
    "old: an unclosed array stays text": (T + '[{"name": "get_time"', T + '[{"name": "get_time"', []),
    "the token at the end stays text": ("Hi " + T + " ", "Hi " + T + " ", []),
    "a partial token at the end stays text": ("Hi [TOOL_CA", "Hi [TOOL_CA", []),
    "whitespace only": ("  \n", "  \n", []),
}


def coder(function: str, *params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={function}>\n{body}</function>\n</tool_call>"


def bare(function: str, *params: tuple[str, str]) -> str:
    return coder(function, *params).removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")


def weather(**arguments: Any) -> ParsedCall:
    return ParsedCall("get_weather", json.dumps(arguments, ensure_ascii=False))


QWEN3_CODER_CASES: dict[str, tuple[str, str, list[ParsedCall]]] = {
    "plain text": ("Hello <there>.\n", "Hello <there>.\n", []),
    "a call": (coder("get_weather", ("city", "Paris")), "", [PARIS]),
    "several calls, text around": ("Checking.\n" + coder("get_weather", ("city", "Paris")) + "\n" + coder("get_time")
                                   + " Done.", "Checking.\n\n Done.", [PARIS, TIME]),
    "values typed by the schema": (
        coder("get_weather", ("days", "3"), ("temp", "21.5"), ("metric", "True"), ("opts", '{"a": [1]}'),
              ("hours", "[1, 2]"), ("note", "null"), ("when", "None"), ("city", "null")), "",
        [weather(days=3, temp=21.5, metric=True, opts={"a": [1]}, hours=[1, 2], note=None, when=None,
                 city="null")]),
    "a whole number is an integer": (coder("get_weather", ("temp", "20.0"), ("when", "7")), "",
                                     [weather(temp=20, when=7)]),
    "values that do not parse": (
        coder("get_weather", ("days", "three"), ("temp", "warm"), ("metric", "yes"), ("hours", "not a list"),
              ("opts", "{'a': (1, 2)}"), ("temp", "inf")), "",
        [weather(days="three", temp="inf", metric=False, hours="not a list", opts={"a": [1, 2]})]),
    "a value JSON cannot write stays text": (coder("get_weather", ("opts", "{1, 2}"), ("hours", "NaN")), "",
                                             [weather(opts="{1, 2}", hours="NaN")]),
    "a parameter not in the schema is a string": (coder("get_weather", ("extra", "5"), ("city", "<b>")), "",
                                                  [weather(extra="5", city="<b>")]),
    "one newline around a value is the format's": (coder("get_weather", ("city", "\nline 1\nline 2\n")), "",
                                                   [weather(city="\nline 1\nline 2\n")]),
    "a tool without parameters' schema": (coder("get_time", ("tz", "1")), "", [ParsedCall("get_time", '{"tz": "1"}')]),
    "an unclosed parameter ends at the next": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n3\n</parameter>\n"
        "</function>\n</tool_call>", "", [weather(city="Paris", days=3)]),
    "an unknown function stays text": (coder("launch", ("x", "1")) + " ok", coder("launch", ("x", "1")) + " ok", []),
    "a block with no function stays text": ("<tool_call>\nhello\n</tool_call>", "<tool_call>\nhello\n</tool_call>", []),
    "a block with text after its function stays text": (
        "<tool_call><function=get_time></function> x</tool_call>",
        "<tool_call><function=get_time></function> x</tool_call>", []),
    "unclosed but complete is a call": ("<tool_call>\n<function=get_time>\n</function>\n", "", [TIME]),
    "unclosed and incomplete stays text": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nPa",
                                           "<tool_call>\n<function=get_weather>\n<parameter=city>\nPa", []),
    "a partial tag at the end stays text": ("Hi <tool_c", "Hi <tool_c", []),
    "whitespace only": ("  \n", "  \n", []),
    # Qwen3-Coder often leaves out the <tool_call> around a call: a bare <function=F> block of one of the tools
    "a bare call": (bare("get_weather", ("city", "Paris")), "", [PARIS]),
    "bare calls, text around": ("Checking.\n" + bare("get_weather", ("city", "Paris")) + "\n" + bare("get_time")
                                + " Done.", "Checking.\n\n Done.", [PARIS, TIME]),
    "a bare call and a wrapped one": (bare("get_time") + "\n" + coder("get_weather", ("city", "Paris")), "",
                                      [TIME, PARIS]),
    "a bare call's stray </tool_call> is the format's": (bare("get_time") + "\n</tool_call>\nDone.", "\n\nDone.",
                                                         [TIME]),
    "a bare call's </tool_call> right after it": (bare("get_time") + "</tool_call>", "", [TIME]),
    "a bare call typed by the schema": (bare("get_weather", ("days", "3"), ("metric", "true")), "",
                                        [weather(days=3, metric=True)]),
    "prose about <function stays text": ("Write <function> or <function=name>, then </function>.",
                                         "Write <function> or <function=name>, then </function>.", []),
    "a bare block of an unknown function stays text": (bare("launch", ("x", "1")) + " ok",
                                                       bare("launch", ("x", "1")) + " ok", []),
    "a bare block of a tool's prefix stays text": ("<function=get_tim></function>", "<function=get_tim></function>",
                                                   []),
    "a bare block that does not parse stays text": ("<function=get_time><parameter=x</function>",
                                                    "<function=get_time><parameter=x</function>", []),
    "an unclosed bare block stays text": ("<function=get_weather>\n<parameter=city>\nPa",
                                          "<function=get_weather>\n<parameter=city>\nPa", []),
    "a </tool_call> after a bare block that is no call stays text": (
        "<function=get_time><parameter=x</function></tool_call>",
        "<function=get_time><parameter=x</function></tool_call>", []),
    "a </tool_call> with no bare call before it stays text": ("Hi </tool_call>", "Hi </tool_call>", []),
    "a partial bare tag at the end stays text": ("Hi <function=get_ti", "Hi <function=get_ti", []),
}
S, E = "<|python_start|>", "<|python_end|>"
LLAMA4_CASES: dict[str, tuple[str, str, list[ParsedCall]]] = {
    "plain text": ("Hello there.\n", "Hello there.\n", []),
    "a list without the tags": ('[get_weather(city="Paris"), get_time()]', "", [PARIS, TIME]),
    "a list in the tags": (S + '[get_weather(city="Paris"), get_time()]' + E, "", [PARIS, TIME]),
    "whitespace around the tags": (" \n" + S + " [get_time()]\n" + E + "\n", "", [TIME]),
    "the start tag alone": (S + "[get_time()]", "", [TIME]),
    "text after the closing tag": (S + "[get_time()]" + E + " Done.", " Done.", [TIME]),
    "a closing tag that no start tag opened stays text": ("[get_time()]" + E, E, [TIME]),
    "the tag before Python code stays text": (S + "print(1)" + E, S + "print(1)" + E, []),
    "an unknown name keeps the list text, tags included": (S + " [launch()]" + E, S + " [launch()]" + E, []),
    "text before the tag stays text": ("Sure: " + S + "[get_time()]" + E, "Sure: " + S + "[get_time()]" + E, []),
    "an unclosed list stays text": (S + "[get_weather(city='Par", S + "[get_weather(city='Par", []),
    "a partial tag stays text": ("<|python_st", "<|python_st", []),
    "a partial closing tag stays text": (S + "[get_time()]<|python_e", "<|python_e", [TIME]),
    "whitespace only": ("  \n", "  \n", []),
}
ALL_CASES = [(MistralParser, name, *case) for name, case in MISTRAL_CASES.items()] + [
    (Qwen3CoderParser, name, *case) for name, case in QWEN3_CODER_CASES.items()] + [
    (Llama4PythonicParser, name, *case) for name, case in LLAMA4_CASES.items()]
IDS = [f"{c[0].name}: {c[1]}" for c in ALL_CASES]


@pytest.mark.parametrize(("parser", "name", "text", "content", "calls"), ALL_CASES, ids=IDS)
def test_a_whole_answer(parser: type[ToolCallParser], name: str, text: str, content: str,
                        calls: list[ParsedCall]) -> None:
    assert whole(text, parser) == (content, calls)


@pytest.mark.parametrize(("parser", "name", "text", "content", "calls"), ALL_CASES, ids=IDS)
def test_every_split_of_the_text_gives_the_whole_answer(parser: type[ToolCallParser], name: str, text: str,
                                                        content: str, calls: list[ParsedCall]) -> None:
    assert_every_split_agrees(lambda: AutoToolCalls(parser(NAMES, PARAMETERS)), text)


def test_the_new_parsers_are_registered() -> None:
    assert {PARSERS[n] for n in ("mistral", "qwen3_coder", "llama4_pythonic")} == {
        MistralParser, Qwen3CoderParser, Llama4PythonicParser}


def test_mistral_call_ids_are_nine_letters_and_digits_as_vllm_makes_them() -> None:
    ids = {MistralParser.call_id() for _ in range(50)}
    assert len(ids) == 50 and all(len(i) == 9 and i.isascii() and i.isalnum() for i in ids)
    assert Qwen3CoderParser.call_id().startswith("chatcmpl-tool-")


def test_mistral_holds_a_name_only_while_it_may_be_a_tools() -> None:
    auto = AutoToolCalls(MistralParser(NAMES))
    assert auto.feed("Sure." + T + "get_", False) == ("Sure.", [])
    assert auto.feed("time[AR", False) == ("", [])
    assert auto.feed("GS]{}", False) == ("", [TIME])
    other = AutoToolCalls(MistralParser(NAMES))
    assert other.feed(T + "get_x", False) == (T + "get_x", [])  # no tool's name: released at once


def test_qwen3_coder_holds_a_bare_function_only_while_it_may_be_a_tools() -> None:
    auto = AutoToolCalls(Qwen3CoderParser(NAMES))
    assert auto.feed("Sure. <function=get_", False) == ("Sure.", [])
    assert auto.feed("time>\n", False) == ("", [])
    assert auto.feed("</function>", False) == ("", [TIME])
    other = AutoToolCalls(Qwen3CoderParser(NAMES))
    assert other.feed("Use <function=f", False) == ("Use <function=f", [])  # no tool's name: released at once
    assert other.feed("oo> tags", False) == ("oo> tags", [])


def test_qwen3_coder_without_the_schemas_keeps_values_as_strings() -> None:
    p = Qwen3CoderParser(NAMES)
    assert p.feed(coder("get_weather", ("days", "3"))) == [weather(days="3")]


@pytest.mark.parametrize(("parser", "tags"), [
    (MistralParser, ["[TOOL_CALLS]", "[ARGS]"]), (Llama4PythonicParser, ["<|python_start|>", "<|python_end|>"])])
def test_the_special_tags_keep_special_tokens_in_the_text(parser: type[ToolCallParser], tags: list[str]) -> None:
    tok = byte_tokenizer()
    assert not tags_are_special(parser, tok)
    tok.add_special_tokens({"additional_special_tokens": tags})
    assert tags_are_special(parser, tok)
